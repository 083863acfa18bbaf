"""A history database that does not answer: reads that need it say UNAVAILABLE (retryable), and
reads the cache answers do not touch it."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from sqlalchemy import text

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CallRefused as Refused
from federation.history.sql_store import SqlHistoryStore
from federation.store.job_cache import JobCache
from federation.store.job_store import InMemoryJobStore
from federation.store.records import Role, TenantRecord, UserRecord
from placement.model import TenantId
from tests.conftest import build_job
from tests.unit.job_service import as_user, job_service

PEER = "ipv4:127.0.0.1:50000"


async def test_a_broken_history_is_unavailable_and_the_live_path_still_answers(tmp_path: Path) -> None:
    history = SqlHistoryStore.open(f"sqlite:///{tmp_path / 'history.sqlite3'}")
    store = InMemoryJobStore()
    await store.put_tenant(TenantRecord(TenantId("vision")))
    await store.put_user(UserRecord("alice", TenantId("vision"), Role.MEMBER))
    await store.put_token("alice", "alice")
    stored, _ = await store.create_job(
        build_job("live-1", tenant="vision"), idempotency_key="k", manifest_digest="d"
    )
    cache = JobCache(store)
    await cache.start()
    assert await cache.wait_for_revision(stored.mod_revision)
    service = job_service(store, cache, history=history)
    try:
        with history.engine.begin() as conn:
            conn.execute(text("DROP TABLE history_jobs"))
        job = await service.GetJob(pb.GetJobRequest(job_id="live-1"), as_user("alice", PEER))
        assert job.job_id == "live-1"
        live = await service.ListJobs(pb.ListJobsRequest(), as_user("alice", PEER))
        assert [j.job_id for j in live.jobs] == ["live-1"]
        for call in (
            service.GetJob(pb.GetJobRequest(job_id="gone-00000000"), as_user("alice", PEER)),
            service.ListJobs(pb.ListJobsRequest(include_archived=True), as_user("alice", PEER)),
        ):
            with pytest.raises(Refused) as refused:
                await call
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        await cache.stop()
        history.close()
