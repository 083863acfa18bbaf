"""A gang's pods, their events and their logs, read through the official client for `gpufed logs`
and `gpufed describe`.

These reads are rare (an engineer asks) and must be current, so they go to the API rather than to
the watch cache, which keeps only what scheduling needs. A log is the pod log API itself
(`read_namespaced_pod_log` with `_preload_content=False`), read on a thread of its own pool and
handed to the event loop through a bounded queue: a follower that reads slowly holds back its own
thread, never the loop, and a follow of hours does not hold one of the few threads that writes use.
A read the API bounds (a tail or a byte limit, without follow: the keeper's copy of every ended
attempt) is read whole in one hop to a small pool's thread instead (`read_bounded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from kubernetes.client.exceptions import ApiException

from clusters.api import (
    ClusterUnreachable,
    GangEvent,
    LogOptions,
    LogUnavailable,
    ReplicaState,
)
from clusters.kubernetes.errors import is_no_answer, reason_of, status_of
from clusters.kubernetes.inventory import GANG_LABEL, parse_time_s
from clusters.kubernetes.kube import Timeouts, call, decode_json
from clusters.kubernetes.last_words import LastWords
from clusters.kubernetes.names import namespace_for, object_name
from clusters.kubernetes.threads import Lane
from placement.model import JobId, TenantId

Json = dict[str, Any]

TASK_LABEL = "gpufed.io/task"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
VOLCANO_TASK_INDEX = "volcano.sh/task-index"
VOLCANO_TASK = "volcano.sh/task-spec"
# Chunks in flight per stream between its reading thread and the loop: the backpressure bound.
_QUEUE_CHUNKS = 32
_READ_BYTES = 64 * 1024
FOLLOW_READ_TIMEOUT_S = 300.0


def _index(meta: Json) -> tuple[int, bool]:
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    for key, by_rank in ((COMPLETION_INDEX, True), (VOLCANO_TASK_INDEX, False)):
        value = annotations.get(key) or labels.get(key)
        if value is not None and str(value).isdigit():
            return int(value), by_rank
    return 0, True


def _container_reason(status: Json) -> tuple[str, str, int | None, float | None, float | None]:
    """(reason, message, exit code, started, finished) of the pod's first container."""
    containers = status.get("containerStatuses") or ()
    if not containers:
        return "", "", None, None, None
    c = containers[0]
    state = c.get("state") or {}
    last = (c.get("lastState") or {}).get("terminated") or {}
    if waiting := state.get("waiting"):
        reason = str(waiting.get("reason") or "")
        code = last.get("exitCode")
        return reason, str(waiting.get("message") or ""), code, None, parse_time_s(last.get("finishedAt"))
    if terminated := state.get("terminated"):
        code = terminated.get("exitCode")
        reason = str(terminated.get("reason") or "")
        if reason == "Completed" and code == 0:
            reason = ""
        return (
            reason,
            str(terminated.get("message") or ""),
            None if code is None else int(code),
            parse_time_s(terminated.get("startedAt")),
            parse_time_s(terminated.get("finishedAt")),
        )
    running = state.get("running") or {}
    # A container running again after a crash: the crash is what the engineer wants to see.
    reason = str(last.get("reason") or "")
    code = last.get("exitCode")
    return reason, "", None if code is None else int(code), parse_time_s(running.get("startedAt")), None


