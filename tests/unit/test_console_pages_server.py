"""The queues, clusters, capacity and finance pages against a real `gpufed up` (etcd, the server, the
simulated clusters in their own process, the simulated provisioner), over loopback with aiohttp's
client as the browser.

The data: alice (vision) runs a short job to its end (the ledger) and a long one (the queues), bob
(nlp) runs a long job and queues a B200 gang no cluster has, and infra plans capacity with a reason
full of markup. Then each page is read as each role: alice never sees nlp's tenant, jobs, GPU types
or spend, whatever URL she types; every value is escaped; and each page shows the real figures.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from aiohttp import web

from federation.console import capacity, clusters, finance, queues
from tests.e2e.console_harness import TERMINAL, ConsoleUp, wait_for

pytestmark = pytest.mark.integration

EVIL = '<script>alert("plan")</script>'

SHORT = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: {name}, annotations: {{sim.gpufed.io/duration: "{duration}"}}}}
spec:
  gpuTypes: [{gpu}]
  tasks:
    - {{name: worker, replicas: {replicas}, image: "pytorch/pytorch:2.3", gpus: 8}}
"""


def _submit(
    up: ConsoleUp, user: str, name: str, *, duration: str, gpu: str = "A100", replicas: int = 1
) -> str:
    text = SHORT.format(name=name, duration=duration, gpu=gpu, replicas=replicas)
    with up.client(user) as client:
        return client.submit(text, idempotency_key=str(uuid.uuid4())).job_id


class Data:
    def __init__(self, up: ConsoleUp) -> None:
        self.vision_done = _submit(up, "alice", "vision-short", duration="1s")
        self.vision_long = _submit(up, "alice", "vision-long", duration="2h")
        self.nlp_long = _submit(up, "bob", "nlp-secret-long", duration="2h", gpu="H100")
        self.nlp_waiting = _submit(up, "bob", "nlp-secret-b200", duration="1h", gpu="B200", replicas=2)
        start = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT08:00")
        end = (datetime.now(UTC) + timedelta(days=3)).strftime("%Y-%m-%dT20:00")
        plan = up.gpufed(
            "capacity", "plan", "create", "--cluster", "gcp-us-east4", "--gpu-type", "L4", "--gpus", "8",
            "--from", start, "--to", end, "--reason", EVIL, user="infra",
        )  # fmt: skip
        assert plan.returncode == 0, plan.stderr
        self.plan_id = re.search(r"plan (\S+) created", plan.stdout).group(1)  # type: ignore[union-attr]
        wait_for(lambda: up.phase("alice", self.vision_done) in TERMINAL, timeout_s=90, what="short job done")
        wait_for(lambda: up.phase("alice", self.vision_long) == "RUNNING", timeout_s=60, what="vision runs")
        wait_for(lambda: up.phase("bob", self.nlp_long) == "RUNNING", timeout_s=60, what="nlp runs")
        self.nlp_ids = (self.nlp_long, self.nlp_waiting)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleUp]:
    running = ConsoleUp(tmp_path_factory.mktemp("pages") / "state")
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def data(up: ConsoleUp) -> Data:
    return Data(up)


@pytest.fixture
async def browsers(up: ConsoleUp) -> AsyncIterator[dict[str, aiohttp.ClientSession]]:
    """A signed-in session per user, each with its own cookie jar."""
    sessions: dict[str, aiohttp.ClientSession] = {}
    try:
        for user in ("alice", "bob", "finance", "infra", "admin"):
            session = aiohttp.ClientSession(up.console_url, cookie_jar=aiohttp.CookieJar(unsafe=True))
            sessions[user] = session
            async with session.post("/login", data={"token": up.token(user)}, allow_redirects=False) as r:
                assert r.status == 303, await r.text()
        yield sessions
    finally:
        await asyncio.gather(*(s.close() for s in sessions.values()))


async def _get(session: aiohttp.ClientSession, path: str) -> tuple[int, str, aiohttp.ClientResponse]:
    async with session.get(path, allow_redirects=False) as r:
        return r.status, await r.text(), r


def _main(html: str, page: str) -> str:
    found = re.search(rf'<main id="page-{page}".*?</main>', html, re.S)
    assert found, html[:400]
    return found.group(0)


def _no_nlp(text: str, data: Data, where: str) -> None:
    for secret in ("nlp", "B200", "nlp-secret", *data.nlp_ids):
        assert secret not in text, f"{where} shows {secret!r}"


def _safe(html: str, where: str) -> None:
    """No markup from the store and nothing the CSP would refuse: no inline script or style."""
    assert "<script>alert" not in html, where
    assert "style=" not in html, where
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/console.js" defer>'], where


async def test_alice_never_sees_nlp_on_any_page_or_typed_url(
    up: ConsoleUp, data: Data, browsers: dict[str, aiohttp.ClientSession]
) -> None:
    alice = browsers["alice"]
    for path in ("/queues", "/clusters", "/finance", "/finance?period=week", "/finance?period=7d"):
        status, html, _ = await _get(alice, path)
        assert status == 200, (path, html[:300])
        _no_nlp(html, data, path)
        _safe(html, path)
    # Typed URLs: query parameters no page reads, another tenant named anywhere, the CSV.
    for path in ("/queues?tenant=nlp", "/finance?tenant=nlp", "/finance.csv?tenant=nlp", "/finance.csv"):
        status, text, _ = await _get(alice, path)
        assert status == 200, path
        _no_nlp(text, data, path)
    status, csv, _ = await _get(alice, "/finance.csv?period=month")
    assert csv.splitlines()[0] == "tenant,day,gpu_hours,cost_usd,intervals"
    assert {line.split(",")[0] for line in csv.splitlines()[1:]} == {"vision"}
    # Capacity is for admin, infra and finance: a member gets the not-found page, nothing of it.
    status, html, _ = await _get(alice, "/capacity")
    assert status == 404
    assert data.plan_id not in html
    _no_nlp(html, data, "/capacity")


