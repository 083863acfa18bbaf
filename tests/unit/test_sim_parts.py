"""The simulated API server's parts on their own: selectors, patches, the store's history, config, tables."""

from __future__ import annotations

from typing import Any

import pytest

from clusters.sim import SimConfigError, config
from clusters.sim.errors import ApiError
from clusters.sim.patch import JSON_PATCH, MERGE, STRATEGIC, apply
from clusters.sim.resources import PODS
from clusters.sim.selectors import parse_field_selector, parse_label_selector
from clusters.sim.store import EventType, ResourceGone, Store
from clusters.sim.table import human_duration
from placement.model import CapacityKind


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a in (1, 2),b", {"a": "2", "b": "x"}, True),
        ("a notin (1,2)", {"a": "1"}, False),
        ("!a", {"b": "1"}, True),
        ("a", {}, False),
    ],
    ids=["eq", "double-eq", "ne-missing", "in-and-exists", "notin", "not-exists", "exists-missing"],
)
def test_label_selector(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_label_selector(selector).matches(labels) is matches


def test_field_selector_reads_nested_fields_and_negation() -> None:
    obj = {
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n1", "unschedulable": True},
        "status": {"phase": "Running"},
    }
    assert parse_field_selector("spec.nodeName=n1,status.phase!=Failed").matches(obj)
    assert parse_field_selector("spec.unschedulable=true").matches(obj)
    assert not parse_field_selector("metadata.name=q").matches(obj)


def test_bad_selector_is_400() -> None:
    with pytest.raises(ApiError) as info:
        parse_label_selector("a in b")
    assert info.value.code == 400


@pytest.mark.parametrize(
    ("content_type", "body", "expected"),
    [
        (
            MERGE,
            {"spec": {"unschedulable": True}},
            {"spec": {"unschedulable": True, "x": 1}, "m": {"a": "1"}},
        ),
        (STRATEGIC, {"m": {"a": None}}, {"spec": {"x": 1}, "m": {}}),
        (
            JSON_PATCH,
            [{"op": "add", "path": "/m/b", "value": "2"}],
            {"spec": {"x": 1}, "m": {"a": "1", "b": "2"}},
        ),
        (JSON_PATCH, [{"op": "remove", "path": "/spec/x"}], {"spec": {}, "m": {"a": "1"}}),
    ],
    ids=["merge", "strategic-delete", "json-add", "json-remove"],
)
def test_patch(content_type: str, body: Any, expected: dict[str, Any]) -> None:
    assert apply(content_type, {"spec": {"x": 1}, "m": {"a": "1"}}, body) == expected


def test_unknown_patch_type_is_415() -> None:
    with pytest.raises(ApiError) as info:
        apply("application/apply-patch+yaml", {}, {})
    assert info.value.code == 415


def a_store(limit: int = 5) -> Store:
    return Store(lambda: 1_700_000_000.0, history_limit=limit)


def test_resource_version_increases_and_noop_update_keeps_it() -> None:
    store = a_store()
    pod = store.create(PODS, {"metadata": {"name": "p", "namespace": "default"}, "spec": {}})
    rv = int(pod["metadata"]["resourceVersion"])
    same = store.update(PODS, dict(pod))
    assert int(same["metadata"]["resourceVersion"]) == rv
    changed = store.update(PODS, {**pod, "spec": {"x": 1}})
    assert int(changed["metadata"]["resourceVersion"]) > rv
    assert changed["metadata"]["generation"] == 2


async def test_watch_replays_history_and_refuses_expired_versions() -> None:
    store = a_store(limit=5)
    start = store.resource_version
    for i in range(3):
        store.create(PODS, {"metadata": {"name": f"p{i}", "namespace": "default"}})
    watcher = store.watch(PODS, "default", parse_label_selector(""), parse_field_selector(""), start)
    replayed = [watcher.queue.get_nowait() for _ in range(3)]
    assert [(t, c.obj["metadata"]["name"]) for t, c in replayed] == [
        (EventType.ADDED, f"p{i}") for i in range(3)
    ]
    for i in range(3, 10):
        store.create(PODS, {"metadata": {"name": f"p{i}", "namespace": "default"}})
    with pytest.raises(ResourceGone):
        store.watch(PODS, None, parse_label_selector(""), parse_field_selector(""), start)


async def test_watch_without_version_starts_with_every_object() -> None:
    store = a_store()
    store.create(PODS, {"metadata": {"name": "a", "namespace": "x"}})
    store.create(PODS, {"metadata": {"name": "b", "namespace": "y"}})
    watcher = store.watch(PODS, "y", parse_label_selector(""), parse_field_selector(""), None)
    (event_type, change) = watcher.queue.get_nowait()
    assert (event_type, change.obj["metadata"]["name"]) == (EventType.ADDED, "b")
    assert watcher.queue.empty()


def test_config_reads_federation_style_cluster_entries() -> None:
    (parsed,) = config.from_document(
        {
            "name": "cloud",
            "provider": "aws",
            "timeScale": 10,
            "pools": [
                {
                    "name": "h100",
                    "gpuType": "H100",
                    "kind": "on_demand",
                    "usdPerGpuHour": 6.8,
                    "gpusPerNode": 8,
                    "nodes": 2,
                },
                {"name": "l4", "gpuType": "L4", "capacityType": "spot", "gpusPerNode": 4},
            ],
        }
    )
    assert parsed.time_scale == 10
    assert [(p.name, p.kind, p.gpu_product, p.node_count) for p in parsed.pools] == [
        ("h100", CapacityKind.ON_DEMAND, "NVIDIA-H100-80GB-HBM3", 2),
        ("l4", CapacityKind.SPOT, "NVIDIA-L4", 1),
    ]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"clusters": []}, "clusters: must be a non-empty list"),
        ({"clusters": [{"name": "a"}, {"name": "a"}]}, "cluster names must be unique"),
        (
            {"name": "a", "pools": [{"name": "p", "gpuType": "A100", "kind": "cheap"}]},
            "cluster.pools[0].kind",
        ),
        ({"name": "a", "pools": [{"name": "p", "gpuType": "A100", "nodes": -1}]}, "cluster.pools[0].nodes"),
    ],
    ids=["empty", "duplicate", "bad-kind", "negative-nodes"],
)
def test_config_errors_name_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(SimConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        config.from_document(document)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5, "5s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (9 * 86400, "9d"),
    ],
)
def test_ages_print_like_kubectl(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


@pytest.mark.parametrize(
    ("taints", "schedulable"),
    [
        pytest.param(
            [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}], True, id="gpu-operator"
        ),
        pytest.param(
            [{"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}],
            True,
            id="aks-spot",
        ),
        pytest.param(
            [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}], False, id="someone-elses"
        ),
        pytest.param(
            [{"key": "dedicated", "value": "infra", "effect": "PreferNoSchedule"}], True, id="only-preferred"
        ),
    ],
)
def test_which_taints_keep_a_node_out_of_the_inventory(
    taints: list[dict[str, str]], schedulable: bool
) -> None:
    from clusters.kubernetes.inventory import _schedulable

    node = {"spec": {"taints": taints}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert _schedulable(node) is schedulable
