"""The placer's values made per gang, with an `__init__` of their own (issue 33).

Compiled, a dataclass's generated `__init__` is a Python function (about 15,000 instructions to make a
`WaitReason`), so the values a cycle makes per gang are declared `init=False` with an `__init__`
written out, which mypyc compiles to struct writes. Written out, it could drift from the fields:

- Its parameters are the fields the dataclass would take, in order, with the same defaults, each
  positional or by keyword (compiled, `inspect` shows some as positional only; they are not), and
  each lands in its own field, in both forms (this module is among the
  placer's tests that also run on the sources, `make test-interpreted`).
- Frozen ones stay frozen: a write raises `FrozenInstanceError`, as before.
- They stay values: equal, hashed and copied as the dataclass's methods say (`compare=False` fields
  are still left out of equality).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from collections.abc import Callable

import pytest

from placement.fit import HistogramFit
from placement.inventory import Inventory, Offer
from placement.model import CapacityKind, ClusterName, GpuType, JobId, Pinning, TenantId
from placement.model_plan import (
    Admission,
    Alternative,
    Choice,
    Preemption,
    PreemptionReason,
    WaitCode,
    WaitReason,
)
from placement.plan import _Fit, _Miss, plan
from placement.preempt import VictimChoice
from tests.unit.placement_builders import ClusterBuilder, SnapshotBuilder, dataclasses_in
from tests.unit.plan_cycles import bench_cycles

MODULES = ("fit", "model_plan", "plan", "preempt")


def _own_init() -> list[type[object]]:
    """Every dataclass of the placer's modules declared with an `__init__` of its own."""
    return [c for c in dataclasses_in(MODULES) if not c.__dataclass_params__.init]  # type: ignore[attr-defined]


def _offer() -> Offer:
    snapshot = SnapshotBuilder().clusters(ClusterBuilder("dc-1").pool("H100", nodes=2)).build()
    return Inventory(snapshot.clusters, snapshot.policy).offers[0]


ALTERNATIVE = Alternative(ClusterName("c"), GpuType("H100"), CapacityKind.SPOT, 2.5, 7.25)
CHOICE = Choice(1.5, 2.0, "ds", "s3://a", "s3://b", 0.75, 12.0, ALTERNATIVE, None, 0.5)
FIT = HistogramFit(((8, 4), (8, 4)), 2, 8)
REASON = WaitReason(
    WaitCode.INSUFFICIENT_CAPACITY, "m", ClusterName("c"), GpuType("A100"), TenantId("t"), 1, 2, 3, 4, 5, 6.5
)


def _examples() -> dict[type[object], Callable[[], object]]:
    """A value of each class with every field set apart from its default."""
    offer = _offer()
    return {
        WaitReason: lambda: REASON,
        Alternative: lambda: ALTERNATIVE,
        Choice: lambda: CHOICE,
        Admission: lambda: Admission(
            JobId("j"), ClusterName("c"), GpuType("H100"), CapacityKind.PRIVATE, 1.0, 2.0, CHOICE
        ),
        Preemption: lambda: Preemption(
            JobId("v"),
            TenantId("t"),
            ClusterName("c"),
            GpuType("H100"),
            8,
            PreemptionReason.LOWER_PRIORITY,
            30.0,
            JobId("j"),
            5.0,
        ),
        HistogramFit: lambda: FIT,
        VictimChoice: lambda: VictimChoice(offer, (), (), (8, 0)),
        _Fit: lambda: _Fit(offer, FIT, 3.5, (offer, 4.0), offer),
        _Miss: lambda: _Miss(False, [REASON], True),
    }


def test_the_values_made_per_gang_have_their_own_init() -> None:
    """The list this module checks is the one the placer uses (a class added to it is checked too)."""
    assert set(_own_init()) == set(_examples())


@pytest.mark.parametrize("cls", _own_init(), ids=lambda c: c.__name__)
def test_the_init_takes_the_fields_in_order_with_their_defaults(cls: type[object]) -> None:
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    assert all(f.default_factory is dataclasses.MISSING for f in fields)
    parameters = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in parameters] == [f.name for f in fields]
    assert [p.default for p in parameters] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]


