"""List-then-watch caches, and the cluster's reachability they measure.

The official client blocks, so each watch has a thread of its own rather than a slot in a shared
pool that a long watch would hold forever: it lists, makes the watch request and waits for the
stream to end. The stream's events are read and applied by one thread for every watch of the process
(`watchreader`): the 400 watch threads of 100 clusters, each woken for every event, cost a context
switch and a GIL hand-off an event. A response it cannot read is read on the watch's own thread as
before. A watch lists once, then follows the event stream from the list's resourceVersion;
when the stream ends (the server's timeout) it resumes from the last version it saw, and only a `410
Gone` (the version fell out of the server's window) costs a new list. While the API cannot be
reached the thread retries with a doubling backoff and `Health` records since when; the backend reads
that to say `reachable=False`, so a blip shorter than the threshold is not an outage. `stop()` shuts
the socket under a blocked read and takes the stream from the reader, so closing never waits out a
watch timeout.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import structlog
import urllib3

from clusters.kubernetes.errors import is_no_answer, status_of
from clusters.kubernetes.kube import KubeApi, ListPath, decode_json
from clusters.kubernetes.watchreader import Stream, open_stream, shared_reader

log = structlog.get_logger("gpufed.clusters.kubernetes")

T = TypeVar("T")
Json = dict[str, Any]
PAGE_SIZE = 500


class Gone(Exception):
    """The watch's resourceVersion is too old for the server: list again."""


