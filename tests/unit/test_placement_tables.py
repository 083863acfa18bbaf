"""The placer's per-tenant and per-place tables answer as the tables and rules they stand for.

`QuotaBook` keeps usage, limits and guarantee less usage per tenant, then type (`_usage_of`,
`_limits_of`, `_room_of`, kept by `add`), beside its (tenant, type) tables, which `held`,
`guaranteed` and `excess` still read: the per-gang questions must answer as those tables do after
any adds, variants counted against their family, and for tenants the book does not know.
`Inventory.eligible` works out the clusters a rule allows once per (region, cloud) and tests names
against a set: it must give the clusters `Pinning.allows` gives, site by site.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.placer_scenario import build
from placement.inventory import Inventory
from placement.model import GpuQuota, GpuType, Pinning, TenantId, TenantQuota
from placement.quota import QuotaBook
from tests.properties import examples

A100, H100, VARIANT = GpuType("A100"), GpuType("H100"), GpuType("A100-80GB")
TYPES = (A100, H100, VARIANT)


def _tree() -> list[TenantQuota]:
    """Two levels with caps, guarantees and borrowing limits on both, and a tenant of its own."""
    return [
        TenantQuota(
            TenantId("org"),
            gpu_caps=((A100, 40),),
            quotas=(GpuQuota(H100, guaranteed_gpus=8, borrowing_limit_gpus=8),),
        ),
        TenantQuota(
            TenantId("nlp"),
            parent=TenantId("org"),
            quotas=(GpuQuota(A100, guaranteed_gpus=8, borrowing_limit_gpus=4),),
        ),
        TenantQuota(TenantId("vision"), parent=TenantId("org"), gpu_caps=((H100, 12),)),
        TenantQuota(TenantId("solo"), quotas=(GpuQuota(A100, guaranteed_gpus=4, borrowing_limit_gpus=0),)),
    ]


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_the_books_per_tenant_tables_answer_as_its_tenant_and_type_tables(seed: int) -> None:
    rng = random.Random(seed)
    book = QuotaBook(_tree(), (), families=((VARIANT, A100),))
    tenants = [TenantId(t) for t in ("org", "nlp", "vision", "solo", "stranger")]
    lists = [(), (A100,), (H100,), (A100, H100), (VARIANT,), (H100, VARIANT)]
    for _ in range(40):
        for tenant in tenants:
            for gpu_type in TYPES:
                held, guaranteed = book.held(tenant, gpu_type), book.guaranteed(tenant, gpu_type)
                for need in range(0, 14, 3):
                    assert book.within_guarantee(tenant, gpu_type, need) == (held + need <= guaranteed)
                    assert book.borrowing(tenant, gpu_type, need) == (held - need > guaranteed)
                    if tenant in book.path:
                        breaks = book.limit_reason_now(tenant, gpu_type, need) is not None
                        assert breaks == (book.excess(tenant, gpu_type, need) > 0)
                        assert book.limit_reason(tenant, gpu_type, need) == book.limit_reason_now(
                            tenant, gpu_type, need
                        )
            for types in lists:
                rooms = [book.guaranteed(tenant, t) - book.held(tenant, t) for t in types]
                assert book.guarantee_headroom(tenant, types) == (max(rooms) if rooms else None)
        book.add(rng.choice(tenants), rng.choice(TYPES), rng.randint(1, 6))


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_the_clusters_a_rule_allows_are_those_it_allows_site_by_site(seed: int) -> None:
    rng = random.Random(seed)
    snapshot = build(gangs=20)
    inventory = Inventory(snapshot.clusters, snapshot.policy)
    names = sorted(inventory.sites)
    regions = sorted({region for region, _, _ in inventory.sites.values()})
    clouds = sorted({cloud for _, cloud, _ in inventory.sites.values()} | {"azure"})

    def some(values: Sequence[str]) -> tuple[str, ...]:
        return tuple(rng.sample(values, rng.choice((0, 0, 1, 2, 5)) if len(values) >= 5 else 1))

    for _ in range(6):
        rule = Pinning(
            clusters=some(names),
            exclude_clusters=some(names),
            regions=some(regions),
            exclude_regions=some(regions) if rng.random() < 0.3 else (),
            clouds=some(clouds) if rng.random() < 0.5 else (),
            exclude_clouds=some(clouds) if rng.random() < 0.3 else (),
        )
        for uniform in (True, False):
            expected = frozenset(
                name
                for name, (region, cloud, mixed) in inventory.sites.items()
                if (uniform or mixed) and rule.allows(name, region, cloud)
            )
            gang = replace(snapshot.queued[0], pinning=rule, uniform=uniform)
            found = inventory.eligible(gang)
            if gang.anywhere:
                assert found is None
            else:
                assert (found if found is not None else frozenset(names)) == expected
                assert found is None or len(found) < len(names)
