"""A set's status from its members' jobs: counts by phase, GPU-hours and cost so far, and whether it
is done. Pure: the API reads the jobs and their ledger intervals (live or archived) and passes
them in, so the sums are tested without a store.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from federation.jobsets.decide import held_reason, live_members
from federation.jobsets.records import JobSetRecord, MemberState, SetMember
from federation.ledger.job_cost import job_micro_usd
from federation.store.intervals import LedgerInterval
from federation.store.jobs import JobRecord
from placement.model import JobPhase

HELD = "HELD"
# A released member whose ended job was archived where no history store can be read.
UNKNOWN = "UNKNOWN"


@dataclass(frozen=True, slots=True)
class MemberView:
    """A member, its current job (None while held, or archived out of reach), and the ledger
    intervals of all its runs (earlier ones included)."""

    member: SetMember
    job: JobRecord | None
    intervals: tuple[LedgerInterval, ...]


@dataclass(frozen=True, slots=True)
class MemberStatus:
    view: MemberView
    # The phase's name, HELD or UNKNOWN: what the member counts as.
    phase: str
    reason: str


@dataclass(frozen=True, slots=True)
class SetStatus:
    members: tuple[MemberStatus, ...]
    counts: dict[str, int]
    gpu_hours: float
    # Whole micro-dollars, as `Job.cost_usd` counts them; None when nothing has run.
    micro_usd: int | None
    done: bool


def set_status(
    record: JobSetRecord, views: list[MemberView], *, now_s: float, queue_room: int | None = None
) -> SetStatus:
    """The set's members as shown, with its counts and costs; `queue_room`: what the queue limits
    leave the tenant now (`held_reason`)."""
    ended = {v.member.job_id for v in views if v.job is None or v.job.phase.is_terminal}
    live = live_members(record, ended.__contains__)
    shown: list[MemberStatus] = []
    for view in views:
        m, job = view.member, view.job
        if m.state is MemberState.HELD:
            shown.append(MemberStatus(view, HELD, held_reason(record, live, queue_room)))
        elif m.state is MemberState.CANCELLED:
            shown.append(MemberStatus(view, JobPhase.CANCELLED.value, held_reason(record, live)))
        elif job is None:
            shown.append(MemberStatus(view, UNKNOWN, "archived; no history store to read it from"))
        else:
            reason = job.reason or (job.message if job.phase is JobPhase.FAILED else "")
            shown.append(MemberStatus(view, job.phase.value, reason))
    intervals = [iv for v in views for iv in v.intervals]
    gpu_seconds = sum(iv.gpu_count * iv.seconds(until_s=now_s) for iv in intervals)
    done = all(
        v.member.state is MemberState.CANCELLED
        or (v.member.state is MemberState.RELEASED and v.member.job_id in ended)
        for v in views
    )
    return SetStatus(
        members=tuple(shown),
        counts=dict(sorted(Counter(s.phase for s in shown).items())),
        gpu_hours=round(gpu_seconds / 3600.0, 6),
        micro_usd=job_micro_usd(intervals, now_s=now_s),
        done=done,
    )
