"""The replay and the real control plane make the same decisions on a sample of the Philly week.

The first 120 jobs of the week (up to 8 GPUs each, GPU types drawn as bench/replay.yaml says) go
through the gRPC API to a real server on real etcd and simulated Kubernetes clusters, and through
the replay with the same clusters, prices and speeds, under burst-now (a job that does not fit in
private capacity goes to the cheapest cloud at once). Time is compressed into waves of 30 jobs:
jobs shorter than the trace's median run SHORT_S (they finish before the next wave), the others
run for the whole test. Each wave is submitted, every job of it is waited for until it runs, and the
short ones must finish before the next wave. SHORT_S is long against a wave's placement: the replay
places a whole wave at one instant, while the server's cycles may split a wave's submissions, and a
short job of the wave's first cycle that ended before its last cycle would free private GPUs the
replay never offers (at 1 s that happened once the leader's gap stopped counting the reconciler; a
wave was placed within 2.5 s of its first submission on a machine with a load average of 12, and
a failure says how long each wave took, see `_premise`).

The four waves run as two cases, two waves each, side by side on the test workers (a case waits out
two waves' short jobs, about 8 s each). The second case starts where the full sequence stands before
its third wave: the long jobs of the first two waves, still running there, are submitted first as an
opening wave of their own (no short job in it, so nothing to wait out), and the replay is given the
same opening. Every job of both cases is compared, the opening's too.

The check: every job runs on the same cluster and GPU type in both. It is deterministic because one
tenant makes the queue first come first served and burst-now never reserves or waits: each job's
decision depends only on the jobs before it and on which have finished, which the waves fix, not on
how submissions fall into the server's cycles. Node choice matches because both place best fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.api.client import GpufedClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.replay.config import load_config
from federation.replay.policies import PolicyKind, PolicySpec
from federation.replay.sim import simulate
from federation.replay.trace import TraceJob, assign_gpu_types, read_trace
from federation.replay.world import PoolDef, World
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from placement.model import CapacityKind, ClusterName, GpuType, GpuTypePolicy, Provider, TenantId, TenantQuota
from tests.e2e.harness import ServerProcess, wait_for
from tests.e2e.kube import gang_pods, serve_clusters, sim_admin

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BENCH_CONFIG = ROOT / "bench" / "replay.yaml"
JOBS, WAVE = 120, 30
# Waves per test case: the sample's four waves make two cases (see the module's docstring).
WAVES_PER_CASE = 2
WAVE_GAP_S = 100_000.0
LONG_S = 600
# What each wave waits out: more than twice the longest a wave took to be placed on a machine with a
# load average of 12 (2.5 s from its first submission to its last admission, 1.0 s at 5).
SHORT_S = 6
POLL_S = 0.2
STARTED = (pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_SUCCEEDED)

# Private nodes and elastic-enough clouds at list prices (USD per GPU-hour) from the shared snapshot.
POOLS = [
    ("onprem", Provider.PRIVATE, "V100", CapacityKind.PRIVATE, 0.6, 2),
    ("onprem", Provider.PRIVATE, "A100", CapacityKind.PRIVATE, 1.0, 1),
    ("aws", Provider.AWS, "V100", CapacityKind.ON_DEMAND, 3.06, 20),
    ("aws", Provider.AWS, "A100", CapacityKind.ON_DEMAND, 2.744705, 20),
    ("gcp", Provider.GCP, "V100", CapacityKind.ON_DEMAND, 2.539151, 20),
    ("gcp", Provider.GCP, "A100", CapacityKind.ON_DEMAND, 3.483719, 20),
]


def _pool_defs() -> list[PoolDef]:
    return [
        PoolDef(ClusterName(c), p, "r1", t.lower(), GpuType(t), k, price, 8, nodes)
        for c, p, t, k, price, nodes in POOLS
    ]


CLUSTERS: list[dict[str, Any]] = [
    {
        "name": cluster,
        "provider": provider.value,
        "region": "r1",
        "pools": [
            {
                "name": p.name,
                "gpuType": p.gpu_type,
                "kind": p.kind.value,
                "usdPerGpuHour": p.usd_per_gpu_hour,
                "gpusPerNode": p.gpus_per_node,
                "nodes": p.nodes,
            }
            for p in _pool_defs()
            if p.cluster == cluster
        ],
    }
    for cluster, provider in (("onprem", Provider.PRIVATE), ("aws", Provider.AWS), ("gcp", Provider.GCP))
]


def _sample() -> list[TraceJob]:
    config = load_config(BENCH_CONFIG)
    if not config.trace_path.exists():
        pytest.skip("shared/data is absent")
    jobs = [
        j
        for j in assign_gpu_types(read_trace(config.trace_path), config.gpu_mix, config.seed)
        if j.num_gpus <= 8
    ]
    return jobs[:JOBS]


def _short(job: TraceJob, median_s: float) -> bool:
    return job.duration_s < median_s


def _manifest(job: TraceJob, short: bool) -> str:
    policy = "  gpuTypePolicy: Any\n" if job.gpu_type_policy is GpuTypePolicy.ANY else ""
    return (
        "apiVersion: gpufed.io/v1\nkind: TrainingJob\n"
        f'metadata:\n  name: {job.job_id}\n  annotations:\n    sim.gpufed.io/duration: "{SHORT_S if short else LONG_S}s"\n'
        f"spec:\n  gpuTypes: [{', '.join(job.gpu_types)}]\n{policy}  maxRuntime: 2h\n"
        f'  tasks:\n    - {{name: master, replicas: 1, image: "pytorch/pytorch:2.3", gpus: {job.num_gpus}}}\n'
    )


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=30,
        policy={"privateWaitSecondsPerGpuHour": 0},
        gpuSpeeds={"V100": 1.0, "A100": 1.6},
        tenants=[{"name": "platform"}, {"name": "replay"}],
        users=[{"name": "admin", "tenant": "platform", "role": "admin"}, {"name": "ann", "tenant": "replay"}],
    ) as process:
        yield process


def _replay(waves: list[list[TraceJob]], median_s: float) -> dict[str, tuple[str, str]]:
    """Where the replay puts each job, with each wave arriving at once (its jobs 10 ms apart, in
    order) long after the one before, short jobs lasting SHORT_S and the others past the end."""
    config = dataclasses.replace(load_config(BENCH_CONFIG), cycle_s=0.0, expected_runtime="limit")
    past_the_end_s = 10 * WAVE_GAP_S * len(waves)
    compressed = [
        TraceJob(
            j.job_id,
            w * WAVE_GAP_S + i * 0.01,
            float(SHORT_S) if _short(j, median_s) else past_the_end_s,
            j.num_gpus,
            TenantId("replay"),
            j.gpu_types,
            j.gpu_type_policy,
        )
        for w, wave in enumerate(waves)
        for i, j in enumerate(wave)
    ]
    pools = _pool_defs()
    # One tenant with no quota, as on the server.
    world = World(
        sum(p.nodes * 8 for p in pools if p.is_private), tuple(pools), (TenantQuota(TenantId("replay")),)
    )
    result = simulate(config, world, PolicySpec("burst_now", PolicyKind.BURST_NOW), compressed)
    return {o.job.job_id: (o.cluster, o.gpu_type) for o in result.outcomes.values()}


def _case_waves(jobs: list[TraceJob], first_wave: int, median_s: float) -> list[list[TraceJob]]:
    """The waves one case submits: its own, after an opening wave of the long jobs that the waves
    before it left running (a short job of those waves had finished before its own next wave)."""
    waves = [jobs[start : start + WAVE] for start in range(0, len(jobs), WAVE)]
    opening = [j for wave in waves[:first_wave] for j in wave if not _short(j, median_s)]
    return ([opening] if opening else []) + waves[first_wave : first_wave + WAVES_PER_CASE]


def _listed(ann: GpufedClient, ids: Collection[str]) -> list[pb.Job]:
    """The jobs named, as one list call: a poll reads once, not once per job, so it stays far under
    the server's per-caller read limit however often it polls."""
    return [j for j in ann.list_all() if j.job_id in ids]