async def test_queues_show_running_and_queued_against_quotas(
    data: Data, browsers: dict[str, aiohttp.ClientSession]
) -> None:
    status, html, response = await _get(browsers["alice"], "/queues")
    assert status == 200
    assert response.headers["Content-Security-Policy"].startswith("default-src 'self'")
    main = _main(html, "queues")
    row = re.search(r'<tr data-tenant="vision" data-gpu-type="A100">.*?</tr>', main, re.S)
    assert row, main[:2000]
    # vision-long: one 8-GPU replica running; its guarantee 16 and cap 24 (federation.yaml's defaults).
    assert '<td class="num running">8</td>' in row.group(0)
    assert '<td class="num guaranteed">16</td>' in row.group(0)
    assert '<td class="num cap">24</td>' in row.group(0)
    # The admin sees every tenant, nlp's queued B200 gang among them.
    status, html, _ = await _get(browsers["admin"], "/queues")
    row = re.search(r'<tr data-tenant="nlp" data-gpu-type="B200">.*?</tr>', html, re.S)
    assert row, html[:2000]
    assert '<td class="num queued">16</td>' in row.group(0)
    # Finance may read tenants, not list jobs: quotas without usage.
    status, html, _ = await _get(browsers["finance"], "/queues")
    assert status == 200
    assert 'id="usage-hidden"' in html


async def test_clusters_show_used_free_prices_and_reachability(
    data: Data, browsers: dict[str, aiohttp.ClientSession]
) -> None:
    for user in ("alice", "admin", "finance"):
        status, html, _ = await _get(browsers[user], "/clusters")
        assert status == 200, user
        main = _main(html, "clusters")
        for cluster in ("onprem-a100", "aws-us-east-1", "gcp-us-east4"):
            assert f'<tr data-cluster="{cluster}"><th scope="row">{cluster}</th>' in main
        assert "$1.10" in main  # the on-prem A100s' price
        assert "reachable" in main
        _safe(html, f"/clusters as {user}")
    status, html, _ = await _get(browsers["admin"], "/clusters")
    a100 = re.search(r'<section class="gpu-type" data-gpu-type="A100">.*?</section>', html, re.S)
    assert a100
    used = [int(n) for n in re.findall(r'<td class="num used">(\d+)</td>', a100.group(0))]
    assert sum(used) >= 8  # vision-long's eight A100s at least


async def test_capacity_shows_pools_and_the_plan_on_a_timeline_escaped(
    data: Data, browsers: dict[str, aiohttp.ClientSession]
) -> None:
    for user in ("infra", "admin", "finance"):
        status, html, _ = await _get(browsers[user], "/capacity")
        assert status == 200, user
        main = _main(html, "capacity")
        assert '<svg id="plan-timeline"' in main
        assert f'<g class="plan" data-plan-id="{data.plan_id}" data-state="scheduled">' in main
        assert 'id="timeline-now"' in main
        assert '<tr data-cluster="aws-us-east-1" data-pool="h100-od">' in main
        assert EVIL not in html
        assert "&lt;script&gt;alert(&quot;plan&quot;)&lt;/script&gt;" in main
        _safe(html, f"/capacity as {user}")


async def test_finance_shows_spend_budget_burn_and_a_csv(
    data: Data, browsers: dict[str, aiohttp.ClientSession]
) -> None:
    status, html, _ = await _get(browsers["finance"], "/finance")
    assert status == 200
    main = _main(html, "finance")
    assert '<svg id="cost-by-tenant"' in main
    assert re.search(r'<rect class="bar" data-tenant="vision"', main)
    hours = re.search(r'<tr data-tenant="vision".*?<td class="num gpu-hours">([\d.,]+)</td>', main, re.S)
    assert hours
    assert float(hours.group(1).replace(",", "")) > 0
    # vision has a monthly budget in the default config: a burn bar against it.
    assert re.search(r'<tr data-tenant="vision".*?<td class="num budget">20,000.0</td>', main, re.S)
    assert 'href="/finance.csv?period=month"' in main
    _safe(html, "/finance as finance")
    status, csv, response = await _get(browsers["finance"], "/finance.csv?period=month")
    assert status == 200
    assert response.headers["Content-Type"].startswith("text/csv")
    assert "attachment" in response.headers["Content-Disposition"]
    tenants = {line.split(",")[0] for line in csv.splitlines()[1:]}
    assert {"vision", "nlp"} <= tenants
    # A period that is not one: the error page, not a traceback.
    status, html, _ = await _get(browsers["finance"], "/finance?period=%3Cb%3E")
    assert status == 400
    assert "<b>" not in _main(html, "error")
    # Reports are for finance and members: the admin and infra get the not-found page, as the API says.
    for user in ("admin", "infra"):
        status, _, _ = await _get(browsers[user], "/finance")
        assert status == 404, user


async def test_signed_out_pages_go_to_the_sign_in(up: ConsoleUp, data: Data) -> None:
    async with aiohttp.ClientSession(up.console_url) as anonymous:
        for path in ("/queues", "/clusters", "/capacity", "/finance", "/finance.csv"):
            async with anonymous.get(path, allow_redirects=False) as r:
                assert r.status == 303, path
                assert r.headers["Location"] == "/login"


def test_the_pages_register_the_contracts_urls() -> None:
    app = web.Application()
    for module in (queues, clusters, capacity, finance):
        module.add_routes(app)
    paths = sorted(r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource)
    assert paths == ["/capacity", "/clusters", "/finance", "/finance-savings.csv", "/finance.csv", "/queues"]
