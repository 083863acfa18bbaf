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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusters.kubernetes.backend import KubernetesBackend
    from clusters.kubernetes.config import GpuPrice, KubernetesClusterConfig, KubernetesSettings

__all__ = ["GpuPrice", "KubernetesBackend", "KubernetesClusterConfig", "KubernetesSettings"]

# Loaded on first use (PEP 562): the package's pure modules (`names`, read by the job logs and the
# console of every server) must not pull in the Kubernetes client, whose import is about half a
# second of a restart's CPU that a federation without a Kubernetes member never needs.
_LAZY = {
    "KubernetesBackend": "clusters.kubernetes.backend",
    "GpuPrice": "clusters.kubernetes.config",
    "KubernetesClusterConfig": "clusters.kubernetes.config",
    "KubernetesSettings": "clusters.kubernetes.config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
