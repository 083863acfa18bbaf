"""A GPU node pool as gpufed asks for it, checked before Pulumi ever sees it.

Pulumi reports a bad pool only after a provider call, minutes in and half-applied; our own checks
name the field and the rule at once: counts in range, a GPU type the cloud's instance actually
carries, spot only where the account and the pool can have it, regions and zones that belong
together, taints and labels with Kubernetes syntax. Every node carries labels naming the pool, GPU
type and owning cluster (`node_labels`), so the usage ledger and the inventory can join what ran
with what was provisioned.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import StrEnum

from iac.errors import InvalidPoolSpec
from placement.model import CapacityKind, ClusterName, GpuType, Provider


class Cloud(StrEnum):
    AWS = "aws"
    GCP = "gcp"
    AZURE = "azure"

    @property
    def provider(self) -> Provider:
        return Provider(self.value)


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
        Machine("p5e.48xlarge", "H200", 8),
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

# EKS node images with the NVIDIA driver and container toolkit; the first is the default.
EKS_GPU_AMIS = ("AL2023_x86_64_NVIDIA", "AL2_x86_64_GPU", "BOTTLEROCKET_x86_64_NVIDIA")

LABEL_POOL = "gpufed.io/pool"
LABEL_GPU_TYPE = "gpufed.io/gpu-type"
LABEL_CLUSTER = "gpufed.io/cluster"
LABEL_CAPACITY = "gpufed.io/capacity-type"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
MAX_NODES = 1000
GPU_TAINT_KEY = "nvidia.com/gpu"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# AKS: Linux agent pool names are 1 to 12 lowercase letters and digits, starting with a letter.
_AKS_POOL = re.compile(r"[a-z][a-z0-9]{0,11}")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_REGION = re.compile(r"[a-z]+[a-z0-9-]*[0-9a-z]")


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str = "NoSchedule"


# gpufed's pods tolerate the GPU operator's taint (see docs/kubernetes.md); other pods stay off.
GPU_TAINT = Taint(GPU_TAINT_KEY, "present", "NoSchedule")


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """What one cloud account lets gpufed do, as the infra team configures it."""

    cloud: Cloud
    # False where the account cannot buy spot: an Azure offer type without Spot VMs (free trial,
    # sponsorship), or an organisation policy.
    spot: bool = True
    # Regions the account may use (empty: any).
    regions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolSpec:
    cloud: Cloud
    cluster: ClusterName
    name: str
    gpu_type: GpuType
    instance_type: str
    region: str
    # GPUs on each node; 0: as many as the instance type carries (`validate` fills it in).
    gpus_per_node: int = 0
    min_nodes: int = 0
    max_nodes: int = 1
    # The count gpufed asks for now; ignored by Pulumi once an autoscaler owns the count.
    desired_nodes: int = 0
    kind: CapacityKind = CapacityKind.ON_DEMAND
    # The cluster autoscaler owns the node count between min and max: Pulumi must not fight it.
    autoscaled: bool = False
    # One zone for every node (empty: the cloud picks within the region).
    zone: str = ""
    taints: tuple[Taint, ...] = (GPU_TAINT,)
    labels: tuple[tuple[str, str], ...] = ()
    # What one GPU of the pool costs per hour (the cloud's price for this type and kind), for the
    # cost of each change shown before it is applied.
    usd_per_gpu_hour: float = 0.0
    # Spot bid cap in USD per node-hour (Azure); None: pay up to the on-demand price.
    spot_max_usd_per_hour: float | None = None
    # A capacity reservation the nodes consume (GKE reservation name, AKS capacity reservation group
    # id); spot nodes cannot consume one.
    reservation: str = ""
    # EKS node image (one of EKS_GPU_AMIS); empty: the first.
    image: str = ""
    # Cloud-side identifiers of the cluster the pool joins (EKS role and subnets, GKE project, AKS
    # resource group), passed through to the program unchanged.
    settings: tuple[tuple[str, str], ...] = field(default=())

    @property
    def pool_id(self) -> str:
        """`<cluster>.<pool>`: unique across the federation, and the pool's stack name."""
        return f"{self.cluster}.{self.name}"

    @property
    def spot(self) -> bool:
        return self.kind is CapacityKind.SPOT

    @property
    def machine(self) -> Machine:
        for m in MACHINES[self.cloud]:
            if m.instance_type == self.instance_type:
                return m
        raise InvalidPoolSpec("instance_type", f"{self.instance_type!r} is not a known {self.cloud} GPU type")

    @property
    def node_gpus(self) -> int:
        """GPUs per node, whether or not `validate` has filled `gpus_per_node` in."""
        return self.gpus_per_node or self.machine.gpus

    def setting(self, key: str, default: str | None = None) -> str:
        for k, v in self.settings:
            if k == key:
                return v
        if default is not None:
            return default
        raise InvalidPoolSpec(f"settings.{key}", f"required for a {self.cloud} pool")

    def with_nodes(self, nodes: int) -> PoolSpec:
        """The same pool asked to hold `nodes`; bounds widen to include it (6 nodes of 0..4 is 0..6).

        Where an autoscaler owns the count, Pulumi ignores `desired_nodes`, so `nodes` becomes the
        autoscaler's minimum instead: the capacity is held (a plan's, a waiting gang's) until gpufed
        lowers the floor again, and the autoscaler may still add nodes above it.
        """
        if self.autoscaled:
            return replace(self, min_nodes=nodes, desired_nodes=nodes, max_nodes=max(self.max_nodes, nodes))
        return replace(
            self,
            desired_nodes=nodes,
            max_nodes=max(self.max_nodes, nodes),
            min_nodes=min(self.min_nodes, nodes),
        )

    def node_labels(self) -> dict[str, str]:
        """What every node of the pool carries: the user's labels, then gpufed's join keys.

        `gpufed.io/pool` is the pool's name as the federation config and the placer's capacity
        requests name it (the Kubernetes backend reads the node's pool from it); with
        `gpufed.io/cluster` it identifies the pool across the federation.
        """
        return {
            **dict(self.labels),
            LABEL_POOL: self.name,
            LABEL_GPU_TYPE: self.gpu_type,
            LABEL_CLUSTER: self.cluster,
            LABEL_CAPACITY: "spot" if self.spot else "on-demand",
        }


