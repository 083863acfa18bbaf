"""The Volcano Job controller: a PodGroup, a headless Service and pods per task, and the policies.

gpufed's backend creates `batch.volcano.sh/v1alpha1` Jobs with `PodEvicted`/`PodFailed: AbortJob`
and `TaskCompleted: CompleteJob` and reads `status.state.phase` and `reason`; users also set
`RestartJob` with `maxRetry`. The phases follow Volcano's state machine: Pending -> Running ->
Completing/Completed, Aborting/Aborted, Terminating/Terminated, Restarting -> Pending, Failed.
Without a matching policy a Job ends when all its pods have ended: Completed if at least
`minAvailable` succeeded, Failed otherwise (Volcano's own rule).

A pod of the Job deleted by anyone but the controller (a drain, `kubectl delete pod`, the pod
garbage collector) is a `PodEvicted` event, as Volcano's pod-delete handler makes it: the Job's
policy for it applies, and only without one is the pod recreated (Volcano's default SyncJob).
Every kill (AbortJob, TerminateJob, CompleteJob, RestartJob) bumps `status.version`; RestartJob
counts `retryCount` and fails the Job once it reaches `maxRetry`. Pods carry the version they were
created at (`volcano.sh/job-version`), and events of pods from an older version are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clusters.sim import podstatus
from clusters.sim.admission import Admission
from clusters.sim.clock import Clock, rfc3339
from clusters.sim.errors import ApiError
from clusters.sim.events import EventRecorder
from clusters.sim.lifecycle import Lifecycle
from clusters.sim.resources import POD_GROUPS, PODS, SERVICES, VOLCANO_JOBS
from clusters.sim.selectors import LabelSelector, Op, Requirement
from clusters.sim.store import Change, EventType, Key, Store, edit, key_of
from clusters.sim.volcano_pods import JOB_NAME, owner_ref, owner_vcjob, pod_for, version_of

Obj = dict[str, Any]
COMPONENT = "vc-controller-manager"
# Phases in which the controller keeps the pods it wants present.
_ACTIVE = {"Pending", "Running"}
_FINAL = {"Completed", "Aborted", "Terminated", "Failed"}
# What an action turns the Job into while pods are stopping, and once they have stopped.
_ENDINGS = {
    "AbortJob": ("Aborting", "Aborted"),
    "TerminateJob": ("Terminating", "Terminated"),
    "CompleteJob": ("Completing", "Completed"),
}
_FINISHED = dict(_ENDINGS.values())


@dataclass(slots=True)
class _Seen:
    handled: set[str] = field(default_factory=set)
    # Pods of the Job deleted by someone else, not yet acted on.
    deleted: list[Obj] = field(default_factory=list)


_RESTARTS = ("RestartJob", "RestartTask", "RestartPod")


def _action_for(job: Obj, task: str | None, event: str) -> str | None:
    """Task policies first, then the Job's; the first whose event matches decides."""
    tasks = {t.get("name"): t for t in job["spec"].get("tasks") or []}
    scopes = [(tasks.get(task) or {}).get("policies") or [], job["spec"].get("policies") or []]
    for policies in scopes:
        for policy in policies:
            events = list(policy.get("events") or []) + ([policy["event"]] if policy.get("event") else [])
            if event in events or "*" in events:
                return str(policy.get("action"))
    return None


# Volcano Jobs synced a round (see `VolcanoJobController.sync`).
SYNC_BATCH = 16


