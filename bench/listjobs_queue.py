"""Another tenant's deep queue must not slow alice's reads: ListJobs alone, then beside 20,000 of
bob's jobs that fit but must wait (issue 30, item 15).

Starts a real etcd and one `gpufed serve` (scheduler and reconcilers running, as in production;
reads not rate-limited, so that what is measured is the cost of a read and not the limit) over one
in-process simulated cluster of 4 x 8 A100. Alice's tenant holds 83 jobs that ask for a GPU type no
cluster has, so hers never change. Her ListJobs (one page of up to 100, several calls in flight) is
measured alone; then bob submits 20,000 gangs of 8 A100 that run 2 s each: they all fit, four run at
a time, and the rest wait, so the placer plans over the whole queue each time one ends. Her lists
are measured again beside that queue, in the same run, and the two compared.

Servers alike but for bob's queue are measured in turns of half a second (A B B A ...), so that
whatever else loads the machine weighs on every figure alike. Five federations, each on an etcd of
its own: one `all` server with no queue (alice alone), with 400 of bob's jobs queued, and with the
full queue; and a split deployment (docs/deploy.md, "Splitting the API from the scheduler": a
`--role scheduler` server that leads and a `--role api` server that alice and bob call), with no
queue and with the full one.

Where the time went (py-spy of the queue's server while alice listed): the placer's plan over the
queue, on a worker thread, held the GIL for CPython's whole 5 ms switch interval at a time while the
event loop, with every API call on it, waited for it, several times per call; and every reconciler
tick walked all 20,000 live jobs three times on the event loop (the in-flight filter, the clusters
refusing dispatches, staging's pins), though it acts only on jobs past the queue. Now the server
sets a 0.5 ms switch interval, and the tick reads the job cache's acting jobs (past the queue, or
queued with a cancel request or a refusal on record). 2026-11-29, this 2-core machine shared with
other work (load 10 to 18), `--concurrency 1 --seconds 15`, 20,000 jobs:

| | alone p50 / p99 | beside the queue p50 / p99 | p50 ratio | p99 ratio |
|---|---|---|---|---|
| before | 3.7 / 12.0 ms | 3.5 / 28.3 ms | 0.95 | 2.36 |
| before, again | 4.1 / 15.0 ms | 4.5 / 22.9 ms | 1.10 | 1.53 |
| 0.5 ms switch interval | 4.4 / 22.5 ms | 4.7 / 33.3 ms | 1.07 | 1.48 |
| and the tick's acting jobs | 4.0 / 17.7 ms | 4.1 / 23.0 ms | 1.00 | 1.30 |
| the same, again | 4.0 / 15.2 ms | 4.1 / 21.5 ms | 1.04 | 1.41 |

Run to run the p99 ratio moves by as much as the change (the machine's other load), so read these
as a range: 1.5 to 2.4 before, 1.3 to 1.4 after, p50 unchanged beside the queue. What is left is
the plan's CPU itself (1.4 to 1.7 s a cycle here, a quarter of the time, on the same two cores):
planning in a process of its own would take it off the API's core.

2026-11-30: a third server with the same running jobs and churn but 400 queued tells the queue's
depth apart from bob's running work (`*_deep_to_shallow`). The cycle's walks of the queue moved off
the event loop, it steps aside while calls are in flight (`federation.scheduling.yielding`), equal
gangs share one decision (`placement.plan`), and the heap is frozen as the cache grows
(`federation.runtime.heap`). A cycle over the 20,000 went from 1.4 to 1.7 s of wall to about 0.2 s,
and its CPU (`placer_cycle_cpu_ms_beside_queue`) is 100 to 160 ms here (47 ms offline for the same
queue). Quiet machine (load 2 to 3), `--concurrency 1 --seconds 15`, six runs:

| | alone p99 | beside 400 p99 | beside 20,000 p99 | p99 ratio | deep to shallow | p50 ratio | lists/s ratio |
|---|---|---|---|---|---|---|---|
| before the heap freeze (3 runs) | 4.1 to 5.3 ms | 4.2 to 5.4 ms | 5.5 to 7.5 ms | 1.03 to 1.81 | 1.02 to 1.67 | 0.99 to 1.03 | 0.85 to 1.02 |
| with it (3 runs) | 3.8 to 4.4 ms | 4.4 to 5.0 ms | 7.7 to 8.0 ms | 1.81 to 2.02 | 1.61 to 1.76 | 1.01 to 1.04 | 0.83 to 0.87 |

The p99 beside the deep queue is 6 to 8 ms, against 21 to 23 ms at the start of the day and 19 ms
in the issue; p50 does not move. But the p99 ratio is still 1.0 to 2.0: what remains is the
cycle's own CPU on the same two cores and the GIL, about 10% of it at one cycle a second. The heap
freeze removes the garbage collector's 40 ms pauses (a probe thread's worst wake-up beside a cycle,
44 ms to 3 ms), which touch the slowest calls, not the p99.

2026-11-30, later: the split (`gpufed serve --role`). The `api` server takes no part in the
election and runs no loop that acts on jobs, so the plan takes none of its GIL. Beside 10,000 of
bob's queued jobs its etcd saw about 4 revisions a second once the first wait reasons were written,
and the idle api server used 0.1 to 0.4 % of a core: the queue costs it next to nothing. Three runs
on this 2-core machine shared with other agents (load 15 to 25), `--concurrency 1 --seconds 15`:

| run | `all` alone p99 | `all` beside 20,000 p99 | ratio | `api` alone p99 | `api` beside 20,000 p99 | ratio | lists/s beside, `all` / `api` |
|---|---|---|---|---|---|---|---|
| 1 | 21.2 ms | 44.1 ms | 2.08 | 11.2 ms | 13.7 ms | 1.22 | 286 / 465 |
| 2 | 11.6 ms | 18.5 ms | 1.59 | 11.0 ms | 15.5 ms | 1.41 | 390 / 437 |
| 3 | 11.1 ms | 25.5 ms | 2.29 | 11.3 ms | 15.6 ms | 1.38 | 351 / 441 |

p50 did not move (1.4 ms, ratios 1.00 to 1.06). Beside the queue, the api server's p99 was 14 to 16
ms where the `all` server's was 19 to 44 ms, and it answered 12 to 63 % more lists a second. What
the split leaves (its ratio 1.2 to 1.4) is the cores: here the scheduler process plans on the same
two cores as the api server and everyone else's work, and the OS, not the GIL, shares them out. In a
deployment the two are pods with CPU of their own (the chart's `scheduler.separate`). (The `% of a
core` lines divide a process's CPU by every server's turns; they divided by two of three before.)

Quiet machine (load 2 to 3, 2026-11-30, at the end of the day), the same command, one run: one `all`
server, p99 4.89 ms alone and 8.40 ms beside bob's 20,000 (ratio 1.72; beside 400 queued 5.74 ms,
deep to shallow 1.46), p50 1.41 and 1.45 ms, placer cycle 186 ms (110 ms CPU); the split, api
server alone 5.31 ms and beside the scheduler planning the 20,000 5.10 ms (ratio 0.96; 1.04 against
the `all` server alone), p50 1.40 and 1.41 ms, 605 and 606 lists a second, the scheduler's cycle
156 ms (99 ms CPU). With cores to spare, the split leaves nothing of the queue in the other tenant's
reads; one server still shows the plan's share of its process in the p99.

    python bench/listjobs_queue.py            # 20,000 of bob's jobs, 20 s measured per server
    python bench/listjobs_queue.py --quick    # 3,000 of bob's jobs, 2.5 s per server (under a minute)
    python bench/listjobs_queue.py --concurrency 1 --seconds 15   # the figures above

Prints `figure_name: value unit` lines at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import server_metrics  # noqa: E402
from bench.isolation_load import CONFIG, _cpu_seconds, _measure, _submit_many  # noqa: E402
from datasync.loopback_ports import free_port  # noqa: E402
from federation.runtime.etcd_process import EtcdProcess  # noqa: E402
from tests.e2e.harness import ServerProcess  # noqa: E402

# CONFIG (imported): the same three tenants and one private cluster as the isolation benchmark.
ALICE_MANIFEST = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: NAME}
spec:
  gpuTypes: [H200]
  tasks:
    - {name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 8}
"""

