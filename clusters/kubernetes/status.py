"""From gang objects and their pods to `GangStatus`: the one place that reads Kubernetes phases.

A gang's fate is told differently by the two kinds of object: an Indexed Job by its conditions (and
the reason on `Failed` says whether a disruption or a container ended it), a Volcano Job by its state
and the event that triggered its policy. Both are mapped here, as pure functions, to the same five
outcomes, so that federation's restart policy sees "evicted" the same way from every cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from clusters.api import GangPhase, GangStatus
from clusters.kubernetes.inventory import ATTEMPT_KEY as ATTEMPT_KEY
from clusters.kubernetes.inventory import JOB_ID_KEY as JOB_ID_KEY
from clusters.kubernetes.inventory import PodInfo, parse_time_s
from placement.model import JobId, NodeShare, TenantId

Json = dict[str, Any]

TENANT_KEY = "gpufed.io/tenant"
REPLICAS_KEY = "gpufed.io/replicas"
# Set on the gang just before `evict` deletes it, so the deletion reads as an eviction.
EVICTED_KEY = "gpufed.io/evicted"
# The gang's Secret (clusters.kubernetes.secret_objects) by name, or NO_SECRET: set on the gang object
# when it is created, so that deleting a gang that has none costs no call. A gang made before gpufed
# said so has neither, and its Secret is deleted by name as before.
SECRET_KEY = "gpufed.io/secret"
NO_SECRET = "none"
MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpufed"

# A Job that a disruption (eviction, lost node) ended; our podFailurePolicy's only rule gives this.
_DISRUPTED = frozenset({"PodFailurePolicy"})
_VOLCANO_EVICTED = frozenset({"PodEvicted"})


class GangKind(StrEnum):
    INDEXED_JOB = "batch/v1 Job"
    VOLCANO_JOB = "batch.volcano.sh/v1alpha1 Job"


@dataclass(frozen=True, slots=True)
class Outcome:
    phase: GangPhase
    message: str
    at_s: float | None


@dataclass(frozen=True, slots=True)
class GangObject:
    """A gang object reduced to what its status needs."""

    kind: GangKind
    namespace: str
    name: str
    uid: str
    job_id: JobId
    attempt: int
    tenant: TenantId
    replicas: int
    # Set once the object says how it ended; None while it may still run.
    outcome: Outcome | None
    # Volcano's own view that the gang runs (minAvailable pods up), with the time it began.
    running_since_s: float | None
    # When deletion was asked for (metadata.deletionTimestamp); the object lingers until pods are gone.
    deleting_since_s: float | None
    evicted_reason: str | None
    # Whether the gang may have a Secret of its own to delete with it (see SECRET_KEY).
    may_have_secret: bool = True

    @property
    def key(self) -> tuple[JobId, int]:
        return (self.job_id, self.attempt)


@dataclass(slots=True)
class PodSummary:
    """What a gang's pods say: how many run, when the last of them started, why one failed."""

    running: int = 0
    started_at_s: float | None = None
    failure: str = ""
    # GPUs the gang's unfinished pods hold, by node name.
    gpus_by_node: dict[str, int] = field(default_factory=dict)
    # GPUs of the gang's pods that were ever bound to a node, finished or not: what the inventory
    # has accounted for (held, or held and given back), as opposed to pods still waiting for a node.
    placed_gpus: int = 0
    # Pods not finished (pending, running, or stopping after a deletion).
    live: int = 0
    # The job and attempt the pods say they ran for (None for pods made before pods said so).
    key: tuple[JobId, int] | None = None
    # Pods finished (Succeeded or Failed) with their containers' finishedAt, when the last of them
    # ended, and whether a finished pod did not say when (evicted before its container ran, say).
    finished: int = 0
    ended_at_s: float | None = None
    end_unknown: bool = False


def _batch_outcome(status: Json) -> Outcome | None:
    for condition in status.get("conditions") or ():
        if condition.get("status") != "True":
            continue
        kind = condition.get("type")
        reason = str(condition.get("reason") or "")
        at_s = parse_time_s(condition.get("lastTransitionTime")) or parse_time_s(status.get("completionTime"))
        message = str(condition.get("message") or reason)
        # FailureTarget and SuccessCriteriaMet come first on current clusters; they are decided ends.
        if kind in {"Failed", "FailureTarget"}:
            phase = GangPhase.EVICTED if reason in _DISRUPTED else GangPhase.FAILED
            return Outcome(phase, f"{reason}: {message}" if message != reason else reason, at_s)
        if kind in {"Complete", "SuccessCriteriaMet"}:
            return Outcome(GangPhase.SUCCEEDED, "completed", at_s)
    return None