class VolcanoJobController:
    def __init__(
        self, store: Store, clock: Clock, recorder: EventRecorder, admission: Admission, lifecycle: Lifecycle
    ) -> None:
        self._store = store
        self._clock = clock
        self._recorder = recorder
        self._admission = admission
        self._lifecycle = lifecycle
        self._dirty: set[Key] = set()
        # Dirty jobs a round left for the next (`sync`), in the order they are to be synced.
        self._backlog: list[Key] = []
        self._seen: dict[str, _Seen] = {}
        # Pods this controller deleted itself: their deletion is no eviction.
        self._killed: set[str] = set()

    def observe(self, change: Change) -> None:
        if change.rt is VOLCANO_JOBS:
            if change.type is EventType.DELETED:
                self._seen.pop(change.obj["metadata"]["uid"], None)
            else:
                self._dirty.add(key_of(change.obj))
        elif change.rt is PODS:
            job = owner_vcjob(change.obj)
            if job is not None:
                self._dirty.add((change.obj["metadata"].get("namespace", ""), job))
                # Volcano's pod handlers take a pod marked for deletion as deleted already.
                if change.type is EventType.DELETED or podstatus.is_deleting(change.obj):
                    self._deleted(change.obj, change.type is EventType.DELETED)

    def _deleted(self, pod: Obj, gone: bool) -> None:
        uid = pod["metadata"]["uid"]
        if uid in self._killed:
            if gone:
                self._killed.discard(uid)
            return
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("uid") in self._seen:
                self._seen[ref["uid"]].deleted.append(pod)

    def sync(self) -> bool:
        if not self._dirty and not self._backlog:
            return False
        # A few jobs a round, the rest kept for the next, ahead of newer ones (so none waits for
        # ever): a burst of new Volcano Jobs synced in one call held the simulator's shared event
        # loop for up to 256 ms (bench/scale.py); the engine hands the loop on between rounds, so
        # other clusters' calls are answered meanwhile.
        waiting = self._backlog + sorted(self._dirty.difference(self._backlog))
        self._dirty = set()
        dirty, self._backlog = waiting[:SYNC_BATCH], waiting[SYNC_BATCH:]
        for namespace, name in dirty:
            job = self._store.get(VOLCANO_JOBS, namespace, name)
            if job is not None and not podstatus.is_deleting(job):
                self._sync_job(job)
        return True

    def _pods(self, job: Obj) -> list[Obj]:
        m = job["metadata"]
        selector = LabelSelector((Requirement(JOB_NAME, Op.EQ, frozenset({m["name"]})),))
        return [
            p
            for p in self._store.list(PODS, m["namespace"], selector)
            if any(r.get("uid") == m["uid"] for r in p["metadata"].get("ownerReferences") or [])
        ]

    def _sync_job(self, job: Obj) -> None:
        m = job["metadata"]
        spec = job["spec"]
        new = edit(job, "status")
        status = new.setdefault("status", {})
        status.setdefault("state", {})
        wall_s = self._clock.wall_s()
        if not status["state"].get("phase"):
            self._ensure_dependents(job)
            self._set_phase(new, "Pending", wall_s)
            status.setdefault("retryCount", 0)
            status.setdefault("version", 0)
        seen = self._seen.setdefault(m["uid"], _Seen())
        pods = self._pods(job)
        phase = status["state"]["phase"]
        version = int(status.get("version", 0))
        entered = phase
        if phase in _ACTIVE:
            action, event, message = self._triggered(job, pods, seen, version)
            if action in _ENDINGS:
                self._set_phase(new, _ENDINGS[action][0], wall_s, event, message)
                status["version"] = version + 1
                self._event(new, action, f"Start to execute action {action}")
            elif action in _RESTARTS:
                status["retryCount"] = int(status.get("retryCount", 0)) + 1
                status["version"] = version + 1
                self._set_phase(new, "Restarting", wall_s, event, message)
                self._event(new, action, f"Start to execute action {action}")
        else:
            seen.deleted.clear()
        phase = status["state"]["phase"]
        live = [p for p in pods if not podstatus.is_terminal(p)]
        if phase in _ACTIVE:
            pods += self._create_missing(new, {p["metadata"]["name"] for p in pods})
            self._progress(new, pods, wall_s)
        elif phase in ("Aborting", "Terminating", "Completing") or phase in _FINAL:
            self._kill(live)
            if phase not in _FINAL and not live:
                self._set_phase(
                    new,
                    _FINISHED[phase],
                    wall_s,
                    status["state"].get("reason"),
                    status["state"].get("message"),
                )
        elif phase == "Restarting":
            self._kill(pods, grace_s=0)
            state = status["state"]
            if entered != "Restarting":
                # Restarting is committed first, as Volcano's KillJob writes it; the next round goes on.
                self._dirty.add(key_of(job))
            elif int(status.get("retryCount", 0)) >= int(spec.get("maxRetry", 3)):
                self._set_phase(
                    new,
                    "Failed",
                    wall_s,
                    state.get("reason"),
                    f"job has reached the maximum retries: {state.get('message', '')}",
                )
            elif not self._pods(job):
                seen.handled.clear()
                self._set_phase(new, "Pending", wall_s)
                pods = self._create_missing(new, set())
        self._count(new, self._pods(job))
        self._store.update(VOLCANO_JOBS, new)
        self._sync_pod_group(new)

    def _triggered(self, job: Obj, pods: list[Obj], seen: _Seen, version: int) -> tuple[str | None, str, str]:
        deleted, seen.deleted = seen.deleted, []
        for pod in deleted:
            uid = pod["metadata"]["uid"]
            if uid in seen.handled or version_of(pod) < version:
                continue
            seen.handled.add(uid)
            task = (pod["metadata"].get("annotations") or {}).get("volcano.sh/task-spec")
            action = _action_for(job, task, "PodEvicted")
            if action is not None:
                return action, "PodEvicted", f"pod {pod['metadata']['name']} was deleted"
        for pod in pods:
            if version_of(pod) < version:
                continue
            uid = pod["metadata"]["uid"]
            if podstatus.phase(pod) != "Failed" or uid in seen.handled:
                continue
            seen.handled.add(uid)
            disrupted = (podstatus.condition(pod, podstatus.DISRUPTION_TARGET) or {}).get("status") == "True"
            event = "PodEvicted" if disrupted else "PodFailed"
            task = (pod["metadata"].get("annotations") or {}).get("volcano.sh/task-spec")
            action = _action_for(job, task, event)
            if action is not None:
                return (
                    action,
                    event,
                    f"pod {pod['metadata']['name']} {'was evicted' if disrupted else 'failed'}",
                )
        for task in job["spec"].get("tasks") or []:
            name = task["name"]
            mine = [
                p
                for p in pods
                if (p["metadata"].get("annotations") or {}).get("volcano.sh/task-spec") == name
            ]
            done = sum(1 for p in mine if podstatus.phase(p) == "Succeeded")
            if mine and done >= int(task.get("replicas", 1)):
                action = _action_for(job, name, "TaskCompleted")
                if action is not None:
                    return action, "TaskCompleted", f"task {name} completed"
        return None, "", ""

    def _progress(self, job: Obj, pods: list[Obj], wall_s: float) -> None:
        """Pending -> Running -> Completed or Failed, by Volcano's default rule."""
        state = job["status"]["state"]
        min_available = int(job["spec"].get("minAvailable", 1))
        total = sum(int(t.get("replicas", 1)) for t in job["spec"].get("tasks") or [])
        running = sum(1 for p in pods if podstatus.phase(p) == "Running")
        succeeded = sum(1 for p in pods if podstatus.phase(p) == "Succeeded")
        failed = sum(1 for p in pods if podstatus.phase(p) == "Failed")
        if succeeded + failed >= total and pods:
            self._set_phase(job, "Completed" if succeeded >= min_available else "Failed", wall_s)
        elif state["phase"] == "Pending" and running + succeeded >= min_available:
            self._set_phase(job, "Running", wall_s)

    def _set_phase(
        self, job: Obj, phase: str, wall_s: float, reason: str | None = None, message: str | None = None
    ) -> None:
        status = job["status"]
        if status.get("state", {}).get("phase") == phase:
            return
        stamp = rfc3339(wall_s)
        state: Obj = {"phase": phase, "lastTransitionTime": stamp}
        if reason:
            state["reason"] = reason
        if message:
            state["message"] = message
        status["state"] = state
        status.setdefault("conditions", []).append({"status": phase, "lastTransitionTime": stamp})

    def _event(self, job: Obj, reason: str, message: str) -> None:
        self._recorder.record(VOLCANO_JOBS, job, reason, message, component=COMPONENT)

    def _kill(self, pods: list[Obj], grace_s: float | None = None) -> None:
        for pod in pods:
            self._killed.add(pod["metadata"]["uid"])
            if not podstatus.is_deleting(pod) or grace_s == 0:
                self._lifecycle.delete(
                    PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], grace_s=grace_s
                )

    def _count(self, job: Obj, pods: list[Obj]) -> None:
        status = job["status"]
        counts = {"Pending": 0, "Running": 0, "Succeeded": 0, "Failed": 0}
        tasks: dict[str, dict[str, int]] = {}
        terminating = 0
        for pod in pods:
            phase = podstatus.phase(pod)
            if podstatus.is_deleting(pod) and phase not in podstatus.TERMINAL_PHASES:
                terminating += 1
                continue
            counts[phase] = counts.get(phase, 0) + 1
            task = (pod["metadata"].get("annotations") or {}).get("volcano.sh/task-spec", "")
            tasks.setdefault(task, {}).setdefault(phase, 0)
            tasks[task][phase] += 1
        status.update(
            minAvailable=int(job["spec"].get("minAvailable", 1)),
            pending=counts["Pending"],
            running=counts["Running"],
            succeeded=counts["Succeeded"],
            failed=counts["Failed"],
            terminating=terminating,
            unknown=0,
            taskStatusCount={t: {"phase": p} for t, p in tasks.items()},
        )

    def _ensure_dependents(self, job: Obj) -> None:
        m = job["metadata"]
        spec = job["spec"]
        namespace, name = m["namespace"], m["name"]
        if self._store.get(POD_GROUPS, namespace, name) is None:
            group = {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "ownerReferences": [owner_ref(job)],
                    "annotations": {},
                    "labels": {JOB_NAME: name},
                },
                "spec": {
                    "minMember": int(spec.get("minAvailable", 1)),
                    "minTaskMember": {
                        t["name"]: int(t.get("minAvailable", t.get("replicas", 1))) for t in spec["tasks"]
                    },
                    "queue": spec.get("queue", "default"),
                    "priorityClassName": spec.get("priorityClassName", ""),
                },
            }
            self._store.create(
                POD_GROUPS, self._admission.admit_create(POD_GROUPS, group, namespace, owned=True)
            )
        plugins = spec.get("plugins") or {}
        if "svc" in plugins and self._store.get(SERVICES, namespace, name) is None:
            svc = {
                "metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner_ref(job)]},
                "spec": {
                    "clusterIP": "None",
                    "publishNotReadyAddresses": True,
                    "selector": {JOB_NAME: name, "volcano.sh/job-namespace": namespace},
                    "ports": [{"name": "placeholder-volcano", "port": 1, "protocol": "TCP", "targetPort": 1}],
                },
            }
            self._store.create(SERVICES, self._admission.admit_create(SERVICES, svc, namespace, owned=True))

    def _create_missing(self, job: Obj, existing: set[str]) -> list[Obj]:
        created: list[Obj] = []
        for task in job["spec"].get("tasks") or []:
            for index in range(int(task.get("replicas", 1))):
                name = f"{job['metadata']['name']}-{task['name']}-{index}"
                if name not in existing:
                    try:
                        pod = self._admission.admit_create(
                            PODS, pod_for(job, task, index, name), job["metadata"]["namespace"], owned=True
                        )
                    except ApiError as error:
                        # Refused at admission (Pod Security): reported on the job, as Volcano does.
                        self._recorder.record(
                            VOLCANO_JOBS,
                            job,
                            "FailedCreate",
                            f"Error creating: {error.message}",
                            warning=True,
                            component=COMPONENT,
                        )
                        return created
                    created.append(self._store.create(PODS, pod))
        return created

    def _sync_pod_group(self, job: Obj) -> None:
        m = job["metadata"]
        group = self._store.get(POD_GROUPS, m["namespace"], m["name"])
        if group is None:
            return
        status = job["status"]
        phase = {"Completed": "Completed", "Running": "Running"}.get(status["state"]["phase"])
        min_member = int(group["spec"].get("minMember", 1))
        if phase is None:
            phase = "Running" if status.get("running", 0) >= min_member else "Inqueue"
        new = edit(group, "status")
        new["status"] = {
            "phase": phase,
            "running": status.get("running", 0),
            "succeeded": status.get("succeeded", 0),
            "failed": status.get("failed", 0),
        }
        self._store.update(POD_GROUPS, new)