REQUIRED_SETTINGS: dict[Cloud, tuple[str, ...]] = {
    Cloud.AWS: ("eksCluster", "nodeRoleArn", "subnetIds"),
    Cloud.GCP: ("gkeCluster", "project"),
    Cloud.AZURE: ("resourceGroup", "aksCluster"),
}


def validate(spec: PoolSpec, provider: ProviderConfig | None = None) -> PoolSpec:
    """The spec with `gpus_per_node` filled in if every field is acceptable, else InvalidPoolSpec
    naming the first bad field. `provider`, when given, is the account the pool is created in."""
    if not isinstance(spec.cloud, Cloud):
        raise InvalidPoolSpec("cloud", f"must be one of {', '.join(Cloud)}, got {spec.cloud!r}")
    _names(spec)
    _place(spec, provider)
    machine = _machine(spec)
    _counts(spec)
    _capacity(spec, provider)
    _taints_and_labels(spec)
    if spec.image and (spec.cloud is not Cloud.AWS or spec.image not in EKS_GPU_AMIS):
        raise InvalidPoolSpec(
            "image",
            f"only an EKS GPU AMI type ({', '.join(EKS_GPU_AMIS)}), got {spec.image!r} on {spec.cloud}",
        )
    for key in REQUIRED_SETTINGS[spec.cloud]:
        if not spec.setting(key, ""):
            raise InvalidPoolSpec(f"settings.{key}", f"required for a {spec.cloud} pool")
    return spec if spec.gpus_per_node else replace(spec, gpus_per_node=machine.gpus)


def _names(spec: PoolSpec) -> None:
    for field_name, value in (("cluster", spec.cluster), ("name", spec.name)):
        if not _DNS_LABEL.fullmatch(value):
            raise InvalidPoolSpec(
                field_name, f"must be a DNS label (lowercase letters, digits, '-', at most 63), got {value!r}"
            )
    if spec.cloud is Cloud.AZURE and not _AKS_POOL.fullmatch(spec.name):
        raise InvalidPoolSpec(
            "name", f"an AKS pool name is 1 to 12 lowercase letters and digits, got {spec.name!r}"
        )


def _place(spec: PoolSpec, provider: ProviderConfig | None) -> None:
    if not _REGION.fullmatch(spec.region):
        raise InvalidPoolSpec("region", f"must be a {spec.cloud} region name, got {spec.region!r}")
    if provider is not None and provider.regions and spec.region not in provider.regions:
        raise InvalidPoolSpec(
            "region", f"{spec.region} is not one of the account's regions ({', '.join(provider.regions)})"
        )
    if not spec.zone:
        return
    if spec.cloud is Cloud.AZURE:
        if spec.zone not in ("1", "2", "3"):
            raise InvalidPoolSpec("zone", f"an Azure availability zone is 1, 2 or 3, got {spec.zone!r}")
    elif not (spec.zone.startswith(spec.region) and len(spec.zone) > len(spec.region)):
        raise InvalidPoolSpec("zone", f"{spec.zone!r} is not a zone of {spec.region}")


