"""End to end: a program that prints its tenant secret does not show it through gpufed.

The simulated cluster runs in process mode (`localExec`): the pod's command is a real local process,
and the simulated kubelet hands it the secret's values from the Kubernetes Secret that gpufed copied
into the job's namespace, as a kubelet would. The program prints the values as they are, in base64
and a line at a time. The judges: `gpufed logs` as a user runs it (while the job runs, read from the
pod; after it ends, from the kept copy), the console's plain-text log page as a browser gets it,
every key and value etcd holds (etcdctl) and the server's log file.
"""

from __future__ import annotations

import base64
import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusters.sim import local_exec
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.harness import ServerProcess, run_cli, wait_for
from tests.e2e.kube import job_of
from tests.e2e.test_secrets import console_pages, secrets_server
from tests.etcdctl import etcdctl

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
    pytest.mark.skipif(local_exec.available() is not None, reason=str(local_exec.available())),
]

CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "lab",
        "provider": "private",
        "region": "dc1",
        "localExec": True,
        "pools": [
            {
                "name": "a100",
                "gpuType": "A100",
                "kind": "private",
                "usdPerGpuHour": 1.0,
                "gpusPerNode": 4,
                "nodes": 1,
            }
        ],
    }
]
# Fresh per run, so that a hit anywhere can only be this run's leak.
TOKEN = f"hf_{secrets.token_hex(16)}"
PEM_LINES = [f"MII{secrets.token_hex(20)}", f"AoG{secrets.token_hex(20)}"]
PEM = "-----BEGIN KEY-----\n" + "\n".join(PEM_LINES) + "\n-----END KEY-----\n"
# Too short to mask (`MIN_MASKED_CHARS`): shown as printed, as the docs say.
SHORT = "a7"

PROGRAM = """
import base64, os, sys, time
token, pem = os.environ["HF_TOKEN"], os.environ["PEM"]
print(f"token={token}", flush=True)
print("b64 " + base64.b64encode(token.encode()).decode(), flush=True)
for line in pem.splitlines():
    print("pem: " + line, flush=True)
print("short " + os.environ["SHORT"], flush=True)
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print(f"bye {token}", flush=True)
"""


def leaks(text: str) -> list[str]:
    forms = {"token": TOKEN, "token base64": base64.b64encode(TOKEN.encode()).decode()}
    forms.update({f"pem line {i}": line for i, line in enumerate(PEM_LINES)})
    return [what for what, form in forms.items() if form in text]


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with secrets_server(
        etcd,
        sims,
        tmp_path,
        CLUSTERS,
        tenants=[{"name": "platform"}, {"name": "vision"}],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
        ],
    ) as process:
        yield process


def logs(fed: ServerProcess, job_id: str, *, check: bool = True) -> str:
    """`gpufed logs JOB`, as alice runs it ("" before its pod has started, unless `check`)."""
    done = run_cli(
        "--server", fed.target, "--token-file", str(fed.state_dir / "tokens" / "alice.token"), "logs", job_id
    )
    if not check and done.returncode != 0:
        return ""
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_secret_values_a_program_prints_are_masked_in_logs_kept_copies_describe_and_the_console(
    fed: ServerProcess, etcd: EtcdProcess, tmp_path: Path
) -> None:
    alice = fed.client("alice")
    alice.put_secret("hf", {"token": TOKEN.encode(), "pem": PEM.encode(), "short": SHORT.encode()})
    go = tmp_path / "go"
    job_id = alice.submit(
        f"""\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: printer}}
spec:
  gpuTypes: [A100]
  tasks:
    - name: main
      replicas: 1
      gpus: 1
      image: python:3.11
      command: {json.dumps([sys.executable, "-c", PROGRAM, str(go)])}
      secretEnv:
        - {{name: HF_TOKEN, secret: hf, key: token}}
        - {{name: PEM, secret: hf, key: pem}}
        - {{name: SHORT, secret: hf, key: short}}
"""
    ).job_id

    # While it runs: read from its pod.
    wait_for(lambda: "ready" in logs(fed, job_id, check=False), timeout_s=90)
    live = logs(fed, job_id)
    assert "token=***" in live
    assert "b64 ***" in live
    # Every line of a multi-line value, its armour too (as GitHub Actions masks them).
    assert live.count("pem: ***") == 4
    assert f"short {SHORT}" in live
    assert not leaks(live), live

    # After it ends: from the copy kept in etcd, which was masked before it was written.
    go.write_text("")
    wait_for(lambda: job_of(fed, "alice", job_id).phase == pb.JOB_PHASE_SUCCEEDED, timeout_s=90)
    wait_for(lambda: "bye ***" in logs(fed, job_id), timeout_s=60)
    kept = logs(fed, job_id)
    assert "token=***" in kept
    assert not leaks(kept), kept

    pages = console_pages(fed, "alice", [f"/jobs/{job_id}", f"/jobs/{job_id}/logs"])
    assert "token=***" in pages
    assert not leaks(pages)
    assert not leaks(str(alice.describe(job_id)))
    dump = etcdctl(etcd.endpoint, "get", "", "--prefix").stdout
    assert f"/gpufed/logs/{job_id}/1/main-0" in dump  # the kept copy is there
    assert not leaks(dump)
    assert not leaks(fed.log_text())
