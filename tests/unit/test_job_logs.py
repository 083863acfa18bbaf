"""The pure parts of `gpufed logs`: failure reasons, where a pod sits in the spec, the kept copy's
cuts, the limits, the config section, and a follow that resumes after its cluster stopped answering."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import click
import pytest

from clusters.api import ClusterUnreachable, GangEvent, LogOptions, ReplicaState
from clusters.logtext import last_bytes
from federation.api.logs import StreamLimits
from federation.cli.logs import parse_since
from federation.errors import InvalidSpec, RateLimited
from federation.joblogs.archive import (
    KeptAttempt,
    KeptReplica,
    LogArchive,
    LogsSettings,
    failure_reason,
    locate,
    parse_logs,
    waiting_reason,
)
from federation.joblogs.stream import Chunk, Target, read_replica, select_kept
from federation.spec.jobspec import RestartPolicy, TaskSpec, TrainingJobSpec
from federation.store.kv_memory import MemoryKv
from placement.model import GpuType, GpuTypePolicy, JobId, TenantId
from tests.history_builders import a_kept_attempt


def a_replica(
    reason: str = "", exit_code: int | None = None, *, task: str = "worker", index: int = 0
) -> ReplicaState:
    return ReplicaState(f"p-{task}-{index}", task, index, False, "n1", "Failed", 0, exit_code, reason, "")


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        pytest.param([], "", id="no-pods"),
        pytest.param([a_replica("Completed", 0)], "Completed", id="plain-reason"),
        pytest.param([a_replica("Error", 3)], "Error (exit 3)", id="exit-code"),
        pytest.param(
            [a_replica("Error", 1), a_replica("OOMKilled", 137)], "OOMKilled", id="oom-before-its-echo"
        ),
        pytest.param([a_replica("Evicted")], "Evicted", id="evicted"),
        pytest.param([a_replica("", 2)], "Error (exit 2)", id="exit-without-reason"),
        pytest.param([a_replica("ImagePullBackOff")], "ImagePullBackOff", id="image-pull"),
    ],
)
def test_failure_reason(replicas: list[ReplicaState], expected: str) -> None:
    assert failure_reason(replicas) == expected


def test_waiting_reason_only_names_what_waiting_will_not_cure() -> None:
    assert waiting_reason([a_replica("ContainerCreating")]) == ""
    assert waiting_reason([a_replica("ContainerCreating"), a_replica("ErrImagePull")]) == "ErrImagePull"


SPEC = TrainingJobSpec(
    name="ddp",
    tenant=TenantId("vision"),
    priority_class="default",
    tasks=(
        TaskSpec("master", 1, "img", (), (), 1),
        TaskSpec("worker", 3, "img", (), (), 1),
    ),
    gpu_types=(GpuType("A100"),),
    gpu_type_policy=GpuTypePolicy.ANY,
    min_available=4,
    max_runtime_s=0,
    restart_policy=RestartPolicy(),
    allow_spot=False,
    dataset=None,
    deadline_s=None,
    labels=(),
    annotations=(),
)


def test_locate_by_rank_and_by_task() -> None:
    by_rank = replace(a_replica(task="master"), by_rank=True, index=2)
    assert locate(by_rank, SPEC, JobId("ddp-1"), 1) == ("worker", 1)
    assert locate(a_replica(task="worker", index=2), SPEC, JobId("ddp-1"), 1) == ("worker", 2)


def test_kept_copy_is_cut_by_since_tail_and_stamps() -> None:
    data = b"".join(f"2026-11-25T10:00:{s:02d}.000000000Z line {s}\n".encode() for s in range(10))
    now_s = 1795600805.0  # 2026-11-25T10:00:05Z
    assert select_kept(data, LogOptions(tail_lines=2), now_s) == ["line 8", "line 9"]
    assert select_kept(data, LogOptions(since_s=2), now_s)[0] == "line 3"
    assert select_kept(data, LogOptions(tail_lines=1, timestamps=True), now_s) == [
        "2026-11-25T10:00:09.000000000Z line 9"
    ]
    assert select_kept(data, LogOptions(tail_lines=0), now_s) == []


def test_last_bytes_starts_at_a_whole_line() -> None:
    data = b"aaaa\nbbbb\ncccc\n"
    assert last_bytes(data, 100) == data
    assert last_bytes(data, 7) == b"cccc\n"


def test_parse_since() -> None:
    assert parse_since("10m") == 600
    assert parse_since("1h30m") == 5400
    assert parse_since("500ms") == 1
    with pytest.raises(click.BadParameter):
        parse_since("ten minutes")


def test_logs_config_section() -> None:
    settings = parse_logs({"logs": {"keepKiB": 64, "retainHours": 24, "maxStreamsPerTenant": 3}})
    assert (settings.keep_bytes, settings.retain_hours, settings.max_streams_per_tenant) == (65536, 24.0, 3)
    assert parse_logs({}).keep_kib == 256
    with pytest.raises(InvalidSpec, match=r"logs\.keepKB"):
        parse_logs({"logs": {"keepKB": 1}})
    with pytest.raises(InvalidSpec, match=r"logs\.keepKiB"):
        parse_logs({"logs": {"keepKiB": 4096}})


def test_stream_limits_per_tenant_then_per_server() -> None:
    limits = StreamLimits(per_tenant=1, per_server=2)
    with limits.slot(TenantId("a")):
        with pytest.raises(RateLimited, match="tenant a already has 1"), limits.slot(TenantId("a")):
            pass
        with (
            limits.slot(TenantId("b")),
            pytest.raises(RateLimited, match="already streams 2"),
            limits.slot(TenantId("c")),
        ):
            pass
    with limits.slot(TenantId("a")):
        pass


class FlakyCluster:
    """Lines 0-5, then the connection is lost; read again, it answers from `since` (overlapping)."""

    def __init__(self) -> None:
        self.asked: list[LogOptions] = []

    async def replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        return []

    async def events(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[GangEvent]:
        return []

    async def pod_log(
        self, tenant: TenantId, replica: ReplicaState, options: LogOptions
    ) -> AsyncIterator[bytes]:
        self.asked.append(options)
        if len(self.asked) == 1:
            yield b"".join(f"2026-11-25T10:00:0{i}.000000000Z line {i}\n".encode() for i in range(6))
            raise ClusterUnreachable("cluster c1: no answer")
        if len(self.asked) == 2:
            raise ClusterUnreachable("cluster c1: no answer")
        yield b"".join(f"2026-11-25T10:00:0{i}.000000000Z line {i}\n".encode() for i in range(4, 9))


def test_a_follow_resumes_where_it_was_without_repeating() -> None:
    cluster = FlakyCluster()
    got: list[Chunk] = []

    async def put(chunk: Chunk) -> None:
        got.append(chunk)

    target = Target("worker", 0, a_replica())
    asyncio.run(
        read_replica(
            cluster,
            "c1",
            TenantId("vision"),
            target,
            LogOptions(follow=True, tail_lines=100),
            put,
            live=lambda: True,
            retry_s=0.01,
            clock=lambda: 1795600810.0,
        )
    )
    lines = [line for c in got for line in c.lines]
    assert lines == [f"line {i}" for i in range(9)]
    notices = [c.notice for c in got if c.notice]
    assert notices == [
        "cluster c1: no answer; resuming when it answers",
        "cluster c1 answers again; the log goes on",
    ]
    assert cluster.asked[0].timestamps  # stamps asked for always, to resume by
    assert cluster.asked[-1].tail_lines is None
    assert cluster.asked[-1].since_s == 6  # back to just before the last line seen (10:00:05)


def test_without_follow_an_unreachable_cluster_is_an_error() -> None:
    async def put(chunk: Chunk) -> None:
        pass

    cluster = FlakyCluster()
    with pytest.raises(ClusterUnreachable):
        asyncio.run(
            read_replica(
                cluster,
                "c1",
                TenantId("vision"),
                Target("worker", 0, a_replica()),
                LogOptions(),
                put,
                live=lambda: True,
                retry_s=0.01,
                clock=lambda: 0.0,
            )
        )


def test_kept_attempts_round_trip_and_expire_at_the_retention() -> None:
    kv = MemoryKv()
    archive = LogArchive(kv, LogsSettings(retain_hours=1.0))
    state = a_replica("OOMKilled", 137)
    kept = KeptAttempt(
        attempt=1,
        cluster="onprem",
        gpu_type="A100",
        capacity_kind="private",
        usd_per_gpu_hour=1.1,
        started_at_s=100.0,
        finished_at_s=160.0,
        outcome="FAILED",
        reason="OOMKilled",
        kept_at_s=1000.0,
        note="",
        replicas=(KeptReplica("worker", 0, state, 6),),
    )

    async def run() -> tuple[KeptAttempt | None, bytes, KeptAttempt | None, int]:
        await archive.keep("job-1", kept, {("worker", 0): b"x y z\n"})
        fresh = await archive.summary("job-1", 1, now_s=1000.0 + 3599)
        data = await archive.log("job-1", 1, "worker", 0)
        stale = await archive.summary("job-1", 1, now_s=1000.0 + 3601)
        lease = (await kv.get(b"/gpufed/logs/job-1/1/worker-0")).lease  # type: ignore[union-attr]
        return fresh, data, stale, lease

    fresh, data, stale, lease = asyncio.run(run())
    assert fresh == kept
    assert data == b"x y z\n"
    assert stale is None
    assert lease != 0, "kept copies go with a lease, so that etcd forgets them"


@pytest.mark.parametrize(
    ("replicas", "tail_bytes", "revisions"),
    [
        pytest.param(4, 1000, 1, id="small-tails-and-summary-in-one-transaction"),
        pytest.param(3, 700 * 1024, 3, id="tails-over-one-request-split-with-the-summary-last"),
    ],
)
def test_an_attempt_is_kept_in_as_few_transactions_as_fit(
    replicas: int, tail_bytes: int, revisions: int
) -> None:
    """One round trip (one revision) per ended attempt when its tails fit in one etcd request; when
    they do not, several, and the summary (which says the tails are there) never before a tail."""
    kv = MemoryKv()
    archive = LogArchive(kv, LogsSettings(retain_hours=1.0, keep_kib=1024))
    state = a_replica("Completed", 0)
    kept = a_kept_attempt(
        1,
        tuple(KeptReplica("worker", i, state, tail_bytes) for i in range(replicas)),
        started_at_s=100.0,
        finished_at_s=160.0,
        kept_at_s=1000.0,
    )
    logs = {("worker", i): bytes([65 + i]) * tail_bytes for i in range(replicas)}

    async def run() -> dict[bytes, int]:
        before = (await kv.range_prefix(b"/gpufed/")).revision
        await archive.keep("job-1", kept, logs)
        found = await kv.range_prefix(b"/gpufed/logs/job-1/")
        assert [await archive.log("job-1", 1, "worker", i) for i in range(replicas)] == list(logs.values())
        return {k.key: k.mod_revision - before for k in found.kvs}

    written = asyncio.run(run())
    assert len(written) == replicas + 1
    assert len(set(written.values())) == revisions
    summary = written.pop(b"/gpufed/logs/job-1/1/_attempt")
    assert summary >= max(written.values())


class CountingKv(MemoryKv):
    """MemoryKv that counts the requests it is sent (a lone txn or a batch of nested ones)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[int] = []

    async def txn(self, compares, success, failure=()):  # type: ignore[no-untyped-def]
        self.requests.append(1)
        return await super().txn(compares, success, failure)

    async def txn_many(self, txns):  # type: ignore[no-untyped-def]
        self.requests.append(len(txns))
        return await super().txn_many(txns)


