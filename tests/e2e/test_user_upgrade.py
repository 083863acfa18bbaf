"""A rolling upgrade from the previous build to this one, with jobs running (issue 31, "Upgrades").

The previous build is git history: commit PREVIOUS_BUILD's tree, taken with `git archive` into a
temporary dir, its gRPC stubs made there, run by this venv's interpreter with `PYTHONPATH` set to
it (checked: its `federation` is that tree's, and it has no schema versions). Two of its servers
share one etcd, one PostgreSQL history and one simulated cluster process, as the replicas of a
Deployment do; ended jobs move to the history at once (`retainInEtcd: 0s`), so both builds archive.
They write what a federation holds: jobs running, ended and waiting, ledger intervals, a token an
admin issued, an approval, a dataset with its manifest and a registration grant.

Then the roll, as `helm upgrade` does it, while a client keeps submitting: the standby is stopped
and this build's server started in its place; a job submitted through the new server (a version 1
record) is dispatched by the old leader, which ignores the field it does not know and drops it on
rewrite (the previous build reads a newer record, and writes it back in the previous form, which
this build reads); the old leader is stopped, the new server takes over, and a second new server
starts. A last job is written by this build alone.

Afterwards, judged by etcdctl, psql and the simulator's pods, not only by gpufed's reads: every
accepted job exists once (live in etcd or archived in SQL, never both), none ran twice, the jobs
running through the roll kept their one attempt, the ledger is whole (one interval per attempt that
ran, open in etcd or closed in SQL), and what the old build wrote is served by the new one to its
users (and only to them). A job record, then a tenant record, newer than this build is refused
with an error that names its key and says to upgrade, and is left as it is. Last, a rollback: the
previous build serves what this one wrote and takes its running jobs over without a second gang.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from federation.api.client import GpufedClient
from federation.api.datasets_client import DatasetsClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import PostgresProcess
from federation.runtime.server import TENANT_REFRESH_S
from federation.runtime.sim_process import SimProcess
from federation.store.schema_version import SCHEMA_FIELD, SCHEMA_VERSION
from tests.e2e.failover import FailoverSubmitter
from tests.e2e.harness import ServerProcess, manifest, run_cli, seed_history, wait_for
from tests.e2e.kube import PodRecorder, onprem_a100, write_config
from tests.etcdctl import etcdctl, keys

pytestmark = pytest.mark.e2e

# The build before schema versions (issue 31's starting point). At each release this moves to the
# release before it: the upgrade that users make is from the one to the other.
PREVIOUS_BUILD = "6790ee4"
# The newest history revision that build knows: a rollback takes the database back to it first.
PREVIOUS_HISTORY_REVISION = "0005"
REPO = Path(__file__).resolve().parents[2]
# The history database every server shares (PostgreSQL, as a Deployment of more than one server
# needs), named to the servers by this variable, never by the DSN itself.
DSN_ENV = "GPUFED_E2E_UPGRADE_DSN"
# A stopped server gives its lease back, so the next takes over at once; a lease that ran out under
# load (the default 5 s) would hand the mixed job below to the new server before the old leader ran it.
LEASE_TTL_S = 5
RUNNING, SUCCEEDED, QUEUED = (
    pb.JobPhase.JOB_PHASE_RUNNING,
    pb.JobPhase.JOB_PHASE_SUCCEEDED,
    pb.JobPhase.JOB_PHASE_QUEUED,
)
CLUSTERS: list[dict[str, Any]] = [onprem_a100(nodes=4)]
USERS = [
    {"name": "admin", "tenant": "platform", "role": "admin"},
    {"name": "fin", "tenant": "platform", "role": "finance"},
    {"name": "alice", "tenant": "vision"},
    {"name": "bob", "tenant": "nlp"},
]


def previous_tree(into: Path) -> Path:
    """The previous build's source, with the gRPC stubs `make proto` would make, compiled once."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", PREVIOUS_BUILD, "federation", "clusters", "datasync", "iac",
             "placement"],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
    except subprocess.CalledProcessError as e:
        pytest.fail(
            f"the previous build {PREVIOUS_BUILD} is not in this clone's history "
            f"(clone without --depth): {e.stderr.decode(errors='replace').strip()}"
        )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True, timeout=60)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--grpc_python_out=.",
         "federation/api/v1/gpufed.proto"],
        cwd=into, check=True, timeout=60,
    )  # fmt: skip
    # Compiled here once, not by both old servers at once as they start.
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "2", "federation", "clusters", "datasync", "iac",
         "placement"],
        cwd=into, check=True, timeout=120, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return into


