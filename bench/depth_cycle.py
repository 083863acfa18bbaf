"""The leader's scheduling cycle at queue depth, in process (issue 33): the CPU of the server's own
cycle functions over `bench/scale_depth.py`'s queue, without etcd, a server or gRPC around them.

    python bench/depth_cycle.py                    # 10,000 and 100,000 queued
    python bench/depth_cycle.py --depths 10000 100000 200000
    python bench/scale_depth.py --cycle-only       # the same, from scale_depth
    python bench/depth_cycle.py --quick --arrivals 100
                                                   # each steady cycle follows 100 submissions, as a
                                                   # cycle amid a stream of them does

What one cycle is here, as in `Scheduler.run_cycle`: the snapshot and plan
(`scheduler._snapshot_and_plan`, on the live jobs as the scheduler keeps them, with the queue carried
from the last cycle and the jobs changed since, as the job cache's feed names them, and the plan
given what the last plan over that queue kept, `GangRequests.plan_carry`: the tenants' lists, the
kinds' counts and the stretches taken in bulk, `placement/stretch_carry.py`) and the comparison of
the waiting jobs' reasons with those last written (`Scheduler._reasons_to_write`: the waits that are
the last cycle's very objects found by C-level comparisons and not read, the others place by place or
looked up, and the jobs no longer waiting looked for among those that left the queue or were
admitted). The 50 clusters of one 8-A100 node each, and the queue, are
`scale_depth`'s, with the jobs its calls submit through the API: tenant t7's (user u7's) manifest, a
kind of gang of its own (another run-time limit and class than the seeded jobs', the class's value a
higher priority), 200 of them queued after the seeded ones (`API_JOBS`, scale_depth's SubmitJob calls at its first depth). Without them the benchmark
missed what the server's cycle does: a tenant of two kinds of two priorities, never settled, ended
every stretch taken in bulk (`placement.plan._Cycle.take_in_bulk`) at its next gang, and half of a
deep queue was decided gang by gang (602 ms of CPU at a million through the server, 110 here). The
first cycle builds every request and admits 50 jobs, which then hold their nodes
(admitted, as the server's snapshot sees them until they are dispatched); then the API's jobs are
submitted, and a cycle plans them; each steady cycle after it
follows one new submission through the API, as `scale_depth` measures a cycle after a SubmitJob. The
figures say how many gangs a steady plan decided one by one and how many it took in stretches, and
how many stretches it edited from the last cycle's. Measured with
`time.process_time`, so that other work on a shared machine counts less; the median of the steady
cycles. It measures where the server's cycle CPU goes (`gpufed_scheduling_cycle_cpu_seconds` is the
snapshot and plan), not its wall time, which `scale_depth` measures through the server.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scale_depth import CLUSTERS, MANIFEST, TENANTS, queued_record  # noqa: E402
from clusters.memory import InMemoryCluster  # noqa: E402
from federation.scheduling.scheduler import _snapshot_and_plan  # noqa: E402
from federation.scheduling.snapshot import GangRequests, PlacerInputs  # noqa: E402
from federation.spec.training_job import parse_manifest  # noqa: E402
from federation.store.job_store import InMemoryJobStore, Stored  # noqa: E402
from federation.store.jobs import JobPlacement, JobRecord, Owner, PhaseEvent  # noqa: E402
from federation.store.records import PoolConfig, SchedulingSettings, TenantRecord  # noqa: E402
from placement.model import (  # noqa: E402
    CapacityKind,
    ClusterName,
    ClusterState,
    GpuType,
    JobId,
    JobPhase,
    Provider,
    TenantId,
)
from tests.unit.reconcile_world import reasons_scheduler  # noqa: E402

STEADY_CYCLES = 3
# Jobs submitted through the API before the cycles are timed (scale_depth's 200 SubmitJob calls), all
# of tenant t7 (its calls' user, u7).
API_JOBS = 200
API_TENANT = 7


@dataclass(frozen=True)
class CycleCpu:
    queued: int
    first_ms: float
    steady_ms: float
    # Of `steady_ms`: the snapshot and plan, and the comparison of the waiting jobs' reasons.
    steady_plan_ms: float
    steady_reasons_ms: float
    # A steady plan's gangs decided one by one, and taken in stretches (`PlanCarry`'s counts), and its
    # stretches edited from the last cycle's and made afresh.
    steady_one_by_one: int = 0
    steady_in_bulk: int = 0
    steady_stretches_edited: int = 0
    steady_stretches_afresh: int = 0
    # A steady cycle's queue entries read whole: the gangs the plan compared place by place with the
    # last plan's queue (`QueueCarry._changes`; none when it takes the scheduler's edits) and the
    # requests copied into the scheduler's queue chunks (`GangRequests.queue_copied`).
    steady_queue_compared: int = 0
    steady_queue_copied: int = 0
    # And the waits the reasons' comparison read one by one (`Scheduler.waits_compared`).
    steady_waits_compared: int = 0


def _inventories() -> list[ClusterState]:
    async def read() -> list[ClusterState]:
        states = []
        for c in range(CLUSTERS):
            pools = (
                PoolConfig("a100", GpuType("A100"), CapacityKind.PRIVATE, 1.4, gpus_per_node=8, node_count=1),
            )
            cluster = InMemoryCluster(
                ClusterName(f"c{c:02d}"), provider=Provider.PRIVATE, region=f"dc{c % 5}", pools=pools
            )
            states.append(await cluster.inventory())
        return states

    return asyncio.run(read())


def api_record(n: int, now: float) -> JobRecord:
    """The `n`th job submitted through the API by scale_depth's calls: its manifest (`MANIFEST`) for
    tenant t7, queued after the seeded jobs."""
    seeded = queued_record(API_TENANT, now)
    classes = {c.name: c.value for c in SchedulingSettings().priority_classes}
    spec = parse_manifest(MANIFEST, priority_classes=list(classes))
    at_s = now + n * 1e-3
    return replace(
        seeded,
        job_id=JobId(f"api-{n:07d}"),
        spec=replace(spec, tenant=seeded.tenant),
        # As SubmitJob sets it: its class's value ("normal", 1000), where the seeded jobs' class is
        # none the settings name (100): the API's jobs go first in their tenant's queue.
        priority=classes[spec.priority_class],
        submitted_at_s=at_s,
        queued_at_s=at_s,
        events=(PhaseEvent(JobPhase.QUEUED, at_s, 1),),
    )


def measure(
    queued: int, steady_cycles: int = STEADY_CYCLES, api_jobs: int = API_JOBS, arrivals: int = 1
) -> CycleCpu:
    """The first and the steady cycles' CPU over `queued` queued jobs and `api_jobs` more."""
    now = time.time()
    records: dict[JobId, JobRecord] = {}
    for n in range(queued):
        record = queued_record(n, now)
        records[record.job_id] = record
    inputs = PlacerInputs(
        settings=SchedulingSettings(),
        tenants=tuple(TenantRecord(name=TenantId(f"t{i}")) for i in range(TENANTS)),
        users={},
        approvals=(),
    )
    inventories = _inventories()
    requests = GangRequests()
    store = InMemoryJobStore()
    store.compress_wait_reasons = True
    scheduler = reasons_scheduler(store)
    revision = 0
    # The scheduler's copy of the live jobs, and those changed since the last cycle (None: all).
    live: dict[JobId, Stored[JobRecord]] = {r.job_id: Stored(r, revision) for r in records.values()}
    changes: dict[JobId, Stored[JobRecord] | None] | None = None

    def change(record: JobRecord) -> None:
        nonlocal changes
        live[record.job_id] = Stored(record, revision)
        if changes is not None:
            changes[record.job_id] = live[record.job_id]

    def cycle() -> tuple[float, float]:
        nonlocal revision, changes
        began = time.process_time()
        # With a `between`, as the server passes its `StepAside`: the passes over the queue go in runs.
        planned = _snapshot_and_plan(
            live, changes, inputs, inventories, {}, {}, 0, now, requests, between=_no_turn
        )
        changes = {}
        planned_at = time.process_time()
        # Where the scheduler looks for the jobs no longer waiting (`Scheduler._write_reasons`).
        admitted = {a.job_id for a in planned.plan.admissions}
        maybe_left = None
        if planned.departed is not None:
            maybe_left = scheduler._maybe_left | planned.departed | admitted
        changed, left = scheduler._reasons_to_write(
            planned.plan.waiting, _no_turn, maybe_left, planned.queued_ids, admitted
        )
        done = time.process_time()
        # As written: what the next cycle compares with.
        for write in changed:
            scheduler._written_reasons[write.job_id] = (write.key, write.reasons)
        for job_id in left:
            del scheduler._written_reasons[job_id]
        scheduler._maybe_left = set()
        scheduler._waits_written()
        revision += 1
        for admission in planned.plan.admissions:
            job_id = admission.job_id
            records[job_id] = _admitted(records[job_id], admission.cluster, now)
            change(records[job_id])
        return 1000 * (planned_at - began), 1000 * (done - planned_at)

    carry = requests.plan_carry
    first = sum(cycle())
    # After the first cycle, as scale_depth's calls come after the server's first pass: the API's jobs
    # (of a higher priority) wait behind the 50 running gangs of tenants t0 to t49, t7 among them.
    for n in range(api_jobs):
        record = api_record(n, now)
        records[record.job_id] = record
        change(record)
    cycle()
    plans, reasons = [], []

    def counts() -> tuple[int, ...]:
        queue = carry.queue
        return (
            carry.one_by_one,
            carry.in_bulk,
            carry.carried,
            carry.made_afresh,
            queue.compared,
            requests.queue_copied,
            scheduler.waits_compared,
        )

    counted = counts()
    for k in range(steady_cycles):
        # One new submission, as scale_depth's cycle follows a SubmitJob (or `arrivals` of them: what
        # a cycle finds during a stream of submissions).
        for a in range(arrivals):
            record = api_record(api_jobs + k * arrivals + a, now)
            records[record.job_id] = record
            change(record)
        plan_ms, reasons_ms = cycle()
        plans.append(plan_ms)
        reasons.append(reasons_ms)
    one_by_one, in_bulk, edited, afresh, compared, copied, waits_compared = (
        (after - before) // steady_cycles for before, after in zip(counted, counts(), strict=True)
    )
    totals = [p + r for p, r in zip(plans, reasons, strict=True)]
    return CycleCpu(
        queued=queued,
        first_ms=first,
        steady_ms=statistics.median(totals),
        steady_plan_ms=statistics.median(plans),
        steady_reasons_ms=statistics.median(reasons),
        steady_one_by_one=one_by_one,
        steady_in_bulk=in_bulk,
        steady_stretches_edited=edited,
        steady_stretches_afresh=afresh,
        steady_queue_compared=compared,
        steady_queue_copied=copied,
        steady_waits_compared=waits_compared,
    )


