"""The lines of a gang's replicas, merged into one stream of tagged chunks, live or from the kept copy.

Live, each replica's pod log is read on its own task and the chunks meet in one bounded queue, so a
chatty replica cannot hold back a quiet one and a slow client slows every reader, never the server.
Lines are always asked for with their timestamps: with them a follow that lost its cluster resumes
(`sinceSeconds` back to the last line seen, and what was already sent is skipped) rather than
starting over, and the kept copy can be cut by `--since`. The stamps are taken off again unless the
caller asked for them.

Only a resumed read skips anything, and only the lines it reads again: those before the instant of
the last line sent, and as many lines of that very instant as were sent. Many lines share one stamp
(a burst printed at once), so a stamp is no line's identity, only its position among equals is.
Stamps are compared as instants (`clusters.logtext.stamp_ns`), never as text: the kubelet trims
trailing zeros of the fraction, and `...03.1Z` sorts after `...03.12Z` as a string.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

import structlog

from clusters.api import ClusterUnreachable, GangInspector, LogOptions, LogUnavailable, ReplicaState
from clusters.logtext import select_lines, split_stamp, stamp_ns
from placement.model import TenantId

log = structlog.get_logger("gpufed.logs")

LIVE = "live"
KEPT = "kept"
# Lines per chunk sent: small enough to arrive as they are written, big enough to amortise framing.
_CHUNK_LINES = 512
_QUEUE_CHUNKS = 64


@dataclass(frozen=True, slots=True)
class Chunk:
    task: str
    replica: int
    pod: str
    lines: tuple[str, ...] = ()
    source: str = LIVE
    notice: str = ""
    container: str = ""


@dataclass(frozen=True, slots=True)
class Target:
    """One replica to read: where the spec puts it, and its pod."""

    task: str
    replica: int
    state: ReplicaState


def split_line(line: str) -> tuple[str, str]:
    """A stamped line's RFC 3339 stamp and its text."""
    return split_stamp(line)


def select_kept(data: bytes, options: LogOptions, now_s: float) -> list[str]:
    """The kept lines that `--since`, `--tail` and `--timestamps` ask for."""
    return select_lines(data, options, now_s)


def _chunks(target: Target, lines: Sequence[str], source: str) -> list[Chunk]:
    return [
        Chunk(
            target.task,
            target.replica,
            target.state.pod,
            tuple(lines[i : i + _CHUNK_LINES]),
            source,
            container=target.state.container,
        )
        for i in range(0, len(lines), _CHUNK_LINES)
    ]


async def read_replica(
    backend: GangInspector,
    cluster: str,
    tenant: TenantId,
    target: Target,
    options: LogOptions,
    put: Callable[[Chunk], Awaitable[None]],
    *,
    live: Callable[[], bool],
    retry_s: float,
    clock: Callable[[], float],
) -> None:
    """One replica's lines until its log ends (with follow: its container ends, or the job does)."""
    asked = replace(options, timestamps=True)
    seen = Seen()
    lost = False
    waiting_said = False

    def notice(text: str) -> Chunk:
        return Chunk(
            target.task, target.replica, target.state.pod, notice=text, container=target.state.container
        )

    while True:
        stream = backend.pod_log(tenant, target.state, asked)
        try:
            rest = ""
            async for data in stream:
                if lost:
                    lost = False
                    await put(notice(f"cluster {cluster} answers again; the log goes on"))
                lines = (rest + data.decode("utf-8", "replace")).split("\n")
                rest = lines.pop()
                for chunk in _chunks(target, seen.fresh(lines, options.timestamps), LIVE):
                    await put(chunk)
            return
        except ClusterUnreachable as error:
            if not options.follow:
                raise
            if not lost:
                lost = True
                await put(notice(f"{error}; resuming when it answers"))
        except LogUnavailable as error:
            gone = "404" in str(error) or "not found" in str(error)
            if gone or not (options.follow and live()):
                await put(notice(str(error)))
                return
            if not waiting_said:
                waiting_said = True
                await put(notice(str(error)))
        finally:
            await _close(stream)
        if not live():
            return
        await asyncio.sleep(retry_s)
        seen.resume()
        if seen.at_ns is not None:
            back_s = math.ceil(clock() - seen.at_ns / 1e9) + 1
            asked = replace(asked, tail_lines=None, since_s=max(1, back_s))


@dataclass(slots=True)
class Seen:
    """Where the lines sent of one replica end, so that a resumed read sends each line once.

    `at_ns`: the instant of the last line sent; `sent_at`: how many lines sent carry it. A resumed
    read (`resume()`) skips what it reads again: lines before `at_ns`, then the first `sent_at` lines
    at `at_ns`; the first line past those ends the skipping, and nothing after it is skipped."""

    at_ns: int | None = None
    sent_at: int = 0
    _skip_at: int = field(default=0, repr=False)
    _resuming: bool = field(default=False, repr=False)

    def resume(self) -> None:
        self._resuming = self.at_ns is not None
        self._skip_at = self.sent_at

    def fresh(self, lines: Sequence[str], timestamps: bool) -> list[str]:
        """The lines not sent yet, stamped or not as the caller asked."""
        out: list[str] = []
        for line in lines:
            stamp, body = split_stamp(line)
            at_ns = stamp_ns(stamp)
            if self._resuming and at_ns is not None and self.at_ns is not None:
                if at_ns < self.at_ns:
                    continue
                if at_ns == self.at_ns and self._skip_at > 0:
                    self._skip_at -= 1
                    continue
            self._resuming = False
            if at_ns is not None:
                if at_ns == self.at_ns:
                    self.sent_at += 1
                else:
                    self.at_ns, self.sent_at = at_ns, 1
            out.append(line if timestamps else body)
        return out


async def _close(stream: AsyncIterator[bytes]) -> None:
    # An abandoned follow must let go of its connection and its thread now, not when collected.
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


async def merged(
    backend: GangInspector,
    cluster: str,
    tenant: TenantId,
    targets: Sequence[Target],
    options: LogOptions,
    *,
    live: Callable[[], bool],
    retry_s: float,
    clock: Callable[[], float],
) -> AsyncIterator[Chunk]:
    """Every target's chunks as they come; raises the first reader's error (ClusterUnreachable)."""
    queue: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue(_QUEUE_CHUNKS)

    async def reader(target: Target) -> None:
        try:
            await read_replica(
                backend, cluster, tenant, target, options, queue.put, live=live, retry_s=retry_s, clock=clock
            )
        except Exception as error:  # handed to the consumer, which raises it
            await queue.put(error)
        await queue.put(None)

    tasks = [asyncio.create_task(reader(t)) for t in targets]
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
