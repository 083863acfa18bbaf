"""A plan given what the last plan over the same queue kept (`placement.stretch_carry.PlanCarry`) is
exactly the plan made without it (issue 33).

The carry edits the last cycle's stretches (gangs taken in bulk, `plan._Cycle.take_in_bulk`) into
this cycle's where the gangs that differ are few and every kind's decision has an equal key. The
proof: seeded random series of deep queues, cycle after cycle, each plan made with the carry compared,
byte for byte and key for key, with the plan made afresh. Between cycles: submissions, cancels,
admissions (the last plan's, taken out of the queue and their room gone), requests replaced under the
same job (a new priority), tenants' settings (caps, guarantees, priority limits), `now` moving past
approvals' expiries, deadlines and private waits, capacity freed and taken, and new terms (a new,
empty carry). Each series must have edited stretches, not only made them afresh.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.scheduling.snapshot import GangRequests
from placement.fairshare import tenant_lists
from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    GpuQuota,
    GpuType,
    JobId,
    NodePool,
    Plan,
    PolicyConfig,
    PriorityClass,
    Provider,
    Snapshot,
    TenantId,
    TenantQuota,
)
from placement.plan import plan
from placement.stretch_carry import PlanCarry
from tests.properties import examples
from tests.unit.plan_cycles import bench_cycles, plan_bytes
from tests.unit.test_plan_reuse import deep_queues

A100, H100 = GpuType("A100"), GpuType("H100")
TENANTS = 12
CLASSES = (
    PriorityClass("default", 0),
    PriorityClass("high", 10),
    PriorityClass("urgent", 20, preemptible=False, needs_approval=True),
)

# The shipped wait's shape (federation/defaults/federation.yaml): the room test, judged only until a
# gang has waited `private_wait_needs_start_after_s`, a threshold the queue's gangs cross as `now`
# moves (a decision that reads each gang's queue time), the reservation and the sunk rate. The rate
# is high enough that every gang's wait is the longest, 72 h: the queue's gangs still wait.
SHIPPED_WAIT = PolicyConfig(
    private_wait_s_per_gpu_hour=3_600_000.0,
    private_wait_max_s=72 * 3600.0,
    private_wait_needs_start=True,
    private_wait_needs_start_after_s=4200.0,
    private_wait_reserve=True,
    private_rate_sunk=True,
)


def _same(carried: Plan, fresh: Plan) -> None:
    assert plan_bytes(carried) == plan_bytes(fresh)
    # The scheduler writes the reasons of the waits whose key changed: the keys must be alike too.
    assert [(w.job_id, w.key) for w in carried.waiting] == [(w.job_id, w.key) for w in fresh.waiting]


class Queue:
    """A deep queue of few kinds over clusters mostly full, changed at random between cycles."""

    def __init__(self, rng: random.Random, *, shared_keys: bool) -> None:
        self.rng = rng
        self.shared_keys = shared_keys
        self.keys: dict[tuple[object, ...], tuple[object, ...]] = {}
        self.queued: dict[JobId, GangRequest] = {}
        self.made = 0
        self.now = 5000.0
        self.free = [rng.choice([0, 0, 0, 8]) for _ in range(8)]
        self.cloud_free = 0
        self.tenants = [self._tenant(t) for t in range(TENANTS)]
        # Half the series start under the shipped wait's shape, so that it runs for many cycles.
        self.policy = SHIPPED_WAIT if rng.random() < 0.5 else PolicyConfig()
        for _ in range(rng.randrange(150, 400)):
            self.submit()

    def _tenant(self, t: int) -> TenantQuota:
        rng = self.rng
        quotas = (GpuQuota(A100, guaranteed_gpus=rng.choice([0, 8, 16]), borrowing_limit_gpus=24),)
        return TenantQuota(
            TenantId(f"t{t}"),
            quotas=quotas if rng.random() < 0.4 else (),
            gpu_caps=((H100, 8),) if rng.random() < 0.2 else (),
            max_priority=10 if rng.random() < 0.1 else None,
        )

    def _key(self, gang: GangRequest) -> GangRequest:
        if self.shared_keys:  # as the scheduler's kept requests: one key object per kind
            object.__setattr__(
                gang, "decision_key", self.keys.setdefault(gang.decision_key, gang.decision_key)
            )
        return gang

    def submit(self) -> None:
        rng = self.rng
        self.made += 1
        t = rng.randrange(TENANTS)
        # A tenant's gangs are of one class (a tenant of one standing settles, and is taken in bulk),
        # but for a few tenants of mixed classes; the urgent class's approvals and some deadlines
        # are a few times that `now` moves past.
        if t % 4 == 0:
            priority_class = "urgent"
        elif t % 4 == 1:
            priority_class = "high"
        elif t == 2:
            priority_class = rng.choice(["default", "high"])
        else:
            priority_class = "default"
        gang = GangRequest(
            JobId(f"q{self.made:05d}"),
            TenantId(f"t{t}"),
            {c.name: c.value for c in CLASSES}[priority_class],
            # Times repeat now and then (the order falls back to the job ids).
            1000.0 + (self.made if rng.random() < 0.9 else rng.randrange(self.made)),
            (8 if t % 4 == 0 else rng.choice([8, 8, 8, 4, 16]),),
            (A100,) if t % 2 else (A100, H100),
            priority_class=priority_class,
            approval_expires_at_s=rng.choice([5010.0, 5100.0, 1e9]) if priority_class == "urgent" else None,
            deadline_at_s=rng.choice([None, 5050.0, 5500.0]) if t in (3, 9) else None,
        )
        self.queued[gang.job_id] = self._key(gang)

    def snapshot(self) -> Snapshot:
        clusters = tuple(
            ClusterState(
                ClusterName(f"c{c}"),
                Provider.PRIVATE if c < 6 else Provider.AWS,
                "dc1",
                (
                    NodePool("a100", A100, CapacityKind.PRIVATE, 1.4, 8, (free, 0)),
                    NodePool(
                        "h100",
                        H100,
                        CapacityKind.ON_DEMAND if c >= 6 else CapacityKind.PRIVATE,
                        # Dear enough in the cloud that a wait saves more than the sunk rate.
                        8.0 if c >= 6 else 2.8,
                        8,
                        # The cloud's H100s have room now and then: a gang may burst, or wait.
                        (self.cloud_free,) if c >= 6 else (0,),
                    ),
                ),
            )
            for c, free in enumerate(self.free)
        )
        # In the scheduler's carried order (a changed job's request moves to the end), or any order.
        queued = list(self.queued.values())
        if self.rng.random() < 0.1:
            self.rng.shuffle(queued)
        return Snapshot(tuple(queued), (), tuple(self.tenants), clusters, CLASSES, policy=self.policy)

    def step(self, last: Plan) -> None:
        """What happens between two cycles."""
        rng = self.rng
        for admission in last.admissions:  # admitted: out of the queue, its room taken
            del self.queued[admission.job_id]
        self.free = [0 if rng.random() < 0.5 else f for f in self.free]
        self.cloud_free = rng.choice([0, 0, 0, 8])
        for _ in range(rng.choice([0, 1, 1, 2, 5, 30])):
            self.submit()
        ids = list(self.queued)
        for _ in range(rng.choice([0, 0, 1, 3])):
            if ids:
                del self.queued[ids.pop(rng.randrange(len(ids)))]  # cancelled
        if ids and rng.random() < 0.3:  # the same job, another request: equal, or of another kind
            old = self.queued[rng.choice(ids)]
            new = replace(old) if rng.random() < 0.5 else replace(old, replica_gpus=(rng.choice([4, 8]),))
            del self.queued[old.job_id]
            self.queued[old.job_id] = self._key(new)
        roll = rng.random()
        if roll < 0.1:
            self.free[rng.randrange(len(self.free))] = 8  # capacity freed
        elif roll < 0.2:
            t = rng.randrange(TENANTS)
            self.tenants[t] = self._tenant(t)  # the tenant's settings changed
        elif roll < 0.25:
            self.policy = rng.choice(
                [
                    PolicyConfig(),
                    PolicyConfig(private_wait_s_per_gpu_hour=600.0, wait_value_usd_per_hour=5.0),
                    PolicyConfig(preemption=False, backfill=False),
                    SHIPPED_WAIT,
                ]
            )
        # Time moves: past approvals' expiries, deadlines and private waits now and then.
        self.now += rng.choice([0.0, 1.0, 10.0, 100.0])


def _kept_as_made_afresh(carry: PlanCarry, queued: Sequence[GangRequest]) -> None:
    """What the queue's carry keeps for the next plan is what a plan would make afresh: the tenants'
    lists (`fairshare.tenant_lists`) and the gangs counted per key object. (A wrong count changes no
    plan, only which gangs are taken in bulk: it is checked here.)"""
    kept = carry.queue
    if kept._lists_of is queued:
        assert {t: [id(g) for g in gangs] for t, gangs in kept._lists.items()} == {
            t: [id(g) for g in gangs] for t, gangs in tenant_lists(queued)[0].items()
        }
    if kept._counts_of is queued:
        assert kept._counts == Counter(id(g.decision_key) for g in queued)
        assert {k: id(g.decision_key) for k, g in kept._samples.items()} == {k: k for k in kept._counts}


@pytest.mark.parametrize("seed", range(8))
def test_a_carried_plan_is_the_plan_made_afresh_cycle_after_cycle(seed: int) -> None:
    rng = random.Random(seed)
    queue = Queue(rng, shared_keys=seed % 2 == 0)
    carry = PlanCarry()
    edited = lists_edited = counted = 0
    for _ in range(40):
        if rng.random() < 0.05:
            edited += carry.carried
            lists_edited += carry.queue.edited
            counted += carry.queue.counts_carried
            carry = PlanCarry()  # a new term: nothing kept
        snapshot = queue.snapshot()
        carried = plan(snapshot, now=queue.now, carry=carry)
        _same(carried, plan(snapshot, now=queue.now))
        _kept_as_made_afresh(carry, snapshot.queued)
        queue.step(carried)
    assert edited + carry.carried > 0, "no stretch was edited from the last cycle's"
    assert lists_edited + carry.queue.edited > 0, "the tenants' lists were never edited from the last"
    if queue.shared_keys:  # the kinds' counts are carried where the key objects are shared
        assert counted + carry.queue.counts_carried > 0, "the kinds were never counted from the last"


def test_the_busy_federations_cycles_plan_alike_with_a_carry() -> None:
    """bench/placer's federation cycle after cycle (30 tenants, guarantees, borrowing, priorities,
    preemption, backfill, deadlines, datasets), each planned with the carry of the last."""
    carry = PlanCarry()

    def both(snapshot: Snapshot, now: float) -> Plan:
        carried = plan(snapshot, now=now, carry=carry)
        _same(carried, plan(snapshot, now=now))
        return carried

    for _ in bench_cycles(1500, 5, both):
        pass


def test_kinds_counted_by_hash_are_not_kept_as_the_queues_counts() -> None:
    """A queue whose first gangs each hold a key object of their own is counted by hashes, only the
    gangs whose hash repeats (`plan._Cycle`): those counts are not the queue's and must not be kept,
    even where some gangs further on share a key object."""
    queue = Queue(random.Random(3), shared_keys=False)
    queued = tuple(queue.queued.values())
    shared = queued[-1]
    later = tuple(
        replace(shared, job_id=JobId(f"z{n:03d}"), queued_at_s=shared.queued_at_s + 1 + n) for n in range(40)
    )
    for gang in later:
        object.__setattr__(gang, "decision_key", shared.decision_key)
    snapshot = replace(queue.snapshot(), queued=queued + later)
    carry = PlanCarry()
    _same(plan(snapshot, now=queue.now, carry=carry), plan(snapshot, now=queue.now))
    _kept_as_made_afresh(carry, snapshot.queued)


@settings(max_examples=examples(100), deadline=None)
@given(deep_queues(), st.sampled_from([0.0, 50.0, 1e4]), st.randoms(use_true_random=False))
def test_any_deep_queue_plans_alike_with_the_last_plans_carry(
    snapshot: Snapshot, now: float, rng: random.Random
) -> None:
    """The policies that reach every path a reuse could go wrong on (preemption and its limit, backfill,
    the private wait, spot): a plan, then one over the queue with gangs gone and `now` moved, given
    the first's carry."""
    carry = PlanCarry()
    _same(plan(snapshot, now=now, carry=carry), plan(snapshot, now=now))
    queued = [g for g in snapshot.queued if rng.random() < 0.9]
    later = replace(snapshot, queued=tuple(queued))
    now += rng.choice([0.0, 1.0, 60.0])
    _same(plan(later, now=now, carry=carry), plan(later, now=now))


def test_the_scheduler_keeps_a_carry_with_its_queue() -> None:
    assert isinstance(GangRequests().plan_carry, PlanCarry)
