"""The in-memory simulated cluster: node-level gang placement, simulated runs, faults and its journal."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters.api import (
    ClusterUnreachable,
    GangPhase,
    GangRejected,
    GangStatus,
    GangWorkload,
    ReplicaSpec,
)
from clusters.memory import InMemoryCluster, JournalError, MemoryPool, listed_nodes
from placement.model import CapacityKind, ClusterName, GpuType, JobId, NodeShare, Provider, TenantId
from tests.properties import examples

H100 = GpuType("H100")
A100 = GpuType("A100")
START_S = 1_000.0


class FakeClock:
    def __init__(self, now_s: float = START_S) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def a_pool(
    name: str = "h100",
    *,
    gpu: GpuType = H100,
    kind: CapacityKind = CapacityKind.ON_DEMAND,
    gpus_per_node: int = 8,
    nodes: int = 3,
) -> MemoryPool:
    return MemoryPool(name, gpu, kind, 2.5, gpus_per_node, nodes)


def a_cluster(
    clock: FakeClock, *pools: MemoryPool, journal: Path | None = None, default_duration_s: float = 5.0
) -> InMemoryCluster:
    return InMemoryCluster(
        ClusterName("c1"),
        provider=Provider.AWS,
        region="us-east-1",
        pools=pools or (a_pool(),),
        object_store="s3://c1",
        journal_path=journal,
        clock=clock,
        default_duration_s=default_duration_s,
    )


def a_gang(
    job: str,
    *replica_gpus: int,
    attempt: int = 1,
    gpu: GpuType = H100,
    kind: CapacityKind = CapacityKind.ON_DEMAND,
    duration_s: float | None = 60.0,
    exit_code: int = 0,
    max_runtime_s: int = 0,
) -> GangWorkload:
    return GangWorkload(
        job_id=JobId(job),
        attempt=attempt,
        tenant=TenantId("t1"),
        gpu_type=gpu,
        kind=kind,
        priority_class="default",
        replicas=tuple(
            ReplicaSpec("worker", i, n, "ghcr.io/example/train:1", ("python", "train.py"), ())
            for i, n in enumerate(replica_gpus or (8,))
        ),
        min_available=len(replica_gpus or (8,)),
        max_runtime_s=max_runtime_s,
        sim_duration_s=duration_s,
        sim_exit_code=exit_code,
    )


async def free_per_node(cluster: InMemoryCluster, pool: str = "h100") -> tuple[int, ...]:
    state = await cluster.inventory()
    return next(p.free_gpus_per_node for p in state.pools if p.name == pool)


async def status_of(cluster: InMemoryCluster, job: str, attempt: int = 1) -> GangStatus | None:
    return next(
        (s for s in await cluster.statuses() if s.job_id == job and s.attempt == attempt),
        None,
    )


# ---- placement --------------------------------------------------------------------------------------


async def test_inventory_describes_the_cluster_with_every_node_free() -> None:
    cluster = a_cluster(FakeClock(), a_pool("h100", nodes=2), a_pool("a100", gpu=A100, gpus_per_node=4))

    state = await cluster.inventory()

    assert (state.name, state.provider, state.region, state.object_store, state.reachable) == (
        "c1",
        Provider.AWS,
        "us-east-1",
        "s3://c1",
        True,
    )
    assert [(p.name, p.gpu_type, p.gpus_per_node, p.free_gpus_per_node) for p in state.pools] == [
        ("h100", H100, 8, (8, 8)),
        ("a100", A100, 4, (4, 4, 4)),
    ]


@pytest.mark.parametrize(
    ("gangs", "expected_free"),
    [
        pytest.param([(8,)], (0, 8, 8), id="one whole node"),
        pytest.param([(2,)], (6, 8, 8), id="a partial node"),
        pytest.param([(4, 4)], (0, 8, 8), id="two replicas share the first node"),
        pytest.param([(8, 4, 2)], (0, 2, 8), id="largest first, smaller ones fill the fuller node"),
        pytest.param([(6,), (2,)], (0, 8, 8), id="best fit picks the fullest node that holds the replica"),
        pytest.param([(6,), (4,)], (2, 4, 8), id="a replica too big for the fullest node goes to the next"),
        pytest.param([(8, 8, 8)], (0, 0, 0), id="the whole cluster"),
        pytest.param([(0,)], (8, 8, 8), id="a replica without GPUs takes none"),
    ],
)
async def test_dispatch_places_replicas_best_fit_decreasing(
    gangs: list[tuple[int, ...]], expected_free: tuple[int, ...]
) -> None:
    cluster = a_cluster(FakeClock())

    for n, replica_gpus in enumerate(gangs):
        await cluster.dispatch(a_gang(f"j{n}", *replica_gpus))

    assert await free_per_node(cluster) == expected_free
    assert all(s.phase is GangPhase.RUNNING for s in await cluster.statuses())


@pytest.mark.parametrize(
    ("before", "gang", "expected_message"),
    [
        pytest.param(
            [],
            (8, 8, 8, 8),
            "needs 32 on_demand H100 GPUs as replicas of 8+8+8+8 (each on one node); "
            "24 free across 3 nodes, largest free block 8",
            id="more GPUs than the cluster has",
        ),
        pytest.param(
            [(6, 6, 6)],
            (4,),
            "6 free across 3 nodes, largest free block 2",
            id="enough GPUs in total but no node holds the replica",
        ),
        pytest.param([], (16,), "largest free block 8", id="a replica larger than any node"),
    ],
)
async def test_a_gang_that_does_not_fit_is_rejected_whole(
    before: list[tuple[int, ...]], gang: tuple[int, ...], expected_message: str
) -> None:
    cluster = a_cluster(FakeClock())
    for n, replica_gpus in enumerate(before):
        await cluster.dispatch(a_gang(f"before{n}", *replica_gpus))
    free_before = await free_per_node(cluster)

    with pytest.raises(GangRejected) as rejected:
        await cluster.dispatch(a_gang("big", *gang))

    assert expected_message in str(rejected.value)
    assert "big-a1" in str(rejected.value)
    assert not rejected.value.retryable
    assert await free_per_node(cluster) == free_before
    assert await status_of(cluster, "big") is None
    assert cluster.dispatch_count(JobId("big"), 1) == 0


async def test_two_half_free_nodes_cannot_take_a_whole_node_replica() -> None:
    cluster = a_cluster(FakeClock(), a_pool(nodes=2))
    for job in ("a", "b", "c", "d"):
        await cluster.dispatch(a_gang(job, 4))
    await cluster.cancel(JobId("b"), 1, grace_period_s=0)
    await cluster.cancel(JobId("d"), 1, grace_period_s=0)
    assert await free_per_node(cluster) == (4, 4)

    with pytest.raises(GangRejected, match=r"needs 8 .* 8 free across 2 nodes, largest free block 4"):
        await cluster.dispatch(a_gang("whole", 8))

    assert await free_per_node(cluster) == (4, 4)


@pytest.mark.parametrize(
    ("gpu", "kind", "expected"),
    [
        pytest.param(H100, CapacityKind.SPOT, {"h100-spot": (0, 8)}, id="spot H100 goes to the spot pool"),
        pytest.param(H100, CapacityKind.ON_DEMAND, {"h100": (0, 8)}, id="on-demand H100 skips spot"),
        pytest.param(A100, CapacityKind.PRIVATE, {"a100": (0, 8)}, id="private A100"),
        pytest.param(A100, CapacityKind.SPOT, "has no spot A100 pool", id="no pool of that kind"),
        pytest.param(
            GpuType("L4"), CapacityKind.ON_DEMAND, "has no on_demand L4 pool", id="no pool of that GPU"
        ),
    ],
)
async def test_dispatch_uses_only_pools_of_the_gangs_gpu_type_and_kind(
    gpu: GpuType, kind: CapacityKind, expected: dict[str, tuple[int, ...]] | str
) -> None:
    cluster = a_cluster(
        FakeClock(),
        a_pool("h100", nodes=2),
        a_pool("h100-spot", kind=CapacityKind.SPOT, nodes=2),
        a_pool("a100", gpu=A100, kind=CapacityKind.PRIVATE, nodes=2),
    )
    gang = a_gang("j1", 8, gpu=gpu, kind=kind)

    if isinstance(expected, str):
        with pytest.raises(GangRejected, match=expected):
            await cluster.dispatch(gang)
        return
    await cluster.dispatch(gang)
    state = await cluster.inventory()
    assert {p.name: p.free_gpus_per_node for p in state.pools} == {
        "h100": (8, 8),
        "h100-spot": (8, 8),
        "a100": (8, 8),
    } | expected


async def test_dispatch_is_idempotent_by_gang_name() -> None:
    clock = FakeClock()
    cluster = a_cluster(clock)
    gang = a_gang("j1", 8, duration_s=10)

    await cluster.dispatch(gang)
    await cluster.dispatch(gang)
    assert await free_per_node(cluster) == (0, 8, 8)

    clock.advance(10)
    await cluster.dispatch(gang)

    assert cluster.dispatch_count(JobId("j1"), 1) == 1
    assert await free_per_node(cluster) == (8, 8, 8)
    assert [s.phase for s in await cluster.statuses()] == [GangPhase.SUCCEEDED]


async def test_another_attempt_of_the_same_job_is_a_new_gang() -> None:
    cluster = a_cluster(FakeClock())

    await cluster.dispatch(a_gang("j1", 8, attempt=1))
    await cluster.dispatch(a_gang("j1", 8, attempt=2))

    assert await free_per_node(cluster) == (0, 0, 8)
    assert {(s.job_id, s.attempt) for s in await cluster.statuses()} == {("j1", 1), ("j1", 2)}


async def test_running_gangs_shows_where_each_replica_runs() -> None:
    cluster = a_cluster(FakeClock())

    await cluster.dispatch(a_gang("j1", 2, 8, duration_s=30))

    [gang] = cluster.running_gangs()
    assert [(r.task, r.replica_index, r.pool, r.node_index, r.gpu_count) for r in gang.replicas] == [
        ("worker", 0, "h100", 1, 2),
        ("worker", 1, "h100", 0, 8),
    ]
    assert (gang.started_at_s, gang.ends_at_s) == (START_S, START_S + 30)


# ---- simulated runs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("duration_s", "exit_code", "max_runtime_s", "ends_after_s", "phase", "message"),
    [
        pytest.param(10.0, 0, 0, 10.0, GangPhase.SUCCEEDED, "completed", id="succeeds after its duration"),
        pytest.param(None, 0, 0, 5.0, GangPhase.SUCCEEDED, "completed", id="default duration when unset"),
        pytest.param(10.0, 3, 0, 10.0, GangPhase.FAILED, "exited with code 3", id="non-zero exit fails"),
        pytest.param(
            100.0, 0, 30, 30.0, GangPhase.FAILED, "exceeded maxRuntime", id="max runtime caps a long run"
        ),
        pytest.param(
            100.0, 3, 30, 30.0, GangPhase.FAILED, "exceeded maxRuntime", id="the cap comes before the exit"
        ),
        pytest.param(
            30.0, 0, 30, 30.0, GangPhase.SUCCEEDED, "completed", id="a run of exactly the cap succeeds"
        ),
        pytest.param(0.0, 0, 0, 0.0, GangPhase.SUCCEEDED, "completed", id="a zero-length run ends at once"),
    ],
)
async def test_a_gang_runs_for_its_simulated_duration(
    duration_s: float | None,
    exit_code: int,
    max_runtime_s: int,
    ends_after_s: float,
    phase: GangPhase,
    message: str,
) -> None:
    clock = FakeClock()
    cluster = a_cluster(clock)
    await cluster.dispatch(
        a_gang("j1", 8, 8, duration_s=duration_s, exit_code=exit_code, max_runtime_s=max_runtime_s)
    )

    if ends_after_s > 0:
        clock.advance(ends_after_s - 0.001)
        assert await status_of(cluster, "j1") == GangStatus(
            JobId("j1"),
            1,
            GangPhase.RUNNING,
            "",
            START_S,
            nodes=(NodeShare("h100", 0, 8), NodeShare("h100", 1, 8)),
        )
        assert await free_per_node(cluster) == (0, 0, 8)
    clock.advance(3600)

    status = await status_of(cluster, "j1")
    assert status is not None
    assert (status.phase, status.finished_at_s) == (phase, START_S + ends_after_s)
    assert message in status.message
    assert await free_per_node(cluster) == (8, 8, 8)
    assert cluster.running_gangs() == []


async def test_freed_capacity_takes_a_waiting_gang() -> None:
    clock = FakeClock()
    cluster = a_cluster(clock, a_pool(nodes=1))
    await cluster.dispatch(a_gang("j1", 8, duration_s=10))
    with pytest.raises(GangRejected):
        await cluster.dispatch(a_gang("j2", 8))

    clock.advance(10)
    await cluster.dispatch(a_gang("j2", 8))

    assert await free_per_node(cluster) == (0,)


# ---- cancel, evict, node loss -----------------------------------------------------------------------


async def test_cancel_ends_a_running_gang_and_keeps_it_listed_until_forgotten() -> None:
    clock = FakeClock()
    cluster = a_cluster(clock)
    await cluster.dispatch(a_gang("j1", 8, 8))
    clock.advance(7)

    await cluster.cancel(JobId("j1"), 1, grace_period_s=30)

    status = await status_of(cluster, "j1")
    assert status is not None
    assert (status.phase, status.finished_at_s) == (GangPhase.CANCELLED, START_S + 7)
    assert "grace period of 30" in status.message
    assert await free_per_node(cluster) == (8, 8, 8)
    clock.advance(3600)
    assert (await status_of(cluster, "j1")) == status

    cluster.forget(JobId("j1"), 1)
    assert await cluster.statuses() == ()


async def test_cancelling_a_finished_gang_deletes_it() -> None:
    clock = FakeClock()
    cluster = a_cluster(clock)
    await cluster.dispatch(a_gang("j1", 8))
    await cluster.cancel(JobId("j1"), 1, grace_period_s=0)

    await cluster.cancel(JobId("j1"), 1, grace_period_s=0)

    assert await cluster.statuses() == ()
    await cluster.dispatch(a_gang("j1", 8))
    assert cluster.dispatch_count(JobId("j1"), 1) == 2


async def test_a_gang_dispatched_again_after_being_deleted_runs_its_own_duration() -> None:
    clock = FakeClock()
    cluster = a_cluster(clock)
    await cluster.dispatch(a_gang("j1", 8, duration_s=10))
    await cluster.cancel(JobId("j1"), 1, grace_period_s=0)
    cluster.forget(JobId("j1"), 1)
    clock.advance(5)

    await cluster.dispatch(a_gang("j1", 8, duration_s=100))
    clock.advance(50)

    assert await status_of(cluster, "j1") == GangStatus(
        JobId("j1"), 1, GangPhase.RUNNING, "", START_S + 5, nodes=(NodeShare("h100", 0, 8),)
    )
    assert cluster.dispatch_count(JobId("j1"), 1) == 2


async def test_cancelling_an_unknown_gang_is_a_no_op() -> None:
    cluster = a_cluster(FakeClock())

    await cluster.cancel(JobId("nobody"), 1, grace_period_s=30)

    assert await cluster.statuses() == ()


async def test_forgetting_a_running_gang_frees_its_gpus() -> None:
    cluster = a_cluster(FakeClock())
    await cluster.dispatch(a_gang("j1", 8))

    cluster.forget(JobId("j1"), 1)

    assert await free_per_node(cluster) == (8, 8, 8)
    assert await cluster.statuses() == ()


async def test_evict_ends_a_running_gang_and_frees_its_gpus() -> None:
    clock = FakeClock()
    cluster = a_cluster(clock)
    await cluster.dispatch(a_gang("j1", 8, 8))
    await cluster.dispatch(a_gang("j2", 4))
    clock.advance(5)

    cluster.inject_eviction(JobId("j1"), 1, reason="spot reclaimed")

    assert await status_of(cluster, "j1") == GangStatus(
        JobId("j1"), 1, GangPhase.EVICTED, "spot reclaimed", START_S, START_S + 5
    )
    assert await free_per_node(cluster) == (8, 8, 4)
    assert (await status_of(cluster, "j2")) == GangStatus(
        JobId("j2"), 1, GangPhase.RUNNING, "", START_S, nodes=(NodeShare("h100", 2, 4),)
    )


async def test_evicting_a_finished_gang_leaves_it_as_it_ended() -> None:
    clock = FakeClock()
    cluster = a_cluster(clock)
    await cluster.dispatch(a_gang("j1", 8, duration_s=10))
    clock.advance(10)

    cluster.inject_eviction(JobId("j1"), 1)

    status = await status_of(cluster, "j1")
    assert status is not None
    assert status.phase is GangPhase.SUCCEEDED
    with pytest.raises(KeyError, match="no gang ghost-a1"):
        cluster.inject_eviction(JobId("ghost"), 1)


async def test_a_failed_node_leaves_the_inventory_and_evicts_the_gangs_on_it() -> None:
    clock = FakeClock()
    cluster = a_cluster(clock, a_pool(nodes=4))
    await cluster.dispatch(a_gang("spans", 8, 8))  # nodes 0 and 1
    await cluster.dispatch(a_gang("other", 2))  # node 2
    clock.advance(3)

    cluster.fail_node("h100", 1)

    spans = await status_of(cluster, "spans")
    assert spans is not None
    assert (spans.phase, spans.message, spans.finished_at_s) == (
        GangPhase.EVICTED,
        "node h100/1 lost",
        START_S + 3,
    )
    other = await status_of(cluster, "other")
    assert other is not None
    assert other.phase is GangPhase.RUNNING
    assert await free_per_node(cluster) == (8, 6, 8)
    with pytest.raises(GangRejected, match="largest free block 8"):
        await cluster.dispatch(a_gang("too-big", 8, 8, 8))
    cluster.fail_node("h100", 1)
    assert await free_per_node(cluster) == (8, 6, 8)


@pytest.mark.parametrize(
    ("pool", "index", "error"),
    [
        pytest.param("nope", 0, KeyError, id="unknown pool"),
        pytest.param("h100", 3, IndexError, id="index past the pool"),
        pytest.param("h100", -1, IndexError, id="negative index"),
    ],
)
def test_failing_a_node_that_does_not_exist_raises(pool: str, index: int, error: type[Exception]) -> None:
    cluster = a_cluster(FakeClock())

    with pytest.raises(error):
        cluster.fail_node(pool, index)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda c: c.inventory(), id="inventory"),
        pytest.param(lambda c: c.dispatch(a_gang("j2", 8)), id="dispatch"),
        pytest.param(lambda c: c.statuses(), id="statuses"),
        pytest.param(lambda c: c.cancel(JobId("j1"), 1, 30), id="cancel"),
    ],
)
async def test_an_unreachable_cluster_raises_on_every_call(
    call: Callable[[InMemoryCluster], Awaitable[object]],
) -> None:
    cluster = a_cluster(FakeClock())
    await cluster.dispatch(a_gang("j1", 8))
    cluster.set_reachable(False)

    with pytest.raises(ClusterUnreachable, match="c1 is unreachable") as raised:
        await call(cluster)

    assert raised.value.retryable
    assert not cluster.reachable
    cluster.set_reachable(True)
    assert await free_per_node(cluster) == (0, 8, 8)
    assert [s.phase for s in await cluster.statuses()] == [GangPhase.RUNNING]


@pytest.mark.parametrize(
    ("gang", "message"),
    [
        pytest.param(a_gang("j1", 8, -1), "replica worker-1 asks for -1 GPUs", id="negative GPUs"),
        pytest.param(replace(a_gang("j1"), replicas=()), "has no replicas", id="no replicas"),
    ],
)
async def test_an_unusable_gang_is_rejected(gang: GangWorkload, message: str) -> None:
    cluster = a_cluster(FakeClock())

    with pytest.raises(GangRejected, match=message):
        await cluster.dispatch(gang)

    assert await free_per_node(cluster) == (8, 8, 8)


# ---- journal ----------------------------------------------------------------------------------------


async def snapshot(cluster: InMemoryCluster) -> tuple[object, ...]:
    return (
        await cluster.inventory(),
        sorted(await cluster.statuses(), key=lambda s: (s.job_id, s.attempt)),
        sorted(cluster.running_gangs(), key=lambda g: g.job_id),
    )


async def test_a_restarted_cluster_replays_its_journal(tmp_path: Path) -> None:
    clock = FakeClock()
    journal = tmp_path / "c1.journal"
    cluster = a_cluster(clock, a_pool(nodes=6), journal=journal)
    await cluster.dispatch(a_gang("long", 8, 2, duration_s=1000))
    await cluster.dispatch(a_gang("short", 4, duration_s=10))
    await cluster.dispatch(a_gang("failing", 2, duration_s=20, exit_code=2))
    await cluster.dispatch(a_gang("cancelled", 8))
    await cluster.dispatch(a_gang("evicted", 8))
    await cluster.dispatch(a_gang("node-lost", 8))
    await cluster.dispatch(a_gang("forgotten", 1))
    clock.advance(15)
    await cluster.cancel(JobId("cancelled"), 1, 30)
    cluster.inject_eviction(JobId("evicted"), 1, reason="preempted by kubelet")
    lost_node = next(
        r.node_index for g in cluster.running_gangs() if g.job_id == "node-lost" for r in g.replicas
    )
    cluster.fail_node("h100", lost_node)
    cluster.forget(JobId("forgotten"), 1)
    before = await snapshot(cluster)

    restarted = a_cluster(clock, a_pool(nodes=6), journal=journal)

    assert await snapshot(restarted) == before
    assert {s.job_id: s.phase for s in await restarted.statuses()} == {
        "long": GangPhase.RUNNING,
        "short": GangPhase.SUCCEEDED,
        "failing": GangPhase.RUNNING,
        "cancelled": GangPhase.CANCELLED,
        "evicted": GangPhase.EVICTED,
        "node-lost": GangPhase.EVICTED,
    }
    await restarted.dispatch(a_gang("long", 8, 2, duration_s=1000))
    assert restarted.dispatch_count(JobId("long"), 1) == 1
    assert await snapshot(restarted) == before


async def test_gangs_finish_on_the_clock_while_the_process_is_down(tmp_path: Path) -> None:
    clock = FakeClock()
    journal = tmp_path / "c1.journal"
    cluster = a_cluster(clock, journal=journal)
    await cluster.dispatch(a_gang("j1", 8, duration_s=100))
    await cluster.dispatch(a_gang("j2", 8, duration_s=100, exit_code=1))
    del cluster

    clock.advance(500)
    restarted = a_cluster(clock, journal=journal)

    assert sorted(await restarted.statuses(), key=lambda s: s.job_id) == [
        GangStatus(JobId("j1"), 1, GangPhase.SUCCEEDED, "completed", START_S, START_S + 100),
        GangStatus(JobId("j2"), 1, GangPhase.FAILED, "exited with code 1", START_S, START_S + 100),
    ]
    assert await free_per_node(restarted) == (8, 8, 8)


async def test_replay_finishes_gangs_before_later_events_reuse_their_gpus(tmp_path: Path) -> None:
    clock = FakeClock()
    journal = tmp_path / "c1.journal"
    cluster = a_cluster(clock, a_pool(nodes=1), journal=journal)
    await cluster.dispatch(a_gang("first", 8, duration_s=10))
    clock.advance(10)
    await cluster.dispatch(a_gang("second", 8, duration_s=10))
    cluster.fail_node("h100", 0)
    before = await snapshot(cluster)

    restarted = a_cluster(clock, a_pool(nodes=1), journal=journal)

    assert await snapshot(restarted) == before
    assert {s.job_id: s.phase for s in await restarted.statuses()} == {
        "first": GangPhase.SUCCEEDED,
        "second": GangPhase.EVICTED,
    }


@pytest.mark.parametrize(
    "torn",
    [
        pytest.param(b'{"op":"dispatch","at_s":10', id="half a record"),
        pytest.param(b"\x00\x00\x00\x00", id="zeroed block"),
        pytest.param(b'{"op":"forget"\n', id="garbage with its newline"),
    ],
)
async def test_a_torn_last_line_is_dropped_on_replay(tmp_path: Path, torn: bytes) -> None:
    clock = FakeClock()
    journal = tmp_path / "c1.journal"
    cluster = a_cluster(clock, journal=journal)
    await cluster.dispatch(a_gang("j1", 8))
    before = await snapshot(cluster)
    with journal.open("ab") as f:
        f.write(torn)

    restarted = a_cluster(clock, journal=journal)
    assert await snapshot(restarted) == before
    await restarted.dispatch(a_gang("j2", 8))

    again = a_cluster(clock, journal=journal)
    assert await snapshot(again) == await snapshot(restarted)
    assert await free_per_node(again) == (0, 0, 8)


async def test_a_corrupt_line_before_the_end_is_an_error(tmp_path: Path) -> None:
    clock = FakeClock()
    journal = tmp_path / "c1.journal"
    cluster = a_cluster(clock, journal=journal)
    await cluster.dispatch(a_gang("j1", 8))
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"not json\n" + b"".join(lines))

    with pytest.raises(JournalError, match="line 1 is corrupt"):
        a_cluster(clock, journal=journal)


async def test_a_journal_for_other_pools_is_an_error(tmp_path: Path) -> None:
    clock = FakeClock()
    journal = tmp_path / "c1.journal"
    cluster = a_cluster(clock, a_pool(nodes=3), journal=journal)
    await cluster.dispatch(a_gang("j1", 8, 8, 8))

    with pytest.raises(JournalError, match="which this cluster lacks"):
        a_cluster(clock, a_pool(nodes=2), journal=journal)


async def test_a_new_journal_starts_empty(tmp_path: Path) -> None:
    journal = tmp_path / "c1.journal"

    cluster = a_cluster(FakeClock(), journal=journal)

    assert journal.exists()
    assert await cluster.statuses() == ()
    assert await free_per_node(cluster) == (8, 8, 8)


# ---- invariants -------------------------------------------------------------------------------------

POOLS = (a_pool("h100", gpus_per_node=8, nodes=3), a_pool("small", gpus_per_node=4, nodes=2))
JOBS = [f"j{n}" for n in range(6)]


@dataclass(frozen=True)
class Dispatch:
    job: str
    replica_gpus: tuple[int, ...]
    duration_s: float


@dataclass(frozen=True)
class Cancel:
    job: str


@dataclass(frozen=True)
class Evict:
    job: str


@dataclass(frozen=True)
class Preempt:
    job: str
    grace_period_s: float


@dataclass(frozen=True)
class FailNode:
    pool: int
    index: int


@dataclass(frozen=True)
class Advance:
    seconds: float


Op = Dispatch | Cancel | Evict | Preempt | FailNode | Advance
A_JOB = st.sampled_from(JOBS)
A_DISPATCH = st.builds(
    Dispatch,
    A_JOB,
    st.lists(st.integers(0, 8), min_size=1, max_size=4).map(tuple),
    st.sampled_from([0.0, 5.0, 10.0, 30.0]),
)
A_CLOCK_STEP = st.builds(Advance, st.sampled_from([1.0, 5.0, 10.0]))
# Dispatches and clock steps drawn more often than node loss, so that capacity is not gone in a few ops.
OPS = st.lists(
    st.one_of(
        A_DISPATCH,
        A_DISPATCH,
        A_CLOCK_STEP,
        st.builds(Cancel, A_JOB),
        st.builds(Evict, A_JOB),
        st.builds(Preempt, A_JOB, st.sampled_from([0.0, 5.0])),
        st.builds(FailNode, st.integers(0, 1), st.integers(0, 2)),
    ),
    max_size=30,
)


async def check_capacity(cluster: InMemoryCluster, failed: set[tuple[str, int]]) -> None:
    """Every healthy node's free GPUs lie within the node and equal its size less what running gangs hold."""
    held: dict[tuple[str, int], int] = {}
    for gang in cluster.running_gangs():
        for r in gang.replicas:
            held[(r.pool, r.node_index)] = held.get((r.pool, r.node_index), 0) + r.gpu_count
    assert not failed & held.keys()
    state = await cluster.inventory()
    for config, reported in zip(POOLS, state.pools, strict=True):
        healthy = [i for i in range(config.node_count) if (config.name, i) not in failed]
        assert all(0 <= free <= config.gpus_per_node for free in reported.free_gpus_per_node)
        assert reported.free_gpus_per_node == tuple(
            config.gpus_per_node - held.get((config.name, i), 0) for i in healthy
        )


