"""`gpufed logs` against `kubectl logs -f`: throughput through the federation, and follow delay.

Starts a real etcd, the simulator as its own process (one cluster, its kubelet printing a progress
line every `logIntervalS`) and `gpufed serve` as another. Then:

1. Throughput. A one-replica job prints about 2,000 lines a second; once its log holds a backlog,
   `kubectl logs -f` (the real binary, on the simulated cluster directly) and a gpufed client
   (StreamLogs with follow, through the server) each read it; lines per second are counted from the
   first line to the N-th, so that neither's process start is in the figure. Taken in turns
   (kubectl, gpufed, kubectl, gpufed ...) and the medians compared: `logs_ratio_to_kubectl`. The
   backlog is what the simulated runtime keeps of a run (its last MiB), about 15,000 lines.
2. Follow delay. 100 followers at once (two tenants of 50, within the default per-tenant limit of
   64), each on a job that prints 20 lines a second, with timestamps: the delay of each line from
   its write (its RFC 3339 stamp) to its arrival at the client; `follow_p99_delay_ms`.

    python bench/logs.py            # the backlog (about 15,000 lines), 11 rounds; 100 followers for 10 s
    python bench/logs.py --quick    # the same backlog, 5 rounds; 100 followers for 4 s (within a minute)

Prints `figure: value unit` lines at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clusters.logtext import split_stamp, stamp_s  # noqa: E402
from federation.api.client import GpufedClient  # noqa: E402
from federation.api.v1 import gpufed_pb2 as pb  # noqa: E402
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc  # noqa: E402
from federation.runtime.etcd_process import EtcdProcess  # noqa: E402
from federation.runtime.sim_process import SimProcess  # noqa: E402
from tests.e2e.harness import ServerProcess, wait_for  # noqa: E402

KUBECTL = str(ROOT / ".venv" / "bin" / "kubectl")
POOL = {
    "name": "a100",
    "gpuType": "A100",
    "kind": "private",
    "usdPerGpuHour": 1.1,
    "gpusPerNode": 8,
    "nodes": 2,
}
FAST = {"name": "fast", "provider": "private", "region": "dc1", "logIntervalS": 0.0005, "pools": [POOL]}
# The followers' jobs ask for H100, which only this cluster has.
SLOW = {
    "name": "slow",
    "provider": "private",
    "region": "dc2",
    "logIntervalS": 0.05,
    "pools": [{**POOL, "name": "h100", "gpuType": "H100"}],
}


def manifest(name: str, gpu: str = "A100") -> str:
    return (
        "apiVersion: gpufed.io/v1\nkind: TrainingJob\n"
        f'metadata:\n  name: {name}\n  annotations:\n    sim.gpufed.io/duration: "600s"\n'
        f"spec:\n  gpuTypes: [{gpu}]\n"
        f'  tasks:\n    - {{name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}}\n'
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def kubectl_rate(kubeconfig: Path, context: str, namespace: str, pod: str, lines: int) -> float:
    """Lines a second of `kubectl logs -f`, first line to the `lines`-th."""
    command = [KUBECTL, "--kubeconfig", str(kubeconfig), "--context", context, "-n", namespace]
    proc = subprocess.Popen([*command, "logs", "-f", pod], stdout=subprocess.PIPE, bufsize=1 << 20)
    assert proc.stdout is not None
    first = 0.0
    count = 0
    try:
        for _ in proc.stdout:
            count += 1
            if count == 1:
                first = time.perf_counter()
            if count >= lines:
                break
        return (count - 1) / (time.perf_counter() - first)
    finally:
        proc.kill()
        proc.wait()


def backlog_lines(kubeconfig: Path, context: str, namespace: str, pod: str) -> int:
    command = [KUBECTL, "--kubeconfig", str(kubeconfig), "--context", context, "-n", namespace, "logs", pod]
    return subprocess.run(command, capture_output=True, check=True, timeout=30).stdout.count(b"\n")


def gpufed_rate(target: str, token: str, job_id: str, lines: int) -> float:
    with GpufedClient(target, token) as client:
        stream = client.logs(pb.StreamLogsRequest(job_id=job_id, follow=True))
        first = 0.0
        count = 0
        try:
            for chunk in stream:
                if not chunk.lines:
                    continue
                if count == 0:
                    first = time.perf_counter()
                count += len(chunk.lines)
                if count >= lines:
                    break
            return (
                (count - len(chunk.lines)) / (time.perf_counter() - first)
                if count > len(chunk.lines)
                else 0.0
            )
        finally:
            stream.cancel()


async def follow_delays(
    target: str, tokens: dict[str, str], jobs: dict[str, str], followers: int, seconds: float
) -> tuple[list[float], int]:
    """Delays (ms) of every line the followers saw during `seconds`, and how many streams failed."""
    delays: list[float] = []
    failed = 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.LogsStub(channel)

        async def one(user: str) -> None:
            nonlocal failed
            request = pb.StreamLogsRequest(job_id=jobs[user], follow=True, timestamps=True, tail_lines=0)
            call = stub.StreamLogs(request, metadata=(("authorization", f"Bearer {tokens[user]}"),))
            end = time.time() + seconds
            try:
                async for chunk in call:
                    now = time.time()
                    for line in chunk.lines:
                        at = stamp_s(split_stamp(line)[0])
                        if at is not None:
                            delays.append((now - at) * 1000.0)
                    if now >= end:
                        break
            except grpc.aio.AioRpcError:
                failed += 1
            finally:
                call.cancel()

        users = sorted(tokens)
        await asyncio.gather(*(one(users[i % len(users)]) for i in range(followers)))
    return delays, failed


def _pod_of(kubeconfig: Path, context: str, job_id: str) -> tuple[str, str]:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    with k8s_config.new_client_from_config(config_file=str(kubeconfig), context=context) as api:
        pods = k8s.CoreV1Api(api).list_pod_for_all_namespaces(label_selector=f"gpufed.io/job-id={job_id}")
        pod = pods.items[0]
        return pod.metadata.namespace, pod.metadata.name


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    lines, rounds, follow_s, followers = (15000, 5, 4.0, 100) if args.quick else (15000, 11, 10.0, 100)
    figures: dict[str, tuple[float, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        etcd = EtcdProcess(work / "etcd")
        etcd.start()
        sims = SimProcess(work / "sim", [FAST, SLOW])
        sims.start()
        clusters = [
            {**{k: v for k, v in c.items() if k != "logIntervalS"}, "backend": "kubernetes",
             "kubeconfig": str(sims.kubeconfig), "context": c["name"]}
            for c in (FAST, SLOW)
        ]  # fmt: skip
        config = {
            "tenants": [{"name": "platform"}, {"name": "vision"}, {"name": "audio"}],
            "users": [
                {"name": "admin", "tenant": "platform", "role": "admin"},
                {"name": "alice", "tenant": "vision"},
                {"name": "bob", "tenant": "audio"},
            ],
            "clusters": clusters,
        }
        (work / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        server = ServerProcess(etcd.endpoint, work / "state", config=work / "federation.yaml")
        server.start()
        try:
            tokens = {
                u: (server.state_dir / "tokens" / f"{u}.token").read_text().strip() for u in ("alice", "bob")
            }
            with server.client("alice") as alice:
                fast = alice.submit(manifest("fast")).job_id
                slow_a = alice.submit(manifest("follow-a", "H100")).job_id
            with server.client("bob") as bob:
                slow_b = bob.submit(manifest("follow-b", "H100")).job_id
            for user, job in (("alice", fast), ("alice", slow_a), ("bob", slow_b)):
                with server.client(user) as c:
                    wait_for(lambda c=c, job=job: c.get(job).phase == pb.JOB_PHASE_RUNNING, timeout_s=60)
            # Let the fast job's log fill: the reads below drain a backlog as fast as they can.
            time.sleep(lines / 2000.0 + 1.0)
            namespace, pod = _pod_of(sims.kubeconfig, "fast", fast)
            # Read no further than the backlog (the runtime keeps the last MiB of a run): past it,
            # both readers would wait for new lines and measure the writer instead.
            backlog = backlog_lines(sims.kubeconfig, "fast", namespace, pod)
            lines = min(lines, int(backlog * 0.9))
            figures["backlog_lines"] = (float(lines), "lines")
            kube_rates: list[float] = []
            fed_rates: list[float] = []
            for _ in range(rounds):
                kube_rates.append(kubectl_rate(sims.kubeconfig, "fast", namespace, pod, lines))
                fed_rates.append(gpufed_rate(server.target, tokens["alice"], fast, lines))
            kube = statistics.median(kube_rates)
            fed = statistics.median(fed_rates)
            figures["kubectl_lines_per_s"] = (kube, "lines/s")
            figures["gpufed_lines_per_s"] = (fed, "lines/s")
            figures["logs_ratio_to_kubectl"] = (fed / kube, "ratio")
            delays, failed = asyncio.run(
                follow_delays(server.target, tokens, {"alice": slow_a, "bob": slow_b}, followers, follow_s)
            )
            figures["followers"] = (float(followers), "streams")
            figures["follow_streams_failed"] = (float(failed), "streams")
            figures["follow_lines"] = (float(len(delays)), "lines")
            figures["follow_p50_delay_ms"] = (percentile(delays, 0.5), "ms")
            figures["follow_p99_delay_ms"] = (percentile(delays, 0.99), "ms")
        finally:
            server.stop()
            sims.stop()
            etcd.stop()
    for name, (value, unit) in figures.items():
        print(f"{name}: {value:.3f} {unit}" if value < 100 else f"{name}: {value:.0f} {unit}")
    ratio = figures["logs_ratio_to_kubectl"][0]
    p99 = figures["follow_p99_delay_ms"][0]
    print(f"thresholds: logs_ratio_to_kubectl >= 0.8 ({'ok' if ratio >= 0.8 else 'MISSED'}), "
          f"follow_p99_delay_ms < 500 ({'ok' if p99 < 500 else 'MISSED'})")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
