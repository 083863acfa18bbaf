"""The simulated kubelet: admits each bound pod, runs its containers, restarts them, reports the end.

A real kubelet would start the containers; this one reads annotations instead, so tests and
benchmarks decide what each pod does (all its containers behave alike):

| annotation | effect |
|---|---|
| `sim.gpufed.io/duration` | seconds each run lasts (default: the cluster's `default_duration_s`) |
| `sim.gpufed.io/duration.TASK` | the same for the pods of task TASK only (before the one above) |
| `sim.gpufed.io/exit-code` | the exit code of each run; non-zero ends it with reason `Error` |
| `sim.gpufed.io/oom-kill-after-s` | the run is OOM-killed after that many seconds (`OOMKilled`, 137) |
| `sim.gpufed.io/oom-kill-after-s.TASK` | the same for the pods of task TASK only (before the one above) |
| `sim.gpufed.io/fail-image-pull` | the image never pulls: `ErrImagePull`, then `ImagePullBackOff` |

Like a real kubelet it refuses a pod whose requests do not fit what the node has left for the pods
it already admitted (`OutOfnvidia.com/gpu`, phase Failed): that is what happens to a pod created
with `spec.nodeName` set, which no scheduler checked. It restarts containers by `restartPolicy`
(Always, or OnFailure after a non-zero exit) after an exponential back-off (CrashLoopBackOff), and
enforces `activeDeadlineSeconds` from the pod's start time.

In process mode (`local_output` given: a cluster configured with `localExec: true`) each pod's main
container runs its command as a local process (`clusters.sim.local_exec`) instead of for a duration:
the run ends when the process exits, with its exit code, and its output is the container's log.
"""

from __future__ import annotations

import base64
import functools
import itertools
from collections.abc import Callable
from typing import Any

from clusters.sim import podstatus
from clusters.sim.capacity import GPU, Demand, NodeInfo
from clusters.sim.clock import Clock, parse_rfc3339
from clusters.sim.events import EventRecorder
from clusters.sim.local_exec import LocalExec
from clusters.sim.resources import NODES, PODS, SECRETS
from clusters.sim.store import Change, EventType, Key, Store, key_of
from clusters.sim.timers import Timers

Obj = dict[str, Any]
DURATION_ANNOTATION = "sim.gpufed.io/duration"
# Which task a pod runs: Volcano's annotation, or gpufed's label on an Indexed Job's pods.
VOLCANO_TASK = "volcano.sh/task-spec"
GPUFED_TASK = "gpufed.io/task"
EXIT_CODE_ANNOTATION = "sim.gpufed.io/exit-code"
OOM_ANNOTATION = "sim.gpufed.io/oom-kill-after-s"
IMAGE_PULL_ANNOTATION = "sim.gpufed.io/fail-image-pull"
COMPONENT = "kubelet"
# The kubelet's container restart back-off: 10 s, doubled per restart, capped at five minutes.
_BACKOFF_CAP_S = 300.0
# How long ErrImagePull shows before the kubelet reports ImagePullBackOff.
_PULL_RETRY_S = 1.0


def _annotation(pod: Obj, key: str) -> str | None:
    value = (pod["metadata"].get("annotations") or {}).get(key)
    return None if value is None else str(value)


def _task_annotation(pod: Obj, key: str) -> str | None:
    # A task's own value (`sim.gpufed.io/duration.master`) before the pod's: the annotations are set
    # gang-wide, and a gang whose master outlives its workers, or whose master alone runs out of
    # memory, needs its tasks told apart.
    task = _annotation(pod, VOLCANO_TASK) or (pod["metadata"].get("labels") or {}).get(GPUFED_TASK)
    return (_annotation(pod, f"{key}.{task}") if task else None) or _annotation(pod, key)


def duration_s(pod: Obj, default_s: float) -> float:
    text = _task_annotation(pod, DURATION_ANNOTATION)
    try:
        return max(0.0, float(text)) if text is not None else default_s
    except ValueError:
        return default_s


