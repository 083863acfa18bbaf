"""Sustained submissions through gRPC into etcd: throughput, p50/p99 latency, and zero lost jobs.

Starts a real etcd and one `gpufed serve` process (scheduler included, as in production), then
several client processes, each with several threads, submit small gangs for a fixed time. Every
accepted job id is then looked up through the API to prove none was lost.

    python bench/submit.py                            # 20 s of load on one server
    python bench/submit.py --quick                    # 5 s
    python bench/submit.py --quick --dataset          # every job names a dataset (checked at submit)
    python bench/submit.py --servers 2 --processes 2  # two servers on one etcd (one leads),
                                                      # one client process on each
    python bench/submit.py --servers 2 --to-follower  # submit only to the server that does not
                                                      # lead: the submission path without the
                                                      # scheduling cycle in its process
    python bench/submit.py --api-workers 2 --processes 2 --channels 4
                                                      # the server with two API worker processes on
                                                      # its port (gpufed serve --api-workers); the
                                                      # kernel deals connections, so each client
                                                      # process opens several
    python bench/submit.py --split --api-workers 2 --processes 3 --channels 4
                                                      # a split deployment: the clients call a
                                                      # --role api server with two workers; a
                                                      # --role scheduler server leads
    python bench/submit.py --quick --py-spy /tmp/venv/bin/py-spy --profile-out prof.txt
                                                      # py-spy's raw stacks of the server taking
                                                      # submissions, during the load (with each
                                                      # thread's id: the CPU each thread of that
                                                      # process used is printed, `cpu: ... thread`)
    python bench/submit.py --quick --whoami           # the same calls to WhoAmI: what gRPC and the
                                                      # per-call wrapper cost the server, without
                                                      # a submission

What it measures against, in the same run and on the same etcd, before the submissions (the servers
idle): etcd's own rate through the project's etcd client (aetcd, the server's), 64 requests in
flight for `--baseline-s` seconds, of single 1 KiB puts (`etcd_put_per_s`) and of the transaction
one submission writes, one to a request (`etcd_create_txn_per_s`: the idempotency key and the
record, each absent before; what a server without group commit could at best do). Aim: 2,000
submissions a second, p99 20 ms (issue 33), printed beside them.

Where the CPU went, since on a shared 2-core machine the rate says more about the neighbours than
about gpufed: each process's CPU per accepted job (servers, etcd, and the client processes' own),
the leader's scheduling cycles' share of the servers' CPU (from its /metrics: snapshot and plan over
the queue that grows during the run), and what a core would carry at those costs
(`submit_jobs_per_server_cpu_s`: a server is one Python process; `submit_jobs_per_client_cpu_s`:
what the load generator can offer from one core).

With `--api-workers N` the server's processes are counted together (`submit_server_cpu_per_job`),
and `submit_jobs_per_s_on_server_cores` says what they would carry with a core each: the rate at
which the busiest of them (the leader, whose loops work for every job) would fill its core.
Measured 2026-11-30 in A/B turns, `--quick --channels 4`, the rate each server's busiest process
would fill its core at (`submit_jobs_per_s_on_server_cores`), with the server's CPU a submission over
all its processes (`submit_server_cpu_per_job`; the busiest process's CPU read to 0.1 s):

| server | 16 in flight, load 5 to 6 | 24 in flight, load 10 to 11 |
|---|---|---|
| one process | 882, 944 /s (1.13, 1.05 ms) | 1,010, 953 /s (0.98, 1.05 ms) |
| and 2 API workers | 1,775, 1,562 /s (1.39, 1.49 ms) | 1,845, 1,809 /s (1.29, 1.28 ms) |
| and 3 API workers | | 2,026, 1,749 /s (1.65, 1.77 ms) |

A split deployment (`--split --processes 3 --channels 4`, load 5 to 6): the `--role api` server
the clients call, alone 1,136 and 1,046/s (its busiest process 0.88 and 0.96 ms a job); with 2
workers 1,463 and 1,843/s (0.68, 0.54 ms); with 3, 1,904 and 1,988/s (0.53, 0.50 ms). The
scheduler server, on its own process, spent 0.30 to 0.37 ms a job. With 48 in flight
(`--concurrency 16`): alone 1,103/s (0.91 ms), with 3 workers 2,324/s (its four processes 0.35 to
0.43 ms a job each, 1.52 ms in all against 1.70 to 1.85 at 24 in flight). Each process added to the api
server adds about 0.3 ms a job in all: 6 calls in flight a process batch less than 24 in one (gRPC's
reads, the group commit's requests), and on two cores each of seven busy processes is descheduled
often; its cache's following of every write is 0.05 ms of it.

The rate itself was 530 to 816/s in every one of these runs: two cores shared by the server's
processes, etcd (0.2 to 0.26 ms a submission) and the clients (0.3 ms). Each worker's RSS was 103 to
110 MiB. The busiest process is the leader or whichever worker the kernel dealt the most
connections; the leader's loops work for every job whichever process took it.

After the watch stream of our own (federation/store/kv_etcd_watch.py) and the group commit's
linger under load (2026-12-01, one process, `--quick`, four pairs in turns with the tree before,
load 1.3 to 3.5): the server's CPU a submission 0.65 to 0.75 ms against 0.86 to 0.90 (medians 0.725
and 0.88), etcd's 0.19 to 0.27 against 0.35 to 0.37, p50 4.9 to 6.7 ms against 6.9 to 7.9. A
request to etcd carried 2.0 transactions before the linger and about 4.8 after; each costs the
server 200 to 300 us of CPU in gRPC.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import server_metrics  # noqa: E402
from datasync.loopback_ports import free_port  # noqa: E402
from federation.api.client import GpufedClient  # noqa: E402
from federation.api.v1 import gpufed_pb2 as pb  # noqa: E402
from federation.runtime.etcd_process import EtcdProcess  # noqa: E402
from federation.spec.manifest_text import wire_manifest  # noqa: E402
from tests.e2e.harness import ServerProcess  # noqa: E402
from tests.procnet import LISTEN, api_worker_pids, sockets_on_port  # noqa: E402

CONFIG = """\
tenants: [{name: platform}, {name: t0}, {name: t1}, {name: t2}, {name: t3}]
users:
  - {name: admin, tenant: platform, role: admin}
  - {name: u0, tenant: t0, role: member}
  - {name: u1, tenant: t1, role: member}
  - {name: u2, tenant: t2, role: member}
  - {name: u3, tenant: t3, role: member}
