"""Preemption orders of earlier cycles: their victims' GPUs belong to the gang they were evicted for.

A victim keeps its GPUs through its grace period, and once evicted its cluster may no longer say on
which nodes its pods are, so the placer cannot count them as leaving by node. Before orders counted,
a second cycle 94 ms after the first ordered two more victims for the same gang: 32 GPUs evicted for
16 needed. Now, for each queued gang with victims still on their cluster (`RunningGang.evicted_for`):

- its victims are claimed for it: no other gang counts on them as leaving;
- from the start of the cycle, the free GPUs of its victims' offer, up to what it needs, are held for
  it, so that gangs decided before it do not take them (once the victims are gone their GPUs show as
  free while the victims' records still carry the order);
- at its turn the hold is given back and it is placed as any gang; if it still does not fit, it
  evicts no one new and waits, holding from the free GPUs only what it needs beyond its victims'.

Pure: reads the snapshot and works on the cycle's inventory.
"""

from __future__ import annotations

from placement.inventory import Inventory, Offer
from placement.model import GangRequest, GpuType, JobId, PolicyConfig, RunningGang, Snapshot, WaitReason
from placement.model import WaitCode as Code
from placement.preempt import RunningIndex


def _take(nodes: list[int], gpus: int) -> list[int]:
    """Take up to `gpus` from `nodes`, fullest node first; what was taken per node."""
    taken = [0] * len(nodes)
    for index in sorted(range(len(nodes)), key=lambda i: (-nodes[i], i)):
        if gpus <= 0:
            break
        taken[index] = min(gpus, nodes[index])
        nodes[index] -= taken[index]
        gpus -= taken[index]
    return taken


class OrderedEvictions:
    def __init__(self, snapshot: Snapshot, inventory: Inventory, running: RunningIndex) -> None:
        self._inventory = inventory
        self.leaving: dict[JobId, list[RunningGang]] = {}
        ordered = [g for g in snapshot.running if g.terminating and g.evicted_for is not None]
        # Only when orders are out: the queue can be tens of thousands deep and this runs every cycle.
        queued = {g.job_id: g for g in snapshot.queued} if ordered else {}
        for gang in sorted(ordered, key=lambda g: g.job_id):
            if gang.evicted_for in queued:
                self.leaving.setdefault(gang.evicted_for, []).append(gang)
                running.claimed.add(gang.job_id)
        self._held: dict[JobId, tuple[Offer, list[int]]] = {}
        for job_id in sorted(self.leaving):
            beneficiary = queued[job_id]
            offer = self._offer(beneficiary)
            if offer is None:
                continue
            nodes = offer.nodes()
            taken = _take(nodes, beneficiary.gpu_count)
            if any(taken):
                inventory.set_nodes(offer, nodes)
                self._held[job_id] = (offer, taken)

    def _offer(self, gang: GangRequest) -> Offer | None:
        first = self.leaving[gang.job_id][0]
        offers = self._inventory.search_order((first.gpu_type,), gang.allow_spot)
        return next((o for o in offers if o.view.cluster == first.cluster), None)

    def carried(self) -> frozenset[JobId]:
        """The jobs the cycle holds leaving victims (and maybe GPUs: `_held` is keyed by some of
        them) for, as it starts."""
        return frozenset(self.leaving)

    def release(self, job_id: JobId) -> None:
        """The gang's turn: give back what was held for it since the start of the cycle."""
        held = self._held.pop(job_id, None)
        if held is None:
            return
        offer, taken = held
        self._inventory.set_nodes(offer, [n + t for n, t in zip(offer.nodes(), taken, strict=True)])

    def wait(self, gang: GangRequest, policy: PolicyConfig, now: float) -> tuple[WaitReason, GpuType]:
        """Hold what the gang needs beyond its victims; why it waits, and the GPU type it waits for.

        The gang's tenant is charged the whole gang (as for a preemptor of this cycle), by the caller.
        """
        leaving = self.leaving[gang.job_id]
        cluster, gpu_type = leaving[0].cluster, leaving[0].gpu_type
        coming = sum(g.gpu_count for g in leaving if (g.cluster, g.gpu_type) == (cluster, gpu_type))
        offer = self._offer(gang)
        if offer is not None:
            nodes = offer.nodes()
            if any(_take(nodes, max(0, gang.gpu_count - coming))):
                self._inventory.set_nodes(offer, nodes)
        grace_s = max(
            policy.default_grace_period_s if g.grace_period_s is None else g.grace_period_s for g in leaving
        )
        # Its own tenant's gangs making room for it (an approved class under its cap, or its own lower
        # priorities) are named so for as long as they leave, not only in the cycle that chose them.
        if all(g.tenant == gang.tenant for g in leaving):
            whose = f"of tenant {gang.tenant}'s own lower-priority gangs, ordered evicted for this job,"
        else:
            whose = "gangs ordered evicted for this job"
        message = (
            f"waiting for {len(leaving)} {whose} to leave cluster {cluster} ({gpu_type}); "
            "their capacity is held for this job"
        )
        return WaitReason(Code.PREEMPTING, message, cluster, gpu_type, at_s=now + grace_s), gpu_type