def _old_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}


class OldServer(ServerProcess):
    """`python -m federation serve` of the previous build: a fresh interpreter (the test zygote has
    this build imported) in the old tree, which `-m` puts first on the path."""

    def __init__(self, tree: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tree = tree

    def start(self) -> None:
        self.starts += 1
        self.state_dir.mkdir(parents=True, exist_ok=True)
        seed_history(self.state_dir)
        self._close_log()
        argv = [
            sys.executable, "-m", "federation", "--state-dir", str(self.state_dir), "serve",
            "--etcd", self.etcd_endpoint, "--port", str(self.port), "--bootstrap", str(self.config),
            "--identity", f"{self.identity}-{self.starts}", *self.extra_args,
        ]  # fmt: skip
        self._log = log = self._log_path().open("wb")
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=_old_env(self.tree), cwd=self.tree
        )
        try:
            self._wait_serving(timeout_s=90)
        except Exception:
            self.stop()
            raise


def _docs(endpoint: str, prefix: str) -> dict[str, dict[str, Any]]:
    """Every JSON object under `prefix`, by key, as etcdctl reads it (the leader's identity, kept
    log tails and the like are not JSON objects, and are left out)."""
    out = json.loads(etcdctl(endpoint, "get", prefix, "--prefix", "-w", "json").stdout)
    docs = {}
    for kv in out.get("kvs", []):
        try:
            doc = json.loads(base64.b64decode(kv["value"]))
        except ValueError:
            continue
        if isinstance(doc, dict):
            docs[base64.b64decode(kv["key"]).decode()] = doc
    return docs


def _psql(dsn: str, query: str) -> list[str]:
    """psql's answer, one row a line: the history counted by PostgreSQL's own client."""
    done = subprocess.run(
        ["psql", "-v", "ON_ERROR_STOP=1", "-At", dsn, "-c", query],
        capture_output=True, text=True, check=True, timeout=20,
    )  # fmt: skip
    return [line for line in done.stdout.splitlines() if line]


def _token(servers: Sequence[ServerProcess], user: str) -> str:
    """From the state dir of whichever server bootstrapped the config (it wrote the token files)."""
    for server in servers:
        path = server.state_dir / "tokens" / f"{user}.token"
        if path.exists():
            return path.read_text().strip()
    raise AssertionError(f"no token file for {user}")


# An old build's server or a new one: _leader gives back the kind it was given.
Server = TypeVar("Server", bound=ServerProcess)


def _leader(servers: Sequence[Server]) -> Server:
    """The server whose latest process won the election (its log says so)."""
    found: Server = wait_for(
        lambda: next((s for s in servers if s.proc is not None and s.proc.poll() is None
                      and "leader_elected" in s.current_log()), None),
        30,
    )  # fmt: skip
    return found


@dataclass
class Rolled:
    etcd: EtcdProcess
    dsn: str
    old: list[OldServer]
    new: list[ServerProcess]
    recorder: PodRecorder
    old_docs: dict[str, dict[str, Any]]
    long_job: str
    short_job: str
    waiting_job: str
    mixed_job: str
    # The mixed job's record as the old leader left it, running.
    mixed_doc: dict[str, Any]
    after_job: str
    issued_token: str
    approval_id: str
    dataset_digest: str
    accepted: dict[str, str]
    lives: dict[tuple[str, int], list[Any]]
    tokens: dict[str, str]


