"""`-o` as users write it (issue 30, item 6): before the subcommand (`gpufed -o json clusters`) and
after it (`gpufed clusters -o json`), on every command of the CLI, against `gpufed up`.

The commands come from click's own tree, so a command added later is walked without a change here;
one that needs arguments a bare call lacks gets a recipe below, and without one it is still called
bare, where its error must be JSON too. Each output is parsed with `json.loads` / `yaml.safe_load`
(streams, `watch` and `logs`, line by line / document by document). Errors under `-o json` are one
JSON object on stderr with a non-zero exit (README, "Output formats").
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner, Result

from datasync import open_store
from datasync.seaweed_process import SeaweedProcess
from datasync.store_config import S3StoreConfig
from federation.api.capacity_client import CapacityClient, plan_request
from federation.api.client import GpufedClient, wait_until_serving
from federation.api.datasets_client import DatasetsClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.main import cli
from federation.runtime.embedded import ENDPOINT_FILE, read_endpoint
from tests.e2e.harness import manifest, wait_for

pytestmark = pytest.mark.e2e

Path_ = tuple[str, ...]
TERMINAL = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}
# Commands whose output is a stream of records: JSON Lines, YAML documents.
STREAMS: set[Path_] = {("watch",), ("logs",), ("set", "watch")}


def command_paths(group: click.Group, at: Path_ = ()) -> Iterator[Path_]:
    """Every command a user can run, from click's tree: leaves, and groups that run on their own."""
    for name in sorted(group.commands):
        command = group.commands[name]
        if isinstance(command, click.Group):
            if command.invoke_without_command:
                yield (*at, name)
            yield from command_paths(command, (*at, name))
        else:
            yield (*at, name)


def command_at(path: Path_) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def offered(path: Path_) -> tuple[str, ...]:
    """The formats a command's `-o` takes after its name."""
    for param in command_at(path).params:
        if "-o" in getattr(param, "opts", ()) and isinstance(param.type, click.Choice):
            return tuple(str(c) for c in param.type.choices)
    raise AssertionError(f"{' '.join(path)} takes no -o after its name")


ALL = list(command_paths(cli))


@dataclass
class World:
    """What `gpufed up` serves, and the objects the recipes name."""

    state_dir: Path
    target: str
    tmp: Path
    job_id: str = ""
    job_file: Path = field(default_factory=Path)
    long_file: Path = field(default_factory=Path)
    tenant_file: Path = field(default_factory=Path)
    counter: Iterator[int] = field(default_factory=itertools.count)

    def client(self, user: str) -> GpufedClient:
        return GpufedClient(self.target, (self.state_dir / "tokens" / f"{user}.token").read_text().strip())

    def fresh(self) -> int:
        return next(self.counter)


def _put(world: World, store: str, objects: dict[str, bytes]) -> None:
    """Objects into an embedded store, with the keys gpufed up keeps in its state dir."""
    where = json.loads((world.state_dir / "stores.json").read_text())[store]
    secret = SeaweedProcess(Path(where["seaweed_dir"])).secret_access_key
    config = S3StoreConfig(
        where["bucket"], endpoint=where["endpoint"], region="us-east-1",
        access_key_id_env="K", secret_access_key_env="S",
    )  # fmt: skip

    async def run() -> None:
        client = open_store(store, config, env={"K": "gpufed", "S": secret})
        for path, data in objects.items():
            await client.put(path, data)
        await client.close()

    asyncio.run(run())


def _synced(world: World) -> str:
    """A copy of walk@v1 in s3-us-east-1 (to evict); returns its reference."""
    with world.client("alice") as alice:
        datasets = DatasetsClient(alice)
        datasets.sync("walk", store="s3-us-east-1", version="v1")
        wait_for(
            lambda: any(s.state == "done" for s in datasets.status("walk", store="s3-us-east-1").syncs),
            timeout_s=20,
        )
    return "walk@v1"


