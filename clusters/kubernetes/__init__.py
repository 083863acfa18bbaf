"""Member clusters on Kubernetes: the backend that drives one kubeconfig context (docs/kubernetes.md).

config = KubernetesClusterConfig(
    name=ClusterName("gke-eu"), provider=Provider.GCP, region="europe-west4",
    prices=(GpuPrice(GpuType("H100"), CapacityKind.ON_DEMAND, 9.8),),
    kubeconfig=Path("~/.kube/config").expanduser(), context="gke-eu",
)
async with KubernetesBackend(config) as backend:
    state = await backend.inventory()
"""

from __future__ import annotations

from clusters.kubernetes.backend import KubernetesBackend
from clusters.kubernetes.config import GpuPrice, KubernetesClusterConfig, KubernetesSettings

__all__ = ["GpuPrice", "KubernetesBackend", "KubernetesClusterConfig", "KubernetesSettings"]
