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


def _container_id(pod: Obj, name: str, restart_count: int = 0) -> str:
    uid = str(pod["metadata"].get("uid", ""))
    return f"containerd://{uid.replace('-', '')[:24]}{abs(hash(name)) % 10**8:08d}{restart_count:04d}"


def restart_count(pod: Obj) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount") or 0)


def _accepted(new: Obj, wall_s: float, host_ip: str, pod_ip: str) -> Obj:
    """What a kubelet writes once it has admitted a pod, whatever its containers then do."""
    status: Obj = new.setdefault("status", {})
    status.setdefault("startTime", rfc3339(wall_s))
    status["hostIP"] = host_ip
    status["hostIPs"] = [{"ip": host_ip}]
    status["podIP"] = pod_ip
    status["podIPs"] = [{"ip": pod_ip}]
    return status


def _not_ready(new: Obj, wall_s: float) -> None:
    names = " ".join(str(c.get("name", "")) for c in containers(new))
    message = f"containers with unready status: [{names}]"
    for kind in ("Ready", "ContainersReady"):
        set_condition(new, kind, "False", wall_s, "ContainersNotReady", message)


def waiting(pod: Obj, wall_s: float, host_ip: str, pod_ip: str, reason: str, message: str) -> Obj:
    """Admitted, but the containers cannot start (an image that does not pull): phase Pending."""
    new = edit(pod, "status")
    status = _accepted(new, wall_s, host_ip, pod_ip)
    status["phase"] = "Pending"
    for kind in ("PodReadyToStartContainers", "Initialized", "PodScheduled"):
        set_condition(new, kind, "True", wall_s)
    _not_ready(new, wall_s)
    status["containerStatuses"] = [
        {
            "name": c.get("name", ""),
            "image": c.get("image", ""),
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}},
            "lastState": {},
        }
        for c in containers(new)
    ]
    return new


def rejected(pod: Obj, wall_s: float, reason: str, message: str) -> Obj:
    """Refused by the kubelet's admission (`OutOfnvidia.com/gpu`): Failed before any container ran."""
    new = edit(pod, "status")
    status = new.setdefault("status", {})
    status["phase"] = "Failed"
    status["reason"] = reason
    status["message"] = message
    status.setdefault("startTime", rfc3339(wall_s))
    return new


def crashed(
    pod: Obj, wall_s: float, *, exit_code: int, reason: str, backoff_s: float, container_message: str = ""
) -> Obj:
    """The containers exited and will be restarted: CrashLoopBackOff, the run kept in `lastState`
    (with the main container's termination message, when it left one)."""
    new = edit(pod, "status")
    status = new.setdefault("status", {})
    stamp = rfc3339(wall_s)
    m = new["metadata"]
    for cs in status.get("containerStatuses") or []:
        running_since = ((cs.get("state") or {}).get("running") or {}).get("startedAt", stamp)
        cs["lastState"] = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason,
                "startedAt": running_since,
                "finishedAt": stamp,
                "containerID": cs.get("containerID", ""),
            }
        }
        if container_message and cs is status["containerStatuses"][0]:
            cs["lastState"]["terminated"]["message"] = container_message
        message = (
            f"back-off {int(backoff_s)}s restarting failed container={cs.get('name')} "
            f"pod={m['name']}_{m.get('namespace', '')}({m.get('uid', '')})"
        )
        cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
        cs["ready"] = False
        cs["started"] = False
    _not_ready(new, wall_s)
    return new


def restarted(pod: Obj, wall_s: float) -> Obj:
    """The back-off is over: the containers run again, one more restart counted."""
    new = edit(pod, "status")
    stamp = rfc3339(wall_s)
    for cs in (new.get("status") or {}).get("containerStatuses") or []:
        cs["restartCount"] = int(cs.get("restartCount") or 0) + 1
        cs["containerID"] = _container_id(new, cs.get("name", ""), cs["restartCount"])
        cs["state"] = {"running": {"startedAt": stamp}}
        cs["ready"] = True
        cs["started"] = True
    for kind in ("ContainersReady", "Ready"):
        set_condition(new, kind, "True", wall_s)
    return new


def running(pod: Obj, wall_s: float, host_ip: str, pod_ip: str) -> Obj:
    """The pod with its containers started and Ready."""
    new = edit(pod, "status")
    status = _accepted(new, wall_s, host_ip, pod_ip)
    stamp = rfc3339(wall_s)
    status["phase"] = "Running"
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
    container_message: str = "",
) -> Obj:
    """The pod ended: Succeeded when every container exited 0, Failed otherwise. `container_message`
    is the main container's termination message (the kubelet's read of its message file)."""
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
        if not previous and (cs.get("state") or {}).get("waiting") and (cs.get("lastState") or {}):
            # Ended between two runs (a crash loop stopped by deletion): the last run stays the record.
            cs["state"] = cs["lastState"]
            cs["ready"] = False
            cs["started"] = False
            continue
        state: Obj = {
            "exitCode": exit_code,
            "reason": container_reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": previous.get("startedAt", started or stamp),
            "finishedAt": stamp,
        }
        if "containerID" in cs:
            state["containerID"] = cs["containerID"]
        if container_message and cs is statuses[0]:
            state["message"] = container_message
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
