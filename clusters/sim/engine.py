"""One simulated cluster without its HTTP front: the store, the nodes and the control loop.

Controllers never call each other. Each one observes committed changes (synchronously, to note what
needs work) and does the work in `sync()`; the engine runs the controllers in rounds until none has
anything left, then sleeps until the next timer or the next change. Because observing is separate
from acting, a controller's writes are seen by every other controller in the next round, the same
way informers and work queues decouple controllers in a real control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

import structlog

from clusters.sim.admission import Admission
from clusters.sim.capacity import GPU
from clusters.sim.clock import Clock, ScaledClock, rfc3339
from clusters.sim.config import SimClusterConfig, SimPoolConfig
from clusters.sim.events import EventRecorder
from clusters.sim.jobs_batch import BatchJobController
from clusters.sim.jobs_volcano import VolcanoJobController
from clusters.sim.kubelet import Kubelet
from clusters.sim.lifecycle import Lifecycle
from clusters.sim.logs import LogBook
from clusters.sim.namespaces import NamespaceController
from clusters.sim.persist import Snapshot
from clusters.sim.podgc import PodGC
from clusters.sim.resources import EVENTS, NAMESPACES, NODES, PODS, QUEUES
from clusters.sim.scheduler import Scheduler
from clusters.sim.selectors import LabelSelector, Op, Requirement
from clusters.sim.store import Change, Store
from clusters.sim.timers import Timers
from placement.model import CapacityKind

Obj = dict[str, Any]
log = structlog.get_logger("gpufed.clusters.sim")

POOL_LABEL = "gpufed.io/pool"
CAPACITY_LABEL = "gpufed.io/capacity-type"
_CAPACITY_VALUES = {
    CapacityKind.SPOT: "spot",
    CapacityKind.ON_DEMAND: "on-demand",
    CapacityKind.PRIVATE: "private",
}
# A runaway feedback between controllers would otherwise spin the loop forever.
_MAX_ROUNDS = 10_000


class Controller(Protocol):
    def observe(self, change: Change) -> None: ...

    def sync(self) -> bool: ...


class Engine:
    def __init__(
        self, config: SimClusterConfig, clock: Clock | None = None, restored: Snapshot | None = None
    ) -> None:
        """`restored`: a snapshot of this cluster (`clusters.sim.persist`) to go on from, instead of
        a new cluster's namespaces and nodes."""
        self.config = config
        wall0_s = None if restored is None else restored.sim_wall_now_s(config.time_scale)
        self.clock: Clock = clock or ScaledClock(config.time_scale, wall0_s)
        self.store = Store(self.clock.wall_s, config.history_limit)
        self.timers = Timers(self.clock)
        self.recorder = EventRecorder(self.store, self.clock, config.event_limit, host=config.name)
        self.admission = Admission(self.store)
        self.lifecycle = Lifecycle(self.store, self.clock, self.timers, self.recorder, config.termination_s)
        self.namespaces = NamespaceController(self.store, self.clock, self.lifecycle)
        self.scheduler = Scheduler(self.store, self.clock, self.recorder)
        self.kubelet = Kubelet(
            self.store,
            self.clock,
            self.timers,
            self.recorder,
            default_duration_s=config.default_duration_s,
            container_start_s=config.container_start_s,
            restart_backoff_s=config.restart_backoff_s,
            local_output=(lambda uid, c, line: self.logs.append(uid, c, line)) if config.local_exec else None,
            local_drained=(lambda uid: self.logs.drained(uid)) if config.local_exec else None,
        )
        self.logs = LogBook(
            self.clock,
            interval_s=config.log_interval_s,
            cap_bytes=config.log_cap_bytes,
            processes=config.local_exec,
        )
        self.podgc = PodGC(self.store, self.clock, self.lifecycle, config.terminated_pod_gc_threshold)
        self.batch_jobs = BatchJobController(
            self.store, self.clock, self.timers, self.recorder, self.admission, self.lifecycle
        )
        self.volcano_jobs = VolcanoJobController(
            self.store, self.clock, self.recorder, self.admission, self.lifecycle
        )
        # Order matters only for latency: controllers that create pods run before the scheduler,
        # and the scheduler before the kubelet, so a new Job's pods start in one pass.
        self._controllers: tuple[Controller, ...] = (
            self.lifecycle,
            self.namespaces,
            self.batch_jobs,
            self.volcano_jobs,
            self.scheduler,
            self.kubelet,
            self.podgc,
            self.logs,
        )
        self._wake = asyncio.Event()
        self.store.add_listener(self._observe)
        if restored is not None:
            self._restore(restored)
        else:
            self._create()
        self.reconcile()

    def _restore(self, snapshot: Snapshot) -> None:
        self.store.restore(snapshot.objects, snapshot.resource_version)
        pods = [obj for rt, obj in snapshot.objects if rt is PODS]
        self.kubelet.resume(pods)
        self.lifecycle.resume(pods)
        events = [obj for rt, obj in snapshot.objects if rt is EVENTS]
        events.sort(key=lambda e: int(e["metadata"].get("resourceVersion") or 0))
        self.recorder.adopt([(e["metadata"].get("namespace", ""), e["metadata"]["name"]) for e in events])
        # The snapshot's nodes win (a pool resized while the cluster ran keeps its size); a pool the
        # config added since gets its nodes.
        for pool in self.config.pools:
            if not self.pool_nodes(pool.name):
                self.add_nodes(pool.name, pool.node_count)
        log.info(
            "sim_cluster_restored",
            cluster=self.config.name,
            objects=len(snapshot.objects),
            pods=len(pods),
            resource_version=snapshot.resource_version,
        )

    def _create(self) -> None:
        """A new cluster: its namespaces, Volcano's default queue, and its pools' nodes."""
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.store.create(
                NAMESPACES, self.admission.admit_create(NAMESPACES, {"metadata": {"name": name}}, None)
            )
        if self.config.volcano:
            # A Volcano installation comes with its `default` queue.
            queue = {"metadata": {"name": "default"}}
            self.store.create(QUEUES, self.admission.admit_create(QUEUES, queue, None))
        for pool in self.config.pools:
            self.add_nodes(pool.name, pool.node_count)

    def _observe(self, change: Change) -> None:
        for controller in self._controllers:
            controller.observe(change)
        self._wake.set()

    def reconcile(self) -> int:
        """Run timers and controllers until nothing is left to do; returns the rounds taken."""
        for rounds in range(1, _MAX_ROUNDS + 1):
            if not self._round():
                return rounds
        log.warning("sim_reconcile_capped", cluster=self.config.name, rounds=_MAX_ROUNDS)
        return _MAX_ROUNDS

    def _round(self) -> bool:
        """Due timers, then each controller's sync once; whether any of them did something."""
        worked = self.timers.run_due()
        for controller in self._controllers:
            worked = controller.sync() or worked
        return worked

    async def _reconcile_yielding(self) -> int:
        """`reconcile`, handing the event loop on between rounds. Every cluster of a simulator
        process shares its loop, and a burst of new gangs took one cluster's reconcile 3 or 4 rounds
        and up to 630 ms (bench/scale.py, 100 clusters): every other cluster's API calls waited
        behind it, where a real API server answers while its controllers work."""
        for rounds in range(1, _MAX_ROUNDS + 1):
            if not self._round():
                return rounds
            await asyncio.sleep(0)
        log.warning("sim_reconcile_capped", cluster=self.config.name, rounds=_MAX_ROUNDS)
        return _MAX_ROUNDS

    async def run(self) -> None:
        """The control loop: reconcile, then sleep until a change or the next timer."""
        while True:
            self._wake.clear()
            try:
                await self._reconcile_yielding()
            except Exception:
                # A bug in one controller must not freeze the whole cluster: log it and go on, as a
                # real controller manager's work queue retries a failed key.
                log.exception("sim_reconcile_failed", cluster=self.config.name)
            delay = self.timers.next_delay_s()
            if self._wake.is_set():
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    # -- nodes --------------------------------------------------------------------------------

    def pool(self, name: str) -> SimPoolConfig:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool named {name!r}")

    @property
    def pools(self) -> tuple[SimPoolConfig, ...]:
        return self.config.pools

    def pool_nodes(self, pool: str) -> list[Obj]:
        selector = LabelSelector((Requirement(POOL_LABEL, Op.EQ, frozenset({pool})),))
        return self.store.list(NODES, None, selector)

    def add_nodes(self, pool_name: str, count: int) -> list[str]:
        pool = self.pool(pool_name)
        taken = {n["metadata"]["name"] for n in self.pool_nodes(pool_name)}
        names: list[str] = []
        index = 0
        while len(names) < count:
            name = f"{self.config.name}-{pool.name}-{index}"
            index += 1
            if name in taken or self.store.get(NODES, "", name) is not None:
                continue
            self.store.create(NODES, self._node(pool, name, index - 1))
            names.append(name)
        return names

    def _node(self, pool: SimPoolConfig, name: str, index: int) -> Obj:
        gpus = str(pool.gpus_per_node)
        resources = {
            "cpu": str(pool.cpu_cores),
            "memory": f"{pool.memory_gib}Gi",
            "pods": str(pool.max_pods),
            "ephemeral-storage": "1000Gi",
            GPU: gpus,
        }
        stamp = rfc3339(self.clock.wall_s())
        conditions = [
            {
                "type": kind,
                "status": "False",
                "reason": f"KubeletHasSufficient{short}",
                "message": f"kubelet has sufficient {short.lower()} available",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }
            for kind, short in (
                ("MemoryPressure", "Memory"),
                ("DiskPressure", "Disk"),
                ("PIDPressure", "PID"),
            )
        ]
        conditions.append(
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }
        )
        pool_no = [p.name for p in self.pools].index(pool.name)
        return {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node.kubernetes.io/instance-type": f"sim-{pool.gpu_type.lower()}-{gpus}",
                    POOL_LABEL: pool.name,
                    CAPACITY_LABEL: _CAPACITY_VALUES[pool.kind],
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": pool.gpu_product,
                    "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
                    "nvidia.com/gpu.count": gpus,
                },
            },
            "spec": {"providerID": f"sim://{self.config.name}/{name}"},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "conditions": conditions,
                "addresses": [
                    {"type": "InternalIP", "address": f"10.{pool_no % 250}.{index // 250}.{index % 250 + 1}"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "kubeletVersion": self.config.kubernetes_version,
                    "kubeProxyVersion": self.config.kubernetes_version,
                    "containerRuntimeVersion": "containerd://1.7.20",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "osImage": "gpufed simulated node",
                    "kernelVersion": "6.1.0-sim",
                    "machineID": name,
                    "systemUUID": name,
                    "bootID": name,
                },
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        }
