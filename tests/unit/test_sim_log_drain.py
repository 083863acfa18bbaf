"""The simulated kubelet's process mode keeps a killed process's last lines, as a container runtime does.

A runtime copies a container's stdout pipe to its log file to the last byte, even when the container
is killed (its pod deleted, or its job ended by another pod's completion); `kubectl logs -f` reads to
the end of that file. The simulator reads its processes' pipes asynchronously, so a line printed
just before the kill may arrive after the container's end or the pod's deletion is seen. It used to
end the run there and drop such a line: a Volcano job ended by its first pod's completion lost the
other pod's last all-reduce line (tests/e2e/test_rendezvous.py, on a busy fresh clone). A
process-mode run now ends when its process's output has been read (`LogBook.drained`), with the end
it was given.
"""

from __future__ import annotations

from typing import Any

from clusters.sim import ManualClock
from clusters.sim.changes import Change, EventType
from clusters.sim.logs import LogBook
from clusters.sim.resources import PODS

UID = "uid-me-0"


def a_pod(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "me-0", "namespace": "default", "uid": UID},
        "spec": {"containers": [{"name": "main", "image": "i", "command": ["run"]}]},
        "status": {"containerStatuses": [{"name": "main", "restartCount": 0, "state": state}]},
    }


def a_book_with_a_running_pod(*, processes: bool = True) -> tuple[LogBook, ManualClock]:
    clock = ManualClock()
    book = LogBook(clock, interval_s=1.0, cap_bytes=1 << 20, processes=processes)
    book.observe(Change(1, EventType.ADDED, PODS, a_pod({"running": {}}), None))
    return book, clock


def texts(book: LogBook, clock: ManualClock) -> list[str]:
    (run,) = book.runs(UID, "main")
    return [text for _, text in run.lines(clock.wall_s() + 1e9, 1 << 20)]


def deleted(book: LogBook) -> None:
    pod = a_pod({"running": {}})
    book.observe(Change(2, EventType.DELETED, PODS, pod, pod))


def test_a_deleted_pods_process_lines_read_after_the_deletion_are_kept_until_drained() -> None:
    book, clock = a_book_with_a_running_pod()
    book.append(UID, "main", "allreduce rank=2")
    deleted(book)
    (run,) = book.runs(UID, "main")
    assert run.ended_wall_s is None
    assert run.draining
    book.append(UID, "main", "allreduce rank=3")  # printed before the kill, read after the deletion
    assert "allreduce rank=3" in texts(book, clock)
    book.drained(UID)
    assert run.ended_wall_s is not None
    assert run.exit_code == 137
    assert "allreduce rank=3" in [text for _, text in run.lines(clock.wall_s() + 1e9, 1 << 20)]
    assert book.runs(UID, "main") == []  # forgotten with its pod, as before
    book.append(UID, "main", "too late")  # after the end: nowhere to go
    assert "too late" not in [text for _, text in run.lines(clock.wall_s() + 1e9, 1 << 20)]


def test_a_simulated_run_ends_at_its_pods_deletion() -> None:
    book, _ = a_book_with_a_running_pod(processes=False)
    (run,) = book.runs(UID, "main")
    deleted(book)  # no process: nothing to wait for
    assert run.ended_wall_s is not None
    assert not run.draining
    assert book.runs(UID, "main") == []


def test_a_process_killed_for_another_reason_than_its_pods_deletion_is_not_ended_by_drained() -> None:
    book, _ = a_book_with_a_running_pod()
    book.append(UID, "main", "working")
    book.drained(UID)  # the kubelet stopped it (its pod ended), and its status says how
    (run,) = book.runs(UID, "main")
    assert run.ended_wall_s is None
    book.observe(Change(3, EventType.MODIFIED, PODS, a_pod({"terminated": {"exitCode": 0}}), None))
    assert run.ended_wall_s is not None
    assert run.exit_code == 0


def test_a_status_end_seen_before_the_pipe_is_read_waits_for_its_last_lines() -> None:
    book, clock = a_book_with_a_running_pod()
    book.append(UID, "main", "allreduce rank=2")
    # The kubelet killed the process (its job ended) and the pod's status says the container ended.
    book.observe(
        Change(
            2, EventType.MODIFIED, PODS, a_pod({"terminated": {"exitCode": 0, "reason": "Completed"}}), None
        )
    )
    (run,) = book.runs(UID, "main")
    assert run.ended_wall_s is None
    assert run.draining
    book.append(UID, "main", "allreduce rank=3")
    book.drained(UID)
    assert run.exit_code == 0
    assert run.reason == "Completed"
    lines = texts(book, clock)
    assert lines.index("allreduce rank=3") < lines.index("[sim] exited with code 0 (Completed)")


def test_a_process_that_printed_nothing_before_its_end_was_seen_keeps_its_lines() -> None:
    # A jax worker prints nothing before its all-reduce line: the fresh clone's pod showed simulated
    # progress lines and lost that line, its run taken for a simulated one and ended at the status.
    book, clock = a_book_with_a_running_pod()
    assert texts(book, clock)[-1].startswith("[sim] command:")  # no simulated progress lines
    book.observe(
        Change(
            2, EventType.MODIFIED, PODS, a_pod({"terminated": {"exitCode": 0, "reason": "Completed"}}), None
        )
    )
    (run,) = book.runs(UID, "main")
    assert run.ended_wall_s is None
    book.append(UID, "main", "allreduce rank=3")
    book.drained(UID)
    assert texts(book, clock)[-2:] == ["allreduce rank=3", "[sim] exited with code 0 (Completed)"]
