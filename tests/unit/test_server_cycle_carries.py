"""The leader's own cycle (`Scheduler.run_cycle`) over a queue shaped as bench/scale_depth.py's keeps
carrying its plan from cycle to cycle (issue 33). Counted, not timed.

In process the plan's carry paid (bench/depth_cycle.py: 110 ms of CPU a steady cycle at a million
queued), but not through the server (602 ms): the server's queue held jobs submitted through the API,
of another kind than the seeded jobs ahead of them, and that tenant ended every stretch taken in bulk
at its next gang, so that half the queue was decided gang by gang. Here the cycle runs as the server
runs it: the job cache over a store, 50 member clusters that run the 50 admitted gangs (statuses,
usage from the ledger), the inputs read from the store, a clock that moves, the reconciler between
cycles, one submission through the store before each cycle, and one tenant's jobs of the API's kind
queued after its seeded ones. Each steady cycle must decide few gangs one by one and edit its
stretches from the last cycle's, and the written reasons must be compared by the waits' identity.
"""

from __future__ import annotations

from dataclasses import replace

from bench.depth_cycle import api_record, measure
from bench.scale_depth import _queued_txn, queued_record
from clusters.memory import InMemoryCluster
from federation.store.job_store import InMemoryJobStore
from federation.store.records import ClusterRecord, PoolConfig, TenantRecord
from placement.model import CapacityKind, ClusterName, GpuType, Provider, TenantId
from placement.queue_chunks import CHUNK
from tests.unit.reconcile_world import Clock, World, wired_world

QUEUED = 8_000
API_JOBS = 30
CLUSTERS = 50
TENANTS = 100


async def test_the_servers_steady_cycles_keep_carrying_the_plan() -> None:
    clock = Clock()
    clock.now = 1_800_000_000.0
    store = InMemoryJobStore()
    store.compress_wait_reasons = True
    for t in range(TENANTS):
        await store.put_tenant(TenantRecord(name=TenantId(f"t{t}")))
    # Seeded as scale_depth seeds etcd (the store's own encoding), an hour before the clock.
    for start in range(0, QUEUED, 30):
        await store.kv.txn_many([_queued_txn(n, clock.now) for n in range(start, min(QUEUED, start + 30))])
    records: list[ClusterRecord] = []
    clusters: dict[str, InMemoryCluster] = {}
    pools = (PoolConfig("a100", GpuType("A100"), CapacityKind.PRIVATE, 1.4, gpus_per_node=8, node_count=1),)
    for c in range(CLUSTERS):
        record = ClusterRecord(
            name=ClusterName(f"c{c:02d}"), provider=Provider.PRIVATE, region=f"dc{c % 5}", pools=pools
        )
        records.append(record)
        clusters[record.name] = InMemoryCluster(
            record.name, provider=record.provider, region=record.region, pools=pools, clock=clock
        )
    async with wired_world(store, records, clusters, clock) as world:
        await _steady_cycles_carry(world)


async def _steady_cycles_carry(world: World) -> None:
    store, cache, scheduler, reconciler, clock = (
        world.store,
        world.cache,
        world.scheduler,
        world.reconciler,
        world.clock,
    )
    carry = scheduler._requests.plan_carry
    made = QUEUED
    # The first cycles admit 50 gangs, which the reconciler dispatches and the clusters run.
    for _ in range(3):
        clock.now += 2.0
        await reconciler.tick(None)
        await world.caught_up()
        await scheduler.run_cycle(None)
    assert sum(1 for s in cache.live_jobs() if s.value.placement is not None) == CLUSTERS
    # Then, as scale_depth's calls after the first pass, tenant t7's jobs submitted through the
    # API: another kind of gang (another run-time limit and class, of a higher priority).
    for n in range(API_JOBS):
        job = api_record(n, clock.now)
        await store.create_job(job, idempotency_key=job.job_id, manifest_digest="d")
    for cycle in range(6):
        clock.now += 2.0
        await reconciler.tick(None)
        made += 1
        job = api_record(API_JOBS + cycle, clock.now) if cycle % 2 else queued_record(made, clock.now)
        await store.create_job(job, idempotency_key=job.job_id, manifest_digest="d")
        await world.caught_up()
        before = (carry.one_by_one, carry.in_bulk, carry.carried, carry.made_afresh)
        compared, copied = carry.queue.compared, scheduler._requests.queue_copied
        waits_compared = scheduler.waits_compared
        result = await scheduler.run_cycle(None)
        # The queue is handed on as its edits: no gang compared with the last queue, and only the
        # chunks the submission touched copied (`placement.queue_chunks`).
        assert carry.queue.compared == compared, cycle
        assert scheduler._requests.queue_copied - copied <= CHUNK, cycle
        one_by_one, in_bulk, edited, afresh = (
            after - was
            for was, after in zip(
                before, (carry.one_by_one, carry.in_bulk, carry.carried, carry.made_afresh), strict=True
            )
        )
        assert result.admitted == 0
        waiting = result.waiting
        assert one_by_one + in_bulk == waiting
        # The kinds' first gangs and the questions' gaps, not half the queue (it was 1,500 here).
        assert one_by_one < waiting // 5, (cycle, one_by_one, in_bulk)
        assert edited > 0, (cycle, edited)
        assert afresh == 0, (cycle, afresh)
        # Every reason is written: the next cycle compares by the waits' identity.
        assert scheduler._last_waits is not None
        # By the chunks the two plans' waits share: the waits decided one by one and the chunks the
        # stretches' edits copied are compared, not every wait (at 8,000 queued a stretch's edits
        # touch most of its chunks of 1,024; bench/depth_cycle.py's test below is deeper).
        assert scheduler.waits_compared - waits_compared < waiting, cycle


def test_the_api_kind_is_another_kind_than_the_seeded_jobs() -> None:
    """What the test above relies on: scale_depth's API jobs are not its seeded jobs' kind."""
    seeded, api = queued_record(7, 0.0), api_record(0, 0.0)
    assert (seeded.tenant, seeded.user) == (api.tenant, api.user)
    assert replace(seeded.spec, name=api.spec.name) != api.spec


def test_the_cycle_as_the_server_runs_it_decides_few_gangs_one_by_one_at_depth() -> None:
    """bench/depth_cycle.py's cycle (the scheduler's live map, the changes, the carried queue, the
    reasons compared), with the API's jobs submitted after the first cycle admitted tenants t0 to
    t49's first jobs: t7, running one gang, has jobs of two priorities. Each steady cycle decides a
    few hundred gangs one by one, whatever the depth (it was half the queue: 10,000 of 20,000)."""
    measured = measure(20_000, steady_cycles=2, api_jobs=50)
    assert measured.steady_one_by_one + measured.steady_in_bulk >= 20_000
    assert measured.steady_one_by_one < 2_000, measured
    assert measured.steady_stretches_edited > 0, measured
    assert measured.steady_stretches_afresh == 0, measured
    # Nothing read the whole queue to find what changed in it: the scheduler's edits were taken.
    assert measured.steady_queue_compared == 0, measured
    assert 0 < measured.steady_queue_copied <= 2 * CHUNK, measured
    # And the reasons' comparison read the waits made anew and the chunks edited, not 20,000.
    assert 0 < measured.steady_waits_compared < 4_000, measured