clusters:
  - name: onprem
    provider: private
    region: dc1
    pools: [{name: a100, gpuType: A100, kind: private, usdPerGpuHour: 1.1, gpusPerNode: 8, nodes: 16}]
datasets: [{name: imagenet@2012, store: onprem-s3, sizeGiB: 150}]
"""

MANIFEST = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: bench, annotations: {sim.gpufed.io/duration: "3s"}}
spec:
  gpuTypes: [A100]
  tasks:
    - {name: master, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}
    - {name: worker, replicas: 3, image: "pytorch/pytorch:2.3", gpus: 1}
"""


SUBMIT_METHOD = "/gpufed.v1.JobService/SubmitJob"
# --whoami: the same calls to the cheapest authenticated method, for the server's cost of a call
# without a submission (gRPC, the per-call wrapper: authentication, metrics).
WHOAMI_METHOD = "/gpufed.v1.FederationService/WhoAmI"
# Room in each request for its idempotency key: a run's prefix, the client's index and a counter.
KEY_LENGTH = 32


def request_bytes(wire: str) -> Callable[[str], bytes]:
    """A SubmitJobRequest for `wire`, serialized once; each call gives it with another key.

    The load generator shares the two cores with the server and etcd: every microsecond a client
    spends building protobuf messages is one the server does not get. A key of fixed length keeps the
    message's length fields valid, so a key is written into the bytes instead.
    """
    from federation.api.v1 import gpufed_pb2 as pb

    placeholder = "k" * KEY_LENGTH
    template = pb.SubmitJobRequest(manifest=wire, idempotency_key=placeholder).SerializeToString()
    assert template.count(placeholder.encode()) == 1, "the manifest must not hold the placeholder"
    head, tail = template.split(placeholder.encode())

    def with_key(key: str) -> bytes:
        if len(key) != KEY_LENGTH:
            raise ValueError(f"idempotency keys here are {KEY_LENGTH} characters: {key!r}")
        return head + key.encode() + tail

    return with_key


