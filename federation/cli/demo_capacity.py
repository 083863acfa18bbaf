"""`gpufed demo`'s capacity step: a gang that fits nowhere grows a cloud pool, then runs.

bob's 32 x H100 gang (on demand) is more than the simulated cloud's H100 pools hold. The placer asks
for capacity, the capacity reconciler grows aws-us-east-1's `h100-od` pool through the simulated
provisioner (nodes appear after the lead time), and the gang runs. `gpufed capacity pools` (as infra)
shows the pool before, while the nodes boot, and after; the simulated cluster's own node list (kubectl)
confirms it. The added nodes go once idle for the idle TTL (60 s in the shipped config): the demo says
when that is at the earliest and does not wait for it (tests/e2e/test_capacity.py does).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from federation.api.capacity_client import CapacityClient
from federation.api.client import GpufedClient
from federation.api.convert import phase_name
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.capacity import pools_text
from federation.cli.render import explain_text

CLUSTER, POOL = "aws-us-east-1", "h100-od"
FINAL = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}

BIG_GANG = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: pretrain-32xh100, annotations: {sim.gpufed.io/duration: "3s"}}
spec:
  gpuTypes: [H100]
  tasks:
    - {name: master, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 8}
    - {name: worker, replicas: 3, image: "pytorch/pytorch:2.3", gpus: 8}
"""


def _step(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def _pool(reply: pb.ListCapacityPoolsResponse) -> pb.CapacityPool | None:
    return next((p for p in reply.pools if (p.cluster, p.pool) == (CLUSTER, POOL)), None)


def _cluster_nodes(state_dir: Path) -> int | None:
    """How many nodes of the pool the simulated cluster itself lists (kubectl), or None without it."""
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run(
        [kubectl, "--kubeconfig", str(state_dir / "sim" / "kubeconfig"), "--context", CLUSTER, "get",
         "nodes", "--selector", f"gpufed.io/pool={POOL}", "--no-headers", "-o", "name"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return len(out.stdout.split()) if out.returncode == 0 else None


def _hms(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%H:%M:%S")


def run(bob: GpufedClient, infra_client: GpufedClient, state_dir: Path) -> tuple[list[tuple[str, bool]], str]:
    """The capacity step; returns its checks and the gang's job id."""
    infra = CapacityClient(infra_client)
    checks: list[tuple[str, bool]] = []

    _step("capacity on demand: the scalable pools before (as infra: gpufed capacity pools)")
    before = infra.pools()
    print(pools_text(before))
    nodes_before = _cluster_nodes(state_dir)
    print(f"kubectl on {CLUSTER}: {nodes_before} nodes in pool {POOL}")

    _step("bob submits a 32 x H100 gang: more than any H100 pool holds, so a pool must grow")
    job_id = bob.submit(BIG_GANG).job_id
    print(f"submitted {job_id}")
    deadline = time.monotonic() + 30
    why = bob.explain(job_id)
    while time.monotonic() < deadline and not any(r.code == "capacity_requested" for r in why.reasons):
        time.sleep(0.3)
        why = bob.explain(job_id)
    print(explain_text(why))
    checks.append(
        ("the gang waits for capacity on the way", any(r.code == "capacity_requested" for r in why.reasons))
    )
    booting = infra.pools()
    growing = _pool(booting)
    deadline = time.monotonic() + 5  # the operation is stored before it is applied: a moment at most
    while (growing is None or not growing.HasField("pending")) and time.monotonic() < deadline:
        time.sleep(0.2)
        booting = infra.pools()
        growing = _pool(booting)
    print("$ gpufed --user infra capacity pools   # while the nodes boot")
    print(pools_text(booting))
    checks.append(
        (
            "the pool grows for that gang",
            growing is not None
            and growing.HasField("pending")
            and growing.pending.nodes_to > growing.pending.nodes_from
            and job_id in growing.pending.job_ids,
        )
    )

    _step("watching the gang to its end (as bob)")
    job = bob.get(job_id)
    for event in bob.watch(job_id=job_id, include_initial=True, timeout_s=90):
        job = event.job
        where = f" on {job.cluster} ({job.gpu_type} {job.capacity_kind})" if job.cluster else ""
        print(f"{job.job_id:<30} {phase_name(job.phase):<10}{where}", flush=True)
        if job.phase in FINAL:
            break
    checks.append(
        (
            "the gang ran once, on the grown cloud pool",
            job.phase == pb.JOB_PHASE_SUCCEEDED
            and job.attempt == 1
            and job.cluster == CLUSTER
            and job.capacity_kind == "on_demand",
        )
    )

    _step("the pools after (as infra)")
    after = infra.pools()
    print(pools_text(after))
    grown = _pool(after)
    nodes_after = _cluster_nodes(state_dir)
    print(f"kubectl on {CLUSTER}: {nodes_after} nodes in pool {POOL}")
    added = (grown.nodes - grown.min_nodes) if grown is not None else 0
    at = {e.phase: e.at.ToNanoseconds() / 1e9 for e in job.events}
    came_up = at.get(pb.JOB_PHASE_ADMITTED, time.time())
    ended = at.get(pb.JOB_PHASE_SUCCEEDED, time.time())
    ttl = after.idle_ttl_seconds
    print(
        f"idle TTL {ttl:.0f} s: the {added} added nodes go once idle that long. The API shows the TTL, not\n"
        f"the idle clocks; they restarted as the nodes came up (~{_hms(came_up)}, the gang admitted) and\n"
        f"as the gang's nodes fell idle ({_hms(ended)}), so the pool shrinks from ~{_hms(came_up + ttl)} "
        f"to ~{_hms(ended + ttl)} UTC.\nThe demo does not wait for it (tests/e2e/test_capacity.py does)."
    )
    checks.append(
        (
            "the cluster has the added nodes",
            grown is not None
            and growing is not None
            and grown.nodes == grown.ready_nodes == growing.pending.nodes_to
            and not grown.HasField("pending")
            and nodes_before is not None
            and nodes_after == grown.nodes > nodes_before,
        )
    )
    return checks, job_id
