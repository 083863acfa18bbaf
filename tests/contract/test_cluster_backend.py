"""The `ClusterBackend` contract, the same cases for every backend (see conftest for the subjects).

What the protocol demands where backends could differ:
* A gang that cannot fit the cluster is refused with `GangRejected` at dispatch, and nothing of it is
  created (no partial start). The in-memory cluster refuses what does not fit its free GPUs now; the
  Kubernetes backend refuses what would not fit even an empty cluster and lets a gang that fits only
  later wait as PENDING in the cluster's queue (tested in tests/integration).
* After `cancel`, a gang that was running is either listed as CANCELLED or gone, and its GPUs are
  free again. A second cancel, or one of a gang never dispatched, is not an error.
* After `evict`, a gang that was running reports EVICTED with the reason in its message, and its
  GPUs are free again once its pods have stopped. When EVICTED shows may differ: the in-memory
  cluster keeps the gang RUNNING (on its GPUs) until the grace period ends, Kubernetes says EVICTED
  as soon as the deletion starts while the inventory still counts the stopping pods' GPUs as used.
* A RUNNING gang's `nodes` name positions in `inventory()`'s `free_gpus_per_node`: one share per
  node, the GPUs it holds there, so that what is free plus what it holds is the node's capacity.
"""

from __future__ import annotations

from collections import Counter

import pytest

from clusters.api import GangPhase, GangRejected
from placement.model import CapacityKind, GpuType
from tests.contract.conftest import Subject
from tests.contract.helpers import a_gang, eventually, free_gpus, status_of, total_gpus, wait_phase

H100 = GpuType("H100")
ON_DEMAND = CapacityKind.ON_DEMAND


def needs_simulation(subject: Subject) -> None:
    if not subject.simulated:
        pytest.skip("needs simulated run durations and exit codes (a real kubelet ignores them)")


async def test_inventory_shows_the_pools_and_their_gpus(subject: Subject) -> None:
    state = await subject.backend.inventory()
    assert state.name == subject.backend.name
    assert state.reachable
    if subject.pools is None:
        assert state.pools, "a real test cluster should have at least one priced GPU pool"
        for pool in state.pools:
            assert pool.gpus_per_node >= 1
            assert all(0 <= free <= pool.gpus_per_node for free in pool.free_gpus_per_node)
        return
    seen = {(p.name, p.gpu_type, p.kind, p.gpus_per_node, p.usd_per_gpu_hour) for p in state.pools}
    assert seen == {(p.name, p.gpu_type, p.kind, p.gpus_per_node, p.usd_per_gpu_hour) for p in subject.pools}
    for pool in state.pools:
        spec = next(p for p in subject.pools if p.name == pool.name)
        assert pool.free_gpus_per_node == (spec.gpus_per_node,) * spec.node_count


async def test_a_dispatched_gang_runs_to_succeeded(subject: Subject) -> None:
    needs_simulation(subject)
    gang = a_gang("ok-1", duration_s=0.5)
    await subject.backend.dispatch(gang)
    status = await wait_phase(subject.backend, gang, GangPhase.SUCCEEDED)
    assert status.started_at_s is not None
    assert status.finished_at_s is not None
    assert status.finished_at_s >= status.started_at_s


async def test_a_gang_is_in_the_statuses_as_soon_as_its_dispatch_returns(subject: Subject) -> None:
    """No wait for a watch event: a status read right after a dispatch that missed the gang made the
    reconciler restart a job whose gang had just been created (Volcano gangs, before the fix; the
    Volcano watch starts at the first dispatch, so the first gang also met its first list)."""
    gangs = [a_gang(f"seen-{i}", replicas=1, gpus=1, duration_s=30.0) for i in range(3)]
    for gang in gangs:
        await subject.backend.dispatch(gang)
        assert await status_of(subject.backend, gang) is not None, f"{gang.name} missing right after dispatch"
    for gang in gangs:
        await subject.backend.cancel(gang.job_id, gang.attempt, 0.0)


