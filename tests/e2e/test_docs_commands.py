"""The README's and docs/' commands, run as written against one `gpufed up` (issue 30: "The README's
commands and examples all run as written").

Every block marked `<!-- runnable -->` (tests/e2e/docs_blocks.py) is cut into its commands (a line
ending in a backslash goes on), and each command is one test, run in page order in a working
directory laid out as a checkout's (`.venv`, `examples/`), where `gpufed up` runs with its state in
`.gpufed`, as the README starts it. A command passes when it exits 0, or, when its comment names a
gRPC status (`# NOT_FOUND, ...`), when it fails with that status, as the page says it does. What is
changed before a command runs, and nothing else:

* `gpufed up &` is not run: the module's `gpufed up` is, on free ports (`--port 0 --metrics-port 0`)
  so that it never meets another test's server on 50051;
* the documented placeholders `<job-id>` (the job the page's latest `submit` printed) and
  `<plan-id>` (the plan its latest `capacity plan create` printed) are filled in;
* a command still running after FOLLOW_S with nothing on stderr (`watch`, `logs -f`: they follow
  until the job ends) is stopped and counts as run.

Exported variables and the working directory carry from one command to the next, as in a shell.
Commands that fail because of a finding another change is fixing are marked as expected to fail
(strict: the day they pass, the mark must go), with the issue's item number.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from federation.runtime.embedded import ENDPOINT_FILE
from tests.e2e.docs_blocks import PAGES, ROOT, Block, runnable_blocks
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.e2e

FOLLOW_S = 5.0
COMMAND_TIMEOUT_S = 25.0
_GRPC_CODES = ("NOT_FOUND", "PERMISSION_DENIED", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "UNAUTHENTICATED")
_JOB_ID = re.compile(r"\b([a-z0-9][a-z0-9-]*-[0-9a-f]{16}) submitted\b")
_PLAN_ID = re.compile(r"\b(plan-[0-9a-f]{8})\b")
_UP = re.compile(r"^\S*gpufed up\s*&")

# (page, the command's start) -> why it fails today. Strict: a command that passes fails its test.
EXPECTED_FAILURES: dict[tuple[str, str], str] = {}


@dataclass(frozen=True, slots=True)
class Command:
    block: Block
    text: str

    @property
    def expected_code(self) -> str | None:
        """The gRPC status the command's comment says it answers with, if any."""
        _, _, comment = self.text.partition(" # ")
        return next((code for code in _GRPC_CODES if comment.strip().startswith(code)), None)


def commands(block: Block) -> list[Command]:
    out: list[Command] = []
    pending = ""
    for line in block.text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        if whole and not whole.startswith("#") and not _UP.match(whole):
            out.append(Command(block, whole))
    return out


@dataclass(slots=True)
class Outcome:
    ok: bool
    detail: str


@dataclass(slots=True)
class PageRun:
    """One page's commands, run in order, each at most once, whichever test asks first."""

    work: Path
    commands: list[Command]
    outcomes: list[Outcome] = field(default_factory=list)
    job_id: str | None = None
    plan_id: str | None = None

    def outcome(self, index: int) -> Outcome:
        while len(self.outcomes) <= index:
            self.outcomes.append(self._run(self.commands[len(self.outcomes)]))
        return self.outcomes[index]

    def _filled(self, text: str) -> str:
        for placeholder, value in (("<job-id>", self.job_id), ("<plan-id>", self.plan_id)):
            if placeholder in text:
                assert value is not None, f"{placeholder} before anything on the page made one"
                text = text.replace(placeholder, value)
        return text

    def _run(self, command: Command) -> Outcome:
        env_file = self.work / ".shell-env"
        script = (
            f"[ -f {env_file} ] && . {env_file}\n"
            f"{self._filled(command.text)}\n"
            f"rc=$?; export -p > {env_file}; exit $rc\n"
        )
        proc = subprocess.Popen(
            ["bash", "-o", "pipefail", "-c", script],
            cwd=self.work,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        follows = " watch " in f" {command.text} " or " -f " in f" {command.text} "
        try:
            stdout, stderr = proc.communicate(timeout=FOLLOW_S if follows else COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            stdout, stderr = proc.communicate(timeout=10)
            if follows and not stderr.strip():
                return Outcome(True, f"still following after {FOLLOW_S} s:\n{stdout[-2000:]}")
            return Outcome(False, f"no end after {COMMAND_TIMEOUT_S} s\n{stdout[-2000:]}\n{stderr[-2000:]}")
        found = _JOB_ID.search(stdout)
        if found is not None:
            self.job_id = found.group(1)
        if "plan create" in command.text and (plan := _PLAN_ID.search(stdout)) is not None:
            self.plan_id = plan.group(1)
        shown = f"exit {proc.returncode}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
        expected = command.expected_code
        if expected is not None:
            return Outcome(
                proc.returncode != 0 and expected in stdout + stderr, f"expected {expected}; {shown}"
            )
        return Outcome(proc.returncode == 0, shown)


def _page_commands() -> list[tuple[Path, list[Command]]]:
    return [
        (page, [c for b in runnable_blocks(page) if b.kind == "gpufed" for c in commands(b)])
        for page in PAGES
    ]


PAGE_COMMANDS = [(page, cmds) for page, cmds in _page_commands() if cmds]


def _params() -> Iterator[object]:
    for page, cmds in PAGE_COMMANDS:
        name = str(page.relative_to(ROOT))
        for i, command in enumerate(cmds):
            marks = [
                pytest.mark.xfail(strict=True, reason=why)
                for (where, start), why in EXPECTED_FAILURES.items()
                if where == name and command.text.startswith(start)
            ]
            short = re.sub(r"\s+", " ", command.text.split(" # ")[0])[:70]
            yield pytest.param(name, i, id=f"{name}:{command.block.line}#{i} {short}", marks=marks)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A working directory laid out as a checkout's, with `gpufed up` running in it."""
    work = tmp_path_factory.mktemp("docs-commands")
    for name in (".venv", "examples"):
        (work / name).symlink_to(ROOT / name)
    log = (work / "up.log").open("w")
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "gpufed"), "up", "--port", "0", "--metrics-port", "0"],
        cwd=work,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_for(lambda: (work / ".gpufed" / ENDPOINT_FILE).exists() or proc.poll() is not None, timeout_s=60)
        assert proc.poll() is None, (work / "up.log").read_text()[-3000:]
        json.loads((work / ".gpufed" / ENDPOINT_FILE).read_text())
        yield work
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def runs(work: Path) -> dict[str, PageRun]:
    return {str(page.relative_to(ROOT)): PageRun(work, cmds) for page, cmds in PAGE_COMMANDS}


@pytest.mark.parametrize(("page", "index"), list(_params()))
def test_the_docs_command_runs_as_written(runs: dict[str, PageRun], page: str, index: int) -> None:
    run = runs[page]
    outcome = run.outcome(index)
    assert outcome.ok, f"{run.commands[index].block.where}: {run.commands[index].text}\n{outcome.detail}"


def test_the_pages_mark_their_command_blocks() -> None:
    """The README's own walk-through is marked runnable, not left out by accident."""
    readme = [c.text for c in dict(PAGE_COMMANDS).get(ROOT / "README.md", [])]
    assert any("submit -f examples/resnet-vision.yaml" in c for c in readme)
    assert any("dataset register" in c for c in readme)
    assert any("rclone copy" in c for c in readme), "putting data into the local stores"
