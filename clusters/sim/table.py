"""`meta.k8s.io/v1` Tables: what kubectl prints for `get`, computed by the server as a real one does.

kubectl asks for `as=Table;v=v1;g=meta.k8s.io` and prints the columns it gets back; the NAMESPACE
column of `-A` it adds itself from each row's object metadata. The columns and cell formats follow
kubectl's own printers (`READY 1/1`, `STATUS Completed`, `AGE 3m2s`) so that output looks familiar.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clusters.sim import podstatus
from clusters.sim.clock import parse_rfc3339
from clusters.sim.resources import (
    BATCH_JOBS,
    CONFIG_MAPS,
    EVENTS,
    LEASES,
    NAMESPACES,
    NODES,
    POD_GROUPS,
    PODS,
    PRIORITY_CLASSES,
    SERVICES,
    VOLCANO_JOBS,
    ResourceType,
)

Obj = dict[str, Any]
# name, type, priority (0 is shown by default, 1 only with -o wide)
Column = tuple[str, str, int]


def human_duration(seconds: float) -> str:
    """kubectl's `duration.HumanDuration`."""
    if seconds < -1:
        return "<invalid>"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    return f"{hours // (24 * 365)}y"


def _age(obj: Obj, now_wall_s: float) -> str:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    return human_duration(now_wall_s - parse_rfc3339(stamp)) if stamp else "<unknown>"


def pod_status_text(pod: Obj) -> str:
    status = pod.get("status") or {}
    if podstatus.is_deleting(pod) and not podstatus.is_terminal(pod):
        return "Terminating"
    if status.get("reason"):
        return str(status["reason"])
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            return str(state["waiting"]["reason"])
        if "terminated" in state:
            return str(state["terminated"].get("reason") or "Completed")
    if podstatus.phase(pod) == "Pending" and podstatus.node_name(pod):
        return "ContainerCreating"
    return podstatus.phase(pod)


def _pod(pod: Obj, now: float) -> list[Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len(podstatus.containers(pod))
    ready = sum(1 for cs in statuses if cs.get("ready"))
    restarts = sum(int(cs.get("restartCount", 0)) for cs in statuses)
    status = pod.get("status") or {}
    return [
        pod["metadata"]["name"],
        f"{ready}/{total}",
        pod_status_text(pod),
        restarts,
        _age(pod, now),
        status.get("podIP") or "<none>",
        podstatus.node_name(pod) or "<none>",
        "<none>",
        "<none>",
    ]


def _node(node: Obj, now: float) -> list[Any]:
    ready = podstatus.condition(node, "Ready")
    text = "Ready" if ready and ready.get("status") == "True" else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        text += ",SchedulingDisabled"
    labels = node["metadata"].get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    info = (node.get("status") or {}).get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in (node.get("status") or {}).get("addresses") or []}
    return [
        node["metadata"]["name"],
        text,
        ",".join(roles) or "<none>",
        _age(node, now),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP", "<none>"),
        addresses.get("ExternalIP", "<none>"),
        info.get("osImage", ""),
        info.get("kernelVersion", ""),
        info.get("containerRuntimeVersion", ""),
    ]


def _job(job: Obj, now: float) -> list[Any]:
    status = job.get("status") or {}
    spec = job.get("spec") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    text = "Complete" if "Complete" in conditions else "Failed" if "Failed" in conditions else "Running"
    if spec.get("suspend"):
        text = "Suspended"
    start = status.get("startTime")
    end = status.get("completionTime")
    duration = human_duration((parse_rfc3339(end) if end else now) - parse_rfc3339(start)) if start else ""
    containers = (spec.get("template") or {}).get("spec", {}).get("containers") or []
    return [
        job["metadata"]["name"],
        text,
        f"{status.get('succeeded', 0)}/{spec.get('completions', 1)}",
        duration,
        _age(job, now),
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
        ",".join(f"{k}={v}" for k, v in ((spec.get("selector") or {}).get("matchLabels") or {}).items()),
    ]


def _vcjob(job: Obj, now: float) -> list[Any]:
    status = job.get("status") or {}
    return [
        job["metadata"]["name"],
        (status.get("state") or {}).get("phase", ""),
        (job.get("spec") or {}).get("minAvailable", 0),
        status.get("running", 0),
        _age(job, now),
        (job.get("spec") or {}).get("queue", ""),
    ]


def _podgroup(pg: Obj, now: float) -> list[Any]:
    status = pg.get("status") or {}
    spec = pg.get("spec") or {}
    return [
        pg["metadata"]["name"],
        status.get("phase", ""),
        spec.get("minMember", 0),
        status.get("running", 0),
        _age(pg, now),
        spec.get("queue", ""),
    ]


