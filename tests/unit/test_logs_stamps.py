"""`gpufed logs` sends every line once, in order, whatever its stamp (issue 30, item 2).

The lines come from a recorded sample of a real kubelet's output with `timestamps=true`
(`data/kubelet_rfc3339nano.log`, see `data/README.md`): stamps of RFC3339Nano with their trailing
zeros trimmed, and lines that share one stamp. Compared as text, `...07Z` sorts after `...07.1Z` and
`...07.1Z` after `...07.12Z`, and a line that shares its stamp with the one before it looked sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from clusters.api import ClusterUnreachable, GangEvent, LogOptions, ReplicaState
from clusters.logtext import split_stamp, stamp_ns
from clusters.memory_logs import fake_log
from federation.joblogs.stream import Chunk, Target, read_replica
from placement.model import JobId, TenantId

SAMPLE = (Path(__file__).parent / "data" / "kubelet_rfc3339nano.log").read_bytes()
LINES = SAMPLE.decode().splitlines()
REPLICA = ReplicaState(
    "ddp-master-0", "master", 0, False, "n1", "Running", 0, None, "", "", container="master"
)


class RecordedCluster:
    """Serves the recorded log: in `cuts` (byte offsets that split lines mid-way), then, if
    `lost_after` lines, loses the connection; read again, it answers from line `resume_from`, as a
    kubelet asked for `sinceSeconds` a little before the last line sent does."""

    def __init__(self, *, lost_after: int | None = None, resume_from: int = 0) -> None:
        self.asked: list[LogOptions] = []
        self._lost_after = lost_after
        self._resume_from = resume_from

    async def replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        return [REPLICA]

    async def events(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[GangEvent]:
        return []

    async def pod_log(
        self, tenant: TenantId, replica: ReplicaState, options: LogOptions
    ) -> AsyncIterator[bytes]:
        self.asked.append(options)
        first = len(self.asked) == 1
        lines = LINES if first else LINES[self._resume_from :]
        if first and self._lost_after is not None:
            lines = lines[: self._lost_after]
        data = "".join(f"{line}\n" for line in lines).encode()
        # Chunks that split lines (and stamps) mid-way, as HTTP chunks do.
        for i in range(0, len(data), 37):
            yield data[i : i + 37]
        if first and self._lost_after is not None:
            raise ClusterUnreachable("cluster c1: no answer")


def _read(cluster: RecordedCluster, options: LogOptions) -> list[Chunk]:
    got: list[Chunk] = []

    async def put(chunk: Chunk) -> None:
        got.append(chunk)

    asyncio.run(
        read_replica(
            cluster,
            "c1",
            TenantId("vision"),
            Target("master", 0, REPLICA),
            options,
            put,
            live=lambda: True,
            retry_s=0.01,
            clock=lambda: 1772442851.0,
        )
    )
    return got


def test_the_sample_is_what_breaks_text_comparison() -> None:
    """The recorded lines are in time order, yet not in text order, and some share a stamp."""
    stamps = [split_stamp(line)[0] for line in LINES]
    instants = [stamp_ns(s) for s in stamps]
    assert all(i is not None for i in instants)
    assert instants == sorted(instants)  # type: ignore[type-var]
    assert stamps != sorted(stamps)
    assert len(set(stamps)) < len(stamps)
    assert stamp_ns("2026-03-02T09:14:07.1Z") < stamp_ns("2026-03-02T09:14:07.12Z")  # type: ignore[operator]
    assert stamp_ns("2026-03-02T09:14:07.2Z") < stamp_ns("2026-03-02T09:14:07.200000001Z")  # type: ignore[operator]


def test_every_recorded_line_is_sent_once_in_order() -> None:
    got = _read(RecordedCluster(), LogOptions(timestamps=True))
    assert [line for c in got for line in c.lines] == LINES
    bare = _read(RecordedCluster(), LogOptions())
    assert [line for c in bare for line in c.lines] == [split_stamp(line)[1] for line in LINES]
    assert {c.container for c in got} == {"master"}


def test_a_resumed_follow_skips_only_what_it_read_again_by_position() -> None:
    """Lost after two of the traceback's four lines (one stamp); read again from three lines
    before that stamp: the two sent are skipped by their position among equals, the rest sent."""
    traceback_at = next(i for i, line in enumerate(LINES) if "Traceback" in line)
    cluster = RecordedCluster(lost_after=traceback_at + 2, resume_from=traceback_at - 3)
    got = _read(cluster, LogOptions(follow=True, timestamps=True))
    assert [line for c in got for line in c.lines] == LINES
    assert [c.notice for c in got if c.notice] == [
        "cluster c1: no answer; resuming when it answers",
        "cluster c1 answers again; the log goes on",
    ]
    assert cluster.asked[-1].since_s is not None
    assert cluster.asked[-1].tail_lines is None


class MemoryCluster:
    """The in-memory cluster's made-up pod log (`clusters.memory_logs`), behind the inspector calls."""

    async def replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        return []

    async def events(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[GangEvent]:
        return []

    def pod_log(self, tenant: TenantId, replica: ReplicaState, options: LogOptions) -> AsyncIterator[bytes]:
        return fake_log(replica, options)


def test_the_in_memory_clusters_lines_are_stamped_as_a_kubelet_stamps_them() -> None:
    """Lines are read with their stamps and the stamps taken off: a log without them lost its first
    word (`[memory]`) as if it were a stamp."""
    ended = ReplicaState(
        "g-master-0",
        "master",
        0,
        False,
        "n1",
        "Succeeded",
        0,
        0,
        "",
        "",
        1772442846.5,
        1772442850.0,
        "master",
    )
    got: list[Chunk] = []

    async def put(chunk: Chunk) -> None:
        got.append(chunk)

    for timestamps in (False, True):
        got.clear()
        asyncio.run(
            read_replica(
                MemoryCluster(),
                "mem",
                TenantId("vision"),
                Target("master", 0, ended),
                LogOptions(timestamps=timestamps),
                put,
                live=lambda: False,
                retry_s=0.01,
                clock=lambda: 1772442851.0,
            )
        )
        texts = [line for c in got for line in c.lines]
        if timestamps:
            assert texts == [
                "2026-03-02T09:14:06.5Z [memory] master-0 started on n1",
                "2026-03-02T09:14:10Z [memory] master-0 ended: Succeeded",
            ]
        else:
            assert texts == ["[memory] master-0 started on n1", "[memory] master-0 ended: Succeeded"]
