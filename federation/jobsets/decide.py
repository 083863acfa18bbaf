"""Which held members of a set to release now: pure, so the limit's rule is tested without I/O.

A member counts against the set's limit from its release until its job ends, whatever phase it is
in meanwhile (queued, admitted, staging, running): the placer may admit every released job, so
counting only running ones could let more than the limit run. The reader says a job ended only when
it saw it end (a terminal phase, or the job archived out of etcd); a job it has not seen yet counts
as live, which can only hold others back, never let too many go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from federation.jobsets.records import JobSetRecord, MemberState, SetMember, member_job_id, member_job_name
from placement.model import JobId

# The most members one transaction releases: each is a compare and a put of about 1.5 KB beside the
# set record, well within etcd's 128 operations and 1.5 MiB per request.
MAX_RELEASE_PER_TXN = 40


@dataclass(frozen=True, slots=True)
class Release:
    members: tuple[SetMember, ...]
    live: int
    held_after: int


def live_members(record: JobSetRecord, ended: Callable[[JobId], bool]) -> int:
    return sum(1 for m in record.members if m.state is MemberState.RELEASED and not ended(m.job_id))


def to_release(
    record: JobSetRecord, ended: Callable[[JobId], bool], queue_room: int | None = None
) -> Release:
    """The held members to release now, in the set's order, so that the live ones stay within the
    set's limit and the released ones within the room the tenant's and the federation's queue limits
    leave (`queue_room`, None: no limit; `federation.api.queue_limit`); none once the set is
    cancelled."""
    live = live_members(record, ended)
    held = [m for m in record.members if m.state is MemberState.HELD]
    if record.cancel_requested or not held:
        return Release((), live, len(held))
    room = len(held) if record.max_parallel == 0 else max(0, record.max_parallel - live)
    if queue_room is not None:
        room = min(room, queue_room)
    chosen = tuple(held[: min(room, MAX_RELEASE_PER_TXN)])
    return Release(chosen, live, len(held) - len(chosen))


def released(record: JobSetRecord, chosen: Sequence[SetMember]) -> JobSetRecord:
    """The record with `chosen` marked released."""
    keys = {m.key for m in chosen}
    members = tuple(_with_state(m, MemberState.RELEASED) if m.key in keys else m for m in record.members)
    return record.with_members(members)


def held_reason(record: JobSetRecord, live: int, queue_room: int | None = None) -> str:
    """What a held member's status says: why it waits, and what lets it go. `queue_room`: what the
    queue limits leave for the tenant now (None: no limit, or not known)."""
    if record.cancel_requested:
        return "cancelled with its set before it was released"
    if queue_room == 0 and (record.max_parallel == 0 or live < record.max_parallel):
        return (
            "held: the tenant's or the federation's queue is at its limit (maxQueuedJobs); released "
            "as queued jobs are placed"
        )
    if record.max_parallel == 0:
        return "held: released at the set controller's next pass"
    return (
        f"held: the set allows at most {record.max_parallel} jobs at once and {live} are queued or "
        "running; released as they finish"
    )


def rerun(record: JobSetRecord, member: SetMember) -> SetMember:
    """The member held again for a new run with a new job id; the failed job kept as an earlier one."""
    generation = len(member.earlier) + 1
    name = member_job_name(record.templates[member.template].spec, member.array_index)
    job_id = member_job_id(record.tenant, record.name, member.key, name, generation)
    return replace(member, job_id=job_id, state=MemberState.HELD, earlier=(*member.earlier, member.job_id))


def _with_state(member: SetMember, state: MemberState) -> SetMember:
    return replace(member, state=state)
