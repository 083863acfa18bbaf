"""Container logs of the simulated kubelet: what each run printed, kept as a record, not as text.

A real kubelet keeps each container's output (and the previous instance's, after a restart) on the
node and serves it through `GET .../pods/{name}/log`. The simulated containers print a fixed shape
(their command and image when they start, a progress line every `interval_s` simulated seconds, how
they exited), so a run is stored as a few numbers and its lines are produced when read. That keeps
memory flat however long a pod runs; a read still sees at most the last `cap_bytes` of a run, the
way a runtime rotates a container's log file.

The book follows pod status changes (a container state that turned `running`, `terminated`, or
`waiting` after a crash), so every path that ends a container (its duration, an OOM kill, deletion,
a lost node) writes the exit line without knowing about logs. Followers wait on an asyncio event
that is set when a run ends; runs of a deleted pod are dropped, as the kubelet drops its logs.

A pod annotated `sim.gpufed.io/log-burst: "0.1,0.12,0.12,0.2"` also prints one line at each of
those offsets (seconds) from the first whole second after its container started: lines that share
a stamp, and stamps whose fraction the kubelet's RFC3339Nano trims (`...05.1Z`, `...05.12Z`), as a
real trainer's bursts give them. Readers that compare stamps as text lose or reorder such lines.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from clusters.sim import podstatus
from clusters.sim.clock import Clock
from clusters.sim.resources import PODS
from clusters.sim.store import Change, EventType

Obj = dict[str, Any]
# The runs a kubelet can show per container: the current one and the one before the last restart.
_KEPT_RUNS = 2
Line = tuple[float, str]
BURST_ANNOTATION = "sim.gpufed.io/log-burst"
# A burst is a test's tool, not a log generator: a few lines, within the hour after the start.
_MAX_BURST_LINES = 1000
_MAX_BURST_OFFSET_S = 3600.0


@dataclass(slots=True)
class Run:
    """One container instance, from its start to its exit."""

    index: int
    started_wall_s: float
    container: str
    image: str
    command: str
    interval_s: float
    ended_wall_s: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    ended: asyncio.Event | None = field(default=None, repr=False)
    # When each burst line is printed (wall seconds, ascending): `sim.gpufed.io/log-burst`.
    burst: tuple[float, ...] = ()
    # What a real process printed (the kubelet's process mode, `clusters.sim.local_exec`): its
    # lines replace the progress lines; None for a simulated run.
    captured: list[Line] | None = None
    # Process mode: whether the process's output was read to its end (`LogBook.drained`), and the end
    # its pod's status or deletion gave before that (`draining`). A container runtime copies a killed
    # container's pipe to its log to the last byte; the simulator reads its processes' pipes as they
    # come, so a line printed just before a kill may be read after the kill is seen. The run ends
    # when the pipe is read, with the end it was given, and a follower reads on until then.
    drained: bool = False
    pending_end: tuple[int, str] | None = None

    @property
    def draining(self) -> bool:
        return self.pending_end is not None and self.ended_wall_s is None

    def _fixed(self) -> list[Line]:
        attempt = f", restart {self.index}" if self.index else ""
        return [
            (
                self.started_wall_s,
                f'[sim] container "{self.container}" started (image {self.image}{attempt})',
            ),
            (self.started_wall_s, f"[sim] command: {self.command}"),
        ]

    def _progress(self, k: int) -> Line:
        elapsed_s = k * self.interval_s
        return self.started_wall_s + elapsed_s, f"[sim] progress: step {k}, {elapsed_s:g}s elapsed"

    def _exit(self) -> Line:
        assert self.ended_wall_s is not None
        if self.reason == "OOMKilled":
            text = f"[sim] killed: out of memory (OOMKilled, exit code {self.exit_code})"
        else:
            text = f"[sim] exited with code {self.exit_code} ({self.reason})"
        return self.ended_wall_s, text

    def _bursts(self, end_wall_s: float) -> list[Line]:
        """The burst lines printed by `end_wall_s` (none at or after the exit, as for progress)."""
        n = len(self.burst)
        return [
            (at, f"[sim] burst: line {i} of {n}")
            for i, at in enumerate(self.burst, 1)
            if at <= end_wall_s and (self.ended_wall_s is None or at < self.ended_wall_s)
        ]

    def _captured_lines(self, until_wall_s: float) -> list[Line]:
        assert self.captured is not None
        printed = [line for line in self.captured if line[0] <= until_wall_s]
        exited = self.ended_wall_s is not None and until_wall_s >= self.ended_wall_s
        return [*self._fixed(), *printed, *([self._exit()] if exited else [])]

    def lines(self, until_wall_s: float, cap_bytes: int) -> list[Line]:
        """What the run has printed by `until_wall_s`, at most its last `cap_bytes`."""
        if self.captured is not None:
            kept: list[Line] = []
            size = 0
            for line in reversed(self._captured_lines(until_wall_s)):
                size += len(line[1]) + 1
                if size > cap_bytes:
                    break
                kept.append(line)
            return kept[::-1]
        end = until_wall_s if self.ended_wall_s is None else min(until_wall_s, self.ended_wall_s)
        if end < self.started_wall_s:
            return []
        steps = self._steps(end)
        bursts = self._bursts(end)
        tail: list[Line] = []
        size = 0
        if self.ended_wall_s is not None and until_wall_s >= self.ended_wall_s:
            tail.append(self._exit())
            size += len(tail[-1][1]) + 1
        # Newest first, so that a long run costs only the lines that fit under the cap; a burst line
        # printed at the instant of a progress line comes after it.
        k, b = steps, len(bursts) - 1
        while k > 0 or b >= 0:
            if b >= 0 and (k == 0 or bursts[b][0] >= self._progress(k)[0]):
                line, b = bursts[b], b - 1
            else:
                line, k = self._progress(k), k - 1
            size += len(line[1]) + 1
            if size > cap_bytes:
                return tail[::-1]
            tail.append(line)
        for line in reversed(self._fixed()):
            size += len(line[1]) + 1
            if size > cap_bytes:
                break
            tail.append(line)
        return tail[::-1]

    def count(self, until_wall_s: float) -> int:
        """How many lines the run has printed by `until_wall_s`, whatever the cap keeps."""
        if self.captured is not None:
            return len(self._captured_lines(until_wall_s))
        end = until_wall_s if self.ended_wall_s is None else min(until_wall_s, self.ended_wall_s)
        if end < self.started_wall_s:
            return 0
        exited = self.ended_wall_s is not None and until_wall_s >= self.ended_wall_s
        return len(self._fixed()) + self._steps(end) + len(self._bursts(end)) + (1 if exited else 0)

    def _steps(self, end_wall_s: float) -> int:
        if self.interval_s <= 0:
            return 0
        steps = math.floor((end_wall_s - self.started_wall_s) / self.interval_s + 1e-9)
        if self.ended_wall_s is not None and end_wall_s >= self.ended_wall_s:
            # A progress line due at the very moment of the exit is not printed.
            while steps > 0 and self._progress(steps)[0] >= self.ended_wall_s:
                steps -= 1
        return max(0, steps)

    def next_line_wall_s(self, now_wall_s: float) -> float | None:
        """When the next line is due, if the run is still going."""
        if self.ended_wall_s is not None or self.captured is not None:
            return None
        burst = next((at for at in self.burst if at > now_wall_s), None)
        if self.interval_s <= 0:
            return burst
        progress = self._progress(self._steps(max(now_wall_s, self.started_wall_s)) + 1)[0]
        return progress if burst is None else min(progress, burst)

    def wait_end(self) -> asyncio.Event:
        if self.ended is None:
            self.ended = asyncio.Event()
            if self.ended_wall_s is not None:
                self.ended.set()
        return self.ended


def _command(container: Obj) -> str:
    words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    return " ".join(words) if words else "(the image's entrypoint)"


def burst_offsets_s(pod: Obj) -> tuple[float, ...]:
    """The pod's `sim.gpufed.io/log-burst` offsets, ascending; none when absent or malformed."""
    text = str((pod["metadata"].get("annotations") or {}).get(BURST_ANNOTATION) or "")
    try:
        offsets = sorted(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        return ()
    if len(offsets) > _MAX_BURST_LINES or any(not 0 <= o <= _MAX_BURST_OFFSET_S for o in offsets):
        return ()
    return tuple(offsets)


def stamp(wall_s: float) -> str:
    """Go's RFC3339Nano (trailing zeros of the fraction dropped), as the kubelet prefixes lines."""
    text = datetime.fromtimestamp(wall_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return f"{text}Z"


class LogBook:
    def __init__(self, clock: Clock, *, interval_s: float, cap_bytes: int, processes: bool = False) -> None:
        self._clock = clock
        # Process mode (`clusters.sim.local_exec`): every run is a process's, its lines captured from
        # the start (none printed yet is not a simulated run: its end still waits for the pipe).
        self._processes = processes
        self.interval_s = interval_s
        self.cap_bytes = cap_bytes
        # (pod uid, container name) -> the runs kept, oldest first.
        self._runs: dict[tuple[str, str], list[Run]] = {}
        # Pods deleted while a run of theirs was draining: forgotten once it has ended.
        self._deleted: set[str] = set()
        self._by_pod: dict[str, set[str]] = {}

    def append(self, pod_uid: str, container: str, text: str) -> None:
        """A line a real process printed, into its container's current run (process mode)."""
        runs = self._runs.get((pod_uid, container))
        if runs and runs[-1].ended_wall_s is None:
            run = runs[-1]
            if run.captured is None:
                run.captured = []
            run.captured.append((self._clock.wall_s(), text))

    def runs(self, pod_uid: str, container: str) -> list[Run]:
        return list(self._runs.get((pod_uid, container), []))

    def observe(self, change: Change) -> None:
        if change.rt is not PODS:
            return
        pod = change.obj
        uid = pod["metadata"]["uid"]
        if change.type is EventType.DELETED:
            runs = self._pod_runs(uid)
            for run in runs:
                self._end_when_drained(run, 137, "Error")
            if any(run.draining for run in runs):
                self._deleted.add(uid)
            else:
                self._forget(uid)
            return
        specs = {c.get("name"): c for c in podstatus.containers(pod)}
        burst = burst_offsets_s(pod)
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            self._follow(uid, cs, specs.get(cs.get("name")) or {}, burst)

    def _follow(self, uid: str, cs: Obj, spec: Obj, burst: tuple[float, ...] = ()) -> None:
        name = str(cs.get("name", ""))
        index = int(cs.get("restartCount") or 0)
        state = cs.get("state") or {}
        runs = self._runs.get((uid, name))
        current = runs[-1] if runs and runs[-1].index == index else None
        if "running" in state and current is None:
            started_wall_s = self._clock.wall_s()
            # Offsets count from a whole second, so that stamps come out with short fractions.
            base_s = float(math.floor(started_wall_s) + 1)
            run = Run(
                index=index,
                started_wall_s=started_wall_s,
                burst=tuple(base_s + o for o in burst),
                container=name,
                image=str(cs.get("image") or spec.get("image") or ""),
                command=_command(spec),
                interval_s=self.interval_s,
                captured=[] if self._processes else None,
            )
            runs = self._runs.setdefault((uid, name), [])
            runs.append(run)
            del runs[:-_KEPT_RUNS]
            self._by_pod.setdefault(uid, set()).add(name)
            return
        ended = state.get("terminated") or (
            (cs.get("lastState") or {}).get("terminated") if "waiting" in state else None
        )
        if ended and current is not None and current.ended_wall_s is None:
            self._end_when_drained(current, int(ended.get("exitCode", 0)), str(ended.get("reason") or ""))

    def drained(self, pod_uid: str) -> None:
        """The pod's process's output was read to its end (process mode): its current runs have all
        their lines, and those given an end meanwhile end now (a deleted pod's are then forgotten)."""
        runs = self._pod_runs(pod_uid)
        for run in runs:
            if run.ended_wall_s is not None:
                continue
            run.drained = True
            if run.pending_end is not None:
                self._end(run, *run.pending_end)
        if pod_uid in self._deleted and not any(run.draining for run in runs):
            self._deleted.discard(pod_uid)
            self._forget(pod_uid)

    def _end_when_drained(self, run: Run, exit_code: int, reason: str) -> None:
        """End a run now, or when its process's output is read if a process printed into it."""
        if run.ended_wall_s is not None or run.pending_end is not None:
            return
        if run.captured is not None and not run.drained:
            run.pending_end = (exit_code, reason)
        else:
            self._end(run, exit_code, reason)

    def _pod_runs(self, pod_uid: str) -> list[Run]:
        names = self._by_pod.get(pod_uid, set())
        return [run for name in names for run in self._runs.get((pod_uid, name), [])]

    def _forget(self, pod_uid: str) -> None:
        for name in self._by_pod.pop(pod_uid, set()):
            self._runs.pop((pod_uid, name), None)

    def _end(self, run: Run, exit_code: int, reason: str) -> None:
        if run.ended_wall_s is not None:
            return
        run.ended_wall_s = self._clock.wall_s()
        run.exit_code = exit_code
        run.reason = reason
        if run.ended is not None:
            run.ended.set()

    def sync(self) -> bool:
        return False
