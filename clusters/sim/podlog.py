"""`GET /api/v1/namespaces/{ns}/pods/{name}/log`: a container's log, as the API server relays it.

The checks and their messages follow the API server and kubelet, because clients branch on them
(`kubectl logs` prints them, gpufed's `logs` command must tell "not started yet" from "gone"):
options are validated first (422 `PodLogOptions` Invalid), then the container is resolved (400
when a pod has several and none is named), then the kubelet's view (400 while a container waits
to start, or when `previous` asks for a run that never ended). A pod not yet bound answers an empty
200, as the API server does when there is no node to ask.

`follow` streams lines as the simulated container prints them and ends when that run ends;
`limitBytes` counts everything sent, followed lines included.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from clusters.sim import errors, podstatus
from clusters.sim.clock import parse_rfc3339
from clusters.sim.engine import Engine
from clusters.sim.errors import ApiError
from clusters.sim.logs import Line, Run, stamp
from clusters.sim.resources import PODS

Obj = dict[str, Any]
# How often a follower re-checks when no line is due (real seconds); bounds a missed wake-up.
_POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class LogOptions:
    container: str | None
    follow: bool
    previous: bool
    timestamps: bool
    since_wall_s: float | None
    tail_lines: int | None
    limit_bytes: int | None


def _flag(query: Any, key: str) -> bool:
    return str(query.get(key, "false")).lower() in ("true", "1")


def _integer(query: Any, key: str, name: str, minimum: int, why: str) -> int | None:
    text = query.get(key)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError as exc:
        raise errors.bad_request(f"invalid value for {key}: {text!r}") from exc
    if value < minimum:
        raise _invalid(name, f"{key}: Invalid value: {value}: {why}")
    return value


def _invalid(name: str, detail: str) -> ApiError:
    return ApiError(422, "Invalid", f'PodLogOptions "{name}" is invalid: {detail}')


def options(query: Any, name: str, now_wall_s: float) -> LogOptions:
    since_s = _integer(query, "sinceSeconds", name, 1, "must be greater than 0")
    since_time = query.get("sinceTime")
    if since_s is not None and since_time:
        raise _invalid(name, "[]: Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified")
    since_wall_s = None if since_s is None else now_wall_s - since_s
    if since_time:
        try:
            since_wall_s = parse_rfc3339(since_time)
        except ValueError as exc:
            raise errors.bad_request(f"invalid value for sinceTime: {since_time!r}") from exc
    return LogOptions(
        container=query.get("container") or None,
        follow=_flag(query, "follow"),
        previous=_flag(query, "previous"),
        timestamps=_flag(query, "timestamps"),
        since_wall_s=since_wall_s,
        tail_lines=_integer(query, "tailLines", name, 0, "must be greater than or equal to 0"),
        limit_bytes=_integer(query, "limitBytes", name, 1, "must be greater than 0"),
    )


def _container(pod: Obj, wanted: str | None) -> str:
    m = pod["metadata"]
    names = [str(c.get("name")) for c in podstatus.containers(pod)]
    if wanted is None:
        if len(names) == 1:
            return names[0]
        raise errors.bad_request(
            f"a container name must be specified for pod {m['name']}, choose one of: [{' '.join(names)}]"
        )
    if wanted not in names:
        raise errors.bad_request(f"container {wanted} is not valid for pod {m['name']}")
    return wanted


def _run(engine: Engine, pod: Obj, container: str, previous: bool) -> Run:
    """The run the kubelet would read, or the 400 it would answer."""
    m = pod["metadata"]
    runs = engine.logs.runs(m["uid"], container)
    status: Obj = next(
        (
            cs
            for cs in (pod.get("status") or {}).get("containerStatuses") or []
            if cs.get("name") == container
        ),
        {},
    )
    state = status.get("state") or {}
    crash_looping = "waiting" in state and bool((status.get("lastState") or {}).get("terminated"))
    if previous:
        # Between two runs (CrashLoopBackOff) the previous run is the one that just ended.
        ended = [r for r in runs if r.ended_wall_s is not None]
        candidates = ended[-1:] if crash_looping else [r for r in ended if runs and r is not runs[-1]]
        if not candidates:
            raise errors.bad_request(
                f'previous terminated container "{container}" in pod "{m["name"]}" not found'
            )
        return candidates[-1]
    if runs and ("running" in state or "terminated" in state or crash_looping):
        return runs[-1]
    waiting = state.get("waiting") or {}
    reason = str(waiting.get("reason") or "ContainerCreating")
    pulling = reason in ("ErrImagePull", "ImagePullBackOff")
    why = "trying and failing to pull image" if pulling else reason
    raise errors.bad_request(f'container "{container}" in pod "{m["name"]}" is waiting to start: {why}')


def _select(lines: list[Line], opts: LogOptions) -> list[Line]:
    if opts.since_wall_s is not None:
        lines = [line for line in lines if line[0] >= opts.since_wall_s]
    if opts.tail_lines is not None:
        lines = lines[len(lines) - opts.tail_lines :] if opts.tail_lines else []
    return lines


def _render(line: Line, timestamps: bool) -> bytes:
    text = f"{stamp(line[0])} {line[1]}" if timestamps else line[1]
    return f"{text}\n".encode()


class _Budget:
    """`limitBytes`: what may still be sent."""

    def __init__(self, limit: int | None) -> None:
        self.left = limit

    def take(self, data: bytes) -> bytes:
        if self.left is None:
            return data
        data = data[: self.left]
        self.left -= len(data)
        return data

    @property
    def spent(self) -> bool:
        return self.left is not None and self.left <= 0


async def serve(request: web.Request, engine: Engine, namespace: str, name: str) -> web.StreamResponse:
    pod = engine.store.require(PODS, namespace, name)
    opts = options(request.query, name, engine.clock.wall_s())
    container = _container(pod, opts.container)
    if podstatus.node_name(pod) is None:
        return web.Response(body=b"", content_type="text/plain")
    run = _run(engine, pod, container, opts.previous)
    budget = _Budget(opts.limit_bytes)
    now = engine.clock.wall_s()
    lines = run.lines(now, engine.logs.cap_bytes)
    body = b"".join(_render(line, opts.timestamps) for line in _select(lines, opts))
    if not opts.follow or run.ended_wall_s is not None:
        return web.Response(body=budget.take(body), content_type="text/plain")
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    # A follower that hangs up ends the stream; it is no error of the server's.
    with contextlib.suppress(ConnectionResetError):
        await response.write(budget.take(body))
        await _follow(response, engine, run, opts, budget, (namespace, name), run.count(now))
        await response.write_eof()
    return response


async def _follow(
    response: web.StreamResponse,
    engine: Engine,
    run: Run,
    opts: LogOptions,
    budget: _Budget,
    key: tuple[str, str],
    sent: int,
) -> None:
    """Write lines as the run prints them; `sent` lines were written already."""
    while not budget.spent:
        if run.ended_wall_s is None:
            due = run.next_line_wall_s(engine.clock.wall_s())
            wait_s = _POLL_S if due is None else engine.clock.real_delay_s(due - engine.clock.wall_s())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.wait_end().wait(), timeout=min(_POLL_S, max(0.0, wait_s)))
        # Whether the run (or the pod) had ended is read before its lines: the write below yields,
        # and a last line printed during it, just before the end, would be lost to a check made
        # after it (the fresh-clone run lost a rank's last line of an all-reduce so).
        # A run whose process's output is still being read (`Run.draining`) is not over, even with
        # its pod gone: its last lines are on their way, as from a container runtime's copy of a pipe.
        over = run.ended_wall_s is not None or (engine.store.get(PODS, *key) is None and not run.draining)
        now = engine.clock.wall_s()
        total = run.count(now)
        fresh = run.lines(now, engine.logs.cap_bytes)
        # Lines never change once printed: the new ones are those numbered from `sent` on.
        new = fresh[max(0, sent - (total - len(fresh))) :]
        sent = total
        if opts.since_wall_s is not None:
            new = [line for line in new if line[0] >= opts.since_wall_s]
        if new:
            await response.write(budget.take(b"".join(_render(line, opts.timestamps) for line in new)))
        if over:
            break
