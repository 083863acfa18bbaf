"""Keep a job set's trials together where their data is (issue 34).

The trials of a sweep or an array usually read one dataset. The first trial placed on a cluster has
the dataset staged into that cluster's object store; its set-mates placed beside it move nothing
more, while each one placed elsewhere pays the egress and the wait of another copy. The cost model
already prices a store that holds a recorded copy (`GangRequest.dataset_cached_in`, from the dataset
registry) as moving nothing, but a copy is recorded only once its staging is done: trials admitted
meanwhile (in the same cycle, or while the first one stages) saw every store as equally far, and a
tie went by packing and cluster name, so one sweep could stage its dataset into every store.

So a store where a set-mate reading the same dataset is placed (admitted, staging, dispatched or
running) counts, for that set's gangs, as a store holding a copy: the copy is there or on its way,
paid for once. That is a cost, not a rule: a cluster cheaper by more than the move still wins, and a
gang whose dataset has no known size or home store is placed as before.

The key is the tenant-qualified set name and the dataset reference as the job wrote it, so two
tenants' sets of the same name, or two sets of one tenant, never share what they learn: what one
tenant's placements say about where data sits reaches no other tenant's gangs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from placement.model import GangRequest, TenantId

SetKey = tuple[str, str]


def set_key(tenant: TenantId, job_set: str) -> str:
    """The set's name qualified by its tenant ("" for a job in no set): set names are per tenant."""
    return f"{tenant}/{job_set}" if job_set else ""


def affinity_key(gang: GangRequest) -> SetKey | None:
    """What the gang shares locality with: its set and dataset (None: no set, or no dataset)."""
    if not gang.job_set or gang.dataset is None:
        return None
    return (gang.job_set, gang.dataset)


class SetStores:
    """Per (set, dataset): the object stores its placed members read from. Order-free (sets of
    names), so equal placements in any order give equal answers."""

    def __init__(self, placed: Iterable[tuple[SetKey, str]] = ()) -> None:
        self._stores: dict[SetKey, frozenset[str]] = {}
        for key, store in placed:
            self.add(key, store)

    def add(self, key: SetKey, store: str | None) -> None:
        if store is None:
            return
        known = self._stores.get(key, frozenset())
        if store not in known:
            self._stores[key] = known | {store}

    def admitted(self, gang: GangRequest, store: str | None) -> None:
        """The gang was placed on a cluster reading from `store`: its set-mates may follow."""
        key = affinity_key(gang)
        if key is not None:
            self.add(key, store)

    def placed_any(self) -> bool:
        """Whether any set member is placed: without one no gang is widened (`widened`)."""
        return bool(self._stores)

    def stores(self, gang: GangRequest) -> frozenset[str]:
        key = affinity_key(gang)
        return frozenset() if key is None else self._stores.get(key, frozenset())

    def widened(self, gang: GangRequest) -> GangRequest:
        """The gang with its set-mates' stores counted as holding its dataset; the very same object
        when that adds nothing (most gangs: no set, no dataset, or no set-mate placed yet)."""
        if not self._stores or gang.dataset_store is None:
            return gang
        extra = self.stores(gang) - {gang.dataset_store, *gang.dataset_cached_in}
        if not extra:
            return gang
        return replace(gang, dataset_cached_in=tuple(sorted({*gang.dataset_cached_in, *extra})))
