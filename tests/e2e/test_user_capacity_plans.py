"""Capacity plans as the infra team uses them (issue 30, item 1): `gpufed capacity plan ...` against a
server with the embedded default's simulated clusters, capacity pools and limits (only the lead
time, boot and idle TTL made short), and kubectl against the simulated clusters as the judge of what
the pools hold.

The embedded default's aws pools: a100-od (8 x A100 at $2.7447), a100-spot, h100-od (8 x H100 at
$6.88, $55.04 a node), h100-spot, two nodes each (64 GPUs in aws), at most 16 nodes a pool; aws may
hold 128 GPUs; the spend ceiling is $1,000/h.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.main import cli
from federation.runtime.config import load_config
from federation.runtime.embedded import default_config_path
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import serve_clusters

pytestmark = pytest.mark.e2e

CLUSTER = "aws-us-east-1"
H100_NODE_USD = 8 * 6.88
A100_NODE_USD = 8 * 2.7447
# Short, for a test: new nodes are asked for the lead time ahead and boot in BOOT_S; idle ones go
# after the TTL, so that each test leaves the pools as configured.
LEAD_S, BOOT_S, TTL_S = 2, 1, 1


def _default() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(default_config_path().read_text())
    return doc


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, SimProcess]]:
    """One server for the module, on an etcd and a simulator of its own, with the embedded default's
    clusters, tenants, users and capacity section. Object stores and datasets are left out: they
    are `gpufed up`'s local SeaweedFS servers, which no test here needs."""
    root = tmp_path_factory.mktemp("plans")
    doc = _default()
    clusters = [{k: v for k, v in c.items() if k not in ("backend", "objectStore", "volcano")} for c in
                load_config(default_config_path()).simulated]  # fmt: skip
    capacity = {
        **doc["capacity"],
        "leadTimeSeconds": LEAD_S,
        "simulatedBootSeconds": BOOT_S,
        "idleTtlSeconds": TTL_S,
    }
    etcd = EtcdProcess(root / "etcd")
    etcd.start()
    try:
        with (
            SimProcess(root / "sim", load_config(default_config_path()).simulated) as sims,
            serve_clusters(
                etcd,
                root,
                sims,
                clusters,
                grace_s=30,
                tenants=doc["tenants"],
                users=doc["users"],
                capacity=capacity,
            ) as fed,
        ):
            yield fed, sims
    finally:
        etcd.stop()


def gpufed(fed: ServerProcess, user: str, *args: str) -> tuple[int, str]:
    """The CLI as a user runs it, in this process (click's runner) against the live server."""
    token = fed.state_dir / "tokens" / f"{user}.token"
    result = CliRunner().invoke(cli, ["--server", fed.target, "--token-file", str(token), *args])
    return result.exit_code, result.output


def plans(fed: ServerProcess) -> dict[str, dict[str, Any]]:
    """`gpufed -o json capacity plan list`, by plan id."""
    code, out = gpufed(fed, "infra", "-o", "json", "capacity", "plan", "list")
    assert code == 0, out
    return {p["plan_id"]: p for p in json.loads(out).get("plans", [])}


def kubectl_nodes(sims: SimProcess, pool: str) -> int:
    """The pool's nodes as `kubectl get nodes` lists them (not being deleted)."""
    assert KUBECTL is not None, "kubectl is not installed (make setup puts it in .venv/bin)"
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", str(sims.kubeconfig), "--context", CLUSTER, "get", "nodes",
         "-l", f"gpufed.io/pool={pool}", "-o", "json"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    return sum(1 for n in items if not n["metadata"].get("deletionTimestamp"))


def _created_id(out: str) -> str:
    assert out.startswith("plan plan-"), out
    return out.split()[1]


def _cancel_all_and_wait_for_the_configured_pools(fed: ServerProcess, sims: SimProcess) -> None:
    for plan_id, p in plans(fed).items():
        if p["state"] not in ("ended", "cancelled"):
            assert gpufed(fed, "infra", "capacity", "plan", "cancel", plan_id)[0] == 0
    for pool in ("h100-od", "h100-spot", "a100-od", "a100-spot"):
        wait_for(lambda pool=pool: kubectl_nodes(sims, pool) == 2, timeout_s=20)


def _until(seconds_from_now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + seconds_from_now))


def test_members_neither_read_nor_make_plans_and_finance_only_reads_them(
    world: tuple[ServerProcess, SimProcess],
) -> None:
    """Plans name other tenants' jobs and, now, a deadline plan's tenant: members read none of it."""
    fed, _ = world
    for args in (("plan", "list"), ("plan", "preview", "--cluster", CLUSTER, "--gpu-type", "H100", "--gpus", "8",
                 "--to", _until(3600))):  # fmt: skip
        code, out = gpufed(fed, "alice", "capacity", *args)
        assert code != 0, out
        assert "PERMISSION_DENIED" in out, out
    code, out = gpufed(fed, "finance", "capacity", "plan", "list")
    assert code == 0, out
    code, out = gpufed(fed, "finance", "capacity", "plan", "create", "--cluster", CLUSTER, "--gpu-type", "H100",
                       "--gpus", "8", "--to", _until(3600), "--allow-partial")  # fmt: skip
    assert code != 0, out
    assert "PERMISSION_DENIED" in out, out


