"""SummarizeJobs' sums kept by the job cache as jobs change (`federation/store/job_summary.py`) are
the sums over every live job, in the same order, whatever the changes: new jobs, phase changes,
placements, jobs gone from etcd, a fresh list. The reference is the walk SummarizeJobs made before
(`reference_summary`, kept here), over the cache's live jobs."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace

from federation.api.job_queries import summary_reply
from federation.api.v1 import gpufed_pb2 as pb
from federation.store.job_cache import JobCache
from federation.store.job_store import KvStore, job_key
from federation.store.job_summary import ANY_GPU, JobSummaryIndex
from federation.store.jobs import JobPlacement, JobRecord
from federation.store.kv_memory import MemoryKv
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, TenantId
from tests.conftest import build_job

_GROUPS: dict[JobPhase, pb.JobGroup.ValueType] = {
    JobPhase.QUEUED: pb.JOB_GROUP_QUEUED,
    JobPhase.ADMITTED: pb.JOB_GROUP_ADMITTED,
    JobPhase.STAGING: pb.JOB_GROUP_ADMITTED,
    JobPhase.DISPATCHED: pb.JOB_GROUP_ADMITTED,
    JobPhase.RUNNING: pb.JOB_GROUP_RUNNING,
}


def reference_summary(jobs: Iterable[JobRecord], tenant: TenantId | None) -> pb.JobSummary:
    """GPUs and jobs per (tenant, GPU type, group) over the jobs not finished: SummarizeJobs' walk
    of every live job, as it was before the sums were kept."""
    gpus: dict[tuple[str, str, pb.JobGroup.ValueType], int] = defaultdict(int)
    counted: dict[tuple[str, str, pb.JobGroup.ValueType], int] = defaultdict(int)
    per_tenant: dict[tuple[str, pb.JobGroup.ValueType], int] = defaultdict(int)
    for job in jobs:
        if tenant is not None and job.tenant != tenant:
            continue
        group = _GROUPS.get(job.phase)
        if group is None:
            continue
        per_tenant[(job.tenant, group)] += 1
        if job.placement is not None and group != pb.JOB_GROUP_QUEUED:
            types: Iterable[str] = (job.placement.gpu_type,)
        elif group == pb.JOB_GROUP_QUEUED:
            types = job.spec.gpu_types or (ANY_GPU,)
        else:
            types = job.spec.gpu_types[:1] or (ANY_GPU,)
        for gpu_type in types:
            gpus[(job.tenant, gpu_type, group)] += job.spec.gpu_count
            counted[(job.tenant, gpu_type, group)] += 1
    return pb.JobSummary(
        rows=[
            pb.JobSummaryRow(
                tenant=t, gpu_type=g, group=grp, gpus=gpus[(t, g, grp)], jobs=counted[(t, g, grp)]
            )
            for t, g, grp in sorted(gpus)
        ],
        tenants=[
            pb.TenantJobCount(tenant=t, group=grp, jobs=n) for (t, grp), n in sorted(per_tenant.items())
        ],
    )


TENANTS = ("vision", "nlp", "speech")
TYPES = (("A100",), ("H100",), ("A100", "H100"), ())
NEXT: dict[JobPhase, JobPhase] = {
    JobPhase.QUEUED: JobPhase.ADMITTED,
    JobPhase.ADMITTED: JobPhase.DISPATCHED,
    JobPhase.DISPATCHED: JobPhase.RUNNING,
    JobPhase.RUNNING: JobPhase.SUCCEEDED,
}


def a_job(rng: random.Random, n: int) -> JobRecord:
    job = build_job(f"j{n}", tenant=rng.choice(TENANTS), gpus=rng.choice((1, 2, 8)))
    types = rng.choice(TYPES)
    return replace(job, spec=replace(job.spec, gpu_types=tuple(GpuType(t) for t in types)))


def moved(rng: random.Random, job: JobRecord) -> JobRecord:
    """The job one step on; placed when it leaves the queue; now and then back to the queue."""
    if job.phase is not JobPhase.QUEUED and rng.random() < 0.15:
        return replace(job, phase=JobPhase.QUEUED, placement=None)  # preempted, requeued
    to = NEXT[job.phase]
    placement = job.placement
    if to is JobPhase.ADMITTED:
        gpu = rng.choice(job.spec.gpu_types or (GpuType("A100"),))
        placement = JobPlacement(ClusterName("c1"), gpu, CapacityKind.PRIVATE, 1.1)
    return replace(job, phase=to, placement=placement)


def check(cache: JobCache) -> None:
    live = [s.value for s in cache.live_jobs()]
    for tenant in (None, *(TenantId(t) for t in TENANTS), TenantId("nobody")):
        assert summary_reply(cache.summary(), tenant) == reference_summary(live, tenant), tenant


async def test_the_kept_sums_are_the_walks_over_random_changes() -> None:
    rng = random.Random(7)
    store = KvStore(MemoryKv())
    cache = JobCache(store)
    await cache.start()
    try:
        made = 0
        for step in range(400):
            live = list(cache.live_jobs())
            ended = [s for s in cache.jobs() if s.value.phase.is_terminal]
            roll = rng.random()
            if roll < 0.4 or not live:
                stored, _ = await store.create_job(
                    a_job(rng, made), idempotency_key=f"k{made}", manifest_digest="d"
                )
                made += 1
                revision = stored.mod_revision
            elif roll < 0.85:
                target = rng.choice(live)
                committed = await store.commit([(moved(rng, target.value), target.mod_revision)])
                assert committed is not None
                revision = committed
            elif ended:
                gone = rng.choice(ended)
                await store.kv.delete(job_key(gone.value.job_id))
                revision = (await store.kv.txn((), (), ())).revision
            else:
                continue
            await cache.wait_for_revision(revision)
            if step == 50:
                check(cache)  # built here, from the live jobs, and kept from now on
            elif step > 50 and step % 7 == 0:
                check(cache)
        check(cache)
    finally:
        await cache.stop()


async def test_the_sums_are_built_again_after_a_fresh_list() -> None:
    store = KvStore(MemoryKv())
    cache = JobCache(store)
    await cache.start()
    try:
        for n in range(5):
            job = replace(build_job(f"j{n}", tenant="vision", gpus=2), job_id=JobId(f"j{n}"))
            await store.create_job(job, idempotency_key=f"k{n}", manifest_digest="d")
        await cache.wait_for_revision((await store.kv.txn((), (), ())).revision)
        check(cache)
        await cache._relist()  # as after a broken watch
        assert not cache._summary.built
        check(cache)
    finally:
        await cache.stop()


def test_a_write_that_keeps_where_a_job_counts_leaves_the_sums_and_one_that_moves_it_moves_them() -> None:
    # The index skips a change whose job counts where it did (issue 33): a rewrite in the same phase,
    # or admitted to staging. A rewrite that changes the placement's GPU type, in the same phase,
    # still moves the job's GPUs between types.
    index = JobSummaryIndex()
    index.build([])
    queued = build_job("a", tenant="vision", gpu="A100")
    h100 = JobPlacement(ClusterName("c1"), GpuType("H100"), CapacityKind.PRIVATE, 1.0)
    a100 = JobPlacement(ClusterName("c1"), GpuType("A100"), CapacityKind.PRIVATE, 1.0)
    steps = [
        replace(queued, message="waiting"),
        replace(queued, phase=JobPhase.ADMITTED, placement=h100),
        replace(queued, phase=JobPhase.STAGING, placement=h100),
        replace(queued, phase=JobPhase.STAGING, placement=a100),
        replace(queued, phase=JobPhase.RUNNING, placement=a100, message="up"),
        replace(queued, phase=JobPhase.SUCCEEDED, placement=a100),
    ]
    index.change(None, queued)
    was = queued
    for now in steps:
        index.change(was, now)
        live = [] if now.phase.is_terminal else [now]
        for tenant in (None, TenantId("vision")):
            assert summary_reply(index, tenant) == reference_summary(live, tenant), now
        was = now
