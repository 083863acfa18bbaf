"""`gpufed up` and the CLI as a user runs them: separate processes, state under one directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import pytest
import yaml

from federation.api.client import wait_until_serving
from federation.runtime.embedded import ENDPOINT_FILE, read_endpoint
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.e2e
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _gpufed(state_dir: Path, *args: str, user: str = "alice") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "federation", "--state-dir", str(state_dir), "--user", user, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line names `text` (the state dir): gpufed up and the etcd it started."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


class Up:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0
        self.log_path = state_dir.parent / "up-0.log"

    def start(self) -> None:
        self.starts += 1
        self.log_path = self.state_dir.parent / f"up-{self.starts}.log"
        # Kept for the failure message: a stop that hangs leaves its thread stacks here.
        with self.log_path.open("w") as stderr:
            self.proc = self._spawn(stderr)
        wait_for(
            lambda: (self.state_dir / ENDPOINT_FILE).exists() or self.proc.poll() is not None, timeout_s=60
        )
        assert self.proc.poll() is None, "gpufed up exited"
        wait_until_serving(read_endpoint(self.state_dir)["grpc"])

    def _spawn(self, stderr: IO[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "federation",
                "--state-dir",
                str(self.state_dir),
                "up",
                "--port",
                "0",
                "--metrics-port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            tail = self.log_path.read_text()[-6000:]
            raise AssertionError(
                f"gpufed up did not stop within 30 s after SIGTERM; its stderr ends:\n{tail}"
            ) from None


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    instance = Up(tmp_path / "state")
    instance.start()
    yield instance
    if instance.proc is not None and instance.proc.poll() is None:
        instance.stop()


def test_cli_submit_get_list_explain_cancel_and_metrics(up: Up) -> None:
    sd = up.state_dir
    # Each `gpufed` call is a process of its own (about a second of imports), and none of them waits for
    # another but for the job id: side by side, the calls take the time of the longest, `watch`, which
    # waits for the job to finish, rather than the sum of them all.
    with ThreadPoolExecutor(max_workers=8) as pool:
        bad_f = pool.submit(_gpufed, sd, "submit", "-f", str(EXAMPLES / "invalid-replicas.yaml"))
        whoami_f = pool.submit(_gpufed, sd, "whoami", user="admin")
        clusters_f = pool.submit(_gpufed, sd, "clusters", user="admin")
        out = _gpufed(sd, "submit", "-f", str(EXAMPLES / "resnet-vision.yaml"), "--idempotency-key", "cli-1")
        assert out.returncode == 0, out.stderr
        job_id = out.stdout.split()[0]
        watched_f = pool.submit(_gpufed, sd, "watch", job_id)
        got_f = pool.submit(_gpufed, sd, "-o", "json", "get", job_id)
        listed_f = pool.submit(_gpufed, sd, "-o", "yaml", "list")
        table_f = pool.submit(_gpufed, sd, "list")
        other_f = pool.submit(_gpufed, sd, "get", job_id, user="bob")

        got = got_f.result()
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["tenant"] == "vision"

        listed = listed_f.result()
        assert job_id in {j["job_id"] for j in yaml.safe_load(listed.stdout)["jobs"]}

        table = table_f.result()
        assert table.stdout.splitlines()[0].split()[:3] == ["JOB", "TENANT", "PHASE"]

        watched = watched_f.result()
        assert watched.returncode == 0
        assert "SUCCEEDED" in watched.stdout.splitlines()[-1]

        bad = bad_f.result()
        assert bad.returncode == 1
        assert "INVALID_ARGUMENT" in bad.stderr
        assert "replicas" in bad.stderr

        other = other_f.result()
        assert other.returncode == 1
        assert "NOT_FOUND" in other.stderr

        whoami = whoami_f.result()
        assert "role admin" in whoami.stdout
        clusters = clusters_f.result()
        assert "onprem-a100" in clusters.stdout

    metrics_url = read_endpoint(sd)["metrics"]
    with urllib.request.urlopen(metrics_url, timeout=5) as response:  # loopback only
        text = response.read().decode()
    for name in (
        "gpufed_queue_depth",
        "gpufed_admissions_total",
        "gpufed_scheduling_cycle_seconds",
        "gpufed_api_request_seconds",
    ):
        assert name in text


def test_up_keeps_state_across_a_restart_and_stops_everything_it_started(up: Up) -> None:
    sd = up.state_dir
    manifest = (EXAMPLES / "bert-eval-nlp.yaml").read_text()
    out = subprocess.run(
        [sys.executable, "-m", "federation", "--state-dir", str(sd), "--user", "bob", "submit", "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.split()[0]
    assert _processes_mentioning(str(sd)), "expected gpufed up and its etcd to be running"
    assert up.stop() == 0
    assert not (sd / ENDPOINT_FILE).exists()
    wait_for(lambda: not _processes_mentioning(str(sd)), timeout_s=10)

    up.start()
    got = _gpufed(sd, "-o", "json", "get", job_id, user="bob")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["job_id"] == job_id
