"""The usage ledger: every interval in which a gang held GPUs, as finance will be charged for it.

One entry per started attempt, keyed `/gpufed/ledger/<job_id>/<attempt>`. The reconciler writes an
entry in the same etcd transaction as the job transition that caused it (the compare-and-swap on the
job's revision makes that exactly once, across restarts and leader changes): opened when the job is
seen RUNNING, closed when the attempt ends, however it ends. An attempt that never started (cancelled,
preempted or refused before its pods ran) writes nothing, so it costs nothing.

Times come from the cluster where it says them (the gang's start and finish), so the ledger agrees
with what the cluster ran rather than with when the control plane noticed. The price is the one the
scheduler admitted the attempt at: the price in force when it started.

`ledger_update` is pure: the reconciler calls it with the record before and after a transition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec

from federation.store.jobs import BurstOffer, JobRecord, burst_offer_from_dict, burst_offer_to_dict
from federation.store.schema_version import check_json
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, TenantId

LEDGER_PREFIX = b"/gpufed/ledger/"


class IntervalEnd(StrEnum):
    """How an interval ended. An open interval (still holding its GPUs) has none."""

    FINISHED = "finished"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    # Restarted by the job's restart policy, or moved off a cluster that stopped answering.
    REQUEUED = "requeued"


@dataclass(frozen=True, slots=True)
class LedgerInterval:
    job_id: JobId
    attempt: int
    tenant: TenantId
    user: str
    cluster: ClusterName
    provider: str
    region: str
    gpu_type: GpuType
    gpu_count: int
    kind: CapacityKind
    start_s: float
    # None while the gang still holds its GPUs.
    end_s: float | None
    usd_per_gpu_hour: float
    ended: IntervalEnd | None = None
    # The job's name and labels, for tags in reports and exports.
    job_name: str = ""
    # The job set the attempt's job belongs to ("" for a job submitted alone), and what kind of set
    # it is (SetKind), so that finance can group by set and by sweep (issue 34). Absent on older
    # records: they read as jobs submitted alone.
    job_set: str = ""
    set_kind: str = ""
    # What bursting at once would have cost this attempt: the job record's `burst_offer` when it is
    # this attempt's (issue 35). Kept here so that an archived job's savings outlive its record in
    # etcd. None on older records and for an attempt the placer had no public offer for.
    burst_offer: BurstOffer | None = None

    @property
    def key(self) -> bytes:
        return ledger_key(self.job_id, self.attempt)

    @property
    def spot(self) -> bool:
        return self.kind is CapacityKind.SPOT

    def seconds(self, *, since_s: float = float("-inf"), until_s: float) -> float:
        """Seconds held within [since_s, until_s]; an open interval counts up to `until_s`."""
        end = until_s if self.end_s is None else min(self.end_s, until_s)
        return max(0.0, end - max(self.start_s, since_s))

    def gpu_hours(self, *, since_s: float = float("-inf"), until_s: float) -> float:
        return self.gpu_count * self.seconds(since_s=since_s, until_s=until_s) / 3600.0

    def cost_usd(self, *, since_s: float = float("-inf"), until_s: float) -> float:
        return self.gpu_hours(since_s=since_s, until_s=until_s) * self.usd_per_gpu_hour


class SetKind(StrEnum):
    """What kind of job set an attempt's job came from (its interval's `set_kind`)."""

    SET = "set"
    ARRAY = "array"
    SWEEP = "sweep"


# The variable a sweep trial's pods carry (federation.jobsets.sweeps.SWEEP_ENV): the store sits below
# jobsets and cannot import it; a unit test holds the two equal.
SWEEP_ENV = "GPUFED_SWEEP"


def set_kind_of(job: JobRecord) -> SetKind | None:
    """The kind of set `job` was released from, None for a job submitted alone."""
    if not job.job_set:
        return None
    if any(k == SWEEP_ENV for task in job.spec.tasks for k, _ in task.env):
        return SetKind.SWEEP
    return SetKind.ARRAY if job.array_index is not None else SetKind.SET


def attempt_offer(job: JobRecord) -> BurstOffer | None:
    """The job's burst-at-once offer if it is the current attempt's (an older attempt's is stale)."""
    offer = job.burst_offer
    return offer if offer is not None and offer.attempt == job.attempt else None


def ledger_key(job_id: str, attempt: int) -> bytes:
    # Zero-padded so that one job's attempts list in order.
    return LEDGER_PREFIX + f"{job_id}/{attempt:06d}".encode()


@dataclass(frozen=True, slots=True)
class ClusterSite:
    """What the ledger records of the cluster an attempt ran on."""

    provider: str
    region: str


def _end_of(after: JobRecord) -> IntervalEnd:
    match after.phase:
        case JobPhase.SUCCEEDED:
            return IntervalEnd.FINISHED
        case JobPhase.FAILED:
            return IntervalEnd.FAILED
        case JobPhase.CANCELLED:
            return IntervalEnd.CANCELLED
        case _:
            # Back to the queue: a preemption order says why, else a restart or a lost cluster.
            return IntervalEnd.REQUEUED


def _running_since(job: JobRecord) -> float | None:
    """When the current attempt was seen RUNNING (the event carries the cluster's start time)."""
    for event in reversed(job.events):
        if event.attempt != job.attempt:
            break
        if event.phase is JobPhase.RUNNING:
            return event.at_s
    return None


def ledger_update(
    before: JobRecord,
    after: JobRecord,
    *,
    site: ClusterSite,
    started_at_s: float | None,
    finished_at_s: float | None,
    now_s: float,
) -> LedgerInterval | None:
    """The ledger entry to write with the transition `before -> after`, or None.

    `started_at_s` and `finished_at_s` are what the cluster reports of the attempt's gang (None when
    it says nothing). An attempt is charged only if it started: it was RUNNING, or the cluster says
    when it started (a short gang may finish between two looks).
    """
    placement = before.placement
    if placement is None or before.phase not in (JobPhase.DISPATCHED, JobPhase.RUNNING):
        return None
    if after.phase is before.phase:
        return None
    start = _running_since(before) if before.phase is JobPhase.RUNNING else None
    if start is None:
        start = started_at_s
    if after.phase is JobPhase.RUNNING:
        start = after.events[-1].at_s if after.events else (started_at_s or now_s)
        end: float | None = None
        ended: IntervalEnd | None = None
    else:
        if start is None:
            return None
        end = finished_at_s if finished_at_s is not None else now_s
        end = max(end, start)
        ended = IntervalEnd.PREEMPTED if before.preemption is not None else _end_of(after)
    set_kind = set_kind_of(before)
    return LedgerInterval(
        job_id=before.job_id,
        attempt=before.attempt,
        tenant=before.tenant,
        user=before.user,
        cluster=placement.cluster,
        provider=site.provider,
        region=site.region,
        gpu_type=placement.gpu_type,
        gpu_count=before.spec.gpu_count,
        kind=placement.kind,
        start_s=start,
        end_s=end,
        usd_per_gpu_hour=placement.usd_per_gpu_hour,
        ended=ended,
        job_name=before.spec.name,
        job_set=before.job_set,
        set_kind="" if set_kind is None else set_kind.value,
        burst_offer=attempt_offer(before),
    )


# ---- codec: the JSON kept in etcd, explicit so that a field rename is a visible change.


def interval_to_dict(iv: LedgerInterval) -> dict[str, Any]:
    return {
        "job_id": iv.job_id,
        "attempt": iv.attempt,
        "tenant": iv.tenant,
        "user": iv.user,
        "cluster": iv.cluster,
        "provider": iv.provider,
        "region": iv.region,
        "gpu_type": iv.gpu_type,
        "gpu_count": iv.gpu_count,
        "kind": iv.kind.value,
        "start_s": iv.start_s,
        "end_s": iv.end_s,
        "usd_per_gpu_hour": iv.usd_per_gpu_hour,
        "ended": None if iv.ended is None else iv.ended.value,
        "job_name": iv.job_name,
        # Only where set, so that every other record stays as it was written before them.
        **({"job_set": iv.job_set, "set_kind": iv.set_kind} if iv.job_set else {}),
        **({"burst_offer": burst_offer_to_dict(iv.burst_offer)} if iv.burst_offer else {}),
    }


def interval_from_dict(d: dict[str, Any]) -> LedgerInterval:
    return LedgerInterval(
        job_id=JobId(d["job_id"]),
        attempt=int(d["attempt"]),
        tenant=TenantId(d["tenant"]),
        user=str(d["user"]),
        cluster=ClusterName(d["cluster"]),
        provider=str(d["provider"]),
        region=str(d["region"]),
        gpu_type=GpuType(d["gpu_type"]),
        gpu_count=int(d["gpu_count"]),
        kind=CapacityKind(d["kind"]),
        start_s=float(d["start_s"]),
        end_s=None if d["end_s"] is None else float(d["end_s"]),
        usd_per_gpu_hour=float(d["usd_per_gpu_hour"]),
        ended=None if d.get("ended") is None else IntervalEnd(d["ended"]),
        job_name=str(d.get("job_name", "")),
        job_set=str(d.get("job_set", "")),
        set_kind=str(d.get("set_kind", "")),
        burst_offer=burst_offer_from_dict(d.get("burst_offer")),
    )


# Typed JSON decoding, as for job records (`federation.store.jobs.job_from_json`): a restart lists
# every open and recently closed interval in etcd before it serves.
_INTERVAL_JSON = msgspec.json.Decoder(LedgerInterval)


def interval_from_json(raw: bytes | str, key: bytes | str | None = None) -> LedgerInterval:
    """The same as `interval_from_dict(json.loads(raw))`, typed by the dataclass where it can be
    (the dataclass's defaults are the old decoder's for keys older records lack); whatever the
    typed decode refuses goes the old way, which raises as it always did. A newer schema version
    than this build's raises `SchemaTooNew` naming `key`."""
    check_json(raw, key)
    try:
        return _INTERVAL_JSON.decode(raw)
    except msgspec.DecodeError:
        return interval_from_dict(json.loads(raw))