@dataclass
class Previous:
    """Two servers of the previous build on their own etcd, simulator and PostgreSQL history."""

    etcd: EtcdProcess
    dsn: str
    where: list[str]
    tree: Path
    old: list[OldServer]
    new: list[ServerProcess]
    recorder: PodRecorder
    tokens: dict[str, str]
    leader: OldServer
    standby: OldServer


@dataclass
class Written:
    """What the previous build wrote, by id, and every JSON document in etcd after it did."""

    long_job: str
    short_job: str
    waiting_job: str
    issued_token: str
    approval_id: str
    dataset_digest: str
    old_docs: dict[str, dict[str, Any]]


# The scenario is four fixtures, each set up by the first test that needs it (in file order: the
# first four tests): the ground (the previous build's tree, etcd, the simulator), the previous build's
# servers, what they write, and the roll. As one fixture it took 50 s of a loaded full run's setup,
# and as three 37 s, over the 30 s a test may take.
@dataclass
class Ground:
    root: Path
    dsn: str
    where: list[str]
    tree: Path
    etcd: EtcdProcess
    sims: SimProcess
    config: Path


@pytest.fixture(scope="module")
def ground(tmp_path_factory: pytest.TempPathFactory, postgres_process: PostgresProcess) -> Iterator[Ground]:
    root = tmp_path_factory.mktemp("upgrade")
    dsn = postgres_process.create_database(f"upgrade_{os.getpid()}")
    os.environ[DSN_ENV] = dsn
    tree = previous_tree(Path(tempfile.mkdtemp(prefix="gpufed-previous-", dir=root)))
    # The old servers really run the old code: its package, without schema versions.
    where = subprocess.run(
        [sys.executable, "-c", "import federation, importlib.util as u; "
         "print(federation.__file__, u.find_spec('federation.store.schema_version'))"],
        env=_old_env(tree), cwd=tree, capture_output=True, text=True, check=True, timeout=30,
    ).stdout.split()  # fmt: skip
    assert where == [str(tree / "federation" / "__init__.py"), "None"], where

    (root / "lab" / "data" / "vision").mkdir(parents=True)
    (root / "lab" / "data" / "vision" / "part-0.bin").write_bytes(b"pixels" * 1000)
    etcd = EtcdProcess(root / "etcd")
    sims = SimProcess(root / "sim", CLUSTERS)
    try:
        etcd.start()
        sims.start()
        config = write_config(
            root / "federation.yaml",
            sims,
            CLUSTERS,
            grace_s=30,
            tenants=[{"name": "platform"}, {"name": "vision"}, {"name": "nlp"}],
            users=USERS,
            objectStores={"lab": {"kind": "local", "root": str(root / "lab"),
                                  "datasetPrefixes": {"*": ["data/{tenant}/"]}}},
            # Ended jobs move to PostgreSQL at the archiver's next pass: both builds archive.
            history={"dsnEnv": DSN_ENV, "retainInEtcd": "0s"},
        )  # fmt: skip
        yield Ground(root, dsn, where, tree, etcd, sims, config)
    finally:
        sims.stop()
        etcd.stop()
        os.environ.pop(DSN_ENV, None)
        shutil.rmtree(tree, ignore_errors=True)


@pytest.fixture(scope="module")
def previous(ground: Ground) -> Iterator[Previous]:
    root, dsn, where, tree, etcd, sims, config = (
        ground.root, ground.dsn, ground.where, ground.tree, ground.etcd, ground.sims, ground.config
    )  # fmt: skip
    lease = ("--lease-ttl-s", str(LEASE_TTL_S))
    old = [
        OldServer(
            tree, etcd.endpoint, root / f"old-{n}", config=config, identity=f"old-{n}", extra_args=lease
        )
        for n in "ab"
    ]
    new = [
        ServerProcess(etcd.endpoint, root / f"new-{n}", config=config, identity=f"new-{n}", extra_args=lease)
        for n in "ab"
    ]
    recorder = PodRecorder()
    recorder.follow(sims, "onprem")
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(OldServer.start, old))
        tokens = {u["name"]: _token(old, u["name"]) for u in USERS}
        # The new servers' state dirs get the bootstrap's token files, as a Deployment's pods share
        # one Secret: the config's users exist already, so no new server writes them again.
        for server in new:
            (server.state_dir / "tokens").mkdir(parents=True)
            for user, token in tokens.items():
                (server.state_dir / "tokens" / f"{user}.token").write_text(token + "\n")
        leader = _leader(old)
        standby = next(s for s in old if s is not leader)
        yield Previous(etcd, dsn, where, tree, old, new, recorder, tokens, leader, standby)
    finally:
        recorder.stop()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(ServerProcess.stop, [*old, *new]))


