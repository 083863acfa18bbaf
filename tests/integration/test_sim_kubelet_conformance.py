"""The simulated kubelet and controllers, judged by the real kubectl and the official client.

Each test drives a behaviour a real cluster has and the simulator once lacked (issue 14): a drain
that finishes, pods of a deleted node collected, Jobs suspended and resumed, Jobs scheduled pod by
pod, a pinned pod refused by the kubelet, container logs with kubectl's flags, and containers that
fail to pull, crash or are OOM-killed. They skip only without kubectl.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from clusters.sim import SimPoolConfig, ThreadedSim, cluster
from tests.e2e import harness
from tests.e2e.harness import Poll

KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
GPU = "nvidia.com/gpu"
# Go's RFC3339Nano, as the kubelet writes it: up to nine fraction digits, trailing zeros dropped.
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{0,8}[1-9])?Z ")


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[ThreadedSim, Path]]:
    config = cluster(
        "kl",
        [SimPoolConfig.of("a100", "A100", node_count=2)],
        default_duration_s=600,
        log_interval_s=0.2,
        restart_backoff_s=0.3,
    )
    with ThreadedSim(config) as running:
        yield running, running.kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def core(sim: tuple[ThreadedSim, Path]) -> client.CoreV1Api:
    configuration = client.Configuration()
    configuration.host = sim[0].url
    configuration.retries = False
    return client.CoreV1Api(client.ApiClient(configuration))


@pytest.fixture
def batch(core: client.CoreV1Api) -> client.BatchV1Api:
    return client.BatchV1Api(core.api_client)


def kubectl(
    kubeconfig: Path, *args: str, ok: bool = True, timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    result = subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), "--cache-dir", str(kubeconfig.parent / "cache"), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if ok:
        assert result.returncode == 0, result.stderr
    return result


_T = TypeVar("_T")


def wait_for(check: Poll[_T], timeout_s: float = 15.0) -> _T:
    """tests/e2e/harness.wait_for, polled every 50 ms: the simulator answers in milliseconds."""
    return harness.wait_for(check, timeout_s, interval_s=0.05)


def settle(sim: ThreadedSim) -> None:
    """Run the simulator's control loop, on its own thread, until no controller has work left.

    The positive signal behind every "X did not happen" below: once this returns, every change made
    so far has been seen by every controller and every timer due by now has fired, so anything the
    cluster was going to do in answer has been done. It replaces sleeping a while and hoping.
    """
    sim.call(sim.cluster.engine.reconcile)


def sim_wall_s(sim: ThreadedSim) -> float:
    """The simulator's clock: what the API server compares `sinceSeconds` with."""
    return sim.call(sim.cluster.engine.clock.wall_s)


def a_pod(
    name: str,
    *,
    gpus: int = 0,
    restart: str = "Never",
    annotations: dict[str, str] | None = None,
    containers: tuple[str, ...] = ("main",),
    **spec: Any,
) -> dict[str, Any]:
    resources = {"limits": {GPU: str(gpus)}} if gpus else {}
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "restartPolicy": restart,
            "containers": [
                {"name": c, "image": "train:1", "command": ["python", "train.py"], "resources": resources}
                for c in containers
            ],
            **spec,
        },
    }


def a_job(name: str, *, pods: int, gpus: int, suspend: bool = False, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "suspend": suspend,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "train:1", "resources": {"limits": {GPU: str(gpus)}}}
                    ],
                }
            },
            **spec,
        },
    }


def job_pods(core: client.CoreV1Api, job: str) -> list[client.V1Pod]:
    return list(
        core.list_namespaced_pod("default", label_selector=f"batch.kubernetes.io/job-name={job}").items
    )


def phase_of(core: client.CoreV1Api, name: str) -> str | None:
    try:
        return str(core.read_namespaced_pod(name, "default").status.phase)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def gone(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, "default")
    except ApiException as exc:
        # The kubernetes client is not followed by mypy (pyproject.toml), so its status is Any.
        status: int = exc.status
        return status == 404
    return False


def admin_state(sim: ThreadedSim) -> dict[str, Any]:
    with urllib.request.urlopen(f"{sim.url}/sim/v1/state", timeout=10) as response:
        state: dict[str, Any] = json.loads(response.read())
    return state


# -- drain, eviction, pod garbage collection --------------------------------------------------


