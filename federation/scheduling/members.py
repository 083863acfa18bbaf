"""The member clusters this server drives, built from their stored records.

Federation sees every cluster only through `clusters.api.ClusterBackend`; this module picks the
backend for each record and turns a cluster that does not answer into a value (unreachable), never
an exception that would stop a scheduling cycle.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from clusters.api import ClusterBackend, ClusterError, GangStatus
from clusters.kubernetes.config import GpuPrice, KubernetesClusterConfig, KubernetesSettings
from clusters.memory import InMemoryCluster
from federation.store.intervals import ClusterSite
from federation.store.records import ClusterRecord
from placement.model import ClusterName, ClusterState, JobId

if TYPE_CHECKING:
    from clusters.kubernetes.backend import KubernetesBackend

log = structlog.get_logger("gpufed.members")

GangKey = tuple[JobId, int]


def _unreachable_state(record: ClusterRecord) -> ClusterState:
    return ClusterState(
        name=record.name,
        provider=record.provider,
        region=record.region,
        pools=tuple(p.with_free(()) for p in record.pools),
        reachable=False,
        object_store=record.object_store,
    )


# The longest a Kubernetes backend waits, silent, before it reports its cluster unreachable. The
# federation's grace period (ClusterRecord.unreachable_grace_s) starts counting only then, so a
# short grace shortens this too: detection takes at most a quarter of the grace on top of it.
MAX_SILENCE_BEFORE_UNREACHABLE_S = 30.0
MIN_SILENCE_BEFORE_UNREACHABLE_S = 1.0


def _kubernetes_backends(backends: Iterable[ClusterBackend]) -> list[KubernetesBackend]:
    """The Kubernetes backends among `backends`. The backend's module (and with it the Kubernetes
    client, half a second of a restart's CPU) is imported only by `build` for a Kubernetes member:
    while it is not loaded, no backend can be one."""
    module = sys.modules.get("clusters.kubernetes.backend")
    if module is None:
        return []
    return [b for b in backends if isinstance(b, module.KubernetesBackend)]


def kubernetes_config(record: ClusterRecord) -> KubernetesClusterConfig:
    """The backend's view of a cluster record: where its API is and what its GPUs cost."""
    if record.kubeconfig is None:
        raise ValueError(f"cluster {record.name}: a kubernetes cluster needs a kubeconfig")
    silence_s = min(
        MAX_SILENCE_BEFORE_UNREACHABLE_S,
        max(MIN_SILENCE_BEFORE_UNREACHABLE_S, record.unreachable_grace_s / 4),
    )
    return KubernetesClusterConfig(
        name=record.name,
        provider=record.provider,
        region=record.region,
        prices=tuple(
            GpuPrice(p.gpu_type, p.kind, p.usd_per_gpu_hour, p.reclaims_per_node_hour) for p in record.pools
        ),
        kubeconfig=Path(record.kubeconfig),
        context=record.context,
        object_store=record.object_store,
        scalable=record.scalable,
        # True means "where the cluster serves it"; False keeps to Indexed Jobs regardless.
        settings=KubernetesSettings(
            use_volcano=None if record.volcano else False, unreachable_after_s=silence_s
        ),
    )


