"""End to end, issue 34 (outputs as datasets): a two-step pipeline on `gpufed serve` with a simulated
cluster in process mode (`localExec`: each pod's command is a real local process) and a real SeaweedFS
as the cluster's object store, through the CLI as a user meets it.

`prep` writes its output with rclone (not gpufed's code) under the prefix gpufed gives its attempt
(GPUFED_OUTPUT_TOKENS); it waits for a file the test creates, so that `train`, submitted meanwhile and
naming `tokens@v1` (a version that does not exist yet), is seen held in the queue with an explain that
says why. Once prep succeeds its output becomes `tokens@v1`; train then runs, and its own output
`model@m1` has tokens@v1 as its ancestor. The judge of the registered manifest is `rclone check
--checkfile sha256` against the bytes in the bucket, read through rclone's hasher (SeaweedFS keeps
no sha256). Then: a third party with the bucket's keys overwrites an object, and the version is
unchanged while rclone check and `gpufed dataset verify` both name the object; another tenant can
neither read the lineage nor write into vision's dataset; a failed job's partial output is never
registered.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusters.sim import local_exec
from datasync import manifest_from_json
from datasync.seaweed_process import SeaweedProcess
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from federation.store.kv_etcd import EtcdKv
from federation.store.schema_version import checked
from tests.e2e.harness import ServerProcess, run_cli_as, wait_for
from tests.e2e.kube import serve_clusters

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(local_exec.available() is not None, reason=str(local_exec.available())),
]

BUCKET = "lab"
RCLONE = Path(sys.executable).parent / "rclone"
CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "lab",
        "provider": "private",
        "region": "dc1",
        "localExec": True,
        "objectStore": "lab",
        "pools": [
            {
                "name": "a100",
                "gpuType": "A100",
                "kind": "private",
                "usdPerGpuHour": 1.0,
                "gpusPerNode": 4,
                "nodes": 2,
            }
        ],
    }
]


@pytest.fixture
def seaweed(tmp_path: Path) -> Iterator[SeaweedProcess]:
    with SeaweedProcess(tmp_path / "weed", buckets=[BUCKET]) as weed:
        yield weed


def rclone_env(weed: SeaweedProcess) -> dict[str, str]:
    """An rclone remote `lab:` on the bucket's S3 endpoint with its keys, as a job or a third party
    with those keys would have it."""
    prefix = "RCLONE_CONFIG_LAB_"
    return {
        prefix + "TYPE": "s3",
        prefix + "PROVIDER": "SeaweedFS",
        prefix + "ENDPOINT": weed.endpoint,
        prefix + "ACCESS_KEY_ID": weed.access_key_id,
        prefix + "SECRET_ACCESS_KEY": weed.secret_access_key,
        prefix + "REGION": "us-east-1",
    }


@pytest.fixture
def fed(
    etcd: EtcdProcess,
    sims: SimProcess,
    seaweed: SeaweedProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ServerProcess]:
    monkeypatch.setenv("LAB_KEY_ID", seaweed.access_key_id)
    monkeypatch.setenv("LAB_SECRET", seaweed.secret_access_key)
    stores = {
        "lab": {
            "kind": "s3",
            "bucket": BUCKET,
            "endpoint": seaweed.endpoint,
            "region": "us-east-1",
            "accessKeyIdEnv": "LAB_KEY_ID",
            "secretAccessKeyEnv": "LAB_SECRET",
        }
    }
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=8,
        objectStores=stores,
        tenants=[{"name": "platform"}, {"name": "vision"}, {"name": "nlp"}],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
            {"name": "bob", "tenant": "nlp"},
        ],
    ) as process:
        yield process


# The CLI as one of the fixture's users (tests/e2e/harness.py).
cli = run_cli_as


def cli_json(fed: ServerProcess, user: str, *args: str) -> Any:
    done = cli(fed, user, *args, "-o", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def job_file(
    tmp_path: Path,
    name: str,
    script: str,
    env: dict[str, str],
    *,
    outputs: list[dict[str, str]],
    dataset: str | None = None,
) -> Path:
    spec: dict[str, Any] = {
        "gpuTypes": ["A100"],
        "outputs": outputs,
        "restartPolicy": {"maxRetries": 0},
        "tasks": [
            {
                "name": "main",
                "replicas": 1,
                "gpus": 1,
                "image": "python:3.11",
                "command": ["/bin/sh", "-c", script],
                "env": env,
            }
        ],
    }
    if dataset is not None:
        spec["dataset"] = dataset
    path = tmp_path / f"{name}.yaml"
    doc = {"apiVersion": "gpufed.io/v1", "kind": "TrainingJob", "metadata": {"name": name}, "spec": spec}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def submit(fed: ServerProcess, user: str, path: Path) -> str:
    done = cli_json(fed, user, "submit", str(path))
    return str(done["job_id"])


def job(fed: ServerProcess, user: str, job_id: str) -> dict[str, Any]:
    return cli_json(fed, user, "get", job_id)  # type: ignore[no-any-return]


def phase_of(fed: ServerProcess, user: str, job_id: str) -> str:
    return str(job(fed, user, job_id)["phase"])


def ended(fed: ServerProcess, user: str, job_id: str) -> str | None:
    p = phase_of(fed, user, job_id)
    return p if p in ("JOB_PHASE_SUCCEEDED", "JOB_PHASE_FAILED", "JOB_PHASE_CANCELLED") else None


def at_s(event: dict[str, Any]) -> float:
    """An event's time (RFC 3339, nanoseconds or none) in seconds."""
    text = str(event["at"]).removesuffix("Z")
    whole, _, fraction = text.partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp() + float(f"0.{fraction or 0}")


