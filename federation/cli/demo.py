"""`gpufed demo` (`make demo`): the embedded default, end to end, in well under a minute.

It starts `gpufed up` as its own process in a temporary state directory, submits the examples as
two tenants, shows what the federation does with them (placement, tenant isolation, a clear error
for a bad manifest, an explained wait, a cancel), watches every job to its end, stages a dataset to
the cloud for a job and reuses the copy (`demo_data`), grows a cloud pool for a gang that fits
nowhere (`demo_capacity`), shows finance's report, and stops the process group cleanly. Exit status
0 only if every step did what it should.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc

from federation.api.client import GpufedClient, wait_until_serving
from federation.api.convert import phase_name
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli import demo_capacity, demo_data
from federation.cli.render import clusters_table, explain_text, jobs_table
from federation.runtime.embedded import ENDPOINT_FILE, read_endpoint

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TERMINAL = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}

UNPLACEABLE = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: needs-b200}
spec:
  gpuTypes: [B200]
  tasks:
    - {name: worker, replicas: 2, image: "pytorch/pytorch:2.3", gpus: 8}
"""


def _step(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def _start_up(state_dir: Path) -> subprocess.Popen[bytes]:
    log = (state_dir / "up.log").open("wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "federation",
            "--state-dir",
            str(state_dir),
            "up",
            "--port",
            "0",
            "--metrics-port",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_for_endpoint(state_dir: Path, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gpufed up exited with {proc.returncode}; see {state_dir / 'up.log'}")
        if (state_dir / ENDPOINT_FILE).exists():
            target = read_endpoint(state_dir)["grpc"]
            wait_until_serving(target)
            return target
        time.sleep(0.2)
    raise RuntimeError("gpufed up did not become ready in time")


def _stop(proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return False
    return proc.returncode == 0


def _kubectl_gangs(state_dir: Path, context: str) -> str:
    """`kubectl get` of gpufed's gang objects: Volcano Jobs where the cluster serves them, else
    Indexed Jobs. kubectl comes with the dev dependencies, beside this interpreter."""
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if kubectl is None:
        return "(no kubectl installed)"
    text = ""
    for resource in ("jobs.batch.volcano.sh", "jobs.batch"):
        out = subprocess.run(
            [
                kubectl,
                "--kubeconfig",
                str(state_dir / "sim" / "kubeconfig"),
                "--context",
                context,
                "get",
                resource,
                "--all-namespaces",
                "--selector",
                "app.kubernetes.io/managed-by=gpufed",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        text = (out.stdout or out.stderr).rstrip()
        if out.returncode == 0 and out.stdout.strip():
            break
    return text


def _token(state_dir: Path, user: str) -> str:
    return (state_dir / "tokens" / f"{user}.token").read_text().strip()


def run_demo() -> int:
    with tempfile.TemporaryDirectory(prefix="gpufed-demo-") as tmp:
        state_dir = Path(tmp)
        proc = _start_up(state_dir)
        ok = False
        try:
            target = _wait_for_endpoint(state_dir, proc)
            ok = _scenario(target, state_dir)
        except Exception as error:  # the demo reports any failure and still stops what it started
            print(f"demo failed: {error!r}", file=sys.stderr)
            print((state_dir / "up.log").read_text()[-4000:], file=sys.stderr)
        finally:
            _step("stopping the embedded default")
            clean = _stop(proc)
            print("stopped cleanly" if clean else "had to kill the embedded default", flush=True)
            ok = ok and clean
        print("\ndemo " + ("passed" if ok else "FAILED"), flush=True)
        return 0 if ok else 1


def _scenario(target: str, state_dir: Path) -> bool:
    admin = GpufedClient(target, _token(state_dir, "admin"))
    alice = GpufedClient(target, _token(state_dir, "alice"))
    bob = GpufedClient(target, _token(state_dir, "bob"))
    checks: list[tuple[str, bool]] = []

    _step(f"gpufed is up at {target}; member clusters (as admin)")
    print(clusters_table(admin.clusters()))

    _step("alice (tenant vision) and bob (tenant nlp) submit the examples")
    key = str(uuid.uuid4())
    vision = alice.submit((EXAMPLES / "resnet-vision.yaml").read_text(), idempotency_key=key)
    again = alice.submit((EXAMPLES / "resnet-vision.yaml").read_text(), idempotency_key=key)
    llm = bob.submit((EXAMPLES / "llm-finetune-nlp.yaml").read_text(), idempotency_key=str(uuid.uuid4()))
    bert = bob.submit((EXAMPLES / "bert-eval-nlp.yaml").read_text(), idempotency_key=str(uuid.uuid4()))
    waits = bob.submit(UNPLACEABLE, idempotency_key=str(uuid.uuid4()))
    for reply in (vision, llm, bert, waits):
        print(f"submitted {reply.job_id} ({reply.job.tenant})")
    print(f"same idempotency key again -> {again.job_id} (created={again.created})")
    checks.append(
        ("idempotent resubmission gives the same job", again.job_id == vision.job_id and not again.created)
    )

    _step("a bad manifest is refused with the field and the rule")
    try:
        alice.submit((EXAMPLES / "invalid-replicas.yaml").read_text())
        checks.append(("invalid manifest refused", False))
    except grpc.RpcError as error:
        print(f"{error.code().name}: {error.details()}")
        checks.append(("invalid manifest refused", error.code() == grpc.StatusCode.INVALID_ARGUMENT))

    _step("tenants are isolated: bob asks for alice's job")
    try:
        bob.get(vision.job_id)
        checks.append(("other tenant's job hidden", False))
    except grpc.RpcError as error:
        print(f"{error.code().name}: {error.details()}")
        checks.append(("other tenant's job hidden", error.code() == grpc.StatusCode.NOT_FOUND))

    _step("watching every job to its end (as admin)")
    expected = {vision.job_id, llm.job_id, bert.job_id}
    finished: dict[str, pb.Job] = {}
    deadline = time.monotonic() + 90
    explained = False
    for event in admin.watch(include_initial=True, timeout_s=90):
        j = event.job
        where = (
            f" on {j.cluster} ({j.gpu_type} {j.capacity_kind} ${j.usd_per_gpu_hour:.2f}/GPU-h)"
            if j.cluster
            else ""
        )
        print(f"{j.job_id:<32} {phase_name(j.phase):<10}{where}")
        if not explained and j.job_id == waits.job_id and j.phase == pb.JOB_PHASE_QUEUED:
            time.sleep(1.0)
            _step("why does bob's B200 job wait?")
            why = bob.explain(waits.job_id)
            print(explain_text(why))
            checks.append(("explain gives reasons", len(why.reasons) > 0))
            bob.cancel(waits.job_id, reason="no B200 anywhere; cancelled by bob")
            print(f"bob cancelled {waits.job_id}")
            explained = True
        if j.phase in TERMINAL and j.job_id in expected:
            finished[j.job_id] = j
        if len(finished) == len(expected) or time.monotonic() > deadline:
            break

    _step("final state (as admin)")
    jobs = admin.list_all()
    print(jobs_table(jobs))
    by_id = {j.job_id: j for j in jobs}
    checks.append(
        (
            "every example job succeeded",
            all(by_id[i].phase == pb.JOB_PHASE_SUCCEEDED for i in expected if i in by_id),
        )
    )
    checks.append(("unplaceable job cancelled", by_id[waits.job_id].phase == pb.JOB_PHASE_CANCELLED))
    checks.append(("bob sees only nlp jobs", {j.tenant for j in bob.list_all()} == {"nlp"}))

    _step("what the member clusters hold: kubectl on each simulated cluster's Kubernetes API")
    shown = {name: _kubectl_gangs(state_dir, name) for name in sorted({by_id[i].cluster for i in expected})}
    for name, text in shown.items():
        print(f"--- {name}\n{text}")
    checks.append(
        (
            "each gang is one object on its cluster",
            all(f"{i}-a{by_id[i].attempt}" in shown.get(by_id[i].cluster, "") for i in expected),
        )
    )
    data_checks, data_jobs = demo_data.run(alice, state_dir)
    checks += data_checks
    infra = GpufedClient(target, _token(state_dir, "infra"))
    capacity_checks, gang = demo_capacity.run(bob, infra, state_dir)
    checks += capacity_checks
    ran = expected | data_jobs | {gang}

    _step("finance: GPU-hours and cost from the usage ledger (as finance, then as alice)")
    finance = GpufedClient(target, _token(state_dir, "finance"))
    print(finance.report(group_by=["tenant", "gpu_type"]).content)
    charged = {iv.job_id for iv in finance.ledger().intervals}
    checks.append(("every job that ran is in the ledger", ran <= charged))
    checks.append(("the job cancelled before it started costs nothing", waits.job_id not in charged))
    mine = {iv.tenant for iv in alice.ledger().intervals}
    checks.append(("alice's report holds only her tenant", mine <= {"vision"}))
    html = finance.report(fmt="html").content
    checks.append(("the HTML report has its charts", 'id="cost-by-tenant"' in html and 'class="bar"' in html))
    print(f"HTML report: {len(html):,} bytes, self-contained (gpufed report -o html --out FILE)")
    for client in (admin, alice, bob, infra, finance):
        client.close()

    _step("checks")
    for name, passed in checks:
        print(f"{'ok  ' if passed else 'FAIL'} {name}")
    return all(passed for _, passed in checks)
