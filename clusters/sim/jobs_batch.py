"""The `batch/v1` Job controller: pods per completion index, failure policy, deadline, completion.

gpufed's backend creates Indexed Jobs with `backoffLimit: 0` and a `podFailurePolicy` that fails the
Job on `DisruptionTarget`, and reads the outcome from the Job's conditions. So the reasons matter:
`PodFailurePolicy` when a disruption (eviction, lost node) ended it, `BackoffLimitExceeded` when a
container failed, `DeadlineExceeded` when it ran past `activeDeadlineSeconds`. The controller keeps
the pods it has counted per Job in memory, so counts stay right when pods are deleted afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clusters.sim import podstatus
from clusters.sim.admission import CONTROLLER_UID, Admission, random_suffix
from clusters.sim.clock import Clock, parse_rfc3339, rfc3339
from clusters.sim.errors import ApiError
from clusters.sim.events import EventRecorder
from clusters.sim.job_failure_policy import rule_matches, rule_subject
from clusters.sim.lifecycle import Lifecycle
from clusters.sim.resources import BATCH_JOBS, PODS
from clusters.sim.selectors import LabelSelector, Op, Requirement
from clusters.sim.store import Change, EventType, Key, Store, clone, edit, key_of
from clusters.sim.timers import Timers

Obj = dict[str, Any]
INDEX = "batch.kubernetes.io/job-completion-index"
COMPONENT = "job-controller"
# Held on every pod the controller creates until it has counted the pod's end, so that a pod
# deleted (evicted, drained) before the controller looked is still counted, as on a real cluster.
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"


@dataclass(slots=True)
class _Tally:
    """What the controller has counted for one Job; the Job's status is rebuilt from it."""

    succeeded: int = 0
    failed: int = 0
    counted: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)
    done_indexes: set[int] = field(default_factory=set)
    deadline_armed: bool = False
    # Pods deleted because the Job was suspended: their end counts neither way.
    suspended: set[str] = field(default_factory=set)


def owner_job(pod: Obj) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Job" and ref.get("apiVersion") == "batch/v1" and ref.get("controller"):
            return str(ref.get("name"))
    return None


def _finished(job: Obj) -> str | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def _compress(indexes: set[int]) -> str:
    """`completedIndexes` as a real controller writes it: "0-3,5"."""
    out: list[str] = []
    ordered = sorted(indexes)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


