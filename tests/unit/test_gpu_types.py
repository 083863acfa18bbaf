"""GPU types (issue 32): the registry, node labels read into it, names checked at submission, and
the placer never giving a job GPUs of less memory than it asked for."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from clusters.kubernetes.inventory import PRODUCT_LABEL, node_info, pool_layout
from clusters.kubernetes.manifests import select_nodes
from federation.errors import InvalidSpec
from federation.spec.gpu_request import check_gpu_request
from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES
from federation.spec.training_job import parse_manifest, render_manifest
from federation.store.config_policy import parse_settings
from federation.store.records import SchedulingSettings, settings_from_dict, settings_to_dict
from placement.gpu_types import BUILTIN_TYPES, GpuRegistry, node_type
from placement.model import CapacityKind, GpuType, Provider, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import a_cluster, a_gang, a_snapshot, a_tenant

REGISTRY = GpuRegistry()
FAMILIES = tuple((m.name, m.family) for m in BUILTIN_TYPES if m.name != m.family)


@pytest.mark.parametrize(
    ("label", "memory_mib", "expected"),
    [
        # NVIDIA GPU feature discovery's nvidia.com/gpu.product
        ("NVIDIA-A100-SXM4-80GB", None, "A100-80GB"),
        ("NVIDIA-A100-SXM4-40GB", None, "A100-40GB"),
        ("NVIDIA-A100-PCIE-40GB", None, "A100-40GB"),
        ("NVIDIA-A100-80GB-PCIe", None, "A100-80GB"),
        ("NVIDIA-A100-SXM4", 40960, "A100-40GB"),  # the memory label tells
        ("NVIDIA-A100-SXM4", None, "A100"),  # nothing tells: the bare family
        ("NVIDIA-H100-80GB-HBM3", None, "H100-SXM"),
        ("NVIDIA-H100-PCIe", None, "H100-PCIE"),
        ("NVIDIA-H100-NVL", None, "H100-NVL"),
        ("NVIDIA-H200", 143771, "H200"),
        ("NVIDIA-L40S", None, "L40S"),
        ("NVIDIA-L4", None, "L4"),
        ("NVIDIA-A10G", None, "A10G"),
        ("Tesla-T4", None, "T4"),
        ("Tesla-V100-SXM2-16GB", None, "V100-16GB"),
        # GKE's cloud.google.com/gke-accelerator
        ("nvidia-tesla-a100", None, "A100-40GB"),
        ("nvidia-a100-80gb", None, "A100-80GB"),
        ("nvidia-h100-80gb", None, "H100-SXM"),
        ("nvidia-h100-mega-80gb", None, "H100-SXM"),
        ("nvidia-h200-141gb", None, "H200"),
        ("nvidia-l4", None, "L4"),
        ("nvidia-tesla-t4", None, "T4"),
        # Karpenter's karpenter.k8s.aws/instance-gpu-name (+ instance-gpu-memory in MiB)
        ("a100", 40960, "A100-40GB"),
        ("a100", 81920, "A100-80GB"),
        ("h100", 81920, "H100"),  # SXM and PCIe both have 80 GB: not told apart
        ("l40s", None, "L40S"),
        ("NVIDIA-Quadro-RTX-8000", None, None),
    ],
)
def test_node_labels_are_read_into_the_registry(
    label: str, memory_mib: int | None, expected: str | None
) -> None:
    assert REGISTRY.identify(label, memory_mib) == expected


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [("a100", "A100"), ("h100-sxm", "H100-SXM"), ("H10", "H100"), ("A100-80G", "A100-80GB"), ("L44", "L4")],
)
def test_an_unknown_name_gets_the_closest_known_ones(name: str, suggestion: str) -> None:
    assert not REGISTRY.is_known(name)
    assert suggestion in REGISTRY.suggest(name)


@pytest.mark.parametrize(
    ("requested", "memory", "expected"),
    [
        (("A100",), 0, ("A100", "A100-40GB", "A100-80GB")),
        (("A100",), 80, ("A100-80GB",)),  # a bare A100 pool promises only the smallest variant
        (("A100-80GB",), 0, ("A100-80GB",)),
        (("H100-SXM", "A100"), 80, ("H100-SXM", "A100-80GB")),
        ((), 141, ("H200", "B200", "MI300X")),
        (("Custom9",), 0, ("Custom9",)),  # a pool's own name is kept as it is without a bound
    ],
)
def test_a_family_stands_for_its_variants_and_memory_bounds_them(
    requested: tuple[str, ...], memory: int, expected: tuple[str, ...]
) -> None:
    assert REGISTRY.expand(tuple(GpuType(t) for t in requested), memory) == expected


def test_a_node_counts_as_the_variant_its_cluster_prices_else_the_family() -> None:
    assert node_type(GpuType("A100-80GB"), REGISTRY, {GpuType("A100-80GB"): 1}) == "A100-80GB"
    assert node_type(GpuType("A100-80GB"), REGISTRY, {GpuType("A100"): 1}) == "A100"  # gpuType: A100 pools
    assert node_type(GpuType("A100-80GB"), REGISTRY, None) == "A100"
    assert node_type(GpuType("A100"), REGISTRY, {GpuType("A100-80GB"): 1}) == "A100"  # never promoted


def _node(labels: dict[str, str], name: str = "n1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_inventory_reads_variants_from_gfd_and_from_gke_and_karpenter_labels() -> None:
    priced = {
        (GpuType("A100-80GB"), CapacityKind.ON_DEMAND): 1.0,
        (GpuType("A100-40GB"), CapacityKind.ON_DEMAND): 1.0,
        (GpuType("H100-SXM"), CapacityKind.ON_DEMAND): 1.0,
    }
    gfd = node_info(_node({PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}), Provider.AWS, priced)
    # GFD's product alone does not tell the variant; GKE's or Karpenter's label beside it does.
    gke = node_info(
        _node({PRODUCT_LABEL: "NVIDIA-A100-SXM4", "cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}),
        Provider.GCP,
        priced,
    )
    eks = node_info(
        _node({PRODUCT_LABEL: "NVIDIA-H100", "karpenter.k8s.aws/instance-gpu-name": "h100"}),
        Provider.AWS,
        priced,
    )
    gke_h100 = node_info(
        _node({PRODUCT_LABEL: "NVIDIA-H100", "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}),
        Provider.GCP,
        priced,
    )
    assert gfd is not None
    assert gke is not None
    assert eks is not None
    assert gke_h100 is not None
    assert (gfd.gpu_type, gke.gpu_type, gke_h100.gpu_type) == ("A100-80GB", "A100-40GB", "H100-SXM")
    assert eks.gpu_type == "H100"  # Karpenter's h100 does not tell SXM from PCIe: the family
    # A node without GFD's product label (GKE's own driver install) is named by its cloud's label,
    # and gpufed's pods select it by that label.
    l4 = node_info(_node({"cloud.google.com/gke-accelerator": "nvidia-l4"}), Provider.GCP, priced)
    assert l4 is not None
    assert (l4.gpu_type, l4.product_label, l4.product) == (
        "L4",
        "cloud.google.com/gke-accelerator",
        "nvidia-l4",
    )
    # A cloud label the registry cannot read names no GPU: the node stays out.
    assert (
        node_info(_node({"cloud.google.com/gke-accelerator": "nvidia-mystery"}), Provider.GCP, priced) is None
    )
    # A config whose pools say `gpuType: A100` (as before variants): the node is an A100, as it was.
    old = node_info(
        _node({PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}),
        Provider.AWS,
        {(GpuType("A100"), CapacityKind.ON_DEMAND): 1.0},
    )
    assert old is not None
    assert old.gpu_type == "A100"


# ---- at submission


def _spec(gpu_types: list[str] | None, memory: int | None = None) -> Any:
    spec: dict[str, Any] = {"tasks": [{"name": "w", "replicas": 2, "image": "busybox", "gpus": 8}]}
    if gpu_types is not None:
        spec["gpuTypes"] = gpu_types
    if memory is not None:
        spec["minGpuMemoryGiB"] = memory
    doc = {"apiVersion": "gpufed.io/v1", "kind": "TrainingJob", "metadata": {"name": "j"}, "spec": spec}
    return parse_manifest(yaml.safe_dump(doc), priority_classes=DEFAULT_PRIORITY_CLASSES)


@pytest.mark.parametrize(
    ("gpu_types", "field", "words"),
    [
        (["a100"], "spec.gpuTypes[0]", "unknown GPU type 'a100'; did you mean A100?"),
        (["H100", "H10"], "spec.gpuTypes[1]", "did you mean H100"),
        (["A100-80"], "spec.gpuTypes[0]", "A100-80GB"),
    ],
)
def test_an_unknown_type_is_refused_at_submission_naming_the_field_and_the_closest(
    gpu_types: list[str], field: str, words: str
) -> None:
    with pytest.raises(InvalidSpec) as caught:
        check_gpu_request(_spec(gpu_types), SchedulingSettings().gpu_registry())
    assert caught.value.field == field
    assert words in caught.value.rule


def test_memory_alone_is_a_request_and_too_much_memory_is_refused() -> None:
    spec = _spec(None, 80)
    assert spec.gpu_types == ()
    assert spec.min_gpu_memory_gib == 80
    check_gpu_request(spec, REGISTRY)
    assert "minGpuMemoryGiB: 80" in render_manifest(spec)
    with pytest.raises(InvalidSpec) as caught:
        check_gpu_request(_spec(["L4"], 80), REGISTRY)
    assert caught.value.field == "spec.minGpuMemoryGiB"
    with pytest.raises(InvalidSpec) as caught:
        _spec(None)
    assert caught.value.field == "spec.gpuTypes"


def test_admins_add_types_in_the_federation_config() -> None:
    settings = parse_settings({"gpuTypes": [{"name": "MI355X", "memoryGiB": 288, "speed": 3.0}]})
    registry = settings.gpu_registry()
    assert registry.is_known("MI355X")
    assert registry.memory_gib(GpuType("MI355X")) == 288
    check_gpu_request(_spec(["MI355X"]), registry)
    assert settings_from_dict(settings_to_dict(settings)) == settings
    with pytest.raises(InvalidSpec) as caught:
        parse_settings({"gpuTypes": [{"name": "A100", "memoryGiB": 40}]})
    assert caught.value.field == "gpuTypes[0].name"  # a family of built-in variants
    with pytest.raises(InvalidSpec) as caught:
        parse_settings({"gpuTypes": [{"name": "X1", "memoryGiB": 0}]})
    assert caught.value.field == "gpuTypes[0].memoryGiB"


# ---- placement


def _a100_cluster(free_80gb: int) -> Any:
    return (
        a_cluster("dc")
        .pool("A100-40GB", nodes=4, name="a100-40")
        .pool("A100", nodes=4, name="a100-legacy")
        .pool("A100-80GB", free=[free_80gb], name="a100-80")
    )


def test_an_80gb_job_never_lands_on_40gb_or_unstated_a100_nodes() -> None:
    job = a_gang("big").gang(1, gpus=8).build()
    job = replace(job, gpu_types=REGISTRY.expand((GpuType("A100"),), 80))
    full = plan(a_snapshot().queue(job).clusters(_a100_cluster(free_80gb=0)).build(), now=0.0)
    assert not full.admissions  # 8 free GPUs of 40 GB and of an unstated A100 on other nodes
    roomy = plan(a_snapshot().queue(job).clusters(_a100_cluster(free_80gb=8)).build(), now=0.0)
    assert [(a.job_id, a.gpu_type) for a in roomy.admissions] == [("big", "A100-80GB")]


def test_a_family_job_may_take_any_variant() -> None:
    job = replace(a_gang("any").gang(1, gpus=8).build(), gpu_types=REGISTRY.expand((GpuType("A100"),)))
    result = plan(a_snapshot().queue(job).clusters(_a100_cluster(free_80gb=0)).build(), now=0.0)
    assert [a.gpu_type for a in result.admissions] in (["A100"], ["A100-40GB"])


def test_a_cap_on_the_family_bounds_its_variants_together() -> None:
    gangs = [
        replace(a_gang(f"j{i}").tenant("t1").gang(1, gpus=8).build(), gpu_types=(GpuType(t),))
        for i, t in enumerate(("A100-40GB", "A100-80GB"))
    ]
    cluster = a_cluster("dc").pool("A100-40GB", nodes=2).pool("A100-80GB", nodes=2)
    snapshot = a_snapshot().queue(*gangs).clusters(cluster).tenants(a_tenant("t1").cap("A100", 8)).build()
    result = plan(replace(snapshot, gpu_families=FAMILIES), now=0.0)
    assert len(result.admissions) == 1  # 8 of the cap of 8: the other variant waits
    (waiting,) = result.waiting
    assert any("A100" in r.message for r in waiting.reasons)
    # Without the family map (a snapshot of an older caller) the variants were not bounded.
    assert len(plan(snapshot, now=0.0).admissions) == 2


def test_a_family_job_is_not_told_of_variants_no_cluster_has() -> None:
    job = replace(a_gang("fam").gang(1, gpus=8).build(), gpu_types=REGISTRY.expand((GpuType("A100"),)))
    full = a_cluster("dc").pool("A100", free=[0])
    snapshot = replace(a_snapshot().queue(job).clusters(full).build(), gpu_families=FAMILIES)
    (waiting,) = plan(snapshot, now=0.0).waiting
    assert [r.code for r in waiting.reasons] == [WaitCode.INSUFFICIENT_CAPACITY], waiting.reasons
    # A family no cluster has at all is still named.
    (nowhere,) = plan(replace(snapshot, clusters=()), now=0.0).waiting
    assert nowhere.reasons[0].code is WaitCode.NO_CLUSTER_HAS_GPU_TYPE


def test_pods_select_nodes_by_the_label_their_gpus_are_named_by() -> None:
    """GKE nodes without GPU feature discovery are selected by GKE's label; where a type's nodes are
    named both ways, only the GFD-labelled ones are counted and selected, never room no pod reaches."""
    priced = {(GpuType("L4"), CapacityKind.ON_DEMAND): 0.7}
    gke = [
        node_info(
            _node({"cloud.google.com/gke-accelerator": "nvidia-l4"}, name=f"gke-{i}"), Provider.GCP, priced
        )
        for i in range(2)
    ]
    nodes = [n for n in gke if n is not None]
    selection = select_nodes(nodes, GpuType("L4"), CapacityKind.ON_DEMAND)
    assert selection is not None
    assert ("cloud.google.com/gke-accelerator", "nvidia-l4") in selection.node_selector
    assert [len(p.nodes) for p in pool_layout(nodes, priced)] == [2]
    gfd = node_info(_node({PRODUCT_LABEL: "NVIDIA-L4"}, name="gfd-0"), Provider.GCP, priced)
    assert gfd is not None
    mixed = [*nodes, gfd]
    selection = select_nodes(mixed, GpuType("L4"), CapacityKind.ON_DEMAND)
    assert selection is not None
    assert (PRODUCT_LABEL, "NVIDIA-L4") in selection.node_selector
    assert [n.name for p in pool_layout(mixed, priced) for n in p.nodes] == ["gfd-0"]
