"""datasync pure parts: the diff, journal, token bucket, retries, cache LRU and the JSON codecs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from datasync.cache import CacheState, CopyKey, pin, plan_eviction, record_copy, touch, unpin
from datasync.codec import (
    CodecError,
    dataset_from_json,
    dataset_to_json,
    manifest_from_json,
    manifest_to_json,
    version_from_json,
    version_to_json,
)
from datasync.errors import AccessDenied, StoreUnavailable
from datasync.journal import JournalState, LocalJournal
from datasync.marker import SyncState, VerifiedObject
from datasync.model import (
    Dataset,
    DatasetName,
    DatasetVersion,
    Manifest,
    ManifestEntry,
    StoreLocation,
    StoreName,
    VersionId,
)
from datasync.plan import diff
from datasync.store import ObjectMeta, PartInfo
from datasync.throttle import Retrier, RetryPolicy, TokenBucket
from placement.model import TenantId


def entry(path: str, size: int = 10, sha: str = "h") -> ManifestEntry:
    return ManifestEntry(path, size, sha)


def seen(path: str, size: int = 10, etag: str = '"e1"') -> ObjectMeta:
    return ObjectMeta(path, size, etag, 0.0)


def verified(size: int = 10, etag: str = "e1", sha: str = "h") -> VerifiedObject:
    return VerifiedObject(size, etag, sha)


# --- the diff -------------------------------------------------------------------------------------

DIFF_CASES = [
    # (id, manifest entries, target listing, marker objects, journal finished, copy, up to date, delete)
    ("empty-target-copies-all", [entry("a"), entry("b")], [], {}, {}, ["a", "b"], [], []),
    ("verified-and-unchanged-is-skipped", [entry("a")], [seen("a")], {"a": verified()}, {}, [], ["a"], []),
    ("present-but-never-verified-is-copied", [entry("a")], [seen("a")], {}, {}, ["a"], [], []),
    (
        "etag-changed-since-verified",
        [entry("a")],
        [seen("a", etag='"e2"')],
        {"a": verified()},
        {},
        ["a"],
        [],
        [],
    ),
    ("size-changed", [entry("a", 11)], [seen("a", 11)], {"a": verified()}, {}, ["a"], [], []),
    ("new-content-in-manifest", [entry("a", sha="h2")], [seen("a")], {"a": verified()}, {}, ["a"], [], []),
    ("journal-finished-counts", [entry("a")], [seen("a")], {}, {"a": verified()}, [], ["a"], []),
    (
        "dropped-path-we-wrote-is-deleted",
        [entry("a")],
        [seen("a"), seen("old")],
        {"a": verified(), "old": verified()},
        {},
        [],
        ["a"],
        ["old"],
    ),
    (
        "foreign-object-is-left-alone",
        [entry("a")],
        [seen("a"), seen("theirs")],
        {"a": verified()},
        {},
        [],
        ["a"],
        [],
    ),
    (
        "dropped-and-already-gone",
        [entry("a")],
        [seen("a")],
        {"a": verified(), "old": verified()},
        {},
        [],
        ["a"],
        [],
    ),
]


@pytest.mark.parametrize(
    ("manifest_entries", "listing", "marker", "journal", "copy", "fresh", "delete"),
    [c[1:] for c in DIFF_CASES],
    ids=[c[0] for c in DIFF_CASES],
)
def test_diff(
    manifest_entries: list[ManifestEntry],
    listing: list[ObjectMeta],
    marker: dict[str, VerifiedObject],
    journal: dict[str, VerifiedObject],
    copy: list[str],
    fresh: list[str],
    delete: list[str],
) -> None:
    state = JournalState(finished=dict(journal))
    to_copy, up_to_date, to_delete = diff(
        Manifest(tuple(manifest_entries)),
        {m.path: m for m in listing},
        SyncState("d", marker) if marker else None,
        state,
    )
    assert [e.path for e in to_copy] == copy
    assert sorted(up_to_date) == fresh
    assert to_delete == delete


# --- journal --------------------------------------------------------------------------------------


def test_local_journal_replays_objects_uploads_and_parts_and_ignores_a_torn_line(tmp_path: Path) -> None:
    journal = LocalJournal.for_sync(tmp_path, "src", "dst", "digest")
    journal.object_finished("a", verified())
    journal.upload_started("big", "u1", 16)
    journal.part_finished("big", "u1", PartInfo(1, '"p1"', 16))
    journal.part_finished("big", "u0", PartInfo(2, '"stale"', 16))  # another upload: ignored
    with journal.path.open("a") as f:
        f.write('{"t":"part","p":"big","u":"u1","n":2,')  # the process died mid-write
    state = LocalJournal(journal.path).state()
    assert state.finished == {"a": verified()}
    assert state.uploads["big"].upload_id == "u1"
    assert state.uploads["big"].parts == {1: PartInfo(1, '"p1"', 16)}
    journal.clear()
    assert not journal.path.exists()


def test_an_object_finished_after_its_upload_drops_the_upload(tmp_path: Path) -> None:
    journal = LocalJournal(tmp_path / "j.jsonl")
    journal.upload_started("big", "u1", 16)
    journal.object_finished("big", verified())
    assert journal.state().uploads == {}


def test_journals_of_different_syncs_do_not_share_a_file(tmp_path: Path) -> None:
    assert (
        LocalJournal.for_sync(tmp_path, "a", "b", "d1").path
        != LocalJournal.for_sync(tmp_path, "a", "b", "d2").path
    )


# --- token bucket and retries ---------------------------------------------------------------------

BUCKET_CASES = [
    # (id, rate, burst, [(size, at time)], expected waits)
    ("within-burst-no-wait", 100.0, 100.0, [(50, 0.0), (50, 0.0)], [0.0, 0.0]),
    ("beyond-burst-waits-for-refill", 100.0, 100.0, [(100, 0.0), (50, 0.0)], [0.0, 0.5]),
    ("refill-after-pause", 100.0, 100.0, [(100, 0.0), (100, 1.0)], [0.0, 0.0]),
    ("refill-capped-at-burst", 100.0, 100.0, [(0, 0.0), (300, 10.0)], [0.0, 2.0]),
    ("larger-than-burst-goes-into-debt", 10.0, 10.0, [(110, 0.0)], [10.0]),
]


@pytest.mark.parametrize(
    ("rate", "burst", "calls", "waits"), [c[1:] for c in BUCKET_CASES], ids=[c[0] for c in BUCKET_CASES]
)
def test_token_bucket(rate: float, burst: float, calls: list[tuple[int, float]], waits: list[float]) -> None:
    bucket = TokenBucket(rate, burst)
    assert [round(bucket.reserve(n, t), 6) for n, t in calls] == waits


def test_token_bucket_long_run_rate_holds() -> None:
    bucket = TokenBucket(1000.0, 100.0)
    now = 0.0
    for _ in range(100):
        now += bucket.reserve(100, now)
    assert now == pytest.approx(9.9, rel=0.01)  # 10,000 bytes at 1,000 B/s after a 100-byte burst


async def test_retrier_retries_retryable_errors_with_growing_backoff() -> None:
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise StoreUnavailable("503")
        return "ok"

    retrier = Retrier(RetryPolicy(max_attempts=5, initial_backoff_s=1.0), sleep=sleep, seed=1)
    assert await retrier("x", flaky) == "ok"
    assert calls == 4
    assert retrier.retries == 3
    assert [0.5 <= s <= 1.0 for s in sleeps[:1]] == [True]
    assert 1.0 <= sleeps[1] <= 2.0
    assert 2.0 <= sleeps[2] <= 4.0


async def test_retrier_gives_up_at_once_on_a_permanent_error_and_after_max_attempts() -> None:
    async def sleep(s: float) -> None:
        return None

    async def denied() -> None:
        raise AccessDenied("403")

    async def down() -> None:
        raise StoreUnavailable("503")

    retrier = Retrier(RetryPolicy(max_attempts=3), sleep=sleep)
    with pytest.raises(AccessDenied):
        await retrier("x", denied)
    assert retrier.retries == 0
    with pytest.raises(StoreUnavailable):
        await retrier("x", down)
    assert retrier.retries == 2


def test_backoff_is_capped() -> None:
    policy = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=5.0)
    assert policy.backoff_s(20, random.Random(0)) <= 5.0


# --- cache ----------------------------------------------------------------------------------------

S = StoreName("gcp-cache")


def key(name: str) -> CopyKey:
    return CopyKey(S, DatasetName(name), VersionId("v1"))


def cache_with(*copies: tuple[str, int, float]) -> CacheState:
    state = CacheState()
    for name, size, used in copies:
        state = record_copy(state, key(name), size, used)
    return state


EVICTION_CASES = [
    # (id, copies (name, size, last used), pinned, capacity, incoming, evicted, fits)
    ("under-capacity-evicts-nothing", [("a", 10, 1), ("b", 10, 2)], [], 30, 0, [], True),
    ("least-recently-used-first", [("a", 10, 3), ("b", 10, 1), ("c", 10, 2)], [], 20, 0, ["b"], True),
    ("room-for-incoming", [("a", 10, 3), ("b", 10, 1), ("c", 10, 2)], [], 30, 15, ["b", "c"], True),
    ("pinned-never-evicted", [("a", 10, 3), ("b", 10, 1), ("c", 10, 2)], ["b"], 20, 0, ["c"], True),
    ("all-pinned-does-not-fit", [("a", 10, 1), ("b", 10, 2)], ["a", "b"], 10, 0, [], False),
]


@pytest.mark.parametrize(
    ("copies", "pinned", "capacity", "incoming", "evicted", "fits"),
    [c[1:] for c in EVICTION_CASES],
    ids=[c[0] for c in EVICTION_CASES],
)
def test_plan_eviction(
    copies: list[tuple[str, int, float]],
    pinned: list[str],
    capacity: int,
    incoming: int,
    evicted: list[str],
    fits: bool,
) -> None:
    state = cache_with(*copies)
    for name in pinned:
        state = pin(state, key(name), "job-1", 0.0)
    decision = plan_eviction(state, S, capacity, incoming)
    assert [k.dataset for k in decision.evict] == evicted
    assert decision.fits is fits
    assert not fits or decision.reason == ""


def test_pins_are_per_job_and_idempotent_and_use_refreshes_recency() -> None:
    state = cache_with(("a", 10, 1), ("b", 10, 2))
    state = pin(state, key("a"), "j1", 5.0)
    state = pin(state, key("a"), "j1", 5.0)
    state = pin(state, key("a"), "j2", 5.0)
    state = unpin(state, key("a"), "j1", 6.0)
    a = state.get(key("a"))
    assert a is not None
    assert a.pinned_by == {"j2"}
    assert plan_eviction(state, S, 10).evict == (key("b"),)
    state = unpin(state, key("a"), "j2", 7.0)
    state = touch(state, key("b"), 8.0)
    assert plan_eviction(state, S, 10).evict == (key("a"),)  # a used at 7, b at 8
    assert [c.key.store for c in state.locations(DatasetName("a"), VersionId("v1"))] == [S]


# --- codecs ---------------------------------------------------------------------------------------


def a_version(v: str = "v1") -> DatasetVersion:
    return DatasetVersion(
        dataset=DatasetName("imagenet"),
        version=VersionId(v),
        home=StoreLocation(StoreName("onprem"), "datasets/imagenet/v1"),
        manifest_digest="ab" * 32,
        size_bytes=123,
        object_count=2,
        created_at_s=1000.5,
    )


def test_manifest_json_round_trips_and_is_stable_whatever_the_input_order() -> None:
    m1 = Manifest((entry("b/ü.bin", 2, "x"), entry("a", 1, "y")))
    m2 = Manifest((entry("a", 1, "y"), entry("b/ü.bin", 2, "x")))
    assert manifest_to_json(m1) == manifest_to_json(m2)
    assert manifest_from_json(manifest_to_json(m1)) == m1
    assert m1.total_size_bytes == 3
    assert m1.digest == m2.digest


def test_dataset_and_version_json_round_trip() -> None:
    dataset = Dataset(
        DatasetName("imagenet"),
        TenantId("vision"),
        StoreName("onprem"),
        (a_version("v1"), a_version("v2")),
        frozenset({TenantId("nlp")}),
    )
    assert dataset_from_json(dataset_to_json(dataset)) == dataset
    assert dataset_to_json(dataset_from_json(dataset_to_json(dataset))) == dataset_to_json(dataset)
    assert version_from_json(version_to_json(a_version())) == a_version()
    assert dataset.visible_to(TenantId("nlp"))
    assert not dataset.visible_to(TenantId("other"))


@pytest.mark.parametrize(
    "doc",
    [b"not json", b"[]", b'{"format":"gpufed.dataset/1"}', b'{"format":"other/1","entries":[]}'],
    ids=["not-json", "not-an-object", "wrong-format", "missing-fields"],
)
def test_codecs_reject_bad_documents(doc: bytes) -> None:
    with pytest.raises(CodecError):
        manifest_from_json(doc)
    with pytest.raises(CodecError):
        dataset_from_json(doc)


def test_a_manifest_lists_each_path_once() -> None:
    with pytest.raises(ValueError):
        Manifest((entry("a"), entry("a")))