@pytest.fixture(scope="module")
def written(previous: Previous) -> Written:
    etcd, leader, standby, tokens = previous.etcd, previous.leader, previous.standby, previous.tokens

    # What the previous build writes: jobs running, ended and waiting, a token, an approval,
    # a dataset, a grant, ledger intervals.
    with (
        GpufedClient(leader.target, tokens["alice"]) as alice,
        GpufedClient(leader.target, tokens["bob"]) as bob,
        GpufedClient(standby.target, tokens["admin"]) as admin,
    ):
        long_job = alice.submit(manifest("long", duration="1h")).job_id
        # Over a second: its interval has a length at the pods' whole seconds, and a cost.
        short_job = bob.submit(manifest("short", duration="1500ms")).job_id
        waiting_job = bob.submit(manifest("waits", gpu="B200")).job_id
        issued = admin.issue_token("alice").token
        approval = admin.grant_approval(
            tenant="vision", priority_class="urgent", duration_s=86_400, reason="the paper"
        ).approval_id
        datasets = DatasetsClient(admin)
        digest = datasets.register(
            "imagenet", "v1", store="lab", prefix="data/vision/", tenant="vision"
        ).manifest_digest
        datasets.set_grant(store="lab", tenant="nlp", prefixes=["data/nlp/"])
        wait_for(lambda: alice.get(long_job).phase == RUNNING, timeout_s=20)
        wait_for(lambda: bob.get(short_job).phase == SUCCEEDED, timeout_s=20)
    old_docs = _docs(etcd.endpoint, "/gpufed/")

    return Written(long_job, short_job, waiting_job, issued, approval, digest, old_docs)


@pytest.fixture(scope="module")
def rolled(previous: Previous, written: Written) -> Iterator[Rolled]:
    etcd, dsn, old, new, recorder, tokens = (
        previous.etcd, previous.dsn, previous.old, previous.new, previous.recorder, previous.tokens
    )  # fmt: skip
    leader, standby = previous.leader, previous.standby
    long_job, short_job, waiting_job = written.long_job, written.short_job, written.waiting_job
    submitter: FailoverSubmitter | None = None
    try:
        submitter = FailoverSubmitter(
            lambda: [s.target for s in (*old, *new)],
            lambda: [tokens["alice"]],
            prefix="roll-",
            duration="250ms",
            pace_s=0.1,
        )
        submitter.thread.start()
        # 1. The standby goes; this build starts in its place, beside the old leader.
        standby.stop()
        new[0].start()
        # A record this build writes, dispatched and rewritten by the old leader; it runs on.
        with GpufedClient(new[0].target, tokens["bob"]) as bob:
            mixed = bob.submit(manifest("mixed", duration="1h")).job_id
            wait_for(lambda: bob.get(mixed).phase == RUNNING, timeout_s=20)
        assert "leader_elected" not in new[0].current_log(), "the old leader ran the mixed job"
        mixed_doc = _docs(etcd.endpoint, f"/gpufed/jobs/{mixed}")[f"/gpufed/jobs/{mixed}"]
        # 2. The old leader goes; the new server takes over. 3. The second new server starts.
        leader.stop()
        wait_for(lambda: "leader_elected" in new[0].current_log(), timeout_s=20)
        new[1].start()
        wait_for(lambda: len(submitter.accepted) >= 20, timeout_s=20)
        submitter.stop.set()
        submitter.thread.join(timeout=30)
        accepted = dict(submitter.accepted)

        # A job only this build has written, running.
        with GpufedClient(new[1].target, tokens["alice"]) as alice:
            after = alice.submit(manifest("after", duration="1h")).job_id
            wait_for(lambda: alice.get(after).phase == RUNNING, timeout_s=20)
        # Every ended job archived: etcd holds the live ones only.
        live = {f"/gpufed/jobs/{j}" for j in (long_job, waiting_job, mixed, after)}
        wait_for(lambda: set(keys(etcd.endpoint, "/gpufed/jobs/")) == live, timeout_s=30)
        wait_for(
            lambda: all(
                p.end_s is not None
                for p in recorder.pods.values()
                if p.start_s and p.job_id not in (long_job, mixed, after)
            ),
            timeout_s=15,
        )
        yield Rolled(
            etcd, dsn, old, new, recorder, written.old_docs, long_job, short_job, waiting_job, mixed, mixed_doc,
            after, written.issued_token, written.approval_id, written.dataset_digest, accepted,
            recorder.lives_by_job(), tokens,
        )  # fmt: skip
    finally:
        if submitter is not None:
            submitter.stop.set()


