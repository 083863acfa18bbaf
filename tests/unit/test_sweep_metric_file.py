"""A sweep trial's metric from a file it writes (issue 34, `metric.source: file`).

The pieces, each alone: the Sweep's `metric` parsed and refused naming the problem; the file's
`NAME=VALUE` lines read (the last value wins); the trial's template refused when it sets a field
gpufed owns for a file metric, and the trials' pods given them; the results read from the kept
attempt summary's termination messages, hidden from another tenant; and the simulated kubelet's
process mode reading the file as a kubelet does (at most 4096 bytes, the pod's 12 KiB shared,
FallbackToLogsOnError's log tail, nothing through a link out of the pod's /etc).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from clusters.api import ReplicaState
from clusters.sim import local_exec
from clusters.sim.resources import PODS
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CallRefused as Refused
from federation.errors import InvalidArgument, InvalidSpec
from federation.joblogs.archive import KeptAttempt, KeptReplica, LogArchive, LogsSettings
from federation.jobsets.records import set_key
from federation.jobsets.sweeps import METRIC_FILE, MetricSource, file_metric, parse_sweep
from federation.spec.pod_template import refuse_metric_file_fields
from federation.store.jobs import JobRecord
from placement.model import JobPhase
from tests.unit import test_jobsets
from tests.unit.test_jobsets import World
from tests.unit.test_rendezvous_local_exec import an_engine, needs_namespaces, state
from tests.waits import until

world = test_jobsets.world

FILE_GRID: dict[str, Any] = {
    "parameters": {"lr": [0.1, 0.01], "batch": [32]},
    "metric": {"name": "loss", "goal": "minimize", "source": "file"},
}


# ---- the Sweep's metric


def test_a_file_metric_defaults_to_gpufeds_path_and_a_printed_one_keeps_its_old_form() -> None:
    spec = parse_sweep(FILE_GRID)
    assert (spec.metric_source, spec.metric_path) == (MetricSource.FILE, METRIC_FILE)
    assert spec.to_dict()["metric"] == {
        "name": "loss",
        "goal": "minimize",
        "source": "file",
        "path": METRIC_FILE,
    }
    given = parse_sweep({**FILE_GRID, "metric": {**FILE_GRID["metric"], "path": "/etc/out/metric"}})
    assert given.metric_path == "/etc/out/metric"
    printed = parse_sweep({**FILE_GRID, "metric": {"name": "loss"}})
    assert printed.metric_source is MetricSource.LOGS
    # What etcd keeps (and the set's digest covers) is what it was before file metrics.
    assert printed.to_dict()["metric"] == {"name": "loss", "goal": "minimize"}


@pytest.mark.parametrize(
    ("metric", "words"),
    [
        ({"source": "stdout"}, "sweep metric.source: must be logs or file, got 'stdout'"),
        ({"source": "file", "path": "metric.txt"}, "sweep metric.path: must be an absolute path"),
        (
            {"source": "file", "path": "/etc/../root/x"},
            "sweep metric.path: must name a file, without . or ..",
        ),
        ({"source": "file", "path": "/etc/out/"}, "sweep metric.path: must name a file"),
        ({"source": "file", "path": "/etc/my metric"}, "sweep metric.path: must not contain spaces"),
        ({"source": "file", "path": "/etc/gpufed-sweep/metric"}, "is the trial's read-only params volume"),
        ({"path": "/etc/m"}, "sweep metric.path: is for metric.source: file"),
        ({"file": "/etc/m"}, "sweep metric.file: unknown key (known: name, goal, source, path)"),
    ],
)
def test_a_bad_metric_source_or_path_is_refused_naming_it(metric: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_sweep({**FILE_GRID, "metric": {"name": "loss", **metric}})
    assert words in str(refused.value)


def test_early_stopping_with_a_file_metric_is_refused_saying_why() -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_sweep({**FILE_GRID, "earlyStopping": {"type": "median"}})
    message = str(refused.value)
    assert message.startswith("sweep earlyStopping: needs intermediate values while trials run")
    assert "known only when a trial ends" in message


# ---- the file's lines


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("loss=0.5\n", 0.5, id="one-line"),
        pytest.param("loss=0.9\naccuracy=0.7\nloss=0.25\n", 0.25, id="the-last-wins"),
        pytest.param("  loss = 3e-2  \n", 0.03, id="spaces"),
        pytest.param("gpufed-metric: loss=1.5\n", 1.5, id="the-printed-prefix"),
        pytest.param("loss=2 step=10\n", 2.0, id="with-a-step"),
        pytest.param("loss=0.4\nloss=nan\nloss=oops\n", 0.4, id="not-numbers-skipped"),
        pytest.param("val_loss=0.1\nloss_x=0.2\n", None, id="other-names"),
        pytest.param("", None, id="empty"),
        pytest.param("loss=0.7", 0.7, id="no-final-newline"),
    ],
)
def test_the_file_gives_the_last_value_of_its_metric(text: str, expected: float | None) -> None:
    assert file_metric(text, "loss") == expected


# ---- the owned fields


def test_a_template_that_sets_the_termination_message_fields_is_refused_naming_the_field() -> None:
    for field, value in (("terminationMessagePath", "/etc/mine"), ("terminationMessagePolicy", "File")):
        template = json.dumps({"spec": {"containers": [{"name": "main", field: value}]}})
        with pytest.raises(InvalidSpec) as refused:
            refuse_metric_file_fields(template, "spec.tasks[0].template")
        assert refused.value.field == f"spec.tasks[0].template.spec.containers[0].{field}"
        assert "gpufed sets it" in refused.value.rule
    # A sidecar's own termination message is not the metric: it may set it; no template at all is fine.
    sidecar = {"name": "log", "image": "busybox", "terminationMessagePath": "/tmp/x"}
    refuse_metric_file_fields(json.dumps({"spec": {"containers": [{"name": "main"}, sidecar]}}), "t")
    refuse_metric_file_fields("", "t")


def manifest_with_template(container: dict[str, Any]) -> str:
    template = {"spec": {"containers": [{"name": "main", **container}]}}
    return (
        "apiVersion: gpufed.io/v1\nkind: TrainingJob\nmetadata:\n  name: trainer\n"
        "spec:\n  gpuTypes: [A100]\n  tasks:\n"
        f"    - {{name: worker, replicas: 1, image: 'eval:1', gpus: 1, template: {json.dumps(template)}}}\n"
    )


async def submit(w: World, who: str, name: str, sweep: dict[str, Any], manifest: str | None = None) -> Any:
    text = manifest or test_jobsets.manifest("trainer")
    return await w.submit(who, name, [text], sweep=json.dumps(sweep), max_parallel=2)


async def test_the_submission_refuses_a_trial_template_that_sets_them_and_stores_nothing(
    world: World,
) -> None:
    text = manifest_with_template({"terminationMessagePath": "/etc/mine"})
    with pytest.raises(Refused) as refused:
        await submit(world, "alice", "owned", FILE_GRID, text)
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details.startswith(
        "manifests[0].spec.tasks[0].template.spec.containers[0].terminationMessagePath: gpufed sets it"
    )
    assert await world.store.kv.get(set_key("vision", "owned")) is None
    # The same template in a sweep whose metric is printed: the field is the user's.
    printed = {**FILE_GRID, "metric": {"name": "loss"}}
    assert (await submit(world, "alice", "owned", printed, text)).created


async def test_each_trials_main_container_gets_the_metric_file_as_its_termination_message(
    world: World,
) -> None:
    sweep = {**FILE_GRID, "metric": {**FILE_GRID["metric"], "path": "/etc/out/metric"}}
    await submit(world, "alice", "lr-file", sweep, manifest_with_template({"workingDir": "/w"}))
    for job in world.live("lr-file"):
        main = json.loads(job.spec.tasks[0].template)["spec"]["containers"][0]
        assert main["terminationMessagePath"] == "/etc/out/metric"
        assert main["terminationMessagePolicy"] == "File"
        assert main["workingDir"] == "/w"  # the template's own fields stay


# ---- the results


async def end_with_message(w: World, job: JobRecord, phase: JobPhase, message: str) -> None:
    """The attempt ends with `message` as its pod's termination message, kept as the reconciler keeps
    the attempt's summary; the trial printed nothing."""
    state = ReplicaState(f"{job.job_id}-0", "worker", 0, False, "n1", "Succeeded", 0, 0, "", message)
    kept = KeptAttempt(
        1, "onprem", "A100", "private", 1.0, 0.0, 1.0, phase.value, "", time.time(), "",
        (KeptReplica("worker", 0, state, 0),),
    )  # fmt: skip
    await LogArchive(w.store.kv, LogsSettings()).keep(job.job_id, kept, {})
    await w.end(job.job_id, phase)


