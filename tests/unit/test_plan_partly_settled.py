"""A tenant settled up to its first gang not decided on the cycle's state (issue 33).

`plan._Cycle.take_in_bulk` takes a stretch of the queue at once from the tenants whose gangs all take
their kind's wait as already decided. Through the server, a tenant's jobs submitted through the API
were another kind than the seeded ones queued before them (another run-time limit): that tenant was
never settled, every stretch ended at its next gang, and half of a deep queue was decided gang by
gang (bench/scale_depth.py: 600 ms of CPU a cycle at a million queued, where the plan carried costs
about 100). Such a tenant is now settled up to its first gang that is not (`_settled_until`).

The proof: seeded series of deep queues whose tenants' gangs are of several kinds, mixed in queue
order, some of one gang each, planned cycle after cycle with the last plan's carry and compared byte
for byte with the plan that decides every gang on its own (`reuse=False`); and a server-shaped queue
in which one tenant's last gangs are another kind, whose gangs are nearly all taken in bulk.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from placement.model import GangRequest, GpuType, JobId, Snapshot, TenantId
from placement.plan import _plan, plan
from placement.stretch_carry import PlanCarry
from tests.unit.plan_cycles import plan_bytes
from tests.unit.test_plan_stretch_carry import Queue

A100 = GpuType("A100")


def _exact(carried_plan: object, snapshot: Snapshot, now: float) -> None:
    """The plan is the one made deciding every gang on its own, reasons' keys and all."""
    fresh = _plan(snapshot, now, reuse=False)
    assert plan_bytes(carried_plan) == plan_bytes(fresh)  # type: ignore[arg-type]
    assert [(w.job_id, w.key) for w in carried_plan.waiting] == [  # type: ignore[attr-defined]
        (w.job_id, w.key) for w in fresh.waiting
    ]


class MixedQueue(Queue):
    """`Queue`, with some tenants' submissions of other kinds (another run-time limit, as the API's
    manifests have; now and then a run-time limit of its own, a kind of one gang) among their usual
    ones, in queue order."""

    higher = False

    def submit(self) -> None:
        super().submit()
        gang = self.queued[JobId(f"q{self.made:05d}")]
        roll = self.rng.random()
        if int(gang.tenant[1:]) % 3 == 1 and roll < 0.35:
            runtime = 86_400 if roll < 0.3 else self.rng.randrange(1, 10**6)
            priority = gang.priority + 1000 if self.higher and roll < 0.2 else gang.priority
            self.queued[gang.job_id] = self._key(replace(gang, max_runtime_s=runtime, priority=priority))


class HigherMixedQueue(MixedQueue):
    """Its tenants' other kinds of a higher priority too, as the API's class is."""

    higher = True


@pytest.mark.parametrize("seed", range(8))
def test_tenants_of_several_kinds_plan_as_every_gang_decided_alone(seed: int) -> None:
    rng = random.Random(1000 + seed)
    queue = (HigherMixedQueue if seed % 4 >= 2 else MixedQueue)(rng, shared_keys=seed % 2 == 0)
    carry = PlanCarry()
    for _ in range(25):
        if rng.random() < 0.05:
            carry = PlanCarry()  # a new term: nothing kept
        snapshot = queue.snapshot()
        carried = plan(snapshot, now=queue.now, carry=carry)
        _exact(carried, snapshot, queue.now)
        queue.step(carried)
    assert carry.in_bulk > 0, "no gang was taken in bulk"


def _server_queue(per_tenant: int, other_kind: int) -> tuple[GangRequest, ...]:
    """scale_depth's queue through the server: 100 tenants of one kind each (8 A100, nothing fits),
    and tenant t7's `other_kind` gangs submitted through the API after them (another run-time limit,
    a class of a higher priority)."""
    keys: dict[tuple[object, ...], tuple[object, ...]] = {}
    gangs = []
    for n in range(100 * per_tenant):
        gang = GangRequest(
            JobId(f"q-{n:07d}"), TenantId(f"t{n % 100}"), 100, 1000.0 + n, (8,), (A100,), max_runtime_s=3600
        )
        gangs.append(gang)
    for n in range(other_kind):
        # Of the API's class, whose value is a higher priority: first in t7's queue.
        gangs.append(
            GangRequest(
                JobId(f"api-{n:04d}"), TenantId("t7"), 1000, 1e6 + n, (8,), (A100,), max_runtime_s=86_400
            )
        )
    for gang in gangs:  # as the scheduler's kept requests: one key object per kind
        object.__setattr__(gang, "decision_key", keys.setdefault(gang.decision_key, gang.decision_key))
    return tuple(gangs)


def test_a_tenant_with_another_kind_at_the_end_of_its_queue_does_not_stop_the_stretches() -> None:
    """Counted, not timed: with one tenant's last gangs of another kind, a plan decides a few hundred
    gangs one by one (the kinds' first gangs and the checks' gaps), not half the queue; and the
    next plan, given the carry, as few and its stretches edited."""
    queue = Queue(random.Random(0), shared_keys=True)
    snapshot = replace(queue.snapshot(), queued=_server_queue(per_tenant=60, other_kind=20), tenants=())
    carry = PlanCarry()
    first = plan(snapshot, now=5000.0, carry=carry)
    _exact(first, snapshot, 5000.0)
    assert not first.admissions
    size = len(snapshot.queued)
    assert carry.one_by_one < size // 10, (carry.one_by_one, carry.in_bulk)
    assert carry.one_by_one + carry.in_bulk == size
    # The next cycle: one more API submission.
    extra = replace(snapshot.queued[-1], job_id=JobId("api-9999"), queued_at_s=2e6)
    object.__setattr__(extra, "decision_key", snapshot.queued[-1].decision_key)
    later = replace(snapshot, queued=(*snapshot.queued, extra))
    one_by_one, edited = carry.one_by_one, carry.carried
    second = plan(later, now=5002.0, carry=carry)
    _exact(second, later, 5002.0)
    assert carry.one_by_one - one_by_one < size // 10
    assert carry.carried > edited, "the stretches were made afresh"
