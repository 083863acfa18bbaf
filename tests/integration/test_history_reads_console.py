"""The web console over archived jobs (issue 19), against a real server (etcd, the servicers, the
HTTP port, the server's own SQLite history store): the jobs page's *Include archived* option and
the job page of an archived job, with a member's isolation as on live jobs."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from federation.runtime.etcd_process import EtcdProcess
from tests.history_builders import an_archived_job
from tests.integration.test_console_http import Console, _start, etcd  # noqa: F401 (etcd: a fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
async def console(etcd: EtcdProcess, tmp_path: Path) -> AsyncIterator[Console]:  # noqa: F811
    started = await _start(etcd, tmp_path / "state")
    yield started
    await started.server.stop()


async def test_archived_jobs_in_the_console_with_the_live_isolation(console: Console) -> None:
    history = console.server.history
    assert history is not None
    now = time.time()
    mine = an_archived_job(
        "old-vision-0000aaaa", tenant="vision", submitted_at_s=now - 7200, name="old-vision"
    )
    theirs = an_archived_job("old-nlp-0000bbbb", tenant="nlp", submitted_at_s=now - 7100, name="old-nlp")
    history.write_jobs([mine, theirs])
    alice = await console.signed_in("alice")
    async with alice:
        async with alice.get("/jobs") as r:
            page = await r.text()
            assert r.status == 200
            assert "old-vision-0000aaaa" not in page
            assert 'name="archived" value="1">' in page
        async with alice.get("/jobs?archived=1") as r:
            page = await r.text()
            assert r.status == 200
            assert 'data-job-id="old-vision-0000aaaa"' in page
            assert "old-nlp" not in page
            assert 'name="archived" value="1" checked>' in page
        async with alice.get("/jobs/old-vision-0000aaaa") as r:
            assert r.status == 200
            page = await r.text()
            assert "SUCCEEDED" in page
            assert 'id="describe"' in page
        async with alice.get("/jobs/vision-job-00000000") as r:
            assert r.status == 404
            unknown = await r.text()
        async with alice.get("/jobs/old-nlp-0000bbbb") as r:
            assert r.status == 404
            assert await r.text() == unknown
