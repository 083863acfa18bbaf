"""The logs of killed gang pods, read from the pod watch's events: which pods are read, what is served
once they are gone, and the bounds."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from clusters.api import LogOptions
from clusters.kubernetes.last_words import LastWords, shaped
from clusters.kubernetes.logs import replica_state

NS = "gpufed-vision"
LOG = (
    b"2026-11-27T10:00:00.000000000Z [sim] container started\n"
    b"2026-11-27T10:00:05.000000000Z step 1\n"
    b"2026-11-27T10:00:10.000000000Z step 2\n"
)


def a_pod(
    name: str,
    *,
    uid: str | None = None,
    phase: str = "Running",
    deleting: bool = False,
    gang: str | None = "train-1-a1",
    namespace: str = NS,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{name}",
        "labels": {"gpufed.io/gang": gang} if gang else {},
        "annotations": {"volcano.sh/task-spec": name.rsplit("-", 2)[-2], "volcano.sh/task-index": "0"},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T10:00:40Z"
    return {"metadata": meta, "spec": {"containers": [{"name": "main"}]}, "status": {"phase": phase}}


class Fetcher:
    def __init__(self, data: bytes = LOG, fail: bool = False) -> None:
        self.data = data
        self.fail = fail
        self.calls: list[tuple[str, str, str, LogOptions]] = []
        self.done = threading.Event()

    def __call__(self, namespace: str, pod: str, container: str, options: LogOptions) -> bytes:
        self.calls.append((namespace, pod, container, options))
        self.done.set()
        if self.fail:
            raise RuntimeError("(404) pods not found")
        return self.data


def words(fetch: Fetcher, **kwargs: Any) -> LastWords:
    return LastWords("onprem", fetch, replica_state, **kwargs)


def wait_read(last: LastWords) -> None:
    asyncio.run(last.settled(NS, "train-1-a1", wait_s=5.0))


def test_a_running_pod_marked_for_deletion_is_read_once_and_served_once_gone() -> None:
    fetch = Fetcher()
    last = words(fetch)
    pod = "train-1-a1-worker-0"
    last.observe("ADDED", a_pod(pod))
    last.observe("MODIFIED", a_pod(pod, deleting=True))
    wait_read(last)
    assert [(c[0], c[1], c[2], c[3].timestamps) for c in fetch.calls] == [(NS, pod, "main", True)]
    # Still there: the live log is the one to read, and the listing shows the live pod.
    assert last.log_of(NS, pod, LogOptions()) is None
    assert last.gone_replicas(NS, "train-1-a1", [pod]) == []
    last.observe("MODIFIED", a_pod(pod, phase="Failed", deleting=True))
    last.observe("DELETED", a_pod(pod, phase="Failed", deleting=True))
    assert len(fetch.calls) == 1
    gone = last.gone_replicas(NS, "train-1-a1", ["train-1-a1-master-0"])
    assert [(r.pod, r.phase) for r in gone] == [(pod, "Failed")]
    assert last.log_of(NS, pod, LogOptions()) == b"[sim] container started\nstep 1\nstep 2\n"
    assert last.log_of(NS, pod, LogOptions(timestamps=True, tail_lines=1)) == LOG.splitlines(True)[-1]
    # Another tenant's namespace never sees it.
    assert last.log_of("gpufed-audio", pod, LogOptions()) is None
    assert last.gone_replicas("gpufed-audio", "train-1-a1", []) == []


def test_the_api_listing_is_ahead_of_the_watch() -> None:
    """The pod is no longer listed though its DELETED event has not arrived: it is gone."""
    last = words(Fetcher())
    pod = "train-1-a1-worker-1"
    last.observe("MODIFIED", a_pod(pod, deleting=True))
    wait_read(last)
    assert [r.pod for r in last.gone_replicas(NS, "train-1-a1", ["train-1-a1-master-0"])] == [pod]
    assert last.log_of(NS, pod, LogOptions()) is None
    assert last.log_of(NS, pod, LogOptions(), only_gone=False) is not None


@pytest.mark.parametrize(
    "pod",
    [
        a_pod("train-1-a1-worker-0", phase="Succeeded", deleting=True),  # ended: its log was there to keep
        a_pod("train-1-a1-worker-0", phase="Pending", deleting=True),  # never ran: no log
        a_pod("train-1-a1-worker-0"),  # not being deleted
        a_pod("other-0", deleting=True, gang=None),  # not gpufed's
    ],
)
def test_other_pods_are_not_read(pod: dict[str, Any]) -> None:
    fetch = Fetcher()
    last = words(fetch)
    last.observe("MODIFIED", pod)
    last.observe("DELETED", pod)
    assert not fetch.done.wait(0.2)
    assert last.gone_replicas(NS, "train-1-a1", []) == []


def test_a_read_that_finds_the_pod_gone_leaves_nothing_to_serve() -> None:
    fetch = Fetcher(fail=True)
    last = words(fetch)
    pod = "train-1-a1-worker-0"
    last.observe("MODIFIED", a_pod(pod, deleting=True))
    wait_read(last)
    last.observe("DELETED", a_pod(pod, deleting=True))
    assert last.missed == 1
    assert last.gone_replicas(NS, "train-1-a1", []) == []
    assert last.log_of(NS, pod, LogOptions()) is None


def test_a_new_pod_of_the_same_name_is_read_live() -> None:
    """Volcano's RestartTask makes a pod of the same name: the copy of the old one is not its log."""
    last = words(Fetcher())
    pod = "train-1-a1-worker-0"
    last.observe("MODIFIED", a_pod(pod, deleting=True))
    wait_read(last)
    last.observe("DELETED", a_pod(pod, deleting=True))
    assert last.log_of(NS, pod, LogOptions()) is not None
    last.observe("ADDED", a_pod(pod, uid="uid-new", phase="Pending"))
    assert last.log_of(NS, pod, LogOptions()) is None