def test_plans_are_checked_against_the_limits_and_hold_what_the_pools_hold(
    world: tuple[ServerProcess, SimProcess],
) -> None:
    fed, sims = world
    until = _until(3600)
    # An older plan: 32 H100 (four h100-od nodes, two more than configured).
    code, out = gpufed(fed, "infra", "capacity", "plan", "create", "--cluster", CLUSTER, "--gpu-type",
                       "H100", "--gpus", "32", "--to", until, "--reason", "older")  # fmt: skip
    assert code == 0, out
    older = _created_id(out)
    before = set(plans(fed))

    # 4,096 H100: the preview says what cannot be held, and create refuses it, storing nothing.
    big = ["--cluster", CLUSTER, "--gpu-type", "H100", "--gpus", "4096", "--to", until]
    code, out = gpufed(fed, "infra", "capacity", "plan", "preview", *big)
    assert code == 0, out
    assert "shortfall: 4048 GPU(s)" in out, out
    code, out = gpufed(fed, "infra", "capacity", "plan", "create", *big)
    assert code != 0, out
    assert "FAILED_PRECONDITION" in out, out
    assert "gpus: the pools can hold 48 of the 4096" in out, out
    for limit in ("the pools' maximum", "the aws limit of 128 GPUs", "the spend ceiling of $1,000.00/h"):
        assert limit in out, out
    assert set(plans(fed)) == before

    # Accepted as partial: aws holds 128 GPUs, of which 32 A100 (2 nodes), the spot H100 pool's 16
    # and the older plan's 32 are taken: 48 H100 (six more h100-od nodes) fit.
    code, out = gpufed(fed, "infra", "capacity", "plan", "create", *big, "--allow-partial")
    assert code == 0, out
    assert "partial, 48 of 4096 H100 GPU(s), 4048 short" in out, out
    partial = _created_id(out)

    # HELD is what the pools hold: once kubectl lists the ten h100-od nodes, the older plan holds
    # its four and the partial one the other six, each at the pool's price.
    wait_for(lambda: kubectl_nodes(sims, "h100-od") == 10, timeout_s=20)
    listed = wait_for(lambda: (p := plans(fed))[partial].get("gpus_now") == 48 and p, timeout_s=10)
    nodes = kubectl_nodes(sims, "h100-od")
    assert listed[older]["gpus_now"] + listed[partial]["gpus_now"] == nodes * 8
    assert listed[older]["gpus_now"] == 32
    assert listed[older]["usd_per_hour"] == pytest.approx(4 * H100_NODE_USD)
    assert listed[partial]["usd_per_hour"] == pytest.approx((nodes - 4) * H100_NODE_USD)
    assert (listed[partial]["gpus"], listed[partial]["requested_gpus"]) == (48, 4096)
    assert listed[partial]["shortfall_gpus"] == 4048
    # Within the cloud limit and the spend ceiling the config sets, every pool as kubectl lists it.
    prices = {
        "h100-od": H100_NODE_USD,
        "h100-spot": 8 * 1.28,
        "a100-od": A100_NODE_USD,
        "a100-spot": 8 * 0.3082,
    }
    assert sum(kubectl_nodes(sims, pool) * 8 for pool in prices) == 128
    assert sum(kubectl_nodes(sims, pool) * usd for pool, usd in prices.items()) <= 1000
    _cancel_all_and_wait_for_the_configured_pools(fed, sims)


def test_ended_plans_stay_listed_with_what_they_delivered_and_cost(
    world: tuple[ServerProcess, SimProcess],
) -> None:
    fed, sims = world
    started = time.time()
    # 16 H100 on the spot pool: the two nodes it has, held from now until the plan ends.
    code, out = gpufed(fed, "infra", "capacity", "plan", "create", "--cluster", CLUSTER, "--gpu-type", "H100",
                       "--pool", "h100-spot", "--gpus", "16", "--to", _until(4), "--reason", "short")  # fmt: skip
    assert code == 0, out
    plan_id = _created_id(out)
    assert kubectl_nodes(sims, "h100-spot") == 2
    wait_for(lambda: plans(fed)[plan_id].get("gpus_now") == 16, timeout_s=10)
    ended = wait_for(lambda: (p := plans(fed)[plan_id])["state"] == "ended" and p, timeout_s=20)
    held_s = time.time() - started
    assert ended.get("gpus_now", 0) == 0
    assert 0 < ended["gpu_hours"] <= 16 * held_s / 3600
    assert ended["total_usd"] == pytest.approx(ended["gpu_hours"] * 1.28, rel=1e-6)
    # The totals stop at the plan's end.
    assert plans(fed)[plan_id]["gpu_hours"] == pytest.approx(ended["gpu_hours"])
    code, out = gpufed(fed, "infra", "capacity", "plan", "list")
    assert code == 0, out
    (row,) = [line for line in out.splitlines() if line.startswith(plan_id)]
    assert " ended " in row, out
    assert f"{ended['total_usd']:,.2f}" in row, out