def replica_state(pod: Json) -> ReplicaState:
    """A pod reduced to what `describe` shows of it."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    index, by_rank = _index(meta)
    reason, message, exit_code, started_s, finished_s = _container_reason(status)
    if status.get("reason"):
        # The pod's own reason (Evicted, OutOfnvidia.com/gpu, DeadlineExceeded) says more than its
        # container's (killed, exit 137).
        reason = str(status["reason"])
        message = str(status.get("message") or message)
    containers = spec.get("containers") or ()
    restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or ())
    return ReplicaState(
        pod=str(meta.get("name", "")),
        task=str(annotations.get(VOLCANO_TASK) if not by_rank else labels.get(TASK_LABEL, "")),
        index=index,
        by_rank=by_rank,
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        restarts=restarts,
        exit_code=exit_code,
        reason=reason,
        message=message,
        started_at_s=started_s if started_s is not None else parse_time_s(status.get("startTime")),
        finished_at_s=finished_s,
        container=str(containers[0].get("name", "")) if containers else "",
    )


def gang_event(event: Json) -> GangEvent:
    involved = event.get("involvedObject") or {}
    last = event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
    return GangEvent(
        object_kind=str(involved.get("kind", "")),
        object_name=str(involved.get("name", "")),
        type=str(event.get("type") or ""),
        reason=str(event.get("reason") or ""),
        message=str(event.get("message") or ""),
        count=int(event.get("count") or 1),
        last_at_s=parse_time_s(last),
    )


class PodReader:
    """Blocking reads of one cluster for describe and logs; run them on worker threads."""

    def __init__(self, client: Any, timeouts: Timeouts) -> None:
        self._client = client
        self._timeouts = timeouts

    def gang_pods(self, gang: str) -> list[Json]:
        response = call(
            self._client,
            "GET",
            "/api/v1/pods",
            timeout=self._timeouts.pair(),
            query=[("labelSelector", f"{GANG_LABEL}={gang}")],
        )
        return _items(response)

    def events(self, namespace: str) -> list[Json]:
        response = call(
            self._client,
            "GET",
            "/api/v1/namespaces/{namespace}/events",
            timeout=self._timeouts.pair(),
            path_params={"namespace": namespace},
        )
        return _items(response)

    def open_log(self, namespace: str, pod: str, container: str, options: LogOptions) -> Any:
        query = [
            ("container", container or None),
            ("follow", options.follow),
            ("limitBytes", options.limit_bytes),
            ("previous", options.previous),
            ("sinceSeconds", options.since_s),
            ("tailLines", options.tail_lines),
            ("timestamps", options.timestamps),
        ]
        return call(
            self._client,
            "GET",
            "/api/v1/namespaces/{namespace}/pods/{name}/log",
            # A follow may be silent for long; one silent past this is read again from where it was.
            timeout=self._timeouts.pair(FOLLOW_READ_TIMEOUT_S if options.follow else None),
            path_params={"namespace": namespace, "name": pod},
            query=query,
        )

    def read_log(self, namespace: str, pod: str, container: str, options: LogOptions) -> bytes:
        """The whole log for `options` at once (not a follow), on the calling thread."""
        response = self.open_log(namespace, pod, container, options)
        try:
            return bytes(response.read(decode_content=True))
        finally:
            with contextlib.suppress(Exception):
                response.release_conn()


def _items(response: Any) -> list[Json]:
    try:
        data = decode_json(response.data)
    finally:
        response.release_conn()
    return list(data.get("items") or ()) if isinstance(data, dict) else []


def log_error(error: BaseException, cluster: str, pod: str) -> Exception:
    """`ClusterUnreachable` for no answer, `LogUnavailable` for the API's own refusal."""
    if is_no_answer(error):
        return ClusterUnreachable(f"cluster {cluster} cannot be reached for the log of pod {pod}: {error!r}")
    status = status_of(error)
    detail = reason_of(error) if isinstance(error, ApiException) else str(error)
    return LogUnavailable(f"pod {pod}: HTTP {status}: {detail}")