def exit_code(pod: Obj) -> int:
    text = _annotation(pod, EXIT_CODE_ANNOTATION)
    try:
        return int(text) if text is not None else 0
    except ValueError:
        return 1


def oom_after_s(pod: Obj) -> float | None:
    text = _task_annotation(pod, OOM_ANNOTATION)
    try:
        return max(0.0, float(text)) if text is not None else None
    except ValueError:
        return None


def image_pull_failure(pod: Obj) -> str | None:
    """The pull error to report, or None when the image pulls."""
    text = _annotation(pod, IMAGE_PULL_ANNOTATION)
    if text is None or text.lower() in ("", "false", "0"):
        return None
    return "not found" if text.lower() in ("true", "1", "yes") else text


def restarts(pod: Obj, code: int) -> bool:
    policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def _field(container: Obj) -> str:
    return f"spec.containers{{{container.get('name')}}}"


class Kubelet:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        timers: Timers,
        recorder: EventRecorder,
        *,
        default_duration_s: float,
        container_start_s: float,
        restart_backoff_s: float = 10.0,
        local_output: Callable[[str, str, str], None] | None = None,
        local_drained: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._timers = timers
        self._recorder = recorder
        self._default_duration_s = default_duration_s
        self._container_start_s = container_start_s
        self._restart_backoff_s = restart_backoff_s
        self._to_start: dict[Key, str] = {}
        self._starting: set[str] = set()
        # Pods this kubelet admitted and that have not ended, per node: what admission counts.
        self._admitted: dict[str, dict[str, Demand]] = {}
        self._node_of: dict[str, str] = {}
        self._nodes: dict[str, tuple[str, NodeInfo]] = {}
        self._ips = itertools.count(2)
        self._local = (
            None
            if local_output is None
            else LocalExec(
                local_output, self._local_exited, secret_data=self._secret_data, on_drained=local_drained
            )
        )
        # Pods whose process runs: uid -> (key, run), to end the right run when it exits.
        self._local_runs: dict[str, tuple[Key, int]] = {}

    def _secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's data as the kubelet hands it to a container: base64-decoded."""
        secret = self._store.get(SECRETS, namespace, name)
        if secret is None:
            return None
        data = {
            k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (secret.get("data") or {}).items()
        }
        data.update({str(k): str(v) for k, v in (secret.get("stringData") or {}).items()})
        return data

    def close(self) -> None:
        """Kill the processes of process mode (the cluster is going away)."""
        if self._local is not None:
            self._local.stop_all()

    def observe(self, change: Change) -> None:
        if change.rt is not PODS:
            return
        pod = change.obj
        uid = pod["metadata"]["uid"]
        ending = change.type is EventType.DELETED or podstatus.is_terminal(pod) or podstatus.is_deleting(pod)
        if ending and self._local is not None and self._local_runs.pop(uid, None) is not None:
            self._local.stop(uid)
        if change.type is EventType.DELETED or podstatus.is_terminal(pod):
            node = self._node_of.pop(uid, None)
            if node is not None:
                self._admitted.get(node, {}).pop(uid, None)
            self._starting.discard(uid)
            return
        if (
            podstatus.node_name(pod)
            and podstatus.phase(pod) == "Pending"
            and not (pod.get("status") or {}).get("containerStatuses")
            and not podstatus.is_deleting(pod)
            and uid not in self._starting
        ):
            self._to_start[key_of(pod)] = uid

    def sync(self) -> bool:
        if not self._to_start:
            return False
        batch, self._to_start = self._to_start, {}
        for key, uid in batch.items():
            self._starting.add(uid)
            self._timers.after(self._container_start_s, functools.partial(self._start, key, uid))
        return True

    def _current(self, key: Key, uid: str) -> Obj | None:
        pod = self._store.get(PODS, *key)
        return pod if pod is not None and pod["metadata"]["uid"] == uid else None

    def _node_info(self, node: Obj) -> NodeInfo:
        """Allocatable parsed once per node version: quantity parsing dominated pod starts."""
        rv = str(node["metadata"].get("resourceVersion", ""))
        cached = self._nodes.get(node["metadata"]["name"])
        if cached is None or cached[0] != rv:
            cached = self._nodes[node["metadata"]["name"]] = (rv, NodeInfo.of(node))
        return cached[1]

    def _refusal(self, pod: Obj, node: Obj) -> tuple[str, str] | None:
        """Admission: the first resource the pod asks for beyond what the node has left."""
        info = self._node_info(node)
        admitted = self._admitted.get(info.name, {})
        demand = Demand.of(pod)
        used = Demand(
            gpu=sum(d.gpu for d in admitted.values()),
            cpu_m=sum(d.cpu_m for d in admitted.values()),
            memory_b=sum(d.memory_b for d in admitted.values()),
        )
        checks = (
            (GPU, demand.gpu, used.gpu, info.gpu, ""),
            ("cpu", demand.cpu_m, used.cpu_m, info.cpu_m, "m"),
            ("memory", demand.memory_b, used.memory_b, info.memory_b, ""),
            ("pods", 1, len(admitted), info.pods, ""),
        )
        for resource, requested, in_use, capacity, unit in checks:
            if requested and in_use + requested > capacity:
                return (
                    f"OutOf{resource}",
                    f"Node didn't have enough resource: {resource}, requested: {requested}{unit}, "
                    f"used: {in_use}{unit}, capacity: {capacity}{unit}",
                )
        return None

    def _start(self, key: Key, uid: str) -> None:
        pod = self._current(key, uid)
        if pod is None or podstatus.phase(pod) != "Pending" or podstatus.is_deleting(pod):
            self._starting.discard(uid)
            return
        node_name = podstatus.node_name(pod) or ""
        node = self._store.get(NODES, "", node_name)
        if node is None:
            # No kubelet serves a node that does not exist; the pod garbage collector removes it.
            self._starting.discard(uid)
            return
        refusal = self._refusal(pod, node)
        if refusal is not None:
            reason, message = refusal
            self._starting.discard(uid)
            ended = self._store.update(
                PODS, podstatus.rejected(pod, self._clock.wall_s(), reason, f"Pod was rejected: {message}")
            )
            self._recorder.record(PODS, ended, reason, message, warning=True, component=COMPONENT)
            return
        self._admitted.setdefault(node_name, {})[uid] = Demand.of(pod)
        self._node_of[uid] = node_name
        host_ip = _host_ip(node)
        n = next(self._ips)
        pod_ip = f"10.244.{(n >> 8) & 255}.{n & 255}"
        now = self._clock.now_s()
        deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
        if deadline is not None:
            self._timers.at(now + float(deadline), lambda: self._deadline(key, uid))
        pull_error = image_pull_failure(pod)
        if pull_error is not None:
            self._pull_failed(key, uid, host_ip, pod_ip, pull_error)
            return
        started = self._store.update(PODS, podstatus.running(pod, self._clock.wall_s(), host_ip, pod_ip))
        self._started(started)

    def _pull_failed(
        self, key: Key, uid: str, host_ip: str, pod_ip: str, error: str, attempt: int = 0
    ) -> None:
        """One failed pull: ErrImagePull, then ImagePullBackOff until the next try (doubling back-off)."""
        pod = self._current(key, uid)
        if pod is None or podstatus.phase(pod) != "Pending" or podstatus.is_deleting(pod):
            return
        image = podstatus.containers(pod)[0].get("image", "")
        message = f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": {error}'
        waiting = self._store.update(
            PODS, podstatus.waiting(pod, self._clock.wall_s(), host_ip, pod_ip, "ErrImagePull", message)
        )
        for c in podstatus.containers(pod):
            image = c.get("image", "")
            rec = functools.partial(
                self._recorder.record, PODS, waiting, component=COMPONENT, field_path=_field(c)
            )
            rec("Pulling", f'Pulling image "{image}"')
            rec("Failed", f'Failed to pull image "{image}": {message}', warning=True)
            rec("Failed", "Error: ErrImagePull", warning=True)

        def back_off() -> None:
            current = self._current(key, uid)
            if current is None or podstatus.phase(current) != "Pending" or podstatus.is_deleting(current):
                return
            new = podstatus.waiting(current, self._clock.wall_s(), host_ip, pod_ip, "ImagePullBackOff", "")
            for cs, c in zip(new["status"]["containerStatuses"], podstatus.containers(new), strict=True):
                cs["state"]["waiting"]["message"] = f'Back-off pulling image "{c.get("image", "")}"'
            backing = self._store.update(PODS, new)
            for c in podstatus.containers(backing):
                rec = functools.partial(
                    self._recorder.record, PODS, backing, component=COMPONENT, field_path=_field(c)
                )
                rec("BackOff", f'Back-off pulling image "{c.get("image", "")}"')
                rec("Failed", "Error: ImagePullBackOff", warning=True)
            wait_s = min(_BACKOFF_CAP_S, self._restart_backoff_s * 2**attempt)
            self._timers.after(
                wait_s, lambda: self._pull_failed(key, uid, host_ip, pod_ip, error, attempt + 1)
            )

        self._timers.after(_PULL_RETRY_S, back_off)

    def resume(self, pods: list[Obj]) -> None:
        """Take up the pods of a cluster restored from a snapshot (`clusters.sim.persist`): admitted
        pods count against their nodes again, and a running container ends when it would have had
        the cluster run on (its start time from its status, its duration from its annotations), its
        deadline too. A container in back-off starts again at once, and a failing pull is retried.
        Pods bound but not started are taken up by `observe`, as any new one."""
        self._ips = itertools.count(len(pods) + 2)
        wall_now = self._clock.wall_s()
        for pod in pods:
            if podstatus.is_terminal(pod) or not podstatus.node_name(pod):
                continue
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            if not statuses:
                continue
            key, uid = key_of(pod), pod["metadata"]["uid"]
            node = podstatus.node_name(pod) or ""
            self._admitted.setdefault(node, {})[uid] = Demand.of(pod)
            self._node_of[uid] = node
            self._starting.add(uid)
            status = pod.get("status") or {}
            deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
            if deadline is not None and status.get("startTime"):
                ends = parse_rfc3339(status["startTime"]) + float(deadline)
                self._timers.after(ends - wall_now, functools.partial(self._deadline, key, uid))
            state = statuses[0].get("state") or {}
            run = podstatus.restart_count(pod)
            if "running" in state and self._local is not None:
                # Process mode: the process died with the simulator, as containers with their node.
                self._timers.after(0.0, functools.partial(self._finish, key, uid, run, False, 137))
            elif "running" in state:
                stamp = state["running"].get("startedAt") or status.get("startTime")
                started = parse_rfc3339(str(stamp)) if stamp else wall_now
                run_s = duration_s(pod, self._default_duration_s)
                oom_s = oom_after_s(pod)
                oom = oom_s is not None and oom_s < run_s
                ends = started + (oom_s if oom and oom_s is not None else run_s)
                self._timers.after(ends - wall_now, functools.partial(self._finish, key, uid, run, oom))
            elif podstatus.phase(pod) == "Running":
                self._timers.after(0.0, functools.partial(self._restart, key, uid, run))
            else:
                error = image_pull_failure(pod) or "not found"
                host_ip, pod_ip = str(status.get("hostIP", "")), str(status.get("podIP", ""))
                self._timers.after(
                    _PULL_RETRY_S, functools.partial(self._pull_failed, key, uid, host_ip, pod_ip, error)
                )

    def _started(self, pod: Obj) -> None:
        """Record the run's start and arm its end."""
        for c in podstatus.containers(pod):
            rec = functools.partial(
                self._recorder.record, PODS, pod, component=COMPONENT, field_path=_field(c)
            )
            # Pulled and Created are left out: a benchmark's event budget goes to what clients read.
            rec("Started", f"Started container {c.get('name')}")
        if self._local is not None:
            key, uid = key_of(pod), pod["metadata"]["uid"]
            self._local_runs[uid] = (key, podstatus.restart_count(pod))
            namespace = pod["metadata"].get("namespace", "")
            peers = [p for p in self._store.list(PODS, namespace) if p["metadata"]["uid"] != uid]
            self._local.start(pod, peers)
            return
        run_s = duration_s(pod, self._default_duration_s)
        oom_s = oom_after_s(pod)
        oom = oom_s is not None and oom_s < run_s
        key, uid = key_of(pod), pod["metadata"]["uid"]
        run = podstatus.restart_count(pod)
        self._timers.after(
            oom_s if oom and oom_s is not None else run_s, lambda: self._finish(key, uid, run, oom)
        )

    def _local_exited(self, uid: str, code: int, message: str) -> None:
        held = self._local_runs.pop(uid, None)
        if held is not None:
            self._finish(held[0], uid, held[1], False, code, message)

    def _finish(
        self, key: Key, uid: str, run: int, oom: bool, code: int | None = None, message: str = ""
    ) -> None:
        pod = self._current(key, uid)
        if pod is None or podstatus.phase(pod) != "Running" or podstatus.restart_count(pod) != run:
            return
        if not (pod["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("running"):
            return
        wall_s = self._clock.wall_s()
        code = 137 if oom else (exit_code(pod) if code is None else code)
        reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
        if oom:
            self._oom_event(pod)
        if restarts(pod, code) and not podstatus.is_deleting(pod):
            backoff_s = min(_BACKOFF_CAP_S, self._restart_backoff_s * 2**run)
            crashed = self._store.update(
                PODS,
                podstatus.crashed(
                    pod, wall_s, exit_code=code, reason=reason, backoff_s=backoff_s, container_message=message
                ),
            )
            for c in podstatus.containers(crashed):
                m = crashed["metadata"]
                self._recorder.record(
                    PODS,
                    crashed,
                    "BackOff",
                    f"Back-off restarting failed container {c.get('name')} in pod "
                    f"{m['name']}_{m.get('namespace')}({m.get('uid')})",
                    warning=True,
                    component=COMPONENT,
                    field_path=_field(c),
                )
            self._timers.after(backoff_s, lambda: self._restart(key, uid, run))
            return
        self._store.update(
            PODS,
            podstatus.terminated(
                pod, wall_s, exit_code=code, reason=None, container_reason=reason, container_message=message
            ),
        )

    def _restart(self, key: Key, uid: str, run: int) -> None:
        pod = self._current(key, uid)
        if pod is None or podstatus.is_terminal(pod) or podstatus.is_deleting(pod):
            return
        if podstatus.restart_count(pod) != run:
            return
        self._started(self._store.update(PODS, podstatus.restarted(pod, self._clock.wall_s())))

    def _oom_event(self, pod: Obj) -> None:
        # The kernel's OOM kill is reported on the node, by node-problem-detector's kernel monitor.
        node = self._store.get(NODES, "", podstatus.node_name(pod) or "")
        if node is None:
            return
        m = pod["metadata"]
        name = podstatus.containers(pod)[0].get("name", "")
        self._recorder.record(
            NODES,
            node,
            "OOMKilling",
            f"Memory cgroup out of memory: Killed process in container {name} "
            f"of pod {m.get('namespace')}/{m['name']}",
            warning=True,
            component="kernel-monitor",
        )

    def _deadline(self, key: Key, uid: str) -> None:
        pod = self._current(key, uid)
        if pod is None or podstatus.is_terminal(pod):
            return
        message = "Pod was active on the node longer than the specified deadline"
        ended = self._store.update(
            PODS,
            podstatus.terminated(
                pod, self._clock.wall_s(), exit_code=137, reason="DeadlineExceeded", message=message
            ),
        )
        self._recorder.record(PODS, ended, "DeadlineExceeded", message, warning=True, component=COMPONENT)


def _host_ip(node: Obj | None) -> str:
    for address in ((node or {}).get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return "10.0.0.1"