def _submitted(fed: ServerProcess, user: str, text: str) -> str:
    with fed.client(user) as client:
        return client.submit(text).job_id


def _phase(fed: ServerProcess, user: str, job_id: str) -> int:
    with fed.client(user) as client:
        return client.get(job_id).phase


def test_a_deadline_plan_names_only_waiting_jobs_of_its_gpu_type_and_of_one_tenant(
    world: tuple[ServerProcess, SimProcess],
) -> None:
    fed, sims = world
    before = set(plans(fed))
    # Jobs that wait: over their tenant's A100 cap (vision 24, nlp 32), so they never start here.
    waiting = _submitted(fed, "alice", manifest("waits", workers=3, gpus=8, gpu="A100", duration="600s"))
    other_tenant = _submitted(fed, "bob", manifest("nlp-waits", workers=4, gpus=8, gpu="A100"))
    running = _submitted(fed, "bob", manifest("runs", workers=1, gpus=4, gpu="H100", duration="600s"))
    done = _submitted(fed, "bob", manifest("done", workers=1, gpus=4, gpu="H100", duration="0.1s"))
    wait_for(lambda: _phase(fed, "bob", running) == pb.JOB_PHASE_RUNNING, timeout_s=20)
    wait_for(lambda: _phase(fed, "bob", done) == pb.JOB_PHASE_SUCCEEDED, timeout_s=20)
    assert _phase(fed, "alice", waiting) == pb.JOB_PHASE_QUEUED
    assert _phase(fed, "bob", other_tenant) == pb.JOB_PHASE_QUEUED
    # Two days: a job without maxRuntime counts as needing the spec default, 24 h.
    deadline = _until(2 * 86_400)

    def create(gpu: str, *jobs: str, user: str = "infra") -> tuple[int, str]:
        named = [a for j in jobs for a in ("--job", j)]
        return gpufed(fed, user, "capacity", "plan", "create", "--cluster", CLUSTER, "--gpu-type", gpu,
                      "--deadline", deadline, *named)  # fmt: skip

    for args, says in (
        (("H100", waiting), f"job_ids[0]: job {waiting} runs on A100, not on the plan's H100"),
        (("H100", running), f"job_ids[0]: job {running} is placed already (RUNNING)"),
        (("H100", done), f"job_ids[0]: job {done} has ended (SUCCEEDED)"),
        (
            ("A100", waiting, other_tenant),
            f"job_ids[1]: job {other_tenant} is tenant nlp's, job_ids[0] is vision's",
        ),
    ):
        code, out = create(*args)
        assert code != 0, out
        assert "INVALID_ARGUMENT" in out, out
        assert says in out, out
    # A job that names the family (A100) may run on its variants: a plan for one is not refused as
    # another type (whatever the pools then say of 80 GB GPUs).
    assert set(plans(fed)) == before
    code, out = create("A100-80GB", waiting)
    assert "runs on" not in out, out
    for made in set(plans(fed)) - before:  # kept (cancelled plans stay listed): not this test's point
        assert gpufed(fed, "infra", "capacity", "plan", "cancel", made)[0] == 0
    before = set(plans(fed))
    # A member cannot create one, nor learn through the refusal what another tenant's job is doing.
    code, out = create("H100", running, user="alice")
    assert code != 0, out
    assert "PERMISSION_DENIED" in out, out
    assert "RUNNING" not in out, out

    code, out = create("A100", waiting)
    assert code == 0, out
    plan_id = _created_id(out)
    # 32 A100 within the day: four a100-od nodes, two more than configured, held once kubectl lists them.
    wait_for(lambda: kubectl_nodes(sims, "a100-od") == 4, timeout_s=20)
    listed = wait_for(lambda: (p := plans(fed)[plan_id]).get("gpus_now") == 32 and p, timeout_s=10)
    assert listed["tenant"] == "vision"
    assert listed["usd_per_hour"] == pytest.approx(kubectl_nodes(sims, "a100-od") * A100_NODE_USD)
    with fed.client("admin") as admin:
        for job_id in (waiting, other_tenant, running):
            admin.cancel(job_id)
    _cancel_all_and_wait_for_the_configured_pools(fed, sims)
