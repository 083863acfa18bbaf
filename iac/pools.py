"""A GPU node pool as gpufed asks for it, checked before Pulumi ever sees it.

Pulumi reports a bad pool only after a provider call, minutes in and half-applied; our own checks
name the field and the rule at once: counts in range, a GPU type the cloud's instance actually
carries, spot only where the cloud offers it for that pool, taints and labels with Kubernetes
syntax. Every node carries labels naming the pool, GPU type and owning cluster, so the usage ledger
can join what ran with what was provisioned.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum


class Cloud(StrEnum):
    AWS = "aws"
    GCP = "gcp"
    AZURE = "azure"


class InvalidPoolSpec(ValueError):
    """A pool spec gpufed will not hand to Pulumi; `field` names the offending field."""

    retryable = False

    def __init__(self, field_name: str, rule: str) -> None:
        super().__init__(f"{field_name}: {rule}")
        self.field = field_name
        self.rule = rule


@dataclass(frozen=True, slots=True)
class Machine:
    """An instance type with its GPUs, as the cloud names both."""

    instance_type: str
    gpu_type: str
    gpus: int
    # GCP attaches GPUs as accelerators by this name; other clouds build them into the type.
    accelerator: str = ""


# The instance types each cloud offers per GPU type (8-GPU training shapes and 1-GPU inference ones).
MACHINES: dict[Cloud, tuple[Machine, ...]] = {
    Cloud.AWS: (
        Machine("p4d.24xlarge", "A100", 8),
        Machine("p4de.24xlarge", "A100", 8),
        Machine("p5.48xlarge", "H100", 8),
        Machine("g6.xlarge", "L4", 1),
        Machine("g6.48xlarge", "L4", 8),
        Machine("g5.xlarge", "A10G", 1),
        Machine("g5.48xlarge", "A10G", 8),
    ),
    Cloud.GCP: (
        Machine("a2-highgpu-8g", "A100", 8, "nvidia-tesla-a100"),
        Machine("a2-ultragpu-8g", "A100", 8, "nvidia-a100-80gb"),
        Machine("a3-highgpu-8g", "H100", 8, "nvidia-h100-80gb"),
        Machine("g2-standard-4", "L4", 1, "nvidia-l4"),
        Machine("g2-standard-96", "L4", 8, "nvidia-l4"),
    ),
    Cloud.AZURE: (
        Machine("Standard_ND96asr_v4", "A100", 8),
        Machine("Standard_ND96amsr_A100_v4", "A100", 8),
        Machine("Standard_ND96isr_H100_v5", "H100", 8),
        Machine("Standard_NC24ads_A100_v4", "A100", 1),
    ),
}

LABEL_POOL = "gpufed.io/pool"
LABEL_GPU_TYPE = "gpufed.io/gpu-type"
LABEL_CLUSTER = "gpufed.io/cluster"
LABEL_CAPACITY = "gpufed.io/capacity-type"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
MAX_NODES = 1000

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class PoolSpec:
    cloud: Cloud
    cluster: str
    name: str
    gpu_type: str
    instance_type: str
    region: str
    min_nodes: int = 0
    max_nodes: int = 1
    # The count gpufed asks for now; ignored by Pulumi once an autoscaler owns the count.
    desired_nodes: int = 0
    spot: bool = False
    # The cluster autoscaler owns the node count between min and max: Pulumi must not fight it.
    autoscaled: bool = False
    zone: str = ""
    taints: tuple[Taint, ...] = (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    labels: tuple[tuple[str, str], ...] = ()
    # What one GPU of the pool costs per hour (the cloud's price for this type and kind), for the
    # cost of each change shown before it is applied.
    usd_per_gpu_hour: float = 0.0
    # Spot bid cap in USD per node-hour (Azure); None: pay up to the on-demand price.
    spot_max_usd_per_hour: float | None = None
    # Cloud-side identifiers of the cluster the pool joins (EKS role and subnets, GKE project, AKS
    # resource group), passed through to the program unchanged.
    settings: tuple[tuple[str, str], ...] = field(default=())

    @property
    def pool_id(self) -> str:
        return f"{self.cluster}.{self.name}"

    @property
    def machine(self) -> Machine:
        for m in MACHINES[self.cloud]:
            if m.instance_type == self.instance_type:
                return m
        raise InvalidPoolSpec("instance_type", f"{self.instance_type!r} is not a known {self.cloud} GPU type")

    @property
    def gpus_per_node(self) -> int:
        return self.machine.gpus

    def setting(self, key: str) -> str:
        for k, v in self.settings:
            if k == key:
                return v
        raise InvalidPoolSpec(f"settings.{key}", f"required for a {self.cloud} pool")

    def node_labels(self) -> dict[str, str]:
        """What every node of the pool carries: gpufed's join keys first, the user's after."""
        return {
            **dict(self.labels),
            LABEL_POOL: self.pool_id.replace(".", "-"),
            LABEL_GPU_TYPE: self.gpu_type,
            LABEL_CLUSTER: self.cluster,
            LABEL_CAPACITY: "spot" if self.spot else "on-demand",
        }


REQUIRED_SETTINGS: dict[Cloud, tuple[str, ...]] = {
    Cloud.AWS: ("eksCluster", "nodeRoleArn", "subnetIds"),
    Cloud.GCP: ("gkeCluster", "project"),
    Cloud.AZURE: ("resourceGroup", "aksCluster"),
}


def validate(spec: PoolSpec) -> PoolSpec:
    """The spec if every field is acceptable, else InvalidPoolSpec naming the first bad field."""
    for field_name, value in (("cluster", spec.cluster), ("name", spec.name)):
        if not _DNS_LABEL.match(value):
            raise InvalidPoolSpec(
                field_name, f"must be a DNS label (lowercase letters, digits, '-'), got {value!r}"
            )
    if not spec.region:
        raise InvalidPoolSpec("region", "required")
    offered = [m for m in MACHINES[spec.cloud] if m.instance_type == spec.instance_type]
    if not offered:
        known = ", ".join(m.instance_type for m in MACHINES[spec.cloud] if m.gpu_type == spec.gpu_type)
        raise InvalidPoolSpec(
            "instance_type",
            f"{spec.instance_type!r} is not a {spec.cloud} GPU instance type gpufed knows"
            + (f" (for {spec.gpu_type}: {known})" if known else ""),
        )
    if offered[0].gpu_type != spec.gpu_type:
        raise InvalidPoolSpec(
            "gpu_type", f"{spec.instance_type} carries {offered[0].gpu_type}, not {spec.gpu_type}"
        )
    if not 0 <= spec.min_nodes <= spec.max_nodes <= MAX_NODES:
        raise InvalidPoolSpec(
            "max_nodes",
            f"need 0 <= min_nodes <= max_nodes <= {MAX_NODES}, got {spec.min_nodes}..{spec.max_nodes}",
        )
    if spec.max_nodes == 0:
        raise InvalidPoolSpec("max_nodes", "a pool that may hold no node is not a pool")
    if not spec.min_nodes <= spec.desired_nodes <= spec.max_nodes:
        raise InvalidPoolSpec(
            "desired_nodes",
            f"{spec.desired_nodes} is outside min_nodes..max_nodes ({spec.min_nodes}..{spec.max_nodes})",
        )
    if spec.usd_per_gpu_hour < 0:
        raise InvalidPoolSpec("usd_per_gpu_hour", "must not be negative")
    if spec.spot_max_usd_per_hour is not None:
        if spec.cloud is not Cloud.AZURE:
            raise InvalidPoolSpec(
                "spot_max_usd_per_hour", f"only Azure takes a spot price cap, not {spec.cloud}"
            )
        if not spec.spot:
            raise InvalidPoolSpec("spot_max_usd_per_hour", "a price cap needs spot: true")
        if not spec.spot_max_usd_per_hour > 0:
            raise InvalidPoolSpec("spot_max_usd_per_hour", "must be positive")
    for i, taint in enumerate(spec.taints):
        _label_key(taint.key, f"taints[{i}].key")
        if not _LABEL_VALUE.match(taint.value):
            raise InvalidPoolSpec(f"taints[{i}].value", f"{taint.value!r} is not a valid label value")
        if taint.effect not in TAINT_EFFECTS:
            raise InvalidPoolSpec(f"taints[{i}].effect", f"must be one of {', '.join(TAINT_EFFECTS)}")
    for key, value in spec.labels:
        _label_key(key, f"labels[{key!r}]")
        if key.startswith("gpufed.io/"):
            raise InvalidPoolSpec(f"labels[{key!r}]", "gpufed.io/ labels are set by gpufed")
        if not _LABEL_VALUE.match(value):
            raise InvalidPoolSpec(f"labels[{key!r}]", f"{value!r} is not a valid label value")
    for key in REQUIRED_SETTINGS[spec.cloud]:
        spec.setting(key)
    return spec


def _label_key(key: str, field_name: str) -> None:
    prefix, _, name = key.rpartition("/")
    if prefix and not _PREFIX.match(prefix):
        raise InvalidPoolSpec(field_name, f"{key!r}: the prefix must be a DNS subdomain")
    if not _LABEL_NAME.match(name):
        raise InvalidPoolSpec(field_name, f"{key!r} is not a valid Kubernetes label name")
