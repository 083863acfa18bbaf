"""The node-pool programs under Pulumi's mocks: what each declares (GPU type and count, spot, taints,
labels, bounds, autoscaler-owned counts), and specs our own validation refuses before Pulumi."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pulumi
import pytest

from iac.pools import Cloud, InvalidPoolSpec, PoolSpec, Taint, validate


class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None


@pytest.fixture
def mocks() -> Iterator[Mocks]:
    # Pulumi's runtime runs on the thread's current event loop; pytest-asyncio's tests leave none
    # behind when they close theirs, so this test brings its own.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    m = Mocks()
    pulumi.runtime.set_mocks(m, preview=False)
    yield m
    asyncio.set_event_loop(None)
    loop.close()


AWS = PoolSpec(
    cloud=Cloud.AWS,
    cluster="aws-us-east-1",
    name="h100-spot",
    gpu_type="H100",
    instance_type="p5.48xlarge",
    region="us-east-1",
    min_nodes=0,
    max_nodes=4,
    desired_nodes=2,
    spot=True,
    labels=(("team", "research"),),
    settings=(
        ("eksCluster", "gpu-prod"),
        ("nodeRoleArn", "arn:aws:iam::1:role/nodes"),
        ("subnetIds", "s-1,s-2"),
    ),
)
GCP = PoolSpec(
    cloud=Cloud.GCP,
    cluster="gcp-us-east4",
    name="a100",
    gpu_type="A100",
    instance_type="a2-highgpu-8g",
    region="us-east4",
    zone="us-east4-c",
    min_nodes=1,
    max_nodes=6,
    desired_nodes=1,
    autoscaled=True,
    spot=True,
    settings=(("gkeCluster", "train"), ("project", "ml-prod")),
)
AZURE = PoolSpec(
    cloud=Cloud.AZURE,
    cluster="azure-eastus",
    name="nd-h100",
    gpu_type="H100",
    instance_type="Standard_ND96isr_H100_v5",
    region="eastus",
    min_nodes=0,
    max_nodes=3,
    desired_nodes=1,
    spot=True,
    spot_max_usd_per_hour=40.0,
    settings=(("resourceGroup", "rg-ml"), ("aksCluster", "aks-train")),
)


def _declare(mocks: Mocks, build: Callable[[], Any]) -> dict[str, Any]:
    @pulumi.runtime.test  # type: ignore[misc]
    def run() -> Any:
        return build().urn.apply(lambda _: None)

    run()
    (resource,) = [r for r in mocks.resources if not r.typ.startswith("pulumi:")]
    return {"type": resource.typ, **resource.inputs, "_opts": resource}


def test_eks_node_group_is_spot_h100_with_the_nvidia_ami_taints_labels_and_bounds(mocks: Mocks) -> None:
    from iac.programs import eks_node_group

    r = _declare(mocks, lambda: eks_node_group(AWS))
    assert r["type"] == "aws:eks/nodeGroup:NodeGroup"
    assert (r["instanceTypes"], r["amiType"], r["capacityType"]) == (
        ["p5.48xlarge"],
        "AL2023_x86_64_NVIDIA",
        "SPOT",
    )
    assert r["scalingConfig"] == {"minSize": 0, "maxSize": 4, "desiredSize": 2}
    assert r["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert r["labels"] == {
        "team": "research",
        "gpufed.io/pool": "aws-us-east-1-h100-spot",
        "gpufed.io/gpu-type": "H100",
        "gpufed.io/cluster": "aws-us-east-1",
        "gpufed.io/capacity-type": "spot",
    }
    assert (r["clusterName"], r["subnetIds"]) == ("gpu-prod", ["s-1", "s-2"])


def test_gke_node_pool_attaches_accelerators_with_the_driver_and_leaves_the_count_to_the_autoscaler(
    mocks: Mocks,
) -> None:
    from iac.programs import gke_node_pool

    r = _declare(mocks, lambda: gke_node_pool(GCP))
    assert r["type"] == "gcp:container/nodePool:NodePool"
    config = r["nodeConfig"]
    assert (config["machineType"], config["spot"]) == ("a2-highgpu-8g", True)
    (accelerator,) = config["guestAccelerators"]
    assert (accelerator["type"], accelerator["count"]) == ("nvidia-tesla-a100", 8)
    assert accelerator["gpuDriverInstallationConfig"] == {"gpuDriverVersion": "LATEST"}
    assert r["autoscaling"] == {"minNodeCount": 1, "maxNodeCount": 6}
    assert "nodeCount" not in r
    assert config["labels"]["gpufed.io/gpu-type"] == "A100"
    assert config["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]


def test_aks_agent_pool_is_spot_with_delete_eviction_and_a_price_cap(mocks: Mocks) -> None:
    from iac.programs import aks_agent_pool

    r = _declare(mocks, lambda: aks_agent_pool(AZURE))
    assert r["type"] == "azure-native:containerservice:AgentPool"
    assert (r["vmSize"], r["scaleSetPriority"], r["scaleSetEvictionPolicy"]) == (
        "Standard_ND96isr_H100_v5",
        "Spot",
        "Delete",
    )
    assert (r["spotMaxPrice"], r["count"], r["enableAutoScaling"]) == (40.0, 1, False)
    assert r["nodeTaints"] == ["nvidia.com/gpu=present:NoSchedule"]
    assert r["nodeLabels"]["gpufed.io/cluster"] == "azure-eastus"


def test_an_autoscaled_pool_tells_pulumi_to_ignore_the_node_count() -> None:
    from iac.programs import _ignore_count

    assert _ignore_count(replace(AWS, autoscaled=True), "scalingConfig.desiredSize").ignore_changes == [
        "scalingConfig.desiredSize"
    ]
    assert _ignore_count(AWS, "scalingConfig.desiredSize").ignore_changes is None


def test_the_bootstrap_makes_namespaces_priority_classes_and_volcano_queues(mocks: Mocks) -> None:
    from iac.programs import bootstrap

    @pulumi.runtime.test  # type: ignore[misc]
    def run() -> Any:
        made = bootstrap(
            namespace="gpufed",
            tenants=["vision", "nlp"],
            priority_classes=[("low", 100), ("urgent", 1000)],
            volcano=True,
        )
        return pulumi.Output.all(*[r.urn for r in made])

    run()
    kinds = sorted((r.typ, r.name) for r in mocks.resources if not r.typ.startswith("pulumi:"))
    assert kinds == [
        ("kubernetes:core/v1:Namespace", "gpufed"),
        ("kubernetes:core/v1:Namespace", "gpufed-nlp"),
        ("kubernetes:core/v1:Namespace", "gpufed-vision"),
        ("kubernetes:scheduling.k8s.io/v1:PriorityClass", "gpufed-low"),
        ("kubernetes:scheduling.k8s.io/v1:PriorityClass", "gpufed-urgent"),
        ("kubernetes:scheduling.volcano.sh/v1beta1:Queue", "queue-nlp"),
        ("kubernetes:scheduling.volcano.sh/v1beta1:Queue", "queue-vision"),
    ]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param(
            {"instance_type": "p5.48xlarge", "gpu_type": "A100"}, "gpu_type", id="type-the-instance-lacks"
        ),
        pytest.param({"instance_type": "m5.large"}, "instance_type", id="not-a-gpu-instance"),
        pytest.param({"min_nodes": 3, "max_nodes": 2, "desired_nodes": 2}, "max_nodes", id="min-above-max"),
        pytest.param({"desired_nodes": 9}, "desired_nodes", id="desired-above-max"),
        pytest.param({"max_nodes": 0, "desired_nodes": 0}, "max_nodes", id="empty-pool"),
        pytest.param({"spot_max_usd_per_hour": 30.0}, "spot_max_usd_per_hour", id="price-cap-on-aws"),
        pytest.param(
            {"taints": (Taint("nvidia.com/gpu", "x", "Sometimes"),)}, "taints[0].effect", id="bad-effect"
        ),
        pytest.param({"labels": (("bad key!", "v"),)}, "labels['bad key!']", id="bad-label-key"),
        pytest.param({"labels": (("gpufed.io/pool", "mine"),)}, "labels['gpufed.io/pool']", id="own-label"),
        pytest.param({"name": "H100_Spot"}, "name", id="name-not-dns"),
        pytest.param({"settings": ()}, "settings.eksCluster", id="no-cluster-to-join"),
    ],
)
def test_invalid_pool_specs_are_refused_before_pulumi(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidPoolSpec) as refused:
        validate(replace(AWS, **change))
    assert refused.value.field == field


def test_the_valid_specs_pass() -> None:
    for spec in (AWS, GCP, AZURE):
        assert validate(spec) is spec