async def test_results_rank_trials_by_their_termination_message_and_hide_them_from_others(
    world: World,
) -> None:
    await submit(world, "alice", "lr-file", FILE_GRID)
    trials = {dict(j.spec.tasks[0].env)["GPUFED_TRIAL"]: j for j in world.live("lr-file")}
    await end_with_message(world, trials["0"], JobPhase.SUCCEEDED, "loss=0.9\nloss=0.8\n")
    await end_with_message(world, trials["1"], JobPhase.SUCCEEDED, "accuracy=0.9\nloss=0.125\n")
    req = pb.GetJobSetRequest(name="lr-file")
    shown = await world.service.GetSweepResults(req, world.ctx("alice"))
    assert [(t.rank, t.key, t.metric) for t in shown.trials] == [(1, "trial-1", 0.125), (2, "trial-0", 0.8)]
    for tenant in ("", "vision"):
        with pytest.raises(Refused) as refused:
            await world.service.GetSweepResults(
                pb.GetJobSetRequest(name="lr-file", tenant=tenant), world.ctx("bob")
            )
        assert refused.value.code is grpc.StatusCode.NOT_FOUND
        assert refused.value.details == "job set 'lr-file' not found"


async def test_a_trial_whose_file_holds_no_value_ranks_last_without_a_metric(world: World) -> None:
    await submit(world, "alice", "lr-file", FILE_GRID)
    trials = {dict(j.spec.tasks[0].env)["GPUFED_TRIAL"]: j for j in world.live("lr-file")}
    await end_with_message(world, trials["0"], JobPhase.FAILED, "")
    await end_with_message(world, trials["1"], JobPhase.SUCCEEDED, "loss=2\n")
    shown = await world.service.GetSweepResults(pb.GetJobSetRequest(name="lr-file"), world.ctx("alice"))
    got = [(t.rank, t.key, t.metric if t.HasField("metric") else None) for t in shown.trials]
    assert got == [(1, "trial-1", 2.0), (0, "trial-0", None)]


