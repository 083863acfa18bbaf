"""A `batch/v1` Job's `podFailurePolicy` rules, matched against one ended pod.

Kept apart from the Job controller: matching is a pure function of the rule and the pod's status
(its conditions, its containers' exit codes), the part that decides whether a disruption fails the
Job at once (gpufed's `FailJob` on `DisruptionTarget`) or counts against `backoffLimit`.
"""

from __future__ import annotations

from typing import Any

from clusters.sim import podstatus

Obj = dict[str, Any]


def rule_matches(rule: Obj, pod: Obj) -> bool:
    on_conditions = rule.get("onPodConditions")
    if on_conditions:
        return any(
            (c := podstatus.condition(pod, want.get("type", ""))) is not None
            and c.get("status") == want.get("status", "True")
            for want in on_conditions
        )
    on_codes = rule.get("onExitCodes")
    if on_codes:
        values = {int(v) for v in on_codes.get("values") or []}
        container = on_codes.get("containerName")
        codes = [
            ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
            for cs in (pod.get("status") or {}).get("containerStatuses") or []
            if container is None or cs.get("name") == container
        ]
        codes = [c for c in codes if c not in (None, 0)]
        if on_codes.get("operator") == "NotIn":
            return any(c not in values for c in codes)
        return any(c in values for c in codes)
    return False


def rule_subject(rule: Obj) -> str:
    if rule.get("onPodConditions"):
        kinds = [w.get("type") for w in rule["onPodConditions"]]
        return f"condition {kinds[0]}"
    return "container exit code"
