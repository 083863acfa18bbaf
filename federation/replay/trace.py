"""Reading a job trace (the Philly columns) and giving each job the GPU types it accepts.

Philly records no GPU type, so the replay assigns one: each job draws an entry of the config's
`gpu_mix` from its own seeded generator, `random.Random(f"{seed}:{job_id}")`. The draw depends only
on the seed and the job's id, never on the order of the file or on which other jobs are read, so a
sample of the trace (every 10th job, the first day) gets the same types as the full week.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from federation.replay.config import DeadlineSettings, GpuChoice, ResumableSettings
from federation.replay.errors import ReplayError
from placement.model import GpuType, GpuTypePolicy, JobId, TenantId

COLUMNS = ("job_id", "submit_time_s", "duration_s", "num_gpus", "tenant")


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: JobId
    submit_time_s: float
    # Run time on a GPU of speed 1.0.
    duration_s: float
    num_gpus: int
    tenant: TenantId
    gpu_types: tuple[GpuType, ...] = ()
    gpu_type_policy: GpuTypePolicy = GpuTypePolicy.ORDERED
    # When the job must have finished (seconds, the trace's clock), or None (`assign_deadlines`).
    deadline_s: float | None = None
    # The job checkpoints: a spot reclaim costs it the work since its last checkpoint (`assign_resumable`).
    resumable: bool = False

    def replica_gpus(self, gpus_per_node: int) -> tuple[int, ...]:
        """One replica per node: a job above a node's GPUs spans whole nodes (16 GPUs: two of 8)."""
        if self.num_gpus <= gpus_per_node:
            return (self.num_gpus,)
        full, rest = divmod(self.num_gpus, gpus_per_node)
        return (gpus_per_node,) * full + ((rest,) if rest else ())


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return io.TextIOWrapper(path.open("rb"), encoding="utf-8")


def read_trace(path: Path) -> list[TraceJob]:
    """Jobs of a trace CSV (optionally gzipped), in submission order. Rejects rows it cannot trust."""
    try:
        with _open_text(path) as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise ReplayError(f"{path}: missing columns {', '.join(missing)}")
            jobs = [_job(row, path, line) for line, row in enumerate(reader, start=2)]
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as error:
        raise ReplayError(f"{path}: cannot read the trace: {error}") from error
    seen: set[str] = set()
    for job in jobs:
        if job.job_id in seen:
            raise ReplayError(f"{path}: job id {job.job_id} appears twice")
        seen.add(job.job_id)
    jobs.sort(key=lambda j: (j.submit_time_s, j.job_id))
    return jobs


def _job(row: dict[str, str], path: Path, line: int) -> TraceJob:
    try:
        submit, duration, gpus = float(row["submit_time_s"]), float(row["duration_s"]), int(row["num_gpus"])
    except (TypeError, ValueError) as error:
        raise ReplayError(f"{path}:{line}: unreadable number ({error})") from error
    if not (math.isfinite(submit) and math.isfinite(duration)) or submit < 0 or duration <= 0 or gpus <= 0:
        raise ReplayError(f"{path}:{line}: submit_time_s >= 0, duration_s > 0 and num_gpus > 0 are required")
    if not row["job_id"] or not row["tenant"]:
        raise ReplayError(f"{path}:{line}: job_id and tenant must not be empty")
    return TraceJob(JobId(row["job_id"]), submit, duration, gpus, TenantId(row["tenant"]))


def assign_gpu_types(jobs: Iterable[TraceJob], mix: Sequence[GpuChoice], seed: int) -> list[TraceJob]:
    """Each job with the GPU types of one mix entry, drawn from a generator seeded by (seed, job id)."""
    weights = [choice.share for choice in mix]
    out = []
    for job in jobs:
        choice = random.Random(f"{seed}:{job.job_id}").choices(mix, weights)[0]
        out.append(
            TraceJob(
                job.job_id,
                job.submit_time_s,
                job.duration_s,
                job.num_gpus,
                job.tenant,
                choice.gpu_types,
                choice.policy,
            )
        )
    return out


def assign_deadlines(jobs: Iterable[TraceJob], settings: DeadlineSettings) -> list[TraceJob]:
    """A deadline for a seeded share of the jobs: submission + factor x duration, and at least
    `min_slack_s` beyond the duration.

    Each job draws from its own generator, `random.Random(f"{seed}:deadline:{job_id}")`: first whether
    it has a deadline (probability `share`), then the factor, uniform in [min_factor, max_factor]. So
    a job's deadline depends only on the seed and its id, as its GPU types do, and a sample of the
    week gets the deadlines the full week gives those jobs."""
    out = []
    for job in jobs:
        rng = random.Random(f"{settings.seed}:deadline:{job.job_id}")
        if settings.share > 0 and rng.random() < settings.share:
            factor = rng.uniform(settings.min_factor, settings.max_factor)
            after_s = max(factor * job.duration_s, job.duration_s + settings.min_slack_s)
            job = replace(job, deadline_s=job.submit_time_s + after_s)
        out.append(job)
    return out


def assign_resumable(jobs: Iterable[TraceJob], settings: ResumableSettings) -> list[TraceJob]:
    """A seeded share of the jobs checkpoints: each job draws from its own generator,
    `random.Random(f"{seed}:resumable:{job_id}")`, so whether it is resumable depends only on the seed
    and its id (a sample of the week gets the same answer for its jobs as the full week)."""
    if settings.share <= 0:
        return list(jobs)
    return [
        replace(job, resumable=True)
        if random.Random(f"{settings.seed}:resumable:{job.job_id}").random() < settings.share
        else job
        for job in jobs
    ]


def sample(jobs: Sequence[TraceJob], limit: int, every_nth: int) -> list[TraceJob]:
    """Every `every_nth` job in submission order, then the first `limit` of those (0: no limit)."""
    picked = list(jobs[:: max(1, every_nth)])
    return picked[:limit] if limit > 0 else picked


def mean_demand_gpus(jobs: Sequence[TraceJob], period_s: float) -> float:
    """GPU-hours of work (on speed-1.0 GPUs) over the period's hours: the GPUs the period needs on average."""
    return sum(j.num_gpus * j.duration_s for j in jobs) / period_s