def test_bounded_per_pod_in_all_and_in_time() -> None:
    line = b"2026-11-27T10:00:00.000000000Z " + b"x" * 68 + b"\n"  # 100 bytes
    now = [1000.0]
    last = words(
        Fetcher(line * 50), max_bytes_per_pod=1000, max_total_bytes=2500, ttl_s=60, clock=lambda: now[0]
    )
    for i in range(4):
        pod = f"train-1-a1-worker-{i}"
        last.observe("MODIFIED", a_pod(pod, deleting=True))
        wait_read(last)
        last.observe("DELETED", a_pod(pod, deleting=True))
    kept = {r.pod for r in last.gone_replicas(NS, "train-1-a1", [])}
    # 900 bytes a pod, 2,500 in all: the two newest stay.
    assert kept == {"train-1-a1-worker-2", "train-1-a1-worker-3"}
    # The tail within 1,000 bytes that starts at a line known to be whole.
    assert len(last.log_of(NS, "train-1-a1-worker-3", LogOptions(timestamps=True)) or b"") == 900
    now[0] += 61
    last.observe("MODIFIED", a_pod("train-1-a1-worker-9", deleting=True))
    wait_read(last)
    # The old ones aged out; the new one is still listed by the API, so it is not "gone".
    assert last.gone_replicas(NS, "train-1-a1", ["train-1-a1-worker-9"]) == []


def test_shaped_cuts_as_the_pod_log_api_does() -> None:
    now_s = 1795773610.0  # 2026-11-27T10:00:10Z
    assert shaped(LOG, LogOptions(since_s=6), now_s) == b"step 1\nstep 2\n"
    assert shaped(LOG, LogOptions(tail_lines=0), now_s) == b""
    assert shaped(LOG, LogOptions(limit_bytes=5), now_s) == b"[sim]"


def test_entries_dropped_for_any_reason_leave_no_name_behind() -> None:
    """The name index follows the entries: pruned or replaced, a name serves nothing afterwards."""
    now = [1000.0]
    last = words(Fetcher(), ttl_s=60, clock=lambda: now[0])
    for i in range(3):
        pod = f"train-1-a1-worker-{i}"
        last.observe("MODIFIED", a_pod(pod, deleting=True))
        wait_read(last)
        last.observe("DELETED", a_pod(pod, deleting=True))
    last.observe("ADDED", a_pod("train-1-a1-worker-0", uid="uid-new", phase="Pending"))
    now[0] += 61
    last.observe("MODIFIED", a_pod("train-1-a1-worker-9", deleting=True))
    wait_read(last)
    assert [last.log_of(NS, f"train-1-a1-worker-{i}", LogOptions()) for i in range(3)] == [None] * 3
    assert last._by_name.keys() == {(NS, "train-1-a1-worker-9")}