class BatchJobController:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        timers: Timers,
        recorder: EventRecorder,
        admission: Admission,
        lifecycle: Lifecycle,
    ) -> None:
        self._store = store
        self._clock = clock
        self._timers = timers
        self._recorder = recorder
        self._admission = admission
        self._lifecycle = lifecycle
        self._dirty: set[Key] = set()
        self._tallies: dict[str, _Tally] = {}
        self._pods_to_release: set[Key] = set()

    def observe(self, change: Change) -> None:
        if change.rt is BATCH_JOBS:
            if change.type is EventType.DELETED:
                self._tallies.pop(change.obj["metadata"]["uid"], None)
            else:
                self._dirty.add(key_of(change.obj))
        elif change.rt is PODS:
            job = owner_job(change.obj)
            if job is not None:
                self._dirty.add((change.obj["metadata"].get("namespace", ""), job))
            if change.type is not EventType.DELETED and TRACKING_FINALIZER in (
                change.obj["metadata"].get("finalizers") or []
            ):
                self._pods_to_release.add(key_of(change.obj))

    def sync(self) -> bool:
        if not self._dirty and not self._pods_to_release:
            return False
        dirty, self._dirty = self._dirty, set()
        for namespace, name in sorted(dirty):
            job = self._store.get(BATCH_JOBS, namespace, name)
            if job is not None and not podstatus.is_deleting(job):
                self._sync_job(job)
        # After the Jobs above have counted them: ended pods no longer need holding.
        release, self._pods_to_release = self._pods_to_release, set()
        for key in release:
            pod = self._store.get(PODS, *key)
            if pod is None:
                continue
            ended = podstatus.is_terminal(pod) or (
                podstatus.is_deleting(pod) and podstatus.node_name(pod) is None
            )
            if ended:
                freed = edit(pod)
                kept = [f for f in freed["metadata"].get("finalizers") or [] if f != TRACKING_FINALIZER]
                freed["metadata"]["finalizers"] = kept
                self._store.update(PODS, freed)
        return True

    def _pods(self, job: Obj) -> list[Obj]:
        uid = job["metadata"]["uid"]
        selector = LabelSelector((Requirement(CONTROLLER_UID, Op.EQ, frozenset({uid})),))
        return [
            p
            for p in self._store.list(PODS, job["metadata"]["namespace"], selector)
            if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
        ]

    def _sync_job(self, job: Obj) -> None:
        m = job["metadata"]
        spec = job["spec"]
        tally = self._tallies.setdefault(m["uid"], _Tally())
        new = edit(job, "status")
        status = new.setdefault("status", {})
        wall_s = self._clock.wall_s()
        pods = self._pods(job)
        finished = _finished(job)
        if finished is None and spec.get("suspend"):
            self._suspend(new, pods, tally, wall_s)
            return
        if (podstatus.condition(job, "Suspended") or {}).get("status") == "True":
            # Resumed: the deadline counts again from now, as the docs say of startTime.
            podstatus.set_condition(new, "Suspended", "False", wall_s, "JobResumed", "Job resumed")
            status["startTime"] = rfc3339(wall_s)
            tally.deadline_armed = False
            self._recorder.record(BATCH_JOBS, new, "Resumed", "Job resumed", component=COMPONENT)
        status.setdefault("startTime", rfc3339(wall_s))
        failure: tuple[str, str] | None = None
        present: set[str] = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            present.add(uid)
            if uid in tally.suspended:
                tally.active.discard(uid)
                continue
            if podstatus.is_terminal(pod):
                tally.active.discard(uid)
                if uid in tally.counted:
                    continue
                tally.counted.add(uid)
                if podstatus.phase(pod) == "Succeeded":
                    tally.succeeded += 1
                    index = _index_of(pod)
                    if index is not None:
                        tally.done_indexes.add(index)
                elif finished is None and failure is None:
                    failure = self._count_failure(job, pod, tally)
            elif not podstatus.is_deleting(pod):
                tally.active.add(uid)
        vanished = tally.active - present
        if vanished and finished is None:
            # A pod deleted while it ran counts as failed, as pod-tracking finalizers make it count.
            tally.failed += len(vanished)
        tally.active -= vanished
        completions = int(spec.get("completions") or 1)
        if finished is None and failure is None and tally.failed > int(spec.get("backoffLimit", 6)):
            failure = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        if finished is None and failure is None:
            failure = self._check_deadline(job, status, tally)
        active = [p for p in pods if not podstatus.is_terminal(p) and not podstatus.is_deleting(p)]
        if failure is not None:
            self._fail(new, failure, active, wall_s)
            active = []
        elif finished is None:
            indexed = spec.get("completionMode") == "Indexed"
            done = len(tally.done_indexes) if indexed else tally.succeeded
            if done >= completions:
                self._complete(new, active, wall_s)
                active = []
            else:
                holding = active
                if spec.get("podReplacementPolicy") == "Failed":
                    holding = [p for p in pods if not podstatus.is_terminal(p)]
                active += self._create_missing(job, holding, tally, completions, indexed)
        elif active:
            self._terminate(job, active)
            active = []
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if podstatus.phase(p) == "Running")
        status["terminating"] = sum(
            1 for p in pods if podstatus.is_deleting(p) and not podstatus.is_terminal(p)
        )
        status["succeeded"] = tally.succeeded
        status["failed"] = tally.failed
        status["uncountedTerminatedPods"] = {}
        if spec.get("completionMode") == "Indexed":
            status["completedIndexes"] = _compress(tally.done_indexes)
        self._store.update(BATCH_JOBS, new)

    def _suspend(self, job: Obj, pods: list[Obj], tally: _Tally, wall_s: float) -> None:
        """No pods while suspended: the running ones are deleted, and they count as nothing."""
        status = job["status"]
        active = [p for p in pods if not podstatus.is_terminal(p) and not podstatus.is_deleting(p)]
        for pod in active:
            tally.suspended.add(pod["metadata"]["uid"])
            tally.active.discard(pod["metadata"]["uid"])
        self._terminate(job, active)
        if (podstatus.condition(job, "Suspended") or {}).get("status") != "True":
            podstatus.set_condition(job, "Suspended", "True", wall_s, "JobSuspended", "Job suspended")
            self._recorder.record(BATCH_JOBS, job, "Suspended", "Job suspended", component=COMPONENT)
        status.pop("startTime", None)
        status["active"] = 0
        status["ready"] = 0
        status["terminating"] = sum(
            1 for p in pods if podstatus.is_deleting(p) and not podstatus.is_terminal(p)
        ) + len(active)
        status.setdefault("succeeded", tally.succeeded)
        status.setdefault("failed", tally.failed)
        self._store.update(BATCH_JOBS, job)

    def _count_failure(self, job: Obj, pod: Obj, tally: _Tally) -> tuple[str, str] | None:
        """Apply the pod failure policy to one failed pod; a (reason, message) fails the Job."""
        rules = ((job["spec"].get("podFailurePolicy") or {}).get("rules")) or []
        for i, rule in enumerate(rules):
            if not rule_matches(rule, pod):
                continue
            action = rule.get("action")
            pod_ref = f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
            if action == "FailJob":
                what = rule_subject(rule)
                return ("PodFailurePolicy", f"Pod {pod_ref} has {what} matching FailJob rule at index {i}")
            if action == "Ignore":
                return None
            break
        tally.failed += 1
        return None

    def _check_deadline(self, job: Obj, status: Obj, tally: _Tally) -> tuple[str, str] | None:
        deadline = job["spec"].get("activeDeadlineSeconds")
        if deadline is None:
            return None
        elapsed = self._clock.wall_s() - parse_rfc3339(status["startTime"])
        if elapsed >= float(deadline):
            return ("DeadlineExceeded", "Job was active longer than specified deadline")
        if not tally.deadline_armed:
            tally.deadline_armed = True
            key = key_of(job)
            self._timers.after(float(deadline) - elapsed, lambda: self._dirty.add(key))
        return None

    def _fail(self, job: Obj, failure: tuple[str, str], active: list[Obj], wall_s: float) -> None:
        reason, message = failure
        podstatus.set_condition(job, "FailureTarget", "True", wall_s, reason, message)
        podstatus.set_condition(job, "Failed", "True", wall_s, reason, message)
        self._recorder.record(BATCH_JOBS, job, reason, message, warning=True, component=COMPONENT)
        self._terminate(job, active)

    def _complete(self, job: Obj, active: list[Obj], wall_s: float) -> None:
        podstatus.set_condition(
            job,
            "SuccessCriteriaMet",
            "True",
            wall_s,
            "CompletionsReached",
            "Reached expected number of succeeded pods",
        )
        podstatus.set_condition(
            job, "Complete", "True", wall_s, "CompletionsReached", "Reached expected number of succeeded pods"
        )
        job["status"]["completionTime"] = rfc3339(wall_s)
        self._recorder.record(BATCH_JOBS, job, "Completed", "Job completed", component=COMPONENT)
        self._terminate(job, active)

    def _terminate(self, job: Obj, pods: list[Obj]) -> None:
        for pod in pods:
            name = pod["metadata"]["name"]
            self._lifecycle.delete(PODS, pod["metadata"]["namespace"], name)
            self._recorder.record(
                BATCH_JOBS, job, "SuccessfulDelete", f"Deleted pod: {name}", component=COMPONENT
            )

    def _create_missing(
        self, job: Obj, active: list[Obj], tally: _Tally, completions: int, indexed: bool
    ) -> list[Obj]:
        parallelism = int(job["spec"].get("parallelism") or 1)
        room = parallelism - len(active)
        if indexed:
            busy = {_index_of(p) for p in active}
            wanted: list[int | None] = [
                i for i in range(completions) if i not in tally.done_indexes and i not in busy
            ]
        else:
            wanted = [None] * max(0, completions - tally.succeeded - len(active))
        created: list[Obj] = []
        for index in wanted[: max(0, room)]:
            try:
                pod = self._admission.admit_create(
                    PODS, self._pod_for(job, index), job["metadata"]["namespace"]
                )
            except ApiError as error:
                # Refused at admission (Pod Security): the Job controller reports it and retries later.
                self._recorder.record(
                    BATCH_JOBS,
                    job,
                    "FailedCreate",
                    f"Error creating: {error.message}",
                    warning=True,
                    component=COMPONENT,
                )
                break
            created.append(self._store.create(PODS, pod))
            self._recorder.record(
                BATCH_JOBS,
                job,
                "SuccessfulCreate",
                f"Created pod: {pod['metadata']['name']}",
                component=COMPONENT,
            )
        return created

    def _pod_for(self, job: Obj, index: int | None) -> Obj:
        m = job["metadata"]
        template = clone(job["spec"]["template"])
        tm = template.get("metadata") or {}
        spec = template.get("spec") or {}
        labels = dict(tm.get("labels") or {})
        annotations = dict(tm.get("annotations") or {})
        name = f"{m['name']}-{random_suffix()}"
        if index is not None:
            labels[INDEX] = str(index)
            annotations[INDEX] = str(index)
            name = f"{m['name']}-{index}-{random_suffix()}"
            spec["hostname"] = f"{m['name']}-{index}"
            for c in spec.get("containers") or []:
                env = c.setdefault("env", [])
                env.append(
                    {
                        "name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX}']"}},
                    }
                )
        return {
            "metadata": {
                "name": name,
                "namespace": m["namespace"],
                "labels": labels,
                "annotations": annotations,
                "finalizers": [TRACKING_FINALIZER],
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": m["name"],
                        "uid": m["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }


def _index_of(pod: Obj) -> int | None:
    text = (pod["metadata"].get("annotations") or {}).get(INDEX)
    return int(text) if text is not None and text.isdigit() else None