# Fits the cluster (one node), so it waits only for room: the placer plans it every cycle.
BOB_MANIFEST = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: NAME, annotations: {sim.gpufed.io/duration: "2s"}}
spec:
  gpuTypes: [A100]
  tasks:
    - {name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 8}
"""

ALICE_JOBS = 83
BOB_JOBS = 20_000
# The third server's queue: deep enough to keep its cluster busy through the run (two of bob's jobs
# end each second), shallow next to the full one. It runs the same jobs with the same churn, so that
# the two differ only in the queue's depth.
SHALLOW_JOBS = 400
QUICK_JOBS = 3_000
QUICK_SECONDS = 2.5


@dataclass
class Federation:
    """One etcd and its servers: one `all` server as today, or a split deployment's `--role
    scheduler` server (which leads) and `--role api` server (which the clients call)."""

    etcd: EtcdProcess
    servers: list[ServerProcess]
    # The HTTP port of the first server, the one that leads (its scheduling cycles).
    metrics_port: int

    @property
    def leader(self) -> ServerProcess:
        return self.servers[0]

    @property
    def front(self) -> ServerProcess:
        """Where the clients call: the api server of a split, else the one server."""
        return self.servers[-1]

    def token(self, user: str) -> str:
        """The user's token, from the state dir of the server that bootstrapped the config first."""
        (path,) = [p for s in self.servers if (p := s.state_dir / "tokens" / f"{user}.token").exists()]
        return path.read_text().strip()

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()
        self.etcd.stop()


def _federation(tmp_path: Path, name: str, *, split: bool) -> Federation:
    """The etcd started (here, on the calling thread: etcd dies with the thread that started it) and
    the servers made, not started; reads not rate-limited, so what is measured is a read's cost."""
    config = tmp_path / name / "federation.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIG)
    etcd = EtcdProcess(tmp_path / name / "etcd")
    etcd.start()
    metrics_port = free_port()
    roles = (("scheduler", "--role", "scheduler"), ("api", "--role", "api")) if split else (("all",),)
    servers = [
        ServerProcess(
            etcd.endpoint,
            tmp_path / name / f"state-{role}",
            config=config,
            identity=f"{name}-{role}",
            extra_args=(
                "--read-rate-per-s",
                "0",
                *flags,
                *(("--metrics-port", str(metrics_port)) if i == 0 else ()),
            ),
        )
        for i, (role, *flags) in enumerate(roles)
    ]
    return Federation(etcd, servers, metrics_port)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3,000 of bob's jobs, 2.5 s per server")
    parser.add_argument("--seconds", type=float, default=None, help="measured time per server")
    parser.add_argument("--slice", type=float, default=0.5, help="seconds per turn of the A B B A order")
    parser.add_argument("--jobs", type=int, default=None, help="bob's jobs (default 20,000)")
    parser.add_argument("--concurrency", type=int, default=4, help="alice's lists in flight")
    args = parser.parse_args()
    seconds = args.seconds or (QUICK_SECONDS if args.quick else 20.0)
    jobs = args.jobs or (QUICK_JOBS if args.quick else BOB_JOBS)
    began = time.monotonic()
    feds: list[Federation] = []
    with tempfile.TemporaryDirectory(prefix="gpufed-listjobs-queue-") as tmp:
        tmp_path = Path(tmp)
        try:
            # Three federations of one `all` server, alike but for bob's queue (none, 400, the full
            # one), and two split ones (a scheduler server and an api server), without a queue and
            # with the full one.
            shapes = (
                ("quiet", False),
                ("shallow", False),
                ("queue", False),
                ("split-quiet", True),
                ("split", True),
            )
            for name, split in shapes:
                feds.append(_federation(tmp_path, name, split=split))
            # Started side by side: each start is seconds of a process's CPU, none waits on another.
            with ThreadPoolExecutor(7) as pool:
                list(pool.map(ServerProcess.start, [s for fed in feds for s in fed.servers]))
            _, shallow, noisy, _, split_fed = feds
            noisy_proc, api_proc, scheduler_proc = (
                noisy.leader.proc,
                split_fed.front.proc,
                split_fed.leader.proc,
            )
            assert noisy_proc is not None
            assert api_proc is not None
            assert scheduler_proc is not None
            alice = ALICE_MANIFEST.replace("NAME", "alice")
            # Through the api server of the split, as its clients submit.
            for fed in feds:
                _submit_many(fed.front.target, fed.token("alice"), alice, ALICE_JOBS, 8)
            bob = BOB_MANIFEST.replace("NAME", "bob")
            _submit_many(shallow.front.target, shallow.token("bob"), bob, SHALLOW_JOBS, 16)
            submit_began = time.monotonic()
            with ThreadPoolExecutor(2) as pool:
                to_all = pool.submit(_submit_many, noisy.front.target, noisy.token("bob"), bob, jobs, 16)
                to_split = pool.submit(
                    _submit_many, split_fed.front.target, split_fed.token("bob"), bob, jobs, 16
                )
                accepted, accepted_split = to_all.result(), to_split.result()
            submit_s = time.monotonic() - submit_began
            # The first cycles over the new queue write every job's first wait reasons: let them pass.
            time.sleep(min(10.0, 2.0 + jobs / 2_000))
            print(f"bob's {accepted} and {accepted_split} jobs in; measuring", file=sys.stderr, flush=True)
            processes = {
                "all": noisy_proc.pid,
                "split_api": api_proc.pid,
                "split_scheduler": scheduler_proc.pid,
            }
            cycles_before = server_metrics.cycles(noisy.metrics_port)
            split_cycles_before = server_metrics.cycles(split_fed.metrics_port)
            cpu_before = {name: _cpu_seconds(pid) for name, pid in processes.items()}
            targets = [(fed.front.target, fed.token("alice")) for fed in feds]
            alone, churn, beside, split_alone, split_beside = _measure(
                targets, args.concurrency, seconds, args.slice
            )
            measured_s = len(targets) * max(1, round(seconds / args.slice)) * args.slice
            cpu_share = {
                name: (_cpu_seconds(pid) - cpu_before[name]) / measured_s for name, pid in processes.items()
            }
            cycles_after = server_metrics.cycles(noisy.metrics_port)
            split_cycles_after = server_metrics.cycles(split_fed.metrics_port)
        finally:
            for fed in feds:
                fed.stop()
    cycles, cycle_s, cycle_cpu_s = _per_cycle(cycles_before, cycles_after)
    split_cycles, split_cycle_s, split_cycle_cpu_s = _per_cycle(split_cycles_before, split_cycles_after)
    print(
        f"alice: {ALICE_JOBS} jobs; one page each, {args.concurrency} in flight, {seconds:.0f} s per server"
    )
    print(
        f"bob: {accepted} and {accepted_split} of {jobs} jobs accepted in {submit_s:.1f} s "
        "(gangs of 8 A100 running 2 s each)"
    )
    print(f"queue's server while measured: {cycles:.0f} placer cycles of {cycle_s * 1e3:.0f} ms on average, ")
    print(f"  {100 * cpu_share['all']:.0f}% of a core")
    print(
        f"split: the scheduler {split_cycles:.0f} cycles of {split_cycle_s * 1e3:.0f} ms, "
        f"{100 * cpu_share['split_scheduler']:.0f}% of a core; the api server "
        f"{100 * cpu_share['split_api']:.0f}% of a core"
    )
    measured = (
        ("alone", alone),
        ("beside a shallow queue", churn),
        ("beside", beside),
        ("split, api server alone", split_alone),
        ("split, api server beside", split_beside),
    )
    for name, m in measured:
        print(
            f"{name}: {m[0]:.0f} lists/s, p50 {m[1] * 1e3:.1f} ms, p99 {m[2] * 1e3:.1f} ms, "
            f"errors {m[3]}, {m[4]} jobs each"
        )
    print(f"run: {time.monotonic() - began:.0f} s")
    print(f"listjobs_p50_ms_alone: {alone[1] * 1e3:.2f} ms")
    print(f"listjobs_p99_ms_alone: {alone[2] * 1e3:.2f} ms")
    print(f"listjobs_p50_ms_beside_queue: {beside[1] * 1e3:.2f} ms")
    print(f"listjobs_p99_ms_beside_queue: {beside[2] * 1e3:.2f} ms")
    print(f"listjobs_p50_ratio: {beside[1] / alone[1]:.2f} ratio")
    print(f"listjobs_p99_ratio: {beside[2] / alone[2]:.2f} ratio")
    print(f"listjobs_per_s_ratio: {beside[0] / alone[0]:.2f} ratio")
    # The queue's depth alone: the same running jobs and churn, 400 queued against the full queue.
    print(f"listjobs_p99_ms_beside_shallow_queue: {churn[2] * 1e3:.2f} ms")
    print(f"listjobs_p50_ratio_deep_to_shallow: {beside[1] / churn[1]:.2f} ratio")
    print(f"listjobs_p99_ratio_deep_to_shallow: {beside[2] / churn[2]:.2f} ratio")
    print(f"placer_cycle_ms_beside_queue: {cycle_s * 1e3:.0f} ms")
    print(f"placer_cycle_cpu_ms_beside_queue: {cycle_cpu_s * 1e3:.0f} ms")
    # The split: alice through an `--role api` server while a `--role scheduler` one plans bob's queue.
    print(f"listjobs_p50_ms_split_api_alone: {split_alone[1] * 1e3:.2f} ms")
    print(f"listjobs_p99_ms_split_api_alone: {split_alone[2] * 1e3:.2f} ms")
    print(f"listjobs_p50_ms_split_api_beside_queue: {split_beside[1] * 1e3:.2f} ms")
    print(f"listjobs_p99_ms_split_api_beside_queue: {split_beside[2] * 1e3:.2f} ms")
    print(f"listjobs_p50_ratio_split: {split_beside[1] / alone[1]:.2f} ratio")
    print(f"listjobs_p99_ratio_split: {split_beside[2] / alone[2]:.2f} ratio")
    print(f"listjobs_per_s_ratio_split: {split_beside[0] / alone[0]:.2f} ratio")
    # The queue's effect within the split: its api server beside the queue against one with none.
    print(f"listjobs_p50_ratio_split_to_split_alone: {split_beside[1] / split_alone[1]:.2f} ratio")
    print(f"listjobs_p99_ratio_split_to_split_alone: {split_beside[2] / split_alone[2]:.2f} ratio")
    print(f"placer_cycle_ms_split_scheduler: {split_cycle_s * 1e3:.0f} ms")
    print(f"placer_cycle_cpu_ms_split_scheduler: {split_cycle_cpu_s * 1e3:.0f} ms")
    print(f"split_api_server_cpu_share: {100 * cpu_share['split_api']:.0f} percent")
    print(f"split_scheduler_cpu_share: {100 * cpu_share['split_scheduler']:.0f} percent")
    errors = sum(m[3] for _, m in measured)
    print(f"listjobs_errors: {errors} calls")
    ok = all(m[4] == ALICE_JOBS for _, m in measured) and errors == 0 and split_cycles > 0
    return 0 if ok else 1


def _per_cycle(
    before: tuple[float, float, float], after: tuple[float, float, float]
) -> tuple[float, float, float]:
    """Cycles between two reads of `cycles`, and their average seconds and CPU seconds."""
    cycles = after[0] - before[0]
    if not cycles:
        return 0.0, 0.0, 0.0
    return cycles, (after[1] - before[1]) / cycles, (after[2] - before[2]) / cycles


if __name__ == "__main__":
    sys.exit(main())
