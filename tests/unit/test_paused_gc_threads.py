"""`paused_gc` from several threads at once (federation.store.job_store).

The scheduler's cycle and the archiver hold the cyclic collector off on worker threads while the
event loop's caches may do the same. Its count and the collector's state before the first pause
were plain globals: a thread that entered while another had just turned the collector off took
"off" for the state to restore, and the collector stayed off for good (cyclic garbage never freed).
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator

import pytest

from federation.store import job_store


@pytest.fixture
def fine_switches() -> Iterator[None]:
    # Threads switch as often as CPython lets them, so that a race in the count shows at once.
    was = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(was)


def test_the_collector_is_on_again_after_threads_pause_it_side_by_side(fine_switches: None) -> None:
    assert gc.isenabled()

    def pause_often() -> None:
        for _ in range(5_000):
            with job_store.paused_gc():
                pass

    threads = [threading.Thread(target=pause_often) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert job_store._gc_pauses == 0
    assert gc.isenabled()
