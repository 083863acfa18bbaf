"""Builders for the history store's tests: ended jobs with their intervals, and the store itself on
either backend (`history_store` takes the backend's name: "sqlite" or "postgres")."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from clusters.api import ReplicaState
from federation.history.model import ArchivedAttempt, ArchivedAudit, ArchivedJob, KeptLog, WaitSnapshot
from federation.history.sql_store import SqlHistoryStore
from federation.joblogs.archive import KeptAttempt, KeptReplica
from federation.runtime.postgres_process import PostgresProcess
from federation.store.intervals import IntervalEnd, LedgerInterval
from federation.store.jobs import JobPlacement, PhaseEvent
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, TenantId
from placement.model_plan import WaitCode, WaitReason
from tests.job_builder import build_job

BACKENDS = ("sqlite", "postgres")
_database_numbers = itertools.count()


def fresh_dsn(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """An empty database of the backend: a new SQLite file, or a new PostgreSQL database."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'history.sqlite3'}"
    postgres: PostgresProcess = request.getfixturevalue("postgres_process")
    return postgres.create_database(f"history_{next(_database_numbers)}")


def open_store(dsn: str) -> Iterator[SqlHistoryStore]:
    store = SqlHistoryStore.open(dsn)
    try:
        yield store
    finally:
        store.close()


def an_interval(
    job_id: str,
    attempt: int = 1,
    *,
    start_s: float,
    end_s: float,
    tenant: str = "t1",
    user: str = "alice",
    cluster: str = "onprem",
    gpu_type: str = "H100",
    gpu_count: int = 8,
    usd_per_gpu_hour: float = 2.0,
) -> LedgerInterval:
    return LedgerInterval(
        job_id=JobId(job_id),
        attempt=attempt,
        tenant=TenantId(tenant),
        user=user,
        cluster=ClusterName(cluster),
        provider="onprem",
        region="eu-west",
        gpu_type=GpuType(gpu_type),
        gpu_count=gpu_count,
        kind=CapacityKind.ON_DEMAND,
        start_s=start_s,
        end_s=end_s,
        usd_per_gpu_hour=usd_per_gpu_hour,
        ended=IntervalEnd.FINISHED,
        job_name=f"train-{job_id}",
    )


def an_archived_job(
    job_id: str,
    *,
    tenant: str = "t1",
    submitted_at_s: float = 1000.0,
    phase: JobPhase = JobPhase.SUCCEEDED,
    intervals: tuple[LedgerInterval, ...] | None = None,
    name: str | None = None,
) -> ArchivedJob:
    """An ended job with one attempt that ran an hour after it was submitted, and a wait before it."""
    record = build_job(job_id, tenant=tenant)
    ran = (an_interval(job_id, start_s=submitted_at_s + 10, end_s=submitted_at_s + 3610, tenant=tenant),)
    record = replace(
        record,
        spec=replace(record.spec, name=name or record.spec.name),
        phase=phase,
        submitted_at_s=submitted_at_s,
        queued_at_s=submitted_at_s,
        placement=JobPlacement(ClusterName("onprem"), GpuType("H100"), CapacityKind.ON_DEMAND, 2.0),
        events=(
            PhaseEvent(JobPhase.QUEUED, submitted_at_s, 1),
            PhaseEvent(JobPhase.RUNNING, submitted_at_s + 10, 1),
            PhaseEvent(phase, submitted_at_s + 3610, 1, "done"),
        ),
    )
    return ArchivedJob(
        record=record,
        ended_at_s=submitted_at_s + 3610,
        attempts=(ArchivedAttempt(1, {"cluster": "onprem", "outcome": phase.value}),),
        intervals=ran if intervals is None else intervals,
        waits=(
            WaitSnapshot(
                submitted_at_s + 1,
                (
                    WaitReason(
                        WaitCode.TENANT_CAP_REACHED,
                        "tenant cap reached",
                        tenant=TenantId(tenant),
                        limit_gpus=8,
                    ),
                ),
            ),
        ),
    )


def an_audit(audit_id: str, at_s: float, action: str = "tenant.put") -> ArchivedAudit:
    return ArchivedAudit(audit_id=audit_id, at_s=at_s, user="root", role="admin", action=action, target="t1")


def a_finished_replica(
    pod: str, task: str, index: int, *, finished_at_s: float, started_at_s: float | None = None
) -> ReplicaState:
    """A replica as a pod that ran to completion leaves it (started a minute before it finished)."""
    return ReplicaState(
        pod=pod,
        task=task,
        index=index,
        by_rank=False,
        node="n1",
        phase="Succeeded",
        restarts=0,
        exit_code=0,
        reason="Completed",
        message="",
        started_at_s=finished_at_s - 60.0 if started_at_s is None else started_at_s,
        finished_at_s=finished_at_s,
    )


def a_kept_attempt(
    attempt: int,
    replicas: tuple[KeptReplica, ...],
    *,
    started_at_s: float,
    finished_at_s: float,
    kept_at_s: float | None = None,
    outcome: str = "SUCCEEDED",
    reason: str = "",
    gpu_type: str = "H100",
    usd_per_gpu_hour: float = 2.0,
) -> KeptAttempt:
    """An attempt's summary as `joblogs` keeps it, on the on-prem cluster (kept when it finished)."""
    return KeptAttempt(
        attempt=attempt,
        cluster="onprem",
        gpu_type=gpu_type,
        capacity_kind="on_demand",
        usd_per_gpu_hour=usd_per_gpu_hour,
        started_at_s=started_at_s,
        finished_at_s=finished_at_s,
        outcome=outcome,
        reason=reason,
        kept_at_s=finished_at_s if kept_at_s is None else kept_at_s,
        note="",
        replicas=replicas,
    )


def with_kept_tails(
    job: ArchivedJob, tails: dict[tuple[str, int], bytes], *, kept_at_s: float
) -> ArchivedJob:
    """`job` with attempt 1 kept as `joblogs` keeps one (its summary naming each replica) and its
    tails moved to the history with it, as the archiver leaves a job."""
    job_id = job.record.job_id
    kept = a_kept_attempt(
        1,
        tuple(
            KeptReplica(
                t, i, a_finished_replica(f"{job_id}-{t}-{i}", t, i, finished_at_s=kept_at_s), len(data)
            )
            for (t, i), data in sorted(tails.items())
        ),
        started_at_s=kept_at_s - 60.0,
        finished_at_s=kept_at_s,
        outcome=job.record.phase.value,
    )
    logs = tuple(KeptLog(job_id, 1, t, i, kept_at_s, data) for (t, i), data in sorted(tails.items()))
    return replace(job, attempts=(ArchivedAttempt(1, asdict(kept)),), logs=logs)