def _at_s(job: pb.Job, phase: pb.JobPhase.ValueType) -> list[float]:
    return [e.at.ToMicroseconds() / 1e6 for e in job.events if e.phase == phase]


def _premise(jobs: list[pb.Job], shorts: set[str]) -> str:
    """The replay's premise for one wave, in the server's own times from the wave's first
    submission: its last admission came before any of its short jobs ended."""
    first_s = min(j.submitted_at.ToMicroseconds() / 1e6 for j in jobs)
    last_admitted_s = max(max(_at_s(j, pb.JOB_PHASE_ADMITTED), default=0.0) for j in jobs) - first_s
    ends = [t for j in jobs if j.job_id in shorts for t in _at_s(j, pb.JOB_PHASE_SUCCEEDED)]
    first_end_s = min(ends, default=float("inf")) - first_s
    held = "held" if last_admitted_s < first_end_s else "BROKEN: a short job ended before the last admission"
    return f"last admission at {last_admitted_s:.2f} s, first short job ended at {first_end_s:.2f} s ({held})"


def _cluster_side(sims: SimProcess, jobs: list[pb.Job]) -> str:
    """What the clusters say of jobs that did not start: their pods, and every node's free GPUs."""
    lines = []
    for job in jobs:
        for cluster in ("onprem", "aws", "gcp"):
            for pod in gang_pods(sims, cluster, job.job_id):
                scheduled = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
                why = f"{scheduled[0].status} {scheduled[0].message}" if scheduled else "-"
                lines.append(
                    f"{cluster} {pod.metadata.name} {pod.status.phase} node={pod.spec.node_name} {why}"
                )
    for cluster in ("onprem",):
        state = sim_admin(sims, cluster, "GET", "/state")
        lines.append(f"{cluster} state: {state}")
    return "\n".join(lines)