# What a client process reports: its latencies (s), the job ids accepted, its errors and its CPU seconds.
ClientResult = tuple[list[float], list[str], int, float]


def _client_process(
    target: str,
    token: str,
    concurrency: int,
    channels: int,
    seconds: float,
    ready: mp.Queue[str],
    begin: Any,  # a multiprocessing Event, set once every client is ready
    start: Any,  # a multiprocessing Value("d"): when the load starts, set before `begin`
    send_yaml: bool,
    dataset: bool,
    key_prefix: str,
    out: mp.Queue[ClientResult],
    whoami: bool = False,
) -> None:
    """One client process: `concurrency` submissions in flight at once on one asyncio channel.

    An asyncio client costs far less CPU per call than a thread per call, and requests are sent as
    bytes made from one serialized message (`request_bytes`), replies kept as bytes and decoded
    after the load: on a 2-core machine more of the CPU is left to the server and etcd, which are
    what is being measured.
    """
    import asyncio

    from federation.api.v1 import gpufed_pb2 as pb

    latencies: list[float] = []
    replies: list[bytes] = []
    errors = 0
    # What GpufedClient sends: the user's YAML read here and sent as JSON (--yaml: sent as written).
    text = MANIFEST + ("  dataset: imagenet@2012\n" if dataset else "")
    request = request_bytes(text if send_yaml else wire_manifest(text))
    if whoami:
        request = lambda _key: b""  # noqa: E731 (an empty WhoAmIRequest)
    counter = iter(range(10**12))
    digits = KEY_LENGTH - len(key_prefix)

    async def run() -> None:
        nonlocal errors
        metadata = (("authorization", f"Bearer {token}"),)
        # Each channel a TCP connection of its own (a process's channels to one target otherwise
        # share one): the kernel deals connections, not calls, to a server's API workers.
        opened = [
            grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(channels)
        ]
        try:
            submits: list[grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = [
                channel.unary_unary(WHOAMI_METHOD if whoami else SUBMIT_METHOD) for channel in opened
            ]
            for channel in opened:
                await channel.channel_ready()
            # Ready only once imported and connected: on a busy machine a spawned client took longer
            # than a fixed head start, and the time it lost was counted as load.
            ready.put(key_prefix)
            await asyncio.to_thread(begin.wait)
            start_at: float = start.value
            stop_at = start_at + seconds

            async def worker(submit: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]) -> None:
                nonlocal errors
                while time.time() < stop_at:
                    body = request(f"{key_prefix}{next(counter):0{digits}d}")
                    began = time.perf_counter()
                    try:
                        reply = await submit(body, metadata=metadata, timeout=10)
                    except grpc.RpcError:
                        errors += 1
                        continue
                    latencies.append(time.perf_counter() - began)
                    replies.append(reply)

            await asyncio.sleep(max(0.0, start_at - time.time()))
            cpu_at_start.append(time.process_time())
            await asyncio.gather(*(worker(submits[i % channels]) for i in range(concurrency)))
            cpu_at_end.append(time.process_time())
        finally:
            for channel in opened:
                await channel.close()

    cpu_at_start: list[float] = []
    cpu_at_end: list[float] = []
    asyncio.run(run())
    ids = [
        f"whoami-{i}" if whoami else pb.SubmitJobResponse.FromString(reply).job_id
        for i, reply in enumerate(replies)
    ]
    # The client's own CPU during the load: whether the clients, on the same cores, could offer more.
    out.put((latencies, ids, errors, cpu_at_end[0] - cpu_at_start[0]))


BASELINE_IN_FLIGHT = 64
AIM_SUBMIT_PER_S = 2000.0
AIM_SUBMIT_P99_MS = 20.0


