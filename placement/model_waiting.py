"""A job left waiting (`Waiting`): the plan's one value that stays interpreted where the placer runs compiled.

A deep queue's cycle makes one `Waiting` per waiting job, so it is made by writing the slots of a
plain class and giving the object `Waiting`'s class (`_Unguarded`), which mypyc's native classes do
not allow; `placement/_compiled.py` leaves this module out of the build for that reason. Everything
else of the plan is in `model_plan`, which re-exports `Waiting`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Protocol

from placement.model_ids import JobId

if TYPE_CHECKING:  # only named in annotations: model_plan imports this module
    from placement.model_plan import WaitReason


class Explanation(Protocol):
    """Reasons recorded as figures, worded when first read (see `placement.reasons`)."""

    @property
    def key(self) -> Hashable:
        """A value that is equal for two explanations only when their reasons are equal."""
        ...

    def build(self) -> tuple[WaitReason, ...]: ...


class _Unguarded:
    """`Waiting`'s slots without its guard against writes: a wait is made as one of these, by plain
    attribute writes, and then becomes a `Waiting` (a class of the same slots may take another's
    place). A deep queue's cycle makes one wait per waiting job, and three `object.__setattr__`
    calls, the only writes `Waiting` allows, took twice as long (0.49 against 0.24 µs a wait)."""

    __slots__ = ("_explanation", "_reasons", "job_id")

    def __init__(
        self, job_id: JobId, reasons: tuple[WaitReason, ...] | None, explanation: Explanation | None
    ) -> None:
        self.job_id = job_id
        self._reasons = reasons
        self._explanation = explanation


class Waiting:
    """A job left waiting, and every reason why, most fundamental first.

    A cycle leaves thousands of jobs waiting on capacity, so the placer records the figures and the
    reasons are worded on first read (`reasons`). `key` tells two waits with equal reasons apart from
    changed ones without wording either: the scheduler writes only jobs whose reasons changed.
    A value: immutable, equal and hashed by job and reasons.
    """

    __slots__ = ("_explanation", "_reasons", "job_id")

    job_id: JobId
    _reasons: tuple[WaitReason, ...] | None
    _explanation: Explanation | None

    def __init__(self, job_id: JobId, reasons: tuple[WaitReason, ...]) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "_reasons", tuple(reasons))
        object.__setattr__(self, "_explanation", None)

    @classmethod
    def _of(
        cls, job_id: JobId, reasons: tuple[WaitReason, ...] | None, explanation: Explanation | None
    ) -> Waiting:
        """A wait from its slots as they are, without `__init__`'s copy (thousands a cycle)."""
        waiting = _Unguarded(job_id, reasons, explanation)
        waiting.__class__ = Waiting  # type: ignore[assignment]
        return waiting  # type: ignore[return-value]

    @classmethod
    def explained(cls, job_id: JobId, explanation: Explanation) -> Waiting:
        """A wait whose reasons are worded from `explanation` when first read. (The placer makes its
        waits with `model_plan.explained_wait`, without an interpreted call.)"""
        return cls._of(job_id, None, explanation)

    @property
    def reasons(self) -> tuple[WaitReason, ...]:
        reasons = self._reasons
        if reasons is None:
            assert self._explanation is not None
            reasons = self._explanation.build()
            object.__setattr__(self, "_reasons", reasons)
        return reasons

    @property
    def key(self) -> Hashable:
        """Equal for two waits with equal reasons (unequal keys may still have equal reasons)."""
        if self._explanation is not None:
            return self._explanation.key
        return self.reasons

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Waiting is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Waiting:
            return NotImplemented
        assert isinstance(other, Waiting)
        return self.job_id == other.job_id and self.reasons == other.reasons

    def __hash__(self) -> int:
        return hash((self.job_id, self.reasons))

    def __reduce__(self) -> tuple[type[Waiting], tuple[JobId, tuple[WaitReason, ...]]]:
        # Copies and pickles carry the worded reasons (the figures refer to the cycle's working state).
        return (Waiting, (self.job_id, self.reasons))

    def __repr__(self) -> str:
        return f"Waiting(job_id={self.job_id!r}, reasons={self.reasons!r})"