async def check_shares(cluster: InMemoryCluster) -> None:
    """Running gangs' shares name listed nodes, once each, and with the free GPUs fill every node."""
    state = await cluster.inventory()
    held = {p.name: [0] * len(p.free_gpus_per_node) for p in state.pools}
    for status in await cluster.statuses():
        if status.phase is not GangPhase.RUNNING:
            assert status.nodes == ()
            continue
        assert len({(s.pool, s.node_index) for s in status.nodes}) == len(status.nodes)
        for share in status.nodes:
            held[share.pool][share.node_index] += share.gpus
    for pool in state.pools:
        free = pool.free_gpus_per_node
        assert [h + f for h, f in zip(held[pool.name], free, strict=True)] == [pool.gpus_per_node] * len(free)


async def run_ops(ops: list[Op], journal: Path) -> None:
    clock = FakeClock()
    cluster = a_cluster(clock, *POOLS, journal=journal)
    failed: set[tuple[str, int]] = set()
    durations_s: dict[str, float] = {}
    for op in ops:
        match op:
            case Dispatch(job, replica_gpus, duration_s):
                created_before = cluster.dispatch_count(JobId(job), 1)
                with contextlib.suppress(GangRejected):
                    await cluster.dispatch(a_gang(job, *replica_gpus, duration_s=duration_s))
                if cluster.dispatch_count(JobId(job), 1) > created_before:
                    durations_s[job] = duration_s
            case Cancel(job):
                await cluster.cancel(JobId(job), 1, grace_period_s=0)
            case Evict(job):
                if await status_of(cluster, job) is not None:
                    cluster.inject_eviction(JobId(job), 1)
            case Preempt(job, grace_period_s):
                await cluster.evict(JobId(job), 1, grace_period_s, "preempted")
            case FailNode(pool, index):
                node = (POOLS[pool].name, min(index, POOLS[pool].node_count - 1))
                cluster.fail_node(*node)
                failed.add(node)
            case Advance(seconds):
                clock.advance(seconds)
        await check_capacity(cluster, failed)
        await check_shares(cluster)
        running = {g.job_id for g in cluster.running_gangs()}
        assert {s.job_id for s in await cluster.statuses() if s.phase is GangPhase.RUNNING} == running
        for status in await cluster.statuses():
            if status.phase is GangPhase.SUCCEEDED:
                assert status.finished_at_s is not None
                assert status.started_at_s is not None
                assert status.finished_at_s - status.started_at_s == durations_s[status.job_id]
    # The journal alone rebuilds the same cluster.
    assert await snapshot(a_cluster(clock, *POOLS, journal=journal)) == await snapshot(cluster)