def test_the_previous_build_runs_from_its_own_tree(ground: Ground) -> None:
    # Its package, from its own tree, without schema versions.
    assert ground.where == [str(ground.tree / "federation" / "__init__.py"), "None"], ground.where
    assert not (ground.tree / "federation" / "store" / "schema_version.py").exists()


def test_two_servers_of_the_previous_build_start_and_one_leads(previous: Previous) -> None:
    assert "leader_elected" in previous.leader.current_log()
    assert "leader_elected" not in previous.standby.current_log()
    assert all(s.proc is not None and s.proc.poll() is None for s in previous.old)


def test_the_previous_build_writes_its_documents_without_a_schema_version(written: Written) -> None:
    docs = written.old_docs
    for prefix in ("/gpufed/jobs/", "/gpufed/ledger/", "/gpufed/approvals/", "/gpufed/datasets/"):
        assert any(k.startswith(prefix) for k in docs), prefix
    assert not [k for k, d in docs.items() if SCHEMA_FIELD in d]


def test_every_job_exists_once_none_ran_twice_and_the_running_ones_kept_their_attempt(rolled: Rolled) -> None:
    # Live in etcd (etcdctl) or archived in the history (psql), never both, never twice.
    live = {d["job_id"]: d for d in _docs(rolled.etcd.endpoint, "/gpufed/jobs/").values()}
    archived = _psql(rolled.dsn, "SELECT job_id FROM history_jobs")
    assert len(archived) == len(set(archived))
    assert not set(live) & set(archived)
    running = {rolled.long_job, rolled.mixed_job, rolled.after_job}
    fixed = {*running, rolled.short_job, rolled.waiting_job}
    assert set(rolled.accepted.values()) | fixed == set(live) | set(archived), "a job was lost or made"
    assert set(live) == {*running, rolled.waiting_job}
    for job_id in running:
        assert (live[job_id]["phase"], live[job_id]["attempt"]) == ("RUNNING", 1), job_id
    assert live[rolled.waiting_job]["phase"] == "QUEUED"
    # The simulator's pods: no job's gang was made twice, and no job ran two attempts.
    ran = {key for key, pods in rolled.lives.items() if any(p.start_s for p in pods)}
    assert all(attempt == 1 for _, attempt in ran), sorted(ran)
    assert {j for j, _ in ran} == fixed - {rolled.waiting_job} | set(rolled.accepted.values())
    with GpufedClient(rolled.new[0].target, rolled.tokens["alice"]) as alice:
        assert alice.get(rolled.long_job).phase == RUNNING


