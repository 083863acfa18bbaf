"""The placer's speed-ups change no plan: the same bytes, cycle after cycle, as before them.

`data/placer_cycles_golden.json` holds the digest of every plan (`plan_cycles.plan_bytes`: the
admissions with their explanations, every wait reason worded, preemptions, capacity requests,
reservations, moves, bursts) that the placer of 2026-11-30 before issue 33's work made over:

- bench/placer's federation (10,000 and 3,000 queued gangs, 50 clusters) cycle after cycle, each next
  snapshot following the last plan as the server's would (`bench.placer_scenario.advance`);
- the first 250 jobs of a Philly week replayed under gpufed's policy and under burst-now
  (`federation.replay`, with the config kept beside the digests, `data/placer_cycles_replay.yaml`),
  every cycle they planned.

A change to the placer that is meant to be only faster must leave every digest as it is. Only a
change that means to plan differently (or to the replay's simulator) regenerates the file, with
`python -m tests.unit.plan_cycles`, and says so in its commit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement import room
from placement.inventory import Inventory
from placement.model import GpuType, Snapshot, TenantId
from placement.plan import _plan, plan
from placement.preempt import RunningIndex, VictimChoice, choose_victims
from tests.properties import examples
from tests.unit.placement_builders import SnapshotBuilder
from tests.unit.plan_cycles import (
    GOLDEN,
    WEEK,
    bench_cycles,
    digest,
    patches_sources,
    plan_bytes,
    replay_cycles,
)
from tests.unit.test_placement_preempt import CASES as PREEMPT_CASES
from tests.unit.test_placement_preempt import NOW as PREEMPT_NOW
from tests.unit.test_plan_reuse import deep_queues

KEPT = json.loads(GOLDEN.read_text())


def _first_difference(got: Iterable[str], kept: list[str]) -> int | None:
    got = list(got)
    if len(got) != len(kept):
        return min(len(got), len(kept))
    return next((i for i, (a, b) in enumerate(zip(got, kept, strict=True)) if a != b), None)


def test_the_busy_federations_cycles_plan_as_before() -> None:
    """Eight cycles of 3,000 gangs: the cold one (2,000 or so admitted) and the steady ones after it
    (a few arrivals, ends and admissions each, preemptions up to the interval's limit)."""
    digests = [digest(p) for _, _, p in bench_cycles(3000, 8, lambda s, now: plan(s, now=now))]
    assert _first_difference(digests, KEPT["bench_3000x8"]) is None


def test_every_gang_decided_afresh_plans_as_before_too() -> None:
    """The digests are of plans that decided every gang afresh (`_plan(reuse=False)`): reuse of a
    wait within a cycle gives the same bytes as well."""
    digests = [digest(p) for _, _, p in bench_cycles(3000, 3, lambda s, now: _plan(s, now, reuse=False))]
    assert _first_difference(digests, KEPT["bench_3000x8"][:3]) is None


@pytest.mark.skipif(not WEEK.exists(), reason=f"the Philly week is not at {WEEK}")
@pytest.mark.parametrize("policy", ["gpufed", "burst_now"])
def test_a_replayed_weeks_cycles_plan_as_before(policy: str) -> None:
    cycles = replay_cycles(250, policy)
    assert len(cycles) == len(KEPT[f"replay_{policy}_250"])
    digests = (digest(plan(snapshot, now=now)) for snapshot, now in cycles)
    assert _first_difference(digests, KEPT[f"replay_{policy}_250"]) is None


def _every_offer(
    self: RunningIndex,
    inventory: Inventory,
    gpu_type: GpuType,
    tenant: TenantId,
    below: int | None,
    others: bool,
    need: int,
) -> frozenset[int]:
    """`RunningIndex.may_free` without its bound: every offer of the type goes to the victim search."""
    return frozenset(id(offer) for offer in inventory.search_order((gpu_type,), True))


def _without_memo(*args: Any, memo: object = None, **kwargs: Any) -> VictimChoice | None:
    """`choose_victims` searching every offer afresh for every gang."""
    return choose_victims(*args[:7], **kwargs)


@contextmanager
def searching_everything() -> Iterator[None]:
    """The victim search as before issue 33: every offer of the types, every gang afresh."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunningIndex, "may_free", _every_offer)
        patch.setattr(room, "choose_victims", _without_memo)
        yield


@patches_sources
@settings(max_examples=examples(150), deadline=None)
@given(deep_queues(), st.sampled_from([0.0, 50.0, 1e4]))
def test_the_victim_searchs_shortcuts_change_no_plan(snapshot: Snapshot, now: float) -> None:
    """Queues with running gangs on known nodes (some leaving), under policies with preemption and
    its limit, backfill, private waits and spot bounds: passing over offers that could not free
    enough, and taking an offer's outcome kept from an earlier gang of the same kind while nothing it
    read changed, give the same bytes as searching every offer for every gang afresh."""
    fast = plan_bytes(plan(snapshot, now=now))
    with searching_everything():
        slow = plan_bytes(plan(snapshot, now=now))
    assert fast == slow


@patches_sources
def test_the_busy_federation_plans_alike_with_every_offer_searched_afresh() -> None:
    """The steady cycles of bench/placer's federation, where most of the queue reaches the victim search
    and, once the interval's preemption limit is near, hundreds of gangs find victims they may not
    evict (the kept outcomes' case)."""
    for snapshot, now, decided in list(bench_cycles(3000, 5, lambda s, now: plan(s, now=now)))[1:]:
        with searching_everything():
            assert plan_bytes(plan(snapshot, now=now)) == plan_bytes(decided)


@patches_sources
@pytest.mark.parametrize(
    "snapshot", [case.values[0] for case in PREEMPT_CASES], ids=[case.id for case in PREEMPT_CASES]
)
def test_each_preemption_rule_plans_alike_with_every_offer_searched(snapshot: SnapshotBuilder) -> None:
    """The preemption rules one by one (reclaiming a guarantee from borrowers, lower priorities in a
    tenant, the smallest set, leaving gangs): the bound passes over no offer the search would use."""
    built = snapshot.build()
    fast = plan_bytes(plan(built, now=PREEMPT_NOW))
    with searching_everything():
        assert plan_bytes(plan(built, now=PREEMPT_NOW)) == fast