def test_kubectl_drain_evicts_and_completes(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    _, kubeconfig = sim
    batch.create_namespaced_job("default", a_job("train", pods=2, gpus=4))
    finished = a_job("done", pods=1, gpus=0)
    finished["spec"]["template"]["metadata"] = {"annotations": {"sim.gpufed.io/duration": "0.1"}}
    finished["spec"]["template"]["spec"]["nodeName"] = "kl-a100-0"
    batch.create_namespaced_job("default", finished)
    wait_for(
        lambda: all(p.status.phase == "Running" for p in job_pods(core, "train")) and job_pods(core, "train")
    )
    wait_for(lambda: [p for p in job_pods(core, "done") if p.status.phase == "Succeeded"])
    on_node = {
        p.metadata.name
        for p in core.list_namespaced_pod("default", field_selector="spec.nodeName=kl-a100-0").items
    }
    assert len(on_node) == 3
    result = kubectl(
        kubeconfig, "drain", "kl-a100-0", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s"
    )
    assert "node/kl-a100-0 drained" in result.stdout
    left = core.list_namespaced_pod("default", field_selector="spec.nodeName=kl-a100-0").items
    assert not left
    assert core.read_node("kl-a100-0").spec.unschedulable
    # The Job replaced its evicted pods on the other node.
    wait_for(lambda: len([p for p in job_pods(core, "train") if p.status.phase == "Running"]) == 2)
    assert {p.spec.node_name for p in job_pods(core, "train")} == {"kl-a100-1"}
    reasons = {e.reason for e in core.list_namespaced_event("default").items}
    assert "Killing" in reasons


def test_eviction_marks_the_pod_then_deletes_it_and_fails_the_job(
    core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    body = a_job("ev", pods=1, gpus=1, backoffLimit=0)
    body["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    }
    batch.create_namespaced_job("default", body)
    pod = wait_for(lambda: next((p for p in job_pods(core, "ev") if p.status.phase == "Running"), None))
    name = pod.metadata.name
    core.create_namespaced_pod_eviction(
        name, "default", {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    )
    evicted = core.read_namespaced_pod(name, "default")
    assert evicted.metadata.deletion_timestamp is not None
    target = next(c for c in evicted.status.conditions if c.type == "DisruptionTarget")
    assert (target.status, target.reason) == ("True", "EvictionByEvictionAPI")
    wait_for(lambda: gone(core, name))
    job = batch.read_namespaced_job("ev", "default")
    failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert failed.reason == "PodFailurePolicy"
    # With a pod failure policy a terminating pod is not replaced before it has failed.
    assert not job_pods(core, "ev")


def test_pods_of_a_deleted_node_are_garbage_collected(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    _, kubeconfig = sim
    core.create_namespaced_pod("default", a_pod("stray", gpus=1, nodeName="kl-a100-1"))
    wait_for(lambda: phase_of(core, "stray") == "Running")
    kubectl(kubeconfig, "delete", "node", "kl-a100-1")
    wait_for(lambda: gone(core, "stray"))
    assert "stray" not in kubectl(kubeconfig, "get", "pods", "-A").stdout


# -- batch Jobs --------------------------------------------------------------------------------


def test_suspended_job_creates_nothing_and_suspend_resume_cycle(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    running, kubeconfig = sim
    batch.create_namespaced_job("default", a_job("held", pods=2, gpus=1, suspend=True))
    # The Job controller has handled the Job (and the scheduler and kubelet anything it made).
    settle(running)
    assert not job_pods(core, "held")
    job = batch.read_namespaced_job("held", "default")
    suspended = next(c for c in job.status.conditions if c.type == "Suspended")
    assert (suspended.status, suspended.reason) == ("True", "JobSuspended")
    kubectl(kubeconfig, "patch", "job", "held", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: len([p for p in job_pods(core, "held") if p.status.phase == "Running"]) == 2)
    first = {p.metadata.name for p in job_pods(core, "held")}
    kubectl(kubeconfig, "patch", "job", "held", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: not job_pods(core, "held"))
    job = batch.read_namespaced_job("held", "default")
    assert (job.status.active or 0, job.status.failed or 0) == (0, 0)
    assert next(c for c in job.status.conditions if c.type == "Suspended").status == "True"
    kubectl(kubeconfig, "patch", "job", "held", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: len([p for p in job_pods(core, "held") if p.status.phase == "Running"]) == 2)
    assert not first & {p.metadata.name for p in job_pods(core, "held")}
    resumed = next(
        c for c in batch.read_namespaced_job("held", "default").status.conditions if c.type == "Suspended"
    )
    assert (resumed.status, resumed.reason) == ("False", "JobResumed")
    reasons = {e.reason for e in core.list_namespaced_event("default").items}
    assert {"Suspended", "Resumed"} <= reasons


def test_a_job_without_podgroup_starts_its_pods_one_by_one(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    # Another team's plain Job: 3 x 8 GPUs on two 8-GPU nodes. kube-scheduler runs the two that fit.
    _, kubeconfig = sim
    batch.create_namespaced_job("default", a_job("other-team", pods=3, gpus=8))
    wait_for(lambda: len([p for p in job_pods(core, "other-team") if p.status.phase == "Running"]) == 2)
    pending = kubectl(
        kubeconfig, "get", "pods", "--field-selector=status.phase=Pending", "-o", "name"
    ).stdout.split()
    assert len(pending) == 1
    events = [e for e in core.list_namespaced_event("default").items if e.reason == "FailedScheduling"]
    assert events
    assert "Insufficient nvidia.com/gpu" in events[0].message


def test_a_pinned_pod_beyond_the_free_gpus_is_refused_by_the_kubelet(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    running, kubeconfig = sim
    core.create_namespaced_pod("default", a_pod("first", gpus=6, nodeName="kl-a100-0"))
    wait_for(lambda: phase_of(core, "first") == "Running")
    core.create_namespaced_pod("default", a_pod("pinned", gpus=8, nodeName="kl-a100-0"))
    wait_for(lambda: phase_of(core, "pinned") == "Failed")
    pod = core.read_namespaced_pod("pinned", "default")
    assert pod.status.reason == "OutOfnvidia.com/gpu"
    assert pod.status.message.startswith("Pod was rejected: Node didn't have enough resource: nvidia.com/gpu")
    row = kubectl(kubeconfig, "get", "pod", "pinned", "--no-headers").stdout.split()
    assert row[2] == "OutOfnvidia.com/gpu"
    assert wait_for(lambda: admin_state(running)["free_gpus"]["kl-a100-0"] == 2)
    assert phase_of(core, "first") == "Running"
    events = [e for e in core.list_namespaced_event("default").items if e.reason == "OutOfnvidia.com/gpu"]
    assert events
    assert events[0].type == "Warning"


# -- containers: logs and failures --------------------------------------------------------------


def test_kubectl_logs_plain_tail_timestamps_limit_and_since(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    running, kubeconfig = sim
    core.create_namespaced_pod("default", a_pod("talker", annotations={"sim.gpufed.io/duration": "1.5"}))
    wait_for(lambda: phase_of(core, "talker") == "Succeeded")
    lines = kubectl(kubeconfig, "logs", "talker").stdout.splitlines()
    assert lines[0] == '[sim] container "main" started (image train:1)'
    assert lines[1] == "[sim] command: python train.py"
    assert [line for line in lines if "progress" in line]
    assert lines[-1] == "[sim] exited with code 0 (Completed)"
    assert kubectl(kubeconfig, "logs", "talker", "--tail=2").stdout.splitlines() == lines[-2:]
    stamped = kubectl(kubeconfig, "logs", "talker", "--timestamps").stdout.splitlines()
    assert all(STAMP.match(line) for line in stamped)
    assert [STAMP.sub("", line) for line in stamped] == lines
    # sinceTime travels in whole seconds (metav1.Time): the lines from that second on come back.
    seconds = [int(datetime.fromisoformat(line[:19]).replace(tzinfo=UTC).timestamp()) for line in stamped]
    cut = seconds[-1]
    since_time = datetime.fromtimestamp(cut, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    since = kubectl(kubeconfig, "logs", "talker", f"--since-time={since_time}").stdout
    assert since.splitlines() == [line for line, s in zip(lines, seconds, strict=True) if s >= cut]
    assert kubectl(kubeconfig, "logs", "talker", "--limit-bytes=12").stdout == lines[0][:12]
    # The container has ended, so its last line is its newest. Once the server's clock is more than
    # a second past it, every line is older than `--since=1s` asks for.
    last_line_s = datetime.fromisoformat(stamped[-1].split(" ", 1)[0]).timestamp()
    wait_for(lambda: sim_wall_s(running) > last_line_s + 1.0)
    assert kubectl(kubeconfig, "logs", "talker", "--since=1s").stdout == ""
    assert kubectl(kubeconfig, "logs", "talker", "--since=1h").stdout.splitlines() == lines


def test_kubectl_logs_follow_streams_and_ends_with_the_container(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    _, kubeconfig = sim
    core.create_namespaced_pod("default", a_pod("stream", annotations={"sim.gpufed.io/duration": "2"}))
    wait_for(lambda: phase_of(core, "stream") == "Running")
    assert KUBECTL is not None
    started = time.monotonic()
    follower = subprocess.Popen(
        [KUBECTL, "--kubeconfig", str(kubeconfig), "logs", "-f", "stream"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    arrivals: list[tuple[float, str]] = []
    for line in follower.stdout:
        arrivals.append((time.monotonic() - started, line.rstrip("\n")))
    assert follower.wait(timeout=30) == 0
    assert arrivals[-1][1] == "[sim] exited with code 0 (Completed)"
    progress = [at for at, text in arrivals if "progress" in text]
    # Lines came while the container ran, not all at the end.
    assert len(progress) >= 5
    assert progress[-1] - progress[0] >= 0.8
    assert phase_of(core, "stream") == "Succeeded"


def test_previous_is_the_run_before_the_restart(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    _, kubeconfig = sim
    # A container that has not restarted has no previous run. Asked of a pod that runs on (the crash
    # loop below restarts every 0.5 s: on a busy machine it had restarted before kubectl asked).
    core.create_namespaced_pod(
        "default", a_pod("steady", restart="Never", annotations={"sim.gpufed.io/duration": "60"})
    )
    wait_for(lambda: phase_of(core, "steady") == "Running")
    refused = kubectl(kubeconfig, "logs", "steady", "--previous", ok=False)
    assert refused.returncode != 0
    assert 'previous terminated container "main" in pod "steady" not found' in refused.stderr
    annotations = {"sim.gpufed.io/duration": "0.5", "sim.gpufed.io/exit-code": "3"}
    core.create_namespaced_pod("default", a_pod("crashy", restart="OnFailure", annotations=annotations))

    def restarted_once() -> Any:
        pod = core.read_namespaced_pod("crashy", "default")
        # A pod not yet started has no container statuses (the kubelet reports them), so a read soon
        # after the create may find none: a busy machine's read did.
        statuses = pod.status.container_statuses or []
        return pod if statuses and statuses[0].restart_count >= 1 else None

    pod = wait_for(restarted_once)
    last = pod.status.container_statuses[0].last_state.terminated
    assert (last.exit_code, last.reason) == (3, "Error")

    def restarts() -> int:
        return int(core.read_namespaced_pod("crashy", "default").status.container_statuses[0].restart_count)

    # The container keeps failing every second or so; a busy machine can take that long to start
    # kubectl. Read `--previous` between two equal restart counts, so that the run it must show is
    # known: the one before the current run.
    def previous_of_a_steady_run() -> tuple[int, list[str]] | None:
        before = restarts()
        lines = kubectl(kubeconfig, "logs", "crashy", "--previous").stdout.splitlines()
        return (before, lines) if restarts() == before else None

    count, previous = wait_for(previous_of_a_steady_run)
    run_before = "" if count == 1 else f", restart {count - 1}"
    assert previous[0] == f'[sim] container "main" started (image train:1{run_before})'
    assert previous[-1] == "[sim] exited with code 3 (Error)"
    current = kubectl(kubeconfig, "logs", "crashy").stdout.splitlines()
    assert current[0].startswith('[sim] container "main" started (image train:1, restart ')
    status = kubectl(kubeconfig, "get", "pod", "crashy", "--no-headers").stdout.split()
    assert int(status[3]) >= 1
    reasons = {e.reason for e in core.list_namespaced_event("default").items}
    assert "BackOff" in reasons


def test_log_endpoint_through_the_official_client(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", a_pod("two", containers=("trainer", "sidecar")))
    core.create_namespaced_pod("default", a_pod("huge", gpus=64))
    wait_for(lambda: phase_of(core, "two") == "Running")
    with pytest.raises(ApiException) as info:
        core.read_namespaced_pod_log("two", "default")
    assert info.value.status == 400
    assert (
        "a container name must be specified for pod two, choose one of: [trainer sidecar]" in info.value.body
    )
    text = core.read_namespaced_pod_log("two", "default", container="sidecar")
    assert text.startswith('[sim] container "sidecar" started')
    with pytest.raises(ApiException) as info:
        core.read_namespaced_pod_log("two", "default", container="trainer", tail_lines=-1)
    assert info.value.status == 422
    with pytest.raises(ApiException) as info:
        core.read_namespaced_pod_log("two", "default", container="nope")
    assert info.value.status == 400
    # Not bound to a node: there is no kubelet to ask, and the answer is empty.
    assert core.read_namespaced_pod_log("huge", "default") == ""
    with pytest.raises(ApiException) as info:
        core.read_namespaced_pod_log("absent", "default")
    assert info.value.status == 404
    stream = core.read_namespaced_pod_log(
        "two", "default", container="trainer", follow=True, _preload_content=False, limit_bytes=40
    )
    assert len(stream.read()) == 40


def test_logs_belong_to_the_pod_and_namespace_and_go_with_the_pod(core: client.CoreV1Api) -> None:
    # Another tenant's pod of the same name in its own namespace has its own log.
    core.create_namespace({"metadata": {"name": "team-b"}})
    core.create_namespaced_pod("default", a_pod("same", annotations={"sim.gpufed.io/duration": "0.2"}))
    other = a_pod("same", annotations={"sim.gpufed.io/duration": "0.2", "sim.gpufed.io/exit-code": "9"})
    core.create_namespaced_pod("team-b", other)
    wait_for(lambda: phase_of(core, "same") == "Succeeded")
    wait_for(lambda: core.read_namespaced_pod("same", "team-b").status.phase == "Failed")
    assert core.read_namespaced_pod_log("same", "default").splitlines()[-1].endswith("(Completed)")
    assert (
        core.read_namespaced_pod_log("same", "team-b").splitlines()[-1] == "[sim] exited with code 9 (Error)"
    )
    core.delete_namespaced_pod("same", "team-b")
    wait_for(lambda: not core.list_namespaced_pod("team-b").items)
    with pytest.raises(ApiException) as info:
        core.read_namespaced_pod_log("same", "team-b")
    assert info.value.status == 404
    assert core.read_namespaced_pod_log("same", "default")


def test_image_pull_failure_waits_with_backoff(sim: tuple[ThreadedSim, Path], core: client.CoreV1Api) -> None:
    _, kubeconfig = sim
    core.create_namespaced_pod(
        "default", a_pod("badimg", annotations={"sim.gpufed.io/fail-image-pull": "true"})
    )
    first = wait_for(
        lambda: (
            (s := core.read_namespaced_pod("badimg", "default").status.container_statuses)
            and s[0].state.waiting
        )
    )
    assert first.reason in ("ErrImagePull", "ImagePullBackOff")
    wait_for(
        lambda: (
            core.read_namespaced_pod("badimg", "default").status.container_statuses[0].state.waiting.reason
            == "ImagePullBackOff"
        )
    )
    # The kubelet keeps trying (0.3 s back-off here), so kubectl may catch either state.
    row = kubectl(kubeconfig, "get", "pod", "badimg", "--no-headers").stdout.split()
    assert row[1] == "0/1"
    assert row[2] in ("ErrImagePull", "ImagePullBackOff")
    assert phase_of(core, "badimg") == "Pending"
    refused = kubectl(kubeconfig, "logs", "badimg", ok=False)
    assert (
        'container "main" in pod "badimg" is waiting to start: trying and failing to pull image'
        in refused.stderr
    )
    reasons = {
        e.reason for e in core.list_namespaced_event("default").items if e.involved_object.name == "badimg"
    }
    assert {"Pulling", "Failed", "BackOff"} <= reasons


def test_oom_kill_and_error_exit_are_container_states(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", a_pod("oom", annotations={"sim.gpufed.io/oom-kill-after-s": "0.3"}))
    core.create_namespaced_pod(
        "default", a_pod("err", annotations={"sim.gpufed.io/duration": "0.3", "sim.gpufed.io/exit-code": "2"})
    )
    wait_for(lambda: phase_of(core, "oom") == "Failed" and phase_of(core, "err") == "Failed")
    oom = core.read_namespaced_pod("oom", "default").status.container_statuses[0].state.terminated
    assert (oom.reason, oom.exit_code) == ("OOMKilled", 137)
    err = core.read_namespaced_pod("err", "default").status.container_statuses[0].state.terminated
    assert (err.reason, err.exit_code) == ("Error", 2)
    assert core.read_namespaced_pod_log("oom", "default").splitlines()[-1] == (
        "[sim] killed: out of memory (OOMKilled, exit code 137)"
    )
    node_events = [
        e
        for e in core.list_namespaced_event("default").items
        if e.reason == "OOMKilling" and e.involved_object.kind == "Node"
    ]
    assert node_events
    assert "default/oom" in node_events[0].message


def test_node_pressure_eviction_fault_leaves_an_evicted_pod(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    running, kubeconfig = sim
    core.create_namespaced_pod("default", a_pod("pressed", gpus=1))
    wait_for(lambda: phase_of(core, "pressed") == "Running")
    request = urllib.request.Request(f"{running.url}/sim/v1/faults/pods/default/pressed/evict", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.loads(response.read())["ok"]
    pod = core.read_namespaced_pod("pressed", "default")
    assert (pod.status.phase, pod.status.reason) == ("Failed", "Evicted")
    target = next(c for c in pod.status.conditions if c.type == "DisruptionTarget")
    assert target.reason == "TerminationByKubelet"
    row = kubectl(kubeconfig, "get", "pod", "pressed", "--no-headers").stdout.split()
    assert row[2] == "Evicted"
    reasons = {
        e.reason for e in core.list_namespaced_event("default").items if e.involved_object.name == "pressed"
    }
    assert {"Evicted", "Killing"} <= reasons
    # Its GPU is free again for others, and the pod is still there to be read.
    assert wait_for(lambda: sum(admin_state(running)["free_gpus"].values()) == 16)
    # Every controller has seen the eviction, and none deleted the pod.
    settle(running)
    assert phase_of(core, "pressed") == "Failed"


def test_a_pod_force_deleted_by_a_third_party_is_still_counted_by_its_job(
    core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    batch.create_namespaced_job("default", a_job("tracked", pods=1, gpus=0, backoffLimit=0))
    pod = wait_for(lambda: next((p for p in job_pods(core, "tracked") if p.status.phase == "Running"), None))
    assert pod.metadata.finalizers == ["batch.kubernetes.io/job-tracking"]
    core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)
    # Counted first, then released: the Job saw the failure although the pod is gone.
    wait_for(lambda: gone(core, pod.metadata.name))
    job = wait_for(lambda: (j := batch.read_namespaced_job("tracked", "default")).status.failed and j)
    assert job.status.failed == 1


def test_a_deleted_pod_waits_for_its_finalizers(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    running, kubeconfig = sim
    body = a_pod("held")
    body["metadata"]["finalizers"] = ["example.com/hold"]
    core.create_namespaced_pod("default", body)
    wait_for(lambda: phase_of(core, "held") == "Running")
    kubectl(kubeconfig, "delete", "pod", "held", "--wait=false")
    stopped = wait_for(
        lambda: (p := core.read_namespaced_pod("held", "default")).status.phase == "Failed" and p
    )
    assert stopped.metadata.deletion_timestamp is not None
    # The kubelet has reported the stop and every controller has seen it; the finalizer holds the pod.
    settle(running)
    assert phase_of(core, "held") == "Failed"
    kubectl(kubeconfig, "patch", "pod", "held", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    wait_for(lambda: gone(core, "held"))


def test_draining_a_node_under_a_volcano_gang_aborts_it_with_pod_evicted(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    _, kubeconfig = sim
    custom = client.CustomObjectsApi(core.api_client)
    template = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "train:1", "resources": {"limits": {GPU: "8"}}}],
        }
    }
    gang = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "gang"},
        "spec": {
            "minAvailable": 2,
            "maxRetry": 0,
            # What gpufed's backend renders (clusters/kubernetes/manifests.py).
            "policies": [
                {"event": "PodEvicted", "action": "AbortJob"},
                {"event": "PodFailed", "action": "AbortJob"},
            ],
            "tasks": [{"name": "worker", "replicas": 2, "template": template}],
        },
    }
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", gang)

    def phase() -> str:
        job = custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "gang")
        return str(job.get("status", {}).get("state", {}).get("phase"))

    wait_for(lambda: phase() == "Running")
    kubectl(
        kubeconfig, "drain", "kl-a100-0", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s"
    )
    wait_for(lambda: phase() == "Aborted")
    job = custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "gang")
    assert job["status"]["state"]["reason"] == "PodEvicted"
    wait_for(lambda: not core.list_namespaced_pod("default").items)
