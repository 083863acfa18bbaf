"""From the store's records to table rows and back: pure, so both backends write the same rows.

A closed interval becomes one `history_intervals` row and one `history_usage_days` row per UTC day
it touched (cut at midnight), which is what lets a report read only the days it covers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from federation.history.model import ArchivedAttempt, ArchivedAudit, ArchivedJob, KeptLog, WaitSnapshot
from federation.store import money
from federation.store.intervals import LedgerInterval, interval_from_dict, interval_to_dict
from federation.store.job_store import wait_to_dict, waits_from_json
from federation.store.jobs import BurstOffer, JobRecord, job_from_json, job_to_dict
from federation.store.money import piece_micro_usd
from placement.model import CapacityKind, ClusterName, GpuType

DAY_S = money.DAY_S


def interval_id(job_id: str, attempt: int) -> str:
    """The interval's primary key: its etcd key's tail, so a row and a key name the same interval."""
    return f"{job_id}/{attempt:06d}"


def day_of(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%d")


def month_of(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m")


def day_pieces(start_s: float, end_s: float) -> Iterator[tuple[str, float, float]]:
    """(day, start, end) for each UTC day [start_s, end_s) touches; nothing for an empty interval.
    The cut is money's, so that each day row is the piece `piece_micro_usd` costs."""
    for at, piece_end in money.day_pieces(start_s, end_s):
        yield day_of(at), at, piece_end


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def job_row(job: ArchivedJob) -> dict[str, Any]:
    r = job.record
    return {
        "job_id": r.job_id,
        "tenant": r.tenant,
        "user_name": r.user,
        "name": r.spec.name,
        "phase": r.phase.value,
        "submitted_at_s": r.submitted_at_s,
        "ended_at_s": job.ended_at_s,
        "record_json": record_json(r),
    }


def record_json(record: JobRecord) -> str:
    """A job's record as the history stores it (`history_jobs.record_json`)."""
    return _dumps(job_to_dict(record))


def record_from_row(record_json: str) -> JobRecord:
    return job_from_json(record_json)


def attempt_row(job_id: str, a: ArchivedAttempt) -> dict[str, Any]:
    return {"job_id": job_id, "attempt": a.attempt, "summary_json": _dumps(dict(a.summary))}


def attempt_from_row(row: Mapping[Any, Any]) -> ArchivedAttempt:
    return ArchivedAttempt(attempt=int(row["attempt"]), summary=json.loads(row["summary_json"]))


def wait_row(job_id: str, seq: int, w: WaitSnapshot) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "seq": seq,
        "at_s": w.at_s,
        "reasons_json": _dumps([wait_to_dict(r) for r in w.reasons]),
    }


def wait_from_row(row: Mapping[Any, Any]) -> WaitSnapshot:
    reasons = waits_from_json(row["reasons_json"])
    return WaitSnapshot(at_s=float(row["at_s"]), reasons=reasons)


def interval_row(iv: LedgerInterval) -> dict[str, Any]:
    d = interval_to_dict(iv)
    d["interval_id"] = interval_id(iv.job_id, iv.attempt)
    d["user_name"] = d.pop("user")
    d["ended"] = d["ended"] or ""
    d["job_set"] = iv.job_set
    d["set_kind"] = iv.set_kind
    d.pop("burst_offer", None)
    d.update(offer_columns(iv.burst_offer))
    return d


def offer_columns(offer: BurstOffer | None) -> dict[str, Any]:
    """A burst offer as the intervals table's flat columns (migration 0006), all NULL for none."""
    if offer is None:
        return dict.fromkeys(OFFER_COLUMNS)
    return {
        "burst_cluster": offer.cluster,
        "burst_gpu_type": offer.gpu_type,
        "burst_kind": offer.kind.value,
        "burst_usd_per_gpu_hour": offer.usd_per_gpu_hour,
        "burst_seen_at_s": offer.seen_at_s,
    }


OFFER_COLUMNS = ("burst_cluster", "burst_gpu_type", "burst_kind", "burst_usd_per_gpu_hour", "burst_seen_at_s")


def offer_from_columns(
    attempt: int,
    cluster: str | None,
    gpu_type: str | None,
    kind: str | None,
    usd_per_gpu_hour: float | None,
    seen_at_s: float | None,
) -> BurstOffer | None:
    """The offer back from its columns; None when the row has none (the price is NULL)."""
    if usd_per_gpu_hour is None or cluster is None or gpu_type is None or kind is None or seen_at_s is None:
        return None
    return BurstOffer(
        cluster=ClusterName(cluster),
        gpu_type=GpuType(gpu_type),
        kind=CapacityKind(kind),
        usd_per_gpu_hour=float(usd_per_gpu_hour),
        seen_at_s=float(seen_at_s),
        attempt=attempt,
    )


def interval_from_row(row: Mapping[Any, Any]) -> LedgerInterval:
    d = dict(row)
    d.pop("interval_id", None)
    d["user"] = d.pop("user_name")
    d["ended"] = d["ended"] or None
    offer = offer_from_columns(int(d["attempt"]), *(d.pop(name, None) for name in OFFER_COLUMNS))
    d["job_set"] = d.get("job_set") or ""
    d["set_kind"] = d.get("set_kind") or ""
    return replace(interval_from_dict(d), burst_offer=offer)


def usage_day_rows(iv: LedgerInterval) -> list[dict[str, Any]]:
    if iv.end_s is None:
        raise ValueError(f"interval {iv.job_id}/{iv.attempt} is open; only closed ones are cut into days")
    key = interval_id(iv.job_id, iv.attempt)
    return [
        {
            "interval_id": key,
            "day": day,
            "start_s": start,
            "end_s": end,
            "tenant": iv.tenant,
            "user_name": iv.user,
            "cluster": iv.cluster,
            "provider": iv.provider,
            "gpu_type": iv.gpu_type,
            "kind": iv.kind.value,
            "gpu_count": iv.gpu_count,
            "usd_per_gpu_hour": iv.usd_per_gpu_hour,
            "cost_micro_usd": piece_micro_usd(iv.gpu_count, start, end, iv.usd_per_gpu_hour),
            "job_set": iv.job_set,
            "set_kind": iv.set_kind,
        }
        for day, start, end in day_pieces(iv.start_s, iv.end_s)
    ]


def audit_row(a: ArchivedAudit) -> dict[str, Any]:
    return {
        "audit_id": a.audit_id,
        "at_s": a.at_s,
        "user_name": a.user,
        "role": a.role,
        "action": a.action,
        "target": a.target,
        "detail": a.detail,
    }


def audit_from_row(row: Mapping[Any, Any]) -> ArchivedAudit:
    return ArchivedAudit(
        audit_id=str(row["audit_id"]),
        at_s=float(row["at_s"]),
        user=str(row["user_name"]),
        role=str(row["role"]),
        action=str(row["action"]),
        target=str(row["target"]),
        detail=str(row["detail"]),
    )


def kept_log_row(k: KeptLog) -> dict[str, Any]:
    return {
        "job_id": k.job_id,
        "attempt": k.attempt,
        "task": k.task,
        "replica": k.replica,
        "kept_at_s": k.kept_at_s,
        "data": k.data,
    }


def kept_log_from_row(row: Mapping[Any, Any]) -> KeptLog:
    return KeptLog(
        job_id=str(row["job_id"]),
        attempt=int(row["attempt"]),
        task=str(row["task"]),
        replica=int(row["replica"]),
        kept_at_s=float(row["kept_at_s"]),
        # psycopg answers bytea as memoryview on some paths; bytes either way for the caller.
        data=bytes(row["data"]),
    )