def test_attempts_kept_together_share_requests_each_whole() -> None:
    """A tick that ends many attempts keeps them in a few etcd requests (group commit), not one
    each; each attempt's tails and summary are still all there, its own bytes under its own keys."""
    kv = CountingKv()
    archive = LogArchive(kv, LogsSettings(retain_hours=1.0))
    state = a_replica("Completed", 0)

    def kept(i: int) -> KeptAttempt:
        return a_kept_attempt(
            1,
            (KeptReplica("worker", 0, state, 8),),
            started_at_s=1.0,
            finished_at_s=2.0,
            kept_at_s=1000.0 + i,
        )

    async def run() -> None:
        await asyncio.gather(
            *(archive.keep(f"job-{i}", kept(i), {("worker", 0): f"job-{i}\n".encode()}) for i in range(40))
        )
        for i in range(40):
            assert await archive.log(f"job-{i}", 1, "worker", 0) == f"job-{i}\n".encode()
            assert await archive.summary(f"job-{i}", 1, now_s=1000.0) == kept(i)

    asyncio.run(run())
    assert sum(kv.requests) == 40
    assert len(kv.requests) <= 3, kv.requests


def test_a_summary_is_written_as_asdict_writes_it() -> None:
    """The summary's JSON is built field by field (asdict deep-copies): byte for byte the same."""
    import json
    from dataclasses import asdict

    from federation.joblogs.archive import _summary_json

    states = (a_replica("OOMKilled", 137), replace(a_replica(), started_at_s=1.5, container="main"))
    kept = replace(
        a_kept_attempt(
            2,
            tuple(KeptReplica("worker", i, s, 10 * i, "cut") for i, s in enumerate(states)),
            started_at_s=0.5,
            finished_at_s=3.0,
        ),
        note="n",
        started_at_s=None,
    )
    assert _summary_json(kept) == json.dumps(asdict(kept), separators=(",", ":")).encode()
