"""The web console in a real browser: Debian's headless chromium, driven by Playwright, against
`gpufed up` run as a user runs it and loaded with the demo's kind of data (issue 21).

What a user would do and see: sign in with a token (a bad one refused), every page with its content,
a job's phase changing on screen without a reload, alice's session never showing nlp's jobs (not
even through typed URLs or the event streams), a cancel through the page that `gpufed audit` shows,
forged cross-site and token-less POSTs refused, and the navigation reachable with Tab and a visible
focus ring.

With GPUFED_CONSOLE_SCREENSHOTS=DIR (e.g. docs/console) the every-page test also leaves a screenshot
of each page there, `<page>.png`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, FloatRect, Page, expect

from tests.e2e.console_harness import (
    PAGES,
    SHORT,
    WAITING,
    AttackerSite,
    ConsoleUp,
    DemoData,
    chromium,
    csrf_of,
    fetch,
    load_demo_data,
    new_context,
    requires_chromium,
    sign_in,
    submit,
    wait_for,
)

pytestmark = [pytest.mark.e2e, requires_chromium]

SCREENSHOTS = os.environ.get("GPUFED_CONSOLE_SCREENSHOTS")
FOCUS_CLIP: FloatRect = {"x": 0, "y": 0, "width": 1280, "height": 160}
# The links each role's navigation shows: only pages its API calls answer (issue 30).
NAV_HREFS = {"/jobs", "/sets", "/queues", "/clusters", "/capacity", "/approvals", "/tenants"}  # an admin's
MEMBER_NAV_HREFS = {"/jobs", "/sets", "/queues", "/clusters", "/finance", "/approvals", "/tenants"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleUp]:
    instance = ConsoleUp(tmp_path_factory.mktemp("console") / "state")
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="module")
def demo(up: ConsoleUp) -> DemoData:
    return load_demo_data(up)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as instance:
        yield instance


def _shoot(page: Page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def _main_text(page: Page, name: str) -> str:
    main = page.locator(f"main#page-{name}")
    assert main.count() == 1, f"{page.url}: no main#page-{name}"
    return main.inner_text()


def _watch_for_breakage(page: Page) -> list[str]:
    """Script errors and Content-Security-Policy violations the page raises, as they come."""
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"script error: {error}"))
    page.on(
        "console",
        lambda message: (
            problems.append(f"console: {message.text}")
            if message.type == "error" and "Content Security Policy" in message.text
            else None
        ),
    )
    return problems


def test_up_prints_the_console_url_beside_metrics(up: ConsoleUp, browser: Browser) -> None:
    printed = up.printed_console_url()
    assert printed is not None, f"`gpufed up` printed no `console:` line:\n{up.printed()}"
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", printed), printed
    context = new_context(browser, up.console_url)
    page = context.new_page()
    # Not signed in: the console sends the browser to the sign-in form.
    page.goto("/")
    assert page.url == f"{up.console_url}/login"
    assert page.locator("form#login input[name=token][type=password]").count() == 1
    # /metrics is still served, on the same port, to anyone.
    metrics = context.request.get("/metrics")
    assert metrics.status == 200
    assert "gpufed_api_request_seconds" in metrics.text()
    context.close()


def test_sign_in_refuses_a_bad_token_and_lands_a_good_one_on_jobs(up: ConsoleUp, browser: Browser) -> None:
    context = new_context(browser, up.console_url)
    page = context.new_page()
    page.goto("/login")
    page.fill("form#login input[name=token]", "not-a-token-" + "x" * 30)
    with page.expect_response(lambda r: r.url.endswith("/login") and r.request.method == "POST") as refused:
        page.click("form#login button[type=submit]")
    assert refused.value.status == 401
    page.wait_for_load_state()
    assert page.locator("p.error").inner_text().strip(), "the refusal says nothing"
    assert page.locator("form#login").count() == 1
    assert not [c for c in context.cookies() if c["name"] == "gpufed_session"]
    page.goto("/jobs")
    assert page.url.endswith("/login"), "a refused sign-in still reached /jobs"

    page.fill("form#login input[name=token]", up.token("alice"))
    with page.expect_navigation():
        page.click("form#login button[type=submit]")
    assert page.url == f"{up.console_url}/jobs"
    assert page.locator("main#page-jobs").count() == 1
    assert page.locator("span#whoami").inner_text().strip() == "alice (vision, member)"
    cookie = next(c for c in context.cookies() if c["name"] == "gpufed_session")
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/"
    assert cookie["secure"] is False  # no TLS here; Secure when the server has TLS
    assert "gpufed_session" not in page.evaluate("document.cookie")
    # Signed in, the root goes to the jobs.
    page.goto("/")
    assert page.url == f"{up.console_url}/jobs"
    response = page.goto("/jobs")
    assert response is not None
    headers = response.headers
    assert "default-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "same-origin"
    context.close()


def test_every_page_renders_its_content(up: ConsoleUp, demo: DemoData, browser: Browser) -> None:
    if SCREENSHOTS:
        context = new_context(browser, up.console_url)
        login = context.new_page()
        login.goto("/login")
        _shoot(login, "login")
        context.close()
    context, page = sign_in(browser, up, "admin")
    problems = _watch_for_breakage(page)

    whoami = "admin (platform, admin)"

    def visit(path: str, name: str) -> str:
        response = page.goto(path)
        assert response is not None
        assert response.status == 200, f"{path}: {response.status}"
        nav = {a.get_attribute("href") for a in page.locator("nav#nav a").all()}
        assert nav_hrefs_ok(nav), f"{path}: nav links {nav}"
        assert page.locator("span#whoami").inner_text().strip() == whoami
        return _main_text(page, name)

    # Jobs: every job of both tenants, one row each with its columns and a link to its page.
    visit("/jobs", "jobs")
    rows = page.locator("table#jobs tbody tr[data-job-id]")
    shown = {r.get_attribute("data-job-id") for r in rows.all()}
    assert {demo.vision, *demo.nlp} <= shown
    row = page.locator(f'table#jobs tr[data-job-id="{demo.vision}"]')
    for cell in ("phase", "tenant", "user", "cluster", "gpus", "submitted"):
        assert row.locator(f"td.{cell}").count() == 1, f"no td.{cell}"
    assert row.locator("td.phase").inner_text().strip() == "SUCCEEDED"
    assert row.locator("td.tenant").inner_text().strip() == "vision"
    assert row.locator("td.user").inner_text().strip() == "alice"
    assert row.locator("td.cluster").inner_text().strip() == "onprem-a100"
    assert row.locator("td.gpus").inner_text().strip().startswith("6")
    assert row.locator("td.name a").get_attribute("href") == f"/jobs/{demo.vision}"
    for name in ("tenant", "phase", "user", "cluster"):
        assert page.locator(f"form#filters [name={name}]").count() == 1, f"no filter {name}"
    _shoot(page, "jobs")

    # Filters: nlp's jobs only.
    page.goto("/jobs?tenant=nlp")
    tenants = {t.strip() for t in page.locator("table#jobs tbody td.tenant").all_inner_texts()}
    assert tenants == {"nlp"}

    # One job: its spec, attempts, describe, wait reasons and logs.
    page.click(f'table#jobs tr[data-job-id="{demo.nlp[0]}"] td.name a')
    page.wait_for_url(f"**/jobs/{demo.nlp[0]}")
    text = _main_text(page, "job")
    assert page.locator("span#job-phase").inner_text().strip() == "SUCCEEDED"
    for section in ("spec", "attempts", "describe", "wait-reasons", "logs"):
        assert page.locator(f"main#page-job #{section}").count() == 1, f"no #{section}"
    assert "llm-finetune" in text
    assert "nvcr.io/nvidia/pytorch:24.05-py3" in page.locator("#spec").inner_text()
    assert page.locator("#logs pre#log-output").count() == 1
    _shoot(page, "job")
    # The waiting gang says why it waits.
    visit(f"/jobs/{demo.nlp_waiting}", "job")
    assert page.locator("span#job-phase").inner_text().strip() == "QUEUED"
    assert "B200" in page.locator("#wait-reasons").inner_text()

    text = visit("/queues", "queues")
    for word in ("vision", "nlp", "A100", "H100"):
        assert word in text, f"queues: no {word}"
    _shoot(page, "queues")

    text = visit("/clusters", "clusters")
    for word in ("onprem-a100", "aws-us-east-1", "gcp-us-east4", "A100", "H100", "L4", "6.88"):
        assert word in text, f"clusters: no {word}"
    _shoot(page, "clusters")

    text = visit("/capacity", "capacity")
    for word in ("h100-od", "l4-od", "gcp-us-east4", demo.plan_reason):
        assert word in text, f"capacity: no {word}"
    _shoot(page, "capacity")

    text = visit("/approvals", "approvals")
    assert demo.approval_reason in text
    assert "alice" in text
    assert page.locator("form#grant-approval").count() == 1
    assert page.locator("form.revoke-approval").count() >= 1
    _shoot(page, "approvals")
    assert not problems, problems
    context.close()

    # Finance, as the finance role: admins run the fleet, not its bills (the API refuses them reports).
    context, page = sign_in(browser, up, "finance")
    problems = _watch_for_breakage(page)
    whoami = "finance (platform, finance)"
    text = visit("/finance", "finance")
    for word in ("vision", "nlp"):
        assert word in text, f"finance: no {word}"
    csv_link = page.locator("a#finance-csv")
    href = csv_link.get_attribute("href")
    assert href is not None
    assert href.startswith("/finance.csv")
    csv = context.request.get(href)
    assert csv.status == 200
    assert "csv" in csv.headers["content-type"]
    assert "vision" in csv.text()
    assert "nlp" in csv.text()
    _shoot(page, "finance")

    assert not problems, problems
    context.close()


FINANCE_NAV_HREFS = {"/queues", "/clusters", "/capacity", "/finance", "/approvals", "/tenants"}


def nav_hrefs_ok(hrefs: set[str | None]) -> bool:
    return hrefs in (NAV_HREFS, MEMBER_NAV_HREFS, FINANCE_NAV_HREFS)


def test_a_jobs_phase_changes_on_screen_without_a_reload(
    up: ConsoleUp, demo: DemoData, browser: Browser
) -> None:
    context, listing = sign_in(browser, up, "alice")
    one = submit(up, "alice", SHORT.format(name="live-one", duration="8s"))
    row = submit(up, "alice", SHORT.format(name="live-row", duration="8s"))

    job_page = context.new_page()
    job_page.goto(f"/jobs/{one}")
    listing.goto("/jobs")
    problems = _watch_for_breakage(job_page) + _watch_for_breakage(listing)
    phase_cell = f'table#jobs tr[data-job-id="{row}"] td.phase'
    first = {
        "job": job_page.locator("span#job-phase").inner_text().strip(),
        "row": listing.locator(phase_cell).inner_text().strip(),
    }
    assert "SUCCEEDED" not in first.values(), f"finished before the pages loaded: {first}"
    navigations: list[str] = []
    for page in (job_page, listing):
        # A mark in the document: a reload would lose it. And count main-frame navigations.
        page.evaluate("window.__noReload = true")
        page.on(
            "framenavigated",
            lambda frame: navigations.append(frame.url) if frame.parent_frame is None else None,
        )
    # Playwright's wait_for_function evaluates a string, which the console's CSP (no 'unsafe-eval')
    # rightly forbids; its `expect` polls from its own injected script instead.
    expect(job_page.locator("span#job-phase")).to_have_text("SUCCEEDED", timeout=90_000)
    expect(listing.locator(phase_cell)).to_have_text("SUCCEEDED", timeout=90_000)
    # The log followed on the same page: the simulated container's lines up to its exit.
    log = job_page.locator("pre#log-output")
    expect(log).to_contain_text('container "worker" started', timeout=30_000)
    expect(log).to_contain_text("exited with code 0", timeout=30_000)
    assert job_page.evaluate("window.__noReload") is True
    assert listing.evaluate("window.__noReload") is True
    assert navigations == [], f"the pages navigated: {navigations}"
    assert up.phase("alice", one) == "SUCCEEDED"
    assert not problems, problems
    context.close()


def _no_nlp(demo: DemoData, text: str, where: str) -> None:
    for marker in (*demo.nlp, *demo.nlp_names):
        assert marker not in text, f"{where}: alice's session shows {marker}"


def test_alices_session_never_shows_nlps_jobs(up: ConsoleUp, demo: DemoData, browser: Browser) -> None:
    context, page = sign_in(browser, up, "alice")
    nlp_job = demo.nlp[0]

    page.goto("/jobs")
    tenants = {t.strip() for t in page.locator("table#jobs tbody td.tenant").all_inner_texts()}
    assert tenants == {"vision"}
    _no_nlp(demo, page.content(), "/jobs")
    for query in ("?tenant=nlp", "?user=bob", "?tenant=nlp&phase=SUCCEEDED", "?cluster=aws-us-east-1"):
        response = page.goto(f"/jobs{query}")
        assert response is not None
        assert response.status in (200, 403, 404), f"/jobs{query}: {response.status}"
        _no_nlp(demo, page.content(), f"/jobs{query}")
        for tenant in page.locator("table#jobs tbody td.tenant").all_inner_texts():
            assert tenant.strip() == "vision", f"/jobs{query}"

    # Another tenant's job is exactly an unknown job: the same 404 page.
    unknown = "no-such-job-0000"
    response = page.goto(f"/jobs/{unknown}")
    assert response is not None
    assert response.status == 404
    unknown_text = page.locator("main").inner_text().replace(unknown, "ID")
    response = page.goto(f"/jobs/{nlp_job}")
    assert response is not None
    assert response.status == 404
    assert page.locator("main").inner_text().replace(nlp_job, "ID") == unknown_text
    _no_nlp(demo, page.content().replace(nlp_job, ""), f"/jobs/{nlp_job}")

    # The job's event streams and logs, typed: the same answer as for an unknown job.
    for suffix in ("/events", "/logs/events", "/logs"):
        theirs = fetch(page, f"/jobs/{nlp_job}{suffix}")
        unknowns = fetch(page, f"/jobs/{unknown}{suffix}")
        assert theirs["status"] in (404, 200), f"{suffix}: {theirs['status']}"
        assert theirs["status"] == unknowns["status"], (suffix, theirs, unknowns)
        assert theirs["body"].replace(nlp_job, "ID") == unknowns["body"].replace(unknown, "ID"), suffix
        _no_nlp(demo, theirs["body"].replace(nlp_job, ""), f"/jobs/<nlp>{suffix}")
    # A cancel of nlp's job with alice's good CSRF token: refused as unknown, and nothing changes.
    page.goto("/jobs")
    token = csrf_of(page)
    got = fetch(page, f"/jobs/{demo.nlp_waiting}/cancel", method="POST", form={"csrf": token})
    assert got["status"] == 404, got
    assert up.phase("bob", demo.nlp_waiting) == "QUEUED"
    assert not up.job_json("bob", demo.nlp_waiting).get("cancel_requested")

    # The live list's stream, asked for nlp's jobs, while an nlp job changes phase: nothing of nlp's.
    fresh = submit(up, "bob", SHORT.format(name="bob-live", duration="1s"))
    for path in ("/jobs/events?tenant=nlp", "/jobs/events", "/jobs/events?user=bob"):
        got = fetch(page, path)
        assert got["status"] in (200, 403, 404), f"{path}: {got['status']}"
        _no_nlp(demo, got["body"], path)
        assert fresh not in got["body"], f"{path}: shows bob's {fresh}"

    # Every page alice can open, and the finance CSV.
    for name in PAGES:
        page.goto(f"/{name}")
        _no_nlp(demo, page.content(), f"/{name}")
        assert fresh not in page.content()
    csv = context.request.get("/finance.csv")
    assert csv.status in (200, 404)
    _no_nlp(demo, csv.text(), "/finance.csv")
    if csv.status == 200:
        assert "nlp" not in csv.text(), "finance CSV: nlp's rows"
    context.close()


def test_a_cancel_through_the_page_works_and_is_audited(
    up: ConsoleUp, demo: DemoData, browser: Browser
) -> None:
    job_id = submit(up, "alice", WAITING.format(name="cancel-me"))
    context, page = sign_in(browser, up, "alice")
    page.goto(f"/jobs/{job_id}")
    assert page.locator("span#job-phase").inner_text().strip() == "QUEUED"
    form = page.locator("form#cancel")
    assert form.locator("input[type=hidden][name=csrf]").count() == 1
    with page.expect_navigation():
        form.locator("[type=submit]").click()
    assert page.url == f"{up.console_url}/jobs/{job_id}"
    expect(page.locator("span#job-phase")).to_have_text("CANCELLED", timeout=60_000)
    wait_for(lambda: up.phase("alice", job_id) == "CANCELLED", timeout_s=30, what="cancelled")

    audit = up.gpufed("audit", "--limit", "1000", user="admin")
    assert audit.returncode == 0, audit.stderr
    lines = [line for line in audit.stdout.splitlines() if job_id in line]
    assert lines, f"no audit line for {job_id}:\n{audit.stdout}"
    assert any("alice" in line and "cancel" in line.lower() for line in lines), lines
    context.close()


def _cancelled_or_requested(up: ConsoleUp, job_id: str) -> bool:
    data = up.job_json("alice", job_id)
    return data.get("phase") == "JOB_PHASE_CANCELLED" or bool(data.get("cancel_requested"))


def test_a_forged_cross_site_post_is_refused(up: ConsoleUp, demo: DemoData, browser: Browser) -> None:
    job_id = submit(up, "alice", WAITING.format(name="do-not-cancel"))
    context, page = sign_in(browser, up, "alice")
    page.goto(f"/jobs/{job_id}")
    leaked = csrf_of(page)
    action = f"{up.console_url}/jobs/{job_id}/cancel"
    statuses: list[tuple[str, int, str]] = []

    with AttackerSite() as attacker:
        # Same site (loopback), another origin (port): the SameSite cookie goes along, so the CSRF
        # checks alone must refuse it.
        attacker.add_auto_post("/prize.html", action, {"reason": "forged"})
        # Even with the session's own CSRF token (as if it had leaked), a foreign Origin is refused.
        attacker.add_auto_post("/prize2.html", action, {"reason": "forged", "csrf": leaked})
        for url in (
            attacker.url("/prize.html"),
            attacker.url("/prize2.html"),
            # Another site altogether (localhost is not 127.0.0.1): no cookie goes along.
            attacker.url("/prize2.html", host="localhost"),
        ):
            victim = context.new_page()
            with victim.expect_response(lambda r: r.url == action) as answer:
                victim.goto(url)
            response = answer.value
            body = response.text() if response.status != 303 else ""
            statuses.append((url, response.status, body))
            victim.close()
    refused = [(u, s) for u, s, b in statuses[:2] if not (s == 403 and "CSRF" in b)]
    assert not refused, f"forged POSTs not refused with 403 CSRF: {refused}"
    assert statuses[2][1] in (401, 403), statuses[2][:2]

    # A same-origin request without the csrf field: refused too.
    got = fetch(page, f"/jobs/{job_id}/cancel", method="POST", form={"reason": "no token"})
    assert got["status"] == 403
    assert "CSRF" in got["body"]
    got = fetch(page, f"/jobs/{job_id}/cancel", method="POST", form={"reason": "bad", "csrf": "0" * 43})
    assert got["status"] == 403

    page.wait_for_timeout(1500)
    assert not _cancelled_or_requested(up, job_id), "the forged POST cancelled the job"
    assert up.phase("alice", job_id) == "QUEUED"
    audit = up.gpufed("audit", "--limit", "1000", user="admin")
    assert job_id not in audit.stdout
    context.close()


def test_tab_reaches_the_navigation_with_a_visible_focus_ring(
    up: ConsoleUp, demo: DemoData, browser: Browser
) -> None:
    context, page = sign_in(browser, up, "alice")
    page.goto("/jobs")
    reached: dict[str, dict[str, Any]] = {}
    for _ in range(30):
        page.keyboard.press("Tab")
        focused: dict[str, Any] = page.evaluate(
            """() => {
                const el = document.activeElement;
                const s = getComputedStyle(el);
                return {href: el.getAttribute("href"), inNav: !!el.closest("nav#nav"),
                        outline: s.outlineStyle, width: parseFloat(s.outlineWidth) || 0,
                        shadow: s.boxShadow};
            }"""
        )
        if focused["inNav"] and focused["href"]:
            reached[focused["href"]] = focused
        if set(reached) >= MEMBER_NAV_HREFS:
            break
    assert set(reached) >= MEMBER_NAV_HREFS, f"Tab reached only {sorted(reached)}"
    for href, style in reached.items():
        ring = (style["outline"] != "none" and style["width"] > 0) or style["shadow"] not in ("none", "")
        assert ring, f"{href}: no visible focus ring ({style})"
    if SCREENSHOTS:
        page.screenshot(path=str(Path(SCREENSHOTS) / "keyboard-focus.png"), clip=FOCUS_CLIP)
    # Enter follows the focused link (the last one reached: Tenants).
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert page.url == f"{up.console_url}/tenants"
    context.close()


def test_an_admin_grants_and_revokes_an_approval_through_the_page_both_audited(
    up: ConsoleUp, demo: DemoData, browser: Browser
) -> None:
    reason = "paper <b>deadline</b> & more"
    context, page = sign_in(browser, up, "admin")
    page.goto("/approvals")
    form = page.locator("form#grant-approval")
    form.locator("[name=tenant]").select_option("nlp")
    form.locator("[name=user]").fill("bob")
    form.locator("[name=priority_class]").fill("urgent")
    form.locator("[name=hours]").fill("2")
    form.locator("[name=reason]").fill(reason)
    with page.expect_navigation():
        form.locator("[type=submit]").click()
    assert page.locator("main#page-approvals").count() == 1
    row = page.locator("main#page-approvals tr", has_text=reason)
    assert row.count() == 1, "the granted approval is not listed (or its reason not shown as written)"
    assert row.locator("b").count() == 0, "the reason's markup was not escaped"
    listed = up.gpufed("approval", "list", user="admin")
    assert reason in listed.stdout, listed.stdout
    approval_id = next(w for w in row.inner_text().split() if w.startswith("ap-"))

    with page.expect_navigation():
        row.locator("form.revoke-approval [type=submit]").click()
    assert page.locator("main#page-approvals tr", has_text=reason).count() == 0
    assert reason not in up.gpufed("approval", "list", user="admin").stdout
    audit = up.gpufed("audit", "--limit", "1000", user="admin").stdout
    granted = [line for line in audit.splitlines() if "approval_grant" in line and "admin" in line]
    revoked = [line for line in audit.splitlines() if "approval_revoked" in line and approval_id in line]
    assert granted, audit
    assert revoked, audit
    context.close()

    # A member has no grant form, and a POST with her own good CSRF token grants nothing.
    context, page = sign_in(browser, up, "alice")
    page.goto("/approvals")
    assert page.locator("form#grant-approval").count() == 0
    got = fetch(
        page,
        "/approvals",
        method="POST",
        form={
            "csrf": csrf_of(page),
            "tenant": "vision",
            "user": "alice",
            "priority_class": "urgent",
            "hours": "24",
            "reason": "self-granted",
        },
    )
    assert got["status"] in (403, 404), got["status"]
    assert "self-granted" not in up.gpufed("approval", "list", "--all", user="admin").stdout
    context.close()


def test_a_revoked_token_ends_the_browser_session(up: ConsoleUp, browser: Browser, tmp_path: Path) -> None:
    token_file = tmp_path / "alice-2.token"
    issued = up.gpufed("token", "issue", "alice", "--out", str(token_file), user="admin")
    assert issued.returncode == 0, issued.stderr
    token_id = issued.stdout.split()[1]
    context = new_context(browser, up.console_url)
    page = context.new_page()
    page.goto("/login")
    page.fill("form#login input[name=token]", token_file.read_text().strip())
    with page.expect_navigation():
        page.click("form#login button[type=submit]")
    assert page.url == f"{up.console_url}/jobs"
    revoked = up.gpufed("token", "revoke", token_id, user="admin")
    assert revoked.returncode == 0, revoked.stderr

    def signed_out() -> bool:
        page.goto("/jobs")
        return page.url == f"{up.console_url}/login"

    wait_for(signed_out, timeout_s=20, what="the revoked token's session ended")
    context.close()


def test_values_from_the_store_are_escaped(up: ConsoleUp, browser: Browser) -> None:
    payload = '<img id="pwned" src="/nothing" alt="x">'
    manifest = SHORT.format(name="escape-me", duration="1s").replace(
        'image: "pytorch/pytorch:2.3", gpus: 1}',
        f"image: \"pytorch/pytorch:2.3\", gpus: 1, command: [python, '{payload}']}}",
    )
    job_id = submit(up, "alice", manifest)
    context, page = sign_in(browser, up, "alice")
    page.goto(f"/jobs/{job_id}")
    assert payload in page.locator("#spec").inner_text(), "the command is not shown as written"
    assert page.locator("#pwned").count() == 0
    page.goto("/jobs")
    assert page.locator("#pwned").count() == 0
    context.close()