def etcd_baseline(endpoint: str, seconds: float) -> tuple[float, float]:
    """(single puts/s, submission-shaped transactions/s) on `endpoint`, 64 in flight, each for
    `seconds`; under keys of their own (`/bench-baseline/`), deleted after."""
    import asyncio

    from federation.store.kv import Compare, Put, Txn
    from federation.store.kv_etcd import EtcdKv

    value = b"x" * 1024

    async def rate(one: Callable[[EtcdKv, int], Awaitable[object]], kv: EtcdKv) -> float:
        done = 0
        stop_at = time.perf_counter() + seconds

        async def worker(w: int) -> None:
            nonlocal done
            n = 0
            while time.perf_counter() < stop_at:
                await one(kv, w * 10_000_000 + n)
                n += 1
                done += 1

        began = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(BASELINE_IN_FLIGHT)))
        return done / (time.perf_counter() - began)

    async def put(kv: EtcdKv, n: int) -> None:
        await kv.put(b"/bench-baseline/put/%d" % n, value)

    async def create(kv: EtcdKv, n: int) -> None:
        idem, key = b"/bench-baseline/idem/%d" % n, b"/bench-baseline/job/%d" % n
        (result,) = await kv.txn_many(
            [Txn((Compare.absent(idem), Compare.absent(key)), (Put(idem, value[:100]), Put(key, value)))]
        )
        assert result.succeeded

    async def run() -> tuple[float, float]:
        kv = await EtcdKv.connect(endpoint)
        try:
            puts = await rate(put, kv)
            txns = await rate(create, kv)
            await kv.delete_prefix(b"/bench-baseline/")
            return puts, txns
        finally:
            await kv.close()

    return asyncio.run(run())


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU a process has used so far (Linux /proc), to show who used the cores."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU each of a process's threads has used so far, by name and thread id (Linux /proc): gRPC's
    core threads (`event_engine`) are seen by no sampling profiler, and py-spy's `--threads` names
    the Python threads (all `python` here) by the same ids."""
    used: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended between the listing and the read
        name = f"{'the event loop' if int(task.name) == pid else name} ({task.name})"
        used[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return used


def _etcd_requests(client_url: str) -> Counter[str]:
    """etcd's handled gRPC requests so far, by method (its /metrics; watch streams not counted)."""
    import urllib.request

    counts: Counter[str] = Counter()
    with urllib.request.urlopen(f"{client_url}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("grpc_server_handled_total{") and 'grpc_type="unary"' in line:
                method = line.split('grpc_method="', 1)[1].split('"', 1)[0]
                counts[method] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _workers_serving(
    servers: list[ServerProcess], counts: list[int], timeout_s: float = 120.0
) -> list[list[int]]:
    """Each server's API worker pids, once every one listens on its server's port (a server serves
    before its workers do)."""
    deadline = time.monotonic() + timeout_s
    while True:
        # A server without workers is not looked up: the servers here share one state dir.
        found = [
            api_worker_pids(each.state_dir) if count else []
            for each, count in zip(servers, counts, strict=True)
        ]
        if all(
            len(pids) == count and all(sockets_on_port(p, each.port, LISTEN) for p in pids)
            for pids, each, count in zip(found, servers, counts, strict=True)
        ):
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(f"API workers not serving within {timeout_s} s: {found}")
        time.sleep(0.2)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="5 s of load instead of 20 s")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--processes", type=int, default=1, help="client processes")
    parser.add_argument("--concurrency", type=int, default=8, help="submissions in flight per client process")
    parser.add_argument(
        "--channels",
        type=int,
        default=1,
        help="connections per client process (the kernel deals connections, not calls, to API workers)",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="a --role scheduler server and a --role api server (with the --api-workers) that the clients call",
    )
    parser.add_argument(
        "--api-workers",
        type=int,
        default=0,
        help="each server with this many API worker processes on its port (gpufed serve --api-workers)",
    )
    parser.add_argument(
        "--whoami",
        action="store_true",
        help="call WhoAmI instead of SubmitJob: what a call costs the server without a submission",
    )
    parser.add_argument("--yaml", action="store_true", help="send the YAML as written instead of JSON")
    parser.add_argument(
        "--dataset", action="store_true", help="every job names a dataset (from the config's datasets:)"
    )
    parser.add_argument(
        "--servers",
        type=int,
        default=1,
        help="gpufed servers on the one etcd; client process i uses server i mod N",
    )
    parser.add_argument(
        "--baseline-s", type=float, default=None, help="seconds of each etcd baseline (default 5; quick 2)"
    )
    parser.add_argument(
        "--to-follower",
        action="store_true",
        help="with --servers 2 or more: submit only to the servers that do not lead",
    )
    parser.add_argument(
        "--py-spy",
        default=None,
        metavar="BIN",
        help="record the first server that takes submissions with this py-spy binary during the load (raw format)",
    )
    parser.add_argument(
        "--profile-out", default="submit-profile.txt", help="where --py-spy writes its raw stacks"
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="with --py-spy: C frames too (py-spy then pauses the server at each sample, so it runs"
        " many times slower: read shares from it, never rates or CPU)",
    )
    args = parser.parse_args()
    if args.split:
        args.servers, args.to_follower = 2, True
    elif args.api_workers and args.servers > 1:
        parser.error("--api-workers with one server, or --split (the servers here share one state dir)")
    # Workers per server: with --split only the api server has them (the clients' server).
    worker_counts = [0, args.api_workers] if args.split else [args.api_workers] * args.servers
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    baseline_s = args.baseline_s or (2.0 if args.quick else 5.0)

    with tempfile.TemporaryDirectory(prefix="gpufed-bench-") as tmp:
        tmp_path = Path(tmp)
        config = tmp_path / "federation.yaml"
        config.write_text(CONFIG)
        etcd = EtcdProcess(tmp_path / "etcd")
        etcd.start()
        metrics_ports = [free_port() for _ in range(args.servers)]
        servers = [
            ServerProcess(
                etcd.endpoint,
                tmp_path / "state",
                config=config,
                identity=f"bench{i}",
                extra_args=(
                    "--metrics-port",
                    str(metrics_ports[i]),
                    "--api-workers",
                    str(worker_counts[i]),
                    *(("--role", "scheduler" if i == 0 else "api") if args.split else ()),
                ),
            )
            for i in range(args.servers)
        ]
        server = servers[0]
        try:
            for each in servers:
                # Started one after the other: the first takes the lease and leads; the others serve.
                each.start()
            workers = _workers_serving(servers, worker_counts)
            tokens = [(tmp_path / "state" / "tokens" / f"u{i}.token").read_text().strip() for i in range(4)]
            etcd_puts, etcd_txns = etcd_baseline(etcd.endpoint, baseline_s)
            # One warm-up call per tenant and server so connection set-up is not measured.
            for token in tokens:
                for each in servers:
                    with GpufedClient(each.target, token) as c:
                        c.whoami()
            ctx = mp.get_context("spawn")
            out: mp.Queue[ClientResult] = ctx.Queue()
            run_id = uuid.uuid4().hex[:8]
            ready: mp.Queue[str] = ctx.Queue()
            start = ctx.Value("d", 0.0)
            begin = ctx.Event()
            # --to-follower: the submissions go to servers that do not lead (started after the first),
            # so that the submission path is measured without the scheduling cycle in its process.
            targets = servers[1:] if args.to_follower and len(servers) > 1 else servers
            procs = [
                ctx.Process(
                    target=_client_process,
                    args=(
                        targets[i % len(targets)].target,
                        tokens[i % len(tokens)],
                        args.concurrency,
                        args.channels,
                        seconds,
                        ready,
                        begin,
                        start,
                        args.yaml,
                        args.dataset,
                        f"{run_id}-{i}-",
                        out,
                        args.whoami,
                    ),
                )
                for i in range(args.processes)
            ]
            for p in procs:
                p.start()
            watched: dict[str, int | None] = {
                f"server{i}": each.proc.pid for i, each in enumerate(servers) if each.proc is not None
            }
            for i, pids in enumerate(workers):
                for w, pid in enumerate(pids):
                    watched[f"server{i}-worker{w}"] = pid
            watched["etcd"] = etcd.pid
            for _ in procs:
                ready.get(timeout=300)
            start_at = time.time() + 0.2
            start.value = start_at
            begin.set()
            while time.time() < start_at:
                time.sleep(0.01)
            profiler = None
            profiled = targets[0].proc
            if args.py_spy and profiled is not None:
                record: tuple[str, ...] = (
                    "record",
                    "--pid",
                    str(profiled.pid),
                    "--format",
                    "raw",
                    "--threads",
                )
                # py-spy reads C stacks only with the process paused at each sample: it costs the
                # server time (rate and CPU figures of such a run are not comparable), not shares.
                record += ("--native",) if args.native else ("--nonblocking",)
                duration = ("--rate", "200", "--duration", str(max(1, int(seconds))), "-o", args.profile_out)
                profiler = subprocess.Popen(
                    [args.py_spy, *record, *duration],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            cpu_before = {name: _cpu_seconds(pid) for name, pid in watched.items() if pid}
            profiled_pid = profiled.pid if profiled is not None else None
            threads_before = {} if profiled_pid is None else _thread_cpu_seconds(profiled_pid)
            scheduler_before = sum(server_metrics.cycles(port)[2] for port in metrics_ports)
            etcd_before = _etcd_requests(etcd.client_url)
            results = [out.get(timeout=seconds + 120) for _ in procs]
            cpu_used = {name: _cpu_seconds(pid) - cpu_before[name] for name, pid in watched.items() if pid}
            threads_used = {} if profiled_pid is None else _thread_cpu_seconds(profiled_pid)
            for name, before in threads_before.items():
                threads_used[name] = threads_used.get(name, 0.0) - before
            rss_mib = {
                name: _rss_mib(pid) for name, pid in watched.items() if pid and name.startswith("server")
            }
            scheduler_used = sum(server_metrics.cycles(port)[2] for port in metrics_ports) - scheduler_before
            etcd_requests = _etcd_requests(etcd.client_url) - etcd_before
            if profiler is not None:
                profiler.wait(timeout=120)
            for p in procs:
                p.join()

            latencies = [x for r in results for x in r[0]]
            accepted = [x for r in results for x in r[1]]
            errors = sum(r[2] for r in results)
            admin_token = (tmp_path / "state" / "tokens" / "admin.token").read_text().strip()
            with GpufedClient(server.target, admin_token, timeout_s=60) as admin:
                listed = admin.list_all()
                stored = {j.job_id for j in listed}
                # Proof that the leader scheduled all along (a throughput bought by an idle
                # scheduler would mean nothing): how far the accepted jobs got by the end.
                phases = Counter(pb.JobPhase.Name(j.phase).removeprefix("JOB_PHASE_") for j in listed)
                missing = [] if args.whoami else [j for j in accepted if j not in stored]
                # The list is served from the cache; confirm any stragglers straight from etcd.
                missing = [j for j in missing if not _exists(admin, j)]
        finally:
            for each in servers:
                each.stop()
            etcd.stop()

    clients = args.processes * args.concurrency
    print(
        f"clients: {clients} in flight ({args.processes} processes x {args.concurrency}), {seconds:.0f} s of load"
    )
    cpu_used["clients"] = sum(r[3] for r in results)
    for name, used in cpu_used.items():
        print(
            f"cpu: {name} used {used:.1f} s of CPU in {seconds:.0f} s ({100 * used / seconds:.0f}% of one core,"
            f" {1000 * used / max(len(accepted), 1):.2f} ms per accepted job)"
        )
    server_cpu = sum(used for name, used in cpu_used.items() if name.startswith("server"))
    for name, used in sorted(threads_used.items(), key=lambda item: -item[1]):
        if used >= 0.05:
            print(f"cpu: the first serving process's thread {name} used {used:.2f} s")
    print(
        f"cpu: the scheduling cycles (snapshot and plan) used {scheduler_used:.1f} s of it"
        f" ({100 * scheduler_used / max(server_cpu, 1e-9):.0f}% of the servers' CPU)"
    )
    if args.py_spy:
        print(
            f"profile: {args.profile_out} (py-spy's raw stacks of the first server taking submissions, during the load)"
        )
    roles = " (a scheduler server, and an api server the clients call)" if args.split else ""
    print(f"servers: {args.servers} on one etcd{roles}, API workers {worker_counts}")
    for name, rss in rss_mib.items():
        print(f"rss: {name} {rss:.0f} MiB at the end")
    print(f"accepted: {len(accepted)}, errors: {errors}, lost: {len(missing)}")
    print(
        "etcd requests during the load (every server's, the leader's own included): "
        + ", ".join(f"{method} {n}" for method, n in etcd_requests.most_common())
    )
    print("phases at the end: " + ", ".join(f"{n} {phase}" for phase, n in sorted(phases.items())))
    print(f"submit_throughput: {len(accepted) / seconds:.0f} jobs/s")
    print(f"submit_p50_latency: {1000 * statistics.median(latencies):.1f} ms")
    print(f"submit_p99_latency: {1000 * _percentile(latencies, 0.99):.1f} ms")
    print(f"submit_clients_in_flight: {clients} requests")
    print(f"submit_server_cpu_per_job: {1000 * server_cpu / max(len(accepted), 1):.2f} ms")
    loop_thread = sum(used for name, used in threads_used.items() if name.startswith("the event loop"))
    print(f"submit_event_loop_cpu_per_job: {1000 * loop_thread / max(len(accepted), 1):.2f} ms")
    print(f"submit_scheduler_cpu_share: {100 * scheduler_used / max(server_cpu, 1e-9):.0f} percent")
    # What a core would carry at these costs: a busy machine lowers the rate, much less the cost. A
    # server is one Python process (one core's worth, give or take gRPC's own threads); the clients
    # are what the load generator could offer from one core.
    print(f"submit_jobs_per_server_cpu_s: {len(accepted) / max(server_cpu, 1e-9):.0f} jobs/s")
    # With API workers each process has a core's worth at most: what the server's processes would
    # carry with a core each, the calls dealt among them as in this run. The busiest one saturates
    # first (the leader, whose loops work for every job, whichever process took it), so the figure
    # is the rate at which it would use its whole core, not the average over the processes.
    # With --split the scheduler server takes no calls: the busiest of the api server's processes.
    serving = ("server1",) if args.split else tuple(f"server{i}" for i in range(args.servers))
    processes = sum(1 + worker_counts[i] for i in range(args.servers) if f"server{i}" in serving)
    busiest = max(used for name, used in cpu_used.items() if name.split("-")[0] in serving)
    if args.split:
        print(
            f"submit_scheduler_server_cpu_per_job: {1000 * cpu_used['server0'] / max(len(accepted), 1):.2f} ms"
        )
    print(f"submit_server_processes: {processes} processes")
    print(f"submit_busiest_server_process_cpu_per_job: {1000 * busiest / max(len(accepted), 1):.2f} ms")
    print(f"submit_jobs_per_s_on_server_cores: {len(accepted) / max(busiest, 1e-9):.0f} jobs/s")
    if args.api_workers:
        workers_rss = [rss for name, rss in rss_mib.items() if "-worker" in name]
        print(f"submit_api_worker_rss_mib: {statistics.mean(workers_rss):.0f} MiB")
    print(f"submit_etcd_requests_per_job: {sum(etcd_requests.values()) / max(len(accepted), 1):.3f} requests")
    print(f"submit_jobs_per_client_cpu_s: {len(accepted) / max(cpu_used['clients'], 1e-9):.0f} jobs/s")
    print(f"submit_errors: {errors} requests")
    print(f"submit_lost_jobs: {len(missing)} jobs")
    print(f"submit_aim_per_s: {AIM_SUBMIT_PER_S:.0f} jobs/s")
    print(f"submit_aim_p99_ms: {AIM_SUBMIT_P99_MS:.0f} ms")
    print(f"etcd_put_per_s: {etcd_puts:.0f} puts/s")
    print(f"etcd_create_txn_per_s: {etcd_txns:.0f} txns/s")
    print(f"submit_to_etcd_put_ratio: {len(accepted) / seconds / etcd_puts:.2f} ratio")
    return 0 if not missing else 1


def _exists(client: GpufedClient, job_id: str) -> bool:
    try:
        client.get(job_id)
        return True
    except grpc.RpcError:
        return False


if __name__ == "__main__":
    sys.exit(main())
