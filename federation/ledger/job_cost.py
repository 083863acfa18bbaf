"""A job's cost so far, for `gpufed get`, `describe` and the console's job page: the same figure,
to the micro-dollar, as the job's rows in `gpufed report ledger` add up to.

Each interval costs its whole length (a running one up to now), cut at UTC midnights and rounded to
whole micro-dollars per day (`federation.store.money.span_micro_usd`), as every report counts it.
A live job's intervals come from etcd's ledger (the server's `LedgerCache`), an archived job's from
the history store; a job with no interval has not run and is charged nothing (None: the API leaves
the field empty and the CLI says so).
"""

from __future__ import annotations

from collections.abc import Iterable

from federation.store.intervals import LedgerInterval
from federation.store.money import format_usd, span_micro_usd


def interval_micro_usd(iv: LedgerInterval, *, now_s: float) -> int:
    end = now_s if iv.end_s is None else min(iv.end_s, now_s)
    return span_micro_usd(iv.gpu_count, iv.start_s, end, iv.usd_per_gpu_hour)


def job_micro_usd(intervals: Iterable[LedgerInterval], *, now_s: float) -> int | None:
    """The intervals' cost in whole micro-dollars, or None when there is none (the job never ran)."""
    listed = list(intervals)
    if not listed:
        return None
    return sum(interval_micro_usd(iv, now_s=now_s) for iv in listed)


def job_cost_text(intervals: Iterable[LedgerInterval], *, now_s: float) -> str:
    """The API's `Job.cost_usd`: a decimal string with six places, or '' for a job that never ran."""
    micro = job_micro_usd(intervals, now_s=now_s)
    return "" if micro is None else format_usd(micro)
