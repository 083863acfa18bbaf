"""What federation tells the Kubernetes backend about one member cluster.

A node says what GPUs it has and how many are free, but not what they cost, which object store
serves the cluster, or whether more nodes can be bought: those are the operator's facts, kept in the
federation config and handed to the backend here. Everything else the backend learns from the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from placement.model import CapacityKind, ClusterName, GpuType, Provider


@dataclass(frozen=True, slots=True)
class GpuPrice:
    """What one GPU-hour of a type costs on this cluster; private capacity at the internal rate."""

    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float
    # Spot: how often the cloud takes a node of this type back, per node-hour (the placer's risk).
    reclaims_per_node_hour: float = 0.0


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    """How the backend behaves; the defaults suit a real cluster, tests shorten the timings."""

    namespace_prefix: str = "gpufed-"
    # Default grace period when a gang is deleted by garbage collection.
    gc_grace_period_s: float = 30.0
    # The API may stay silent this long before inventory says unreachable and calls raise.
    unreachable_after_s: float = 30.0
    # Server-side lifetime of one watch request; the watch resumes from its resourceVersion after.
    watch_timeout_s: int = 300
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    # Reconnect backoff while the API cannot be reached: doubles from min to max.
    backoff_min_s: float = 0.2
    backoff_max_s: float = 10.0
    # How long inventory(), statuses() and dispatch() wait for the first list before giving up.
    sync_timeout_s: float = 10.0
    # API calls (dispatch, cancel) of this cluster on threads at once, on the pool every member
    # cluster shares (clusters.kubernetes.threads); watches have one thread each on top.
    api_threads: int = 16
    # A cancelled or evicted gang is reported as such for this long after its objects are gone.
    tombstone_ttl_s: float = 600.0
    # The port the rendezvous environment gives to torch.distributed.
    master_port: int = 29500
    # None: Volcano Jobs where discovery finds batch.volcano.sh, else Indexed Jobs. False: Indexed
    # Jobs even where Volcano is installed (an operator who keeps Volcano for other work).
    use_volcano: bool | None = None


@dataclass(frozen=True, slots=True)
class KubernetesClusterConfig:
    """One member cluster reached through one kubeconfig context."""

    name: ClusterName
    provider: Provider
    region: str
    prices: tuple[GpuPrice, ...]
    kubeconfig: Path | None = None
    # None means the kubeconfig's current context.
    context: str | None = None
    object_store: str | None = None
    # Whether the provisioner may add nodes (clouds); inventory does not depend on it.
    scalable: bool = False
    settings: KubernetesSettings = field(default_factory=KubernetesSettings)

    def price_table(self) -> Mapping[tuple[GpuType, CapacityKind], float]:
        return {(p.gpu_type, p.kind): p.usd_per_gpu_hour for p in self.prices}

    def reclaim_table(self) -> Mapping[tuple[GpuType, CapacityKind], float]:
        return {
            (p.gpu_type, p.kind): p.reclaims_per_node_hour for p in self.prices if p.reclaims_per_node_hour
        }

    def price(self, gpu_type: GpuType, kind: CapacityKind) -> float | None:
        for p in self.prices:
            if p.gpu_type == gpu_type and p.kind == kind:
                return p.usd_per_gpu_hour
        return None
