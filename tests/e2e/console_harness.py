"""The web console's browser tests' fixtures: `gpufed up` as a user runs it, the demo's jobs, and
Debian's headless chromium driven by Playwright.

`gpufed up` runs as its own process with its own state directory (`--port 0 --metrics-port 0`); the
console's URL is the `console:` line it prints (the tests also check the line is there). Jobs go in
as the demo submits them: alice (tenant vision) and bob (tenant nlp) with the token files `gpufed up`
printed, infra plans capacity and the admin grants an approval with the CLI.

The browser is Debian's `chromium` (`make test` installs it where missing) through Playwright's
bundled driver with `executable_path`: no browser is ever downloaded (`playwright install` never
runs). Nothing may leave the machine: every request goes to a proxy on a closed port except
loopback's, which Chromium never proxies. (`--proxy-bypass-list=<-loopback>` would do the opposite:
it sends loopback through the proxy too.) In CI a missing chromium fails the tests instead of
skipping them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from federation.api.client import GpufedClient, wait_until_serving
from federation.api.convert import phase_name
from federation.runtime.embedded import ENDPOINT_FILE, read_endpoint

if TYPE_CHECKING:
    # Only the type: the harness's module imports the history store, which these tests do not use.
    from tests.e2e.harness import Poll

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
IN_CI = os.environ.get("CI") == "true"
CHROMIUM_ARGS = [
    # Playwright runs chromium without its sandbox already (as root it could not start one); said here
    # so that the flags in use are all in one place.
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # Nothing leaves the machine: everything but loopback goes to a closed port.
    "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=127.0.0.1;localhost",
]

requires_chromium = pytest.mark.skipif(
    CHROMIUM is None and not IN_CI, reason="chromium is not installed (make test installs it)"
)

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
PAGES = ("jobs", "queues", "clusters", "capacity", "finance", "approvals")

# A gang for a GPU type no cluster has: it waits in the queue for as long as a test needs it to.
WAITING = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  gpuTypes: [B200]
  tasks:
    - {{name: worker, replicas: 2, image: "pytorch/pytorch:2.3", gpus: 8}}
"""

# A small job that runs for `duration` on the on-prem A100s.
SHORT = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: {name}, annotations: {{sim.gpufed.io/duration: "{duration}"}}}}
spec:
  gpuTypes: [A100]
  tasks:
    - {{name: master, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}}
    - {{name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}}
"""

# The demo's capacity step: more H100 than any pool holds, so aws-us-east-1's h100-od pool grows.
BIG_GANG = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: pretrain-32xh100, annotations: {sim.gpufed.io/duration: "3s"}}
spec:
  gpuTypes: [H100]
  tasks:
    - {name: master, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 8}
    - {name: worker, replicas: 3, image: "pytorch/pytorch:2.3", gpus: 8}
"""


_T = TypeVar("_T")


