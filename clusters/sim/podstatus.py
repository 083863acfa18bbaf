"""How a pod's status changes, in one place for the kubelet, the scheduler and the faults.

A pod's status is read by several clients for different things (the Job controller counts phases,
gpufed's backend reads `DisruptionTarget` and `status.reason`, kubectl renders READY and STATUS from
container statuses), so every transition writes all of them consistently through these helpers.
"""

from __future__ import annotations

from typing import Any

from clusters.sim.clock import rfc3339
from clusters.sim.store import edit

Obj = dict[str, Any]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# Marks a pod the scheduler may not reschedule because the API already told the world it is gone.
DISRUPTION_TARGET = "DisruptionTarget"


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def is_terminal(pod: Obj) -> bool:
    return phase(pod) in TERMINAL_PHASES


def is_deleting(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def node_name(pod: Obj) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def condition(obj: Obj, kind: str) -> Obj | None:
    conditions: list[Obj] = (obj.get("status") or {}).get("conditions") or []
    for c in conditions:
        if c.get("type") == kind:
            return c
    return None


def set_condition(
    obj: Obj, kind: str, status: str, wall_s: float, reason: str | None = None, message: str | None = None
) -> None:
    """Upsert a condition; its transition time moves only when its status does."""
    conditions: list[Obj] = obj.setdefault("status", {}).setdefault("conditions", [])
    stamp = rfc3339(wall_s)
    new: Obj = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": stamp}
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    for i, c in enumerate(conditions):
        if c.get("type") == kind:
            if c.get("status") == status:
                new["lastTransitionTime"] = c.get("lastTransitionTime", stamp)
            conditions[i] = new
            return
    conditions.append(new)


def containers(pod: Obj) -> list[Obj]:
    found: list[Obj] = (pod.get("spec") or {}).get("containers") or []
    return list(found)


def _container_id(pod: Obj, name: str) -> str:
    uid = str(pod["metadata"].get("uid", ""))
    return f"containerd://{uid.replace('-', '')[:24]}{abs(hash(name)) % 10**8:08d}"


def running(pod: Obj, wall_s: float, host_ip: str, pod_ip: str) -> Obj:
    """The pod with its containers started and Ready."""
    new = edit(pod, "status")
    status = new.setdefault("status", {})
    stamp = rfc3339(wall_s)
    status["phase"] = "Running"
    status.setdefault("startTime", stamp)
    status["hostIP"] = host_ip
    status["hostIPs"] = [{"ip": host_ip}]
    status["podIP"] = pod_ip
    status["podIPs"] = [{"ip": pod_ip}]
    for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled"):
        set_condition(new, kind, "True", wall_s)
    status["containerStatuses"] = [
        {
            "name": c.get("name", ""),
            "image": c.get("image", ""),
            "imageID": f"{c.get('image', '')}@sha256:{'0' * 64}",
            "containerID": _container_id(new, c.get("name", "")),
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": stamp}},
            "lastState": {},
        }
        for c in containers(new)
    ]
    return new


def terminated(
    pod: Obj,
    wall_s: float,
    *,
    exit_code: int,
    reason: str | None = None,
    message: str | None = None,
    container_reason: str | None = None,
) -> Obj:
    """The pod ended: Succeeded when every container exited 0, Failed otherwise."""
    new = edit(pod, "status")
    status = new.setdefault("status", {})
    stamp = rfc3339(wall_s)
    status["phase"] = "Succeeded" if exit_code == 0 and reason is None else "Failed"
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    started = status.get("startTime")
    statuses = status.get("containerStatuses") or [
        {"name": c.get("name", ""), "image": c.get("image", ""), "imageID": "", "restartCount": 0}
        for c in containers(new)
    ]
    for cs in statuses:
        previous = (cs.get("state") or {}).get("running") or {}
        state: Obj = {
            "exitCode": exit_code,
            "reason": container_reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": previous.get("startedAt", started or stamp),
            "finishedAt": stamp,
        }
        if "containerID" in cs:
            state["containerID"] = cs["containerID"]
        cs["state"] = {"terminated": state}
        cs["ready"] = False
        cs["started"] = False
    status["containerStatuses"] = statuses
    ready_reason = "PodCompleted" if status["phase"] == "Succeeded" else "PodFailed"
    for kind in ("Ready", "ContainersReady"):
        set_condition(new, kind, "False", wall_s, ready_reason)
    if condition(new, "PodReadyToStartContainers") is not None:
        set_condition(new, "PodReadyToStartContainers", "False", wall_s)
    return new


def disrupted(
    pod: Obj, wall_s: float, *, condition_reason: str, condition_message: str, reason: str, message: str
) -> Obj:
    """Ended from outside (eviction, lost node): `DisruptionTarget` and the pod's reason say why."""
    new = terminated(pod, wall_s, exit_code=137, reason=reason, message=message, container_reason="Error")
    set_condition(new, DISRUPTION_TARGET, "True", wall_s, condition_reason, condition_message)
    return new
