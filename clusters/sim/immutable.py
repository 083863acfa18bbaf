"""Update validation of the fields a real API server will not let an update change.

A pod's spec is fixed once created except for container images, `activeDeadlineSeconds`, added
tolerations and scheduling gates being removed; a Job's `selector`, `template` (while it is not
suspended) and `completionMode` are immutable. A real server refuses such an update with `422
Invalid`; without this check a `kubectl apply` that changed a running pod's GPU request would be
accepted and silently change what the simulated scheduler counts.
"""

from __future__ import annotations

from typing import Any

from clusters.sim import errors
from clusters.sim.resources import BATCH_JOBS, PODS, ResourceType

Obj = dict[str, Any]
_POD_MESSAGE = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions "
    "to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)


def _pod_fixed(spec: Obj) -> Obj:
    """The part of a pod spec an update may not change."""
    fixed = {
        k: v
        for k, v in spec.items()
        if k not in ("activeDeadlineSeconds", "tolerations", "schedulingGates", "nodeName")
    }
    for key in ("containers", "initContainers"):
        if isinstance(fixed.get(key), list):
            fixed[key] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in fixed[key]
            ]
    return fixed


def _as_defaulted(new: Any, old: Any) -> Any:
    """`new` with what it leaves out taken from `old`: a real server defaults an update's body
    before validating it, so a field a client omits is not a change."""
    if isinstance(new, dict) and isinstance(old, dict):
        return {**old, **{k: _as_defaulted(v, old.get(k)) for k, v in new.items()}}
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [_as_defaulted(n, o) for n, o in zip(new, old, strict=True)]
    return new


def _check_pod(name: str, old: Obj, new: Obj) -> None:
    old_spec = old.get("spec") or {}
    new_spec = _as_defaulted(new.get("spec") or {}, old_spec)
    if _pod_fixed(old_spec) != _pod_fixed(new_spec):
        raise errors.invalid(PODS, name, "spec", _POD_MESSAGE)
    old_tolerations = old_spec.get("tolerations") or []
    new_tolerations = new_spec.get("tolerations") or []
    if any(t not in new_tolerations for t in old_tolerations):
        raise errors.invalid(PODS, name, "spec.tolerations", _POD_MESSAGE)
    old_deadline = old_spec.get("activeDeadlineSeconds")
    new_deadline = new_spec.get("activeDeadlineSeconds")
    if old_deadline is not None and (new_deadline is None or new_deadline > old_deadline):
        raise errors.invalid(
            PODS,
            name,
            "spec.activeDeadlineSeconds",
            f"Invalid value: {new_deadline}: must be less than or equal to previous value",
        )
    gates = old_spec.get("schedulingGates") or []
    if any(g not in gates for g in new_spec.get("schedulingGates") or []):
        raise errors.invalid(PODS, name, "spec.schedulingGates", "Forbidden: only deletion is allowed")


def _check_job(name: str, old: Obj, new: Obj) -> None:
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    fields = ["selector", "completionMode"]
    if not old_spec.get("suspend"):
        fields.append("template")
    for field in fields:
        if old_spec.get(field) != new_spec.get(field):
            raise errors.invalid(
                BATCH_JOBS,
                name,
                f"spec.{field}",
                f"Invalid value: {new_spec.get(field)!r}: field is immutable",
            )


def check_update(rt: ResourceType, old: Obj, new: Obj) -> None:
    """Refuse an update (not a status write) that changes an immutable field."""
    name = str((old.get("metadata") or {}).get("name", ""))
    if rt is PODS:
        _check_pod(name, old, new)
    elif rt is BATCH_JOBS:
        _check_job(name, old, new)
