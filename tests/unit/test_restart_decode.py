"""What the restart's fast paths must not change (issue 19, restart to serving).

Records are decoded by type (`job_from_json`, `interval_from_json`) instead of `json.loads` and the
dict codecs: a record of today, or one written before a field existed, must come out exactly as
the dict codec makes it, and a record the typed decode refuses must still load the old way. The
job cache's index is built with one sort, and a new leader reads the wait reasons already stored
instead of writing them all again.
"""

from __future__ import annotations

import gc
import json
from dataclasses import replace
from typing import Any

import pytest

from federation.ledger.cache import LedgerCache
from federation.spec.jobspec import DatasetRef
from federation.store.intervals import (
    IntervalEnd,
    LedgerInterval,
    interval_from_dict,
    interval_from_json,
    interval_to_dict,
)
from federation.store.job_cache import JobCache
from federation.store.job_cache_index import list_key
from federation.store.job_store import (
    FREEZE_AFTER_OBJECTS,
    InMemoryJobStore,
    Stored,
    job_key,
    paused_gc,
)
from federation.store.jobs import (
    BurstOffer,
    DispatchRefusal,
    JobPlacement,
    JobRecord,
    PhaseEvent,
    PreemptionOrder,
    job_from_dict,
    job_from_json,
    job_to_dict,
)
from federation.store.kv_memory import MemoryKv
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, TenantId
from tests.conftest import build_job


def _dumps(d: dict[str, Any]) -> bytes:
    return json.dumps(d, separators=(",", ":")).encode()


def _varied_jobs() -> list[JobRecord]:
    """Records with every optional part set one way or the other."""
    base = build_job("plain", tenant="t1", annotations=(("a", "1"), ("b", "2")))
    running = replace(
        build_job("running", tenant="t2", gpus=4, replicas=3),
        phase=JobPhase.RUNNING,
        attempt=3,
        retries_used=1,
        placement=JobPlacement(ClusterName("onprem"), GpuType("H100"), CapacityKind.SPOT, 1.25),
        events=(
            PhaseEvent(JobPhase.QUEUED, 10.0, 1),
            PhaseEvent(JobPhase.ADMITTED, 11.5, 1, "fits"),
            PhaseEvent(JobPhase.RUNNING, 13.0, 3, "again"),
        ),
        preemption=PreemptionOrder(JobId("urgent"), "lower_priority", 30.0, 14.0, 9.0),
        refusals=(DispatchRefusal(ClusterName("cloud"), 2, 1.0, 2.0, 4.0, "quota"),),
        message="running",
        reason="OOMKilled",
        cancel_requested=True,
    )
    with_dataset = replace(
        base,
        job_id=JobId("data"),
        spec=replace(
            base.spec,
            dataset=DatasetRef("imagenet", "v2"),
            deadline_s=3600.0,
            labels=(("team", "vision"),),
            tenant=None,
        ),
        submitted_at_s=5.0,
        queued_at_s=5.0,
    )
    # A move back to private GPUs of a job that says it resumes from a checkpoint.
    moving = replace(
        running,
        job_id=JobId("moving"),
        spec=replace(running.spec, resumable=True),
        preemption=PreemptionOrder(
            JobId("moving"), "saves 500 USD", 30.0, 14.0, 9.0, ClusterName("onprem"), GpuType("A100")
        ),
    )
    ended = replace(
        running,
        job_id=JobId("ended"),
        phase=JobPhase.SUCCEEDED,
        preemption=None,
        events=(*running.events, PhaseEvent(JobPhase.SUCCEEDED, 20.0, 3, "done")),
    )
    # A job whose attempt waited for private GPUs, with what bursting at once would have cost.
    waited = replace(
        running,
        job_id=JobId("waited"),
        burst_offer=BurstOffer(ClusterName("aws"), GpuType("H100"), CapacityKind.ON_DEMAND, 4.1, 12.0, 3),
    )
    return [base, running, with_dataset, ended, moving, waited]


@pytest.mark.parametrize("job", _varied_jobs(), ids=lambda j: j.job_id)
def test_a_record_decodes_by_type_as_the_dict_codec_decodes_it(job: JobRecord) -> None:
    raw = _dumps(job_to_dict(job))
    assert job_from_json(raw) == job_from_dict(json.loads(raw)) == job


def test_a_record_older_than_retries_used_counts_its_earlier_attempts_as_retries() -> None:
    # Records written before `retries_used` existed: every new attempt was a retry. The typed
    # decode alone would say 0 (the dataclass's default).
    job = replace(build_job("old"), attempt=3, retries_used=2)
    d = job_to_dict(job)
    for newer in ("retries_used", "preemption", "refusals", "reason"):
        del d[newer]
    decoded = job_from_json(_dumps(d))
    assert decoded == job_from_dict(d)
    assert decoded.retries_used == 2


