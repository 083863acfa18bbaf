"""A gang whose object says it succeeded before the pod view has shown its pods run is not over yet.

The Kubernetes backend follows gang objects and pods by two watches, and a busy client reads the
pod stream (several events a pod) behind the gang's. A 250 ms gang's Volcano Job could read
Completed while its pods were still unseen or Pending in the pod cache: the status said SUCCEEDED
with no start, the reconciler closed the attempt from DISPATCHED, and the ledger, which charges an
attempt only from a known start, never billed it (a loaded HA run, tests/e2e/test_crash_ha.py: an
attempt whose pods ran had no interval). The pod shapes are the Kubernetes API's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from clusters.api import GangPhase, GangStatus
from clusters.kubernetes.inventory import ATTEMPT_KEY, GANG_LABEL, JOB_ID_KEY, pod_info
from clusters.kubernetes.status import (
    POD_VIEW_PATIENCE_S,
    GangKind,
    GangObject,
    Outcome,
    gang_status,
    summarize_pods,
)
from placement.model import JobId, TenantId

T0 = 1_795_940_000.0
COMPLETED_AT = T0 + 1


def _stamp(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(name: str, phase: str) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if phase != "Pending":
        status["startTime"] = _stamp(T0)
        status["containerStatuses"] = [
            {"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": _stamp(COMPLETED_AT)}}}
        ]
    return {
        "metadata": {
            "namespace": "team",
            "name": name,
            "labels": {GANG_LABEL: "g-1", JOB_ID_KEY: "j-1", ATTEMPT_KEY: "1"},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
        "status": status,
    }


# A Volcano Job that went from Pending straight to Completed (its pods ran a quarter of a second).
COMPLETED = GangObject(
    kind=GangKind.VOLCANO_JOB,
    namespace="team",
    name="g-1",
    uid="u",
    job_id=JobId("j-1"),
    attempt=1,
    tenant=TenantId("nlp"),
    replicas=2,
    outcome=Outcome(GangPhase.SUCCEEDED, "completed", COMPLETED_AT),
    running_since_s=None,
    deleting_since_s=None,
    evicted_reason=None,
)


def _status(*pods: dict[str, Any], now_s: float) -> GangStatus:
    summary = summarize_pods(pod_info(p) for p in pods).get(("team", "g-1"))
    return gang_status(COMPLETED, summary, now_s=now_s)


def test_a_success_whose_pods_the_pod_view_shows_pending_waits_for_them() -> None:
    status = _status(_pod("g-1-master-0", "Pending"), _pod("g-1-worker-0", "Pending"), now_s=T0 + 2)
    assert status.phase is GangPhase.PENDING
    assert not status.phase.is_final


def test_a_success_whose_pods_the_pod_view_has_not_seen_waits_for_them() -> None:
    assert _status(now_s=T0 + 2).phase is GangPhase.PENDING


def test_once_the_pods_are_seen_run_the_success_stands_with_their_start() -> None:
    status = _status(_pod("g-1-master-0", "Succeeded"), _pod("g-1-worker-0", "Succeeded"), now_s=T0 + 2)
    assert status.phase is GangPhase.SUCCEEDED
    assert (status.started_at_s, status.finished_at_s) == (T0, COMPLETED_AT)


def test_past_the_patience_the_success_stands_with_its_start_unknown() -> None:
    # Pods deleted by someone before gpufed saw them: the gang is not left unfinished for ever.
    status = _status(now_s=COMPLETED_AT + POD_VIEW_PATIENCE_S)
    assert status.phase is GangPhase.SUCCEEDED
    assert status.started_at_s is None