def wait_for(predicate: Poll[_T], *, timeout_s: float = 30.0, what: str = "condition") -> _T:
    """tests/e2e/harness.wait_for's loop, polled every 0.2 s (a page's state, not a process's) and its
    failure named by `what`, which that one does not take."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met within {timeout_s:g} s")
        time.sleep(0.2)


class ConsoleUp:
    """`gpufed up` in a state directory of its own, its printed lines kept in a file."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.out_path = state_dir.parent / "up.out"
        self.err_path = state_dir.parent / "up.err"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 90.0) -> None:
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "federation",
                    "--state-dir",
                    str(self.state_dir),
                    "up",
                    "--port",
                    "0",
                    "--metrics-port",
                    "0",
                ],
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
        proc = self.proc
        wait_for(
            lambda: (
                proc.poll() is not None
                or ((self.state_dir / ENDPOINT_FILE).exists() and "try: gpufed" in self.printed())
            ),
            timeout_s=timeout_s,
            what="gpufed up ready",
        )
        assert proc.poll() is None, f"gpufed up exited:\n{self.err_path.read_text()[-4000:]}"
        wait_until_serving(self.grpc_target)
        # The console line may come after the others; give it a moment before deriving the URL.
        deadline = time.monotonic() + 3.0
        while self.printed_console_url() is None and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def printed(self) -> str:
        return self.out_path.read_text(errors="replace")

    def printed_console_url(self) -> str | None:
        found = re.search(r"^console: (\S+)\s*$", self.printed(), re.M)
        return found.group(1) if found else None

    @property
    def grpc_target(self) -> str:
        return read_endpoint(self.state_dir)["grpc"]

    @property
    def console_url(self) -> str:
        """The console's base URL without the trailing slash: the printed line, or else the metrics
        port's root (the console shares the port that serves /metrics)."""
        printed = self.printed_console_url()
        if printed is not None:
            return printed.rstrip("/")
        metrics = read_endpoint(self.state_dir)["metrics"]
        assert metrics, "gpufed up serves no HTTP port"
        return metrics.removesuffix("/metrics")

    def token_file(self, user: str) -> Path:
        """The token file `gpufed up` printed for `user`."""
        found = re.search(rf"^token for {re.escape(user)}: (\S+)$", self.printed(), re.M)
        assert found, f"gpufed up printed no token file for {user}"
        return Path(found.group(1))

    def token(self, user: str) -> str:
        return self.token_file(user).read_text().strip()

    def client(self, user: str) -> GpufedClient:
        return GpufedClient(self.grpc_target, self.token(user))

    def gpufed(self, *args: str, user: str) -> subprocess.CompletedProcess[str]:
        """The CLI as a user runs it, with the token file `gpufed up` printed for `user`."""
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "federation",
                "--state-dir",
                str(self.state_dir),
                "--token-file",
                str(self.token_file(user)),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def phase(self, user: str, job_id: str) -> str:
        with self.client(user) as c:
            return phase_name(c.get(job_id).phase)

    def job_json(self, user: str, job_id: str) -> dict[str, Any]:
        out = self.gpufed("-o", "json", "get", job_id, user=user)
        assert out.returncode == 0, out.stderr
        data: dict[str, Any] = json.loads(out.stdout)
        return data


@dataclass
class DemoData:
    """The ids of what the demo's kind of data put into the federation."""

    vision: str  # alice's ResNet (examples/resnet-vision.yaml), run to its end
    nlp: list[str]  # bob's examples and his waiting B200 gang and 32 x H100 gang
    nlp_names: list[str]
    nlp_waiting: str
    plan_reason: str
    approval_reason: str


def submit(up: ConsoleUp, user: str, manifest: str) -> str:
    with up.client(user) as c:
        return c.submit(manifest, idempotency_key=str(uuid.uuid4())).job_id


def load_demo_data(up: ConsoleUp) -> DemoData:
    """What `gpufed demo` submits, in short: the examples as alice and bob, a B200 gang that waits,
    the 32 x H100 gang that grows a cloud pool, infra's capacity plan, an admin's approval; then wait
    until the examples have run (so that finance has costs to show)."""
    vision = submit(up, "alice", (EXAMPLES / "resnet-vision.yaml").read_text())
    llm = submit(up, "bob", (EXAMPLES / "llm-finetune-nlp.yaml").read_text())
    bert = submit(up, "bob", (EXAMPLES / "bert-eval-nlp.yaml").read_text())
    waiting = submit(up, "bob", WAITING.format(name="needs-b200"))
    gang = submit(up, "bob", BIG_GANG)

    start = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%dT08:00")
    end = (datetime.now(UTC) + timedelta(days=4)).strftime("%Y-%m-%dT20:00")
    plan_reason = "launch week for the speech models"
    plan = up.gpufed(
        "capacity", "plan", "create", "--cluster", "gcp-us-east4", "--gpu-type", "L4", "--gpus", "8",
        "--from", start, "--to", end, "--reason", plan_reason, user="infra",
    )  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    approval_reason = "CVPR deadline"
    grant = up.gpufed(
        "approval", "grant", "--tenant", "vision", "--user", "alice", "--for", "72h",
        "--reason", approval_reason, user="admin",
    )  # fmt: skip
    assert grant.returncode == 0, grant.stderr

    def finished(user: str, job_id: str) -> Callable[[], bool]:
        return lambda: up.phase(user, job_id) in TERMINAL

    for job_id, user in ((vision, "alice"), (llm, "bob"), (bert, "bob")):
        wait_for(finished(user, job_id), timeout_s=120, what=f"{job_id} finished")
    return DemoData(
        vision=vision,
        nlp=[llm, bert, waiting, gang],
        nlp_names=["llm-finetune", "bert-eval", "needs-b200", "pretrain-32xh100"],
        nlp_waiting=waiting,
        plan_reason=plan_reason,
        approval_reason=approval_reason,
    )


