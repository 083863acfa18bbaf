"""How much a move back from the cloud could save: private GPUs idle while cloud gangs that fit run.

    .venv/bin/python bench/repatriate_potential.py --week 2017-11-20 --size 0.75 --policy gpufed

Replays one week under one policy (no moves) and, after every step of the simulator, packs the
running cloud gangs (dearest first, best fit, on a type the job accepts) into the private GPUs that
are idle, skipping room a queued job of that type could take now. It integrates over time:

- `idle_private_gpu_h_<type>`: idle private GPU-hours of a type while a fitting cloud gang ran;
- `fitting_cloud_usd`: the cloud dollars those fitting gangs spent meanwhile (instantaneous measure);
- `first_fit_remaining_usd`: for each cloud gang that ever fits, its cloud cost from the first moment
  it fits to its end (what a move at that moment would avoid, before overhead; room conflicts
  between gangs ignored, so an upper bound of the moves' saving).

`--move` turns the probe into an oracle that moves every fitting gang at once (at any event, not
only at cycles, with `--overhead-s` of lost progress): what repatriation could do at best.
`--rate` replaces gpufed's seconds of wait per GPU-hour. A measuring tool, not a benchmark with
headline figures: docs/results/README.md (third round) quotes its output.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from federation.replay.config import ReplayConfig, load_config  # noqa: E402
from federation.replay.policies import PolicySpec, policies  # noqa: E402
from federation.replay.sim import Simulator, best_fit  # noqa: E402
from federation.replay.sweep import load_inputs, world_for  # noqa: E402
from federation.replay.trace import TraceJob  # noqa: E402
from federation.replay.world import World  # noqa: E402
from placement.model import GpuType, JobId  # noqa: E402


def _fit(nodes: list[int], replicas: tuple[int, ...]) -> bool:
    return best_fit(nodes, replicas) is not None


class Probe(Simulator):
    def __init__(
        self, config: ReplayConfig, world: World, policy: PolicySpec, jobs: Sequence[TraceJob]
    ) -> None:
        super().__init__(config, world, policy, jobs)
        self.last_t: float | None = None
        self.idle_gpu_h: dict[str, float] = {}
        self.fit_usd = 0.0
        self.first_fit: dict[str, float] = {}
        self.rates: list[tuple[str, float, float]] = []  # (type, gpus, usd/h) fitting at the last step
        self.move = False
        self.moves = 0
        self.overhead_s = 0.0

    def _after_step(self, now: float) -> None:
        if self.last_t is not None and now > self.last_t:
            dt_h = (now - self.last_t) / 3600.0
            for gpu_type, gpus, usd in self.rates:
                self.idle_gpu_h[gpu_type] = self.idle_gpu_h.get(gpu_type, 0.0) + gpus * dt_h
                self.fit_usd += usd * dt_h
        self.last_t = now
        self.rates = []
        private = [p for p in self.pools if p.is_private]
        free = {p.gpu_type: list(self.free[(p.cluster, p.name)]) for p in private}
        # Room a queued job could take now is not free for a move.
        for request in self.queue.values():
            for gpu_type in request.gpu_types:
                if gpu_type in free:
                    _fit(free[gpu_type], request.replica_gpus)
                    break
        cloud = [
            (run.pool.usd_per_gpu_hour * run.gang.gpu_count, job_id, run)
            for job_id, run in self.running.items()
            if not run.pool.is_private and run.start_s <= now and not run.leaving
        ]
        cloud.sort(key=lambda c: (-c[0], c[1]))
        for usd_h, job_id, run in cloud:
            job = self.jobs[job_id]
            for gpu_type in job.gpu_types:
                if gpu_type in free and _fit(free[gpu_type], job.replica_gpus(8)):
                    self.rates.append((gpu_type, float(job.num_gpus), usd_h))
                    if job_id not in self.first_fit:
                        self.first_fit[job_id] = usd_h * (run.finish_s - now) / 3600.0
                    if self.move:
                        self._oracle_move(job_id, run, gpu_type, now)
                    break

    def _oracle_move(self, job_id: JobId, run: Any, gpu_type: GpuType, now: float) -> None:
        # Not the simulator's own `_move` (a planned `Move`, with its checks): the oracle move stop the cloud run now, restart the rest of the work on private GPUs.
        job = self.jobs[job_id]
        done = (now - run.start_s) * self.config.speed(run.pool.gpu_type)
        remaining = job.duration_s - done + self.overhead_s
        if remaining <= 0:
            return
        self._end(job_id, run, now, completed=False)
        moved = dataclasses.replace(job, duration_s=remaining, gpu_types=(gpu_type,))
        self.jobs[job_id] = moved
        request = self._request(moved, run.gang.queued_at_s)
        self.queue[job_id] = request
        pool = next(p for p in self.pools if p.is_private and p.gpu_type == gpu_type)
        assert self._start(request, pool, now)
        self.moves += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--week", default="2017-11-20")
    parser.add_argument("--size", type=float, default=0.75)
    parser.add_argument("--policy", default="gpufed")
    parser.add_argument("--move", action="store_true", help="carry out every move at once (oracle)")
    parser.add_argument("--overhead-s", type=float, default=0.0)
    parser.add_argument(
        "--rate", type=float, default=0.0, help="gpufed's s per GPU-hour instead of the config's"
    )
    args = parser.parse_args()
    config = load_config(ROOT / "bench" / "replay.yaml")
    trace = config.trace_path.parent / f"philly_week_{args.week}.csv.gz"
    config = dataclasses.replace(config, trace_path=trace)
    spec = next(p for p in policies(config) if p.name == args.policy)
    if args.rate and spec.gpufed is not None:
        spec = dataclasses.replace(
            spec, gpufed=dataclasses.replace(spec.gpufed, private_wait_s_per_gpu_hour=args.rate)
        )
    inputs = load_inputs(config)
    world = world_for(config, inputs, args.size)
    probe = Probe(config, world, spec, inputs.jobs)
    probe.move, probe.overhead_s = args.move, args.overhead_s
    result = probe.run()
    cloud = sum(i.cost_usd for i in result.intervals)
    tag = f"{args.week}_{args.policy}_{args.size:g}x"
    print(f"cloud_usd_{tag}: {cloud:.0f} USD")
    for gpu_type, gpu_h in sorted(probe.idle_gpu_h.items()):
        print(f"idle_private_gpu_h_{gpu_type}_{tag}: {gpu_h:.0f} GPU-h")
    print(f"fitting_cloud_usd_{tag}: {probe.fit_usd:.0f} USD")
    print(f"first_fit_remaining_usd_{tag}: {sum(probe.first_fit.values()):.0f} USD")
    print(f"gangs_that_fit_{tag}: {len(probe.first_fit)} gangs")
    done = [o for o in result.outcomes.values() if o.finish_s is not None]
    jct = sum(o.finish_s - o.job.submit_time_s for o in done if o.finish_s is not None) / len(done) / 3600.0
    print(f"avg_jct_{tag}: {jct:.3f} h ({len(done)} of {len(result.outcomes)} finished)")
    print(f"moves_{tag}: {probe.moves} moves")


if __name__ == "__main__":
    main()
