"""The Kubernetes backend's health record: how long a member cluster has not answered (issue 33).

`answered` is called for every watch event and call (thousands a second at 100 clusters), so it
returns without taking the lock while the cluster answers; what it reports must not change.
"""

from __future__ import annotations

import threading

from clusters.kubernetes.watch import Health


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_silence_counts_from_the_first_failure_until_an_answer() -> None:
    clock = Clock()
    health = Health(clock)
    health.answered()
    assert health.silent_for_s() == 0.0
    health.failed()
    clock.now += 5.0
    health.failed()  # a later failure does not restart the count
    clock.now += 2.0
    assert health.silent_for_s() == 7.0
    health.answered()
    assert health.silent_for_s() == 0.0
    health.answered()
    clock.now += 3.0
    health.failed()
    clock.now += 1.0
    assert health.silent_for_s() == 1.0


def test_answers_and_failures_from_many_threads_end_in_the_last_ones_state() -> None:
    health = Health(Clock())
    start = threading.Barrier(8)

    def hammer(fail: bool) -> None:
        start.wait()
        for _ in range(2000):
            health.failed() if fail else health.answered()

    threads = [threading.Thread(target=hammer, args=(i % 2 == 0,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    health.answered()
    assert health.silent_for_s() == 0.0
    health.failed()
    assert health.silent_for_s() == 0.0  # failing since now, by the clock that did not move
    assert health._failing_since is not None