def _namespace(ns: Obj, now: float) -> list[Any]:
    return [ns["metadata"]["name"], (ns.get("status") or {}).get("phase", ""), _age(ns, now)]


def _service(svc: Obj, now: float) -> list[Any]:
    spec = svc.get("spec") or {}
    ports = ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or [])
    return [
        svc["metadata"]["name"],
        spec.get("type", "ClusterIP"),
        spec.get("clusterIP", "<none>"),
        "<none>",
        ports or "<none>",
        _age(svc, now),
        ",".join(f"{k}={v}" for k, v in (spec.get("selector") or {}).items()),
    ]


def _event(ev: Obj, now: float) -> list[Any]:
    last = ev.get("lastTimestamp") or ev["metadata"].get("creationTimestamp")
    involved = ev.get("involvedObject") or {}
    return [
        human_duration(now - parse_rfc3339(last)) if last else "<unknown>",
        ev.get("type", ""),
        ev.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        ev.get("message", ""),
    ]


def _config_map(cm: Obj, now: float) -> list[Any]:
    data = len(cm.get("data") or {}) + len(cm.get("binaryData") or {})
    return [cm["metadata"]["name"], data, _age(cm, now)]


def _lease(lease: Obj, now: float) -> list[Any]:
    return [lease["metadata"]["name"], (lease.get("spec") or {}).get("holderIdentity", ""), _age(lease, now)]


def _priority_class(pc: Obj, now: float) -> list[Any]:
    return [pc["metadata"]["name"], pc.get("value", 0), bool(pc.get("globalDefault", False)), _age(pc, now)]


_NAME: Column = ("Name", "string", 0)
_AGE: Column = ("Age", "string", 0)
_PRINTERS: dict[ResourceType, tuple[list[Column], Callable[[Obj, float], list[Any]]]] = {
    PODS: (
        [
            _NAME,
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "integer", 0),
            _AGE,
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ],
        _pod,
    ),
    NODES: (
        [
            _NAME,
            ("Status", "string", 0),
            ("Roles", "string", 0),
            _AGE,
            ("Version", "string", 0),
            ("Internal-IP", "string", 1),
            ("External-IP", "string", 1),
            ("OS-Image", "string", 1),
            ("Kernel-Version", "string", 1),
            ("Container-Runtime", "string", 1),
        ],
        _node,
    ),
    BATCH_JOBS: (
        [
            _NAME,
            ("Status", "string", 0),
            ("Completions", "string", 0),
            ("Duration", "string", 0),
            _AGE,
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        _job,
    ),
    VOLCANO_JOBS: (
        [
            _NAME,
            ("Status", "string", 0),
            ("MinAvailable", "integer", 0),
            ("Runnings", "integer", 0),
            _AGE,
            ("Queue", "string", 1),
        ],
        _vcjob,
    ),
    POD_GROUPS: (
        [
            _NAME,
            ("Status", "string", 0),
            ("MinMember", "integer", 0),
            ("Runnings", "integer", 0),
            _AGE,
            ("Queue", "string", 1),
        ],
        _podgroup,
    ),
    NAMESPACES: ([_NAME, ("Status", "string", 0), _AGE], _namespace),
    CONFIG_MAPS: ([_NAME, ("Data", "integer", 0), _AGE], _config_map),
    LEASES: ([_NAME, ("Holder", "string", 0), _AGE], _lease),
    PRIORITY_CLASSES: (
        [_NAME, ("Value", "integer", 0), ("Global-Default", "boolean", 0), _AGE],
        _priority_class,
    ),
    SERVICES: (
        [
            _NAME,
            ("Type", "string", 0),
            ("Cluster-IP", "string", 0),
            ("External-IP", "string", 0),
            ("Port(s)", "string", 0),
            _AGE,
            ("Selector", "string", 1),
        ],
        _service,
    ),
    EVENTS: (
        [
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Message", "string", 0),
        ],
        _event,
    ),
}


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def _row_object(obj: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def render(
    rt: ResourceType,
    objs: list[Obj],
    now_wall_s: float,
    resource_version: str,
    include: str = "Metadata",
    *,
    with_columns: bool = True,
) -> Obj:
    columns, printer = _PRINTERS.get(
        rt, ([_NAME, _AGE], lambda o, now: [o["metadata"]["name"], _age(o, now)])
    )
    rows = []
    for obj in objs:
        row: Obj = {"cells": printer(obj, now_wall_s)}
        embedded = _row_object(obj, include)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    table: Obj = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {
                "name": name,
                "type": kind,
                "format": "name" if name == "Name" else "",
                "description": "",
                "priority": priority,
            }
            for name, kind, priority in columns
        ]
        if with_columns
        else [],
        "rows": rows,
    }
    return table