# ---- the simulated kubelet's read of the file


def upper_with(tmp_path: Path, content: bytes, path: str = "/etc/gpufed-metric") -> tuple[Path, Path | None]:
    upper = tmp_path / "etc"
    upper.mkdir()
    file = local_exec.message_file(upper, {"terminationMessagePath": path})
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(content)
    return upper, file


def read(upper: Path, file: Path | None, *, limit: int = 4096, policy: str = "File", code: int = 0) -> str:
    lines = [f"line {i}" for i in range(200)]
    return local_exec.termination_message(file, upper, limit, policy=policy, exit_code=code, last_lines=lines)


def test_the_file_is_read_up_to_4096_bytes(tmp_path: Path) -> None:
    upper, file = upper_with(tmp_path, b"loss=0.5\n" + b"x" * 5000)
    message = read(upper, file)
    assert len(message.encode()) == 4096
    assert message.startswith("loss=0.5\nxxx")


def test_a_pods_containers_share_12_kib_of_messages() -> None:
    def pod(containers: int, inits: int = 0) -> dict[str, Any]:
        return {"spec": {"containers": [{}] * containers, "initContainers": [{}] * inits}}

    assert local_exec.termination_message_limit(pod(1)) == 4096
    assert local_exec.termination_message_limit(pod(3)) == 4096
    assert local_exec.termination_message_limit(pod(4)) == 3072
    assert local_exec.termination_message_limit(pod(8, 4)) == 1024


def test_only_a_path_under_etc_is_read_in_process_mode(tmp_path: Path) -> None:
    upper = tmp_path / "etc"
    assert local_exec.message_file(upper, {}) is None  # /dev/termination-log is the host's here
    assert local_exec.message_file(upper, {"terminationMessagePath": "/tmp/m"}) is None
    assert local_exec.message_file(upper, {"terminationMessagePath": "/etc/a/b"}) == upper / "a" / "b"