@settings(max_examples=examples(100), deadline=None)
@given(OPS)
def test_free_gpus_stay_within_every_node(ops: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run_ops(ops, Path(tmp) / "c1.journal"))


# ---- preemption through the protocol, and where gangs sit ----------------------------------------


async def test_a_preempted_gang_keeps_its_gpus_for_its_grace_period_then_ends_evicted() -> None:
    clock = FakeClock()
    cluster = a_cluster(clock)
    await cluster.dispatch(a_gang("j1", 8, duration_s=100))

    await cluster.evict(JobId("j1"), 1, 30, "preempted for urgent-1")
    clock.advance(29)
    assert (await status_of(cluster, "j1")).phase is GangPhase.RUNNING  # type: ignore[union-attr]
    assert await free_per_node(cluster) == (0, 8, 8)

    clock.advance(1)
    assert await status_of(cluster, "j1") == GangStatus(
        JobId("j1"), 1, GangPhase.EVICTED, "preempted for urgent-1", START_S, START_S + 30
    )
    assert await free_per_node(cluster) == (8, 8, 8)


@pytest.mark.parametrize(
    ("grace_s", "phase", "ended_after_s"),
    [
        pytest.param(0, GangPhase.EVICTED, 0, id="no grace: evicted at once"),
        pytest.param(60, GangPhase.SUCCEEDED, 10, id="finishing within the grace period: it succeeds"),
    ],
)
async def test_a_preemption_ends_at_the_grace_period_or_the_gangs_own_end(
    grace_s: float, phase: GangPhase, ended_after_s: float
) -> None:
    clock = FakeClock()
    cluster = a_cluster(clock)
    await cluster.dispatch(a_gang("j1", 8, duration_s=10))

    await cluster.evict(JobId("j1"), 1, grace_s, "preempted")
    clock.advance(100)

    status = await status_of(cluster, "j1")
    assert status is not None
    assert (status.phase, status.finished_at_s, status.nodes) == (phase, START_S + ended_after_s, ())


