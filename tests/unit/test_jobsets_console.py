"""The console's job set pages over the real servicers (in-memory store) and aiohttp's test server:
a member sees its set with counts and held members, cancels it with the form, and another tenant's
member gets the 404 page for it, as for a set that does not exist."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from federation.api.service import FederationService
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.app import build_app
from federation.console.calls import ConsoleCalls
from federation.metrics import Metrics
from federation.security.auth import Authenticator
from federation.store.job_cache import JobCache
from federation.store.job_store import InMemoryJobStore
from federation.store.records import Role, TenantRecord, UserRecord
from placement.model import TenantId
from tests.unit.job_service import job_service
from tests.unit.test_jobsets import manifest


@pytest.fixture
async def console() -> AsyncIterator[tuple[TestClient[Any, Any], ConsoleCalls]]:
    store = InMemoryJobStore()
    for name in ("vision", "nlp"):
        await store.put_tenant(TenantRecord(TenantId(name)))
    for user, tenant in [("alice", "vision"), ("bob", "nlp")]:
        await store.put_user(UserRecord(user, TenantId(tenant), Role.MEMBER))
        await store.put_token(user, user)
    cache = JobCache(store)
    await cache.start()

    async def no_clusters() -> list[Any]:
        return []

    jobs = job_service(store, cache)
    fed = FederationService(auth=Authenticator(store), metrics=Metrics(), clusters=no_clusters)
    calls = ConsoleCalls([jobs, fed])
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(calls, registry=CollectorRegistry())))
    await client.start_server()
    yield client, calls
    await client.close()
    await cache.stop()


async def _sign_in(client: TestClient[Any, Any], token: str) -> None:
    client.session.cookie_jar.clear()
    response = await client.post("/login", data={"token": token}, allow_redirects=False)
    assert response.status == 303, await response.text()


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page[:500]
    return found.group(1)


async def test_a_member_sees_and_cancels_its_set_and_another_tenant_gets_the_404_page(
    console: tuple[TestClient[Any, Any], ConsoleCalls],
) -> None:
    browser, calls = console
    request = pb.SubmitJobSetRequest(name="evals", manifests=[manifest()], array="0-4%2")
    await calls.call_token("alice", "test", "SubmitJobSet", request)
    await _sign_in(browser, "alice")
    listing = await browser.get("/sets")
    page = await listing.text()
    assert listing.status == 200
    assert ">Job sets</a>" in page
    assert 'data-job-set="evals"' in page
    assert "held 3, queued 2" in page
    detail = await browser.get("/sets/vision/evals")
    page = await detail.text()
    assert detail.status == 200
    assert "held: the set allows at most 2 jobs at once" in page
    assert page.count('data-member="') == 5
    cancelled = await browser.post(
        "/sets/vision/evals/cancel",
        data={"csrf": _csrf(page), "reason": "wrong shards"},
        allow_redirects=False,
    )
    assert cancelled.status == 303
    after = await (await browser.get("/sets/vision/evals")).text()
    assert "cancelling; wrong shards" in after
    assert "cancelled 3" in after
    await _sign_in(browser, "bob")
    theirs = await browser.get("/sets/vision/evals")
    missing = await browser.get("/sets/vision/nothing")
    assert theirs.status == missing.status == 404
    assert (await theirs.text()) == (await missing.text())
    assert "evals" not in await (await browser.get("/sets")).text()
    refused = await browser.post("/sets/vision/evals/cancel", data={"csrf": "x"}, allow_redirects=False)
    assert refused.status in (403, 404)
