"""What a simulated cluster looks like: its pools of GPU nodes and how fast its time runs.

The file format reuses the keys of the federation config's cluster entries (`name`, `pools` with
`name`, `gpuType`, `kind`, `gpusPerNode`, `nodes`), so one cluster block can be handed to the
simulator as it is; keys the simulator does not need (prices, region) are ignored. A file holds
either one cluster or `clusters: [...]`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from placement.model import CapacityKind, ClusterName, GpuType, PoolSpec

# What a GPU operator writes in `nvidia.com/gpu.product` and `nvidia.com/gpu.memory` per model:
# families (a pool configured as `A100`) and the variants of `placement.gpu_types`.
GPU_PRODUCTS: dict[str, tuple[str, int]] = {
    "A100": ("NVIDIA-A100-SXM4-80GB", 81920),
    "A100-40GB": ("NVIDIA-A100-SXM4-40GB", 40960),
    "A100-80GB": ("NVIDIA-A100-SXM4-80GB", 81920),
    "H100": ("NVIDIA-H100-80GB-HBM3", 81559),
    "H100-SXM": ("NVIDIA-H100-80GB-HBM3", 81559),
    "H100-PCIE": ("NVIDIA-H100-PCIe", 81559),
    "H100-NVL": ("NVIDIA-H100-NVL", 95830),
    "V100-16GB": ("Tesla-V100-SXM2-16GB", 16384),
    "V100-32GB": ("Tesla-V100-SXM2-32GB", 32768),
    "H200": ("NVIDIA-H200", 143771),
    "L4": ("NVIDIA-L4", 23034),
    "L40S": ("NVIDIA-L40S", 46068),
    "A10G": ("NVIDIA-A10G", 23028),
    "V100": ("Tesla-V100-SXM2-16GB", 16384),
    "T4": ("Tesla-T4", 15360),
}


class SimConfigError(ValueError):
    """A simulator config that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class SimPoolConfig:
    name: str
    gpu_type: GpuType
    kind: CapacityKind
    gpus_per_node: int
    node_count: int
    gpu_product: str
    gpu_memory_mib: int
    cpu_cores: int = 96
    memory_gib: int = 1024
    max_pods: int = 110

    @classmethod
    def of(
        cls,
        name: str,
        gpu_type: str,
        *,
        gpus_per_node: int = 8,
        node_count: int = 1,
        kind: CapacityKind = CapacityKind.ON_DEMAND,
        gpu_product: str | None = None,
        gpu_memory_mib: int | None = None,
    ) -> SimPoolConfig:
        product, memory = GPU_PRODUCTS.get(gpu_type, (f"NVIDIA-{gpu_type}", 16384))
        return cls(
            name=name,
            gpu_type=GpuType(gpu_type),
            kind=kind,
            gpus_per_node=gpus_per_node,
            node_count=node_count,
            gpu_product=gpu_product or product,
            gpu_memory_mib=gpu_memory_mib or memory,
        )

    @classmethod
    def from_pool_spec(cls, spec: PoolSpec) -> SimPoolConfig:
        return cls.of(
            spec.name,
            spec.gpu_type,
            gpus_per_node=spec.gpus_per_node,
            node_count=spec.node_count,
            kind=spec.kind,
        )


@dataclass(frozen=True, slots=True)
class SimClusterConfig:
    name: ClusterName
    pools: tuple[SimPoolConfig, ...]
    # When set, Kubernetes API requests without `Authorization: Bearer <token>` get 401.
    token: str | None = None
    # How long a pod runs when it has no `sim.gpufed.io/duration` annotation (simulated seconds).
    default_duration_s: float = 60.0
    # 10 runs simulated time ten times faster than real time.
    time_scale: float = 1.0
    # How many changes the watch history keeps; a watch from an older resourceVersion gets 410.
    history_limit: int = 20000
    # How many Event objects are kept before the oldest are deleted.
    event_limit: int = 10000
    # How long a deleted running pod takes to stop (simulated seconds, capped by its grace period).
    termination_s: float = 0.2
    # Simulated seconds between a pod's binding and its container running.
    container_start_s: float = 0.0
    # The first container restart back-off (simulated seconds), doubled per restart up to 300 s.
    restart_backoff_s: float = 10.0
    # Simulated seconds between a running container's progress lines in its log.
    log_interval_s: float = 5.0
    # The most of one container run's log a read returns (the runtime's rotation).
    log_cap_bytes: int = 1024 * 1024
    # Ended pods kept before the pod garbage collector deletes the oldest.
    terminated_pod_gc_threshold: int = 12500
    # Real seconds between BOOKMARK events on watches that asked for them.
    bookmark_interval_s: float = 5.0
    kubernetes_version: str = "v1.34.0"
    # False makes a cluster without Volcano: its API groups are neither listed nor served.
    volcano: bool = True
    # HTTPS with a certificate made on start (clusters.sim.tls): kubectl sends tokens only over TLS.
    tls: bool = False
    # The kubelet runs each pod's command as a local process (clusters.sim.local_exec), for tests
    # of a real rendezvous: never for a cluster that untrusted users submit to.
    local_exec: bool = False


