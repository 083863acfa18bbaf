"""What a replay's outcome means for users and for the bill: one row of figures per policy and size.

- Cloud cost: every cloud interval, completed or not (a preempted or reclaimed run was paid for too).
- Job completion time (JCT): finish minus submission. Queueing delay: start of the attempt that
  completed minus submission (so it includes lost attempts and the cloud lead time).
- Private utilisation: private GPU-seconds in use within the period over private GPUs x period.
- Deadlines (`jobs.deadlines`): of the jobs with one, those that finished after it or not at all.
- Fairness: each team's share of the private GPU-hours used in the period against its entitled share
  (its guarantee share: its share of the week's demand), as Jain's index over received / entitled
  (1 is perfectly proportional) and the largest absolute gap in percentage points.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from federation.replay.sim import Interval, Result

_HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class Metrics:
    policy: str
    size_factor: float
    private_gpus: int
    jobs: int
    unfinished: int
    cloud_cost_usd: float
    cloud_gpu_hours: float
    jobs_in_cloud: int
    avg_jct_h: float
    p95_jct_h: float
    avg_queue_h: float
    p95_queue_h: float
    private_utilisation: float
    jain_fairness: float
    max_share_gap_pp: float
    preemptions: int
    cycles: int
    replay_s: float
    # The trace this row replays (its file name without extensions): rows of several weeks share a table.
    week: str = ""
    # CPU seconds of the replay: on a machine shared with other work, wall time says more about the
    # others than about the replay.
    replay_cpu_s: float = 0.0
    # Running cloud gangs moved back to private GPUs (repatriation; 0 for policies without it).
    moves: int = 0
    # Spot runs taken back by their cloud (each a restart from scratch; the lost run is in the bill).
    reclaims: int = 0
    # Of those, reclaims of resumable jobs (restarted from their last checkpoint, not from scratch).
    reclaims_resumed: int = 0
    # Jobs with a deadline (`jobs.deadlines`), those that finished after it (or never), and those whose
    # deadline the placer found unmeetable and ran without it (gpufed's policies only).
    deadlines: int = 0
    deadlines_missed: int = 0
    deadlines_dropped: int = 0
    # Which jobs missed their deadline, to compare policies job by job; not a column of the tables.
    missed_deadline_ids: tuple[str, ...] = field(default=(), repr=False)

    def row(self) -> dict[str, object]:
        row = asdict(self)
        del row["missed_deadline_ids"]
        return row


def missed_deadlines(result: Result) -> list[str]:
    """The jobs with a deadline that finished after it, or did not finish, in id order."""
    return sorted(
        o.job.job_id
        for o in result.outcomes.values()
        if o.job.deadline_s is not None and (o.finish_s is None or o.finish_s > o.job.deadline_s)
    )


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one value takes everything."""
    if not values:
        return 1.0
    total = sum(values)
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


def clipped_gpu_s(interval: Interval, period_s: float) -> float:
    return interval.gpus * max(0.0, min(interval.end_s, period_s) - max(interval.start_s, 0.0))


def fairness(
    intervals: Sequence[Interval], entitled: Mapping[str, float], period_s: float
) -> tuple[float, float]:
    """Jain's index of received/entitled private shares, and the largest gap in percentage points."""
    received: dict[str, float] = defaultdict(float)
    for interval in intervals:
        if interval.private:
            received[interval.tenant] += clipped_gpu_s(interval, period_s)
    total = sum(received.values())
    weight = sum(entitled.values())
    if total <= 0 or weight <= 0:
        return 1.0, 0.0
    ratios, gaps = [], []
    for tenant, share in entitled.items():
        got = received.get(tenant, 0.0) / total
        want = share / weight
        if want > 0:
            ratios.append(got / want)
        gaps.append(abs(got - want) * 100.0)
    return jain(ratios), max(gaps, default=0.0)


def summarise(
    result: Result,
    size_factor: float,
    entitled: Mapping[str, float],
    period_s: float,
    replay_s: float,
    week: str = "",
    replay_cpu_s: float = 0.0,
) -> Metrics:
    done = [o for o in result.outcomes.values() if o.finish_s is not None and o.start_s is not None]
    jct = np.array([o.finish_s - o.job.submit_time_s for o in done if o.finish_s is not None]) / _HOUR_S
    queue = np.array([o.start_s - o.job.submit_time_s for o in done if o.start_s is not None]) / _HOUR_S
    cloud = [i for i in result.intervals if not i.private]
    private_s = sum(clipped_gpu_s(i, period_s) for i in result.intervals if i.private)
    jain_index, gap = fairness(result.intervals, entitled, period_s)
    missed = missed_deadlines(result)

    def stat(values: np.ndarray, q: float | None) -> float:
        if values.size == 0:
            return float("nan")
        return float(np.percentile(values, q)) if q is not None else float(values.mean())

    return Metrics(
        policy=result.policy,
        size_factor=size_factor,
        private_gpus=result.private_gpus,
        jobs=len(result.outcomes),
        unfinished=len(result.outcomes) - len(done),
        cloud_cost_usd=sum(i.cost_usd for i in cloud),
        cloud_gpu_hours=sum(i.gpus * (i.end_s - i.start_s) for i in cloud) / _HOUR_S,
        jobs_in_cloud=sum(1 for o in done if not o.private),
        avg_jct_h=stat(jct, None),
        p95_jct_h=stat(jct, 95),
        avg_queue_h=stat(queue, None),
        p95_queue_h=stat(queue, 95),
        private_utilisation=private_s / (result.private_gpus * period_s) if result.private_gpus else 0.0,
        jain_fairness=jain_index,
        max_share_gap_pp=gap,
        preemptions=sum(o.preemptions for o in result.outcomes.values()),
        cycles=result.cycles,
        replay_s=replay_s,
        week=week,
        replay_cpu_s=replay_cpu_s,
        moves=result.moves,
        reclaims=result.reclaims,
        reclaims_resumed=result.reclaims_resumed,
        deadlines=sum(1 for o in result.outcomes.values() if o.job.deadline_s is not None),
        deadlines_missed=len(missed),
        deadlines_dropped=result.deadlines_dropped,
        missed_deadline_ids=tuple(missed),
    )
