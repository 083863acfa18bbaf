"""What `gpufed up --config X` suggests trying first (issue 30, item 10): a user X has, whose token
it just wrote, never the default's alice when X has no alice."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from federation.cli.first_steps import first_steps
from federation.runtime.config import load_config
from federation.runtime.embedded import default_config_path
from federation.store.records import Role, UserRecord
from placement.model import TenantId

pytestmark = pytest.mark.e2e


def _up_until_ready(state_dir: Path, config: Path, log: Path) -> list[str]:
    """Start `gpufed up --config`, read what it prints once ready, and stop it."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "federation", "--state-dir", str(state_dir)),
            *("up", "--config", str(config), "--port", "0", "--metrics-port", "0"),
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        # The ready message ends with the suggestions, after the token lines.
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(("try: ", "no user")):
                if line.startswith("try: ") and "whoami" in line:
                    lines.append(proc.stdout.readline().rstrip("\n"))
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert lines, f"gpufed up printed nothing; its log ends:\n{log.read_text()[-3000:]}"
    return lines


def test_up_with_a_config_without_alice_names_a_user_it_has(tmp_path: Path) -> None:
    text = default_config_path().read_text()
    config = tmp_path / "team.yaml"
    config.write_text("\n".join(line for line in text.splitlines() if "name: alice" not in line) + "\n")
    users = {u.name: u for u in load_config(config).users}
    assert "alice" not in users

    state_dir = tmp_path / "state"
    printed = _up_until_ready(state_dir, config, tmp_path / "up.log")
    tried = [line for line in printed if line.startswith("try: ")]
    assert tried, printed
    assert "alice" not in "\n".join(printed)
    named = re.search(r"--user (\S+)", tried[0])
    assert named is not None, tried
    user = named.group(1)
    assert user in users, (user, sorted(users))
    # Its token is one gpufed up wrote.
    assert (state_dir / "tokens" / f"{user}.token").exists()
    assert f"token for {user}: " in "\n".join(printed)
    # A member first, who submits jobs; the submit line names the member's own tenant.
    assert users[user].role is Role.MEMBER
    assert f"spec.tenant: {users[user].tenant}" in "\n".join(printed)


@pytest.mark.parametrize(
    ("users", "with_token", "expected"),
    [
        (
            [("alice", "vision", Role.MEMBER), ("admin", "platform", Role.ADMIN)],
            {"alice", "admin"},
            ["try: gpufed --user alice submit -f examples/resnet-vision.yaml"],
        ),
        (
            [("root", "platform", Role.ADMIN)],
            {"root"},
            ["try: gpufed --user root whoami"],
        ),
        (
            [("bo", "nlp", Role.MEMBER), ("ann", "nlp", Role.MEMBER)],
            {"bo", "ann"},
            [
                "try: gpufed --user ann whoami",
                "then: gpufed --user ann submit -f JOB.yaml (a TrainingJob with spec.tenant: nlp)",
            ],
        ),
        # A user whose token was revoked before this start gets no token file: not suggested.
        ([("alice", "vision", Role.MEMBER)], set(), None),
        ([], set(), None),
    ],
    ids=["default-alice", "only-an-admin", "members-of-another-tenant", "no-token", "no-users"],
)
def test_first_steps(
    users: list[tuple[str, str, Role]], with_token: set[str], expected: list[str] | None
) -> None:
    records = [UserRecord(name, TenantId(tenant), role) for name, tenant, role in users]
    lines = first_steps(records, with_token, config="x.yaml", example_here=True)
    if expected is None:
        (line,) = lines
        assert line.startswith("no user in x.yaml has a token")
        assert "token issue" in line
    else:
        assert lines == expected
