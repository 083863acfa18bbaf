"""End to end, spot for jobs that checkpoint: a job that says `resumable: true` takes spot where the
same job without it is kept on demand by the bound on restarts from scratch; explain says what a
reclaim costs it, and the ledger bills it at the spot price.

A cloud cluster with A100 spot at $0.31 (0.05 reclaims per node-hour, from the config) and on demand at
$2.74, and no private GPUs. Both jobs allow spot and state a run-time limit of a day, two replicas of 4
GPUs: 2.4 reclaims expected over such a run, 318 % slower if each restarted it from scratch, far past
the 30 % bound. The one that checkpoints loses only the work since its last checkpoint at a reclaim
(about 0.5 h, the policy's estimate), which spot's price already charges. Each runs 2 s in the
simulated cluster, so the ledger's intervals close.

The clusters are judged by the official Kubernetes client (the nodes each gang's pods are bound to,
and those nodes' capacity-type label); the bill by finance's ledger.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.render import explain_text
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import a100_pool, capacity_types, job_of, serve_clusters

pytestmark = pytest.mark.e2e

SPOT_PRICE, ON_DEMAND_PRICE = 0.31, 2.74


CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "aws",
        "provider": "aws",
        "region": "us-east-1",
        "pools": [
            a100_pool(2, name="a100-spot", kind="spot", price=SPOT_PRICE, reclaimsPerNodeHour=0.05),
            a100_pool(2, name="a100-od", kind="on_demand", price=ON_DEMAND_PRICE),
        ],
    },
]
TENANTS: list[dict[str, Any]] = [{"name": "platform"}, {"name": "vision"}]
USERS: list[dict[str, Any]] = [
    {"name": "admin", "tenant": "platform", "role": "admin"},
    {"name": "fin", "tenant": "platform", "role": "finance"},
    {"name": "vic", "tenant": "vision"},
]


def day_job(name: str, *, resumable: bool) -> str:
    extra = "  allowSpot: true\n  maxRuntime: 1d\n" + ("  resumable: true\n" if resumable else "")
    return manifest(name, gpus=4, duration="2s", extra_spec=extra)


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=4,
        policy={"privateWaitSecondsPerGpuHour": 0, "spotMaxRestartSlowdown": 0.3, "preferPrivate": True},
        tenants=TENANTS,
        users=USERS,
    ) as process:
        yield process


def test_a_resumable_job_takes_spot_the_same_job_without_checkpoints_is_kept_off(
    fed: ServerProcess, sims: SimProcess
) -> None:
    with fed.client("vic") as vic:
        resumes = vic.submit(day_job("resumes", resumable=True)).job_id
        restarts = vic.submit(day_job("restarts", resumable=False)).job_id
        texts = {}
        for job_id in (resumes, restarts):
            # While it runs (2 s) or once it has run: the admission's words stay in its record.
            texts[job_id] = wait_for(
                lambda job_id=job_id: (
                    job_of(fed, "vic", job_id).phase in (pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_SUCCEEDED)
                    and explain_text(vic.explain(job_id))
                ),
                timeout_s=60,
            )
    assert capacity_types(sims, "aws", resumes) == {"spot"}
    assert capacity_types(sims, "aws", restarts) == {"on-demand"}
    assert "spot: resumable, a reclaim costs about 0.5 h of work" in texts[resumes], texts[resumes]
    assert "resumable" not in texts[restarts], texts[restarts]

    # The bill: each job's attempt at the price of the capacity it ran on, by finance's ledger.
    for job_id in (resumes, restarts):
        wait_for(
            lambda job_id=job_id: job_of(fed, "vic", job_id).phase == pb.JOB_PHASE_SUCCEEDED, timeout_s=60
        )
    with fed.client("fin") as fin:
        intervals = wait_for(
            lambda: (
                (found := [iv for iv in fin.ledger().intervals if iv.job_id in (resumes, restarts)])
                and len(found) == 2
                and all(iv.end_s > 0 for iv in found)
                and found
            ),
            timeout_s=30,
        )
    billed = {iv.job_id: iv for iv in intervals}
    assert (billed[resumes].kind, billed[resumes].usd_per_gpu_hour) == ("spot", SPOT_PRICE)
    assert (billed[restarts].kind, billed[restarts].usd_per_gpu_hour) == ("on_demand", ON_DEMAND_PRICE)
    for iv in billed.values():
        assert iv.gpu_count == 8
        # The ledger states cost to the micro-dollar.
        assert iv.cost_usd == pytest.approx(iv.gpu_hours * iv.usd_per_gpu_hour, abs=1e-6)
        assert iv.gpu_hours == pytest.approx(8 * (iv.end_s - iv.start_s) / 3600)