async def test_evicting_a_missing_or_finished_gang_is_fine_and_a_second_eviction_keeps_the_first_end() -> (
    None
):
    clock = FakeClock()
    cluster = a_cluster(clock)
    await cluster.evict(JobId("ghost"), 1, 5, "preempted")
    await cluster.dispatch(a_gang("j1", 8, duration_s=100))

    await cluster.evict(JobId("j1"), 1, 10, "first")
    await cluster.evict(JobId("j1"), 1, 50, "second")
    clock.advance(10)

    assert await status_of(cluster, "j1") == GangStatus(
        JobId("j1"), 1, GangPhase.EVICTED, "first", START_S, START_S + 10
    )


async def test_a_preemption_in_its_grace_period_survives_a_reload_from_the_journal(tmp_path: Path) -> None:
    clock = FakeClock()
    journal = tmp_path / "c1.jsonl"
    cluster = a_cluster(clock, journal=journal)
    await cluster.dispatch(a_gang("j1", 8, duration_s=100))
    await cluster.evict(JobId("j1"), 1, 30, "preempted")

    reloaded = a_cluster(clock, journal=journal)
    clock.advance(30)

    status = await status_of(reloaded, "j1")
    assert status is not None
    assert (status.phase, status.message) == (GangPhase.EVICTED, "preempted")


