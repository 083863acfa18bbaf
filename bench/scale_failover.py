"""Failover with 100,000 live jobs (issue 33): the leader of an HA pair is killed with SIGKILL; how
long until its successor serves and schedules. Run by `bench/scale.py` (its
`failover_to_scheduling_s`) or alone:

    python bench/scale_failover.py             # 100,000 live jobs
    python bench/scale_failover.py --quick     # 10,000

A real etcd holds the live jobs, built as `bench/history.py`'s restart builds them (`_live_record`,
`_live_interval`) and written straight into etcd in the store's own encoding (`_dumps`, as
`KvStore.commit` writes records and intervals): 90 % ended within the hour (with their closed
ledger intervals), 10 % queued for the H100 pool of the simulated member cluster
`onprem` (one `python -m clusters.sim` process, shared by both servers as real clusters are). The
pool has room for 64 of them, so the first leader dispatches 64 gangs that run for a day and the
rest wait. Two `gpufed serve` processes on that etcd, with the servers' default leader lease unless
`--lease-ttl-s` says otherwise; once the leader's first pass is done and the standby serves, the
leader is killed with SIGKILL, and from that instant:

* `failover_to_leader_key_s`, `failover_to_first_cycle_s`: from the standby's own log, when it won
  the leader key (`leader_acquired`: the dead leader's lease ran out and etcd deleted its key) and
  when its first scheduling cycle was done (`leader_first_cycle_done`: a new term plans before its
  first reconciler tick);
* `failover_to_ready_s`: the standby logs `leader_first_pass_done`: its first cycle, reconciler
  tick and the cycle after it are done (what makes its `/readyz` 200 as a leader);
* `failover_to_scheduling_s`: a probe job submitted to the standby right after the kill (a gang of
  one A100 on the cluster `probe`, free, which no queued job asks for) is admitted, as GetJob on the
  standby reads it. This includes the lease's TTL: the dead leader's key lives that long.

Measured 2026-11-30 (2 shared cores, load 4 to 9), 100,000 live jobs, before the default lease went
from 5 s to 3 s: 2.82 s to scheduling with a 2 s lease, 6.43 s with the 5 s lease (the standby held
680 to 700 MiB). With the 5 s lease and a new term's cycle first, in two runs: the key won 4.80 and
5.21 s after the kill, the first cycle done 0.93 and 1.92 s after that (a standby's first cycle builds
every queued job's request, the tenants' usage over 90,000 closed intervals and the stored wait
reasons, none of which it kept while it stood by), the probe admitted at 6.36 and 7.65 s. With the
default 3 s lease, a new term's cycle first and a standby that builds the queued jobs' requests while
it waits (load 12 to 27): the key won at 2.77 s, the first cycle done at 4.05 and 4.12 s, the probe
admitted at 4.30 and 4.51 s; the standby held 600 to 700 MiB.

Measured 2026-12-01 (2 cores shared by three agents, load 1 to 4), the lease refreshed from the lease
keeper's thread (`federation.scheduling.lease_keeper`) against the tree before it, on the same
machine in turns. `--quick` (10,000 live jobs), three runs each: the key won at 2.78, 2.87, 2.97 s
before and 2.92, 2.81, 2.78 s after; the probe admitted at 2.83, 2.94, 3.04 s before and 2.99, 2.88,
2.85 s after. 100,000 live jobs: the key won at 2.76 s before (probe 3.36 s); after, in five runs,
1.51, 3.17, 3.06, 2.30, 2.24 s (probe 2.05 to 3.66 s). The same bound: a SIGKILLed leader's lease
runs out as before, up to a TTL after its last refresh plus up to 0.5 s for etcd's lessor (at
1.51 s the last refresh had been 1.5 to 2 s before the kill, a refresh late or not yet made in a
term killed 1.2 s after it began; that run's logs were not kept).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import structlog  # noqa: E402

from bench.history import RESTART_TENANTS, _live_interval, _live_record  # noqa: E402
from bench.scale_depth import rss_mib  # noqa: E402
from datasync.loopback_ports import free_port  # noqa: E402
from federation.api.client import GpufedClient  # noqa: E402
from federation.api.v1 import gpufed_pb2 as pb  # noqa: E402
from federation.runtime.etcd_process import EtcdProcess  # noqa: E402
from federation.runtime.sim_process import SimProcess  # noqa: E402
from federation.scheduling.leader import DEFAULT_LEASE_TTL_S  # noqa: E402
from federation.store.intervals import interval_to_dict  # noqa: E402
from federation.store.job_store import _dumps, job_key  # noqa: E402
from federation.store.jobs import job_to_dict  # noqa: E402
from federation.store.kv import Compare, Put, Txn  # noqa: E402
from federation.store.kv_etcd import EtcdKv  # noqa: E402
from placement.model import JobPhase  # noqa: E402
from tests.e2e.harness import ServerProcess  # noqa: E402
from tests.e2e.kube import write_config  # noqa: E402

CLUSTERS = [
    {
        "name": "onprem",
        "provider": "private",
        "region": "dc1",
        "pools": [
            {
                "name": "h100",
                "gpuType": "H100",
                "kind": "private",
                "usdPerGpuHour": 2.2,
                "gpusPerNode": 8,
                "nodes": 8,
            }
        ],
    },
    {
        "name": "probe",
        "provider": "private",
        "region": "dc2",
        "pools": [
            {
                "name": "a100",
                "gpuType": "A100",
                "kind": "private",
                "usdPerGpuHour": 1.1,
                "gpusPerNode": 8,
                "nodes": 1,
            }
        ],
    },
]
PROBE = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: failover-probe, annotations: {sim.gpufed.io/duration: "1h"}}
spec:
  gpuTypes: [A100]
  tasks:
    - {name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}
"""
FIRST_PASS = "leader_first_pass_done"  # logged once a leader's first tick and cycle are done
PLACED = {pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_DISPATCHED, pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_SUCCEEDED}


