"""The node-pool programs under Pulumi's mocks: what each declares (GPU type and count, spot, taints,
labels, bounds, autoscaler-owned counts ignored), the cluster bootstrap, and specs our own
validation refuses before Pulumi."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pulumi
import pytest
from pulumi.runtime.mocks import MockMonitor

from iac.errors import InvalidPoolSpec, PermanentIacError
from iac.pools import Cloud, PoolSpec, ProviderConfig, Taint, validate
from placement.model import CapacityKind, ClusterName, GpuType, PriorityClass, TenantId


@dataclass
class Declared:
    """One resource as the engine was asked to register it."""

    typ: str
    name: str
    inputs: dict[str, Any]
    ignore_changes: list[str] = field(default_factory=list)


class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.declared: list[Declared] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        if not args.typ.startswith("pulumi:"):
            self.declared.append(Declared(args.typ, args.name, dict(args.inputs)))
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None


class RecordingMonitor(MockMonitor):
    """The mock monitor, also keeping each registration's resource options (`ignore_changes`)."""

    def __init__(self, mocks: Mocks) -> None:
        super().__init__(mocks)
        self.ignore_changes: dict[str, list[str]] = {}

    def RegisterResource(self, request: Any) -> Any:
        self.ignore_changes[request.name] = list(request.ignoreChanges)
        # pulumi's MockMonitor.RegisterResource has no annotations.
        return super().RegisterResource(request)  # type: ignore[no-untyped-call]


# The recorded declarations and the monitor that saw their options, as the `mocks` fixture gives them.
MockPair = tuple[Mocks, RecordingMonitor]


@pytest.fixture
def mocks() -> Iterator[MockPair]:
    # Pulumi's runtime runs on the thread's current event loop; pytest-asyncio's tests leave none
    # behind when they close theirs, so these tests bring their own.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    m = Mocks()
    monitor = RecordingMonitor(m)
    pulumi.runtime.set_mocks(m, preview=False, monitor=monitor)
    yield m, monitor
    asyncio.set_event_loop(None)
    loop.close()


AWS = PoolSpec(
    cloud=Cloud.AWS,
    cluster=ClusterName("aws-us-east-1"),
    name="h100-spot",
    gpu_type=GpuType("H100"),
    instance_type="p5.48xlarge",
    region="us-east-1",
    min_nodes=0,
    max_nodes=4,
    desired_nodes=2,
    kind=CapacityKind.SPOT,
    labels=(("team", "research"),),
    settings=(
        ("eksCluster", "gpu-prod"),
        ("nodeRoleArn", "arn:aws:iam::1:role/nodes"),
        ("subnetIds", "s-1,s-2"),
    ),
)
GCP = PoolSpec(
    cloud=Cloud.GCP,
    cluster=ClusterName("gcp-us-east4"),
    name="a100",
    gpu_type=GpuType("A100"),
    instance_type="a2-highgpu-8g",
    region="us-east4",
    zone="us-east4-c",
    min_nodes=1,
    max_nodes=6,
    desired_nodes=1,
    autoscaled=True,
    kind=CapacityKind.SPOT,
    settings=(("gkeCluster", "train"), ("project", "ml-prod")),
)
AZURE = PoolSpec(
    cloud=Cloud.AZURE,
    cluster=ClusterName("azure-eastus"),
    name="ndh100",
    gpu_type=GpuType("H100"),
    instance_type="Standard_ND96isr_H100_v5",
    region="eastus",
    zone="2",
    min_nodes=0,
    max_nodes=3,
    desired_nodes=1,
    kind=CapacityKind.SPOT,
    spot_max_usd_per_hour=40.0,
    settings=(("resourceGroup", "rg-ml"), ("aksCluster", "aks-train")),
)


def _declare(mocks: MockPair, build: Callable[[], Any]) -> Declared:
    @pulumi.runtime.test  # type: ignore[untyped-decorator]  # pulumi's test decorator has no annotations
    def run() -> Any:
        return build().urn.apply(lambda _: None)

    run()
    recorded, monitor = mocks
    (resource,) = recorded.declared
    resource.ignore_changes = monitor.ignore_changes[resource.name]
    return resource