def test_a_record_older_than_moves_is_not_resumable_and_its_preemption_no_move() -> None:
    job = _varied_jobs()[1]
    d = job_to_dict(job)
    del d["spec"]["resumable"]
    del d["preemption"]["move_to"]
    del d["preemption"]["move_gpu_type"]
    for decoded in (job_from_json(_dumps(d)), job_from_dict(d)):
        assert decoded == job
        assert decoded.spec.resumable is False
        assert decoded.preemption is not None
        assert decoded.preemption.move_to is None


def test_a_record_of_other_json_types_loads_the_old_way() -> None:
    # Integers where floats are stored and a float where an int is: the dict codec coerces them.
    job = build_job("coerced")
    d = job_to_dict(job)
    d["priority"] = float(d["priority"])
    d["submitted_at_s"] = int(d["submitted_at_s"])
    d["spec"]["tasks"][0]["replicas"] = float(d["spec"]["tasks"][0]["replicas"])
    assert job_from_json(_dumps(d)) == job_from_dict(d)
    assert isinstance(job_from_json(_dumps(d)).priority, int)


def test_a_record_that_is_not_one_fails_as_before() -> None:
    with pytest.raises(KeyError):
        job_from_json(b'{"job_id": "x"}')
    with pytest.raises(ValueError):
        job_from_json(b"{not json")


def _interval(**changes: Any) -> LedgerInterval:
    interval = LedgerInterval(
        job_id=JobId("j1"),
        attempt=2,
        tenant=TenantId("t1"),
        user="alice",
        cluster=ClusterName("onprem"),
        provider="private",
        region="dc1",
        gpu_type=GpuType("H100"),
        gpu_count=8,
        kind=CapacityKind.PRIVATE,
        start_s=100.0,
        end_s=None,
        usd_per_gpu_hour=2.2,
    )
    return replace(interval, **changes)


@pytest.mark.parametrize(
    "interval",
    [_interval(), _interval(end_s=200.5, ended=IntervalEnd.PREEMPTED, job_name="train")],
    ids=["open", "closed"],
)
def test_an_interval_decodes_by_type_as_the_dict_codec_decodes_it(interval: LedgerInterval) -> None:
    raw = _dumps(interval_to_dict(interval))
    assert interval_from_json(raw) == interval_from_dict(json.loads(raw)) == interval


def test_an_interval_older_than_its_end_and_name_loads() -> None:
    d = interval_to_dict(_interval(end_s=150.0))
    del d["ended"], d["job_name"]
    d["start_s"] = 100  # an int, as a hand-written record might have it
    assert interval_from_json(_dumps(d)) == interval_from_dict(d)


async def test_the_cache_of_stored_records_old_and_new_is_what_decoding_each_eagerly_gives() -> None:
    """The job cache over raw records as etcd holds them (today's, older ones, other JSON types):
    every job as the dict codec decodes it, the live ones apart, every listing in list order."""
    kv = MemoryKv()
    raws: dict[JobId, bytes] = {}
    for n in range(300):
        job = _varied_jobs()[n % 4]
        job = replace(
            job,
            job_id=JobId(f"j{n:04d}"),
            tenant=TenantId(f"t{n % 3}"),
            submitted_at_s=float(n % 17),
            phase=(JobPhase.QUEUED, JobPhase.RUNNING, JobPhase.SUCCEEDED, JobPhase.FAILED)[n % 4],
        )
        d = job_to_dict(job)
        if n % 5 == 0:
            del d["retries_used"], d["refusals"], d["reason"]
        if n % 7 == 0:
            d["priority"] = float(d["priority"])
        raws[job.job_id] = _dumps(d)
        await kv.put(job_key(job.job_id), raws[job.job_id])
    cache = JobCache(InMemoryJobStore(kv))
    await cache.start()
    try:
        eager = {job_id: job_from_dict(json.loads(raw)) for job_id, raw in raws.items()}
        assert {s.value.job_id: s.value for s in cache.jobs()} == eager
        assert {s.value.job_id for s in cache.live_jobs()} == {
            job_id for job_id, job in eager.items() if not job.phase.is_terminal
        }
        for tenant in (None, TenantId("t1")):
            for phases in ((), (JobPhase.RUNNING,), (JobPhase.QUEUED, JobPhase.FAILED)):
                want = sorted(
                    (
                        j
                        for j in eager.values()
                        if (tenant is None or j.tenant == tenant) and (not phases or j.phase in phases)
                    ),
                    key=list_key,
                )
                assert [s.value for s in cache.ordered(tenant, phases)] == want
                got_back = [s.value for s in cache.ordered(tenant, phases, newest_first=True)]
                assert got_back == want[::-1]
    finally:
        await cache.stop()