async def seed(endpoint: str, count: int) -> float:
    """`count` live jobs, 90 % ended and 10 % queued (see the module's doc); the seconds it took."""
    began = time.perf_counter()
    now = time.time()
    rng = random.Random(7)
    queued = count // 10
    phases = [JobPhase.SUCCEEDED] * (count - queued) + [JobPhase.QUEUED] * queued
    rng.shuffle(phases)
    kv = await EtcdKv.connect(endpoint)
    try:
        txns = []
        for n, phase in enumerate(phases):
            record = _live_record(n, phase, now, rng)
            puts = [Put(job_key(record.job_id), _dumps(job_to_dict(record)))]
            if phase is JobPhase.SUCCEEDED:
                interval = _live_interval(record)
                puts.append(Put(interval.key, _dumps(interval_to_dict(interval))))
            txns.append(Txn((Compare.absent(job_key(record.job_id)),), tuple(puts)))
            if len(txns) == 40 * 8 or n == count - 1:
                batches = [txns[i : i + 40] for i in range(0, len(txns), 40)]
                await asyncio.gather(*(kv.txn_many(b) for b in batches))
                txns = []
    finally:
        await kv.close()
    return time.perf_counter() - began


def _until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.01)


@dataclass
class Failover:
    live: int
    lease_ttl_s: int | None  # None: the servers' default
    to_ready_s: float
    to_scheduling_s: float
    standby_rss_mib: float
    seed_s: float
    # From the standby's own log, seconds after the kill: the key won, the first cycle done (it
    # schedules), the first pass (cycle, tick, cycle) done.
    to_acquired_s: float = 0.0
    to_first_cycle_s: float = 0.0
    to_first_pass_s: float = 0.0


def logged_at(log: str, event: str, after: float) -> float | None:
    """The wall-clock time of the first `event` at or after `after` in a server's JSON log (the
    standby may have led for a moment while both started)."""
    for line in log.splitlines():
        if f'"event": "{event}"' in line:
            stamp = json.loads(line)["timestamp"]
            at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            if at >= after:
                return at
    return None


class PatientServer(ServerProcess):
    """A server given longer than the e2e tests' 90 s to list its jobs (two start at once)."""

    def _wait_serving(self, timeout_s: float) -> None:
        super()._wait_serving(timeout_s=600.0)


