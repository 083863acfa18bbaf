"""End to end, preemption orders count until their victims are gone: no job is evicted twice over.

The issue's scenario: one 32 x A100 cluster held whole by vision, which borrows 16 of them; nlp,
guaranteed 16, submits a 16-GPU gang. Cycles run back to back (each commit wakes the next one, some
tens of milliseconds apart) while the victims take their grace period to leave. Before orders
counted in the snapshot, two cycles 94 ms apart each ordered two 8-GPU evictions for the same gang:
32 GPUs evicted for 16 needed. Exactly 16 may be ordered, whether the grace period is 2 s or 30 s.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import a100_pool, job_of, write_config

pytestmark = pytest.mark.e2e

CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "dc",
        "provider": "private",
        "region": "dc1",
        "objectStore": "dc-s3",
        "pools": [a100_pool(nodes=4)],
    }
]

TENANTS: list[dict[str, Any]] = [
    {"name": "platform"},
    {"name": "vision", "quotas": {"A100": {"guaranteed": 16, "borrowingLimit": 16}}},
    {"name": "nlp", "quotas": {"A100": {"guaranteed": 16, "borrowingLimit": 16}}},
]

USERS: list[dict[str, Any]] = [
    {"name": "admin", "tenant": "platform", "role": "admin"},
    {"name": "vic", "tenant": "vision"},
    {"name": "nora", "tenant": "nlp"},
]


def _ordered(fed: ServerProcess) -> list[dict[str, Any]]:
    """The server's `preemption_ordered` events (it logs one JSON object a line)."""
    events = []
    for line in fed.log_text().splitlines():
        if '"preemption_ordered"' in line:
            events.append(json.loads(line))
    return events


# Planned cycles to wait for once everyone has settled, to see that none of them orders more: about
# three seconds of an idle server's cycles (one each half second).
SETTLED_CYCLES = 6


def _planned_cycles(metrics_url: str) -> int:
    """Scheduling cycles the server has planned (not those skipped as idle): its /metrics count."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
    with opener.open(metrics_url, timeout=10) as response:
        text = response.read().decode()
    found = re.search(r"^gpufed_scheduling_cycle_seconds_count (\S+)$", text, re.MULTILINE)
    assert found is not None, "no cycle count in /metrics"
    return int(float(found.group(1)))


def _fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path, grace_s: float) -> ServerProcess:
    config = write_config(
        tmp_path / "federation.yaml",
        sims,
        CLUSTERS,
        grace_s=4,
        policy={
            "defaultGracePeriodSeconds": grace_s,
            "privateWaitSecondsPerGpuHour": 0,
            "preemptionLimitGpus": 256,
            "preemptionIntervalSeconds": 600,
        },
        tenants=TENANTS,
        users=USERS,
    )
    # A metrics port (the kernel's pick, which the server logs), for the cycle count.
    process = ServerProcess(
        etcd.endpoint, tmp_path / "state", config=config, extra_args=("--metrics-port", "0")
    )
    process.start()
    return process


def _metrics_url(fed: ServerProcess) -> str:
    for line in fed.log_text().splitlines():
        if '"server_started"' in line:
            return f"http://127.0.0.1:{json.loads(line)['metrics_port']}/metrics"
    raise AssertionError("the server logged no server_started event")


@pytest.fixture(params=[2.0, 30.0], ids=["grace-2s", "grace-30s"])
def grace_s(request: pytest.FixtureRequest) -> float:
    value: float = request.param
    return value


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path, grace_s: float) -> Iterator[ServerProcess]:
    process = _fed(etcd, sims, tmp_path, grace_s)
    yield process
    process.stop()


def test_a_gang_within_its_guarantee_evicts_exactly_the_gpus_it_needs(
    fed: ServerProcess, grace_s: float
) -> None:
    # Vision fills the cluster: four 8-GPU gangs (two pods of 4), 16 of them borrowed.
    with fed.client("vic") as vic:
        vision = [vic.submit(manifest(f"v{i}", workers=1, gpus=4, duration="1h")).job_id for i in range(4)]
    wait_for(lambda: all(job_of(fed, "vic", j).phase == pb.JOB_PHASE_RUNNING for j in vision), timeout_s=60)
    # nlp asks for 16 within its guarantee: two 8-GPU gangs of vision's must go, no more.
    with fed.client("nora") as nora:
        wanted = nora.submit(manifest("llm", workers=1, gpus=8, duration="1h")).job_id
    running = wait_for(
        lambda: (j := job_of(fed, "nora", wanted)).phase == pb.JOB_PHASE_RUNNING and j, timeout_s=60
    )
    assert running.cluster == "dc"
    # A few more cycles with everyone settled: nothing else is ordered. Counted rather than slept
    # for, so that a busy machine (slower cycles) runs as many of them.
    metrics = _metrics_url(fed)
    settled = _planned_cycles(metrics)
    wait_for(lambda: _planned_cycles(metrics) >= settled + SETTLED_CYCLES, timeout_s=60, interval_s=0.2)
    ordered = _ordered(fed)
    assert sum(int(o["gpus"]) for o in ordered) == 16, ordered
    assert {o["for_job"] for o in ordered} == {wanted}
    evicted = {o["victim"] for o in ordered}
    assert len(evicted) == 2, ordered
    assert evicted <= set(vision), ordered
    # The victims were requeued as new attempts; the other two vision gangs were never touched.
    assert all(job_of(fed, "vic", j).attempt == 2 for j in evicted)
    assert all(job_of(fed, "vic", j).attempt == 1 for j in set(vision) - evicted)
