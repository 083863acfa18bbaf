"""One tenant's job count must not slow another's reads: alice's ListJobs beside bob's 20,000 jobs.

Starts two alike stacks, each a real etcd and one `gpufed serve` process (scheduler included, as in
production; reads not rate-limited, so that what is measured is the cost of a read and not the
limit). Alice's tenant holds 83 jobs on both; on the second, bob then submits 20,000 jobs through
the API and the server settles (the leader has planned them and written their wait reasons). One
client process lists alice's jobs (one page of up to 100, several calls in flight) on each server
in turns of half a second (A B B A ...), so that whatever else loads the machine weighs on both
figures alike: calls a second, p50 and p99 latency. All jobs ask for a GPU type no cluster has, so
they stay queued and nothing changes under the measurement.

Before the cache kept jobs by tenant, each list scanned and sorted every job of every tenant: alice's
lists fell from 474/s to 168/s and p99 rose from 162 ms to 1,136 ms.

    python bench/isolation_load.py            # 20,000 of bob's jobs, 20 s measured per server
    python bench/isolation_load.py --quick    # 5,000 of bob's jobs, 3 s per server (within a minute)

Prints `figure: value unit` lines at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.api.client import GpufedClient  # noqa: E402
from federation.runtime.etcd_process import EtcdProcess  # noqa: E402
from federation.spec.manifest_text import wire_manifest  # noqa: E402
from tests.e2e.harness import ServerProcess  # noqa: E402

CONFIG = """\
tenants: [{name: platform}, {name: vision}, {name: nlp}]
users:
  - {name: admin, tenant: platform, role: admin}
  - {name: alice, tenant: vision, role: member}
  - {name: bob, tenant: nlp, role: member}
clusters:
  - name: onprem
    provider: private
    region: dc1
    pools: [{name: a100, gpuType: A100, kind: private, usdPerGpuHour: 1.1, gpusPerNode: 8, nodes: 4}]
"""

# H200: no cluster has it, so every job waits in the queue and nothing changes while we measure.
MANIFEST = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: NAME}
spec:
  gpuTypes: [H200]
  tasks:
    - {name: worker, replicas: 2, image: "pytorch/pytorch:2.3", gpus: 8}
"""

ALICE_JOBS = 83
BOB_JOBS = 20_000


def _submit_many(target: str, token: str, manifest: str, count: int, concurrency: int) -> int:
    """Submit `count` copies of `manifest` with `concurrency` in flight; the number accepted."""
    from federation.api.v1 import gpufed_pb2 as pb
    from federation.api.v1 import gpufed_pb2_grpc as pb_grpc

    wire = wire_manifest(manifest)
    accepted = 0

    async def run() -> None:
        nonlocal accepted
        metadata = (("authorization", f"Bearer {token}"),)
        left = count
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.JobServiceStub(channel)

            async def worker() -> None:
                nonlocal accepted, left
                while left > 0:
                    left -= 1
                    request = pb.SubmitJobRequest(manifest=wire, idempotency_key=str(uuid.uuid4()))
                    for _ in range(5):
                        try:
                            await stub.SubmitJob(request, metadata=metadata, timeout=30)
                            accepted += 1
                            break
                        except grpc.RpcError:
                            await asyncio.sleep(0.2)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(run())
    return accepted


def _list_load(
    targets: list[tuple[str, str]],
    concurrency: int,
    seconds: float,
    slice_s: float,
    out: mp.Queue[tuple[list[list[float]], list[int], list[int]]],
) -> None:
    """One client process: alice's ListJobs, `concurrency` calls in flight, on each (target, token)
    in turn for `slice_s` at a time, in the order A B B A ..., until each had `seconds`."""
    from federation.api.v1 import gpufed_pb2 as pb
    from federation.api.v1 import gpufed_pb2_grpc as pb_grpc

    latencies: list[list[float]] = [[] for _ in targets]
    errors = [0 for _ in targets]
    listed = [0 for _ in targets]

    async def run() -> None:
        channels = [grpc.aio.insecure_channel(target) for target, _ in targets]
        stubs = [pb_grpc.JobServiceStub(c) for c in channels]
        metadata = [(("authorization", f"Bearer {token}"),) for _, token in targets]
        request = pb.ListJobsRequest(page_size=100)
        # Warm-up: connections and token resolution are not what is measured.
        for stub, md in zip(stubs, metadata, strict=True):
            for _ in range(20):
                await stub.ListJobs(request, metadata=md, timeout=30)

        async def load(i: int, stop_at: float) -> None:
            async def worker() -> None:
                while time.perf_counter() < stop_at:
                    began = time.perf_counter()
                    try:
                        reply = await stubs[i].ListJobs(request, metadata=metadata[i], timeout=30)
                    except grpc.RpcError:
                        errors[i] += 1
                        continue
                    latencies[i].append(time.perf_counter() - began)
                    listed[i] = len(reply.jobs)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        rounds = max(1, round(seconds / slice_s))
        for r in range(rounds):
            order = range(len(targets)) if r % 2 == 0 else reversed(range(len(targets)))
            for i in order:
                await load(i, time.perf_counter() + slice_s)
        for c in channels:
            await c.close()

    asyncio.run(run())
    out.put((latencies, errors, listed))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(
    targets: list[tuple[str, str]], concurrency: int, seconds: float, slice_s: float
) -> list[tuple[float, float, float, int, int]]:
    """Per target: (calls/s, p50 s, p99 s, errors, jobs per answer) of alice's lists."""
    ctx = mp.get_context("spawn")
    out: mp.Queue[tuple[list[list[float]], list[int], list[int]]] = ctx.Queue()
    proc = ctx.Process(target=_list_load, args=(targets, concurrency, seconds, slice_s, out))
    proc.start()
    latencies, errors, listed = out.get(timeout=len(targets) * seconds + 120)
    proc.join()
    measured = max(1, round(seconds / slice_s)) * slice_s
    return [
        (
            len(lat) / measured,
            _percentile(lat, 0.5),
            _percentile(lat, 0.99),
            errors[i],
            listed[i],
        )
        for i, lat in enumerate(latencies)
    ]