def _plan_args() -> list[str]:
    start = datetime.now(UTC) + timedelta(days=1)
    return [
        *("--cluster", "gcp-us-east4", "--gpu-type", "L4", "--gpus", "1"),
        *("--from", start.strftime("%Y-%m-%dT%H:%M"), "--to", (start + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")),
        *("--reason", "walk"),
    ]  # fmt: skip


def _cancellable(world: World) -> str:
    with world.client("alice") as alice:
        return alice.submit(world.long_file.read_text(), idempotency_key=f"walk-{world.fresh()}").job_id


def _ended_set(world: World) -> str:
    """A job set (an array of two walk jobs) whose jobs have ended: `set watch` on it ends at once."""
    with world.client("alice") as alice:
        alice.submit_set("walk-set", [world.job_file.read_text()], array="0-1")
        wait_for(lambda: alice.get_set("walk-set").done, timeout_s=30)
    return "walk-set"


def _running_set(world: World) -> str:
    """A fresh job set of a long job, to cancel."""
    name = f"long-set-{world.fresh()}"
    with world.client("alice") as alice:
        alice.submit_set(name, [world.long_file.read_text()])
    return name


def _approval(world: World) -> str:
    with world.client("admin") as admin:
        reply = admin.grant_approval(
            tenant="vision", user="", priority_class="urgent", duration_s=3600, reason="walk"
        )
    return reply.approval_id


def _token(world: World) -> str:
    with world.client("admin") as admin:
        return admin.issue_token("ivan", ttl_s=3600).info.token_id


def _scratch_tenant(world: World) -> str:
    name = f"scratch{world.fresh()}"
    with world.client("admin") as admin:
        admin.set_tenant(json.dumps({"name": name, "quotas": {"L4": {"cap": 1, "guaranteed": 0}}}))
    return name


def _plan(world: World) -> str:
    with world.client("infra") as infra:
        start = time.time() + 86400
        request = plan_request(
            kind="fixed", cluster="gcp-us-east4", gpu_type="L4", gpus=1, start_s=start,
            end_s=start + 7200, pool="", reason="walk",
        )  # fmt: skip
        return CapacityClient(infra).create_plan(request).plan_id


# What a command needs to succeed: (user, arguments). A command without a recipe is called bare.
Recipe = Callable[[World], tuple[str, list[str]]]
RECIPES: dict[Path_, Recipe] = {
    ("approval", "grant"): lambda w: (
        "admin",
        ["--tenant", "vision", "--class", "urgent", "--for", "1h", "--reason", "walk"],
    ),
    ("approval", "list"): lambda w: ("admin", []),
    ("approval", "revoke"): lambda w: ("admin", [_approval(w)]),
    ("audit",): lambda w: ("admin", ["--limit", "5"]),
    ("cancel",): lambda w: ("alice", [_cancellable(w)]),
    ("capacity", "plan", "cancel"): lambda w: ("infra", [_plan(w)]),
    ("capacity", "plan", "create"): lambda w: ("infra", _plan_args()),
    ("capacity", "plan", "list"): lambda w: ("infra", ["--all"]),
    ("capacity", "plan", "preview"): lambda w: ("infra", _plan_args()),
    ("capacity", "pools"): lambda w: ("infra", []),
    ("clusters",): lambda w: ("alice", []),
    ("dataset", "evict"): lambda w: ("alice", [_synced(w), "--store", "s3-us-east-1"]),
    ("dataset", "grant"): lambda w: ("admin", ["onprem-s3", "vision", "vision/"]),
    ("dataset", "grants"): lambda w: ("alice", []),
    ("dataset", "list"): lambda w: ("alice", []),
    ("dataset", "register"): lambda w: (
        "alice",
        [f"walk@r{w.fresh()}", "--store", "onprem-s3", "--prefix", "vision/walk/v1/"],
    ),
    ("dataset", "show"): lambda w: ("alice", ["walk"]),
    ("dataset", "status"): lambda w: ("alice", ["walk"]),
    ("dataset", "sync"): lambda w: ("alice", ["walk@v1", "--store", "gcs-us-east4", "--wait"]),
    ("dataset", "verify"): lambda w: ("alice", ["walk@v1", "--store", "onprem-s3", "--no-repair"]),
    ("describe",): lambda w: ("alice", [w.job_id]),
    ("set", "cancel"): lambda w: ("alice", [_running_set(w)]),
    ("set", "describe"): lambda w: ("alice", [_ended_set(w)]),
    ("set", "list"): lambda w: ("alice", []),
    ("set", "watch"): lambda w: ("alice", [_ended_set(w)]),
    ("explain",): lambda w: ("alice", [w.job_id]),
    ("get",): lambda w: ("alice", [w.job_id]),
    ("list",): lambda w: ("alice", []),
    ("logs",): lambda w: ("alice", [w.job_id]),
    ("queues",): lambda w: ("alice", []),
    ("report",): lambda w: ("finance", []),
    ("report", "focus"): lambda w: ("finance", []),
    ("report", "ledger"): lambda w: ("finance", []),
    ("submit",): lambda w: ("alice", ["-f", str(w.job_file)]),
    ("tenant", "delete"): lambda w: ("admin", [_scratch_tenant(w)]),
    ("tenant", "get"): lambda w: ("alice", ["vision"]),
    ("tenant", "list"): lambda w: ("admin", []),
    ("tenant", "set"): lambda w: ("admin", ["-f", str(w.tenant_file)]),
    ("token", "issue"): lambda w: ("admin", ["ivan", "--ttl", "1h"]),
    ("token", "list"): lambda w: ("admin", []),
    ("token", "revoke"): lambda w: ("admin", [_token(w)]),
    ("user", "list"): lambda w: ("admin", []),
    ("user", "set"): lambda w: ("admin", [f"walker{w.fresh()}", "--tenant", "vision"]),
    ("user", "set-priority"): lambda w: ("admin", ["ivan", "normal"]),
    ("watch",): lambda w: ("alice", [w.job_id]),
    ("whoami",): lambda w: ("alice", []),
}
# Commands that start servers or run for minutes; called with input they refuse, so that their
# errors are checked in both places. They also accept `-o` (test_every_command_parses_o_in_both_places),
# and `up -o json` itself starts this module's server.
REFUSED: dict[Path_, Recipe] = {
    ("up",): lambda w: ("admin", ["--config", str(w.tmp / "no-such-config.yaml")]),
    ("serve",): lambda w: ("admin", ["--port", "0"]),  # no --etcd
    ("replay",): lambda w: ("admin", ["--out", str(w.tmp / "replay")]),  # no --config
    # `demo` runs the whole walkthrough (its own `gpufed up`, about a minute): an unknown option.
    ("demo",): lambda w: ("admin", ["--no-such-option"]),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("walk")
    state_dir = tmp / "state"
    argv = [sys.executable, "-m", "federation", "--state-dir", str(state_dir), "up", "-o", "json"]
    proc = subprocess.Popen(
        [*argv, "--port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE,
        stderr=(tmp / "up.log").open("w"),
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        # `up -o json`: one JSON object on its first line once ready.
        ready = json.loads(proc.stdout.readline())
        assert set(ready["tokens"]) >= {"admin", "alice", "finance", "infra"}
        wait_for(lambda: (state_dir / ENDPOINT_FILE).exists(), timeout_s=10)
        target = read_endpoint(state_dir)["grpc"]
        assert ready["grpc"] == target
        wait_until_serving(target)
        w = World(state_dir=state_dir, target=target, tmp=tmp)
        w.job_file = tmp / "job.yaml"
        w.job_file.write_text(manifest("walk", tenant="vision", workers=1, duration="1s"))
        w.long_file = tmp / "long.yaml"
        w.long_file.write_text(manifest("long", tenant="vision", workers=1, duration="600s"))
        w.tenant_file = tmp / "tenant.yaml"
        w.tenant_file.write_text("name: walkers\nquotas: {L4: {cap: 1, guaranteed: 0}}\n")
        _put(w, "onprem-s3", {"vision/walk/v1/a.bin": b"a" * 3000, "vision/walk/v1/b.bin": b"b" * 2000})
        with w.client("alice") as alice:
            DatasetsClient(alice).register("walk", "v1", store="onprem-s3", prefix="vision/walk/v1/")
            w.job_id = alice.submit(w.job_file.read_text(), idempotency_key="walk-job").job_id
            wait_for(lambda: alice.get(w.job_id).phase in TERMINAL, timeout_s=20)
        yield w
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def gpufed(world: World, user: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--state-dir", str(world.state_dir), "--user", user, *args])


def _placed(fmt: str, where: str, path: Path_, args: list[str]) -> list[str]:
    return [*path, *args, "-o", fmt] if where == "after" else ["-o", fmt, *path, *args]


def parse(fmt: str, text: str, stream: bool) -> list[Any]:
    """Every record of an output; a structured output is mappings (or lists), never a bare string."""
    if fmt == "json":
        records = (
            [json.loads(line) for line in text.splitlines() if line.strip()] if stream else [json.loads(text)]
        )
    else:
        records = [d for d in yaml.safe_load_all(text) if d is not None] if stream else [yaml.safe_load(text)]
    for record in records:
        assert isinstance(record, dict | list), f"not a document: {text[:300]!r}"
    return records


def assert_json_error(result: Result, what: str) -> dict[str, Any]:
    assert result.exit_code != 0, f"{what}: exit 0\n{result.output}"
    assert result.stdout == "", f"{what}: stdout holds {result.stdout[:300]!r}"
    try:
        doc = json.loads(result.stderr)
    except ValueError:
        raise AssertionError(f"{what}: stderr is not one JSON object: {result.stderr[:500]!r}") from None
    assert set(doc) == {"error"}, doc
    assert doc["error"]["code"], doc
    assert doc["error"]["message"], doc
    assert doc["error"]["exit_code"] == result.exit_code, (doc, result.exit_code)
    return doc["error"]  # type: ignore[no-any-return]


def test_the_walk_reaches_every_command() -> None:
    # The walk is click's tree: if a command went missing from it, this module would pass vacuously.
    assert {("clusters",), ("token", "list"), ("report", "ledger"), ("capacity", "plan", "list")} <= set(ALL)
    assert len(ALL) >= 40


@pytest.mark.parametrize("path", ALL, ids=[" ".join(p) for p in ALL])
def test_every_command_parses_o_in_both_places(path: Path_) -> None:
    """`-o` after the name is the command's own option; before it, the top level's. Parsed only."""
    assert "json" in offered(path)
    top = cli.make_context("gpufed", ["-o", "yaml", *path])
    assert top.params["output"] == "yaml"
    parent = top
    for name in path[:-1]:
        parent = command_at((*parent.command_path.split()[1:], name)).make_context(
            name, [path[-1]], parent=parent, resilient_parsing=True
        )
    command_at(path).make_context(path[-1], ["-o", "json"], parent=parent, resilient_parsing=True)


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("fmt", ["json", "yaml", "table"])
@pytest.mark.parametrize("path", ALL, ids=[" ".join(p) for p in ALL])
def test_every_command_speaks_the_format_asked(world: World, path: Path_, fmt: str, where: str) -> None:
    if where == "after" and fmt not in offered(path):
        pytest.skip(f"{' '.join(path)} offers {offered(path)} after its name")
    if path in REFUSED:
        user, args = REFUSED[path](world)
        result = gpufed(world, user, *_placed(fmt, where, path, args))
        assert result.exit_code != 0, result.output
        if fmt == "json":
            assert_json_error(result, " ".join(path))
        elif fmt == "yaml":
            assert "error" in yaml.safe_load(result.stderr)
        return
    recipe = RECIPES.get(path)
    user, args = recipe(world) if recipe else ("admin", [])
    result = gpufed(world, user, *_placed(fmt, where, path, args))
    what = f"gpufed {' '.join(_placed(fmt, where, path, args))} as {user}"
    if recipe is None and result.exit_code != 0:
        # A command this module does not know yet: whatever it answers bare must be structured.
        if fmt == "json":
            assert_json_error(result, what)
        return
    assert result.exit_code == 0, f"{what}: exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
    if fmt != "table":
        records = parse(fmt, result.stdout, path in STREAMS)
        assert records, f"{what}: no records"


def test_json_errors_are_one_object_on_stderr_in_both_places(world: World) -> None:
    for path in ALL:
        for where in ("before", "after"):
            argv = _placed("json", where, path, ["--no-such-option"])
            error = assert_json_error(gpufed(world, "alice", *argv), " ".join(argv))
            assert error["code"] == "USAGE", error
            assert "--no-such-option" in error["message"], error
    # Errors from the server keep its status code.
    missing = assert_json_error(gpufed(world, "alice", "get", "no-such-job", "-o", "json"), "get")
    assert missing["code"] == "NOT_FOUND"
    assert "no-such-job" in missing["message"]
    denied = assert_json_error(gpufed(world, "alice", "-o", "json", "tenant", "delete", "vision"), "delete")
    assert denied["code"] == "PERMISSION_DENIED"
    # YAML errors the same way; table errors stay click's text.
    assert (
        yaml.safe_load(gpufed(world, "alice", "get", "x", "-o", "yaml").stderr)["error"]["code"]
        == "NOT_FOUND"
    )
    plain = gpufed(world, "alice", "get", "x")
    assert plain.exit_code == 1
    assert plain.stderr.startswith("Error: NOT_FOUND")


def test_tenant_get_gives_the_document_as_an_object_and_only_ones_own(world: World) -> None:
    result = gpufed(world, "alice", "tenant", "get", "vision", "-o", "json")
    assert result.exit_code == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["name"] == "vision"
    assert isinstance(got["document"], dict)
    assert got["document"]["quotas"]["A100"]["cap"] == 24
    # `tenant set` takes back what `tenant get` shows.
    listed = json.loads(gpufed(world, "admin", "-o", "json", "tenant", "list").stdout)
    assert all(isinstance(t["document"], dict) for t in listed["tenants"])
    # Another tenant's document stays out of a member's reach, in JSON as in a table.
    other = gpufed(world, "alice", "-o", "json", "tenant", "get", "nlp")
    error = assert_json_error(other, "tenant get nlp")
    assert "quotas" not in json.dumps(error)


def test_the_format_after_the_subcommand_wins(world: World) -> None:
    result = gpufed(world, "alice", "-o", "yaml", "whoami", "-o", "json")
    assert json.loads(result.stdout)["user"] == "alice"
    # `report`'s own -o passes a common format to its subcommands, and takes the top-level one.
    ledger = gpufed(world, "finance", "report", "-o", "json", "ledger")
    assert "intervals" in json.loads(ledger.stdout)
    report = gpufed(world, "finance", "-o", "json", "report")
    assert isinstance(json.loads(report.stdout), dict)