@pytest.mark.parametrize("first_wave", [0, 2], ids=["waves-0-1", "waves-2-3"])
def test_the_replay_and_the_control_plane_put_every_job_in_the_same_place(
    fed: ServerProcess, sims: SimProcess, first_wave: int
) -> None:
    jobs = _sample()
    # The whole sample's median, whichever case: a job is short or long in both cases alike.
    durations = sorted(j.duration_s for j in jobs)
    median_s = durations[len(durations) // 2]
    waves = _case_waves(jobs, first_wave, median_s)
    expected = _replay(waves, median_s)
    actual: dict[str, tuple[str, str]] = {}
    premises: list[str] = []
    with fed.client("ann") as ann:
        for wave in waves:
            ids = {ann.submit(_manifest(j, _short(j, median_s))).job_id: j for j in wave}

            def placed(ids: dict[str, TraceJob] = ids) -> list[pb.Job] | None:
                found = _listed(ann, ids)
                ready = len(found) == len(ids) and all(f.phase in STARTED and f.cluster for f in found)
                return found if ready else None

            try:
                done = wait_for(placed, timeout_s=120, interval_s=POLL_S)
            except AssertionError:
                stuck = [(ann.get(i), ann.explain(i)) for i in ids]
                late = [(j, e) for j, e in stuck if j.phase not in STARTED or not j.cluster]
                raise AssertionError(
                    "not all placed: "
                    + "; ".join(
                        f"{j.name} {j.phase} {j.message} {[r.code for r in e.reasons]}" for j, e in late
                    )
                    + "\n"
                    + _cluster_side(sims, [j for j, _ in late])
                ) from None
            for job in done:
                actual[ids[job.job_id].job_id] = (job.cluster, job.gpu_type)
            shorts = {i for i, j in ids.items() if _short(j, median_s)}
            wait_for(
                lambda s=shorts: all(j.phase == pb.JOB_PHASE_SUCCEEDED for j in _listed(ann, s)), 60, POLL_S
            )
            premises.append(_premise(_listed(ann, ids), shorts))
    differ = {k: (expected[k], actual[k]) for k in actual if expected[k] != actual[k]}
    assert not differ, (
        f"{len(differ)} of {len(actual)} jobs placed differently (replay, server): {differ}\n"
        + "\n".join(f"wave {w}: {p}" for w, p in enumerate(premises))
    )
    # The sample exercises both sides of the decision.
    assert {c for c, _ in actual.values()} >= {"onprem"}
    assert len({c for c, _ in actual.values()}) >= 2