async def test_the_ledger_cache_of_stored_intervals_is_what_decoding_each_eagerly_gives() -> None:
    kv = MemoryKv()
    want = {}
    for n in range(50):
        interval = _interval(job_id=JobId(f"j{n:03d}"), end_s=None if n % 2 else 500.0 + n)
        d = interval_to_dict(interval)
        if n % 3 == 0:
            del d["ended"], d["job_name"]
        await kv.put(interval.key, _dumps(d))
        want[interval.key] = interval_from_dict(d)
    ledger = LedgerCache(InMemoryJobStore(kv))
    await ledger.start()
    try:
        assert {iv.key: iv for iv in ledger.intervals()} == want
    finally:
        await ledger.stop()


def test_what_a_pause_made_in_bulk_is_frozen_and_a_little_is_not() -> None:
    gc.collect()
    frozen = gc.get_freeze_count()
    try:
        with paused_gc():
            small = [[n] for n in range(100)]
        assert gc.get_freeze_count() == frozen
        with paused_gc():
            # Lists are tracked by the collector: each one counts.
            bulk = [[n] for n in range(FREEZE_AFTER_OBJECTS + 1000)]
        assert gc.get_freeze_count() >= frozen + FREEZE_AFTER_OBJECTS
        assert gc.isenabled()
        del small, bulk
    finally:
        gc.unfreeze()


def _ended(job_id: str, *, submitted_at_s: float) -> JobRecord:
    job = replace(_varied_jobs()[3], job_id=JobId(job_id), submitted_at_s=submitted_at_s)
    return replace(job, queued_at_s=submitted_at_s)


async def test_ended_jobs_listed_undecoded_still_follow_the_watch_and_a_relist() -> None:
    """The cache lists ended jobs without decoding them; each reads as decoding it eagerly gives,
    a change to one (watched, or found by the relist after a compaction) replaces it, a deletion
    (the archiver's) takes it out of every listing."""
    kv = MemoryKv()
    store = InMemoryJobStore(kv)
    queued = build_job("queued")
    for job in (_ended("e1", submitted_at_s=1.0), _ended("e2", submitted_at_s=2.0), queued):
        await kv.put(job_key(job.job_id), _dumps(job_to_dict(job)))
    cache = JobCache(store)
    await cache.start()
    try:
        e1, e2 = cache.get(JobId("e1")), cache.get(JobId("e2"))
        assert e1 is not None
        assert e2 is not None
        assert not e1.decoded, "an ended job is not decoded by the list"
        assert [s.value.job_id for s in cache.ordered(None, (JobPhase.SUCCEEDED,))] == ["e1", "e2"]
        assert e1.decoded
        assert [s.value.job_id for s in cache.live_jobs()] == ["queued"]

        # Watched: a change to an ended job, then the archiver's deletion of the other.
        changed = replace(e2.value, message="archived soon")
        revision = await store.commit([(changed, e2.mod_revision)])
        assert revision is not None
        await kv.delete(job_key("e1"))
        assert await cache.wait_for_revision(revision + 1, timeout_s=3)
        assert cache.get(JobId("e2")) == type(e2)(changed, revision)
        assert cache.get(JobId("e1")) is None
        assert [s.value.job_id for s in cache.ordered()] == ["e2", "queued"]

        # Changed behind the watch and compacted: the relist finds it, and announces it.
        events = cache.subscribe()
        behind = replace(changed, message="changed behind the watch")
        revision = await kv.put(job_key("e2"), _dumps(job_to_dict(behind)))
        await kv.compact(kv.revision)
        assert await cache.wait_for_revision(revision, timeout_s=3)
        relisted = cache.get(JobId("e2"))
        assert relisted is not None
        assert relisted.value == behind
        assert relisted.mod_revision == revision
        event = events.get_nowait()
        assert event is not None
        assert (event.job_id, event.job, event.mod_revision) == ("e2", behind, revision)
    finally:
        await cache.stop()


def test_a_stored_value_decoded_on_read_equals_the_same_value_decoded_at_once() -> None:
    job = _varied_jobs()[3]
    raw = _dumps(job_to_dict(job))
    lazy = Stored.decoded_on_read(raw, job_from_json, 7)
    eager = Stored(job, 7)
    assert lazy == eager
    assert eager == lazy
    assert hash(lazy) == hash(eager)
    assert lazy != Stored(job, 8)
    assert Stored.decoded_on_read(raw, job_from_json, 7).value == job


def test_an_ended_record_the_decoder_refuses_fails_when_read() -> None:
    # The head decodes; the rest does not: the failure the eager list raised comes on reading it.
    d = job_to_dict(_varied_jobs()[3])
    del d["spec"]
    lazy = Stored.decoded_on_read(_dumps(d), job_from_json, 1)
    with pytest.raises(KeyError):
        _ = lazy.value
    with pytest.raises(KeyError):
        _ = lazy.value
