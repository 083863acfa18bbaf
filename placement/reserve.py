"""Hold back capacity that is promised but not yet visible in a cluster's inventory.

Between admission and dispatch a gang owns GPUs that its cluster does not yet show as used. If a
snapshot ignored that, the next cycle would admit a second gang into the same GPUs. This takes the
promised gangs out of the inventory the same way the cluster would place them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from placement.fit import fit_replicas
from placement.model import CapacityKind, ClusterName, ClusterState, GpuType
from placement.model_values import keep_as_values


@dataclass(frozen=True, slots=True)
class PendingGang:
    cluster: ClusterName
    gpu_type: GpuType
    kind: CapacityKind
    replica_gpus: tuple[int, ...]


def reserve_pending(state: ClusterState, pending: Iterable[PendingGang]) -> ClusterState:
    """The cluster as it will look once `pending` gangs (those bound for it) are placed.

    A gang that no longer fits (the cluster shrank meanwhile) takes what it can of its type, so the
    estimate errs towards less free capacity, never more.
    """
    pools = list(state.pools)
    for gang in pending:
        if gang.cluster != state.name:
            continue
        matching = [i for i, p in enumerate(pools) if p.gpu_type == gang.gpu_type and p.kind == gang.kind]
        if not matching:
            continue
        free = [n for i in matching for n in pools[i].free_gpus_per_node]
        taken = fit_replicas(gang.replica_gpus, free)
        if taken is None:
            # Cannot be placed whole any more: assume the worst and drain as much as it asked for.
            remaining = sum(gang.replica_gpus)
            drained = []
            for n in free:
                take = min(n, remaining)
                drained.append(take)
                remaining -= take
            taken = tuple(drained)
        offset = 0
        for i in matching:
            count = len(pools[i].free_gpus_per_node)
            slice_taken = taken[offset : offset + count]
            pools[i] = replace(
                pools[i],
                free_gpus_per_node=tuple(
                    f - t for f, t in zip(pools[i].free_gpus_per_node, slice_taken, strict=True)
                ),
            )
            offset += count
    return replace(state, pools=tuple(pools))


keep_as_values(PendingGang)