def load(path: str | Path) -> tuple[SimClusterConfig, ...]:
    """Every cluster in a YAML (or JSON) file: one cluster mapping or `clusters: [...]`."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SimConfigError(f"{path}: {exc}") from exc
    return from_document(data)


def from_document(data: Any) -> tuple[SimClusterConfig, ...]:
    if not isinstance(data, Mapping):
        raise SimConfigError("the config must be a mapping")
    if "clusters" in data:
        entries = data["clusters"]
        if not isinstance(entries, list) or not entries:
            raise SimConfigError("clusters: must be a non-empty list")
        configs = tuple(from_mapping(e, f"clusters[{i}]") for i, e in enumerate(entries))
    else:
        configs = (from_mapping(data, "cluster"),)
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise SimConfigError(f"cluster names must be unique: {names}")
    return configs


def _get(data: Mapping[str, Any], at: str, *keys: str, default: Any = None, required: bool = False) -> Any:
    for key in keys:
        if key in data:
            return data[key]
    if required:
        raise SimConfigError(f"{at}.{keys[0]} is required")
    return default


def _number(value: Any, at: str, kind: type[int] | type[float]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SimConfigError(f"{at} must be a number, not {value!r}")
    if value < 0:
        raise SimConfigError(f"{at} must not be negative")
    return kind(value)


_KINDS = {
    "spot": CapacityKind.SPOT,
    "on_demand": CapacityKind.ON_DEMAND,
    "on-demand": CapacityKind.ON_DEMAND,
    "ondemand": CapacityKind.ON_DEMAND,
    "private": CapacityKind.PRIVATE,
}


def from_mapping(data: Any, at: str = "cluster") -> SimClusterConfig:
    if not isinstance(data, Mapping):
        raise SimConfigError(f"{at} must be a mapping")
    name = _get(data, at, "name", required=True)
    if not isinstance(name, str) or not name:
        raise SimConfigError(f"{at}.name must be a non-empty string")
    default_kind = CapacityKind.PRIVATE if data.get("provider") == "private" else CapacityKind.ON_DEMAND
    pools = tuple(_pool(p, f"{at}.pools[{i}]", default_kind) for i, p in enumerate(data.get("pools") or []))
    token = _get(data, at, "token")
    return SimClusterConfig(
        name=ClusterName(name),
        pools=pools,
        token=str(token) if token else None,
        default_duration_s=_number(
            _get(data, at, "defaultDurationS", default=60.0), f"{at}.defaultDurationS", float
        ),
        time_scale=_number(_get(data, at, "timeScale", default=1.0), f"{at}.timeScale", float) or 1.0,
        history_limit=_number(_get(data, at, "historyLimit", default=20000), f"{at}.historyLimit", int),
        event_limit=_number(_get(data, at, "eventLimit", default=10000), f"{at}.eventLimit", int),
        volcano=bool(_get(data, at, "volcano", default=True)),
        tls=bool(_get(data, at, "tls", default=False)),
        local_exec=bool(_get(data, at, "localExec", default=False)),
        restart_backoff_s=_number(
            _get(data, at, "restartBackoffS", default=10.0), f"{at}.restartBackoffS", float
        ),
        log_interval_s=_number(_get(data, at, "logIntervalS", default=5.0), f"{at}.logIntervalS", float),
        termination_s=_number(_get(data, at, "terminationS", default=0.2), f"{at}.terminationS", float),
    )


def _pool(data: Any, at: str, default_kind: CapacityKind) -> SimPoolConfig:
    if not isinstance(data, Mapping):
        raise SimConfigError(f"{at} must be a mapping")
    kind_text = str(_get(data, at, "kind", "capacityType", default=default_kind.value)).lower()
    if kind_text not in _KINDS:
        raise SimConfigError(f"{at}.kind must be one of spot, on_demand, private, not {kind_text!r}")
    return SimPoolConfig.of(
        str(_get(data, at, "name", required=True)),
        str(_get(data, at, "gpuType", required=True)),
        gpus_per_node=_number(_get(data, at, "gpusPerNode", default=8), f"{at}.gpusPerNode", int),
        node_count=_number(_get(data, at, "nodes", "nodeCount", default=1), f"{at}.nodes", int),
        kind=_KINDS[kind_text],
        gpu_product=_get(data, at, "gpuProduct"),
        gpu_memory_mib=_get(data, at, "gpuMemoryMiB"),
    )


def cluster(name: str, pools: Iterable[SimPoolConfig], **options: Any) -> SimClusterConfig:
    """A config in one call, for tests and the embedded default."""
    return SimClusterConfig(name=ClusterName(name), pools=tuple(pools), **options)
