"""When a scheduling cycle may be skipped: nothing it reads has changed, and it was planned lately.

The leader ran a full cycle every half second even when nothing had changed. With bob's 20,000
jobs queued a cycle took over a second of CPU, and in the same process as the API: a third of a
core for ever, spent re-deciding that nothing could run, and every API call of every tenant waited
behind it (alice's ListJobs p99 rose half again). A plan is a function of its snapshot and the
time, so while the jobs (the cache revision), the inputs, the clusters' inventories and statuses,
usage and the preemption count are all as they were, the plan can only change with the time:
approvals expiring, deadlines, waits for private capacity ending. Those are re-planned at least
every `max(IDLE_REPLAN_MIN_S, IDLE_REPLAN_CYCLES x last cycle's length)`: as before (every cycle)
with a short queue, and no more than one cycle in twenty of the time with a long one.
"""

from __future__ import annotations

from dataclasses import dataclass

IDLE_REPLAN_MIN_S = 0.5
IDLE_REPLAN_CYCLES = 20


@dataclass(slots=True)
class _Planned:
    inputs: tuple[object, ...]
    at_s: float
    seconds: float


class IdleGate:
    """Remembers what the last full cycle read, to tell whether the next one would see anything new."""

    def __init__(self) -> None:
        self._last: _Planned | None = None

    @property
    def replan_interval_s(self) -> float:
        """How long after the last full cycle the next one runs though nothing changed: it grows with
        that cycle's length, measured in real time."""
        last = self._last
        return (
            IDLE_REPLAN_MIN_S if last is None else max(IDLE_REPLAN_MIN_S, IDLE_REPLAN_CYCLES * last.seconds)
        )

    def may_skip(self, inputs: tuple[object, ...], now_s: float) -> bool:
        last = self._last
        if last is None or now_s - last.at_s >= self.replan_interval_s:
            return False
        return _same(last.inputs, inputs)

    def planned(self, inputs: tuple[object, ...], now_s: float, seconds: float) -> None:
        self._last = _Planned(inputs, now_s, seconds)

    def forget(self) -> None:
        """The last cycle's plan was not all carried out (a conflict): plan again next time."""
        self._last = None


def _same(before: tuple[object, ...], now: tuple[object, ...]) -> bool:
    # Identity first: most parts are the very objects of the last cycle when nothing changed.
    return len(before) == len(now) and all(a is b or a == b for a, b in zip(before, now, strict=True))
