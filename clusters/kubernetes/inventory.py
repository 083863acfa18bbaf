"""Nodes and pods as the inventory needs them, and the `ClusterState` built from them.

The watch threads keep every node and pod of the cluster; holding the full objects would cost memory
and time on each inventory, so each is reduced once, when its event arrives, to the few fields that
count: a node's pool, GPU type, capacity kind, GPUs and whether gpufed may schedule there; a pod's
node, GPU request, phase and gang. `cluster_state` is then a pass over small records.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clusters.api import ReplicaState
from placement.gpu_types import GpuRegistry, node_type
from placement.model import CapacityKind, ClusterName, ClusterState, GpuType, NodePool, Provider

Json = dict[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
# Where else clusters name their GPUs: GKE's accelerator label (`nvidia-tesla-a100`,
# `nvidia-h100-80gb`) and Karpenter's on EKS (`a100`). They tell a variant apart where GPU feature
# discovery's product does not, and name the GPU of a node without GFD (GKE's own driver install
# runs none): such a node is counted by its cloud label, and gpufed's pods select it by that label
# (`NodeInfo.product_label`, `manifests.select_nodes`).
CLOUD_PRODUCT_LABELS = ("cloud.google.com/gke-accelerator", "karpenter.k8s.aws/instance-gpu-name")
# Memory per GPU in MiB, which tells variants apart where the name does not (Karpenter's `a100`).
MEMORY_LABELS = ("nvidia.com/gpu.memory", "karpenter.k8s.aws/instance-gpu-memory")
REGISTRY = GpuRegistry()
GANG_LABEL = "gpufed.io/gang"
# The exact ids are annotations; labels carry them too, shortened where they had to be.
JOB_ID_KEY = "gpufed.io/job-id"
ATTEMPT_KEY = "gpufed.io/attempt"
POOL_LABELS = (
    "gpufed.io/pool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "agentpool",
)
SPOT_LABELS = {
    "gpufed.io/capacity-type": "spot",
    "cloud.google.com/gke-spot": "true",
    "eks.amazonaws.com/capacityType": "SPOT",
    "kubernetes.azure.com/scalesetpriority": "spot",
}
# gpufed's pods tolerate these taint keys, whatever the effect: the GPU operator's, and the one AKS
# puts on every spot node (without it, AKS spot pools would never show in the inventory).
AKS_SPOT_TAINT = "kubernetes.azure.com/scalesetpriority"
TOLERATED_TAINTS = frozenset({GPU_RESOURCE, AKS_SPOT_TAINT})
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})

# Longest names first, so that "A100" is not read as "A10" nor "L40S" as "L4".
KNOWN_GPUS = (
    "GH200", "H200", "H100", "H800", "B200", "B100", "GB200", "A100", "A800", "A10G", "A10", "A30",
    "A40", "L40S", "L40", "L4", "V100", "T4", "P100", "P4", "K80", "MI300X", "MI250X",
)  # fmt: skip
_TOKEN = re.compile(r"[-_ ]+")


def gpu_type_of(product: str, memory_mib: int | None = None) -> GpuType:
    """The registry's type (`placement.gpu_types`) a product label names (`NVIDIA-A100-SXM4-80GB` is
    `A100-80GB`); a product the registry does not know, by the model word in it."""
    identified = REGISTRY.identify(product, memory_mib)
    if identified is not None:
        return identified
    tokens = [t.upper() for t in _TOKEN.split(product) if t]
    for token in tokens:
        if token in KNOWN_GPUS:
            return GpuType(token)
    for known in KNOWN_GPUS:
        if any(token.startswith(known) for token in tokens):
            return GpuType(known)
    model = [t for t in tokens if t not in {"NVIDIA", "TESLA", "GEFORCE", "AMD"}]
    return GpuType(model[0] if model else product)


def parse_time_s(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _quantity(value: object) -> int:
    """GPU counts are whole numbers; anything else (a typo, a fraction) counts as none."""
    try:
        return int(str(value))
    except ValueError:
        return 0


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    pool: str
    pool_label: str | None
    product: str
    gpu_type: GpuType
    kind: CapacityKind
    allocatable_gpus: int
    # The label that marks the node as spot capacity, if any (key, value).
    spot_label: tuple[str, str] | None
    # Ready, not cordoned, and no NoSchedule/NoExecute taint that gpufed's pods do not tolerate.
    schedulable: bool
    # The label `product` was read from: GFD's, or a cloud's on a node without GFD.
    product_label: str = PRODUCT_LABEL


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    node_name: str | None
    gpus: int
    phase: str
    # The gang the pod belongs to (its `gpufed.io/gang` label), if gpufed made it.
    gang: str | None
    started_at_s: float | None
    # Why it failed, for a gang's status message ("DeadlineExceeded", "exit code 3", ...).
    failure: str
    # The job and attempt the pod ran for, so that pods which outlived their gang object (deleted
    # with `--cascade=orphan`, say) can still be told apart and removed.
    job_id: str | None = None
    attempt: int | None = None
    # When its last container ended (finishedAt), for a finished pod: the moment its GPUs were
    # free, which the federation charges to rather than to when it noticed.
    finished_at_s: float | None = None
    # A finished gang pod as `describe` and the keeper show it (`logs.replica_state`), set by the
    # backend's pod watch, so that the keeper reads an ended attempt's pods without a list call.
    replica: ReplicaState | None = None

    @property
    def holds_gpus(self) -> bool:
        return self.node_name is not None and self.phase not in FINISHED_PHASES

    @property
    def live(self) -> bool:
        """Not finished: it may run, or still runs while it stops (a deleted pod until it is gone)."""
        return self.phase not in FINISHED_PHASES


def _schedulable(node: Json) -> bool:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    for taint in spec.get("taints") or ():
        if taint.get("effect") in {"NoSchedule", "NoExecute"} and taint.get("key") not in TOLERATED_TAINTS:
            return False
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_info(
    node: Json, provider: Provider, priced: Mapping[tuple[GpuType, CapacityKind], object] | None = None
) -> NodeInfo | None:
    """The node as inventory sees it; None for a node without GPUs.

    Its GPU type is the registry's variant where the cluster's config prices that variant, else the
    family (a pool configured as `gpuType: A100` takes every A100 node, whichever its memory); with
    no price list, the family, as before variants existed.
    """
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    allocatable = _quantity(((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, 0))
    product_label = PRODUCT_LABEL
    product = labels.get(PRODUCT_LABEL)
    if not product:
        # No GPU feature discovery: the cloud's label, if the registry knows what it names.
        product_label = next((key for key in CLOUD_PRODUCT_LABELS if labels.get(key)), "")
        product = labels.get(product_label) if product_label else None
        if product and REGISTRY.identify(product) is None:
            product = None
    if allocatable <= 0 or not product:
        return None
    memory = next((_quantity(labels[key]) for key in MEMORY_LABELS if labels.get(key)), None)
    identified = gpu_type_of(product, memory or None)
    if identified not in REGISTRY.models:
        # A bare family (variant not told) or no known type: the cloud's label may say which.
        for key in CLOUD_PRODUCT_LABELS:
            told = REGISTRY.identify(labels.get(key, ""), memory or None) if labels.get(key) else None
            if told is not None and REGISTRY.family_of(told) == REGISTRY.family_of(identified):
                identified = told
                break
    types = None if priced is None else {gpu_type for gpu_type, _ in priced}
    gpu_type = node_type(identified, REGISTRY, None if types is None else dict.fromkeys(types))
    spot_label = next(
        (
            (key, labels[key])
            for key, value in SPOT_LABELS.items()
            if labels.get(key, "").lower() == value.lower()
        ),
        None,
    )
    if provider is Provider.PRIVATE:
        kind = CapacityKind.PRIVATE
    elif spot_label is not None:
        kind = CapacityKind.SPOT
    else:
        kind = CapacityKind.ON_DEMAND
    pool_label = next((key for key in POOL_LABELS if labels.get(key)), None)
    pool = labels[pool_label] if pool_label else f"{gpu_type.lower()}-{kind.value.replace('_', '-')}"
    return NodeInfo(
        name=meta.get("name", ""),
        pool=pool,
        pool_label=pool_label,
        product=product,
        product_label=product_label,
        gpu_type=gpu_type,
        kind=kind,
        allocatable_gpus=allocatable,
        spot_label=spot_label,
        schedulable=_schedulable(node),
    )


def _pod_gpus(spec: Json) -> int:
    """The pod's effective GPU request: the larger of its containers' sum and any init container."""

    def gpus(container: Json) -> int:
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        # An extended resource given only as a limit is requested at that limit.
        return _quantity(requests.get(GPU_RESOURCE, limits.get(GPU_RESOURCE, 0)))

    main = sum(gpus(c) for c in spec.get("containers") or ())
    init = max((gpus(c) for c in spec.get("initContainers") or ()), default=0)
    return max(main, init)


def _failure(status: Json) -> str:
    reason = status.get("reason")
    if reason:
        return str(reason)
    for container in status.get("containerStatuses") or ():
        terminated = (container.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            return f"container {container.get('name')} exited with code {terminated['exitCode']}"
    return ""


def _finished_at_s(status: Json) -> float | None:
    """The latest finishedAt among the pod's terminated containers (None if none ended)."""
    ends = (
        parse_time_s(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for c in status.get("containerStatuses") or ()
    )
    return max((e for e in ends if e is not None), default=None)


def pod_info(pod: Json) -> PodInfo:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    return PodInfo(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        node_name=spec.get("nodeName") or None,
        gpus=_pod_gpus(spec),
        phase=phase,
        gang=(meta.get("labels") or {}).get(GANG_LABEL),
        started_at_s=parse_time_s(status.get("startTime")),
        failure=_failure(status) if phase == "Failed" else "",
        job_id=_id_of(meta, JOB_ID_KEY),
        attempt=int(attempt) if (attempt := _id_of(meta, ATTEMPT_KEY)) and attempt.isdigit() else None,
        finished_at_s=_finished_at_s(status) if phase in FINISHED_PHASES else None,
    )


def _id_of(meta: Json, key: str) -> str | None:
    value = (meta.get("annotations") or {}).get(key) or (meta.get("labels") or {}).get(key)
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class PoolLayout:
    """One priced pool as the inventory lists it: its name, and its schedulable nodes in order."""

    name: str
    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float
    gpus_per_node: int
    # Schedulable nodes only, by name: position i is `free_gpus_per_node[i]` of the pool.
    nodes: tuple[NodeInfo, ...]


def pool_layout(
    nodes: Iterable[NodeInfo], prices: Mapping[tuple[GpuType, CapacityKind], float]
) -> list[PoolLayout]:
    """Pools grouped by pool label, sorted by name, each with its schedulable nodes by name.

    The one ordering both the inventory and the gangs' node shares use, so that a share's node
    index points at the node the inventory lists there.
    """
    nodes = list(nodes)
    # Where some nodes of a type and kind carry GPU feature discovery's label, gpufed's pods select by
    # it (`manifests.select_nodes`): nodes named only by their cloud's label are left out, not
    # counted as room no pod of that type would reach.
    by_gfd = {(n.gpu_type, n.kind) for n in nodes if n.product_label == PRODUCT_LABEL}
    groups: dict[tuple[str, GpuType, CapacityKind], list[NodeInfo]] = defaultdict(list)
    for node in nodes:
        if node.product_label != PRODUCT_LABEL and (node.gpu_type, node.kind) in by_gfd:
            continue
        groups[(node.pool, node.gpu_type, node.kind)].append(node)
    pool_names: dict[str, int] = defaultdict(int)
    for pool, _, _ in groups:
        pool_names[pool] += 1
    pools: list[PoolLayout] = []
    for (pool, gpu_type, kind), members in groups.items():
        price = prices.get((gpu_type, kind))
        if price is None:
            continue
        members.sort(key=lambda n: n.name)
        pools.append(
            PoolLayout(
                # A pool label shared by nodes of two GPU types or kinds becomes one pool per kind.
                name=pool if pool_names[pool] == 1 else f"{pool}-{gpu_type.lower()}-{kind.value}",
                gpu_type=gpu_type,
                kind=kind,
                usd_per_gpu_hour=price,
                gpus_per_node=max(n.allocatable_gpus for n in members),
                nodes=tuple(n for n in members if n.schedulable),
            )
        )
    pools.sort(key=lambda p: p.name)
    return pools


def node_positions(layout: Iterable[PoolLayout]) -> dict[str, tuple[str, int]]:
    """Node name to (pool, index in the pool's free_gpus_per_node), for listed nodes only."""
    return {node.name: (pool.name, i) for pool in layout for i, node in enumerate(pool.nodes)}


def cluster_state(
    *,
    name: ClusterName,
    provider: Provider,
    region: str,
    object_store: str | None,
    prices: Mapping[tuple[GpuType, CapacityKind], float],
    nodes: Iterable[NodeInfo],
    pods: Iterable[PodInfo],
    reachable: bool,
    reclaims: Mapping[tuple[GpuType, CapacityKind], float] | None = None,
) -> ClusterState:
    """Pools grouped by pool label, each schedulable node with its free GPUs; unpriced pools left out.
    `reclaims`: spot pools' reclaims per node-hour, by type and kind (none listed: 0)."""
    risks = reclaims or {}
    used: dict[str, int] = defaultdict(int)
    for pod in pods:
        if pod.holds_gpus and pod.gpus and pod.node_name is not None:
            used[pod.node_name] += pod.gpus
    pools = [
        NodePool(
            name=pool.name,
            gpu_type=pool.gpu_type,
            kind=pool.kind,
            usd_per_gpu_hour=pool.usd_per_gpu_hour,
            gpus_per_node=pool.gpus_per_node,
            free_gpus_per_node=tuple(max(0, n.allocatable_gpus - used.get(n.name, 0)) for n in pool.nodes),
            restart_risk_per_hour=risks.get((pool.gpu_type, pool.kind), 0.0),
        )
        for pool in pool_layout(nodes, prices)
    ]
    return ClusterState(
        name=name,
        provider=provider,
        region=region,
        pools=tuple(pools),
        reachable=reachable,
        object_store=object_store,
    )


def unpriced(
    nodes: Iterable[NodeInfo], prices: Mapping[tuple[GpuType, CapacityKind], float]
) -> set[tuple[GpuType, CapacityKind]]:
    """GPU types and kinds the cluster has but the config gives no price for (left out of inventory)."""
    return {(n.gpu_type, n.kind) for n in nodes if (n.gpu_type, n.kind) not in prices}


def never_fits(
    nodes: Iterable[NodeInfo], gpu_type: GpuType, kind: CapacityKind, replica_gpus: list[int]
) -> str | None:
    """Why the gang could not run here even on an empty cluster, or None if it could.

    Best fit decreasing over the schedulable nodes' allocatable GPUs, each replica on one node. A
    gang that fits only once others finish is not refused: it waits in the cluster's queue.
    """
    free = sorted(
        n.allocatable_gpus for n in nodes if n.gpu_type == gpu_type and n.kind == kind and n.schedulable
    )
    have = f"the cluster has {len(free)} such schedulable nodes with {sum(free)} GPUs in all"
    for need in sorted(replica_gpus, reverse=True):
        fitting = [i for i, f in enumerate(free) if f >= need]
        if not fitting:
            return (
                f"needs {sum(replica_gpus)} {kind.value} {gpu_type} GPUs as replicas of "
                f"{'+'.join(str(g) for g in sorted(replica_gpus, reverse=True))} (each on one node); "
                f"{have}"
            )
        best = min(fitting, key=lambda i: free[i])
        free[best] -= need
    return None
