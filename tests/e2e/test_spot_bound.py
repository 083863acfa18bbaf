"""End to end, which gangs that allow spot get it: idle private GPUs first, then spot only for runs
that reclaims, each restarting them from scratch, would not slow by more than the policy's bound.

One private node of 8 A100s at an internal rate of $1.10, and a cloud cluster with A100 spot at $0.31
(0.05 reclaims per node-hour, from the config) and on demand at $2.74. Every job allows spot and is
two replicas of 4 or 8 GPUs; the bound is 30 %, which two replicas meet for runs up to about 5.2 h
(0.52 reclaims expected over the run):

- `first` (2 h): the private node is idle, and it is taken although spot is cheaper;
- `short` (2 h), once the private node is full: spot;
- `long` (1 day): on demand, though spot has room;
- `wide` (1 day, two whole nodes): on demand has no room left and spot is not offered to it: it waits,
  and `explain` says why, with the slowdown and the bound.

The clusters are judged by the official Kubernetes client: the nodes each gang's pods are bound to,
and those nodes' capacity-type label.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import a100_pool, capacity_types, gang_pods, job_of, serve_clusters

pytestmark = pytest.mark.e2e


CLUSTERS: list[dict[str, Any]] = [
    {"name": "dc", "provider": "private", "region": "dc1", "pools": [a100_pool(1)]},
    {
        "name": "aws",
        "provider": "aws",
        "region": "us-east-1",
        "pools": [
            a100_pool(3, name="a100-spot", kind="spot", price=0.31, reclaimsPerNodeHour=0.05),
            a100_pool(1, name="a100-od", kind="on_demand", price=2.74),
        ],
    },
]
TENANTS: list[dict[str, Any]] = [
    {"name": "platform"},
    {"name": "vision", "quotas": {"A100": {"guaranteed": 8}}},
]
USERS: list[dict[str, Any]] = [
    {"name": "admin", "tenant": "platform", "role": "admin"},
    {"name": "vic", "tenant": "vision"},
]


def spot_job(name: str, limit: str, gpus: int = 4) -> str:
    return manifest(name, gpus=gpus, duration="1h", extra_spec=f"  allowSpot: true\n  maxRuntime: {limit}\n")


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


def running(fed: ServerProcess, job_id: str) -> pb.Job:
    found: pb.Job = wait_for(
        lambda: (job := job_of(fed, "vic", job_id)).phase == pb.JOB_PHASE_RUNNING and job, timeout_s=60
    )
    return found


def test_idle_private_first_spot_only_for_runs_the_bound_allows(fed: ServerProcess, sims: SimProcess) -> None:
    with fed.client("vic") as vic:
        first = vic.submit(spot_job("first", "2h")).job_id
        assert running(fed, first).cluster == "dc"
        short = vic.submit(spot_job("short", "2h")).job_id
        long = vic.submit(spot_job("long", "1d")).job_id
        assert running(fed, short).cluster == "aws"
        assert running(fed, long).cluster == "aws"
        wide = vic.submit(spot_job("wide", "1d", gpus=8)).job_id
        explained = wait_for(
            lambda: (
                (why := vic.explain(wide)).phase == pb.JOB_PHASE_QUEUED
                and any(r.code == "spot_not_allowed" for r in why.reasons)
                and why
            ),
            timeout_s=60,
        )
    assert capacity_types(sims, "dc", first) == {"private"}
    assert capacity_types(sims, "aws", short) == {"spot"}
    assert capacity_types(sims, "aws", long) == {"on-demand"}
    assert not gang_pods(sims, "aws", wide)
    (note,) = [r for r in explained.reasons if r.code == "spot_not_allowed"]
    # Two replicas for 24 h at 0.05: 2.4 reclaims expected, (e^2.4 - 1) / 2.4 - 1 = 318 % slower.
    assert note.cluster == "aws"
    assert "318%" in note.message
    assert "allows 30%" in note.message