def manifest_of(etcd: EtcdProcess, name: str, version: str) -> Any:
    """The registered manifest, as etcd holds it (the test's only direct read of gpufed's state)."""

    async def read() -> Any:
        kv = await EtcdKv.connect(etcd.endpoint)
        try:
            held = await kv.get(f"/gpufed/manifests/{name}/{version}".encode())
            assert held is not None
            return manifest_from_json(checked(held.value, held.key))
        finally:
            await kv.close()

    return asyncio.run(read())


def rclone_check(weed: SeaweedProcess, prefix: str, sums: Path) -> subprocess.CompletedProcess[str]:
    """rclone's check of a SUM file (the manifest's sha256 of each path) against the bucket's bytes:
    `rclone hashsum sha256 --checkfile SUMS --download`, which reads every object and hashes it (S3
    keeps no sha256 for rclone to ask for) and reports each path that differs or is missing."""
    return subprocess.run(
        [str(RCLONE), "hashsum", "sha256", "--download", "--checkfile", str(sums), f"lab:{BUCKET}/{prefix}"],
        env={**os.environ, **rclone_env(weed)}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


PREP = (
    # Waits for the test's go-ahead (a file), then writes its output with rclone.
    'while [ ! -e "$GO" ]; do sleep 0.05; done; set -e; '
    'printf "tokens of shard 0" | "$RCLONE" rcat "lab:lab/${GPUFED_OUTPUT_TOKENS}shard-0.txt"; '
    'head -c 3000 /dev/zero | "$RCLONE" rcat "lab:lab/${GPUFED_OUTPUT_TOKENS}nested/shard-1.bin"; '
    'echo "wrote to $GPUFED_OUTPUT_TOKENS"'
)
TRAIN = 'set -e; printf "weights" | "$RCLONE" rcat "lab:lab/${GPUFED_OUTPUT_MODEL}model.bin"'
BROKEN = 'printf "half" | "$RCLONE" rcat "lab:lab/${GPUFED_OUTPUT_TOKENS}half.txt"; exit 3'


def test_a_two_step_pipeline_runs_in_order_and_its_output_is_a_verified_dataset_with_lineage(
    fed: ServerProcess, seaweed: SeaweedProcess, etcd: EtcdProcess, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    env = {**rclone_env(seaweed), "RCLONE": str(RCLONE), "GO": str(go), "LR": "0.1"}
    prep_id = submit(
        fed,
        "alice",
        job_file(
            tmp_path,
            "prep",
            PREP,
            env,
            outputs=[{"dataset": "tokens", "path": "vision/tokens/", "version": "v1"}],
        ),
    )
    wait_for(lambda: phase_of(fed, "alice", prep_id) == "JOB_PHASE_RUNNING", timeout_s=60, interval_s=0.2)
    train_id = submit(
        fed,
        "alice",
        job_file(
            tmp_path,
            "train",
            TRAIN,
            env,
            outputs=[{"dataset": "model", "path": "vision/models/", "version": "m1"}],
            dataset="tokens@v1",
        ),
    )
    # Held in the queue, holding no GPUs, while prep runs; explain says what for.
    explained = cli_json(fed, "alice", "explain", train_id)
    assert (
        f"waiting for its input vision/tokens@v1, the declared output of job {prep_id}"
        in explained["summary"]
    ), explained
    assert phase_of(fed, "alice", train_id) == "JOB_PHASE_QUEUED"
    assert cli_json(fed, "alice", "dataset", "outputs", prep_id)["outputs"][0]["state"] == "pending"

    go.touch()
    assert (
        wait_for(lambda: ended(fed, "alice", prep_id), timeout_s=60, interval_s=0.2) == "JOB_PHASE_SUCCEEDED"
    )
    assert (
        wait_for(lambda: ended(fed, "alice", train_id), timeout_s=90, interval_s=0.2) == "JOB_PHASE_SUCCEEDED"
    )

    # In order: train was admitted only after prep succeeded.
    prep_events, train_events = job(fed, "alice", prep_id)["events"], job(fed, "alice", train_id)["events"]
    prep_done = max(at_s(e) for e in prep_events if e["phase"] == "JOB_PHASE_SUCCEEDED")
    train_admitted = min(at_s(e) for e in train_events if e["phase"] == "JOB_PHASE_ADMITTED")
    assert train_admitted >= prep_done, (prep_events, train_events)

    # The output is tokens@v1: the succeeded attempt's prefix, with its manifest and lineage.
    (output,) = cli_json(fed, "alice", "dataset", "outputs", prep_id)["outputs"]
    assert output["state"] == "registered", output

    def registered(job_id: str) -> bool:
        (out,) = cli_json(fed, "alice", "dataset", "outputs", job_id)["outputs"]
        assert out["state"] in ("registering", "registered"), out
        return bool(out["state"] == "registered")

    # train's own output is registered a moment after it succeeds (every server's controller polls).
    wait_for(lambda: registered(train_id), timeout_s=30, interval_s=0.2)
    prefix = f"vision/tokens/{prep_id}/a1/"
    assert (output["store"], output["prefix"]) == ("lab", prefix)
    shown = cli_json(fed, "alice", "dataset", "show", "tokens")
    (version,) = shown["versions"]
    assert (version["version"], version["prefix"], int(version["object_count"])) == ("v1", prefix, 2)

    lineage = cli_json(fed, "alice", "dataset", "lineage", "model@m1")
    assert [(a["dataset"], a["version"]) for a in lineage["ancestors"]] == [("vision/tokens", "v1")]
    assert lineage["version"]["job_id"] == train_id
    tokens = cli_json(fed, "alice", "dataset", "lineage", "tokens@v1")
    assert tokens["version"]["job_id"] == prep_id
    assert "LR=0.1" in tokens["version"]["params"]
    assert tokens["version"]["images"] == ["python:3.11"]
    assert [(d["dataset"], d["version"]) for d in tokens["descendants"]] == [("vision/model", "m1")]
    table = cli(fed, "alice", "dataset", "lineage", "tokens@v1")
    assert f"vision/tokens@v1  made by job {prep_id}" in table.stdout, table.stdout

    # rclone, the judge: the manifest's sha256 of every path against the bytes in the bucket.
    manifest = manifest_of(etcd, "vision/tokens", "v1")
    assert sorted(e.path for e in manifest.entries) == ["nested/shard-1.bin", "shard-0.txt"]
    sums = tmp_path / "tokens.sha256"
    sums.write_text("".join(f"{e.sha256}  {e.path}\n" for e in manifest.entries))
    judged = rclone_check(seaweed, prefix, sums)
    assert judged.returncode == 0, judged.stderr[-3000:]
    assert "2 matching files" in judged.stderr, judged.stderr[-3000:]

    # A third party with the bucket's keys overwrites an object after the job ended: the registered
    # version does not change, and both rclone and gpufed's verify name the object.
    third = subprocess.run(
        [str(RCLONE), "rcat", f"lab:{BUCKET}/{prefix}shard-0.txt"],
        input="tokens of shard X", env={**os.environ, **rclone_env(seaweed)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert third.returncode == 0, third.stderr
    assert manifest_of(etcd, "vision/tokens", "v1") == manifest
    judged = rclone_check(seaweed, prefix, sums)
    assert judged.returncode != 0
    assert "shard-0.txt" in judged.stderr, judged.stderr[-3000:]
    verified = cli(fed, "alice", "dataset", "verify", "tokens@v1", "--store", "lab", "--no-repair")
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "wrong sha256: shard-0.txt" in verified.stdout, verified.stdout

    # Another tenant learns nothing through lineage, and cannot write into vision's dataset.
    hidden = cli(fed, "bob", "dataset", "lineage", "vision/tokens@v1")
    assert hidden.returncode != 0
    assert "NOT_FOUND" in hidden.stderr, hidden.stderr
    sneaky = job_file(
        tmp_path, "sneaky", TRAIN, env, outputs=[{"dataset": "vision/tokens", "path": "nlp/x/"}]
    )
    refused = cli(fed, "bob", "submit", str(sneaky))
    assert refused.returncode != 0
    assert "spec.outputs[0].dataset" in refused.stderr, refused.stderr
    assert "cannot write into another tenant's dataset" in refused.stderr, refused.stderr


def test_a_failed_jobs_partial_output_is_never_registered(
    fed: ServerProcess, seaweed: SeaweedProcess, tmp_path: Path
) -> None:
    env = {**rclone_env(seaweed), "RCLONE": str(RCLONE)}
    broken_id = submit(
        fed,
        "alice",
        job_file(
            tmp_path,
            "broken",
            BROKEN,
            env,
            outputs=[{"dataset": "tokens", "path": "vision/tokens/", "version": "v9"}],
        ),
    )
    assert (
        wait_for(lambda: ended(fed, "alice", broken_id), timeout_s=60, interval_s=0.2) == "JOB_PHASE_FAILED"
    )
    (output,) = cli_json(fed, "alice", "dataset", "outputs", broken_id)["outputs"]
    assert output["state"] == "not_registered", output
    # Its partial object is in the bucket, and is no dataset.
    listed = subprocess.run(
        [str(RCLONE), "lsf", "-R", f"lab:{BUCKET}/vision/tokens/{broken_id}/"],
        env={**os.environ, **rclone_env(seaweed)}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "half.txt" in listed.stdout, listed.stderr
    missing = cli(fed, "alice", "dataset", "show", "tokens")
    assert missing.returncode != 0
    assert "NOT_FOUND" in missing.stderr, missing.stderr
