"""Sweeps through the real servicer over the in-memory store (as tests/unit/test_jobsets.py does for
sets): a Sweep becomes a set of trials held within its limit, each trial's job carries its values
in its environment and in its pods' params file, the results rank trials by the metric read from
their kept logs, and another tenant learns nothing of a sweep through any call."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CallRefused as Refused
from federation.joblogs.archive import KeptAttempt, LogArchive, LogsSettings
from federation.jobsets.records import set_key
from federation.jobsets.stopping import EarlyStopper
from federation.jobsets.store import PARAMS_ANNOTATION, PARAMS_DIR, PARAMS_VOLUME
from federation.store.jobs import JobRecord
from placement.model import JobPhase
from tests.unit import test_jobsets
from tests.unit.test_jobsets import World, counts, manifest

# The servicer over the in-memory store, with alice (vision), bob (nlp), an admin, infra and finance.
world = test_jobsets.world

GRID = {
    "parameters": {"lr": [0.1, 0.01], "batch": [32, 64]},
    "metric": {"name": "loss", "goal": "minimize"},
}


async def submit_sweep(w: World, who: str, name: str, sweep: dict[str, Any], **fields: Any) -> Any:
    return await w.submit(who, name, [manifest("trainer")], sweep=json.dumps(sweep), **fields)


async def results(w: World, who: str, name: str, tenant: str = "") -> pb.SweepResults:
    req = pb.GetJobSetRequest(name=name, tenant=tenant)
    return await w.service.GetSweepResults(req, w.ctx(who))


async def end_printing(w: World, job: JobRecord, phase: JobPhase, *lines: str) -> None:
    """The attempt ends with `lines` in its kept log tail, as the reconciler keeps it."""
    archive = LogArchive(w.store.kv, LogsSettings())
    data = "".join(f"2026-11-30T05:00:0{i}.000000000Z {line}\n" for i, line in enumerate(lines))
    kept = KeptAttempt(1, "onprem", "A100", "private", 1.0, 0.0, 1.0, phase.value, "", 1.0, "", ())
    await archive.keep(job.job_id, kept, {("worker", 0): data.encode()})
    await w.end(job.job_id, phase)


async def test_a_grid_sweep_holds_its_trials_within_the_limit_and_each_sees_its_values(world: World) -> None:
    reply = await submit_sweep(world, "alice", "lr-grid", GRID, max_parallel=2)
    assert reply.created
    assert reply.job_set.job_count == 4
    assert counts(reply.job_set) == {"HELD": 2, "QUEUED": 2}
    live = sorted(world.live("lr-grid"), key=lambda j: j.job_id)
    seen = []
    for job in live:
        env = dict(job.spec.tasks[0].env)
        assert env["SEED"] == "1"  # the template's own variables stay
        values = {"lr": float(env["GPUFED_PARAM_LR"]), "batch": int(env["GPUFED_PARAM_BATCH"])}
        template = json.loads(job.spec.tasks[0].template)
        # The same values in the file every container mounts (a downward API volume of the annotation).
        assert json.loads(template["metadata"]["annotations"][PARAMS_ANNOTATION]) == values
        (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == PARAMS_VOLUME]
        assert volume["downwardAPI"]["items"][0]["path"] == "params.json"
        mounts = template["spec"]["containers"][0]["volumeMounts"]
        assert {"name": PARAMS_VOLUME, "mountPath": PARAMS_DIR, "readOnly": True} in mounts
        seen.append((env["GPUFED_TRIAL"], values))
    assert sorted(seen) == [("0", {"lr": 0.1, "batch": 32}), ("1", {"lr": 0.1, "batch": 64})]


async def test_the_same_sweep_again_creates_nothing_and_another_under_its_name_is_refused(
    world: World,
) -> None:
    await submit_sweep(world, "alice", "lr-grid", GRID)
    again = await submit_sweep(world, "alice", "lr-grid", GRID)
    assert not again.created
    other = {**GRID, "parameters": {"lr": [0.1, 0.001], "batch": [32, 64]}}
    with pytest.raises(Refused) as refused:
        await submit_sweep(world, "alice", "lr-grid", other)
    assert refused.value.code is grpc.StatusCode.ALREADY_EXISTS


async def test_bad_sweeps_are_refused_naming_the_problem_and_store_nothing(world: World) -> None:
    cases = [
        ({**GRID, "parameters": {"lr": []}}, "sweep parameters.lr: values: give at least one value"),
        ({**GRID, "search": "hyperband"}, "sweep search: must be grid or random"),
        (
            {**GRID, "search": "random", "trials": 5, "parameters": {"lr": {"min": 1, "max": 0}}},
            "min 1 is greater than max 0",
        ),
    ]
    for sweep, words in cases:
        with pytest.raises(Refused) as refused:
            await submit_sweep(world, "alice", "bad", sweep)
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert words in refused.value.details
    with pytest.raises(Refused) as refused:
        await world.submit("alice", "bad", [manifest("trainer")], sweep="{not json")
    assert "sweep: not JSON" in refused.value.details
    with pytest.raises(Refused) as refused:
        await submit_sweep(world, "alice", "bad", GRID, array="0-3")
    assert "sweep: give exactly one manifest" in refused.value.details
    assert await world.store.kv.get(set_key("vision", "bad")) is None


async def test_results_rank_trials_by_the_metric_they_printed_and_list_the_rest_last(world: World) -> None:
    sweep = {**GRID, "metric": {"name": "accuracy", "goal": "maximize"}}
    await submit_sweep(world, "alice", "acc", sweep, max_parallel=3)
    first = {dict(j.spec.tasks[0].env)["GPUFED_TRIAL"]: j for j in world.live("acc")}
    await end_printing(world, first["0"], JobPhase.SUCCEEDED, "gpufed-metric: accuracy=0.7", "done")
    await end_printing(
        world, first["1"], JobPhase.SUCCEEDED, "gpufed-metric: accuracy=0.2", "gpufed-metric: accuracy=0.9"
    )
    await end_printing(world, first["2"], JobPhase.FAILED, "Traceback: CUDA out of memory")
    shown = await results(world, "alice", "acc")
    assert (shown.metric, shown.goal, shown.search) == ("accuracy", "maximize", "grid")
    order = [(t.rank, t.key, t.metric if t.HasField("metric") else None) for t in shown.trials]
    assert order == [(1, "trial-1", 0.9), (2, "trial-0", 0.7), (0, "trial-2", None), (0, "trial-3", None)]
    by_key = {t.key: t for t in shown.trials}
    assert [(p.name, p.value) for p in by_key["trial-1"].parameters] == [("lr", "0.1"), ("batch", "64")]
    assert by_key["trial-1"].phase == pb.JOB_PHASE_SUCCEEDED
    assert by_key["trial-2"].phase == pb.JOB_PHASE_FAILED
    assert by_key["trial-3"].held  # still held: released by the controller's next pass
    assert not shown.job_set.members  # the status without the member list
    assert shown.job_set.job_count == 4


async def test_another_tenant_learns_nothing_of_a_sweep_and_a_plain_set_has_no_results(world: World) -> None:
    await submit_sweep(world, "alice", "lr-grid", GRID)
    for tenant in ("", "vision"):
        with pytest.raises(Refused) as refused:
            await results(world, "bob", "lr-grid", tenant)
        assert refused.value.code is grpc.StatusCode.NOT_FOUND
        assert refused.value.details == "job set 'lr-grid' not found"
    with pytest.raises(Refused) as refused:
        await results(world, "fin", "lr-grid")
    assert refused.value.code is grpc.StatusCode.NOT_FOUND
    assert len((await results(world, "admin", "lr-grid", "vision")).trials) == 4
    assert len((await results(world, "ops", "lr-grid", "vision")).trials) == 4
    # bob's own sweep of the same name is his: his trials, none of alice's values or jobs.
    mine = await submit_sweep(world, "bob", "lr-grid", {**GRID, "parameters": {"lr": [5]}})
    assert mine.job_set.tenant == "nlp"
    assert [
        (t.key, [p.value for p in t.parameters]) for t in (await results(world, "bob", "lr-grid")).trials
    ] == [("trial-0", ["5"])]
    await world.submit("alice", "plain", [manifest()], array="0-1")
    with pytest.raises(Refused) as refused:
        await results(world, "alice", "plain")
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION


async def test_median_stopping_cancels_the_running_trial_that_loses_and_says_why(world: World) -> None:
    sweep = {
        "parameters": {"lr": [1, 2, 3, 4, 5]},
        "metric": {"name": "loss", "goal": "minimize"},
        "earlyStopping": {"type": "median", "minTrials": 2, "minStep": 1},
    }
    await submit_sweep(world, "alice", "stop-me", sweep)
    await submit_sweep(world, "alice", "no-stopping", GRID)  # no earlyStopping: never looked at
    trials = {dict(j.spec.tasks[0].env)["GPUFED_TRIAL"]: j for j in world.live("stop-me")}
    steps = [f"gpufed-metric: loss={v} step={s}" for s, v in [(1, 0.5), (2, 0.4), (3, 0.3)]]
    await end_printing(world, trials["0"], JobPhase.SUCCEEDED, *steps, "gpufed-metric: loss=0.3")
    await end_printing(world, trials["1"], JobPhase.SUCCEEDED, *[line.replace("0.", "0.1") for line in steps])
    # The running trials' live logs (the cluster's side is not under test here).
    live = {
        trials["2"].job_id: ["gpufed-metric: loss=0.9 step=1", "gpufed-metric: loss=0.8 step=2"],  # loses
        trials["3"].job_id: ["gpufed-metric: loss=0.2 step=2"],  # wins
        trials["4"].job_id: ["warming up"],  # nothing yet
    }
    read: list[str] = []

    async def live_lines(job: JobRecord) -> list[str] | None:
        read.append(job.job_id)
        return live.get(job.job_id)

    calls = world.service.job_sets
    assert calls is not None
    stopper = EarlyStopper(sets=calls.sets, store=world.store, cache=world.cache, live_lines=live_lines)
    assert await stopper.pass_once() == 1
    assert sorted(read) == sorted(live)  # only the sweep with earlyStopping, only its running trials
    # At step 2 the others stood at 0.4 (ended), 0.14 (ended) and 0.2 (running): median 0.2.
    stopped = await world.store.get_job(trials["2"].job_id)
    assert stopped is not None
    assert stopped.value.cancel_requested
    assert stopped.value.message == (
        "early stopping (median rule): 0.8 at step 2 is worse than the median 0.2 of 3 other trials at that step"
    )
    for key in ("3", "4"):
        left = await world.store.get_job(trials[key].job_id)
        assert left is not None
        assert not left.value.cancel_requested
    # Asked once: the next pass does not cancel it again.
    assert await stopper.pass_once() == 0
    await world.end(trials["2"].job_id, JobPhase.CANCELLED)
    shown = {t.key: t for t in (await results(world, "alice", "stop-me")).trials}
    assert shown["trial-2"].phase == pb.JOB_PHASE_CANCELLED
    assert shown["trial-2"].reason.startswith("early stopping (median rule)")


async def test_successive_halving_cancels_the_running_trial_outside_the_best_half_at_its_rung(
    world: World,
) -> None:
    sweep = {
        "parameters": {"lr": [1, 2, 3, 4, 5]},
        "metric": {"name": "loss", "goal": "minimize"},
        "earlyStopping": {"type": "successiveHalving", "minTrials": 2, "minStep": 1, "reductionFactor": 2},
    }
    await submit_sweep(world, "alice", "halve-me", sweep)
    trials = {dict(j.spec.tasks[0].env)["GPUFED_TRIAL"]: j for j in world.live("halve-me")}
    steps = [f"gpufed-metric: loss={v} step={s}" for s, v in [(1, 0.5), (2, 0.4), (3, 0.3)]]
    await end_printing(world, trials["0"], JobPhase.SUCCEEDED, *steps)
    await end_printing(
        world,
        trials["1"],
        JobPhase.SUCCEEDED,
        "gpufed-metric: loss=0.6 step=1",
        "gpufed-metric: loss=0.5 step=2",
    )
    live = {
        trials["2"].job_id: [
            "gpufed-metric: loss=0.9 step=1",
            "gpufed-metric: loss=0.8 step=2",
        ],  # loses at rung 2
        trials["3"].job_id: ["gpufed-metric: loss=0.2 step=2"],  # the best at rung 2
        trials["4"].job_id: ["warming up"],
    }

    async def live_lines(job: JobRecord) -> list[str] | None:
        return live.get(job.job_id)

    calls = world.service.job_sets
    assert calls is not None
    stopper = EarlyStopper(sets=calls.sets, store=world.store, cache=world.cache, live_lines=live_lines)
    assert await stopper.pass_once() == 1
    # At rung 2 the four trials stood at 0.4, 0.5, 0.8 and 0.2: the best half (0.2, 0.4) go on.
    stopped = await world.store.get_job(trials["2"].job_id)
    assert stopped is not None
    assert stopped.value.cancel_requested
    assert stopped.value.message == (
        "early stopping (successive halving): 0.8 at rung step 2 is not among the best 2 of 4 trials at that "
        "step (1/2 go on; the cutoff is 0.4)"
    )
    for key in ("3", "4"):
        left = await world.store.get_job(trials[key].job_id)
        assert left is not None
        assert not left.value.cancel_requested
