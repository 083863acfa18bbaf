"""SubmitJob's `spec.dataset` check: the rule (table), and the in-memory view that keeps it off etcd."""

from __future__ import annotations

from typing import Any

import pytest

from datasync import (
    Dataset,
    DatasetName,
    DatasetVersion,
    Manifest,
    ManifestEntry,
    StoreLocation,
    StoreName,
    VersionId,
)
from federation.datasets.check import DatasetCheck, refusal
from federation.datasets.registry import DatasetRegistry
from federation.errors import FailedPrecondition
from federation.spec.jobspec import DatasetRef
from federation.store.kv import KeyValue, RangeResult
from federation.store.kv_memory import MemoryKv
from federation.store.records import DatasetLocation, SchedulingSettings
from placement.model import TenantId

VISION, NLP, SPEECH = TenantId("vision"), TenantId("nlp"), TenantId("speech")
MANIFEST = Manifest((ManifestEntry("a.bin", 3, "0" * 64),))
FALLBACK = SchedulingSettings(datasets=(DatasetLocation("imagenet@2012", "onprem-s3", 1),))


def a_version(name: str, version: str) -> DatasetVersion:
    return DatasetVersion(
        DatasetName(name),
        VersionId(version),
        StoreLocation(StoreName("home"), f"{name}/{version}/"),
        MANIFEST.digest,
        3,
        1,
        created_at_s=1.0,
    )


def a_dataset(name: str, *, tenant: TenantId = VISION, shared: tuple[TenantId, ...] = ()) -> Dataset:
    return Dataset(DatasetName(name), tenant, StoreName("home"), (a_version(name, "v1"),), frozenset(shared))


@pytest.mark.parametrize(
    ("ref", "tenant", "dataset", "refused"),
    [
        pytest.param(DatasetRef("mini", "v1"), VISION, a_dataset("mini"), None, id="own-version"),
        pytest.param(DatasetRef("mini"), VISION, a_dataset("mini"), None, id="own-latest"),
        pytest.param(
            DatasetRef("vision/mini", "v1"), NLP, a_dataset("mini", shared=(NLP,)), None, id="shared"
        ),
        pytest.param(
            DatasetRef("vision/mini", "v1"), NLP, a_dataset("mini"), "not registered", id="unshared"
        ),
        pytest.param(DatasetRef("mini", "v2"), VISION, a_dataset("mini"), "no version 'v2'", id="no-version"),
        pytest.param(DatasetRef("nope", "v1"), VISION, None, "not registered", id="unknown"),
        pytest.param(DatasetRef("imagenet", "2012"), VISION, None, None, id="config-fallback"),
        pytest.param(DatasetRef("imagenet"), VISION, None, "not registered", id="fallback-is-exact"),
        # The registry decides a name it knows: the fallback list is no way into another tenant's data.
        pytest.param(
            DatasetRef("vision/imagenet", "2012"),
            NLP,
            a_dataset("imagenet"),
            "not registered",
            id="registry-wins",
        ),
    ],
)
def test_the_rule(ref: DatasetRef, tenant: TenantId, dataset: Dataset | None, refused: str | None) -> None:
    reason = refusal(ref, tenant, dataset, FALLBACK)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None
        assert reason.startswith("spec.dataset: ")
        assert refused in reason
        assert ref.name in reason


class CountingKv(MemoryKv):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def get(self, key: bytes) -> KeyValue | None:
        self.reads += 1
        return await super().get(key)

    async def range_prefix(self, *args: Any, **kwargs: Any) -> RangeResult:
        self.reads += 1
        return await super().range_prefix(*args, **kwargs)


async def test_accepted_references_are_answered_from_memory_and_a_new_registration_is_seen_at_once() -> None:
    kv = CountingKv()
    registry = DatasetRegistry(kv)
    now = [0.0]
    check = DatasetCheck(registry, refresh_s=2.0, clock=lambda: now[0])
    await registry.add_version(VISION, a_version("mini", "v1"), MANIFEST, frozenset({NLP}))

    await check.check(VISION, DatasetRef("mini", "v1"), FALLBACK)
    reads = kv.reads
    for tenant in (VISION, NLP):
        for _ in range(50):
            await check.check(tenant, DatasetRef("vision/mini", "v1"), FALLBACK)
            await check.check(VISION, DatasetRef("mini", "v1"), FALLBACK)
            await check.check(tenant, DatasetRef("imagenet", "2012"), FALLBACK)
    assert kv.reads == reads, "accepted references must not read etcd between refreshes"

    # Registered after the view was read, and submitted at once: one lookup (its key and the key a
    # dataset of that name had before names were per tenant, always both), then memory.
    await registry.add_version(VISION, a_version("fresh", "v1"), MANIFEST, frozenset())
    reads = kv.reads
    await check.check(VISION, DatasetRef("fresh", "v1"), FALLBACK)
    assert kv.reads == reads + 2
    await check.check(VISION, DatasetRef("fresh", "v1"), FALLBACK)
    assert kv.reads == reads + 2

    now[0] = 3.0
    await check.check(VISION, DatasetRef("mini", "v1"), FALLBACK)
    assert kv.reads == reads + 3  # the refresh


@pytest.mark.parametrize(
    ("tenant", "ref"),
    [
        pytest.param(SPEECH, DatasetRef("vision/mini", "v1"), id="another-tenants-unshared"),
        pytest.param(SPEECH, DatasetRef("mini", "v1"), id="another-tenants-name-is-not-mine"),
        pytest.param(VISION, DatasetRef("nope"), id="unknown"),
        pytest.param(VISION, DatasetRef("mini", "v9"), id="unknown-version"),
    ],
)
async def test_refusals_name_the_field_and_the_reference(tenant: TenantId, ref: DatasetRef) -> None:
    registry = DatasetRegistry(MemoryKv())
    await registry.add_version(VISION, a_version("mini", "v1"), MANIFEST, frozenset({NLP}))
    with pytest.raises(FailedPrecondition) as caught:
        await DatasetCheck(registry).check(tenant, ref, FALLBACK)
    assert str(caught.value).startswith("spec.dataset: ")
    assert ref.name in str(caught.value)