def _no_turn() -> None:
    """The cycle's `between` here: no event loop waits for a turn."""


def _admitted(record: JobRecord, cluster: str, now: float) -> JobRecord:
    placement = JobPlacement(ClusterName(cluster), GpuType("A100"), CapacityKind.PRIVATE, 1.4)
    return record.transition(JobPhase.ADMITTED, by=Owner.SCHEDULER, at_s=now, placement=placement)


def figures(results: list[CycleCpu]) -> list[str]:
    lines = []
    for r in results:
        lines.append(f"cycle_cpu_{r.queued}_first_ms: {r.first_ms:.0f} ms")
        lines.append(f"cycle_cpu_{r.queued}_steady_ms: {r.steady_ms:.0f} ms")
        lines.append(f"cycle_cpu_{r.queued}_steady_snapshot_plan_ms: {r.steady_plan_ms:.0f} ms")
        lines.append(f"cycle_cpu_{r.queued}_steady_reasons_ms: {r.steady_reasons_ms:.0f} ms")
        lines.append(f"cycle_{r.queued}_steady_gangs_one_by_one: {r.steady_one_by_one} gangs")
        lines.append(f"cycle_{r.queued}_steady_gangs_in_bulk: {r.steady_in_bulk} gangs")
        lines.append(f"cycle_{r.queued}_steady_stretches_edited: {r.steady_stretches_edited} stretches")
        lines.append(f"cycle_{r.queued}_steady_stretches_afresh: {r.steady_stretches_afresh} stretches")
        lines.append(f"cycle_{r.queued}_steady_queue_compared: {r.steady_queue_compared} gangs")
        lines.append(f"cycle_{r.queued}_steady_queue_copied: {r.steady_queue_copied} requests")
        lines.append(f"cycle_{r.queued}_steady_waits_compared: {r.steady_waits_compared} waits")
        lines.append(f"cycle_cpu_{r.queued}_steady_us_per_queued_job: {1000 * r.steady_ms / r.queued:.2f} us")
    shallow, deep = results[0], results[-1]
    lines.append(
        f"cycle_cpu_ratio_{deep.queued}_to_{shallow.queued}: {deep.steady_ms / shallow.steady_ms:.1f} ratio"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--depths", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--quick", action="store_true", help="2,000 and 20,000 queued")
    parser.add_argument(
        "--arrivals",
        type=int,
        default=1,
        help="submissions each steady cycle follows (1, as scale_depth; more: a cycle amid a stream)",
    )
    args = parser.parse_args(argv)
    depths = [2_000, 20_000] if args.quick else args.depths
    results = [measure(d, arrivals=args.arrivals) for d in depths]
    for line in figures(results):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