def _machine(spec: PoolSpec) -> Machine:
    carriers = [m.instance_type for m in MACHINES[spec.cloud] if m.gpu_type == spec.gpu_type]
    if not carriers:
        offered = sorted({m.gpu_type for m in MACHINES[spec.cloud]})
        raise InvalidPoolSpec(
            "gpu_type", f"{spec.gpu_type!r} is not available on {spec.cloud} (offered: {', '.join(offered)})"
        )
    offered_machine = [m for m in MACHINES[spec.cloud] if m.instance_type == spec.instance_type]
    if not offered_machine:
        raise InvalidPoolSpec(
            "instance_type",
            f"{spec.instance_type!r} is not a {spec.cloud} GPU instance type gpufed knows "
            f"(for {spec.gpu_type}: {', '.join(carriers)})",
        )
    machine = offered_machine[0]
    if machine.gpu_type != spec.gpu_type:
        raise InvalidPoolSpec(
            "gpu_type", f"{spec.instance_type} carries {machine.gpu_type}, not {spec.gpu_type}"
        )
    if spec.gpus_per_node not in (0, machine.gpus):
        raise InvalidPoolSpec(
            "gpus_per_node", f"{spec.instance_type} carries {machine.gpus} GPUs, not {spec.gpus_per_node}"
        )
    return machine


def _counts(spec: PoolSpec) -> None:
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
    if not spec.usd_per_gpu_hour >= 0:
        raise InvalidPoolSpec("usd_per_gpu_hour", f"must be zero or more, got {spec.usd_per_gpu_hour}")


def _capacity(spec: PoolSpec, provider: ProviderConfig | None) -> None:
    if spec.kind not in (CapacityKind.ON_DEMAND, CapacityKind.SPOT):
        raise InvalidPoolSpec("kind", f"a cloud pool is on_demand or spot, not {spec.kind}")
    if spec.spot and provider is not None and not provider.spot:
        raise InvalidPoolSpec("kind", f"the {provider.cloud} account is configured without spot capacity")
    if spec.spot and spec.reservation:
        raise InvalidPoolSpec("reservation", "spot nodes cannot consume a capacity reservation")
    if spec.reservation and spec.cloud is Cloud.AWS:
        raise InvalidPoolSpec(
            "reservation", "an EKS node group takes a reservation only through a launch template"
        )
    if spec.spot_max_usd_per_hour is not None:
        if spec.cloud is not Cloud.AZURE:
            raise InvalidPoolSpec(
                "spot_max_usd_per_hour", f"only Azure takes a spot price cap, not {spec.cloud}"
            )
        if not spec.spot:
            raise InvalidPoolSpec("spot_max_usd_per_hour", "a price cap needs kind: spot")
        if not spec.spot_max_usd_per_hour > 0:
            raise InvalidPoolSpec("spot_max_usd_per_hour", "must be positive")


def _taints_and_labels(spec: PoolSpec) -> None:
    for i, taint in enumerate(spec.taints):
        _label_key(taint.key, f"taints[{i}].key")
        if not _LABEL_VALUE.fullmatch(taint.value):
            raise InvalidPoolSpec(f"taints[{i}].value", f"{taint.value!r} is not a valid label value")
        if taint.effect not in TAINT_EFFECTS:
            raise InvalidPoolSpec(f"taints[{i}].effect", f"must be one of {', '.join(TAINT_EFFECTS)}")
    seen: set[str] = set()
    for key, value in spec.labels:
        where = f"labels[{key!r}]"
        _label_key(key, where)
        if key.startswith("gpufed.io/"):
            raise InvalidPoolSpec(where, "gpufed.io/ labels are set by gpufed")
        if key in seen:
            raise InvalidPoolSpec(where, "given twice")
        seen.add(key)
        if not _LABEL_VALUE.fullmatch(value):
            raise InvalidPoolSpec(where, f"{value!r} is not a valid label value")
    if not _LABEL_VALUE.fullmatch(spec.gpu_type):
        raise InvalidPoolSpec("gpu_type", f"{spec.gpu_type!r} is not a valid label value")


def _label_key(key: str, field_name: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and not _PREFIX.fullmatch(prefix):
        raise InvalidPoolSpec(field_name, f"{key!r}: the prefix must be a DNS subdomain")
    if not _LABEL_NAME.fullmatch(name):
        raise InvalidPoolSpec(field_name, f"{key!r} is not a valid Kubernetes label name")