@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's chromium through Playwright's own driver; never a downloaded browser."""
    assert CHROMIUM is not None, "chromium is missing: `make test` installs Debian's chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


def new_context(browser: Browser, base_url: str) -> BrowserContext:
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 800})
    context.set_default_timeout(15_000)
    return context


def sign_in(browser: Browser, up: ConsoleUp, user: str) -> tuple[BrowserContext, Page]:
    """A browser context signed in as `user` with the token file's contents, on /jobs."""
    context = new_context(browser, up.console_url)
    page = context.new_page()
    page.goto("/login")
    page.fill("form#login input[name=token]", up.token(user))
    with page.expect_navigation():
        page.click("form#login button[type=submit]")
    # Finance may not list jobs: it lands on its own page (issue 30).
    home = "/finance" if user == "finance" else "/jobs"
    assert page.url.rstrip("/").endswith(home), f"sign-in as {user} landed on {page.url}"
    return context, page


def csrf_of(page: Page) -> str:
    """The session's CSRF token, from the first form on the page that carries it."""
    value = page.locator("input[name=csrf]").first.get_attribute("value")
    assert value, "no csrf field on the page"
    return value


def fetch(page: Page, url: str, *, method: str = "GET", form: dict[str, str] | None = None) -> dict[str, Any]:
    """`fetch` from inside the page (same origin, the session's cookie): status, final URL and body.
    A 200 event stream is read for at most two seconds, then abandoned."""
    result: dict[str, Any] = page.evaluate(
        """async ([url, method, form]) => {
            const ctl = new AbortController();
            const init = {method, signal: ctl.signal, redirect: "follow"};
            if (form !== null) init.body = new URLSearchParams(form);
            const r = await fetch(url, init);
            let body = "";
            const type = r.headers.get("content-type") || "";
            if (type.startsWith("text/event-stream")) {
                const reader = r.body.getReader();
                const dec = new TextDecoder();
                const until = Date.now() + 2000;
                while (Date.now() < until) {
                    const chunk = await Promise.race([
                        reader.read(), new Promise(ok => setTimeout(() => ok(null), until - Date.now()))]);
                    if (chunk === null || chunk.done) break;
                    body += dec.decode(chunk.value);
                }
                ctl.abort();
            } else {
                body = await r.text();
            }
            return {status: r.status, url: r.url, type, body};
        }""",
        [url, method, form],
    )
    return result


class AttackerSite:
    """A second origin on loopback serving pages that POST to the console on their own."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path.split("?")[0])
                data = (body or "not found").encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> AttackerSite:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def url(self, path: str, *, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def add_auto_post(self, path: str, action: str, fields: dict[str, str]) -> None:
        inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items())
        self.pages[path] = (
            "<!doctype html><html><body><h1>You won a GPU!</h1>"
            f'<form id="f" method="POST" action="{action}">{inputs}</form>'
            '<script>document.getElementById("f").submit();</script></body></html>'
        )
