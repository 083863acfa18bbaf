"""The restart's list path (federation.store.job_store): the collector held off while records are
built, nested safely, and a record that cannot be decoded fails the list without leaving its
prefetched page's request behind."""

from __future__ import annotations

import asyncio
import gc

import pytest

from federation.store.job_store import JOBS, InMemoryJobStore, paused_gc
from federation.store.kv_pages import FIRST_PAGE_KEYS
from tests.conftest import build_job


def test_paused_gc_nests_and_restores_what_it_found() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        # The inner one ended first (the ledger's list beside the jobs'): still off.
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            assert not gc.isenabled()
        # It was off before: left off.
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_a_corrupt_record_fails_the_list_and_cancels_the_next_page() -> None:
    store = InMemoryJobStore()
    for i in range(FIRST_PAGE_KEYS + 5):
        await store.create_job(build_job(f"j{i:05d}"), idempotency_key=f"k{i}", manifest_digest="d")
    await store.kv.put(JOBS + b"j00003", b"{not json")
    before = set(asyncio.all_tasks())
    with pytest.raises(ValueError, match="Expecting property name"):
        await store.list_jobs()
    await asyncio.sleep(0)
    assert set(asyncio.all_tasks()) == before
    assert gc.isenabled()


def test_a_page_of_etcd_asks_for_no_sort_order() -> None:
    # etcd applies a range's limit only after sorting every key to the range's end when a sort
    # order is given: paging a restart's 100,000 jobs then read five billion keys' worth.
    from aetcd import rpc

    from federation.store.kv_etcd import range_request

    request = range_request(JOBS, limit=FIRST_PAGE_KEYS, start=JOBS + b"j1\0", revision=42)
    assert request.sort_order == rpc.RangeRequest.NONE
    assert (request.key, request.limit, request.revision) == (JOBS + b"j1\0", FIRST_PAGE_KEYS, 42)
