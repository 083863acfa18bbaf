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

from collections.abc import Sequence

import pulumi
import pulumi_aws as aws
import pulumi_azure_native as azure_native
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from iac.pools import Cloud, PoolSpec, validate

# EKS applies NoSchedule as NO_SCHEDULE and so on.
_EKS_EFFECT = {
    "NoSchedule": "NO_SCHEDULE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
}
_GKE_EFFECT = _EKS_EFFECT


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
        # Amazon Linux 2023 with the NVIDIA driver and container toolkit.
        ami_type="AL2023_x86_64_NVIDIA",
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
        tags={"gpufed:pool": spec.pool_id, "gpufed:cluster": spec.cluster, "gpufed:gpu-type": spec.gpu_type},
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
    return gcp.container.NodePool(
        spec.name,
        name=spec.name,
        cluster=spec.setting("gkeCluster"),
        project=spec.setting("project"),
        location=spec.zone or spec.region,
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
            taints=[
                gcp.container.NodePoolNodeConfigTaintArgs(
                    key=t.key, value=t.value, effect=_GKE_EFFECT[t.effect]
                )
                for t in spec.taints
            ],
            oauth_scopes=["https://www.googleapis.com/auth/cloud-platform"],
        ),
        opts=_ignore_count(spec, "nodeCount", "initialNodeCount"),
    )


def aks_agent_pool(spec: PoolSpec) -> azure_native.containerservice.AgentPool:
    spec = validate(spec)
    spot = spec.spot
    return azure_native.containerservice.AgentPool(
        spec.name,
        agent_pool_name=spec.name.replace("-", "")[:12],
        resource_group_name=spec.setting("resourceGroup"),
        resource_name_=spec.setting("aksCluster"),
        vm_size=spec.instance_type,
        mode="User",
        os_type="Linux",
        count=spec.desired_nodes,
        enable_auto_scaling=spec.autoscaled,
        min_count=spec.min_nodes if spec.autoscaled else None,
        max_count=spec.max_nodes if spec.autoscaled else None,
        scale_set_priority="Spot" if spot else "Regular",
        # A spot VM evicted is deleted, not stopped: a stopped GPU VM still bills its disk and its quota.
        scale_set_eviction_policy="Delete" if spot else None,
        spot_max_price=(spec.spot_max_usd_per_hour or -1.0) if spot else None,
        node_labels=spec.node_labels(),
        node_taints=[f"{t.key}={t.value}:{t.effect}" for t in spec.taints],
        availability_zones=[spec.zone] if spec.zone else None,
        opts=_ignore_count(spec, "count"),
    )


POOL_PROGRAMS = {Cloud.AWS: eks_node_group, Cloud.GCP: gke_node_pool, Cloud.AZURE: aks_agent_pool}


def pool_program(spec: PoolSpec) -> pulumi.CustomResource:
    """The node pool of `spec`, on its cloud."""
    resource: pulumi.CustomResource = POOL_PROGRAMS[spec.cloud](spec)
    pulumi.export("pool_id", spec.pool_id)
    pulumi.export("nodes", spec.desired_nodes)
    return resource


def bootstrap(
    *,
    namespace: str,
    tenants: Sequence[str],
    priority_classes: Sequence[tuple[str, int]],
    volcano: bool,
    provider: k8s.Provider | None = None,
) -> list[pulumi.CustomResource]:
    """What a member cluster needs before gpufed dispatches to it: its namespace and one per tenant,
    the federation's PriorityClasses, and a Volcano Queue per tenant where Volcano runs."""
    opts = pulumi.ResourceOptions(provider=provider)
    created: list[pulumi.CustomResource] = [
        k8s.core.v1.Namespace(
            namespace,
            metadata={"name": namespace, "labels": {"app.kubernetes.io/managed-by": "gpufed"}},
            opts=opts,
        )
    ]
    for tenant in tenants:
        name = f"gpufed-{tenant}"
        created.append(
            k8s.core.v1.Namespace(
                name,
                metadata={
                    "name": name,
                    "labels": {"app.kubernetes.io/managed-by": "gpufed", "gpufed.io/tenant": tenant},
                },
                opts=opts,
            )
        )
    for cls, value in priority_classes:
        created.append(
            k8s.scheduling.v1.PriorityClass(
                f"gpufed-{cls}",
                metadata={"name": f"gpufed-{cls}", "labels": {"app.kubernetes.io/managed-by": "gpufed"}},
                value=value,
                global_default=False,
                preemption_policy="PreemptLowerPriority",
                description=f"gpufed priority class {cls}",
                opts=opts,
            )
        )
    if volcano:
        for tenant in tenants:
            created.append(
                k8s.apiextensions.CustomResource(
                    f"queue-{tenant}",
                    api_version="scheduling.volcano.sh/v1beta1",
                    kind="Queue",
                    metadata={"name": f"gpufed-{tenant}", "labels": {"gpufed.io/tenant": tenant}},
                    spec={"weight": 1, "reclaimable": True},
                    opts=opts,
                )
            )
    return created
