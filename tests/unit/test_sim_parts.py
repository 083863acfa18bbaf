"""The simulated API server's parts on their own: selectors, patches, the store's history, config, tables."""

from __future__ import annotations

from typing import Any

import pytest

from clusters.sim import SimConfigError, config, kubelet
from clusters.sim.changes import Change, Watcher
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


def next_event(watcher: Watcher) -> tuple[EventType, Change]:
    event = watcher.queue.get_nowait()
    assert event is not None, "the watch ended"  # a None in the queue ends the watch
    return event


async def test_watch_replays_history_and_refuses_expired_versions() -> None:
    store = a_store(limit=5)
    start = store.resource_version
    for i in range(3):
        store.create(PODS, {"metadata": {"name": f"p{i}", "namespace": "default"}})
    watcher = store.watch(PODS, "default", parse_label_selector(""), parse_field_selector(""), start)
    replayed = [next_event(watcher) for _ in range(3)]
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
    (event_type, change) = next_event(watcher)
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


# -- API machinery parts: quantities, strategic merge, protobuf, field ownership ----------------


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("1000m", "1"),
        (4, "4"),
        ("1Gi", "1Gi"),
        ("1024Mi", "1Gi"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("1000", "1k"),
        (0.5, "500m"),
        ("1e3", "1e3"),
        ("100m", "100m"),
        ("0.0000000001", "1n"),
        (1073741824, "1073741824"),
    ],
)
def test_quantity_canonical_form(given: object, canonical: str) -> None:
    from clusters.sim.quantity import canonical as to_canonical

    assert to_canonical(given) == canonical


@pytest.mark.parametrize("bad", ["four", "1Gb", "", " 1", True, None])
def test_quantity_refuses_what_the_server_refuses(bad: object) -> None:
    from clusters.sim.quantity import QuantityError, canonical

    with pytest.raises(QuantityError):
        canonical(bad)


def test_strategic_merge_by_key_directives_and_sets() -> None:
    svc = {"spec": {"ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "b"}]}}
    merged = apply(STRATEGIC, svc, {"spec": {"ports": [{"port": 81, "name": "bb"}, {"port": 82}]}})
    assert merged["spec"]["ports"] == [{"port": 80, "name": "a"}, {"port": 81, "name": "bb"}, {"port": 82}]
    deleted = apply(STRATEGIC, svc, {"spec": {"ports": [{"port": 80, "$patch": "delete"}]}})
    assert deleted["spec"]["ports"] == [{"port": 81, "name": "b"}]
    replaced = apply(STRATEGIC, svc, {"spec": {"ports": [{"$patch": "replace"}, {"port": 9}]}})
    assert replaced["spec"]["ports"] == [{"port": 9}]
    ordered = apply(STRATEGIC, svc, {"spec": {"$setElementOrder/ports": [{"port": 81}, {"port": 80}]}})
    assert [p["port"] for p in ordered["spec"]["ports"]] == [81, 80]
    pod = {"metadata": {"finalizers": ["a"]}, "spec": {"tolerations": [{"key": "x"}]}}
    patched = apply(
        STRATEGIC, pod, {"metadata": {"finalizers": ["b"]}, "spec": {"tolerations": [{"key": "y"}]}}
    )
    assert patched["metadata"]["finalizers"] == ["a", "b"]  # a merged set
    assert patched["spec"]["tolerations"] == [{"key": "y"}]  # no merge key: replaced
    with pytest.raises(ApiError):
        apply(STRATEGIC, svc, {"spec": {"ports": [{"name": "no-port"}]}})
    # A JSON merge patch still replaces lists whole.
    assert apply(MERGE, svc, {"spec": {"ports": [{"port": 1}]}})["spec"]["ports"] == [{"port": 1}]


def _proto_field(number: int, payload: bytes | int) -> bytes:
    def varint(value: int) -> bytes:
        out = b""
        while True:
            byte, value = value & 0x7F, value >> 7
            out += bytes([byte | (0x80 if value else 0)])
            if not value:
                return out

    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_protobuf_bodies_decode_and_unknown_fields_are_refused() -> None:
    from clusters.sim import protobuf

    meta = _proto_field(1, b"cm") + _proto_field(2, b"") + _proto_field(7, 0)
    entry = _proto_field(1, b"k") + _proto_field(2, b"v")
    raw = _proto_field(1, meta) + _proto_field(2, entry)
    type_meta = _proto_field(1, b"v1") + _proto_field(2, b"ConfigMap")
    body = b"k8s\x00" + _proto_field(1, type_meta) + _proto_field(2, raw)
    assert protobuf.decode(body) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm"},
        "data": {"k": "v"},
    }
    odd = b"k8s\x00" + _proto_field(1, type_meta) + _proto_field(2, raw + _proto_field(99, b"x"))
    with pytest.raises(ApiError) as info:
        protobuf.decode(odd)
    assert info.value.code == 415
    other = b"k8s\x00" + _proto_field(1, _proto_field(1, b"v1") + _proto_field(2, b"Secret"))
    with pytest.raises(ApiError) as info:
        protobuf.decode(other)
    assert info.value.code == 415


def test_field_ownership_update_then_apply_conflict() -> None:
    from clusters.sim import apply as ssa
    from clusters.sim.resources import CONFIG_MAPS

    applied = ssa.apply_create(
        CONFIG_MAPS,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}},
        {"fieldManager": "me"},
    )
    assert applied["metadata"]["managedFields"][0]["fieldsV1"] == {"f:data": {"f:a": {}}}
    changed = {**applied, "data": {"a": "2"}}
    ssa.record_update(changed, applied, {"fieldManager": "other"}, "Update")
    owners = {e["manager"]: e["fieldsV1"] for e in changed["metadata"]["managedFields"]}
    assert owners == {"other": {"f:data": {"f:a": {}}}}  # an update takes the field over
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "3"}}
    with pytest.raises(ApiError) as info:
        ssa.apply_patch(CONFIG_MAPS, changed, config, {"fieldManager": "me"})
    assert info.value.code == 409
    forced = ssa.apply_patch(CONFIG_MAPS, changed, config, {"fieldManager": "me", "force": "true"})
    assert forced["data"] == {"a": "3"}
    assert [e["manager"] for e in forced["metadata"]["managedFields"]] == ["me"]


