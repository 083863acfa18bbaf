"""Pulumi programs for a GPU node pool on each cloud, and the per-cluster Kubernetes bootstrap.

Plain provider resources, one per pool: EKS `aws.eks.NodeGroup` (NVIDIA AMI, on demand or spot,
taints), GKE `gcp.container.NodePool` (guest accelerators with the driver installed by GKE, spot,
autoscaling bounds), AKS `azure_native.containerservice.AgentPool` (spot priority with an eviction
policy and a price cap). Where an autoscaler owns the node count, Pulumi is told to ignore it, or the
next `up` would undo every scale-up the autoscaler made.

Each function runs inside a Pulumi program (an inline program of the Automation API, or under
`pulumi.runtime.set_mocks` in tests) and returns the resource it declared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_azure_native as azure_native
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from iac.errors import InvalidPoolSpec
from iac.pools import EKS_GPU_AMIS, Cloud, PoolSpec, validate
from placement.model import PriorityClass, TenantId

# EKS applies NoSchedule as NO_SCHEDULE and so on.
_EKS_EFFECT = {
    "NoSchedule": "NO_SCHEDULE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
}
_GKE_EFFECT = _EKS_EFFECT
MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_TENANT = "gpufed.io/tenant"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _ignore_count(spec: PoolSpec, *paths: str) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(ignore_changes=list(paths) if spec.autoscaled else None)


def eks_node_group(spec: PoolSpec) -> aws.eks.NodeGroup:
    spec = validate(spec)
    return aws.eks.NodeGroup(
        spec.name,
        cluster_name=spec.setting("eksCluster"),
        node_group_name=spec.name,
        node_role_arn=spec.setting("nodeRoleArn"),
        subnet_ids=spec.setting("subnetIds").split(","),
        instance_types=[spec.instance_type],
        # An image with the NVIDIA driver and container toolkit (Amazon Linux 2023 unless asked).
        ami_type=spec.image or EKS_GPU_AMIS[0],
        capacity_type="SPOT" if spec.spot else "ON_DEMAND",
        scaling_config=aws.eks.NodeGroupScalingConfigArgs(
            min_size=spec.min_nodes, max_size=spec.max_nodes, desired_size=spec.desired_nodes
        ),
        labels=spec.node_labels(),
        taints=[
            aws.eks.NodeGroupTaintArgs(key=t.key, value=t.value, effect=_EKS_EFFECT[t.effect])
            for t in spec.taints
        ],
        region=spec.region,
        tags=_tags(spec, ":"),
        opts=_ignore_count(spec, "scalingConfig.desiredSize"),
    )


def gke_node_pool(spec: PoolSpec) -> gcp.container.NodePool:
    spec = validate(spec)
    machine = spec.machine
    autoscaling = (
        gcp.container.NodePoolAutoscalingArgs(min_node_count=spec.min_nodes, max_node_count=spec.max_nodes)
        if spec.autoscaled
        else None
    )
    reservation = (
        gcp.container.NodePoolNodeConfigReservationAffinityArgs(
            consume_reservation_type="SPECIFIC_RESERVATION",
            key="compute.googleapis.com/reservation-name",
            values=[spec.reservation],
        )
        if spec.reservation
        else None
    )
    return gcp.container.NodePool(
        spec.name,
        name=spec.name,
        cluster=spec.setting("gkeCluster"),
        project=spec.setting("project"),
        # The cluster's location: its region for a regional cluster, or its zone for a zonal one.
        location=spec.setting("gkeLocation", spec.region),
        node_locations=[spec.zone] if spec.zone else None,
        node_count=None if spec.autoscaled else spec.desired_nodes,
        initial_node_count=spec.desired_nodes if spec.autoscaled else None,
        autoscaling=autoscaling,
        node_config=gcp.container.NodePoolNodeConfigArgs(
            machine_type=spec.instance_type,
            spot=spec.spot,
            guest_accelerators=[
                gcp.container.NodePoolNodeConfigGuestAcceleratorArgs(
                    type=machine.accelerator,
                    count=machine.gpus,
                    # GKE installs the driver: no DaemonSet of our own to keep in step.
                    gpu_driver_installation_config=gcp.container.NodePoolNodeConfigGuestAcceleratorGpuDriverInstallationConfigArgs(
                        gpu_driver_version="LATEST"
                    ),
                )
            ],
            labels=spec.node_labels(),
            resource_labels=_tags(spec, "_"),
            taints=[
                gcp.container.NodePoolNodeConfigTaintArgs(
                    key=t.key, value=t.value, effect=_GKE_EFFECT[t.effect]
                )
                for t in spec.taints
            ],
            reservation_affinity=reservation,
            oauth_scopes=["https://www.googleapis.com/auth/cloud-platform"],
        ),
        opts=_ignore_count(spec, "nodeCount", "initialNodeCount"),
    )


def aks_agent_pool(spec: PoolSpec) -> azure_native.containerservice.AgentPool:
    spec = validate(spec)
    spot = spec.spot
    return azure_native.containerservice.AgentPool(
        spec.name,
        agent_pool_name=spec.name,
        resource_group_name=spec.setting("resourceGroup"),
        resource_name_=spec.setting("aksCluster"),
        vm_size=spec.instance_type,
        # Spot pools cannot be system pools; GPU pools never should be.
        mode="User",
        os_type="Linux",
        count=spec.desired_nodes,
        enable_auto_scaling=spec.autoscaled,
        min_count=spec.min_nodes if spec.autoscaled else None,
        max_count=spec.max_nodes if spec.autoscaled else None,
        scale_set_priority="Spot" if spot else "Regular",
        # A spot VM evicted is deleted, not stopped: a stopped GPU VM still bills its disk and its quota.
        scale_set_eviction_policy="Delete" if spot else None,
        # -1: pay up to the on-demand price, so the pool is evicted for capacity, never for price.
        spot_max_price=(spec.spot_max_usd_per_hour or -1.0) if spot else None,
        capacity_reservation_group_id=spec.reservation or None,
        node_labels=spec.node_labels(),
        node_taints=[f"{t.key}={t.value}:{t.effect}" for t in spec.taints],
        availability_zones=[spec.zone] if spec.zone else None,
        tags=_tags(spec, ":"),
        opts=_ignore_count(spec, "count"),
    )


def _tags(spec: PoolSpec, sep: str) -> dict[str, str]:
    """Cloud-side tags for the billing export (GCP resource labels allow neither ':' nor '.')."""
    return {
        f"gpufed{sep}pool": spec.name,
        f"gpufed{sep}cluster": spec.cluster,
        f"gpufed{sep}gpu-type": spec.gpu_type.lower() if sep == "_" else spec.gpu_type,
    }


POOL_PROGRAMS = {Cloud.AWS: eks_node_group, Cloud.GCP: gke_node_pool, Cloud.AZURE: aks_agent_pool}


def pool_program(spec: PoolSpec) -> pulumi.CustomResource:
    """The node pool of `spec`, on its cloud."""
    resource: pulumi.CustomResource = POOL_PROGRAMS[spec.cloud](spec)
    pulumi.export("pool_id", spec.pool_id)
    pulumi.export("nodes", spec.desired_nodes)
    return resource


@dataclass(frozen=True, slots=True)
class ClusterBootstrap:
    """What one member cluster needs before gpufed dispatches to it.

    Names agree with what the Kubernetes backend dispatches to (docs/kubernetes.md): tenant `t` runs
    in namespace `<namespace_prefix>t` and Volcano queue `t`, and a gang names the federation's
    priority class as it is (`high`, not `gpufed-high`).
    """

    tenants: tuple[TenantId, ...]
    priority_classes: tuple[PriorityClass, ...]
    volcano: bool
    # gpufed's own namespace on the cluster (agents, secrets).
    namespace: str = "gpufed"
    namespace_prefix: str = "gpufed-"


def bootstrap(spec: ClusterBootstrap, provider: k8s.Provider | None = None) -> list[pulumi.CustomResource]:
    """The bootstrap's namespaces, PriorityClasses and (where Volcano runs) queues, in that order."""
    for field_name, name in (
        ("namespace", spec.namespace),
        *((f"tenants[{i}]", spec.namespace_prefix + t) for i, t in enumerate(spec.tenants)),
        *((f"priority_classes[{i}]", c.name) for i, c in enumerate(spec.priority_classes)),
    ):
        if not _DNS_LABEL.fullmatch(name):
            raise InvalidPoolSpec(field_name, f"{name!r} is not a DNS label")
    opts = pulumi.ResourceOptions(provider=provider)
    created: list[pulumi.CustomResource] = [
        k8s.core.v1.Namespace(
            spec.namespace,
            metadata={"name": spec.namespace, "labels": {MANAGED_BY: "gpufed"}},
            opts=opts,
        )
    ]
    for tenant in spec.tenants:
        name = spec.namespace_prefix + tenant
        created.append(
            k8s.core.v1.Namespace(
                name,
                metadata={"name": name, "labels": {MANAGED_BY: "gpufed", LABEL_TENANT: tenant}},
                opts=opts,
            )
        )
    for cls in spec.priority_classes:
        created.append(
            k8s.scheduling.v1.PriorityClass(
                f"priority-{cls.name}",
                metadata={"name": cls.name, "labels": {MANAGED_BY: "gpufed"}},
                value=cls.value,
                global_default=False,
                # gpufed's placer chooses every victim itself (whole gangs, with a grace period);
                # the kube-scheduler must not evict pods of its own accord to seat a gang.
                preemption_policy="Never",
                description=f"gpufed priority class {cls.name}"
                + ("" if cls.preemptible else " (never preempted by gpufed)"),
                opts=opts,
            )
        )
    if spec.volcano:
        for tenant in spec.tenants:
            created.append(
                k8s.apiextensions.CustomResource(
                    f"queue-{tenant}",
                    api_version="scheduling.volcano.sh/v1beta1",
                    kind="Queue",
                    metadata={"name": tenant, "labels": {MANAGED_BY: "gpufed", LABEL_TENANT: tenant}},
                    spec={"weight": 1, "reclaimable": True},
                    opts=opts,
                )
            )
    return created
