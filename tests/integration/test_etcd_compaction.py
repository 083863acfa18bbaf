"""etcd's size under put/delete churn: with the auto-compaction every `EtcdProcess` now runs, the
compacted revision advances and the database stops growing; without it, the same churn grows the
database round after round, although every key written is deleted again. etcdctl is the judge."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from federation.runtime.etcd_process import EtcdProcess
from federation.scheduling.compactor import Compactor
from federation.scheduling.leader import LeaderElection
from federation.store.kv import Delete, Put, WatchEvent
from federation.store.kv_etcd import EtcdKv
from tests.contract.helpers import eventually
from tests.e2e.harness import wait_for
from tests.etcdctl import compacted_past, endpoint_status, etcdctl

ROUNDS = 12
KEYS_PER_ROUND = 250
VALUE = b"x" * 4096
ROUND_BYTES = KEYS_PER_ROUND * len(VALUE)  # about 1 MiB written, then deleted, per round
# What compaction must keep the file under: the live history of a round or two, plus bbolt's own
# pages. Without compaction the rounds add up to ROUNDS x ROUND_BYTES (12 MiB) of history.
BOUND_BYTES = 5 * ROUND_BYTES


async def _churn_round(kv: EtcdKv, round_no: int) -> int:
    """Write a round of keys and delete them all again; the revision after the deletes."""
    keys = [f"/churn/{round_no}/{i}".encode() for i in range(KEYS_PER_ROUND)]
    for start in range(0, len(keys), 100):
        await kv.txn([], [Put(k, VALUE) for k in keys[start : start + 100]])
    for start in range(0, len(keys), 100):
        result = await kv.txn([], [Delete(k) for k in keys[start : start + 100]])
    return result.revision


# etcd's periodic compaction with a short retention, so that each round waits a fraction of a second
# for it: the sizes it leaves are the same as with 1 s (3.0 MB a round on, measured), in a quarter
# of the time. etcd takes any Go duration here.
COMPACTION_RETENTION = "250ms"


@pytest.mark.parametrize("compaction", [COMPACTION_RETENTION, None], ids=["auto-compaction", "no-compaction"])
async def test_churn_leaves_etcd_small_only_with_compaction(tmp_path: Path, compaction: str | None) -> None:
    process = EtcdProcess(tmp_path / "etcd", compaction_retention=compaction)
    process.start()
    kv = await EtcdKv.connect(process.endpoint)
    try:
        assert f"--quota-backend-bytes={2 * 1024**3}" in process._command()
        sizes: list[int] = []
        for round_no in range(ROUNDS):
            revision = await _churn_round(kv, round_no)
            if compaction is not None:
                # etcd's compactor, not ours, drops this round's history (within about two retentions).
                wait_for(lambda rev=revision: compacted_past(process.endpoint, rev - 1), timeout_s=30)
            sizes.append(endpoint_status(process.endpoint).db_size_bytes)
        final = endpoint_status(process.endpoint)
        early_history_gone = compacted_past(process.endpoint, 2)
    finally:
        await kv.close()
        process.stop()
    if compaction is not None:
        assert max(sizes) < BOUND_BYTES, sizes
        # Flat: the later rounds reuse the pages compaction freed instead of growing the file. bbolt
        # reuses a freed page only once no read transaction that could see it is open, so on a
        # loaded machine one round may find the last one's pages still pending and grow the file
        # by about a round (seen once in seven runs beside a soak: 1.6 -> 3.1 MB). Two rounds of
        # slack over the last six still tells flat from growing: without compaction those six
        # rounds add six.
        assert sizes[-1] <= sizes[ROUNDS // 2] + 2 * ROUND_BYTES, sizes
        assert final.db_size_in_use_bytes <= final.db_size_bytes
        assert early_history_gone
    else:
        assert final.db_size_bytes > ROUNDS * ROUND_BYTES * 0.9, sizes
        assert not early_history_gone


def test_a_compacted_revision_is_refused_to_etcdctl(tmp_path: Path) -> None:
    with EtcdProcess(tmp_path / "etcd", compaction_retention=COMPACTION_RETENTION) as process:
        put = json.loads(etcdctl(process.endpoint, "put", "/k", "v1", "-w", "json").stdout)
        first = int(put["header"]["revision"])
        etcdctl(process.endpoint, "put", "/k", "v2")
        wait_for(lambda: compacted_past(process.endpoint, first), timeout_s=30)
        assert etcdctl(process.endpoint, "get", "/k", "--print-value-only").stdout.strip() == "v2"


async def test_the_leader_compacts_an_etcd_that_does_not_compact_itself(tmp_path: Path) -> None:
    """An external etcd run without `--auto-compaction-*`: the leader's compactor cuts its history,
    through the real Compact call, and etcdctl sees the old revisions refused."""
    process = EtcdProcess(tmp_path / "etcd", compaction_retention=None)
    process.start()
    kv = await EtcdKv.connect(process.endpoint)
    election = LeaderElection(kv, "leader", ttl_s=5)
    try:
        fence = await election.acquire()
        compactor = Compactor(kv, retention_s=0.5)
        running = asyncio.create_task(compactor.run(fence, election.lost()))
        first = await kv.put(b"/churn/k", b"v0")
        # Writes go on until the compactor has cut past the first: it keeps a retention of history,
        # so it needs a revision after `first` sampled at least that long ago.
        deadline = time.monotonic() + 30
        writes = 0
        while compactor.compacted_to <= first:
            assert time.monotonic() < deadline, f"compacted to {compactor.compacted_to}, not past {first}"
            writes += 1
            await kv.put(b"/churn/k", f"v{writes}".encode())
            await asyncio.sleep(0.05)
        await asyncio.to_thread(wait_for, lambda: compacted_past(process.endpoint, first), 30)
        assert compactor.compacted_to > first
        await election.resign()
        await asyncio.wait_for(running, 5)  # it stops with the lead
    finally:
        await kv.close()
        process.stop()


async def test_a_standby_takes_over_after_the_leader_key_revision_was_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader key is written once, when the lead is taken, so its revision is soon compacted. A
    standby that watched for a vacancy from that revision was refused by etcd (the watch raised
    `WatchCompacted`) and its election ended: it never took over (found by the soak)."""
    process = EtcdProcess(tmp_path / "etcd", compaction_retention=None)
    process.start()
    kv = await EtcdKv.connect(process.endpoint)
    # The watches the standby starts, counted (only it watches here): it watches for a vacancy after
    # each refused attempt, for a third of its TTL at a time.
    watches: list[int] = []
    etcd_watch = kv.watch_prefix

    def counted_watch(prefix: bytes, *, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        watches.append(start_revision)
        return etcd_watch(prefix, start_revision=start_revision)

    monkeypatch.setattr(kv, "watch_prefix", counted_watch)

    async def watched(count: int) -> bool:
        return len(watches) >= count

    leader = LeaderElection(kv, "leader", ttl_s=2)
    standby = LeaderElection(kv, "standby", ttl_s=2)
    try:
        await leader.acquire()
        waiting = asyncio.create_task(standby.acquire())
        # Refused the lead, the standby has read the leader key and watches for a vacancy.
        await eventually(lambda: watched(1), timeout_s=10, what="the standby to watch the leader key")
        for i in range(5):
            revision = await kv.put(b"/churn/k", f"v{i}".encode())
        await kv.compact(revision)  # past the leader key's revision, as etcd's compactor would
        # The standby watches again after the compaction, and once more after that watch: the one
        # that started after the compaction did not end its election.
        compacted_at = len(watches)
        await eventually(
            lambda: watched(compacted_at + 2), timeout_s=10, what="the standby to watch twice more"
        )
        assert not waiting.done()
        await leader.resign()
        fence = await asyncio.wait_for(waiting, 10)
        assert standby.is_leader
        assert fence.create_revision > revision
    finally:
        await standby.close()
        await kv.close()
        process.stop()
