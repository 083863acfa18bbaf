"""The writes that create and remove a gang's objects, all or nothing, and idempotent by name.

A gang is one object (a Volcano Job) or two (a headless Service, then an Indexed Job). Names come
from the job id and attempt, so a repeated create meets `409 Conflict`, which is success: the object
is already there. When the second object of an Indexed gang cannot be created the first is removed
again, so a failed dispatch leaves nothing behind that garbage collection would have to find.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, TypeVar

import structlog

from clusters.api import ClusterError, GangRejected, GangWorkload
from clusters.kubernetes import manifests
from clusters.kubernetes.config import KubernetesClusterConfig
from clusters.kubernetes.errors import ApiRefused, status_of
from clusters.kubernetes.inventory import GANG_LABEL
from clusters.kubernetes.kube import KubeApi
from clusters.kubernetes.names import namespace_for, object_name, queue_for
from clusters.kubernetes.secret_objects import bound_gang, secret_manifest, secret_object_name
from clusters.kubernetes.status import (
    ATTEMPT_KEY,
    EVICTED_KEY,
    JOB_ID_KEY,
    MANAGED_BY,
    MANAGED_BY_KEY,
    NO_SECRET,
    SECRET_KEY,
    GangKind,
    GangObject,
    gang_object,
)
from placement.model import JobId

log = structlog.get_logger("gpufed.clusters.kubernetes")

R = TypeVar("R")
CONFLICT = frozenset({409})
NOT_FOUND = frozenset({404})


# Gangs named in one `deletecollection`'s label selector: a gang's name is a DNS label (63 bytes at
# most), so a chunk's selector stays within the few kilobytes of a request line that API servers and
# proxies take (kube-apiserver's own limit is far above it).
COLLECTION_CHUNK = 50


def gangs_selector(names: Collection[str]) -> str:
    """The label selector of exactly these gangs of gpufed's (`managed-by=gpufed,gang in (...)`)."""
    return f"{MANAGED_BY_KEY}={MANAGED_BY},{GANG_LABEL} in ({','.join(sorted(names))})"


class Caller(Protocol):
    """Runs a blocking API call off the event loop and maps its errors (the backend's `_call`)."""

    async def __call__(
        self,
        doing: str,
        fn: Callable[..., R],
        *args: Any,
        ok: frozenset[int] = ...,
        dispatching: bool = ...,
    ) -> R | None: ...


