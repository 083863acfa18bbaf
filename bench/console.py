"""The web console's server time per page with 10,000 jobs in the system (issue 21: under 300 ms).

Starts a real etcd and one `gpufed serve` process (scheduler included, as in production; its HTTP
port serves the console; reads not rate-limited, so that what is measured is the cost of a page and
not the limit) on a federation like the embedded default's: the teams and users, three clusters,
scalable pools, a capacity plan and an approval. Then puts the jobs in through the API (SubmitJob,
many in flight): a few hundred short jobs that run to their end first (so that finance has a ledger
to add up), then the rest, 8-GPU gangs of a day's run that fill the clusters and wait in the queues,
split between vision and nlp. Once the server has settled (its first cycles over a new queue write
every job's wait reasons), it signs in as the admin (who sees every job), as alice and as finance
(reports are the finance role's: the API gives admins none), and asks for each page several times
over one keep-alive connection per session, one request at a time: time from sending the request to
the last byte of the answer, over loopback. The figure per page is the median; `slowest_page_ms`
is the slowest page's.

    python bench/console.py            # 10,000 jobs, each page 15 times
    python bench/console.py --quick    # 2,000 jobs, each page 5 times (within a minute)

Prints `figure: value unit` lines at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections import Counter
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from datasync.loopback_ports import free_port  # noqa: E402
from federation.api.capacity_client import CapacityClient, plan_request  # noqa: E402
from federation.api.client import GpufedClient  # noqa: E402
from federation.api.v1 import gpufed_pb2 as pb  # noqa: E402
from federation.runtime.etcd_process import EtcdProcess  # noqa: E402
from federation.spec.manifest_text import wire_manifest  # noqa: E402
from tests.e2e.harness import ServerProcess  # noqa: E402

# The embedded default's federation (federation/defaults/federation.yaml) without the simulator
# process and the object stores: the same teams, users, quotas, clusters and prices.
CONFIG = """\
priorityClasses:
  - {name: low, value: 100}
  - {name: normal, value: 1000}
  - {name: high, value: 10000}
  - {name: urgent, value: 100000, preemptible: false, needsApproval: true}
capacity:
  provisioner: simulated
  leadTimeSeconds: 10
  idleTtlSeconds: 60
  spendCeilingUsdPerHour: 1000
  cloudGpuLimits: {aws: 128, gcp: 64}
  maxNodesPerPool: 16
tenants:
  - name: platform
  - name: research
    quotas: {A100: {cap: 64}, H100: {cap: 48}}
  - name: vision
    parent: research
    weight: 1
    monthlyBudgetGpuHours: 20000
    quotas:
      A100: {guaranteed: 16, borrowingLimit: 16, lendingLimit: 16, cap: 24}
      H100: {cap: 16}
  - name: nlp
    parent: research
    weight: 2
    quotas:
      A100: {guaranteed: 16, borrowingLimit: 16, cap: 32}
      H100: {guaranteed: 0, cap: 32}
  - name: speech
    maxPriorityClass: high
users:
  - {name: admin, tenant: platform, role: admin}
  - {name: infra, tenant: platform, role: infra}
  - {name: finance, tenant: platform, role: finance}
  - {name: alice, tenant: vision, role: member}
  - {name: ivan, tenant: vision, role: member, maxPriorityClass: normal}
  - {name: bob, tenant: nlp, role: member}
  - {name: sara, tenant: speech, role: member}
clusters:
  - name: onprem-a100
    provider: private
    region: dc1
    pools:
      - {name: a100, gpuType: A100, kind: private, usdPerGpuHour: 1.10, gpusPerNode: 8, nodes: 4}
  - name: aws-us-east-1
    provider: aws
    region: us-east-1
    scalable: true
    pools:
      - {name: h100-od, gpuType: H100, kind: on_demand, usdPerGpuHour: 6.88, gpusPerNode: 8, nodes: 2}
      - {name: h100-spot, gpuType: H100, kind: spot, usdPerGpuHour: 1.28, gpusPerNode: 8, nodes: 2}
      - {name: a100-od, gpuType: A100, kind: on_demand, usdPerGpuHour: 2.7447, gpusPerNode: 8, nodes: 2}
      - {name: a100-spot, gpuType: A100, kind: spot, usdPerGpuHour: 0.3082, gpusPerNode: 8, nodes: 2}
  - name: gcp-us-east4
    provider: gcp
    region: us-east4
    scalable: true
    pools:
      - {name: l4-od, gpuType: L4, kind: on_demand, usdPerGpuHour: 0.7045, gpusPerNode: 1, nodes: 8}
      - {name: l4-spot, gpuType: L4, kind: spot, usdPerGpuHour: 0.2959, gpusPerNode: 1, nodes: 8}
"""

SHORT = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: NAME, annotations: {sim.gpufed.io/duration: "1s"}}
spec:
  gpuTypes: [GPU]
  tasks:
    - {name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}
"""

