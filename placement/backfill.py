"""Backfill: a reserved start for the first gang blocked by running work, and who may start ahead of it.

Without reservations a large gang can wait forever while small gangs keep taking the GPUs it needs
as they free up. So the first gang of the cycle (in queue order) that fits nowhere now, but would fit
somewhere once running gangs end, is promised the earliest such start, on one offer (cluster, GPU
type, kind, price). Running gangs end at their run-time limit (`RunningGang.ends_at_s`); gangs being
evicted end after their grace period. A gang whose end is unknown is assumed never to end.

Several gangs may hold reservations on one offer (`PolicyConfig.private_wait_reservations`); they
never overlap: a later one is searched from the start of the one before it, on what that one leaves
free then (the earlier gang is taken to run for ever), adding only the running gangs that end after.

A later gang may still be admitted onto the reserved offer if it does not delay any promised start:
either its own run-time limit ends before that start, or it fits in what the offer will have free at
the start besides the reserved gang. Gangs without a run-time limit can only use the second way.

The future free nodes are a histogram like the present ones, so where exactly a backfilled gang sits
is approximated by the same best-fit rule: a cluster that places it elsewhere may leave a different
(never a smaller) total free at the start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from placement.fit import FreeHistogram, fit_replicas
from placement.inventory import Offer
from placement.model import JobId
from placement.preempt import RunningIndex


class Hold:
    """A reservation in working form: the offer, the start, and the offer's free nodes at that start
    besides the reserved gang (as a histogram for backfill checks, and per node for the next hold)."""

    __slots__ = ("applied", "committed", "future", "job_id", "nodes_after", "offer", "start_at_s")

    def __init__(
        self,
        job_id: JobId,
        offer: Offer,
        start_at_s: float,
        nodes_after: Sequence[int],
        applied: tuple[float, str],
    ) -> None:
        self.job_id = job_id
        self.offer = offer
        self.start_at_s = start_at_s
        self.nodes_after = tuple(nodes_after)
        self.future = FreeHistogram(nodes_after)
        # The last running gang's (end, job id) counted as ended in `nodes_after`: a hold searched after
        # this one adds only the gangs that come later in that order.
        self.applied = applied
        # Gangs admitted onto the offer that still run at the start (they use `future`).
        self.committed: list[tuple[int, ...]] = []

    def nodes_left(self) -> list[int]:
        """Free GPUs per node at the start besides the reserved gang and the gangs committed since."""
        nodes = list(self.nodes_after)
        for shape in self.committed:
            taken = fit_replicas(shape, nodes)
            if taken is None:  # pragma: no cover - the histogram admitted it, and both follow one rule
                raise AssertionError("node list and histogram disagree")
            nodes = [free - t for free, t in zip(nodes, taken, strict=True)]
        return nodes

    def allows(self, shape: tuple[int, ...], max_runtime_s: int, now: float) -> bool:
        if max_runtime_s > 0 and now + max_runtime_s <= self.start_at_s:
            return True
        return self.future.fit(shape) is not None

    def commit(self, shape: tuple[int, ...], max_runtime_s: int, now: float) -> None:
        """Record a gang admitted onto the offer (after `allows` said yes)."""
        if max_runtime_s > 0 and now + max_runtime_s <= self.start_at_s:
            return
        placed = self.future.fit(shape)
        assert placed is not None
        self.future.take(placed)
        self.committed.append(shape)


def reserve(
    job_id: JobId,
    shape: tuple[int, ...],
    offers: Sequence[Offer],
    index: RunningIndex,
    end_of: Callable[[str, float | None, bool], float | None],
    offer_cost: Callable[[Offer], float],
    after: Mapping[Offer, Hold] | None = None,
) -> Hold | None:
    """The earliest start over `offers` for a gang that fits none of them now, or None if none is known.

    `end_of(job_id, ends_at_s, terminating)` says when a running gang frees its GPUs (None: never).
    `after` gives, per offer, the last reservation already made on it: the gang may start there only
    at or after it, on what it leaves free, so that the two never overlap.
    """
    best: Hold | None = None
    best_key: tuple[float, float, tuple[object, ...]] | None = None
    for offer in offers:
        if not offer.fits_when_empty(shape):
            continue
        events = []
        for gang, shares in index.on(offer):
            end = end_of(gang.job_id, gang.ends_at_s, gang.terminating)
            if end is not None:
                events.append((end, gang.job_id, shares))
        before = None if after is None else after.get(offer)
        if not events and before is None:
            continue
        events.sort(key=lambda e: (e[0], e[1]))
        if before is None:
            nodes = offer.nodes()
        else:
            nodes = before.nodes_left()
            events = [e for e in events if (e[0], e[1]) > before.applied]
            # Room already free when the earlier reservation starts is this gang's from then on.
            taken = fit_replicas(shape, nodes)
            if taken is not None:
                key = (before.start_at_s, offer_cost(offer), offer.search_key)
                if best_key is None or key < best_key:
                    left = [free - t for free, t in zip(nodes, taken, strict=True)]
                    best, best_key = Hold(job_id, offer, before.start_at_s, left, before.applied), key
                continue
        for end, gang_id, shares in events:
            if best_key is not None and end > best_key[0]:
                break
            for node, gpus in shares:
                nodes[node] += gpus
            taken = fit_replicas(shape, nodes)
            if taken is None:
                continue
            key = (end, offer_cost(offer), offer.search_key)
            if best_key is None or key < best_key:
                left = [free - t for free, t in zip(nodes, taken, strict=True)]
                best, best_key = Hold(job_id, offer, end, left, (end, gang_id)), key
            break
    return best
