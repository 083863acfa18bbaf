"""The capacity reconciler's decisions and effects, on an in-memory provisioner and store.

Time is a number the test moves; the "cluster" reports as ready the nodes the provisioner has
finished, and as busy the nodes the test says run jobs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import pytest

from federation.capacity.pools import PoolKey, ScalablePoolEntry, scalable_pools
from federation.capacity.reconciler import CapacityReconciler
from federation.capacity.records import CapacitySettings, PendingOp, PlanKind, PlanRecord, ProvisionerKind
from federation.capacity.store import CapacityStore
from federation.store.jobs import JobPlacement, JobRecord
from federation.store.kv_memory import MemoryKv
from federation.store.records import ClusterRecord, PoolConfig
from iac.api import ChangeResult
from iac.errors import QuotaExceeded, Throttled
from iac.memory import InMemoryProvisioner
from iac.pools import PoolSpec
from placement.model import (
    CapacityKind,
    CapacityRequest,
    ClusterName,
    ClusterState,
    GpuType,
    JobId,
    JobPhase,
    NodePool,
    Provider,
    Waiting,
    WaitReason,
)
from placement.model_plan import WaitCode
from tests.job_builder import build_job

T = TypeVar("T")

CLUSTER = ClusterName("aws-1")
H100 = GpuType("H100")
KEY: PoolKey = (CLUSTER, "h100-od")
SETTINGS = CapacitySettings(
    provisioner=ProvisionerKind.SIMULATED,
    lead_time_s=10.0,
    idle_ttl_s=30.0,
    max_nodes_per_pool=8,
    retry_base_s=2.0,
    retry_max_s=60.0,
)


class FlakyProvisioner(InMemoryProvisioner):
    """Fails the next `failures` applies with the given error, then works."""

    def __init__(self, *, lead_time_s: float, clock: Clock) -> None:
        super().__init__(lead_time_s=lead_time_s, clock=clock)
        self.failures: list[Exception] = []

    async def apply(self, spec: PoolSpec, nodes: int, *, busy_nodes: int = 0) -> ChangeResult:
        if self.failures:
            raise self.failures.pop(0)
        return await super().apply(spec, nodes, busy_nodes=busy_nodes)


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    clock: Clock
    kv: MemoryKv
    store: CapacityStore
    provisioner: FlakyProvisioner
    pools: dict[PoolKey, ScalablePoolEntry]
    busy: dict[PoolKey, int] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def inventories(self) -> list[ClusterState]:
        pools = []
        for key, entry in self.pools.items():
            assert entry.spec is not None
            status = await self.provisioner.status(entry.spec)
            ready = status.ready_nodes if status.exists else entry.min_nodes
            busy = self.busy.get(key, 0)
            gpn = entry.config.gpus_per_node
            pools.append(
                NodePool(
                    entry.config.name,
                    H100,
                    entry.config.kind,
                    6.88,
                    gpn,
                    (0,) * busy + (gpn,) * (ready - busy),
                )
            )
        return [ClusterState(CLUSTER, Provider.AWS, "us-east-1", tuple(pools))]

    def reconciler(self, settings: CapacitySettings = SETTINGS) -> CapacityReconciler:
        return CapacityReconciler(
            store=self.store,
            provisioner=self.provisioner,
            settings=settings,
            pools=self.pools,
            inventories=self.inventories,
            job=lambda _: None,
            clock=self.clock,
        )

    def nodes(self) -> int:
        return self.provisioner.nodes(f"{CLUSTER}.h100-od")


@pytest.fixture
def world() -> Iterator[World]:
    clock = Clock()
    kv = MemoryKv()
    record = ClusterRecord(
        CLUSTER,
        Provider.AWS,
        "us-east-1",
        (PoolConfig("h100-od", H100, CapacityKind.ON_DEMAND, 6.88, 8, 2),),
        scalable=True,
    )
    provisioner = FlakyProvisioner(lead_time_s=SETTINGS.lead_time_s, clock=clock)
    w = World(clock, kv, CapacityStore(kv), provisioner, scalable_pools([record], SETTINGS))
    entry = w.pools[KEY]
    assert entry.spec is not None
    w.run(provisioner.apply(entry.spec, 2))
    yield w
    w.loop.close()


def gang(job: str, nodes: int = 4) -> CapacityRequest:
    return CapacityRequest(CLUSTER, "h100-od", H100, CapacityKind.ON_DEMAND, nodes, (JobId(job),))


def test_a_request_grows_the_pool_once_and_the_nodes_arrive_after_the_lead_time(world: World) -> None:
    rec = world.reconciler()
    rec.offer([gang("big")], {})
    world.run(rec.tick(None))
    assert world.nodes() == 6
    ops = world.run(world.store.list_ops())
    assert [(o.nodes_from, o.nodes_to, o.job_ids) for o in ops] == [(2, 6, (JobId("big"),))]

    # The placer repeats the request every cycle until the nodes show: it is not asked again.
    world.clock.now += 5
    world.run(rec.tick(None))
    assert world.nodes() == 6
    assert sum(1 for op, *_ in world.provisioner.operations if op.value == "scale_up") == 2
    # Meanwhile the placer sees the pool as already asked of.
    (state,) = rec.with_scalable_pools(world.run(world.inventories()))
    (pool,) = state.scalable_pools
    assert (pool.node_count, pool.requested_nodes, pool.addable_nodes) == (2, 4, 2)

    world.clock.now += 6
    world.run(rec.tick(None))
    assert world.run(world.store.list_ops()) == []
    (interval,) = world.run(world.store.list_intervals())
    assert (interval.gpu_count, interval.end_s) == (32, None)


def test_idle_nodes_go_after_the_ttl_down_to_the_configured_count_never_a_busy_one(world: World) -> None:
    rec = world.reconciler()
    rec.offer([gang("big")], {})
    world.run(rec.tick(None))
    world.clock.now += 11
    rec.offer([], {})
    world.busy[KEY] = 4  # the gang runs on four of the six nodes
    world.run(rec.tick(None))
    world.clock.now += 31
    world.run(rec.tick(None))
    assert world.nodes() == 4  # the two idle nodes went; the four busy ones stay

    world.busy[KEY] = 1  # the gang ended; one node picked up something small
    world.run(rec.tick(None))
    world.clock.now += 29
    world.run(rec.tick(None))
    assert world.nodes() == 4  # idle for 29 s < TTL
    world.clock.now += 2
    world.run(rec.tick(None))
    assert world.nodes() == 2  # back to the configured count; the busy node is within it
    intervals = world.run(world.store.list_intervals())
    assert sum(iv.gpu_count for iv in intervals) == 32
    assert {iv.end_s is not None for iv in intervals} == {True}


def test_a_busy_floor_is_kept_even_above_the_configured_count(world: World) -> None:
    rec = world.reconciler()
    rec.offer([gang("big")], {})
    world.run(rec.tick(None))
    world.clock.now += 11
    rec.offer([], {})
    world.busy[KEY] = 5
    world.run(rec.tick(None))
    world.clock.now += 100
    world.run(rec.tick(None))
    assert world.nodes() == 5


@pytest.mark.parametrize(
    ("settings", "code"),
    [
        pytest.param(
            replace(SETTINGS, cloud_gpu_limits=((Provider.AWS, 40),)), "provider_gpu_limit", id="gpu-limit"
        ),
        pytest.param(
            replace(SETTINGS, spend_ceiling_usd_per_hour=200.0), "spend_ceiling", id="spend-ceiling"
        ),
        pytest.param(replace(SETTINGS, max_nodes_per_pool=5), "pool_max_nodes", id="pool-max"),
    ],
)
def test_a_request_over_a_limit_is_refused_and_the_job_says_why(
    world: World, settings: CapacitySettings, code: str
) -> None:
    record = ClusterRecord(
        CLUSTER,
        Provider.AWS,
        "us-east-1",
        (PoolConfig("h100-od", H100, CapacityKind.ON_DEMAND, 6.88, 8, 2),),
        scalable=True,
    )
    world.pools = scalable_pools([record], settings)
    rec = world.reconciler(settings)
    rec.offer([gang("big")], {})
    world.run(rec.tick(None))
    assert world.nodes() == 2
    assert world.run(world.store.list_ops()) == []
    placer = WaitReason(WaitCode.CAPACITY_REQUESTED, "asked for 4 nodes")
    (waiting,) = rec.annotate([Waiting(JobId("big"), (placer,))])
    (reason,) = waiting.reasons
    assert reason.code is WaitCode.CAPACITY_REFUSED
    assert code in reason.message


def test_a_gang_that_starts_elsewhere_before_the_nodes_could_be_ready_is_not_bought(world: World) -> None:
    rec = world.reconciler()
    rec.offer([gang("big")], {JobId("big"): world.clock.now + 5})
    world.run(rec.tick(None))
    assert world.nodes() == 2


def test_a_failure_is_retried_with_backoff_and_reported_until_it_succeeds(world: World) -> None:
    world.provisioner.failures = [Throttled("429 slow down"), Throttled("429 slow down")]
    rec = world.reconciler()
    rec.offer([gang("big")], {})
    world.run(rec.tick(None))
    (op,) = world.run(world.store.list_ops())
    assert (op.attempts, op.retryable, op.next_try_at_s - world.clock.now) == (1, True, 2.0)
    (waiting,) = rec.annotate([Waiting(JobId("big"), ())])
    assert waiting.reasons[0].code is WaitCode.CAPACITY_FAILED
    assert "429 slow down" in waiting.reasons[0].message

    world.clock.now += 1
    world.run(rec.tick(None))  # not yet: the backoff has not passed
    assert world.run(world.store.list_ops())[0].attempts == 1
    world.clock.now += 1
    world.run(rec.tick(None))
    (op,) = world.run(world.store.list_ops())
    assert (op.attempts, op.next_try_at_s - world.clock.now) == (2, 4.0)
    world.clock.now += 4
    world.run(rec.tick(None))
    (op,) = world.run(world.store.list_ops())
    assert op.applied
    assert not op.last_error
    assert world.nodes() == 6


def test_a_permanent_failure_waits_the_longest_interval(world: World) -> None:
    world.provisioner.failures = [QuotaExceeded("vCPU quota exceeded")]
    rec = world.reconciler()
    rec.offer([gang("big")], {})
    world.run(rec.tick(None))
    (op,) = world.run(world.store.list_ops())
    assert (op.retryable, op.next_try_at_s - world.clock.now) == (False, 60.0)
    (waiting,) = rec.annotate([Waiting(JobId("big"), ())])
    assert "a person must fix this" in waiting.reasons[0].message


def test_a_new_leader_finds_the_pending_operation_and_does_not_ask_again(world: World) -> None:
    first = world.reconciler()
    first.offer([gang("big")], {})
    world.run(first.tick(None))
    scale_ups = len(world.provisioner.operations)

    second = world.reconciler()
    second.offer([gang("big")], {})
    world.run(second.tick(None))
    assert [op for op in world.provisioner.operations[scale_ups:] if op[0].value == "scale_up"] == []
    world.clock.now += 11
    world.run(second.tick(None))
    assert world.run(world.store.list_ops()) == []


def test_a_scale_up_that_never_lands_is_asked_again(world: World) -> None:
    rec = world.reconciler()
    rec.offer([gang("big")], {})
    world.run(rec.tick(None))
    entry = world.pools[KEY]
    assert entry.spec is not None
    # The provisioner lost it (a restarted simulator): back to two nodes.
    world.run(world.provisioner.apply(entry.spec, 2))
    world.clock.now += 10 + 11
    world.run(rec.tick(None))
    (op,) = world.run(world.store.list_ops())
    assert not op.applied
    assert op.last_error
    world.clock.now += 2
    world.run(rec.tick(None))
    assert world.nodes() == 6


def test_a_fixed_plan_is_provisioned_ahead_and_released_after_its_end(world: World) -> None:
    now = world.clock.now
    plan = PlanRecord(
        "plan-1", PlanKind.FIXED, CLUSTER, H100, "infra", now, gpus=24, start_s=now + 100, end_s=now + 200
    )
    assert world.run(world.store.create_plan(plan))
    rec = world.reconciler()
    world.run(rec.tick(None))
    assert world.nodes() == 2
    world.clock.now = now + 89  # before start - lead time
    world.run(rec.tick(None))
    assert world.nodes() == 2
    world.clock.now = now + 90
    world.run(rec.tick(None))
    assert world.nodes() == 3
    (op,) = world.run(world.store.list_ops())
    assert op.plan_ids == ("plan-1",)
    world.clock.now = now + 150
    world.run(rec.tick(None))
    assert world.nodes() == 3
    world.clock.now = now + 200  # ended: the nodes are idle since they joined, long past the TTL
    world.run(rec.tick(None))
    assert world.nodes() == 2


def test_a_cancelled_plan_holds_nothing(world: World) -> None:
    now = world.clock.now
    plan = PlanRecord(
        "plan-1",
        PlanKind.FIXED,
        CLUSTER,
        H100,
        "infra",
        now,
        gpus=24,
        start_s=now,
        end_s=now + 500,
        cancelled_at_s=now,
    )
    world.run(world.store.create_plan(plan))
    rec = world.reconciler()
    world.run(rec.tick(None))
    assert world.nodes() == 2


def test_a_deadline_plan_holds_enough_for_its_jobs_and_nothing_once_they_are_done(world: World) -> None:
    now = world.clock.now
    jobs = {JobId("a"): (16, 3600), JobId("b"): (16, 3600)}
    done: set[JobId] = set()

    def job(job_id: JobId) -> JobRecord:
        gpus, runtime = jobs[job_id]
        record = build_job(job_id, gpus=gpus, phase=JobPhase.SUCCEEDED if job_id in done else JobPhase.QUEUED)
        return replace(record, spec=replace(record.spec, max_runtime_s=runtime))

    # Both jobs, an hour each, within 1 h 10 min: they must run side by side, on 32 GPUs (4 nodes).
    plan = PlanRecord(
        "plan-d", PlanKind.DEADLINE, CLUSTER, H100, "infra", now, end_s=now + 4200, job_ids=tuple(jobs)
    )
    world.run(world.store.create_plan(plan))
    rec = CapacityReconciler(
        store=world.store,
        provisioner=world.provisioner,
        settings=SETTINGS,
        pools=world.pools,
        inventories=world.inventories,
        job=job,
        clock=world.clock,
    )
    world.run(rec.tick(None))
    assert world.nodes() == 4
    world.clock.now += 11
    world.run(rec.tick(None))
    done.update(jobs)
    world.clock.now += 31
    world.run(rec.tick(None))
    assert world.nodes() == 2


def test_the_old_nodes_do_not_go_as_the_new_ones_arrive(world: World) -> None:
    rec = world.reconciler()
    world.run(rec.tick(None))  # the two configured nodes start their idle clocks
    world.clock.now += 100  # ... long past the TTL, but they are the pool's floor
    rec.offer([gang("big")], {})
    world.run(rec.tick(None))
    world.clock.now += 11
    world.run(rec.tick(None))  # the four new nodes land; the gang is admitted but not yet on them
    assert world.nodes() == 6
    world.clock.now += 29
    world.run(rec.tick(None))
    assert world.nodes() == 6


def test_a_gang_admitted_to_the_pool_holds_its_nodes_before_its_pods_show(world: World) -> None:
    admitted = replace(
        build_job("admitted", gpus=32, phase=JobPhase.ADMITTED),
        placement=JobPlacement(CLUSTER, H100, CapacityKind.ON_DEMAND, 6.88),
    )
    live: list[JobRecord] = []
    rec = CapacityReconciler(
        store=world.store,
        provisioner=world.provisioner,
        settings=SETTINGS,
        pools=world.pools,
        inventories=world.inventories,
        job=lambda _: None,
        clock=world.clock,
        live_jobs=lambda: live,
    )
    rec.offer([gang("big")], {})
    world.run(rec.tick(None))
    world.clock.now += 11
    rec.offer([], {})
    world.run(rec.tick(None))
    live.append(admitted)
    world.clock.now += 100
    world.run(rec.tick(None))
    assert world.nodes() == 4  # the gang's four stay, busy or not; the two spare ones go
    live.clear()  # it ended: its nodes are idle from now
    world.run(rec.tick(None))
    world.clock.now += 31
    world.run(rec.tick(None))
    assert world.nodes() == 2


def test_an_operation_a_crashed_leader_recorded_but_never_applied_is_applied_by_the_next(
    world: World,
) -> None:
    op = PendingOp(CLUSTER, "h100-od", 2, 6, world.clock.now, "4 node(s) for big", (JobId("big"),))
    world.run(world.store.put_op(op, fence=None))
    rec = world.reconciler()
    rec.offer([gang("big")], {})
    world.run(rec.tick(None))
    assert world.nodes() == 6
    (stored,) = world.run(world.store.list_ops())
    assert stored.applied


def test_with_no_word_to_add_the_placers_waits_are_handed_on_as_they_are() -> None:
    # Not copied: a copy of a deep queue's waits held the event loop every cycle (issue 33).
    from federation.capacity.track import annotate

    waits = tuple(Waiting(JobId(f"j{i}"), ()) for i in range(3))
    assert annotate(waits, {}) is waits
    note = WaitReason(WaitCode.CAPACITY_FAILED, "quota")
    marked = annotate(waits, {JobId("j1"): note})
    assert [w.reasons for w in marked] == [(), (note,), ()]
    assert marked[0] is waits[0]
    assert marked[2] is waits[2]
