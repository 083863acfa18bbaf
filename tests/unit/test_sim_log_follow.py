"""`kubectl logs -f` against the simulator: a follower gets every line a process printed, up to its exit.

The follower writes new lines to the client, which yields to the event loop; the process may print
its last line and exit in that moment. A follower that checked for the end only after the write
ended the stream without that line or the exit line.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from clusters.sim.logs import Run
from clusters.sim.podlog import LogOptions, _Budget, _follow

OPTIONS = LogOptions(
    container=None,
    follow=True,
    previous=False,
    timestamps=False,
    since_wall_s=None,
    tail_lines=None,
    limit_bytes=None,
)


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def wall_s(self) -> float:
        return self.now_s

    def real_delay_s(self, wall_delay_s: float) -> float:
        return wall_delay_s


class _Client:
    """What the follower wrote; on its first write the process prints its last line and exits."""

    def __init__(self, run: Run, clock: _Clock) -> None:
        self._run, self._clock = run, clock
        self.written = b""

    async def write(self, data: bytes) -> None:
        self.written += data
        run = self._run
        if run.ended_wall_s is None:
            assert run.captured is not None
            self._clock.now_s += 1
            run.captured.append((self._clock.now_s, "rank 3 done"))
            run.ended_wall_s, run.exit_code, run.reason = self._clock.now_s, 0, "Completed"
            run.wait_end().set()
        await asyncio.sleep(0)


def test_a_line_printed_while_the_follower_writes_is_sent_before_the_end() -> None:
    clock = _Clock()
    run = Run(
        index=0,
        started_wall_s=90.0,
        container="trainer",
        image="jax:cpu",
        command="python allreduce.py",
        interval_s=0.0,
        captured=[(95.0, "rank 2 done")],
    )
    engine = SimpleNamespace(
        clock=clock,
        logs=SimpleNamespace(cap_bytes=1 << 20),
        store=SimpleNamespace(get=lambda *_: {"metadata": {}}),
    )
    client = _Client(run, clock)
    # The follower already sent the two fixed lines; "rank 2 done" is new.
    asyncio.run(_follow(client, engine, run, OPTIONS, _Budget(None), ("ns", "pod"), 2))  # type: ignore[arg-type]
    lines = client.written.decode().splitlines()
    assert lines == ["rank 2 done", "rank 3 done", "[sim] exited with code 0 (Completed)"]