def _volcano_outcome(state: Json) -> Outcome | None:
    phase = state.get("phase")
    reason = str(state.get("reason") or "")
    at_s = parse_time_s(state.get("lastTransitionTime"))
    evicted = reason in _VOLCANO_EVICTED
    suffix = f" ({reason})" if reason else ""
    if phase == "Completed":
        return Outcome(GangPhase.SUCCEEDED, "completed", at_s)
    if phase in {"Aborted", "Failed"}:
        return Outcome(GangPhase.EVICTED if evicted else GangPhase.FAILED, f"{phase}{suffix}", at_s)
    if phase == "Terminated":
        return Outcome(GangPhase.EVICTED if evicted else GangPhase.CANCELLED, f"{phase}{suffix}", at_s)
    return None


def _text(meta: Json, key: str) -> str | None:
    """The exact value from the annotation, else the (possibly shortened) label."""
    value = (meta.get("annotations") or {}).get(key) or (meta.get("labels") or {}).get(key)
    return str(value) if value is not None else None


def gang_object(obj: Json, kind: GangKind) -> GangObject | None:
    """None for an object that is not one of gpufed's gangs (labels missing or garbled)."""
    meta = obj.get("metadata") or {}
    job_id = _text(meta, JOB_ID_KEY)
    attempt = _text(meta, ATTEMPT_KEY)
    if job_id is None or attempt is None or not attempt.isdigit():
        return None
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    running_since_s = None
    if kind is GangKind.INDEXED_JOB:
        replicas = int(spec.get("completions") or spec.get("parallelism") or 0)
        outcome = _batch_outcome(status)
    else:
        replicas = sum(int(t.get("replicas") or 0) for t in spec.get("tasks") or ())
        state = status.get("state") or {}
        outcome = _volcano_outcome(state)
        if state.get("phase") in {"Running", "Completing"}:
            running_since_s = parse_time_s(state.get("lastTransitionTime"))
            running_since_s = running_since_s if running_since_s is not None else 0.0
    return GangObject(
        kind=kind,
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        job_id=JobId(job_id),
        attempt=int(attempt),
        tenant=TenantId(_text(meta, TENANT_KEY) or ""),
        replicas=replicas,
        outcome=outcome,
        running_since_s=running_since_s,
        deleting_since_s=(
            parse_time_s(meta["deletionTimestamp"]) or 0.0 if meta.get("deletionTimestamp") else None
        ),
        evicted_reason=(meta.get("annotations") or {}).get(EVICTED_KEY),
        may_have_secret=(meta.get("annotations") or {}).get(SECRET_KEY) != NO_SECRET,
    )


def summarize_pods(pods: Iterable[PodInfo]) -> dict[tuple[str, str], PodSummary]:
    """Per (namespace, gang): one pass over the pod cache for every gang's status."""
    summaries: dict[tuple[str, str], PodSummary] = {}
    for pod in pods:
        if pod.gang is None:
            continue
        summary = summaries.setdefault((pod.namespace, pod.gang), PodSummary())
        if pod.started_at_s is not None:
            summary.started_at_s = max(summary.started_at_s or 0.0, pod.started_at_s)
        if pod.holds_gpus and pod.gpus and pod.node_name is not None:
            summary.gpus_by_node[pod.node_name] = summary.gpus_by_node.get(pod.node_name, 0) + pod.gpus
        if pod.node_name is not None:
            summary.placed_gpus += pod.gpus
        if pod.live:
            summary.live += 1
        if not pod.live:
            if pod.finished_at_s is None:
                summary.end_unknown = True
            else:
                summary.finished += 1
                summary.ended_at_s = max(summary.ended_at_s or 0.0, pod.finished_at_s)
        if summary.key is None and pod.job_id is not None and pod.attempt is not None:
            summary.key = (JobId(pod.job_id), pod.attempt)
        if pod.phase == "Running":
            summary.running += 1
        elif pod.failure and not summary.failure:
            summary.failure = f"pod {pod.name}: {pod.failure}"
    return summaries


def node_shares(
    gpus_by_node: Mapping[str, int], positions: Mapping[str, tuple[str, int]]
) -> tuple[NodeShare, ...]:
    """The gang's GPUs by inventory position; none at all if a node is not in the inventory
    (cordoned, NotReady, unpriced), since a partial location would miscount what evicting frees."""
    shares = []
    for node, gpus in gpus_by_node.items():
        position = positions.get(node)
        if position is None:
            return ()
        shares.append(NodeShare(position[0], position[1], gpus))
    return tuple(sorted(shares, key=lambda n: (n.pool, n.node_index)))