def test_field_selectors_only_on_supported_fields() -> None:
    from clusters.sim.selectors import check_field_selector, field_value

    check_field_selector("", "nodes", False, True, parse_field_selector("spec.unschedulable=false"))
    with pytest.raises(ApiError) as info:
        check_field_selector("", "nodes", False, True, parse_field_selector("spec.unschedulabel=false"))
    assert info.value.code == 400
    with pytest.raises(ApiError):
        check_field_selector("batch.volcano.sh", "jobs", True, False, parse_field_selector("status.state=x"))
    assert field_value({"spec": {}}, ("spec", "unschedulable")) == "false"


def test_exact_list_rebuilds_the_past_until_history_is_compacted() -> None:
    now = [0.0]
    store = Store(lambda: now[0], compaction_interval_s=10)
    ns = {"metadata": {"name": "default"}}
    from clusters.sim.resources import NAMESPACES

    store.create(NAMESPACES, ns)
    pod = {"metadata": {"name": "p", "namespace": "default"}, "spec": {}}
    store.create(PODS, pod)
    rv = store.resource_version
    store.remove(PODS, "default", "p")
    assert [o["metadata"]["name"] for o in store.list_at(PODS, rv)] == ["p"]
    assert store.list(PODS) == []
    now[0] = 11
    store.create(PODS, {"metadata": {"name": "q", "namespace": "default"}, "spec": {}})
    now[0] = 22
    store.create(PODS, {"metadata": {"name": "r", "namespace": "default"}, "spec": {}})
    with pytest.raises(ResourceGone):
        store.list_at(PODS, rv)


def test_json_patch_move_and_copy() -> None:
    doc = {"a": {"b": 1}, "l": [1, 2]}
    ops = [{"op": "move", "from": "/a/b", "path": "/c"}, {"op": "copy", "from": "/l/0", "path": "/l/-"}]
    assert apply(JSON_PATCH, doc, ops) == {"a": {}, "l": [1, 2, 1], "c": 1}
    with pytest.raises(ApiError):
        apply(JSON_PATCH, doc, [{"op": "copy", "from": "/missing", "path": "/x"}])


def test_watch_window_keeps_100_events_and_grows_while_they_are_fresh() -> None:
    from clusters.sim.resources import CONFIG_MAPS, NODES
    from clusters.sim.watchcache import WatchWindows

    now = [0.0]
    windows = WatchWindows(lambda: now[0])
    windows.start(10)
    assert windows.floor(CONFIG_MAPS) == 10  # nothing before the server started
    for rv in range(11, 311):  # 300 events in one instant: the window doubles to keep them
        windows.record(CONFIG_MAPS, rv)
    assert windows.floor(CONFIG_MAPS) == 10
    now[0] = 200.0  # now they are stale: the window shrinks back and the oldest go
    for rv in range(311, 420):  # once the grown window is full, it shrinks instead
        windows.record(CONFIG_MAPS, rv)
    assert windows.floor(CONFIG_MAPS) > 10
    assert windows.floor(NODES) == 10  # per kind


@pytest.mark.parametrize(
    ("task", "expected_oom_s", "expected_duration_s"),
    [("master", 1.5, 9.0), ("worker", None, 4.0)],
)
def test_a_tasks_own_annotation_comes_before_the_gangs(
    task: str, expected_oom_s: float | None, expected_duration_s: float
) -> None:
    annotations = {
        "volcano.sh/task-spec": task,
        "sim.gpufed.io/oom-kill-after-s.master": "1.5",
        "sim.gpufed.io/duration": "4",
        "sim.gpufed.io/duration.master": "9",
    }
    pod = {"metadata": {"name": f"{task}-0", "annotations": annotations}}
    assert kubelet.oom_after_s(pod) == expected_oom_s
    assert kubelet.duration_s(pod, default_s=20.0) == expected_duration_s