class MemberClusters:
    def __init__(
        self, records: Sequence[ClusterRecord], backends: Mapping[ClusterName, ClusterBackend]
    ) -> None:
        self._records = {r.name: r for r in records}
        self._backends = dict(backends)
        # Gangs whose cluster refused an eviction order until its deadline, and until when no new
        # order may name them (`hold_off_orders`). Per leader: a new one may order once more, and
        # withdraws again at that order's deadline.
        self._held_off: dict[JobId, float] = {}
        # Each cluster's gangs by key, with the sequence its backend returned: a backend that
        # memoises its statuses (the Kubernetes one, until a watch moves) returns the very same
        # sequence, and the dict is not built again. The reconciler's tick and the scheduling cycle
        # each read every cluster's, every loop turn (2.4 % of the server's CPU at 100 clusters).
        self._by_key: dict[ClusterName, tuple[Sequence[GangStatus], dict[GangKey, GangStatus]]] = {}

    def hold_off_orders(self, job_id: JobId, until_s: float) -> None:
        """The reconciler withdrew an order its cluster kept refusing: no new one for this job until then."""
        self._held_off[job_id] = max(until_s, self._held_off.get(job_id, until_s))

    def held_off(self, now_s: float) -> frozenset[JobId]:
        """Jobs no preemption or move may be ordered for now (their cluster refused the last one)."""
        for job_id in [j for j, until in self._held_off.items() if until <= now_s]:
            del self._held_off[job_id]
        return frozenset(self._held_off)

    @classmethod
    def build(
        cls,
        records: Sequence[ClusterRecord],
        *,
        state_dir: Path | None,
        clock: Callable[[], float] = time.time,
    ) -> MemberClusters:
        backends: dict[ClusterName, ClusterBackend] = {}
        for record in records:
            if record.backend == "kubernetes":
                from clusters.kubernetes.backend import KubernetesBackend  # see _kubernetes_backends

                backends[record.name] = KubernetesBackend(kubernetes_config(record))
                continue
            if record.backend != "memory":
                # "sim" never reaches a server: `gpufed up` starts the simulator and stores the
                # cluster as "kubernetes"; anything else is a record from a newer or broken writer.
                raise ValueError(
                    f"cluster {record.name}: backend {record.backend!r} cannot be served; "
                    "use kubernetes (with a kubeconfig) or memory"
                )
            journal = None
            if state_dir is not None:
                (state_dir / "clusters").mkdir(parents=True, exist_ok=True)
                journal = state_dir / "clusters" / f"{record.name}.journal"
            backends[record.name] = InMemoryCluster(
                record.name,
                provider=record.provider,
                region=record.region,
                pools=record.pools,
                object_store=record.object_store,
                journal_path=journal,
                clock=clock,
            )
        return cls(records, backends)

    async def start(self, sync_timeout_s: float = 5.0) -> None:
        """Start every backend's watches and wait, briefly, for their first lists.

        A cluster that does not answer in time is not an error: the first cycles see it
        unreachable, and it joins when its API answers.
        """
        kube = _kubernetes_backends(self._backends.values())
        await asyncio.gather(*(b.start() for b in kube))
        synced = await asyncio.gather(*(b.wait_synced(sync_timeout_s) for b in kube))
        for backend, ok in zip(kube, synced, strict=True):
            if not ok:
                log.warning("cluster_not_synced", cluster=backend.name, waited_s=sync_timeout_s)

    async def add(self, record: ClusterRecord, state_dir: Path | None = None) -> None:
        """A cluster registered while the server runs (`gpufed cluster join`): driven from now on,
        replacing the backend of an earlier record of that name (a new kubeconfig or token)."""
        old = self._backends.get(record.name)
        fresh = MemberClusters.build([record], state_dir=state_dir)
        if old is not None:
            await MemberClusters((), {record.name: old}).close()
        self._records[record.name] = record
        self._backends[record.name] = fresh._backends[record.name]
        await fresh.start()

    async def close(self, timeout_s: float = 15.0) -> None:
        """Stop every backend's watches; bounded, because a shutdown must not hang on one cluster."""
        kube = {asyncio.create_task(b.close()): b.name for b in _kubernetes_backends(self._backends.values())}
        if not kube:
            return
        _, pending = await asyncio.wait(kube, timeout=timeout_s)
        for task in pending:
            log.error("cluster_close_stuck", cluster=kube[task], waited_s=timeout_s)
            task.cancel()

    @property
    def names(self) -> list[ClusterName]:
        return sorted(self._backends)

    def get(self, name: ClusterName) -> ClusterBackend | None:
        return self._backends.get(name)

    def site(self, name: ClusterName) -> ClusterSite:
        """Provider and region for the ledger; a cluster removed since keeps a recognisable entry."""
        record = self._records.get(name)
        if record is None:
            return ClusterSite(provider="unknown", region="unknown")
        return ClusterSite(provider=record.provider.value, region=record.region)

    def unreachable_grace_s(self, name: ClusterName) -> float:
        record = self._records.get(name)
        return 120.0 if record is None else record.unreachable_grace_s

    async def inventories(self) -> list[ClusterState]:
        return [await self._inventory_of(name) for name in self.names]

    async def _inventory_of(self, name: ClusterName) -> ClusterState:
        try:
            return self._capable(self._backends[name], await self._backends[name].inventory())
        except ClusterError as error:
            log.warning("cluster_inventory_failed", cluster=name, error=str(error))
            return _unreachable_state(self._records[name])

    @staticmethod
    def _capable(backend: ClusterBackend, state: ClusterState) -> ClusterState:
        """The state with what the cluster can run: a gang whose replicas differ needs Volcano, which
        a Kubernetes member has only once discovery found it served (and the config did not turn it
        off); until then such gangs wait rather than go there to be refused (issue 32). The in-memory
        backend runs any gang."""
        for kube in _kubernetes_backends((backend,)):
            mixed = kube.uses_volcano is True
            if state.runs_mixed_gangs != mixed:
                return replace(state, runs_mixed_gangs=mixed)
        return state

    async def statuses(self) -> dict[ClusterName, dict[GangKey, GangStatus] | None]:
        """Each cluster's gangs by (job, attempt); None for a cluster that did not answer."""
        return {name: await self._statuses_of(name) for name in self.names}

    async def observe(
        self,
    ) -> tuple[dict[ClusterName, dict[GangKey, GangStatus] | None], list[ClusterState]]:
        """`statuses()` and `inventories()`, each cluster's pair as of one instant (`ClusterBackend.observe`):
        the scheduler holds back a live gang's GPUs that the inventory does not show, and two reads
        apart let a pod bound between them count twice. A cluster that does not answer the pair is
        read as before, each half on its own, so its inventory still says how it stands."""
        statuses: dict[ClusterName, dict[GangKey, GangStatus] | None] = {}
        states: list[ClusterState] = []
        for name in self.names:
            backend = self._backends[name]
            try:
                gangs, state = await backend.observe()
            except ClusterError:
                statuses[name] = await self._statuses_of(name)
                states.append(await self._inventory_of(name))
                continue
            statuses[name] = self._keyed(name, gangs)
            states.append(self._capable(backend, state))
        return statuses, states

    async def _statuses_of(self, name: ClusterName) -> dict[GangKey, GangStatus] | None:
        try:
            gangs = await self._backends[name].statuses()
        except ClusterError as error:
            log.warning("cluster_status_failed", cluster=name, error=str(error))
            return None
        return self._keyed(name, gangs)

    def _keyed(self, name: ClusterName, gangs: Sequence[GangStatus]) -> dict[GangKey, GangStatus]:
        known = self._by_key.get(name)
        if known is None or known[0] is not gangs:
            known = self._by_key[name] = (gangs, {(s.job_id, s.attempt): s for s in gangs})
        return known[1]