def test_the_ledger_is_whole_one_interval_per_attempt_that_ran(rolled: Rolled) -> None:
    # Open intervals in etcd, closed ones archived with their jobs: each attempt in one place, once.
    live = {(d["job_id"], d["attempt"]): d for d in _docs(rolled.etcd.endpoint, "/gpufed/ledger/").values()}
    rows = _psql(
        rolled.dsn, "SELECT job_id || ' ' || attempt || ' ' || (end_s > start_s) FROM history_intervals"
    )
    archived = {(job_id, int(attempt)) for job_id, attempt, _ in (row.split() for row in rows)}
    # Pods' times have whole seconds, so a short attempt may start and end in one second.
    instant = {
        (job_id, int(attempt))
        for job_id, attempt, longer in (row.split() for row in rows)
        if longer == "false"
    }
    assert len(rows) == len(archived)
    assert not set(live) & archived
    ran = {key for key, pods in rolled.lives.items() if any(p.start_s for p in pods)}
    assert set(live) | archived == ran, (set(live) | archived) ^ ran
    assert set(live) == {(j, 1) for j in (rolled.long_job, rolled.mixed_job, rolled.after_job)}
    assert all(d["end_s"] is None for d in live.values())
    assert (rolled.short_job, 1) in archived
    # Finance reads the same ledger, but for the archived intervals of no length: the history's
    # listing finds intervals through their rows per UTC day, and those have none (a gap of the
    # history store, in both builds; not an upgrade's doing).
    with GpufedClient(rolled.new[1].target, rolled.tokens["fin"]) as fin:
        served = {(r.job_id, r.attempt) for r in fin.ledger(start_s=0).intervals}
    assert served == ran - instant


def test_what_the_old_build_wrote_is_served_by_the_new_one_to_its_users_only(rolled: Rolled) -> None:
    target = rolled.new[1].target
    # The token the old build issued authenticates; the approval and the dataset are there.
    with GpufedClient(target, rolled.issued_token) as alice:
        assert alice.get(rolled.long_job).phase == RUNNING
    with GpufedClient(target, rolled.tokens["admin"]) as admin:
        approvals = {a.approval_id for a in admin.list_approvals(tenant="vision").approvals}
        assert rolled.approval_id in approvals
    with GpufedClient(target, rolled.tokens["alice"]) as alice:
        version = DatasetsClient(alice).get("imagenet")
        assert [v.manifest_digest for v in version.versions] == [rolled.dataset_digest]
    # The job the old build ran to its end, with the cost of the interval it closed.
    with GpufedClient(target, rolled.tokens["bob"]) as bob:
        short = bob.get(rolled.short_job)
        assert short.phase == SUCCEEDED
        assert Decimal(short.cost_usd) > 0
    # Another tenant sees neither the job nor the dataset.
    with GpufedClient(target, rolled.tokens["bob"]) as bob:
        for call in (lambda: bob.get(rolled.long_job), lambda: DatasetsClient(bob).get("vision/imagenet")):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)
        assert rolled.long_job not in {j.job_id for j in bob.list_all()}


def test_versions_in_etcd_old_records_stay_version_0_new_writes_carry_the_version(rolled: Rolled) -> None:
    docs = _docs(rolled.etcd.endpoint, "/gpufed/")
    # Untouched since the old build wrote them: no field, read as version 0.
    for prefix in ("/gpufed/approvals/", "/gpufed/datasets/", "/gpufed/manifests/"):
        found = [k for k in docs if k.startswith(prefix)]
        assert found, prefix
        assert all(SCHEMA_FIELD not in docs[k] for k in found), prefix
    # Written by this build after the roll: the job submitted last, and its interval.
    assert docs[f"/gpufed/jobs/{rolled.after_job}"][SCHEMA_FIELD] == SCHEMA_VERSION
    assert docs[f"/gpufed/ledger/{rolled.after_job}/000001"][SCHEMA_FIELD] == SCHEMA_VERSION
    # The job this build wrote and the old leader dispatched: the old build kept what it knew and
    # dropped the field, so it reads as version 0, the same form.
    assert rolled.mixed_doc["phase"] == "RUNNING"
    assert SCHEMA_FIELD not in rolled.mixed_doc