JOIN_LABELS = {"gpufed.io/pool", "gpufed.io/gpu-type", "gpufed.io/cluster", "gpufed.io/capacity-type"}


def test_eks_node_group_is_spot_h100_with_the_nvidia_ami_taints_labels_and_bounds(mocks: MockPair) -> None:
    from iac.programs import eks_node_group

    r = _declare(mocks, lambda: eks_node_group(AWS))
    assert r.typ == "aws:eks/nodeGroup:NodeGroup"
    i = r.inputs
    assert (i["instanceTypes"], i["amiType"], i["capacityType"]) == (
        ["p5.48xlarge"],
        "AL2023_x86_64_NVIDIA",
        "SPOT",
    )
    assert i["scalingConfig"] == {"minSize": 0, "maxSize": 4, "desiredSize": 2}
    assert i["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert i["labels"] == {
        "team": "research",
        "gpufed.io/pool": "h100-spot",
        "gpufed.io/gpu-type": "H100",
        "gpufed.io/cluster": "aws-us-east-1",
        "gpufed.io/capacity-type": "spot",
    }
    assert (i["clusterName"], i["subnetIds"], i["region"]) == ("gpu-prod", ["s-1", "s-2"], "us-east-1")
    assert r.ignore_changes == [], "Pulumi owns the count of a pool no autoscaler owns"


def test_eks_on_demand_with_the_al2_gpu_image_and_an_autoscaler_owned_count(mocks: MockPair) -> None:
    from iac.programs import eks_node_group

    spec = replace(AWS, kind=CapacityKind.ON_DEMAND, image="AL2_x86_64_GPU", autoscaled=True, min_nodes=1)
    r = _declare(mocks, lambda: eks_node_group(spec))
    assert (r.inputs["capacityType"], r.inputs["amiType"]) == ("ON_DEMAND", "AL2_x86_64_GPU")
    assert r.inputs["labels"]["gpufed.io/capacity-type"] == "on-demand"
    assert r.ignore_changes == ["scalingConfig.desiredSize"]


