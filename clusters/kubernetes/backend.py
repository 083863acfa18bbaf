"""`ClusterBackend` for a real Kubernetes cluster, through the official client.

One backend drives one kubeconfig context. Reads never touch the API on the caller's path: watch
threads (`watch.Informer`) keep nodes, pods and gang objects cached, and `inventory()` and
`statuses()` are computed from that cache, memoised until it changes. Writes (dispatch, cancel,
evict, garbage collection) go to the API on the threads of one pool that every member cluster shares
(clusters.kubernetes.threads), at most `api_threads` of this cluster's at once: a slow or hung cluster
holds its own threads and no more, and neither the event loop's default executor that the rest of
the server uses nor another cluster's calls wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from typing import Any, TypeVar

import structlog

from clusters.api import (
    ClusterError,
    ClusterUnreachable,
    GangEvent,
    GangRejected,
    GangStatus,
    GangWorkload,
    LogOptions,
    ReplicaState,
    VanishedAttempt,
)
from clusters.kubernetes import manifests
from clusters.kubernetes.config import KubernetesClusterConfig
from clusters.kubernetes.errors import is_no_answer, status_of, translate
from clusters.kubernetes.gangs import GangWriter
from clusters.kubernetes.inventory import (
    FINISHED_PHASES,
    NodeInfo,
    PodInfo,
    cluster_state,
    never_fits,
    node_info,
    node_positions,
    pod_info,
    pool_layout,
    unpriced,
)
from clusters.kubernetes.kube import KubeApi, ListPath, Timeouts, api_client, sibling_client
from clusters.kubernetes.logs import LOG_THREADS, GangInspection, replica_state
from clusters.kubernetes.names import namespace_for, object_name
from clusters.kubernetes.status import (
    MANAGED_BY,
    MANAGED_BY_KEY,
    GangKind,
    GangObject,
    gang_object,
    gang_statuses,
    orphan_statuses,
    summarize_pods,
)
from clusters.kubernetes.threads import Lane
from clusters.kubernetes.tombstones import Tombstones
from clusters.kubernetes.vanished import VanishedPods
from clusters.kubernetes.watch import Health, Informer
from placement.model import ClusterName, ClusterState, JobId, TenantId

log = structlog.get_logger("gpufed.clusters.kubernetes")

R = TypeVar("R")
GANG_SELECTOR = f"{MANAGED_BY_KEY}={MANAGED_BY}"
# A `deletecollection` refused for want of the verb (403, a role from before gpufed asked for it) or
# not served for the kind (405): the gangs go one by one, and the collection is asked again after
# COLLECTION_RETRY_S (an administrator may have run `gpufed cluster join` again meanwhile).
COLLECTION_REFUSED = frozenset({403, 405})
COLLECTION_RETRY_S = 600.0


class KubernetesBackend:
    """A member cluster behind `clusters.api.ClusterBackend`; use as `async with` or `start`/`close`.

    Beyond the protocol: `evict` (preemption), `collect_garbage` (stale attempts) and `wait_synced`.
    """

    def __init__(self, config: KubernetesClusterConfig, *, client: Any = None) -> None:
        settings = config.settings
        self._config = config
        self._prices = config.price_table()
        self._reclaims = config.reclaim_table()
        self._log = log.bind(cluster=config.name)
        timeouts = Timeouts(settings.connect_timeout_s, settings.request_timeout_s)
        self._client = client or api_client(
            config.kubeconfig, config.context, pool_size=settings.api_threads + 8
        )
        self._api = KubeApi(self._client, timeouts)
        self._health = Health()
        self._calls = Lane(f"{config.name} api", settings.api_threads)
        self._nodes: Informer[NodeInfo] = self._informer(
            "nodes", self._api.list_nodes, lambda o: node_info(o, config.provider, self._prices)
        )
        self._jobs: Informer[GangObject] = self._informer(
            "jobs", self._api.list_jobs, lambda o: gang_object(o, GangKind.INDEXED_JOB), GANG_SELECTOR
        )
        self._vcjobs: Informer[GangObject] | None = None
        self._volcano: bool | None = None
        self._tombstones = Tombstones(settings.tombstone_ttl_s)
        self._writer = GangWriter(self._api, config, self._call, self._created)
        self._inspection = GangInspection(
            config.name,
            settings.namespace_prefix,
            self._client,
            timeouts,
            None
            if client is not None
            else functools.partial(sibling_client, self._client, pool_size=LOG_THREADS),
        )
        self._vanished = VanishedPods(settings.tombstone_ttl_s)
        self._pods: Informer[PodInfo] = self._informer(
            "pods", self._api.list_pods, _pod_info, observer=self._observe_pod, group=_gang_of
        )
        self._inventory_memo: tuple[tuple[int, int, bool], ClusterState] | None = None
        self._statuses_memo: tuple[tuple[int, int, int, int, int], tuple[GangStatus, ...]] | None = None
        self._warned_unpriced: set[tuple[str, str]] = set()
        self._started = False
        self._closed = False
        # When the cluster last refused a `deletecollection` (403: its account lacks the verb).
        self._collection_refused_s: float | None = None

    def _informer(
        self,
        name: str,
        path: ListPath,
        parse: Callable[[dict[str, Any]], Any],
        selector: str | None = None,
        observer: Callable[[str, dict[str, Any]], None] | None = None,
        group: Callable[[Any], str | None] | None = None,
    ) -> Informer[Any]:
        s = self._config.settings
        return Informer(
            name,
            self._api,
            path,
            parse,
            health=self._health,
            label_selector=selector,
            watch_timeout_s=s.watch_timeout_s,
            backoff_min_s=s.backoff_min_s,
            backoff_max_s=s.backoff_max_s,
            cluster=self._config.name,
            observer=observer,
            group=group,
        )

    # ---- life ------------------------------------------------------------------------------------

    async def __aenter__(self) -> KubernetesBackend:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the watches; discovery of Volcano is tried now and again later if the API is down."""
        if self._started:
            return
        self._started = True
        for informer in (self._nodes, self._pods, self._jobs):
            informer.start()
        try:
            await self._discover()
        except ClusterUnreachable as error:
            self._log.warning("discovery_deferred", error=str(error))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        informers = [i for i in (self._nodes, self._pods, self._jobs, self._vcjobs) if i is not None]
        for informer in informers:
            informer.stop()
        for informer in informers:
            if not await self._calls.run(informer.join, 10.0):
                self._log.error("watch_thread_stuck", watch=informer.name)
        # The calls on threads end before their connection pool is closed below; those waiting
        # for a slot are refused.
        await self._calls.close()
        self._inspection.close()
        self._api.close()
        self._log.debug("backend_closed")

    async def wait_synced(self, timeout_s: float | None = None) -> bool:
        """Until every watch has listed once (True), or the timeout passes (False)."""
        deadline = time.monotonic() + (
            self._config.settings.sync_timeout_s if timeout_s is None else timeout_s
        )
        while True:
            if self._volcano is None:
                with contextlib.suppress(ClusterUnreachable):
                    await self._discover()
            if self._volcano is not None and all(i.synced.is_set() for i in self._informers()):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)

    def _informers(self) -> list[Informer[Any]]:
        return [i for i in (self._nodes, self._pods, self._jobs, self._vcjobs) if i is not None]

    # ---- ClusterBackend --------------------------------------------------------------------------

    @property
    def name(self) -> ClusterName:
        return self._config.name

    @property
    def uses_volcano(self) -> bool | None:
        """Whether gangs go out as Volcano Jobs; None until discovery has answered."""
        return self._volcano

    @property
    def reachable(self) -> bool:
        return self._health.silent_for_s() <= self._config.settings.unreachable_after_s

    async def inventory(self) -> ClusterState:
        """From the watch cache; an API silent past the threshold gives `reachable=False`."""
        reachable = await self._inventory_reachable()
        return self._inventory_of(self._nodes.snapshot(), self._pods.snapshot(), reachable)

    async def statuses(self) -> Sequence[GangStatus]:
        await self._require_gang_cache()
        return self._statuses_of(self._nodes.snapshot(), self._pods.snapshot())

    async def observe(self) -> tuple[Sequence[GangStatus], ClusterState]:
        """The gangs' statuses and the inventory from one look at the node and pod caches.

        The watch threads change the caches at any moment, so two separate reads can straddle a
        pod's binding: the statuses call it unbound (the federation holds its GPUs back) while the
        inventory already counts it used. The cycle then saw those GPUs taken twice, and under
        burst-now sent a gang to a cloud while private GPUs stood free
        (tests/e2e/test_replay_agreement.py)."""
        await self._require_gang_cache()
        reachable = await self._inventory_reachable()
        nodes, pods = self._nodes.snapshot(), self._pods.snapshot()
        return self._statuses_of(nodes, pods), self._inventory_of(nodes, pods, reachable)

    async def _inventory_reachable(self) -> bool:
        reachable = self.reachable
        if reachable and not (self._nodes.synced.is_set() and self._pods.synced.is_set()):
            reachable = await self._wait(self._nodes, self._pods)
        return reachable

    def _inventory_of(
        self,
        nodes_seen: tuple[int, Sequence[NodeInfo]],
        pods_seen: tuple[int, Sequence[PodInfo]],
        reachable: bool,
    ) -> ClusterState:
        key = (nodes_seen[0], pods_seen[0], reachable)
        if self._inventory_memo is not None and self._inventory_memo[0] == key:
            return self._inventory_memo[1]
        nodes, pods = nodes_seen[1], pods_seen[1]
        for gpu_type, kind in unpriced(nodes, self._prices):
            if (gpu_type, kind) not in self._warned_unpriced:
                self._warned_unpriced.add((gpu_type, kind))
                self._log.warning("pool_unpriced", gpu_type=gpu_type, kind=kind.value)
        c = self._config
        state = cluster_state(
            name=c.name,
            provider=c.provider,
            region=c.region,
            object_store=c.object_store,
            prices=self._prices,
            nodes=nodes,
            pods=pods,
            reachable=reachable,
            reclaims=self._reclaims,
        )
        self._inventory_memo = (key, state)
        return state

    def _statuses_of(
        self, nodes_seen: tuple[int, Sequence[NodeInfo]], pods_seen: tuple[int, Sequence[PodInfo]]
    ) -> tuple[GangStatus, ...]:
        now_s = time.time()
        self._tombstones.expire(now_s)
        vc = self._vcjobs.version if self._vcjobs is not None else 0
        # Nodes count too: a running gang's shares are positions in the inventory's node lists.
        key = (self._jobs.version, vc, pods_seen[0], self._tombstones.version, nodes_seen[0])
        if self._statuses_memo is not None and self._statuses_memo[0] == key:
            return self._statuses_memo[1]
        gangs = self._gangs()
        positions = node_positions(pool_layout(nodes_seen[1], self._prices))
        summaries = summarize_pods(pods_seen[1])
        found = gang_statuses(gangs.values(), summaries, now_s=now_s, positions=positions)
        orphans = orphan_statuses(summaries, gangs.values(), self._tombstones.by_key())
        reported = gangs.keys() | {(o.job_id, o.attempt) for o in orphans}
        result = tuple(found) + tuple(orphans) + self._tombstones.statuses(exclude=reported)
        self._statuses_memo = (key, result)
        return result

    async def dispatch(self, gang: GangWorkload) -> None:
        await self._require_gang_cache()
        cache_key = f"{namespace_for(self._config.settings.namespace_prefix, gang.tenant)}/"
        cache_key += object_name(gang.job_id, gang.attempt)
        if any(i is not None and i.get(cache_key) is not None for i in (self._jobs, self._vcjobs)):
            return
        if not gang.replicas:
            raise GangRejected(f"gang {gang.name} has no replicas")
        _, nodes = self._nodes.snapshot()
        selection = manifests.select_nodes(nodes, gang.gpu_type, gang.kind)
        why = never_fits(nodes, gang.gpu_type, gang.kind, [r.gpu_count for r in gang.replicas])
        if selection is None or why is not None:
            message = f"gang {gang.name} cannot run on cluster {self.name}: " + (
                why or f"it has no {gang.kind.value} {gang.gpu_type} nodes"
            )
            self._log.info("gang_rejected", job_id=gang.job_id, attempt=gang.attempt, reason=message)
            raise GangRejected(message)
        volcano = await self._discover()
        self._tombstones.forget((gang.job_id, gang.attempt))
        await self._writer.create(gang, selection, volcano=volcano)
        self._log.info(
            "gang_dispatched",
            job_id=gang.job_id,
            attempt=gang.attempt,
            gpu_count=gang.gpu_count,
            volcano=volcano,
            name=object_name(gang.job_id, gang.attempt),
        )

    async def cancel(self, job_id: JobId, attempt: int, grace_period_s: float) -> None:
        """Delete the gang (a running one is then reported CANCELLED); deleting a missing one is fine."""
        await self._stop_gang(job_id, attempt, grace_period_s, evicted=None)

    async def cancel_many(self, keys: Collection[tuple[JobId, int]], grace_period_s: float) -> None:
        """Cancel these gangs as `cancel` cancels each, with one `deletecollection` a namespace and
        kind (and chunk: `GangWriter.delete_many`). The collector's ended gangs went with a call
        each, a third of a one-pod job's calls to its cluster (bench/scale.py). A gang the watch does
        not show yet (`cancel` asks the API for it) goes alone, and so does every gang while the
        cluster's account may not `deletecollection` (a cluster joined before gpufed asked for the
        verb answers 403: said once, then asked again after COLLECTION_RETRY_S)."""
        await self._require_gang_cache()
        gangs = self._gangs()
        collective = self._collection_refused_s is None or (
            time.monotonic() - self._collection_refused_s >= COLLECTION_RETRY_S
        )
        singles: list[tuple[JobId, int]] = []
        groups: dict[tuple[GangKind, str], list[GangObject]] = {}
        for key in dict.fromkeys(keys):
            gang = gangs.get(key)
            if gang is None or not collective:
                singles.append(key)
            else:
                groups.setdefault((gang.kind, gang.namespace), []).append(gang)
        for (kind, namespace), members in groups.items():
            for gang in members:
                self._stopping(gang, evicted=None)
            await asyncio.gather(
                *(self._writer.delete_secret(namespace, g.name) for g in members if g.may_have_secret)
            )
            try:
                await self._writer.delete_many(kind, namespace, [g.name for g in members], grace_period_s)
            except ClusterError as error:
                refused = None if error.__cause__ is None else status_of(error.__cause__)
                if refused is None or refused not in COLLECTION_REFUSED:
                    raise
                self._collection_refused_s = time.monotonic()
                collective = False
                self._log.warning(
                    "delete_collection_refused",
                    namespace=namespace,
                    status=refused,
                    fix="run `gpufed cluster join` again to grant deletecollection; gangs go one by one",
                )
                singles.extend(g.key for g in members)
                continue
            self._collection_refused_s = None
        await asyncio.gather(*(self.cancel(job_id, attempt, grace_period_s) for job_id, attempt in singles))

    async def release_secrets(self, tenant: TenantId, job_id: JobId, attempt: int) -> None:
        """Delete the gang's Secret (clusters.kubernetes.secret_objects) by name; 404 is fine."""
        namespace = namespace_for(self._config.settings.namespace_prefix, tenant)
        await self._writer.delete_secret(namespace, object_name(job_id, attempt))

    async def evict(self, job_id: JobId, attempt: int, grace_period_s: float, reason: str) -> None:
        """Stop the gang as an eviction (preemption): an Event on it says why, its status is EVICTED.

        EVICTED shows as soon as the deletion starts, while the pods still stop within the grace
        period; their GPUs stay used in `inventory()` until they are gone, so nothing is counted free
        early.
        """
        await self._stop_gang(job_id, attempt, grace_period_s, evicted=reason)

    def vanished(self, job_id: JobId, attempt: int) -> VanishedAttempt | None:
        """clusters.api.RemembersVanished: when the deleted pods of the attempt ran (see vanished.py)."""
        return self._vanished.get((job_id, attempt))

    def _observe_pod(self, kind: str, obj: dict[str, Any]) -> None:
        # On the thread that reads the pod watch (the shared reader's, every watch's), for every
        # event: neither may block.
        self._inspection.observe_pod(kind, obj)
        self._vanished.observe_pod(kind, obj)

    # ---- clusters.api.GangInspector (describe and logs; clusters.kubernetes.logs) ----------------

    async def replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        return await self._inspection.replicas(tenant, job_id, attempt)

    async def ended_replicas(
        self, tenant: TenantId, job_id: JobId, attempt: int, pods: int
    ) -> Sequence[ReplicaState] | None:
        """The pods of an attempt that ended, as the pod watch holds them: no call, where `replicas`
        lists them (a request, and its answer parsed, for every attempt the keeper keeps). Only when
        the watch answers and holds exactly the gang's `pods` pods, each finished: a finished pod
        does not change, so a list would show the same. Else None, and the caller lists them (a pod
        not finished or not seen yet, one gone, one replaced by a retry)."""
        if self._health.silent_for_s() > 0 or not self._pods.synced.is_set():
            return None
        namespace = namespace_for(self._config.settings.namespace_prefix, tenant)
        gang = object_name(job_id, attempt)
        found = [p.replica for p in self._pods.grouped(f"{namespace}/{gang}")]
        states = [r for r in found if r is not None]
        if len(found) != pods or len(states) != pods:
            return None
        return await self._inspection.with_killed(namespace, gang, states)

    async def events(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[GangEvent]:
        return await self._inspection.events(tenant, job_id, attempt)

    async def killed_replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        """clusters.api.KilledPodLogs: the pods killed while they ran, with their logs read."""
        return await self._inspection.killed_replicas(tenant, job_id, attempt)

    def pod_log(self, tenant: TenantId, replica: ReplicaState, options: LogOptions) -> AsyncIterator[bytes]:
        return self._inspection.pod_log(tenant, replica, options)

    # ---- beyond the protocol ---------------------------------------------------------------------

    async def collect_garbage(
        self, live: Collection[tuple[JobId, int]], grace_period_s: float | None = None
    ) -> list[tuple[JobId, int]]:
        """Delete every gpufed gang (and orphaned Service) whose (job id, attempt) is not in `live`,
        and the pods of such attempts that outlived their gang object."""
        await self._require_gang_cache()
        grace_s = self._config.settings.gc_grace_period_s if grace_period_s is None else grace_period_s
        live_keys = set(live)
        gangs = self._gangs()
        stale = [g for key, g in gangs.items() if key not in live_keys]
        await asyncio.gather(*(self._writer.delete(g, grace_s) for g in stale))
        _, pods = self._pods.snapshot()
        left = (
            {
                (JobId(p.job_id), p.attempt)
                for p in pods
                if p.job_id is not None and p.attempt is not None and p.live
            }
            - live_keys
            - gangs.keys()
        )
        for job_id, attempt in sorted(left):
            await self._remove_leftovers(job_id, attempt, grace_s)
        orphans = await self._writer.orphan_services(live_keys, {g.name for g in self._gangs().values()})
        self._tombstones.retain(live_keys)
        collected = sorted({g.key for g in stale} | set(orphans) | left)
        if collected:
            self._log.info("gangs_collected", count=len(collected), gangs=[f"{j}/{a}" for j, a in collected])
        return collected

    def watch_counts(self) -> dict[str, tuple[int, int, int]]:
        """Per watch: lists made, watch requests made, events applied (for tests and benchmarks)."""
        return {i.name: (i.lists, i.watches, i.events) for i in self._informers()}

    # ---- internals -------------------------------------------------------------------------------

    def _created(self, kind: GangKind, obj: dict[str, Any]) -> None:
        informer = self._vcjobs if kind is GangKind.VOLCANO_JOB else self._jobs
        if informer is not None:
            informer.remember(obj)

    def _gangs(self) -> dict[tuple[JobId, int], GangObject]:
        gangs = {g.key: g for g in self._jobs.snapshot()[1]}
        if self._vcjobs is not None:
            gangs.update((g.key, g) for g in self._vcjobs.snapshot()[1])
        return gangs

    async def _stop_gang(
        self, job_id: JobId, attempt: int, grace_period_s: float, *, evicted: str | None
    ) -> None:
        await self._require_gang_cache()
        key = (job_id, attempt)
        gang = self._gangs().get(key)
        if gang is None:
            # Created so recently that the watch has not shown it yet, or really gone: ask the API.
            gang = await self._writer.find(job_id, attempt, volcano=bool(self._volcano))
        if gang is None:
            if evicted is None:
                # Cancelling a gang that is gone is the collector's clean-up: nothing needs its record.
                self._tombstones.forget(key)
            # An eviction sent again (a new leader does) must not erase how the gang ended.
            await self._remove_leftovers(job_id, attempt, grace_period_s)
            return
        if self._stopping(gang, evicted=evicted) and evicted is not None:
            await self._writer.mark_evicted(gang, evicted)
        await self._writer.delete(gang, grace_period_s)
        self._log.info(
            "gang_evicted" if evicted is not None else "gang_cancelled",
            job_id=job_id,
            attempt=attempt,
            grace_period_s=grace_period_s,
            reason=evicted,
        )

    def _stopping(self, gang: GangObject, *, evicted: str | None) -> bool:
        """Remember how a gang about to be deleted ended (a tombstone while it had not ended, as
        its status then says CANCELLED or EVICTED); False for an eviction sent again, whose first
        reason stands, as on every backend (the delete is still sent: the API server keeps the
        shorter of two grace periods)."""
        again = evicted is not None and gang.evicted_reason is not None and gang.deleting_since_s is not None
        if again:
            return False
        if gang.outcome is None:
            self._tombstones.add(gang.key, evicted=evicted, at_s=time.time())
        else:
            self._tombstones.forget(gang.key)
        return True

    async def _remove_leftovers(self, job_id: JobId, attempt: int, grace_period_s: float) -> None:
        """Delete what an attempt left behind its deleted gang object: pods (orphaned by
        `--cascade=orphan`, or still stopping), and their Service and PodGroup of the same name."""
        _, pods = self._pods.snapshot()
        name = object_name(job_id, attempt)
        left = [p for p in pods if (p.job_id, p.attempt) == (job_id, attempt) or p.gang == name]
        if not left:
            return
        await self._writer.delete_leftovers(
            [(p.namespace, p.name) for p in left], name, grace_period_s, volcano=bool(self._volcano)
        )
        self._log.info(
            "gang_leftovers_deleted",
            job_id=job_id,
            attempt=attempt,
            pods=len(left),
            grace_period_s=grace_period_s,
        )

    async def _require_gang_cache(self) -> None:
        """Raise ClusterUnreachable unless the API answers and the gang watches have listed."""
        if self._closed:
            raise ClusterUnreachable(f"cluster {self.name}: the backend is closed")
        if not self.reachable:
            raise ClusterUnreachable(
                f"cluster {self.name}: the API has not answered for {self._health.silent_for_s():.0f} s"
            )
        await self._discover()
        assert self._vcjobs is not None or self._volcano is False
        waiting = [i for i in self._informers() if not i.synced.is_set()]
        if waiting and not await self._wait(*waiting):
            raise ClusterUnreachable(
                f"cluster {self.name}: watches not listed yet: {', '.join(i.name for i in waiting)}"
            )

    async def _wait(self, *informers: Informer[Any]) -> bool:
        deadline = time.monotonic() + self._config.settings.sync_timeout_s
        while not all(i.synced.is_set() for i in informers):
            if time.monotonic() >= deadline or not self.reachable:
                return False
            await asyncio.sleep(0.02)
        return True

    async def _discover(self) -> bool:
        """Whether the API serves Volcano's jobs; asked once, then the vcjob watch starts if it does."""
        if self._volcano is not None:
            return self._volcano
        groups = await self._call("discover API groups", self._api.api_groups)
        if self._volcano is None:
            served = manifests.VOLCANO_GROUP in (groups or ())
            self._volcano = served and self._config.settings.use_volcano is not False
            if self._volcano:
                self._vcjobs = self._informer(
                    "vcjobs",
                    self._api.list_volcano_jobs,
                    lambda o: gang_object(o, GangKind.VOLCANO_JOB),
                    GANG_SELECTOR,
                )
                self._vcjobs.start()
            self._log.info("api_discovered", volcano=self._volcano)
        return self._volcano

    async def _call(
        self,
        doing: str,
        fn: Callable[..., R],
        *args: Any,
        ok: frozenset[int] = frozenset(),
        dispatching: bool = False,
    ) -> R | None:
        """Run one blocking API call on the shared pool, within this cluster's lane; an error whose
        HTTP status is in `ok` gives None."""
        try:
            result = await self._calls.run(fn, *args)
        except Exception as error:
            status = status_of(error)
            if status is not None and status in ok:
                self._health.answered()
                return None
            if is_no_answer(error):
                self._health.failed()
            else:
                self._health.answered()
            raise translate(error, self.name, doing, dispatching=dispatching) from error
        self._health.answered()
        return result


def _pod_info(pod: dict[str, Any]) -> PodInfo:
    """A pod as the backend's cache keeps it; a finished gang pod with what `describe` shows of it
    (once or twice in a pod's life: finished is its last phase)."""
    info = pod_info(pod)
    if info.gang is not None and info.phase in FINISHED_PHASES:
        return dataclasses.replace(info, replica=replica_state(pod))
    return info


def _gang_of(pod: PodInfo) -> str | None:
    """Where the pod cache files a gang's pod: its namespace and gang name."""
    return None if pod.gang is None else f"{pod.namespace}/{pod.gang}"