def test_a_record_newer_than_this_build_is_refused_naming_its_key_and_left_alone(rolled: Rolled) -> None:
    key = f"/gpufed/jobs/{rolled.waiting_job}"
    newer = {**_docs(rolled.etcd.endpoint, key)[key], SCHEMA_FIELD: SCHEMA_VERSION + 1, "later": {"x": 1}}
    raw = json.dumps(newer)
    etcdctl(rolled.etcd.endpoint, "put", key, raw)
    target = rolled.new[1].target

    def refused(token: str) -> str:
        with GpufedClient(target, token) as client:
            try:
                client.get(rolled.waiting_job)
            except grpc.RpcError as e:
                return (e.details() or "") if e.code() == grpc.StatusCode.FAILED_PRECONDITION else ""
        return ""

    # The admin reads the key and the version; the job's owner, that an admin must upgrade.
    details = wait_for(lambda: refused(rolled.tokens["admin"]), timeout_s=10)
    assert f"{key} has schema version {SCHEMA_VERSION + 1}" in details
    assert "upgrade gpufed" in details
    owners = refused(rolled.tokens["bob"])
    assert "an admin must upgrade gpufed" in owners
    assert key not in owners
    # Another tenant is answered as for a job that is not there.
    answers = []
    with GpufedClient(target, rolled.tokens["alice"]) as alice:
        for job_id in (rolled.waiting_job, "made-up-job"):
            with pytest.raises(grpc.RpcError) as e:
                alice.get(job_id)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            answers.append((e.value.details() or "").replace(job_id, "<id>"))
    assert answers[0] == answers[1]
    # Neither server rewrote it, both still serve, and the job left their listings.
    assert etcdctl(rolled.etcd.endpoint, "get", key, "--print-value-only").stdout.strip() == raw
    for server in rolled.new:
        assert server.proc is not None
        assert server.proc.poll() is None
        with GpufedClient(server.target, rolled.tokens["alice"]) as alice:
            assert alice.get(rolled.long_job).phase == RUNNING
        # Each server learns of the record from its own watch; only the target's was waited for.
        with GpufedClient(server.target, rolled.tokens["bob"]) as bob:
            wait_for(lambda c=bob: rolled.waiting_job not in {j.job_id for j in c.list_all()}, timeout_s=10)
        wait_for(lambda s=server: "stored_record_refused" in s.current_log(), timeout_s=10)
    # As an operator would after upgrading: the record back in a form this build reads.
    original = {k: v for k, v in newer.items() if k not in (SCHEMA_FIELD, "later")}
    etcdctl(rolled.etcd.endpoint, "put", key, json.dumps(original))
    with GpufedClient(target, rolled.tokens["bob"]) as bob:
        wait_for(lambda: rolled.waiting_job in {j.job_id for j in bob.list_all()}, timeout_s=10)


def test_a_newer_configuration_record_refuses_calls_and_a_start_and_is_left_alone(
    rolled: Rolled, tmp_path: Path
) -> None:
    """A tenant record (configuration every cycle and submission reads) newer than this build: the
    running servers refuse what needs it and keep running; a server starting on it exits with the
    error instead of serving half a federation."""
    key = "/gpufed/tenants/nlp"
    held = etcdctl(rolled.etcd.endpoint, "get", key, "--print-value-only").stdout.strip()
    raw = json.dumps({**json.loads(held), SCHEMA_FIELD: SCHEMA_VERSION + 1})
    etcdctl(rolled.etcd.endpoint, "put", key, raw)
    try:
        with GpufedClient(rolled.new[0].target, rolled.tokens["bob"]) as bob:
            # A server re-reads its tenants for submissions at most every TENANT_REFRESH_S: until it
            # has, it rightly takes a submission on the record it read before. A manifest that is no
            # manifest tells the two apart and can never make a job (refused as invalid before the
            # re-read, for the record after it). Submitting at once, the job was made in one loaded
            # run, and stayed for the next test, which then found a job the previous build did not.
            def reread() -> bool:
                with pytest.raises(grpc.RpcError) as probe:
                    bob.submit("not a manifest")
                return probe.value.code() == grpc.StatusCode.FAILED_PRECONDITION

            wait_for(reread, timeout_s=TENANT_REFRESH_S + 30)
            with pytest.raises(grpc.RpcError) as refused:
                bob.submit(manifest("refused"))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "an admin must upgrade gpufed" in (refused.value.details() or "")
        third = ServerProcess(
            rolled.etcd.endpoint, tmp_path / "third", config=rolled.new[0].config, identity="third"
        )
        with pytest.raises(
            RuntimeError, match=rf"{key} has schema version {SCHEMA_VERSION + 1}.*upgrade gpufed"
        ):
            third.start()
        assert all(s.proc is not None and s.proc.poll() is None for s in rolled.new)
        assert etcdctl(rolled.etcd.endpoint, "get", key, "--print-value-only").stdout.strip() == raw
    finally:
        etcdctl(rolled.etcd.endpoint, "put", key, held)