async def test_the_same_dispatch_twice_makes_one_gang(subject: Subject) -> None:
    gang = a_gang("twice-1", duration_s=30.0)
    before = free_gpus(await subject.backend.inventory(), H100, ON_DEMAND)
    await subject.backend.dispatch(gang)
    await subject.backend.dispatch(gang)
    await wait_phase(subject.backend, gang, GangPhase.RUNNING, GangPhase.PENDING)
    mine = [
        s for s in await subject.backend.statuses() if (s.job_id, s.attempt) == (gang.job_id, gang.attempt)
    ]
    assert len(mine) == 1

    async def used_once() -> bool:
        used = before - free_gpus(await subject.backend.inventory(), H100, ON_DEMAND)
        assert used <= gang.gpu_count, f"{used} GPUs used: the gang was started twice"
        return used == gang.gpu_count

    if subject.simulated:
        await eventually(used_once, what="the gang's GPUs to show as used once")
    await subject.backend.cancel(gang.job_id, gang.attempt, 0.0)


async def test_a_gang_larger_than_the_cluster_is_rejected_and_nothing_starts(subject: Subject) -> None:
    state = await subject.backend.inventory()
    total = total_gpus(state, H100, ON_DEMAND)
    per_node = max(
        (p.gpus_per_node for p in state.pools if p.gpu_type == H100 and p.kind is ON_DEMAND), default=8
    )
    gang = a_gang("huge-1", replicas=total // per_node + 1, gpus=per_node)
    with pytest.raises(GangRejected):
        await subject.backend.dispatch(gang)
    assert await status_of(subject.backend, gang) is None
    assert free_gpus(await subject.backend.inventory(), H100, ON_DEMAND) == free_gpus(state, H100, ON_DEMAND)


async def test_a_replica_larger_than_any_node_is_rejected(subject: Subject) -> None:
    gang = a_gang("wide-1", replicas=1, gpus=64)
    with pytest.raises(GangRejected):
        await subject.backend.dispatch(gang)
    assert await status_of(subject.backend, gang) is None


async def test_a_failing_exit_code_gives_failed(subject: Subject) -> None:
    needs_simulation(subject)
    gang = a_gang("bad-1", duration_s=0.3, exit_code=3)
    await subject.backend.dispatch(gang)
    status = await wait_phase(subject.backend, gang, GangPhase.FAILED, GangPhase.SUCCEEDED)
    assert status.phase is GangPhase.FAILED, status
    assert status.finished_at_s is not None


async def test_inventory_shows_the_gpus_a_running_gang_uses(subject: Subject) -> None:
    needs_simulation(subject)
    gang = a_gang("busy-1", replicas=2, gpus=4, duration_s=30.0)
    before = free_gpus(await subject.backend.inventory(), H100, ON_DEMAND)
    await subject.backend.dispatch(gang)
    await wait_phase(subject.backend, gang, GangPhase.RUNNING)

    async def used() -> bool:
        return before - free_gpus(await subject.backend.inventory(), H100, ON_DEMAND) == gang.gpu_count

    await eventually(used, what="8 GPUs in use")
    await subject.backend.cancel(gang.job_id, gang.attempt, 0.0)


async def test_observe_gives_the_statuses_and_the_inventory_as_the_two_reads_do(subject: Subject) -> None:
    """`observe` is the pair of `statuses()` and `inventory()` as of one instant: at rest the same
    values (that the pair is from one instant is shown in tests/integration, by a binding made to
    land between two looks)."""
    needs_simulation(subject)
    gang = a_gang("observed-1", replicas=2, gpus=4, duration_s=30.0)
    await subject.backend.dispatch(gang)
    await wait_phase(subject.backend, gang, GangPhase.RUNNING)

    async def settled() -> bool:
        status = await status_of(subject.backend, gang)
        return status is not None and status.bound_gpus in (None, gang.gpu_count)

    await eventually(settled, what="the gang's pods bound")
    statuses, state = await subject.backend.observe()
    assert set(statuses) == set(await subject.backend.statuses())
    assert state == await subject.backend.inventory()
    await subject.backend.cancel(gang.job_id, gang.attempt, 0.0)


async def test_cancel_stops_the_gang_and_frees_its_gpus(subject: Subject) -> None:
    needs_simulation(subject)
    gang = a_gang("stop-1", replicas=2, gpus=8, duration_s=60.0)
    before = free_gpus(await subject.backend.inventory(), H100, ON_DEMAND)
    await subject.backend.dispatch(gang)
    await wait_phase(subject.backend, gang, GangPhase.RUNNING)
    await subject.backend.cancel(gang.job_id, gang.attempt, 0.0)

    async def stopped() -> bool:
        status = await status_of(subject.backend, gang)
        freed = free_gpus(await subject.backend.inventory(), H100, ON_DEMAND) == before
        return freed and (status is None or status.phase is GangPhase.CANCELLED)

    await eventually(stopped, what="the gang gone or CANCELLED, and its GPUs free")
    # Cancelling again (the collector may) is fine too.
    await subject.backend.cancel(gang.job_id, gang.attempt, 0.0)


async def test_cancelling_a_gang_that_was_never_dispatched_is_fine(subject: Subject) -> None:
    gang = a_gang("ghost-1")
    await subject.backend.cancel(gang.job_id, gang.attempt, 5.0)
    assert await status_of(subject.backend, gang) is None


# ---- where a running gang sits, and eviction ------------------------------------------------------


async def test_a_running_gang_names_the_inventory_nodes_it_holds(subject: Subject) -> None:
    needs_simulation(subject)
    # Three replicas of 4 on two nodes of 8: one node holds two of them, which make one share.
    gang = a_gang("placed-1", replicas=3, gpus=4, duration_s=30.0)
    before = free_gpus(await subject.backend.inventory(), H100, ON_DEMAND)
    await subject.backend.dispatch(gang)
    await wait_phase(subject.backend, gang, GangPhase.RUNNING)

    async def settled() -> bool:
        # Statuses and inventory may come from caches that catch up one after the other.
        status = await status_of(subject.backend, gang)
        used = before - free_gpus(await subject.backend.inventory(), H100, ON_DEMAND)
        return status is not None and bool(status.nodes) and used == gang.gpu_count

    await eventually(settled, what="the gang located and its GPUs in use")
    status = await status_of(subject.backend, gang)
    state = await subject.backend.inventory()
    assert status is not None
    assert sum(share.gpus for share in status.nodes) == gang.gpu_count
    assert sorted(share.gpus for share in status.nodes) == [4, 8]
    held = Counter((share.pool, share.node_index) for share in status.nodes)
    assert max(held.values()) == 1, f"a node named twice: {status.nodes}"
    pools = {p.name: p for p in state.pools}
    for share in status.nodes:
        pool = pools[share.pool]
        assert (pool.gpu_type, pool.kind) == (gang.gpu_type, gang.kind)
        assert 0 <= share.node_index < len(pool.free_gpus_per_node)
        # The gang is alone on the cluster: what it holds is what the node is missing.
        assert pool.free_gpus_per_node[share.node_index] + share.gpus == pool.gpus_per_node
    await subject.backend.cancel(gang.job_id, gang.attempt, 0.0)


async def test_evict_ends_the_gang_as_evicted_with_the_reason_and_frees_its_gpus(subject: Subject) -> None:
    needs_simulation(subject)
    gang = a_gang("victim-1", replicas=2, gpus=8, duration_s=60.0)
    before = free_gpus(await subject.backend.inventory(), H100, ON_DEMAND)
    await subject.backend.dispatch(gang)
    await wait_phase(subject.backend, gang, GangPhase.RUNNING)

    await subject.backend.evict(gang.job_id, gang.attempt, 1.0, "preempted for urgent-1: priority")

    status = await wait_phase(subject.backend, gang, *[p for p in GangPhase if p.is_final])
    assert status.phase is GangPhase.EVICTED, status
    assert "preempted for urgent-1" in status.message
    assert status.nodes == ()

    async def freed() -> bool:
        return free_gpus(await subject.backend.inventory(), H100, ON_DEMAND) == before

    await eventually(freed, what="the evicted gang's GPUs to be free")
    # Evicting again (a new leader may) is fine, and changes nothing.
    await subject.backend.evict(gang.job_id, gang.attempt, 1.0, "preempted again")
    again = await status_of(subject.backend, gang)
    assert again is not None
    assert (again.phase, again.message) == (GangPhase.EVICTED, status.message)


async def test_evicting_a_gang_that_was_never_dispatched_is_fine(subject: Subject) -> None:
    gang = a_gang("ghost-2")
    await subject.backend.evict(gang.job_id, gang.attempt, 5.0, "preempted")
    assert await status_of(subject.backend, gang) is None