def test_fallback_to_logs_only_when_the_file_is_empty_and_the_container_failed(tmp_path: Path) -> None:
    upper, empty = upper_with(tmp_path, b"")
    assert read(upper, empty, policy="FallbackToLogsOnError", code=0) == ""
    assert read(upper, empty, policy="File", code=1) == ""
    tail = read(upper, empty, policy="FallbackToLogsOnError", code=1)
    # The last 80 lines at most, and at most 2048 bytes of them (here the bytes are the smaller).
    assert tail.endswith("line 199\n")
    assert len(tail.encode()) <= 2048
    assert "line 119\n" not in tail
    written = upper / "gpufed-metric"
    written.write_text("loss=1\n")
    assert read(upper, written, policy="FallbackToLogsOnError", code=1) == "loss=1\n"


def test_a_link_out_of_the_pods_etc_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("password=hunter2\n")
    upper = tmp_path / "etc"
    upper.mkdir()
    (upper / "gpufed-metric").symlink_to(secret)
    assert read(upper, upper / "gpufed-metric") == ""
    (upper / "dir").symlink_to(tmp_path, target_is_directory=True)
    assert read(upper, upper / "dir" / "host-secret") == ""


@needs_namespaces
async def test_process_mode_puts_the_file_the_process_wrote_into_the_terminated_message() -> None:
    engine = an_engine()
    script = (
        "test -f /etc/out/metric || exit 9; "  # made (empty) before the start, as a kubelet does
        "echo loss=0.25 > /etc/out/metric; head -c 6000 /dev/zero | tr '\\0' x >> /etc/out/metric"
    )
    body = {
        "metadata": {"name": "trial-0"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "i",
                    "command": ["/bin/sh", "-c", script],
                    "terminationMessagePath": "/etc/out/metric",
                }
            ],
        },
    }
    engine.store.create(PODS, engine.admission.admit_create(PODS, body, "default"))

    def ended() -> bool:
        engine.reconcile()
        return "terminated" in state(engine, "trial-0")

    try:
        await until(ended, "the process exited", timeout_s=30)
        terminated = state(engine, "trial-0")["terminated"]
        assert terminated["exitCode"] == 0, terminated
        assert terminated["message"].startswith("loss=0.25\nxxxx")
        assert len(terminated["message"].encode()) == 4096
        assert file_metric(terminated["message"], "loss") == 0.25
    finally:
        engine.kubelet.close()


def test_the_guides_file_metric_is_what_a_sweep_takes() -> None:
    import yaml

    page = (Path(__file__).resolve().parents[2] / "docs" / "jobsets.md").read_text()
    blocks = [b.split("```", 1)[0] for b in page.split("```yaml\n")[1:]]
    (text,) = [b for b in blocks if "source: file" in b]
    spec = parse_sweep({"parameters": {"lr": [1]}, **yaml.safe_load(text)})
    assert (spec.metric, spec.metric_source, spec.metric_path) == ("loss", MetricSource.FILE, METRIC_FILE)
    pythons = [b.split("```", 1)[0] for b in page.split("```python\n")[1:]]
    (python,) = [b for b in pythons if METRIC_FILE in b]
    assert file_metric("loss=0.5\naccuracy=0.9\n", "loss") == 0.5
    assert "loss={val_loss}" in python


def test_the_message_is_the_main_containers_in_its_terminated_state_or_last_state() -> None:
    from clusters.sim import podstatus

    pod = {
        "metadata": {"name": "p", "namespace": "n", "uid": "u"},
        "spec": {"containers": [{"name": "main"}, {"name": "side"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": c, "state": {"running": {"startedAt": "2026-11-30T07:00:00Z"}}}
                for c in ("main", "side")
            ],
        },
    }
    ended = podstatus.terminated(pod, 1.0e9, exit_code=0, container_message="loss=1\n")
    main, side = (cs["state"]["terminated"] for cs in ended["status"]["containerStatuses"])
    assert main["message"] == "loss=1\n"
    assert "message" not in side
    crashed = podstatus.crashed(pod, 1.0e9, exit_code=1, reason="Error", backoff_s=10, container_message="x")
    assert crashed["status"]["containerStatuses"][0]["lastState"]["terminated"]["message"] == "x"
    assert "message" not in crashed["status"]["containerStatuses"][1]["lastState"]["terminated"]