class Health:
    """Whether the API has been answering; every call and watch reports to it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failing_since: float | None = None

    def answered(self) -> None:
        # Read without the lock first: every watch event and call reports here (thousands a second
        # at 100 clusters), and the cluster is almost always answering. A `failed` racing this
        # read is ordered after it, as it could have been under the lock.
        if self._failing_since is None:
            return
        with self._lock:
            self._failing_since = None

    def failed(self) -> None:
        with self._lock:
            if self._failing_since is None:
                self._failing_since = self._clock()

    def silent_for_s(self) -> float:
        with self._lock:
            return 0.0 if self._failing_since is None else self._clock() - self._failing_since


class Informer(Generic[T]):
    """A thread that keeps `items` equal to the server's objects of one kind, each reduced by `parse`.

    `parse` returns None for objects the cache should not keep (a node without GPUs). With `group`,
    the items are also filed by the name it gives each (None: not filed), for `grouped`: a gang's
    pods found without a walk of every pod of the cluster.
    """

    def __init__(
        self,
        name: str,
        api: KubeApi,
        path: ListPath,
        parse: Callable[[Json], T | None],
        *,
        health: Health,
        label_selector: str | None = None,
        watch_timeout_s: int,
        backoff_min_s: float,
        backoff_max_s: float,
        cluster: str,
        observer: Callable[[str, Json], None] | None = None,
        group: Callable[[T], str | None] | None = None,
    ) -> None:
        self.name = name
        self._group = group
        # The items by the name `group` gives them, then by key; kept with `_items`, under `_lock`.
        self._groups: dict[str, dict[str, T]] = {}
        # Told of every watch event as it is applied, on the thread that reads the stream (the shared
        # reader's, where every watch's events are applied): it must not block.
        self._observer = observer
        self._api = api
        self._path = path
        self._parse = parse
        self._health = health
        self._selector = label_selector
        self._watch_timeout_s = watch_timeout_s
        self._backoff = (backoff_min_s, backoff_max_s)
        self._lock = threading.Lock()
        self._items: dict[str, T] = {}
        # Objects put in by `remember` that no list or watch event has shown yet, with their
        # resourceVersion: a list taken before their create must not drop them (see `_relist`).
        self._remembered: dict[str, int] = {}
        self._version = 0
        # The items at `_version`, as `snapshot` last gave them (None before its first look).
        self._view: tuple[int, tuple[T, ...]] | None = None
        self._resource_version: str | None = None
        self._stop = threading.Event()
        self._response: urllib3.BaseHTTPResponse | None = None
        # The stream the shared reader reads for this informer now, and its events so far.
        self._stream: Stream | None = None
        self._seen = 0
        self._cluster = cluster
        self.synced = threading.Event()
        # Counters that tests and the benchmark read: lists made, watch requests made, events seen.
        self.lists = 0
        self.watches = 0
        self.events = 0
        self._log = log.bind(cluster=cluster, watch=name)
        self._thread = threading.Thread(target=self._run, name=f"gpufed-watch-{cluster}-{name}", daemon=True)

    # ---- read side (any thread) ------------------------------------------------------------------

    def snapshot(self) -> tuple[int, tuple[T, ...]]:
        """The cache's version (bumped on every change) and its items, as they were at that version.

        Copied once a version, on the first look after a change, and shared by every look until the
        next: the scheduler's and the reconciler's looks at every cluster each second found most
        clusters unchanged, and copied their nodes and pods for a memo hit all the same."""
        with self._lock:
            view = self._view
            if view is None or view[0] != self._version:
                view = self._view = (self._version, tuple(self._items.values()))
            return view

    @property
    def version(self) -> int:
        return self._version

    def get(self, key: str) -> T | None:
        with self._lock:
            return self._items.get(key)

    def grouped(self, name: str) -> list[T]:
        """The items `group` files under `name` (none without `group`)."""
        with self._lock:
            return list((self._groups.get(name) or {}).values())

    def _file(self, key: str, old: T | None, new: T | None) -> None:
        """Moves `key` from the group of its old item to that of its new one; under `_lock`."""
        if self._group is None:
            return
        if old is not None and (was := self._group(old)) is not None:
            members = self._groups.get(was)
            if members is not None:
                members.pop(key, None)
                if not members:
                    del self._groups[was]
        if new is not None and (now := self._group(new)) is not None:
            self._groups.setdefault(now, {})[key] = new

    def _regroup(self) -> None:
        """Every item filed again, after a list replaced them all; under `_lock`."""
        self._groups = {}
        for key, item in self._items.items():
            self._file(key, None, item)

    def remember(self, obj: Json) -> None:
        """Put an object the backend just created into the cache, unless the watch already has it.

        Without this a `statuses()` right after a dispatch could miss the new gang for the moment
        the watch event takes, and federation would read the gap as a gang that disappeared.
        """
        parsed = self._parse(obj)
        if parsed is None:
            return
        with self._lock:
            if _key(obj) not in self._items:
                self._items[_key(obj)] = parsed
                self._file(_key(obj), None, parsed)
                self._version += 1
                rv = _numeric_rv(obj)
                if rv is not None:
                    self._remembered[_key(obj)] = rv

    # ---- life ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            response = self._response
            stream = self._stream
        if response is not None:
            # Unblocks the read in the watch thread (urllib3 >= 2.3), or ends the shared reader's.
            # The watch thread may be closing the response at this moment (its stream ended): then
            # there is nothing left to unblock.
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                response.shutdown()
        if stream is not None:
            shared_reader().drop(stream)

    def join(self, timeout_s: float) -> bool:
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # ---- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        delay_s = self._backoff[0]
        while not self._stop.is_set():
            try:
                if self._resource_version is None:
                    self._relist()
                began_s = time.monotonic()
                if self._watch_once() == 0 and time.monotonic() - began_s < 1.0:
                    # A server that ends watches at once must not be asked again in a tight loop.
                    self._stop.wait(delay_s)
                delay_s = self._backoff[0]
            except Gone:
                self._log.info("watch_expired", resource_version=self._resource_version)
                self._resource_version = None
            except Exception as error:
                if self._stop.is_set():
                    break
                if is_no_answer(error):
                    self._health.failed()
                    self._log.warning("watch_disconnected", error=repr(error), retry_in_s=delay_s)
                else:
                    # An answer we did not expect (a 4xx, a garbled body): start over from a list.
                    self._log.error("watch_failed", error=repr(error), retry_in_s=delay_s)
                    self._resource_version = None
                self._stop.wait(delay_s)
                delay_s = min(delay_s * 2, self._backoff[1])
        self._log.debug("watch_stopped")

    def _relist(self) -> None:
        items: dict[str, T] = {}
        token: str | None = None
        while True:
            self.lists += 1
            try:
                page = self._api.list_page(
                    self._path, label_selector=self._selector, limit=PAGE_SIZE, token=token
                )
            except Exception as error:
                if status_of(error) == 410 and token is not None:
                    # The continue token expired mid-list: the list is no longer one snapshot.
                    token = None
                    items = {}
                    continue
                raise
            self._health.answered()
            for obj in page.get("items") or ():
                parsed = self._parse(obj)
                if parsed is not None:
                    items[_key(obj)] = parsed
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                resource_version = str(meta.get("resourceVersion") or "")
                break
        listed_rv = _numeric_rv({"metadata": {"resourceVersion": resource_version}})
        with self._lock:
            # An object created after this list's snapshot (its resourceVersion is newer) but
            # remembered before the list came back is not in it: keep it, as the watch that follows
            # from the list's version will bring its ADDED (or DELETED) event. Without this, the
            # first gangs dispatched while a new watch made its first list vanished for the moment
            # the watch took, and federation read that as gangs lost and restarted them.
            # resourceVersions are compared only when both are numbers (they are etcd revisions on
            # every API server; one that is not is dropped as before).
            for key, rv in list(self._remembered.items()):
                if listed_rv is None or rv <= listed_rv:
                    del self._remembered[key]
                elif key not in items and key in self._items:
                    items[key] = self._items[key]
            self._items = items
            self._regroup()
            self._version += 1
        self._resource_version = resource_version
        self.synced.set()
        self._log.debug("watch_listed", items=len(items), resource_version=resource_version)

    def _watch_once(self) -> int:
        """Follow one watch request to its end; the number of events it brought."""
        assert self._resource_version is not None
        self.watches += 1
        try:
            response = self._api.watch(
                self._path,
                resource_version=self._resource_version,
                label_selector=self._selector,
                timeout_s=self._watch_timeout_s,
            )
        except Exception as error:
            if status_of(error) == 410:
                raise Gone from error
            raise
        self._health.answered()
        self._seen = 0
        stream = open_stream(response, self._deliver, name=f"{self._cluster}/{self.name}")
        if stream is None:
            return self._read_here(response)
        with self._lock:
            self._response = response
            self._stream = stream
        if self._stop.is_set():
            response.shutdown()
            shared_reader().drop(stream)
        try:
            # The reader thread applies the events; this one waits for the stream's end (the
            # server's timeout, an error, or `stop`), then makes the next request.
            stream.ended.wait()
        finally:
            with self._lock:
                self._response = None
                self._stream = None
            # The client did not read the body, so the connection cannot serve another request.
            response.close()
            response.release_conn()
        if stream.error is not None:
            raise stream.error
        return self._seen

    def _deliver(self, line: bytes) -> bool:
        """One event of the stream, on the reader's thread; False once the informer is stopping."""
        if self._stop.is_set():
            return False
        self._seen += 1
        self._apply(decode_json(line))
        return True

    def _read_here(self, response: urllib3.BaseHTTPResponse) -> int:
        """The stream read on this thread (a response the shared reader cannot read)."""
        with self._lock:
            self._response = response
        if self._stop.is_set():
            response.shutdown()
        seen = 0
        ended = False
        try:
            for line in self._api.lines(response):
                if self._stop.is_set():
                    break
                seen += 1
                self._apply(decode_json(line))
            else:
                ended = True
        finally:
            with self._lock:
                self._response = None
            if not ended:
                # Unread bytes would poison the next request on this connection: drop it instead.
                response.close()
            response.release_conn()
        return seen

    def _apply(self, event: Json) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(str(obj.get("message", "")))
            raise WatchError(f"watch {self.name}: {obj.get('code')} {obj.get('message', '')}")
        self._health.answered()
        resource_version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if resource_version:
                self._resource_version = str(resource_version)
            return
        self.events += 1
        key = _key(obj)
        parsed = None if kind == "DELETED" else self._parse(obj)
        with self._lock:
            self._remembered.pop(key, None)  # the watch shows it now, or its end
            old = self._items.get(key)
            if parsed is None:
                changed = self._items.pop(key, None) is not None
            else:
                self._items[key] = parsed
                changed = True
            self._file(key, old, parsed)
            if changed:
                self._version += 1
        if self._observer is not None:
            try:
                self._observer(str(kind), obj)
            except Exception:  # an observer's fault must not stop the cache
                self._log.exception("watch_observer_failed")
        if resource_version:
            self._resource_version = str(resource_version)


class WatchError(Exception):
    """The watch stream reported an error other than Gone; the informer lists again."""


def _key(obj: Json) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _numeric_rv(obj: Json) -> int | None:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None