LONG = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: NAME, annotations: {sim.gpufed.io/duration: "24h"}}
spec:
  gpuTypes: [GPU]
  allowSpot: true
  tasks:
    - {name: master, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 8}
"""

TERMINAL = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}


def _submit_many(target: str, jobs: list[tuple[str, str]], concurrency: int) -> list[str]:
    """Submit (token, manifest) pairs with `concurrency` in flight; the accepted job ids."""
    from federation.api.v1 import gpufed_pb2_grpc as pb_grpc

    accepted: list[str] = []
    queue = list(reversed([(token, wire_manifest(text)) for token, text in jobs]))

    async def run() -> None:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.JobServiceStub(channel)

            async def worker() -> None:
                while queue:
                    token, wire = queue.pop()
                    request = pb.SubmitJobRequest(manifest=wire, idempotency_key=str(uuid.uuid4()))
                    metadata = (("authorization", f"Bearer {token}"),)
                    for _ in range(5):
                        try:
                            reply = await stub.SubmitJob(request, metadata=metadata, timeout=30)
                            accepted.append(reply.job_id)
                            break
                        except grpc.RpcError:
                            await asyncio.sleep(0.2)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(run())
    return accepted


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _settle(pid: int, quiet_share: float = 0.35, window_s: float = 2.0, limit_s: float = 120.0) -> float:
    """Wait until the server uses under `quiet_share` of a core over `window_s`; the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        before = _cpu_seconds(pid)
        time.sleep(window_s)
        if (_cpu_seconds(pid) - before) / window_s < quiet_share:
            break
    return time.monotonic() - started