def test_gke_node_pool_attaches_accelerators_with_the_driver_and_leaves_the_count_to_the_autoscaler(
    mocks: MockPair,
) -> None:
    from iac.programs import gke_node_pool

    r = _declare(mocks, lambda: gke_node_pool(GCP))
    assert r.typ == "gcp:container/nodePool:NodePool"
    i = r.inputs
    config = i["nodeConfig"]
    assert (config["machineType"], config["spot"]) == ("a2-highgpu-8g", True)
    (accelerator,) = config["guestAccelerators"]
    assert (accelerator["type"], accelerator["count"]) == ("nvidia-tesla-a100", 8)
    assert accelerator["gpuDriverInstallationConfig"] == {"gpuDriverVersion": "LATEST"}
    assert i["autoscaling"] == {"minNodeCount": 1, "maxNodeCount": 6}
    assert (i.get("nodeCount"), i["initialNodeCount"]) == (None, 1)
    assert (i["location"], i["nodeLocations"]) == ("us-east4", ["us-east4-c"])
    assert set(config["labels"]) >= JOIN_LABELS
    assert config["labels"]["gpufed.io/gpu-type"] == "A100"
    assert config["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert sorted(r.ignore_changes) == ["initialNodeCount", "nodeCount"]


def test_gke_fixed_size_on_demand_pool_with_a_reservation(mocks: MockPair) -> None:
    from iac.programs import gke_node_pool

    spec = replace(
        GCP, autoscaled=False, kind=CapacityKind.ON_DEMAND, reservation="a100-res", desired_nodes=3
    )
    r = _declare(mocks, lambda: gke_node_pool(spec))
    i = r.inputs
    assert (i["nodeCount"], i.get("autoscaling"), i["nodeConfig"]["spot"]) == (3, None, False)
    assert i["nodeConfig"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["a100-res"],
    }
    assert r.ignore_changes == []


def test_aks_agent_pool_is_spot_with_delete_eviction_and_a_price_cap(mocks: MockPair) -> None:
    from iac.programs import aks_agent_pool

    r = _declare(mocks, lambda: aks_agent_pool(AZURE))
    assert r.typ == "azure-native:containerservice:AgentPool"
    i = r.inputs
    assert (i["vmSize"], i["scaleSetPriority"], i["scaleSetEvictionPolicy"]) == (
        "Standard_ND96isr_H100_v5",
        "Spot",
        "Delete",
    )
    assert (i["spotMaxPrice"], i["count"], i["enableAutoScaling"], i["mode"]) == (40.0, 1, False, "User")
    assert (i["agentPoolName"], i["resourceName"], i["availabilityZones"]) == ("ndh100", "aks-train", ["2"])
    assert i["nodeTaints"] == ["nvidia.com/gpu=present:NoSchedule"]
    assert set(i["nodeLabels"]) >= JOIN_LABELS
    assert i["nodeLabels"]["gpufed.io/cluster"] == "azure-eastus"
    assert r.ignore_changes == []


def test_aks_autoscaled_on_demand_pool_has_bounds_and_leaves_the_count(mocks: MockPair) -> None:
    from iac.programs import aks_agent_pool

    spec = replace(
        AZURE,
        kind=CapacityKind.ON_DEMAND,
        spot_max_usd_per_hour=None,
        autoscaled=True,
        min_nodes=1,
        max_nodes=3,
    )
    r = _declare(mocks, lambda: aks_agent_pool(spec))
    i = r.inputs
    assert (i["scaleSetPriority"], i.get("scaleSetEvictionPolicy"), i.get("spotMaxPrice")) == (
        "Regular",
        None,
        None,
    )
    assert (i["enableAutoScaling"], i["minCount"], i["maxCount"]) == (True, 1, 3)
    assert r.ignore_changes == ["count"]


def test_pool_program_exports_the_pool_and_its_count(mocks: MockPair) -> None:
    from iac.programs import pool_program

    _declare(mocks, lambda: pool_program(AWS))
    recorded, _ = mocks
    assert [d.typ for d in recorded.declared] == ["aws:eks/nodeGroup:NodeGroup"]


def test_the_bootstrap_makes_the_names_the_kubernetes_backend_dispatches_to(mocks: MockPair) -> None:
    from clusters.kubernetes.names import namespace_for, queue_for
    from iac.programs import ClusterBootstrap, bootstrap

    spec = ClusterBootstrap(
        tenants=(TenantId("vision"), TenantId("nlp")),
        priority_classes=(PriorityClass("low", 100), PriorityClass("urgent", 100000, preemptible=False)),
        volcano=True,
    )

    @pulumi.runtime.test  # type: ignore[untyped-decorator]  # pulumi's test decorator has no annotations
    def run() -> Any:
        return pulumi.Output.all(*[r.urn for r in bootstrap(spec)])

    run()
    recorded, _ = mocks
    made = sorted((d.typ, d.inputs["metadata"]["name"]) for d in recorded.declared)
    assert made == [
        ("kubernetes:core/v1:Namespace", "gpufed"),
        ("kubernetes:core/v1:Namespace", namespace_for("gpufed-", TenantId("nlp"))),
        ("kubernetes:core/v1:Namespace", namespace_for("gpufed-", TenantId("vision"))),
        ("kubernetes:scheduling.k8s.io/v1:PriorityClass", "low"),
        ("kubernetes:scheduling.k8s.io/v1:PriorityClass", "urgent"),
        ("kubernetes:scheduling.volcano.sh/v1beta1:Queue", queue_for(TenantId("nlp"))),
        ("kubernetes:scheduling.volcano.sh/v1beta1:Queue", queue_for(TenantId("vision"))),
    ]
    classes = {
        d.inputs["metadata"]["name"]: d.inputs for d in recorded.declared if d.typ.endswith("PriorityClass")
    }
    assert (classes["urgent"]["value"], classes["urgent"]["preemptionPolicy"]) == (100000, "Never")
    queue = next(d.inputs for d in recorded.declared if d.typ.endswith("Queue"))
    assert queue["spec"] == {"weight": 1, "reclaimable": True}


def test_without_volcano_the_bootstrap_makes_no_queue(mocks: MockPair) -> None:
    from iac.programs import ClusterBootstrap, bootstrap

    @pulumi.runtime.test  # type: ignore[untyped-decorator]  # pulumi's test decorator has no annotations
    def run() -> Any:
        made = bootstrap(ClusterBootstrap(tenants=(TenantId("vision"),), priority_classes=(), volcano=False))
        return pulumi.Output.all(*[r.urn for r in made])

    run()
    recorded, _ = mocks
    assert [d.typ for d in recorded.declared] == ["kubernetes:core/v1:Namespace"] * 2


def test_a_bootstrap_with_a_tenant_that_is_no_dns_label_is_refused() -> None:
    from iac.programs import ClusterBootstrap, bootstrap

    with pytest.raises(InvalidPoolSpec, match=r"tenants\[0\]"):
        bootstrap(ClusterBootstrap(tenants=(TenantId("Vision_Team"),), priority_classes=(), volcano=True))
    with pytest.raises(InvalidPoolSpec, match=r"tenants\[0\]"):
        bootstrap(ClusterBootstrap(tenants=(TenantId("vision\n"),), priority_classes=(), volcano=True))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param(replace(AWS, gpu_type=GpuType("A100")), "gpu_type", id="type-the-instance-lacks"),
        pytest.param(replace(AWS, gpu_type=GpuType("MI300X")), "gpu_type", id="type-not-on-this-cloud"),
        pytest.param(
            replace(GCP, gpu_type=GpuType("H200"), instance_type="a3-highgpu-8g"),
            "gpu_type",
            id="h200-not-on-gcp",
        ),
        pytest.param(replace(AWS, instance_type="m5.large"), "instance_type", id="not-a-gpu-instance"),
        pytest.param(replace(AWS, gpus_per_node=4), "gpus_per_node", id="gpus-per-node-not-the-instances"),
        pytest.param(
            replace(AWS, min_nodes=3, max_nodes=2, desired_nodes=2), "max_nodes", id="min-above-max"
        ),
        pytest.param(replace(AWS, max_nodes=1001, desired_nodes=2), "max_nodes", id="above-1000-nodes"),
        pytest.param(replace(AWS, min_nodes=-1), "max_nodes", id="negative-min"),
        pytest.param(replace(AWS, desired_nodes=9), "desired_nodes", id="desired-above-max"),
        pytest.param(replace(AWS, max_nodes=0, desired_nodes=0), "max_nodes", id="empty-pool"),
        pytest.param(replace(AWS, usd_per_gpu_hour=-1.0), "usd_per_gpu_hour", id="negative-price"),
        pytest.param(replace(AWS, kind=CapacityKind.PRIVATE), "kind", id="private-is-no-cloud-pool"),
        pytest.param(
            replace(AWS, spot_max_usd_per_hour=30.0), "spot_max_usd_per_hour", id="price-cap-on-aws"
        ),
        pytest.param(
            replace(AZURE, kind=CapacityKind.ON_DEMAND), "spot_max_usd_per_hour", id="price-cap-without-spot"
        ),
        pytest.param(
            replace(GCP, reservation="res-1"), "reservation", id="spot-cannot-consume-a-reservation"
        ),
        pytest.param(
            replace(AWS, kind=CapacityKind.ON_DEMAND, reservation="cr-1"),
            "reservation",
            id="reservation-on-eks",
        ),
        pytest.param(replace(AWS, image="AL2_x86_64"), "image", id="eks-image-without-gpu-driver"),
        pytest.param(replace(GCP, image="AL2023_x86_64_NVIDIA"), "image", id="eks-image-on-gke"),
        pytest.param(
            replace(AWS, taints=(Taint("nvidia.com/gpu", "x", "Sometimes"),)),
            "taints[0].effect",
            id="bad-effect",
        ),
        pytest.param(replace(AWS, taints=(Taint("-gpu", "x"),)), "taints[0].key", id="bad-taint-key"),
        pytest.param(replace(AWS, taints=(Taint("gpu", "a b"),)), "taints[0].value", id="bad-taint-value"),
        pytest.param(replace(AWS, labels=(("bad key!", "v"),)), "labels['bad key!']", id="bad-label-key"),
        pytest.param(
            replace(AWS, labels=(("Example.COM/x", "v"),)), "labels['Example.COM/x']", id="prefix-not-dns"
        ),
        pytest.param(replace(AWS, labels=(("team", "x" * 64),)), "labels['team']", id="label-value-too-long"),
        pytest.param(replace(AWS, labels=(("team", "a"), ("team", "b"))), "labels['team']", id="label-twice"),
        pytest.param(
            replace(AWS, labels=(("gpufed.io/pool", "mine"),)), "labels['gpufed.io/pool']", id="own-label"
        ),
        pytest.param(replace(AWS, name="H100_Spot"), "name", id="name-not-dns"),
        # `$` matches before a final newline: names are matched whole.
        pytest.param(replace(AWS, name="h100-spot\n"), "name", id="name-with-trailing-newline"),
        pytest.param(replace(AWS, region="us-west-2\n"), "region", id="region-with-trailing-newline"),
        pytest.param(
            replace(AWS, taints=(Taint("gpu", "x\n"),)), "taints[0].value", id="taint-value-newline"
        ),
        pytest.param(replace(AWS, cluster=ClusterName("x" * 64)), "cluster", id="cluster-too-long"),
        pytest.param(replace(AZURE, name="nd-h100-spot"), "name", id="aks-pool-name-rules"),
        pytest.param(replace(AWS, region=""), "region", id="no-region"),
        pytest.param(replace(AWS, zone="us-west-2a"), "zone", id="zone-of-another-region"),
        pytest.param(replace(AZURE, zone="eastus-1"), "zone", id="azure-zone-is-a-number"),
        pytest.param(replace(AWS, settings=()), "settings.eksCluster", id="no-cluster-to-join"),
        pytest.param(
            replace(GCP, settings=(("gkeCluster", "train"),)), "settings.project", id="no-gcp-project"
        ),
    ],
)
def test_invalid_pool_specs_are_refused_before_pulumi(spec: PoolSpec, field: str, mocks: MockPair) -> None:
    from iac.programs import pool_program

    with pytest.raises(InvalidPoolSpec) as refused:
        validate(spec)
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")
    assert isinstance(refused.value, PermanentIacError)
    with pytest.raises(InvalidPoolSpec):
        pool_program(spec)
    recorded, _ = mocks
    assert recorded.declared == [], "nothing reached Pulumi"


