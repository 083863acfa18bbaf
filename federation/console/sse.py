"""Server-sent events for the live parts of the pages: a job's phase, the jobs table, a log follow.

Two ways to feed a stream: `poll` calls the servicers about once a second and sends what changed
(the jobs table, one job), `relay` forwards a servicer's own stream (StreamLogs with follow). Either
way the stream ends when the browser goes away, when the session ends (sign-out, idle, or its
token refused: every poll and a WhoAmI every few seconds re-authenticate it), or when the source
has nothing more to say; the last event is `end`, so the page's script stops reconnecting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc
import structlog
from aiohttp import web

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY, CallRefused
from federation.console.session import SESSION_KEY, SESSIONS_KEY
from federation.errors import StoreUnavailable

log = structlog.get_logger("gpufed.console.sse")

POLL_INTERVAL_S = 1.0
# A comment line this often keeps proxies from closing an idle stream, and finds a vanished browser.
KEEPALIVE_S = 15.0
# How often a relayed stream re-checks the session's token itself (the servicer's guard does too).
RECHECK_S = 5.0

Event = tuple[str, object]
T = TypeVar("T")


class EventStream:
    """One open `text/event-stream` answer."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        self._last_write_s = time.monotonic()

    async def open(self) -> None:
        await self.response.prepare(self._request)
        # Reconnect after 3 s if the stream drops without an `end`.
        await self._write("retry: 3000\n\n")

    async def send(self, event: str, data: object) -> None:
        await self._write(f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n")

    async def keepalive(self) -> None:
        if time.monotonic() - self._last_write_s >= KEEPALIVE_S:
            await self._write(": keepalive\n\n")

    async def _write(self, text: str) -> None:
        await self.response.write(text.encode())
        self._last_write_s = time.monotonic()

    def browser_gone(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing()


# When this stream last found its session alive in the store (monotonic seconds).
_ALIVE_AT_KEY = web.RequestKey("gpufed_console_alive_at", float)


async def _session_alive(request: web.Request) -> bool:
    """Whether the session still exists in the store, asked at most once a second per stream: a
    relayed stream loops once per line, and sessions live in etcd (a sign-out on another server
    ends this stream within a second)."""
    now = time.monotonic()
    if now - request.get(_ALIVE_AT_KEY, -POLL_INTERVAL_S) < POLL_INTERVAL_S:
        return True
    session = request[SESSION_KEY]
    try:
        alive = await request.app[SESSIONS_KEY].alive(session.session_id)
    except StoreUnavailable:
        # etcd is away for a moment: the stream goes on; the next check decides.
        return True
    if alive:
        request[_ALIVE_AT_KEY] = now
    return alive


async def _end_session_if_refused(request: web.Request, refusal: CallRefused) -> None:
    if refusal.code is grpc.StatusCode.UNAUTHENTICATED:
        await request.app[SESSIONS_KEY].end(request[SESSION_KEY].session_id)


async def _ended(request: web.Request, stream: EventStream) -> None:
    """The loop stopped because the session ended: tell a browser still there, so it stops too."""
    if not stream.browser_gone() and not await _session_alive(request):
        await stream.send("end", {"code": "UNAUTHENTICATED", "message": "signed out"})


async def poll(
    request: web.Request,
    fetch: Callable[[], Awaitable[tuple[Iterable[Event], bool]]],
    *,
    interval_s: float = POLL_INTERVAL_S,
) -> web.StreamResponse:
    """Call `fetch` about every `interval_s`; send the events it returns; stop when it says done."""
    stream = EventStream(request)
    await stream.open()
    try:
        while await _session_alive(request) and not stream.browser_gone():
            try:
                events, done = await fetch()
            except CallRefused as refusal:
                await _end_session_if_refused(request, refusal)
                await stream.send("end", {"code": refusal.code.name, "message": refusal.details})
                break
            for name, data in events:
                await stream.send(name, data)
            if done:
                await stream.send("end", {})
                break
            await stream.keepalive()
            await asyncio.sleep(interval_s)
        else:
            await _ended(request, stream)
    except ConnectionResetError:
        # The browser went away mid-write: nothing to tell anyone.
        pass
    return stream.response


async def relay(
    request: web.Request,
    source: AsyncIterator[T],
    render: Callable[[T], Iterable[Event]],
) -> web.StreamResponse:
    """Forward a servicer's stream as events until it ends, the browser goes or the session ends."""
    stream = EventStream(request)
    await stream.open()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=64)

    async def pump() -> None:
        try:
            async for item in source:
                await queue.put(("item", item))
            await queue.put(("done", None))
        except CallRefused as refusal:
            await queue.put(("refused", refusal))

    task = asyncio.create_task(pump(), name="console-sse-relay")
    checked_s = time.monotonic()
    try:
        while await _session_alive(request) and not stream.browser_gone():
            try:
                kind, value = await asyncio.wait_for(queue.get(), timeout=POLL_INTERVAL_S)
            except TimeoutError:
                await stream.keepalive()
                if time.monotonic() - checked_s >= RECHECK_S:
                    checked_s = time.monotonic()
                    await request.app[CALLS_KEY].call(request, "WhoAmI", pb.WhoAmIRequest())
                continue
            if kind == "item":
                for name, data in render(value):
                    await stream.send(name, data)
            elif kind == "refused":
                assert isinstance(value, CallRefused)
                await _end_session_if_refused(request, value)
                await stream.send("end", {"code": value.code.name, "message": value.details})
                break
            else:
                await stream.send("end", {})
                break
        else:
            await _ended(request, stream)
    except CallRefused as refusal:
        await _end_session_if_refused(request, refusal)
        with contextlib.suppress(ConnectionResetError):
            await stream.send("end", {"code": refusal.code.name, "message": refusal.details})
    except ConnectionResetError:
        pass
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, CallRefused):
            await task
        # Closing the generator runs the servicer's own clean-up (its stream slot, its watch).
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
    return stream.response
