"""The simulator freezes what it made to start once every cluster serves, and runs the collector less
often than CPython's defaults (`clusters.sim.__main__._settle_heap`).

Issue 33: at 100 clusters the collector took a third of the simulator's CPU over a 4,000-job
lifecycle, most of it full collections over every cluster's objects; the simulator shares the two
cores with the server it stands in for."""

from __future__ import annotations

import gc
import weakref

from clusters.sim.__main__ import GC_THRESHOLDS, _settle_heap


class _Node:
    other: object = None


def test_settling_collects_the_garbage_then_freezes_the_rest() -> None:
    before = gc.get_threshold()
    cyclic = _Node()
    cyclic.other = cyclic
    gone = weakref.ref(cyclic)
    kept = _Node()
    del cyclic
    try:
        _settle_heap()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gone() is None, "garbage in a cycle is collected, not frozen for ever"
        assert gc.get_freeze_count() > 0
        assert kept not in gc.get_objects(), "frozen: no collection walks it"
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