@pytest.mark.parametrize(
    ("spec", "provider", "field"),
    [
        pytest.param(AZURE, ProviderConfig(Cloud.AZURE, spot=False), "kind", id="account-without-spot"),
        pytest.param(
            AZURE, ProviderConfig(Cloud.AZURE, regions=("westeurope",)), "region", id="azure-region"
        ),
        pytest.param(
            AWS, ProviderConfig(Cloud.AWS, regions=("eu-west-1",)), "region", id="region-not-the-accounts"
        ),
    ],
)
def test_a_provider_config_refuses_what_the_account_cannot_do(
    spec: PoolSpec, provider: ProviderConfig, field: str
) -> None:
    with pytest.raises(InvalidPoolSpec) as refused:
        validate(spec, provider)
    assert refused.value.field == field


@pytest.mark.parametrize("spec", [AWS, GCP, AZURE], ids=["aws", "gcp", "azure"])
def test_valid_specs_pass_with_the_gpu_count_filled_in(spec: PoolSpec) -> None:
    checked = validate(spec, ProviderConfig(spec.cloud, regions=(spec.region,)))
    assert checked.gpus_per_node == 8
    assert replace(checked, gpus_per_node=0) == spec


@pytest.mark.parametrize(
    ("autoscaled", "nodes", "bounds"),
    [
        pytest.param(False, 6, (0, 6, 6), id="fixed-widens-max"),
        pytest.param(False, 0, (0, 4, 0), id="fixed-to-zero"),
        pytest.param(True, 3, (3, 4, 3), id="autoscaled-becomes-the-floor"),
    ],
)
def test_scaling_a_spec_to_n_nodes(autoscaled: bool, nodes: int, bounds: tuple[int, int, int]) -> None:
    sized = replace(AWS, autoscaled=autoscaled).with_nodes(nodes)
    assert (sized.min_nodes, sized.max_nodes, sized.desired_nodes) == bounds
    validate(sized)
