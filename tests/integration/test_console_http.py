"""The web console against a real server: etcd, the servicers, the HTTP port, over loopback.

The server runs in the test's event loop (so the test submits and inspects jobs through the same
servicers, in process); the browser is aiohttp's client with a cookie jar.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from federation.api.v1 import gpufed_pb2 as pb
from federation.console import sse
from federation.console.calls import CallRefused, ConsoleCalls
from federation.runtime.bootstrap import bootstrap
from federation.runtime.config import load_config
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.server import FederationServer, ServerConfig
from federation.security.auth import TOKEN_CACHE_TTL_S, Authenticator
from federation.store.job_store import KvStore
from federation.store.kv_etcd import EtcdKv
from tests.contract.helpers import eventually
from tests.e2e.harness import manifest

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).parents[1] / "e2e" / "federation.yaml"


@dataclass
class Console:
    server: FederationServer
    url: str
    tokens: dict[str, str]
    calls: ConsoleCalls
    ssl_context: ssl.SSLContext | None = None

    async def api(self, user: str, method: str, message: object) -> object:
        """A call as `user`, through the same servicers (as a gRPC client would make it)."""
        return await self.calls.call_token(self.tokens[user], "test", method, message)

    async def submit(self, user: str, name: str, *, duration: str = "2s", tenant: str | None = None) -> str:
        reply = await self.api(
            user, "SubmitJob", pb.SubmitJobRequest(manifest=manifest(name, duration=duration))
        )
        assert isinstance(reply, pb.SubmitJobResponse)
        return reply.job_id

    async def job(self, user: str, job_id: str) -> pb.Job:
        reply = await self.api(user, "GetJob", pb.GetJobRequest(job_id=job_id))
        assert isinstance(reply, pb.Job)
        return reply

    def browser(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(ssl=self.ssl_context) if self.ssl_context else None
        return aiohttp.ClientSession(self.url, cookie_jar=aiohttp.CookieJar(unsafe=True), connector=connector)

    async def signed_in(self, user: str) -> aiohttp.ClientSession:
        session = self.browser()
        async with session.post("/login", data={"token": self.tokens[user]}, allow_redirects=False) as r:
            assert r.status == 303, await r.text()
        return session


async def _start(etcd: EtcdProcess, state: Path, *, tls: tuple[Path, Path] | None = None) -> Console:
    kv = await EtcdKv.connect(etcd.endpoint)
    try:
        token_files = await bootstrap(KvStore(kv), load_config(CONFIG), state / "tokens")
    finally:
        await kv.close()
    config = ServerConfig(
        etcd_endpoint=etcd.endpoint,
        state_dir=state,
        metrics_port=0,
        identity="console-test",
        cycle_interval_s=0.2,
        tls_cert=tls[0] if tls else None,
        tls_key=tls[1] if tls else None,
    )
    server = FederationServer(config)
    await server.start()
    assert server.console_url is not None
    context = None
    if tls is not None:
        context = ssl.create_default_context(cafile=str(tls[0]))
    tokens = {user: path.read_text().strip() for user, path in token_files.items()}
    return Console(server, server.console_url.rstrip("/"), tokens, ConsoleCalls(server.servicers), context)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    process = EtcdProcess(tmp_path / "etcd")
    process.start()
    yield process
    process.stop()


@pytest.fixture
async def console(etcd: EtcdProcess, tmp_path: Path) -> AsyncIterator[Console]:
    started = await _start(etcd, tmp_path / "state")
    yield started
    await started.server.stop()


@dataclass
class SkippingClock:
    """The monotonic clock plus whatever the test skipped: a TTL runs out without the test waiting."""

    skipped_s: float = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped_s

    def skip(self, seconds: float) -> None:
        self.skipped_s += seconds


@pytest.fixture
async def console_and_clock(
    etcd: EtcdProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Console, SkippingClock]]:
    """A console whose server resolves tokens through an `Authenticator` (its token cache) reading
    the returned clock; the rest of the server keeps real time."""
    clock = SkippingClock()
    monkeypatch.setattr(
        "federation.runtime.server.Authenticator", functools.partial(Authenticator, clock=clock)
    )
    started = await _start(etcd, tmp_path / "state")
    yield started, clock
    await started.server.stop()


def _cookie(response: aiohttp.ClientResponse) -> str:
    headers = response.headers.getall("Set-Cookie", [])
    found = [h for h in headers if h.startswith("gpufed_session=")]
    assert found, headers
    return found[0]


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match is not None, html[:500]
    return match.group(1)


async def _sse_events(
    session: aiohttp.ClientSession, path: str, *, until: str, timeout_s: float = 20.0
) -> list[tuple[str, str]]:
    """Events read from `path` until one whose data holds `until` (or the stream ends)."""
    events: list[tuple[str, str]] = []
    async with asyncio.timeout(timeout_s), session.get(path) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        name = ""
        async for raw in r.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, line[6:]))
                if until in line or name == "end":
                    return events
    return events


# ---- sign-in and the cookie


async def test_sign_in_with_a_good_token_and_refusal_of_a_bad_one(console: Console) -> None:
    async with console.browser() as browser:
        async with browser.get("/", allow_redirects=False) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/login"
        async with browser.get("/jobs", allow_redirects=False) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/login"
        async with browser.get("/login") as r:
            page = await r.text()
            assert 'form id="login"' in page
            assert 'name="token" type="password"' in page
        async with browser.post("/login", data={"token": "not-a-token"}, allow_redirects=False) as r:
            assert r.status == 401
            page = await r.text()
            assert '<p class="error"' in page
            assert "unknown or revoked token" in page
            assert "gpufed_session=" not in " ".join(r.headers.getall("Set-Cookie", []))
        async with browser.post(
            "/login", data={"token": console.tokens["alice"]}, allow_redirects=False
        ) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/jobs"
            cookie = _cookie(r)
        attributes = [part.strip().lower() for part in cookie.split(";")]
        assert "httponly" in attributes
        assert "samesite=strict" in attributes
        assert "path=/" in attributes
        assert "secure" not in attributes  # no TLS here
        async with browser.get("/jobs") as r:
            assert r.status == 200
            page = await r.text()
            assert '<span id="whoami">alice (vision, member)</span>' in page
            assert 'main id="page-jobs"' in page
            assert r.headers["Content-Security-Policy"] == "default-src 'self'; frame-ancestors 'none'"
            assert r.headers["X-Content-Type-Options"] == "nosniff"
            assert r.headers["Referrer-Policy"] == "same-origin"
            for label in ("Jobs", "Queues", "Clusters", "Finance", "Approvals"):
                assert f">{label}</a>" in page
            # A member may not read capacity: no link to the 404 page (issue 30).
            assert ">Capacity</a>" not in page
        # Signing out ends the session on the server, not just in this browser.
        session_id = SimpleCookie(cookie)["gpufed_session"].value
        async with browser.post("/logout", data={"csrf": _csrf(page)}, allow_redirects=False) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/login"
    async with console.browser() as replay:
        replay.cookie_jar.update_cookies({"gpufed_session": session_id})
        async with replay.get("/jobs", allow_redirects=False) as r:
            assert r.status == 303


async def test_metrics_still_serve_prometheus_text(console: Console) -> None:
    async with console.browser() as browser, browser.get("/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
        assert "# TYPE gpufed_api_request_seconds histogram" in text
        assert "gpufed_leader" in text


# ---- isolation


async def test_a_member_never_sees_another_tenants_job_through_any_url(console: Console) -> None:
    secret = await console.submit("bob", "nlp-secret", duration="60s")
    mine = await console.submit("alice", "vision-job", duration="60s")
    alice = await console.signed_in("alice")
    async with alice:
        for path, status in (
            ("/jobs", 200),
            ("/jobs?user=bob", 200),
            ("/jobs?tenant=nlp", 403),
            ("/jobs?tenant=nlp&user=bob&phase=QUEUED", 403),
        ):
            async with alice.get(path) as r:
                assert r.status == status, path
                page = await r.text()
                assert 'table id="jobs"' in page
                assert secret not in page
                assert "nlp-secret" not in page
                assert 'data-job-id="' + secret not in page
        async with alice.get("/jobs?tenant=nlp") as r:
            assert "members may list only their own tenant" in await r.text()
        async with alice.get("/jobs") as r:
            assert f'data-job-id="{mine}"' in await r.text()
        async with alice.get("/jobs/vision-job-00000000") as r:
            assert r.status == 404
            unknown = await r.text()
        async with alice.get(f"/jobs/{secret}") as r:
            assert r.status == 404
            assert await r.text() == unknown
        for path in (f"/jobs/{secret}/events", f"/jobs/{secret}/logs", f"/jobs/{secret}/logs/events"):
            async with alice.get(path) as r:
                assert r.status == 404, path
                assert secret not in await r.text()
        async with alice.get(f"/jobs/{mine}") as r:
            assert r.status == 200
            csrf = _csrf(await r.text())
        async with alice.post(f"/jobs/{secret}/cancel", data={"csrf": csrf}, allow_redirects=False) as r:
            assert r.status == 404
        async with alice.get("/jobs/events?tenant=nlp") as r:
            assert r.status == 404
        # The live table streams only what ListJobs gives alice: her own tenant's jobs.
        events = await _sse_events(alice, "/jobs/events", until=mine)
        assert all(secret not in data for _, data in events)
        assert any(mine in data for _, data in events)
    assert not (await console.job("bob", secret)).cancel_requested


# ---- CSRF


async def test_posts_without_the_csrf_token_or_from_another_origin_are_refused(console: Console) -> None:
    job_id = await console.submit("alice", "guarded", duration="60s")
    async with await console.signed_in("alice") as alice:
        async with alice.get(f"/jobs/{job_id}") as r:
            csrf = _csrf(await r.text())
        forged = [
            ({}, {}),
            ({"csrf": "0" * 43}, {}),
            ({"csrf": csrf}, {"Origin": "http://evil.example"}),
            ({"csrf": csrf}, {"Origin": "null"}),
        ]
        for data, headers in forged:
            async with alice.post(
                f"/jobs/{job_id}/cancel", data=data, headers=headers, allow_redirects=False
            ) as r:
                assert r.status == 403, (data, headers)
                assert "CSRF" in await r.text()
        async with alice.post("/logout", data={}, allow_redirects=False) as r:
            assert r.status == 403
        async with alice.get("/jobs", allow_redirects=False) as r:
            assert r.status == 200  # the refused sign-out did not end the session
        assert not (await console.job("alice", job_id)).cancel_requested
        # A sign-in posted from another site is refused too (login CSRF).
        async with alice.post(
            "/login", data={"token": console.tokens["bob"]}, headers={"Origin": "http://evil.example"}
        ) as r:
            assert r.status == 403


# ---- writes


async def test_cancel_works_and_is_audited_with_the_user(console: Console) -> None:
    job_id = await console.submit("alice", "to-cancel", duration="120s")
    async with await console.signed_in("alice") as alice:
        async with alice.get(f"/jobs/{job_id}") as r:
            page = await r.text()
            assert 'form id="cancel"' in page
            for section in ("spec", "attempts", "describe", "wait-reasons", "logs"):
                assert f'id="{section}"' in page
            assert 'pre id="log-output"' in page
        own = f"{console.url.split('//')[0]}//{console.url.split('//')[1]}"
        async with alice.post(
            f"/jobs/{job_id}/cancel",
            data={"csrf": _csrf(page), "reason": "wrong dataset"},
            headers={"Origin": own},
            allow_redirects=False,
        ) as r:
            assert r.status == 303, await r.text()
            assert r.headers["Location"] == f"/jobs/{job_id}"
        deadline = time.monotonic() + 20
        while (job := await console.job("alice", job_id)).phase != pb.JOB_PHASE_CANCELLED:
            assert time.monotonic() < deadline, job
            await asyncio.sleep(0.2)
        async with alice.get(f"/jobs/{job_id}") as r:
            page = await r.text()
            assert '<span id="job-phase"' in page
            assert ">CANCELLED</span>" in page
            assert 'form id="cancel"' not in page
    audit = await console.api("admin", "ListAudit", pb.ListAuditRequest(limit=100))
    assert isinstance(audit, pb.ListAuditResponse)
    cancels = [e for e in audit.events if e.action == "job_cancel_requested" and e.target == job_id]
    assert len(cancels) == 1
    assert cancels[0].user == "alice"
    assert "wrong dataset" in cancels[0].detail


async def test_admins_grant_and_revoke_approvals_members_cannot(console: Console) -> None:
    async with await console.signed_in("alice") as alice, alice.get("/approvals") as r:
        page = await r.text()
        assert 'main id="page-approvals"' in page
        assert "grant-approval" not in page
        csrf = _csrf(page)
        async with alice.post(
            "/approvals",
            data={"csrf": csrf, "tenant": "vision", "priority_class": "urgent", "hours": "2", "reason": "x"},
            allow_redirects=False,
        ) as refused:
            assert refused.status == 404
    async with await console.signed_in("admin") as admin:
        async with admin.get("/approvals") as r:
            page = await r.text()
            assert 'form id="grant-approval"' in page
        data = {
            "csrf": _csrf(page),
            "tenant": "vision",
            "priority_class": "urgent",
            "hours": "2",
            "reason": "<b>paper</b> deadline",
        }
        async with admin.post("/approvals", data=data, allow_redirects=False) as r:
            assert r.status == 303, await r.text()
        async with admin.get("/approvals") as r:
            page = await r.text()
            assert "&lt;b&gt;paper&lt;/b&gt; deadline" in page
            assert "<b>paper</b>" not in page
            match = re.search(r'action="/approvals/(ap-[0-9a-f]+)/revoke"', page)
            assert match is not None
            assert 'class="revoke-approval"' in page
        async with admin.post(
            f"/approvals/{match.group(1)}/revoke", data={"csrf": data["csrf"]}, allow_redirects=False
        ) as r:
            assert r.status == 303
        async with admin.get("/approvals") as r:
            assert match.group(1) not in await r.text()
    audit = await console.api("admin", "ListAudit", pb.ListAuditRequest(limit=100))
    assert isinstance(audit, pb.ListAuditResponse)
    assert {"approval_granted", "approval_revoked"} <= {e.action for e in audit.events}


# ---- sessions end with their token


async def test_a_revoked_token_ends_the_session(console_and_clock: tuple[Console, SkippingClock]) -> None:
    console, clock = console_and_clock
    issued = await console.api("admin", "IssueToken", pb.IssueTokenRequest(user="alice"))
    assert isinstance(issued, pb.IssuedToken)
    console.tokens["alice2"] = issued.token
    async with await console.signed_in("alice2") as alice:
        async with alice.get("/jobs", allow_redirects=False) as r:
            assert r.status == 200
        await console.api("admin", "RevokeToken", pb.RevokeTokenRequest(token_id=issued.info.token_id))
        # Revocation reaches every server within the token cache's TTL (5 s), as for the gRPC API:
        # the cache's clock skips the TTL rather than the test sleeping through it, and the session
        # must end within the same 3 s past it as on real time.
        deadline = clock() + TOKEN_CACHE_TTL_S + 3
        clock.skip(TOKEN_CACHE_TTL_S)
        while True:
            async with alice.get("/jobs", allow_redirects=False) as r:
                if r.status == 303:
                    assert r.headers["Location"] == "/login"
                    break
            assert clock() < deadline, "the session outlived its token"
            await asyncio.sleep(0.25)
        with pytest.raises(CallRefused):
            await console.api("alice2", "WhoAmI", pb.WhoAmIRequest())


# ---- live updates and escaping


async def test_a_jobs_phase_arrives_by_server_sent_events(console: Console) -> None:
    job_id = await console.submit("alice", "live", duration="1s")
    async with await console.signed_in("alice") as alice:
        events = await _sse_events(alice, f"/jobs/{job_id}/events", until='"phase":"SUCCEEDED"', timeout_s=30)
        for query, shown in (("phase=LIVE", False), ("phase=SUCCEEDED", True), ("phase=RUNNING", False)):
            async with alice.get(f"/jobs?{query}") as r:
                assert (f'data-job-id="{job_id}"' in await r.text()) is shown, query
    phases = [data for name, data in events if name == "job"]
    assert len(phases) >= 2, events  # a first state, then at least one change, without a reload
    assert '"phase":"SUCCEEDED"' in phases[-1]


async def test_text_from_the_store_is_escaped(console: Console) -> None:
    job_id = await console.submit("alice", "escape", duration="120s")
    script = "<script>alert(1)</script>"
    await console.api("alice", "CancelJob", pb.CancelJobRequest(job_id=job_id, reason=script))
    async with await console.signed_in("alice") as alice, alice.get(f"/jobs/{job_id}") as r:
        page = await r.text()
    assert script not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


# ---- TLS


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_with_tls_the_console_is_https_and_the_cookie_secure(
    etcd: EtcdProcess, tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    console = await _start(etcd, tmp_path / "state", tls=certificate)
    try:
        assert console.url.startswith("https://127.0.0.1:")
        async with console.browser() as browser:
            async with browser.post(
                "/login", data={"token": console.tokens["alice"]}, allow_redirects=False
            ) as r:
                assert r.status == 303
                attributes = [part.strip().lower() for part in _cookie(r).split(";")]
                assert "secure" in attributes
                assert "httponly" in attributes
            async with browser.get("/metrics") as r:
                assert r.status == 200
        plain = console.url.replace("https://", "http://")
        async with aiohttp.ClientSession() as raw:
            with pytest.raises(aiohttp.ClientError):
                async with raw.get(plain + "/metrics") as r:
                    await r.read()
    finally:
        await console.server.stop()


async def test_an_open_event_stream_ends_when_its_session_does(console: Console) -> None:
    job_id = await console.submit("alice", "long", duration="300s")
    async with await console.signed_in("alice") as alice:
        async with alice.get(f"/jobs/{job_id}") as r:
            csrf = _csrf(await r.text())
        async with asyncio.timeout(15), alice.get(f"/jobs/{job_id}/events") as stream:
            assert stream.status == 200
            first = await stream.content.readuntil(b"\n\n")  # retry:
            first = await stream.content.readuntil(b"\n\n")
            assert b"event: job" in first
            async with alice.post("/logout", data={"csrf": csrf}, allow_redirects=False) as r:
                assert r.status == 303
            rest = await stream.content.read()  # until the server closes the stream
        assert b"event: end" in rest
        assert b"signed out" in rest
        async with alice.get(f"/jobs/{job_id}/events", allow_redirects=False) as r:
            assert r.status == 401  # EventSource stops on it rather than reconnecting


async def test_the_logs_stream_relays_streamlogs_and_ends(console: Console) -> None:
    job_id = await console.submit("alice", "logged", duration="1s")
    deadline = time.monotonic() + 20
    while (await console.job("alice", job_id)).phase != pb.JOB_PHASE_SUCCEEDED:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    async with await console.signed_in("alice") as alice:
        events = await _sse_events(alice, f"/jobs/{job_id}/logs/events?follow=0", until="\x00", timeout_s=15)
        async with alice.get(f"/jobs/{job_id}/logs") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
    assert events[-1][0] == "end", events
    lines = "".join(json.loads(data) for name, data in events if name == "log")
    assert "[master-0] [memory] master-0 started" in lines
    assert sorted(lines.splitlines()) == sorted(text.splitlines())


async def test_static_files_are_served_with_the_security_headers(console: Console) -> None:
    async with console.browser() as browser:
        for path, kind in (("/static/console.css", "text/css"), ("/static/console.js", "javascript")):
            async with browser.get(path) as r:
                assert r.status == 200, path
                assert kind in r.headers["Content-Type"]
                assert r.headers["X-Content-Type-Options"] == "nosniff"
                assert r.headers["Content-Security-Policy"] == "default-src 'self'; frame-ancestors 'none'"
        escape = URL(console.url + "/static/%2e%2e/app.py", encoded=True)
        async with browser.get(escape, allow_redirects=False) as r:
            assert r.status in (403, 404)
            assert "def build_app" not in await r.text()
        async with browser.get("/login") as r:
            page = await r.text()
        # Every style sheet in static/ is linked, console.css first; the script is a file, never inline.
        assert page.index('href="/static/console.css"') < page.find('href="/static/charts.css"') or (
            "charts.css" not in page
        )
        assert '<script src="/static/console.js" defer></script>' in page
        assert "<style" not in page
        assert "<script>" not in page


async def test_the_server_stops_promptly_with_event_streams_open(etcd: EtcdProcess, tmp_path: Path) -> None:
    console = await _start(etcd, tmp_path / "state")
    stopped = False
    try:
        job_id = await console.submit("alice", "watched", duration="300s")
        async with await console.signed_in("alice") as alice:
            streams = [
                await alice.get(f"/jobs/{job_id}/events"),
                await alice.get("/jobs/events"),
                await alice.get(f"/jobs/{job_id}/logs/events?follow=1"),
            ]
            for stream in streams:
                assert stream.status == 200
                await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 5)
            # The streams would run as long as the 300 s job (one follows its log): a stop that
            # waited for them would not return before that. It takes about 2 s on a quiet machine;
            # the deadline is only there to fail such a wait, and leaves a busy machine room (a
            # bound of 10 s failed a fresh-clone run at 12 s, under the suite's load).
            await asyncio.wait_for(console.server.stop(), 120)
            stopped = True
            # The server ended every stream itself (none was closed here): each read ends, cleanly or
            # with the connection cut mid-stream, as a stopping server leaves it.
            for stream in streams:
                with contextlib.suppress(aiohttp.ClientPayloadError):
                    await asyncio.wait_for(stream.content.read(), 30)
                assert stream.content.at_eof() or isinstance(
                    stream.content.exception(), aiohttp.ClientPayloadError
                )
                stream.close()
    finally:
        if not stopped:
            await console.server.stop()


# The live table's poll interval in the test below: a tenth of the console's, so that a few polls
# take a fraction of a second; the loop under test is the console's own (`sse.poll`).
QUICK_POLL_S = sse.POLL_INTERVAL_S / 10


async def test_an_event_stream_stops_polling_when_the_browser_leaves(
    console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    def list_calls() -> float:
        value = console.server.metrics.registry.get_sample_value(
            "gpufed_api_request_seconds_count", {"method": "ListJobs", "code": "OK"}
        )
        return value or 0.0

    console_poll = sse.poll
    poll_returned = asyncio.Event()

    async def quick_poll(
        request: web.Request,
        fetch: Callable[[], Awaitable[tuple[Iterable[sse.Event], bool]]],
        *,
        interval_s: float = sse.POLL_INTERVAL_S,
    ) -> web.StreamResponse:
        try:
            return await console_poll(request, fetch, interval_s=QUICK_POLL_S)
        finally:
            poll_returned.set()

    # The jobs page's handler looks `sse.poll` up at each request.
    monkeypatch.setattr(sse, "poll", quick_poll)

    async def read_three_times() -> bool:
        return list_calls() >= 3

    await console.submit("alice", "polled", duration="300s")
    async with await console.signed_in("alice") as alice:
        stream = await alice.get("/jobs/events")
        assert stream.status == 200
        await asyncio.wait_for(stream.content.readuntil(b"event: job"), 10)
        await eventually(read_three_times, timeout_s=10, what="three ListJobs reads by the open stream")
        assert list_calls() >= 3  # one read an interval while the page is open
        stream.close()  # the browser navigates away
        # The server notices: its poll loop for the stream returns ...
        await asyncio.wait_for(poll_returned.wait(), 10)
        after = list_calls()
        # ... and nothing goes on reading for the browser that left. No event marks a read that
        # does not happen, so this part is a bounded wait: five intervals of the loop that ended.
        await asyncio.sleep(5 * QUICK_POLL_S)
        assert list_calls() == after, "the stream kept polling for a browser that left"


async def test_a_follow_opened_before_the_job_starts_waits_for_its_pods(console: Console) -> None:
    job_id = await console.submit("alice", "early", duration="2s")
    async with await console.signed_in("alice") as alice:
        events = await _sse_events(alice, f"/jobs/{job_id}/logs/events?follow=1", until="\x00", timeout_s=30)
    assert events[-1] == ("end", "{}"), events  # ended because the job did, not refused
    lines = "".join(json.loads(data) for name, data in events if name == "log")
    assert "[master-0] [memory] master-0 started" in lines
    assert (await console.job("alice", job_id)).phase == pb.JOB_PHASE_SUCCEEDED


async def test_each_role_gets_the_apis_answer_on_the_jobs_page(console: Console) -> None:
    nlp_job = await console.submit("bob", "nlp-visible", duration="60s")
    async with await console.signed_in("admin") as admin, admin.get("/jobs?tenant=nlp") as r:
        assert r.status == 200
        page = await r.text()
        assert f'data-job-id="{nlp_job}"' in page
        assert '<option value="nlp" selected>' in page
    async with await console.signed_in("fin") as fin:
        async with fin.get("/jobs") as r:
            assert r.status == 403
            page = await r.text()
            assert "may not list jobs" in page
            assert nlp_job not in page
            assert '<span id="whoami">fin (platform, finance)</span>' in page
        async with fin.get(f"/jobs/{nlp_job}") as r:
            assert r.status == 404
        async with fin.get("/approvals") as r:
            assert r.status == 200
            assert "grant-approval" not in await r.text()


async def test_the_jobs_page_filters_and_orders_on_the_server(console: Console) -> None:
    first = await console.submit("alice", "vision-first", duration="60s")
    second = await console.submit("alice", "vision-second", duration="60s")
    bobs = await console.submit("bob", "nlp-other", duration="60s")
    async with await console.signed_in("admin") as admin:
        async with admin.get("/jobs?user=alice") as r:
            assert r.status == 200
            page = await r.text()
        ids = re.findall(r'data-job-id="([^"]+)"', page)
        # Newest first by default; bob's job filtered out by ListJobs, not by the page.
        assert ids.index(second) < ids.index(first)
        assert bobs not in ids
        async with admin.get("/jobs?user=alice&order=oldest") as r:
            ids = re.findall(r'data-job-id="([^"]+)"', await r.text())
        assert ids.index(first) < ids.index(second)
        async with admin.get("/jobs?cluster=nowhere") as r:
            assert r.status == 200
            assert "No jobs match." in await r.text()
        # A filter the API refuses: the page says which field, with no rows.
        async with admin.get("/jobs?user=a%01b") as r:
            assert r.status == 400
            assert "user: a name without" in await r.text()
        async with admin.get("/queues") as r:
            assert r.status == 200
            queues = await r.text()
        assert 'data-tenant="nlp"' in queues
        assert "queued-truncated" not in queues
    async with await console.signed_in("alice") as alice, alice.get("/queues") as r:
        assert r.status == 200
        mine = await r.text()
        assert 'data-tenant="vision"' in mine
        assert 'data-tenant="nlp"' not in mine