class GangWriter:
    def __init__(
        self,
        api: KubeApi,
        config: KubernetesClusterConfig,
        call: Caller,
        created: Callable[[GangKind, dict[str, Any]], None],
    ) -> None:
        self._created = created
        self._api = api
        self._config = config
        self._call = call
        # The tenant namespaces this writer made or saw, with the pod security level it labelled them.
        self._namespaces: dict[str, str] = {}
        self._queues: set[str] = set()
        # One make-or-label of a namespace (or queue) at a time: a burst of a new tenant's gangs
        # on a cluster otherwise sent one create and one label each (4 per tenant and cluster in
        # bench/scale.py), all but the first answered 409 or changing nothing.
        self._ensuring: dict[str, asyncio.Lock] = {}
        self._log = log.bind(cluster=config.name)

    async def create(self, gang: GangWorkload, selection: manifests.NodeSelection, *, volcano: bool) -> None:
        """Create the gang in its tenant's namespace, making the namespace again if someone deleted it.

        gpufed owns `<prefix><tenant>`: a namespace deleted under it (by a person, or a clean-up
        script) is recreated, and the create tried once more, rather than refused for every job of
        the tenant until a person notices.
        """
        namespace = await self._namespace(gang)
        try:
            await self._create(gang, selection, namespace, volcano=volcano)
        except ClusterError as error:
            # Whatever went wrong, ask for the namespace (and the tenant's Volcano queue, which a
            # person may have deleted too) again next time: it costs one 409 each.
            self._namespaces.pop(namespace, None)
            self._queues.discard(queue_for(gang.tenant))
            if not _namespace_missing(error):
                raise
            self._log.warning("namespace_recreated", namespace=namespace, job_id=gang.job_id)
            await self._create(gang, selection, await self._namespace(gang), volcano=volcano)

    async def _create(
        self, gang: GangWorkload, selection: manifests.NodeSelection, namespace: str, *, volcano: bool
    ) -> None:
        name = object_name(gang.job_id, gang.attempt)
        if gang.secrets:
            # The Secret first, so that no pod starts before what it reads is there; the pods read it
            # by the gang's Secret's name (clusters.kubernetes.secret_objects).
            secret = secret_object_name(name)
            body = secret_manifest(gang, manifests.object_metadata(gang, secret, namespace))
            await self._call(
                f"create secret {secret} in {namespace}",
                self._api.create_secret,
                namespace,
                body,
                ok=CONFLICT,
                dispatching=True,
            )
            gang = bound_gang(gang, secret)
            try:
                await self._create_gang(gang, selection, name, namespace, volcano=volcano)
            except Exception:
                # All or nothing: without its gang the Secret must not stay. If this fails too, the
                # next delete of the attempt (the collector's) removes it by name.
                await self.delete_secret(namespace, name)
                raise
            return
        await self._create_gang(gang, selection, name, namespace, volcano=volcano)

    async def _create_gang(
        self,
        gang: GangWorkload,
        selection: manifests.NodeSelection,
        name: str,
        namespace: str,
        *,
        volcano: bool,
    ) -> None:
        settings = self._config.settings
        doing = f"create gang {name} in {namespace}"
        if volcano:
            await self._queue(gang)
            body = manifests.volcano_job(gang, name, namespace, selection, master_port=settings.master_port)
            body = _with_secret_mark(body, gang)
            made = await self._call(
                doing, self._api.create_volcano_job, namespace, body, ok=CONFLICT, dispatching=True
            )
            # Into the watch cache at once, as an Indexed Job is: until the watch event came, a
            # status read right after this dispatch missed the gang, and the reconciler took that
            # for a gang that disappeared and restarted the job (seen as soon as ticks ran back to
            # back; real watches lag as well).
            if made is not None:
                self._created(GangKind.VOLCANO_JOB, made)
            return
        if manifests.uniform_replica(gang) is None:
            raise GangRejected(
                f"gang {gang.name}: cluster {self._config.name} has no Volcano, and an Indexed Job runs "
                "one pod template, but the replicas differ in image, command, env or GPUs"
            )
        service = manifests.headless_service(gang, name, namespace, master_port=settings.master_port)
        job = manifests.indexed_job(gang, name, namespace, selection, master_port=settings.master_port)
        job = _with_secret_mark(job, gang)
        await self._call(doing, self._api.create_service, namespace, service, ok=CONFLICT, dispatching=True)
        try:
            made = await self._call(
                doing, self._api.create_job, namespace, job, ok=CONFLICT, dispatching=True
            )
        except Exception:
            # All or nothing: the Service alone is no gang. If this fails too, GC finds the orphan.
            try:
                await self._call(
                    f"remove service {name}", self._api.delete_service, namespace, name, ok=NOT_FOUND
                )
            except Exception as error:
                self._log.warning("service_left_behind", name=name, namespace=namespace, error=str(error))
            raise
        if made is not None:
            self._created(GangKind.INDEXED_JOB, made)

    async def delete_secret(self, namespace: str, name: str) -> None:
        """Delete the gang's Secret (if it had one: 404 otherwise). A cluster joined before gpufed
        made Secrets refuses with 403 until `gpufed cluster join` runs again: said, not raised, as
        such a cluster never got a Secret to delete."""
        secret = secret_object_name(name)
        try:
            await self._call(
                f"delete secret {secret} in {namespace}",
                self._api.delete_secret,
                namespace,
                secret,
                ok=NOT_FOUND,
            )
        except ClusterError as error:
            cause = error.__cause__
            if cause is None or status_of(cause) != 403:
                raise
            self._log.warning("secret_delete_forbidden", namespace=namespace, name=secret)

    async def delete(self, gang: GangObject, grace_period_s: float) -> None:
        """Delete the gang object (its pods go with it, in the foreground), and what it does not own:
        its Secret, if it may have one, and the headless Service of an Indexed Job. A Volcano Job's
        Service is its svc plugin's, owned by the Job (an ownerReference): the garbage collector and
        Volcano's own controller delete it with the Job, so it costs no call here."""
        namespace, name = gang.namespace, gang.name
        doing = f"delete gang {name} in {namespace}"
        if gang.may_have_secret:
            await self.delete_secret(namespace, name)
        if gang.kind is GangKind.VOLCANO_JOB:
            await self._call(
                doing, self._api.delete_volcano_job, namespace, name, grace_period_s, ok=NOT_FOUND
            )
            return
        await self._call(doing, self._api.delete_job, namespace, name, grace_period_s, ok=NOT_FOUND)
        await self._call(f"delete service {name}", self._api.delete_service, namespace, name, ok=NOT_FOUND)

    async def delete_many(
        self, kind: GangKind, namespace: str, names: Sequence[str], grace_period_s: float
    ) -> None:
        """Delete these gangs of one kind and namespace with one `deletecollection` a chunk of
        COLLECTION_CHUNK names (an Indexed gang's headless Services with one more), by a selector
        that names each gang and gpufed as their manager: an object of the namespace that carries no
        gpufed label, or another gang's, is not picked. Their Secrets are the caller's (`delete`
        removes one by name). Raises the API's refusal as `delete` does; a cluster whose account
        lacks the verb answers 403 (`ClusterError` caused by it), and its caller deletes one by one.
        """
        ordered = sorted(names)
        for start in range(0, len(ordered), COLLECTION_CHUNK):
            chunk = ordered[start : start + COLLECTION_CHUNK]
            selector = gangs_selector(chunk)
            doing = f"delete gangs {', '.join(chunk)} in {namespace}"
            if kind is GangKind.VOLCANO_JOB:
                await self._call(doing, self._api.delete_volcano_jobs, namespace, selector, grace_period_s)
                continue
            await self._call(doing, self._api.delete_jobs, namespace, selector, grace_period_s)
            await self._call(f"delete services of {doing}", self._api.delete_services, namespace, selector)

    async def delete_leftovers(
        self, pods: Sequence[tuple[str, str]], name: str, grace_period_s: float, *, volcano: bool
    ) -> None:
        """Delete an attempt's pods by name, then its Service and PodGroup (named like the gang) in
        each of their namespaces: what is left when the gang object went without them."""
        for namespace, pod in pods:
            await self._call(
                f"delete pod {pod} in {namespace}",
                self._api.delete_pod,
                namespace,
                pod,
                grace_period_s,
                ok=NOT_FOUND,
            )
        for namespace in sorted({ns for ns, _ in pods}):
            await self.delete_secret(namespace, name)
            await self._call(
                f"delete service {name}", self._api.delete_service, namespace, name, ok=NOT_FOUND
            )
            if volcano:
                await self._call(
                    f"delete pod group {name}", self._api.delete_pod_group, namespace, name, ok=NOT_FOUND
                )

    async def mark_evicted(self, gang: GangObject, reason: str) -> None:
        """Say on the gang (annotation, then an Event) that gpufed evicted it, before deleting it."""
        doing = f"annotate gang {gang.name} as evicted"
        if gang.kind is GangKind.VOLCANO_JOB:
            annotate = self._api.annotate_volcano_job
            api_version = f"{manifests.VOLCANO_GROUP}/{manifests.VOLCANO_VERSION}"
        else:
            annotate = self._api.annotate_job
            api_version = "batch/v1"
        await self._call(doing, annotate, gang.namespace, gang.name, {EVICTED_KEY: reason}, ok=NOT_FOUND)
        now = time.time()
        event = manifests.eviction_event(
            namespace=gang.namespace,
            name=gang.name,
            uid=gang.uid,
            kind="Job",
            api_version=api_version,
            reason=reason,
            now_iso=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            seq=f"{int(now * 1e9):x}",
        )
        await self._call(f"record eviction of {gang.name}", self._api.create_event, gang.namespace, event)

    async def find(self, job_id: JobId, attempt: int, *, volcano: bool) -> GangObject | None:
        """The gang by its label, asking the API: for a gang the watch may not have shown yet."""
        selector = f"{GANG_LABEL}={object_name(job_id, attempt)}"
        calls = [(self._api.list_jobs, GangKind.INDEXED_JOB)]
        if volcano:
            calls.append((self._api.list_volcano_jobs, GangKind.VOLCANO_JOB))
        for path, kind in calls:
            page = await self._call(
                f"find gang {job_id}/{attempt}",
                lambda p=path: self._api.list_page(p, label_selector=selector, limit=10, token=None),
            )
            for obj in (page or {}).get("items") or ():
                gang = gang_object(obj, kind)
                if gang is not None and gang.key == (job_id, attempt):
                    return gang
        return None

    async def orphan_services(
        self, live: Collection[tuple[JobId, int]], gang_names: set[str]
    ) -> list[tuple[JobId, int]]:
        """Delete gpufed's Services that belong to no live attempt and to no gang object."""
        services = await self._call(
            "list services", self._api.list_services, f"{MANAGED_BY_KEY}={MANAGED_BY}"
        )
        removed = []
        for service in services or ():
            meta = service.get("metadata") or {}
            notes = meta.get("annotations") or {}
            job_id, attempt = notes.get(JOB_ID_KEY), notes.get(ATTEMPT_KEY)
            if job_id is None or attempt is None or not str(attempt).isdigit():
                continue
            key = (JobId(job_id), int(attempt))
            if key in live or meta.get("name") in gang_names:
                continue
            await self.delete_secret(meta.get("namespace", ""), meta.get("name", ""))
            await self._call(
                f"delete service {meta.get('name')}",
                self._api.delete_service,
                meta.get("namespace", ""),
                meta.get("name", ""),
                ok=NOT_FOUND,
            )
            removed.append(key)
        return removed

    def _ensure_lock(self, what: str) -> asyncio.Lock:
        lock = self._ensuring.get(what)
        if lock is None:
            lock = self._ensuring[what] = asyncio.Lock()
        return lock

    async def _namespace(self, gang: GangWorkload) -> str:
        prefix = self._config.settings.namespace_prefix
        namespace = namespace_for(prefix, gang.tenant)
        level = gang.pod_security
        if self._namespaces.get(namespace) == level:
            return namespace
        async with self._ensure_lock(f"namespace/{namespace}"):
            # Another gang of the tenant may have made or labelled it while this one waited.
            known = self._namespaces.get(namespace)
            if known == level:
                return namespace
            if known is None:
                body = manifests.namespace_manifest(prefix, gang.tenant, level)
                made = await self._call(
                    f"create namespace {namespace}", self._api.create_namespace, body, ok=CONFLICT
                )
                # Already there (409): made by an earlier server, perhaps with another level.
                known = level if made is not None else None
            if known != level:
                # The tenant's level changed since (an admin's), or the namespace predates it: Pod
                # Security Admission must enforce the level this gang's pods were checked against.
                await self._call(
                    f"label namespace {namespace} pod security {level}",
                    self._api.label_namespace,
                    namespace,
                    manifests.pod_security_labels(level),
                )
            self._namespaces[namespace] = level
        return namespace

    async def _queue(self, gang: GangWorkload) -> None:
        queue = queue_for(gang.tenant)
        if queue in self._queues:
            return
        async with self._ensure_lock(f"queue/{queue}"):
            if queue in self._queues:
                return
            body = manifests.queue_manifest(gang.tenant)
            try:
                await self._call(f"create queue {queue}", self._api.create_queue, body, ok=CONFLICT)
            except ApiRefused as error:
                if "HTTP 404" not in str(error):
                    raise
                # No Queue resource (a Volcano without its scheduling CRDs, or a simulator that
                # leaves queues out): the job names its queue all the same; say so once.
                self._log.warning("volcano_queues_not_served", queue=queue)
            self._queues.add(queue)


def _with_secret_mark(body: dict[str, Any], gang: GangWorkload) -> dict[str, Any]:
    """The gang object's manifest, saying whether the gang has a Secret of its own (SECRET_KEY)."""
    name = str(body["metadata"]["name"])
    body["metadata"]["annotations"][SECRET_KEY] = secret_object_name(name) if gang.secrets else NO_SECRET
    return body


def _namespace_missing(error: BaseException) -> bool:
    """A create answered `404 namespaces "x" not found`: the namespace was deleted under us."""
    cause = error.__cause__
    return cause is not None and status_of(cause) == 404 and 'namespaces "' in str(error)
