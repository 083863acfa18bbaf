"""Serving one watch: newline-delimited JSON events over a chunked response.

This is what the python client's `Watch.stream` and `kubectl get -w` read. Events already queued
are written together (one write for a burst), BOOKMARK events carry the store's resourceVersion
when the watcher asked for them and has nothing pending, a watch-list (`sendInitialEvents=true`)
ends its initial events with the `k8s.io/initial-events-end` bookmark, `timeoutSeconds` ends the
stream cleanly, and a resume from before the history window answers `200` with one ERROR event holding a `410
Expired` Status, as a real API server does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from clusters.sim import errors, reads, table
from clusters.sim.changes import encode_json
from clusters.sim.resources import ResourceType
from clusters.sim.selectors import FieldSelector, LabelSelector
from clusters.sim.store import Change, EventType, ResourceGone, Store, Watcher

Obj = dict[str, Any]
# A real API server picks 30 to 60 minutes; one cap keeps abandoned sim watches from piling up.
DEFAULT_TIMEOUT_S = 1800.0
_BURST = 512


def _line(event_type: str, obj: Obj) -> bytes:
    return encode_json({"type": event_type, "object": obj}) + b"\n"


async def serve(
    request: web.Request,
    store: Store,
    rt: ResourceType,
    namespace: str | None,
    labels: LabelSelector,
    fields: FieldSelector,
    *,
    bookmark_interval_s: float,
    now_wall_s: Callable[[], float],
    streams: dict[Watcher, web.Request],
) -> web.StreamResponse:
    query = request.query
    rv_text = query.get("resourceVersion", "")
    initial_events = reads.check_watch(store, query)
    try:
        since = None if rv_text in ("", "0") or initial_events else int(rv_text)
        timeout_s = float(query.get("timeoutSeconds", DEFAULT_TIMEOUT_S))
    except ValueError as exc:
        raise errors.bad_request(f"invalid watch parameter: {exc}") from exc
    if query.get("sendInitialEvents") == "false" and since is None:
        since = store.resource_version
    bookmarks = query.get("allowWatchBookmarks", "") in ("true", "1")
    as_table = table.wants_table(request.headers.get("Accept", ""))
    include = query.get("includeObject", "Metadata")
    response = web.StreamResponse(headers={"Content-Type": "application/json", "Cache-Control": "no-cache"})
    response.enable_chunked_encoding()
    await reads.wait_fresh(store, query)
    try:
        if since is not None and since > store.resource_version:
            raise reads.too_large(since, store.resource_version)
        watcher = store.watch(rt, namespace, labels, fields, since)
    except (ResourceGone, errors.ApiError) as exc:
        failure = exc if isinstance(exc, errors.ApiError) else errors.gone(str(exc))
        await response.prepare(request)
        await response.write(_line(EventType.ERROR.value, failure.status()))
        await response.write_eof()
        return response
    if initial_events:
        # The watch-list protocol: the initial ADDED events end with a bookmark that says so.
        end = {
            "kind": rt.kind,
            "apiVersion": rt.api_version,
            "metadata": {
                "resourceVersion": str(store.resource_version),
                "annotations": {"k8s.io/initial-events-end": "true"},
            },
        }
        marker = Change(store.resource_version, EventType.BOOKMARK, rt, end, None)
        watcher.queue.put_nowait((EventType.BOOKMARK, marker))
    streams[watcher] = request
    await response.prepare(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    first_table = True
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            wait_s = min(remaining, bookmark_interval_s) if bookmarks else remaining
            try:
                item = await asyncio.wait_for(watcher.queue.get(), timeout=wait_s)
            except TimeoutError:
                if bookmarks and watcher.queue.empty() and loop.time() < deadline:
                    mark = {
                        "kind": rt.kind,
                        "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(store.resource_version)},
                    }
                    await response.write(_line(EventType.BOOKMARK.value, mark))
                continue
            batch = [item]
            while len(batch) < _BURST and not watcher.queue.empty():
                batch.append(watcher.queue.get_nowait())
            chunks: list[bytes] = []
            ended = False
            for entry in batch:
                if entry is None:
                    ended = True
                    break
                event_type, change = entry
                if as_table and event_type is not EventType.BOOKMARK:
                    rendered = table.render(
                        rt, [change.obj], now_wall_s(), str(change.rv), include, with_columns=first_table
                    )
                    first_table = False
                    chunks.append(_line(event_type.value, rendered))
                else:
                    chunks.append(change.line(event_type))
            if chunks:
                await response.write(b"".join(chunks))
            if ended:
                break
    except (ConnectionResetError, asyncio.CancelledError):
        store.unwatch(watcher)
        streams.pop(watcher, None)
        raise
    store.unwatch(watcher)
    streams.pop(watcher, None)
    if request.transport is not None and not request.transport.is_closing():
        await response.write_eof()
    return response