@pytest.mark.parametrize("cls", _own_init(), ids=lambda c: c.__name__)
def test_each_argument_lands_in_its_field_positionally_or_by_keyword(cls: type[object]) -> None:
    value = _examples()[cls]()
    names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    held = [getattr(value, name) for name in names]
    # Every field set apart from its default, so a swapped or dropped assignment shows.
    defaults = [f.default for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    assert all(h != d for h, d in zip(held, defaults, strict=True))
    for made in (cls(*held), cls(**dict(zip(names, held, strict=True)))):
        assert [getattr(made, name) for name in names] == held
        assert [type(getattr(made, name)) for name in names] == list(map(type, held))
        assert made == value
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]  # type: ignore[arg-type]
    short = cls(*held[: len(required)])
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.default is not dataclasses.MISSING:
            assert getattr(short, field.name) == field.default


@pytest.mark.parametrize("cls", _own_init(), ids=lambda c: c.__name__)
def test_frozen_values_still_refuse_writes(cls: type[object]) -> None:
    value = _examples()[cls]()
    first = dataclasses.fields(cls)[0].name  # type: ignore[arg-type]
    if cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, first, getattr(value, first))
        assert hash(value) == hash(cls(*[getattr(value, f.name) for f in dataclasses.fields(cls)]))  # type: ignore[arg-type]
    else:  # the cycle's own working records (`_Fit`, `_Miss`) are written as it goes
        setattr(value, first, getattr(value, first))


def test_the_models_values_still_compare_copy_and_pickle() -> None:
    """Equality is the dataclass's (an admission's `choice` is left out of it), and the model's values
    still pickle and copy by their constructors (`model_values`)."""
    admission = _examples()[Admission]()
    assert isinstance(admission, Admission)
    assert admission == dataclasses.replace(admission, choice=None)
    assert admission != dataclasses.replace(admission, expected_cost_usd=9.0)
    assert dataclasses.replace(REASON, at_s=None) != REASON
    for value in (REASON, ALTERNATIVE, CHOICE, admission, _examples()[Preemption]()):
        assert pickle.loads(pickle.dumps(value)) == value
        assert copy.deepcopy(value) == value
        assert repr(copy.deepcopy(value)) == repr(value)


def test_waits_made_by_the_compiled_placer_are_the_waits_waiting_makes() -> None:
    """`explained_wait` and `reasoned_wait` write `Waiting`'s slots through their descriptors (no
    interpreted call): the same wait as `Waiting.explained` and `Waiting(...)`, slot for slot, still
    immutable, equal, hashed and pickled as one."""
    from placement.model_plan import Waiting, explained_wait, reasoned_wait

    (_, _, decided), *_ = bench_cycles(300, 1, lambda s, now: plan(s, now=now))
    explained = [w for w in decided.waiting if w._explanation is not None]
    assert explained
    for wait in explained[:50]:
        assert wait._explanation is not None
        made = explained_wait(wait.job_id, wait._explanation)
        before = Waiting.explained(wait.job_id, wait._explanation)
        assert type(made) is Waiting
        assert (made.job_id, made._reasons, made._explanation) == (before.job_id, None, before._explanation)
        assert made.key == before.key
        assert made == before
        assert made.reasons == before.reasons == wait.reasons
        assert hash(made) == hash(before)
        assert pickle.loads(pickle.dumps(made)) == made
    made = reasoned_wait(JobId("j"), (REASON,))
    assert (made.job_id, made._reasons, made._explanation) == ("j", (REASON,), None)
    assert made == Waiting(JobId("j"), (REASON,))
    assert made.key == (REASON,)
    with pytest.raises(AttributeError):
        made.job_id = JobId("other")


def test_rules_compare_and_hash_as_the_dataclass_did() -> None:
    """`Pinning`'s own `__eq__` and `__hash__` (compiled: the generated ones are Python functions):
    equal exactly when every list is, hashed as the tuple of its lists (the dataclass's hash, so sets
    and dicts of rules hold the same order as before), and not equal to another class's value."""
    names = [f.name for f in dataclasses.fields(Pinning)]
    rules = Pinning(("a",), ("b",), ("eu",), ("us",), ("aws",), ("gcp",))
    assert hash(rules) == hash(tuple(getattr(rules, n) for n in names))
    assert hash(Pinning()) == hash(((),) * len(names))
    twin = Pinning(*[tuple(getattr(rules, n)) for n in names])
    assert twin == rules
    assert hash(twin) == hash(rules)
    for name in names:
        other = dataclasses.replace(rules, **{name: ("z",)})
        assert other != rules
    assert rules != tuple(getattr(rules, n) for n in names)
    assert rules.__eq__(object()) is NotImplemented
    assert {rules: 1}[twin] == 1