async def stream_log(
    executor: Executor,
    open_response: Callable[[], Any],
    *,
    cluster: str,
    pod: str,
) -> AsyncIterator[bytes]:
    """Chunks of whole lines from a pod log response opened on `executor`'s thread."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(_QUEUE_CHUNKS)
    stop = threading.Event()
    holder: list[Any] = []

    def put(item: bytes | BaseException | None) -> None:
        future = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
        while not stop.is_set():
            try:
                future.result(timeout=0.5)
                return
            except TimeoutError:
                continue
        future.cancel()

    def pump() -> None:
        try:
            response = open_response()
        except Exception as error:
            put(log_error(error, cluster, pod))
            return
        holder.append(response)
        rest = b""
        try:
            for chunk in response.stream(_READ_BYTES, decode_content=True):
                if stop.is_set():
                    return
                data = rest + chunk
                cut = data.rfind(b"\n") + 1
                rest = data[cut:]
                if cut:
                    put(data[:cut])
            if rest:
                put(rest + b"\n")
            put(None)
        except Exception as error:
            put(None if stop.is_set() else log_error(error, cluster, pod))
        finally:
            with contextlib.suppress(Exception):
                response.release_conn()

    task = loop.run_in_executor(executor, pump)
    try:
        while True:
            item = await queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        for response in holder:
            # Unblocks the thread's read of a follow that the client stopped listening to.
            with contextlib.suppress(Exception):
                response.shutdown()
        with contextlib.suppress(asyncio.QueueEmpty):
            while True:
                queue.get_nowait()
        if task.done():
            with contextlib.suppress(BaseException):
                task.result()


# Log streams one cluster serves at once; beyond, a stream waits for a thread (the server's own
# limits refuse long before).
LOG_THREADS = 256
# Bounded reads (a tail, read whole: the keeper's copy of every ended attempt) at once per cluster.
# Each takes a few milliseconds; on the streams' pool a burst of ends started a thread for each
# read in flight (thread starts showed in the server's profile), where these few are reused.
TAIL_THREADS = 8
# Lists of a gang's pods and of events at once per cluster (`describe`, a keeper's list when the
# watch cannot answer).
READ_THREADS = 4


async def _once(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


def whole_lines(data: bytes) -> bytes:
    """A log read whole, ending with a newline as `stream_log`'s last chunk does."""
    return data if not data or data.endswith(b"\n") else data + b"\n"


async def read_bounded(
    lane: Lane, read: Callable[[], bytes], *, cluster: str, pod: str
) -> AsyncIterator[bytes]:
    """A log that the API bounds (`tailLines` or `limitBytes`, no follow), read whole on a thread of
    the shared pool that `lane` bounds: one hop to a thread and back instead of `stream_log`'s hop
    and queued chunk per read, which cost the server most of its CPU for the copy the keeper takes of
    every ended attempt (bench/scale.py). The whole answer is in memory at once, as the keeper joins
    it."""
    try:
        data = await lane.run(read)
    except Exception as error:
        raise log_error(error, cluster, pod) from error
    if data:
        yield whole_lines(data)