def test_rolling_back_to_the_previous_build_serves_what_this_build_wrote(rolled: Rolled) -> None:
    """`helm rollback` after this build has written, its history migrations undone first with
    `gpufed admin history-downgrade`: the previous build reads version 1 documents (it ignores the
    field), so it serves them, archived jobs included; nothing runs twice."""
    with GpufedClient(rolled.new[0].target, rolled.tokens["admin"]) as admin:
        issued = admin.issue_token("bob").token
        approval = admin.grant_approval(
            tenant="nlp", priority_class="urgent", duration_s=3600, reason="the rollback"
        ).approval_id
        DatasetsClient(admin).register("imagenet", "v2", store="lab", prefix="data/vision/", tenant="vision")
        DatasetsClient(admin).set_grant(store="lab", tenant="nlp", prefixes=["data/nlp/", "data/shared/"])
    docs = _docs(rolled.etcd.endpoint, "/gpufed/")
    for prefix in ("/gpufed/tokens/", "/gpufed/approvals/", "/gpufed/datasets/", "/gpufed/dataset-grants/"):
        assert any(k.startswith(prefix) and d.get(SCHEMA_FIELD) == SCHEMA_VERSION for k, d in docs.items()), (
            prefix
        )
    jobs = {d["job_id"] for k, d in docs.items() if k.startswith("/gpufed/jobs/")}
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(ServerProcess.stop, rolled.new))
    # This build migrated the history past what the previous one knows (it would stop at start,
    # Alembic unable to locate the newer revision): its CLI takes the schema back first, as
    # docs/deploy.md's "Rolling back" says. psql is the judge of where the schema is.
    down = run_cli(
        "admin", "history-downgrade", "--to", PREVIOUS_HISTORY_REVISION, "--history-dsn", rolled.dsn
    )
    assert down.returncode == 0, down.stderr
    assert _psql(rolled.dsn, "SELECT version_num FROM alembic_version") == [PREVIOUS_HISTORY_REVISION]
    back = rolled.old[0]
    back.start()
    with GpufedClient(back.target, issued) as bob:
        assert bob.get(rolled.waiting_job).phase == QUEUED
        assert bob.get(rolled.short_job).phase == SUCCEEDED  # from the history
    with GpufedClient(back.target, rolled.tokens["admin"]) as admin:
        assert {approval, rolled.approval_id} <= {a.approval_id for a in admin.list_approvals().approvals}
        assert {j.job_id for j in admin.list_all()} == jobs
    with GpufedClient(back.target, rolled.tokens["alice"]) as alice:
        assert [v.version for v in DatasetsClient(alice).get("imagenet").versions] == ["v1", "v2"]
        wait_for(lambda: "leader_elected" in back.current_log(), timeout_s=15)
        long_job = alice.get(rolled.long_job)
        assert long_job.phase == RUNNING
    # The old leader took the running jobs over as they were: no second gang on the cluster.
    lives = rolled.recorder.lives_by_job()
    for job_id in (rolled.long_job, rolled.mixed_job, rolled.after_job):
        assert {a for (j, a) in lives if j == job_id} == {1}, job_id