def _settle(pid: int, quiet_share: float = 0.35, window_s: float = 2.0, limit_s: float = 120.0) -> float:
    """Wait until the server uses under `quiet_share` of a core over `window_s` (its first cycles over
    a new queue write every job's wait reasons); the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        before = _cpu_seconds(pid)
        time.sleep(window_s)
        if (_cpu_seconds(pid) - before) / window_s < quiet_share:
            break
    return time.monotonic() - started


def _stack(
    tmp_path: Path, name: str, config_text: str = CONFIG, extra_args: tuple[str, ...] = ()
) -> tuple[EtcdProcess, ServerProcess]:
    """An etcd and a `gpufed serve` on it, bootstrapped from `config_text`, with no read limit."""
    config = tmp_path / "federation.yaml"
    config.write_text(config_text)
    etcd = EtcdProcess(tmp_path / name / "etcd")
    etcd.start()
    server = ServerProcess(
        etcd.endpoint,
        tmp_path / name / "state",
        config=config,
        identity=name,
        extra_args=("--read-rate-per-s", "0", *extra_args),
    )
    try:
        server.start()
    except Exception:
        etcd.stop()
        raise
    return etcd, server


def _token(server: ServerProcess, user: str) -> str:
    return (server.state_dir / "tokens" / f"{user}.token").read_text().strip()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="5,000 of bob's jobs and 3 s per server, within a minute"
    )
    parser.add_argument("--seconds", type=float, default=None, help="measured time per server")
    parser.add_argument("--slice", type=float, default=0.5, help="seconds per turn of the A B B A order")
    parser.add_argument("--jobs", type=int, default=None, help="bob's jobs (default 20,000)")
    parser.add_argument("--concurrency", type=int, default=4, help="alice's lists in flight")
    args = parser.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 20.0)
    jobs = args.jobs or (5_000 if args.quick else BOB_JOBS)

    began = time.monotonic()
    stacks: list[tuple[EtcdProcess, ServerProcess]] = []
    with tempfile.TemporaryDirectory(prefix="gpufed-isolation-") as tmp:
        tmp_path = Path(tmp)
        try:
            # Two servers, each on its own etcd, alike but for bob's jobs. Measured in turns of a
            # fraction of a second (A B B A ...), so that whatever else loads the machine weighs on
            # both figures alike.
            stacks = [_stack(tmp_path, "quiet"), _stack(tmp_path, "noisy")]
            (_, quiet), (_, noisy) = stacks
            assert quiet.proc is not None
            assert noisy.proc is not None
            for server in (quiet, noisy):
                _submit_many(
                    server.target, _token(server, "alice"), MANIFEST.replace("NAME", "alice"), ALICE_JOBS, 8
                )
            submit_began = time.monotonic()
            accepted = _submit_many(
                noisy.target, _token(noisy, "bob"), MANIFEST.replace("NAME", "bob"), jobs, 16
            )
            submit_s = time.monotonic() - submit_began
            settle_s = _settle(noisy.proc.pid)
            with GpufedClient(noisy.target, _token(noisy, "bob"), timeout_s=60) as bob:
                bobs = len(bob.list_all())
            targets = [(server.target, _token(server, "alice")) for server in (quiet, noisy)]
            alone, beside = _measure(targets, args.concurrency, seconds, args.slice)
            cpu_before = _cpu_seconds(noisy.proc.pid)
            time.sleep(2.0)
            idle_share = (_cpu_seconds(noisy.proc.pid) - cpu_before) / 2.0
        finally:
            for etcd, server in stacks:
                server.stop()
                etcd.stop()

    print(
        f"alice: {ALICE_JOBS} jobs; lists of one page (up to 100), {args.concurrency} in flight, "
        f"{seconds:.0f} s per server in turns of {args.slice:g} s"
    )
    print(
        f"bob: {accepted} of {jobs} jobs accepted in {submit_s:.1f} s; {bobs} listed; settled in {settle_s:.1f} s"
    )
    print(f"server with bob's jobs, between calls: {100 * idle_share:.0f}% of one core")
    for name, m in (("alone", alone), ("beside", beside)):
        print(
            f"{name}: {m[0]:.0f} lists/s, p50 {m[1] * 1e3:.1f} ms, p99 {m[2] * 1e3:.1f} ms, "
            f"errors {m[3]}, {m[4]} jobs each"
        )
    print(f"run: {time.monotonic() - began:.0f} s")
    print(f"listjobs_per_s_alone: {alone[0]:.0f} calls/s")
    print(f"listjobs_per_s_with_noise: {beside[0]:.0f} calls/s")
    print(f"listjobs_ratio_with_noise: {beside[0] / alone[0]:.2f} ratio")
    print(f"listjobs_p99_ms_alone: {alone[2] * 1e3:.1f} ms")
    print(f"listjobs_p99_ms_with_noise: {beside[2] * 1e3:.1f} ms")
    print(f"listjobs_p99_ratio_with_noise: {beside[2] / alone[2]:.2f} ratio")
    print(f"listjobs_errors: {alone[3] + beside[3]} calls")
    ok = beside[0] >= 0.8 * alone[0] and beside[2] <= 1.2 * alone[2] and alone[4] == beside[4] == ALICE_JOBS
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