def run(live: int, lease_ttl_s: int | None = None, say: Callable[[str], None] = print) -> Failover:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with tempfile.TemporaryDirectory(prefix="gpufed-scale-failover-") as tmp:
        work = Path(tmp)
        etcd = EtcdProcess(work / "etcd")
        sims = SimProcess(work / "sim", CLUSTERS)
        etcd.start()
        servers: list[PatientServer] = []
        try:
            sims.start()
            seed_s = asyncio.run(seed(etcd.endpoint, live))
            say(f"failover: {live} live jobs in etcd in {seed_s:.1f} s")
            config = write_config(
                work / "federation.yaml",
                sims,
                CLUSTERS,
                grace_s=60,
                tenants=[{"name": "platform"}] + [{"name": t} for t in RESTART_TENANTS],
                users=[
                    {"name": "admin", "tenant": "platform", "role": "admin"},
                    {"name": "u0", "tenant": "t0"},
                ],
            )
            ports = {name: free_port() for name in "ab"}
            lease = () if lease_ttl_s is None else ("--lease-ttl-s", str(lease_ttl_s))
            servers = [
                PatientServer(
                    etcd.endpoint,
                    work / f"state-{name}",
                    config=config,
                    identity=name,
                    extra_args=(*lease, "--metrics-port", str(ports[name]), "--compress-wait-reasons"),
                )
                for name in "ab"
            ]
            began = time.monotonic()
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(PatientServer.start, servers))
            # The leader is the one whose log says so (a standby's /readyz is 200 too: it serves).
            _until(lambda: any(FIRST_PASS in s.current_log() for s in servers), 600, "a leader's first pass")
            say(
                f"failover: both serving, a leader's first pass done, {time.monotonic() - began:.1f} s after launch"
            )
            leader, standby = servers if FIRST_PASS in servers[0].current_log() else servers[::-1]
            token_files = [s.state_dir / "tokens" / "u0.token" for s in servers]
            token = next(p for p in token_files if p.exists()).read_text().strip()
            assert standby.proc is not None
            with GpufedClient(standby.target, token, timeout_s=30) as client:
                client.whoami()  # the channel is up before the kill, so its setup is not timed
                standby_rss, _ = rss_mib(standby.proc.pid)
                killed, killed_wall = time.monotonic(), time.time()
                leader.kill()
                probe = ""
                while not probe:
                    try:
                        probe = client.submit(PROBE, idempotency_key="failover-probe").job_id
                    except grpc.RpcError:
                        time.sleep(0.01)
                _until(lambda: FIRST_PASS in standby.current_log(), 120, "the standby's first pass")
                to_ready = time.monotonic() - killed
                _until(lambda: client.get(probe).phase in PLACED, 120, "the probe's admission")
                to_scheduling = time.monotonic() - killed
            standby_log = standby.current_log()
            split = {
                event: (logged_at(standby_log, event, killed_wall) or killed_wall) - killed_wall
                for event in ("leader_acquired", "leader_first_cycle_done", FIRST_PASS)
            }
        finally:
            for server in servers:
                server.stop()
            sims.stop()
            etcd.stop()
    return Failover(
        live,
        lease_ttl_s,
        to_ready,
        to_scheduling,
        standby_rss,
        seed_s,
        to_acquired_s=split["leader_acquired"],
        to_first_cycle_s=split["leader_first_cycle_done"],
        to_first_pass_s=split[FIRST_PASS],
    )


def figures(f: Failover) -> list[str]:
    return [
        f"failover_live_jobs: {f.live} jobs",
        f"failover_lease_ttl_s: {f.lease_ttl_s or DEFAULT_LEASE_TTL_S} s",
        f"failover_to_leader_key_s: {f.to_acquired_s:.2f} s",
        f"failover_to_first_cycle_s: {f.to_first_cycle_s:.2f} s",
        f"failover_to_ready_s: {f.to_ready_s:.2f} s",
        f"failover_to_scheduling_s: {f.to_scheduling_s:.2f} s",
        f"failover_standby_rss_mib: {f.standby_rss_mib:.0f} MiB",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10,000 live jobs")
    parser.add_argument("--live", type=int, default=None)
    parser.add_argument("--lease-ttl-s", type=int, default=None, help="default: the servers' own")
    args = parser.parse_args()
    live = args.live or (10_000 if args.quick else 100_000)
    for line in figures(run(live, args.lease_ttl_s)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
