"""The simulator's control loop shares its event loop with every cluster of its process and their API
servers: it syncs a burst of Volcano Jobs a few a round (`SYNC_BATCH`) and hands the loop on between
rounds, as a real API server answers while its controllers work. `reconcile` still runs to quiescence
(the tests that call it rely on that), and no Job of a burst is left behind."""

from __future__ import annotations

import asyncio

from clusters.sim import ManualClock, SimPoolConfig, cluster
from clusters.sim.engine import Engine
from clusters.sim.jobs_volcano import SYNC_BATCH
from clusters.sim.resources import PODS, VOLCANO_JOBS
from clusters.sim.writes import Writes
from tests.unit.test_sim_edit import a_volcano_job

# More than three rounds of the controller (SYNC_BATCH is 16).
BURST = 53


def _engine() -> tuple[Engine, ManualClock]:
    clock = ManualClock()
    pools = [SimPoolConfig.of("a100", "A100", node_count=BURST)]
    return Engine(cluster("u", pools, default_duration_s=5), clock), clock


def _burst(engine: Engine) -> list[str]:
    names = [f"vj-{i:03d}" for i in range(BURST)]
    writes = Writes(engine)
    for name in names:
        writes.create(VOLCANO_JOBS, "default", a_volcano_job(name), {"fieldManager": "gpufed"})
    return names


def _jobs_with_pods(engine: Engine) -> set[str]:
    return {p["metadata"]["labels"]["volcano.sh/job-name"] for p in engine.store.list(PODS, "default")}


def test_reconcile_syncs_a_burst_larger_than_a_round_to_the_last_job() -> None:
    engine, _ = _engine()
    names = _burst(engine)
    engine.reconcile()
    assert _jobs_with_pods(engine) == set(names)


def test_jobs_left_for_the_next_round_go_before_newer_ones() -> None:
    engine, _ = _engine()
    names = _burst(engine)
    engine.volcano_jobs.sync()
    # A job whose name sorts first arrives after the first round: it waits behind those left.
    Writes(engine).create(VOLCANO_JOBS, "default", a_volcano_job("aaa-late"), {"fieldManager": "gpufed"})
    engine.volcano_jobs.sync()
    assert _jobs_with_pods(engine) == set(names[: 2 * SYNC_BATCH])
    engine.reconcile()
    assert _jobs_with_pods(engine) == {*names, "aaa-late"}


async def test_the_control_loop_hands_the_event_loop_on_between_rounds() -> None:
    engine, _ = _engine()
    _burst(engine)
    turns: list[int] = []

    async def neighbour() -> None:
        # Another cluster's API call, in effect: count how many Jobs had pods each time it ran.
        while len(turns) < 200:
            turns.append(len(_jobs_with_pods(engine)))
            await asyncio.sleep(0)

    loop_task = asyncio.create_task(engine.run())
    try:
        await asyncio.wait_for(neighbour(), timeout=30)
    finally:
        loop_task.cancel()
    # The neighbour ran while the burst was part done, not only before and after it.
    assert any(0 < seen < BURST for seen in turns), turns[:40]
    assert turns[-1] == BURST