async def test_node_shares_index_the_inventorys_nodes_even_after_a_node_before_them_fails() -> None:
    clock = FakeClock()
    cluster = a_cluster(clock, a_pool(nodes=4))
    await cluster.dispatch(a_gang("a", 8))  # node 0
    await cluster.dispatch(a_gang("b", 4, 4))  # best fit packs both replicas onto node 1
    await cluster.dispatch(a_gang("c", 8))

    cluster.fail_node("h100", 0)
    inventory = await cluster.inventory()
    free = inventory.pools[0].free_gpus_per_node

    for job in ("b", "c"):
        status = await status_of(cluster, job)
        assert status is not None
        assert status.nodes
        for share in status.nodes:
            # What the gang holds plus what is free never exceeds the node it names.
            assert share.gpus + free[share.node_index] <= 8
    held = [0] * len(free)
    for job in ("b", "c"):
        for share in (await status_of(cluster, job)).nodes:  # type: ignore[union-attr]
            held[share.node_index] += share.gpus
    assert [h + f for h, f in zip(held, free, strict=True)] == [8, 8, 8]
    # Node 0 is gone, so node 1 (where b packed both replicas) is now the inventory's first.
    assert (await status_of(cluster, "b")).nodes == (NodeShare("h100", 0, 8),)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("node_count", "failed", "listed"),
    [
        pytest.param(3, set(), (0, 1, 2), id="all healthy: every node at its own index"),
        pytest.param(4, {0}, (1, 2, 3), id="first failed: every later node moves up one"),
        pytest.param(4, {1, 2}, (0, 3), id="two failed in the middle: node 3 is listed second"),
        pytest.param(2, {0, 1}, (), id="all failed: none listed"),
        pytest.param(0, set(), (), id="no nodes"),
    ],
)
def test_the_inventory_lists_healthy_nodes_in_pool_order(
    node_count: int, failed: set[int], listed: tuple[int, ...]
) -> None:
    assert listed_nodes(node_count, failed) == listed


async def test_node_shares_follow_failed_nodes_across_a_reload_from_the_journal(tmp_path: Path) -> None:
    clock = FakeClock()
    journal = tmp_path / "c1.jsonl"
    cluster = a_cluster(clock, a_pool(nodes=4), journal=journal)
    await cluster.dispatch(a_gang("a", 8, 8, 8))  # nodes 0, 1 and 2
    await cluster.dispatch(a_gang("b", 8))  # node 3
    cluster.fail_node("h100", 1)  # evicts a

    reloaded = a_cluster(clock, a_pool(nodes=4), journal=journal)

    for c in (cluster, reloaded):
        # Node 3 is third of the healthy nodes 0, 2 and 3.
        assert await free_per_node(c) == (8, 8, 0)
        assert (await status_of(c, "b")).nodes == (NodeShare("h100", 2, 8),)  # type: ignore[union-attr]