def gang_status(
    gang: GangObject,
    pods: PodSummary | None,
    *,
    now_s: float,
    positions: Mapping[str, tuple[str, int]] | None = None,
) -> GangStatus:
    pods = pods or PodSummary()
    started_at_s = pods.started_at_s if pods.started_at_s is not None else gang.running_since_s or None
    outcome = gang.outcome
    if outcome is None and gang.deleting_since_s is not None:
        # Deleted while it could still run: gpufed (or an operator) stopped it.
        at_s = gang.deleting_since_s or now_s
        if gang.evicted_reason is not None:
            outcome = Outcome(GangPhase.EVICTED, gang.evicted_reason, at_s)
        else:
            outcome = Outcome(GangPhase.CANCELLED, "deleted", at_s)
    if outcome is not None:
        message = outcome.message
        if outcome.phase is GangPhase.FAILED and pods.failure:
            message = f"{message}; {pods.failure}"
        return GangStatus(
            job_id=gang.job_id,
            attempt=gang.attempt,
            phase=outcome.phase,
            message=message,
            started_at_s=started_at_s,
            finished_at_s=outcome.at_s if outcome.at_s is not None else now_s,
            live_pods=pods.live,
            pods_ended_at_s=pods_ended_at_s(pods, gang.replicas),
        )
    running = gang.running_since_s is not None or (gang.replicas > 0 and pods.running >= gang.replicas)
    if running:
        return GangStatus(
            job_id=gang.job_id,
            attempt=gang.attempt,
            phase=GangPhase.RUNNING,
            message=f"{pods.running} of {gang.replicas} pods running",
            started_at_s=started_at_s if started_at_s is not None else now_s,
            nodes=node_shares(pods.gpus_by_node, positions) if positions is not None else (),
            # The gang's object can say Running before the pod watch has shown its pods bound.
            bound_gpus=pods.placed_gpus,
            live_pods=pods.live,
        )
    # Pods already bound hold their GPUs in the inventory; the federation holds back only the rest.
    return GangStatus(
        job_id=gang.job_id,
        attempt=gang.attempt,
        phase=GangPhase.PENDING,
        message=f"{pods.running} of {gang.replicas} pods running",
        nodes=node_shares(pods.gpus_by_node, positions) if positions is not None else (),
        bound_gpus=pods.placed_gpus,
        live_pods=pods.live,
    )


def pods_ended_at_s(pods: PodSummary, replicas: int) -> float | None:
    """When the gang's pods ended, if every replica's pod is there, finished, with its end time.
    A pod deleted outright leaves no pod behind: then the count falls short and the end is unknown."""
    if pods.live or pods.end_unknown or replicas <= 0 or pods.finished < replicas:
        return None
    return pods.ended_at_s


def gang_statuses(
    gangs: Iterable[GangObject],
    pods: Mapping[tuple[str, str], PodSummary],
    *,
    now_s: float,
    positions: Mapping[str, tuple[str, int]] | None = None,
) -> list[GangStatus]:
    return [gang_status(g, pods.get((g.namespace, g.name)), now_s=now_s, positions=positions) for g in gangs]


def orphan_statuses(
    pods: Mapping[tuple[str, str], PodSummary],
    gangs: Iterable[GangObject],
    ended: Mapping[tuple[JobId, int], GangStatus],
) -> list[GangStatus]:
    """Attempts whose pods outlived their gang object: deleted with `--cascade=orphan`, or deleted
    in the background while the pods still stop. Reported `orphaned`, with the pods still live, so
    that federation neither starts the next attempt beside them nor closes the ledger early.

    `ended` holds what the backend remembers of gangs it stopped itself; their outcome stands.
    """
    have = {(g.namespace, g.name) for g in gangs}
    found: list[GangStatus] = []
    for where, summary in sorted(pods.items()):
        if where in have or summary.key is None:
            continue
        known = ended.get(summary.key)
        if known is not None:
            found.append(replace(known, live_pods=summary.live, orphaned=True))
            continue
        found.append(
            GangStatus(
                job_id=summary.key[0],
                attempt=summary.key[1],
                phase=GangPhase.CANCELLED,
                message=f"gang object deleted; {summary.live} of its pods left",
                started_at_s=summary.started_at_s,
                live_pods=summary.live,
                orphaned=True,
            )
        )
    return found