class GangInspection:
    """`clusters.api.GangInspector` for the Kubernetes backend: reads on pools of their own."""

    def __init__(
        self,
        cluster: str,
        namespace_prefix: str,
        client: Any,
        timeouts: Timeouts,
        log_client: Callable[[], Any] | None,
    ) -> None:
        self._cluster = cluster
        self._prefix = namespace_prefix
        self._reader = PodReader(client, timeouts)
        self._timeouts = timeouts
        # Follows hold a connection each for as long as they last: a client (connection pool) of
        # their own keeps them from crowding out the backend's calls and watches.
        self._log_client_factory = log_client
        self._log_client: Any = None
        self._log_reader: PodReader | None = None
        # Killed pods' logs, read as the pod watch sees them go (`observe_pod` is its hook).
        self.last_words = LastWords(cluster, self._reader.read_log, replica_state)
        # Lists and bounded reads on the process's shared pool (clusters.kubernetes.threads), each
        # bounded per cluster as its own pool was; follows keep a pool of their own, as each holds
        # its thread for as long as it lasts.
        self._reads = Lane(f"{cluster} reads", READ_THREADS)
        self._logs = ThreadPoolExecutor(
            max_workers=LOG_THREADS, thread_name_prefix=f"gpufed-k8s-log-{cluster}"
        )
        self._tails = Lane(f"{cluster} tails", TAIL_THREADS)

    def observe_pod(self, kind: str, pod: Json) -> None:
        if str((pod.get("metadata") or {}).get("namespace", "")).startswith(self._prefix):
            self.last_words.observe(kind, pod)

    def close(self) -> None:
        self.last_words.close()
        self._reads.refuse()
        self._tails.refuse()
        self._logs.shutdown(wait=False, cancel_futures=True)
        if self._log_client is not None:
            with contextlib.suppress(Exception):
                self._log_client.close()

    async def _read(self, doing: str, fn: Callable[[], list[Json]]) -> list[Json]:
        try:
            return await self._reads.run(fn)
        except ApiException as error:
            if status_of(error) == 404:
                return []
            if is_no_answer(error):
                raise ClusterUnreachable(f"cluster {self._cluster}: {doing}: {reason_of(error)}") from error
            raise LogUnavailable(f"cluster {self._cluster}: {doing}: {reason_of(error)}") from error
        except Exception as error:
            raise ClusterUnreachable(
                f"cluster {self._cluster}: {doing}: no answer from the API ({error!r})"
            ) from error

    async def replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        gang = object_name(job_id, attempt)
        pods = await self._read("list the gang's pods", functools.partial(self._reader.gang_pods, gang))
        namespace = namespace_for(self._prefix, tenant)
        found = [replica_state(p) for p in pods if (p.get("metadata") or {}).get("namespace") == namespace]
        return await self.with_killed(namespace, gang, found)

    async def with_killed(self, namespace: str, gang: str, found: list[ReplicaState]) -> list[ReplicaState]:
        """The gang's pods `found` on the cluster, with those killed while they ran beside them, in
        `describe`'s order."""
        if found:
            # Killed pods are shown beside the rest while the gang's pods are there (the keeper
            # reads them all when the gang ends); once every pod is gone, so is the gang's live view,
            # and readers turn to the kept copy.
            await self.last_words.settled(namespace, gang)
            found += self.last_words.gone_replicas(namespace, gang, [r.pod for r in found])
        return sorted(found, key=lambda r: (not r.by_rank, r.task, r.index, r.pod))

    async def killed_replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        # Whether or not any pod of the gang is left (`replicas` shows these only beside live ones).
        gang = object_name(job_id, attempt)
        namespace = namespace_for(self._prefix, tenant)
        await self.last_words.settled(namespace, gang)
        return self.last_words.gone_replicas(namespace, gang, [])

    async def events(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[GangEvent]:
        gang = object_name(job_id, attempt)
        namespace = namespace_for(self._prefix, tenant)
        pods = await self._read("list the gang's pods", functools.partial(self._reader.gang_pods, gang))
        names = {gang} | {str((p.get("metadata") or {}).get("name", "")) for p in pods}
        raw = await self._read("list events", functools.partial(self._reader.events, namespace))
        # By name within the tenant's namespace: gang, Service, PodGroup and pods share the prefix.
        found = [
            gang_event(e)
            for e in raw
            if str((e.get("involvedObject") or {}).get("name", "")) in names
            or str((e.get("involvedObject") or {}).get("name", "")).startswith(f"{gang}-")
        ]
        return sorted(found, key=lambda e: e.last_at_s or 0.0)

    def pod_log(self, tenant: TenantId, replica: ReplicaState, options: LogOptions) -> AsyncIterator[bytes]:
        if self._log_reader is None:
            if self._log_client_factory is not None:
                self._log_client = self._log_client_factory()
            self._log_reader = (
                PodReader(self._log_client, self._timeouts) if self._log_client is not None else self._reader
            )
        namespace = namespace_for(self._prefix, tenant)
        kept = self.last_words.log_of(namespace, replica.pod, options)
        if kept is not None:
            return _once(kept)
        if not options.follow and (options.tail_lines is not None or options.limit_bytes is not None):
            reader = functools.partial(
                self._log_reader.read_log, namespace, replica.pod, replica.container, options
            )
            bounded = read_bounded(self._tails, reader, cluster=self._cluster, pod=replica.pod)
            return self._live_else_kept(bounded, namespace, replica.pod, options)
        opener = functools.partial(
            self._log_reader.open_log, namespace, replica.pod, replica.container, options
        )
        live = stream_log(self._logs, opener, cluster=self._cluster, pod=replica.pod)
        return self._live_else_kept(live, namespace, replica.pod, options)

    async def _live_else_kept(
        self, live: AsyncIterator[bytes], namespace: str, pod: str, options: LogOptions
    ) -> AsyncIterator[bytes]:
        """The live log; if the pod went before it could be read (killed a moment ago, its DELETED
        event not yet here), the copy read as it was killed."""
        sent = False
        try:
            async for chunk in live:
                sent = True
                yield chunk
        except LogUnavailable:
            kept = None if sent else self.last_words.log_of(namespace, pod, options, only_gone=False)
            if kept is None:
                raise
            if kept:
                yield kept