class Browserless:
    """One signed-in console session over one keep-alive connection, as a browser holds one."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = urllib.parse.urlencode({"token": token})
        self.conn.request(
            "POST",
            "/login",
            body=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        response = self.conn.getresponse()
        response.read()
        if response.status != 303:
            raise RuntimeError(f"sign-in refused: {response.status}")
        cookie = response.getheader("Set-Cookie") or ""
        found = re.match(r"(gpufed_session=[^;]+)", cookie)
        if not found:
            raise RuntimeError(f"sign-in set no session cookie: {cookie!r}")
        self.cookie = found.group(1)

    def get(self, path: str) -> tuple[float, int, int, float | None]:
        """(seconds to the last byte, status, bytes, the Server-Timing total in ms if given)."""
        began = time.perf_counter()
        self.conn.request("GET", path, headers={"Cookie": self.cookie})
        response = self.conn.getresponse()
        body = response.read()
        took = time.perf_counter() - began
        timing = response.getheader("Server-Timing")
        server_ms = None
        if timing:
            found = re.search(r"dur=([0-9.]+)", timing)
            server_ms = float(found.group(1)) if found else None
        return took, response.status, len(body), server_ms

    def close(self) -> None:
        self.conn.close()


def _token(server: ServerProcess, user: str) -> str:
    return (server.state_dir / "tokens" / f"{user}.token").read_text().strip()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, each page 5 times")
    parser.add_argument("--jobs", type=int, default=None, help="jobs in the system (default 10,000)")
    parser.add_argument("--repeat", type=int, default=None, help="requests per page (default 15)")
    parser.add_argument("--concurrency", type=int, default=16, help="submissions in flight")
    args = parser.parse_args()
    total = args.jobs or (2_000 if args.quick else 10_000)
    repeat = args.repeat or (5 if args.quick else 15)
    short_count = min(300, total // 10)

    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpufed-console-bench-") as tmp:
        tmp_path = Path(tmp)
        config = tmp_path / "federation.yaml"
        config.write_text(CONFIG)
        etcd = EtcdProcess(tmp_path / "etcd")
        etcd.start()
        http_port = free_port()
        server = ServerProcess(
            etcd.endpoint,
            tmp_path / "state",
            config=config,
            identity="bench",
            extra_args=("--metrics-port", str(http_port), "--read-rate-per-s", "0"),
        )
        try:
            server.start()
            assert server.proc is not None
            alice, bob = _token(server, "alice"), _token(server, "bob")
            with GpufedClient(server.target, _token(server, "infra")) as infra:
                start_s = time.time() + 2 * 86400
                CapacityClient(infra).create_plan(
                    plan_request(
                        cluster="gcp-us-east4",
                        gpu_type="L4",
                        gpus=8,
                        start_s=start_s,
                        end_s=start_s + 2 * 86400,
                        reason="launch week",
                    )
                )
            with GpufedClient(server.target, _token(server, "admin")) as admin:
                admin.grant_approval(
                    tenant="vision",
                    user="alice",
                    priority_class="urgent",
                    duration_s=72 * 3600,
                    reason="CVPR deadline",
                )

            submit_began = time.monotonic()
            # First the short jobs, to their end: the ledger finance adds up.
            short = [
                (alice if i % 2 else bob, SHORT.replace("NAME", f"eval-{i}").replace("GPU", gpu))
                for i, gpu in zip(range(short_count), ("A100", "H100", "L4") * short_count, strict=False)
            ]
            short_ids = _submit_many(server.target, short, args.concurrency)
            with GpufedClient(server.target, _token(server, "admin"), timeout_s=60) as admin:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    phases = Counter(j.phase for j in admin.list_all())
                    if sum(n for p, n in phases.items() if p in TERMINAL) >= len(short_ids):
                        break
                    time.sleep(1.0)
            # Then the long gangs: a few run, the rest wait.
            long = [
                (alice if i % 2 else bob, LONG.replace("NAME", f"train-{i}").replace("GPU", gpu))
                for i, gpu in zip(range(total - short_count), ("A100", "H100") * total, strict=False)
            ]
            long_ids = _submit_many(server.target, long, args.concurrency)
            submit_s = time.monotonic() - submit_began
            settle_s = _settle(server.proc.pid)
            with GpufedClient(server.target, _token(server, "admin"), timeout_s=60) as admin:
                listed = admin.list_all()
            phases_text = ", ".join(
                f"{n} {pb.JobPhase.Name(p).removeprefix('JOB_PHASE_')}"
                for p, n in sorted(Counter(j.phase for j in listed).items())
            )
            one_job = next(j.job_id for j in listed if j.job_id in long_ids and j.tenant == "vision")

            pages = {
                "jobs": "/jobs",
                "jobs_filtered": "/jobs?tenant=vision&phase=QUEUED",
                # The user and cluster filters; a sparse one (the few running on one cluster).
                "jobs_user": "/jobs?user=alice",
                "jobs_cluster": "/jobs?cluster=onprem-a100",
                "job": f"/jobs/{one_job}",
                "queues": "/queues",
                "clusters": "/clusters",
                "capacity": "/capacity",
                "finance": "/finance",
                "finance_csv": "/finance.csv",
                "approvals": "/approvals",
            }
            sessions = {"admin": Browserless(http_port, _token(server, "admin"))}
            sessions["alice"] = Browserless(http_port, alice)
            sessions["finance"] = Browserless(http_port, _token(server, "finance"))
            # Reports are the finance role's (and members' for their tenant): admins get none.
            plan = [
                ("finance" if name.startswith("finance") else "admin", name, path)
                for name, path in pages.items()
            ]
            plan += [("alice", "jobs_member", "/jobs"), ("alice", "job_member", f"/jobs/{one_job}")]
            times: dict[str, list[float]] = {name: [] for _, name, _ in plan}
            server_times: dict[str, list[float]] = {name: [] for _, name, _ in plan}
            sizes: dict[str, int] = {}
            statuses: dict[str, set[int]] = {name: set() for _, name, _ in plan}
            # One warm-up request per page; then the pages in turn, `repeat` rounds.
            for who, _, path in plan:
                sessions[who].get(path)
            cpu_before = _cpu_seconds(server.proc.pid)
            measure_began = time.monotonic()
            for _ in range(repeat):
                for who, name, path in plan:
                    took, status, size, server_ms = sessions[who].get(path)
                    times[name].append(took)
                    statuses[name].add(status)
                    sizes[name] = size
                    if server_ms is not None:
                        server_times[name].append(server_ms)
            measure_s = time.monotonic() - measure_began
            cpu_used = _cpu_seconds(server.proc.pid) - cpu_before
            for session in sessions.values():
                session.close()
        finally:
            server.stop()
            etcd.stop()

    print(
        f"jobs: {len(short_ids) + len(long_ids)} of {total} accepted in {submit_s:.1f} s; settled in {settle_s:.1f} s"
    )
    print(f"phases: {phases_text}")
    print(
        f"pages: {len(plan)} (as admin, who sees every job, finance as finance, and as alice), {repeat} requests each "
        f"after one warm-up, one at a time over a keep-alive connection"
    )
    print(f"server cpu while measured: {cpu_used:.1f} s in {measure_s:.1f} s")
    bad = {name: sorted(s) for name, s in statuses.items() if s != {200}}
    for name, values in times.items():
        ms = sorted(1000 * v for v in values)
        server_part = (
            f", Server-Timing median {statistics.median(server_times[name]):.1f} ms"
            if server_times[name]
            else ""
        )
        print(
            f"{name}: median {statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms, "
            f"{sizes[name]:,} bytes, status {sorted(statuses[name])}{server_part}"
        )
    print(f"run: {time.monotonic() - began:.0f} s")
    medians = {name: 1000 * statistics.median(values) for name, values in times.items()}
    slowest = max(medians, key=lambda n: medians[n])
    print(f"slowest_page_ms: {medians[slowest]:.1f} ms")
    for name, value in medians.items():
        print(f"page_ms_{name}: {value:.1f} ms")
    print(f"page_errors: {sum(len(s - {200}) for s in statuses.values())} pages")
    if bad:
        print(f"pages not answered 200: {bad}", file=sys.stderr)
    return 0 if not bad and medians[slowest] < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
