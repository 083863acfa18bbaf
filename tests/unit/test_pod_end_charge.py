"""An attempt held back for its pods is charged to the pods' own end, not to when gpufed noticed.

The pod shapes are the Kubernetes API's (Pod status: `phase`, `containerStatuses[].state.terminated.
finishedAt` as RFC 3339, https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/). A pod in
phase Succeeded or Failed no longer holds its GPUs; a pod deleted outright leaves no trace, so its end
is unknown and the reconciler's own clock is all there is.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from clusters.api import GangPhase, GangStatus
from clusters.kubernetes.inventory import ATTEMPT_KEY, GANG_LABEL, JOB_ID_KEY, pod_info
from clusters.kubernetes.status import GangKind, GangObject, Outcome, gang_status, summarize_pods
from federation.scheduling.reconciler import _charged_until
from placement.model import JobId, TenantId

T0 = 1_795_940_000.0


def _stamp(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(name: str, phase: str, *, finished_at_s: float | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": _stamp(T0)}}
    if finished_at_s is not None:
        state = {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": _stamp(finished_at_s)}}
    return {
        "metadata": {
            "namespace": "team",
            "name": name,
            "labels": {GANG_LABEL: "g-1", JOB_ID_KEY: "j-1", ATTEMPT_KEY: "1"},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {
            "phase": phase,
            "startTime": _stamp(T0),
            "containerStatuses": [{"name": "main", "state": state}],
        },
    }


def _failed_gang(replicas: int) -> GangObject:
    return GangObject(
        kind=GangKind.INDEXED_JOB,
        namespace="team",
        name="g-1",
        uid="u",
        job_id=JobId("j-1"),
        attempt=1,
        tenant=TenantId("vision"),
        replicas=replicas,
        # The Job's Failed condition came first: one pod was deleted, the others still stopped.
        outcome=Outcome(GangPhase.FAILED, "BackoffLimitExceeded", T0 + 10),
        running_since_s=None,
        deleting_since_s=None,
        evicted_reason=None,
    )


def _status(*pods: dict[str, Any], replicas: int = 2) -> GangStatus:
    summary = summarize_pods(pod_info(p) for p in pods)[("team", "g-1")]
    return gang_status(_failed_gang(replicas), summary, now_s=T0 + 99)


def test_a_finished_pod_says_when_its_containers_ended_and_a_running_one_does_not() -> None:
    assert pod_info(_pod("a", "Failed", finished_at_s=T0 + 12)).finished_at_s == T0 + 12
    assert pod_info(_pod("b", "Running")).finished_at_s is None
    # Its phase decides: a pod whose container has ended but which is not yet Failed or Succeeded
    # still counts as holding its GPUs.
    assert pod_info(_pod("c", "Running", finished_at_s=T0 + 5)).finished_at_s is None


def test_the_pods_end_is_the_last_of_every_replicas_finishedat() -> None:
    status = _status(_pod("a", "Failed", finished_at_s=T0 + 11), _pod("b", "Failed", finished_at_s=T0 + 13))
    assert status.live_pods == 0
    assert status.pods_ended_at_s == T0 + 13
    assert status.finished_at_s == T0 + 10  # the gang's own end is still the condition's


@pytest.mark.parametrize(
    "pods",
    [
        pytest.param((("a", "Failed", T0 + 11), ("b", "Running", None)), id="one-still-runs"),
        pytest.param((("a", "Failed", T0 + 11),), id="one-deleted-outright"),
        pytest.param((("a", "Failed", T0 + 11), ("b", "Failed", None)), id="one-ended-without-a-time"),
    ],
)
def test_the_pods_end_is_unknown_unless_every_replica_is_there_finished_with_a_time(
    pods: tuple[tuple[str, str, float | None], ...],
) -> None:
    assert _status(*(_pod(n, ph, finished_at_s=at) for n, ph, at in pods)).pods_ended_at_s is None


def _gang(*, live: int, pods_end: float | None) -> GangStatus:
    return GangStatus(
        job_id=JobId("j-1"),
        attempt=1,
        phase=GangPhase.FAILED,
        finished_at_s=T0 + 10,
        live_pods=live,
        pods_ended_at_s=pods_end,
    )


def test_an_attempt_held_for_its_pods_is_charged_to_their_end_and_otherwise_to_the_gangs() -> None:
    done = _gang(live=0, pods_end=T0 + 13)
    assert _charged_until(done, cancelled=False, waited=True) == T0 + 13
    assert _charged_until(done, cancelled=True, waited=False) == T0 + 13
    assert _charged_until(done, cancelled=False, waited=False) == T0 + 10
    # Pods gone without a trace, or a gang gone whole: only the reconciler's clock knows ("now").
    assert _charged_until(_gang(live=0, pods_end=None), cancelled=False, waited=True) is None
    assert _charged_until(None, cancelled=False, waited=True) is None
    assert _charged_until(_gang(live=1, pods_end=T0 + 13), cancelled=True, waited=True) is None
