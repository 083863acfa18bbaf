"""A restart keeps every admin change: the config seeds an empty store and never undoes one.

`gpufed serve --bootstrap` (and `gpufed up`) apply the config file on every start. Each kind of
admin change is made through the API, the server is stopped and started again on the same etcd and
state dir with the same config, and the change must still be there: a revoked token stays refused,
a tenant keeps the rate limit and class limit an admin set, a moved user stays moved, a deleted
tenant stays deleted. What the config newly names is still created, and every write bootstrap
makes is on the audit trail, done by `bootstrap`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest

from federation.api.client import GpufedClient
from federation.runtime.etcd_process import EtcdProcess
from tests.e2e.harness import CONFIG, ServerProcess, manifest

pytestmark = pytest.mark.e2e

SCRATCH = "  - name: scratch\n"


def _config(tmp_path: Path, *extra_users: str) -> Path:
    """The e2e federation plus a tenant without users (so an admin may delete it)."""
    text = CONFIG.read_text().replace("  - name: nlp\n", "  - name: nlp\n" + SCRATCH)
    for line in extra_users:
        text = text.replace("clusters:\n", f"{line}\nclusters:\n", 1)
    path = tmp_path / "federation.yaml"
    path.write_text(text)
    return path


def _refused(client: GpufedClient) -> grpc.StatusCode | None:
    try:
        client.whoami()
    except grpc.RpcError as error:
        return error.code()
    return None


def _document(admin: GpufedClient, tenant: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads(admin.get_tenant(tenant).document)
    return doc


def test_every_kind_of_admin_change_survives_a_restart(etcd: EtcdProcess, tmp_path: Path) -> None:
    server = ServerProcess(etcd.endpoint, tmp_path / "state", config=_config(tmp_path))
    server.start()
    try:
        bob_token = (server.state_dir / "tokens" / "bob.token").read_text().strip()
        with server.client("admin") as admin:
            # 1. revoke bob's token (the one bootstrap issued from his token file)
            (bob_id,) = [t.token_id for t in admin.list_tokens(user="bob").tokens]
            admin.revoke_token(bob_id)
            # 2. a tenant's submission rate and highest priority class
            admin.set_tenant(
                "name: vision\nmaxPriorityClass: low\nsubmitRateLimit: {perSecond: 0.05, burst: 2}\n"
            )
            # 3. move a user to another tenant, and 4. change a user's class limit
            admin.set_user("alice", tenant="nlp", role="member")
            admin.set_user_priority("fin", "low")
            # 5. delete a tenant the config names
            admin.delete_tenant("scratch")
            # 6. a tenant, a user and a token the config does not know
            admin.set_tenant("name: robotics\nweight: 2\n")
            admin.set_user("dora", tenant="robotics", role="member")
            dora = admin.issue_token("dora").token
            before = _document(admin, "vision")
        with GpufedClient(server.target, bob_token) as bob:
            assert _wait_refused(bob) == grpc.StatusCode.UNAUTHENTICATED

        server.stop()
        server.start()

        with server.client("admin") as admin:
            assert _document(admin, "vision") == before
            assert before["maxPriorityClass"] == "low"
            assert before["submitRateLimit"] == {"perSecond": 0.05, "burst": 2}
            users = {u.name: u for u in admin.list_users().users}
            assert users["alice"].tenant == "nlp"
            assert users["fin"].max_priority_class == "low"
            assert "scratch" not in {t.name for t in admin.list_tenants().tenants}
            assert "robotics" in {t.name for t in admin.list_tenants().tenants}
            assert not admin.list_tokens(user="bob").tokens, "bootstrap re-issued a revoked token"
            trail = [(e.user, e.action, e.target) for e in admin.list_audit(limit=1000).events]
        with GpufedClient(server.target, bob_token) as bob:
            assert _refused(bob) == grpc.StatusCode.UNAUTHENTICATED, "a revoked token works after restart"
        with server.client("alice") as alice:
            assert alice.whoami().tenant == "nlp", "a moved user was moved back"
        with GpufedClient(server.target, dora) as dora_client:
            assert dora_client.whoami().tenant == "robotics"
        with server.client("admin") as admin:
            # The limits the admin set are the ones in force: class `low` at most, then a burst of 2
            # (a token back every 20 s, so a busy machine's slow calls cannot earn the third one).
            with pytest.raises(grpc.RpcError) as too_high:
                admin.submit(manifest("n", gpu="B200", tenant="vision"))
            assert too_high.value.code() == grpc.StatusCode.PERMISSION_DENIED
            low = "  priorityClassName: low\n"
            for i in range(2):
                admin.submit(manifest(f"r{i}", gpu="B200", tenant="vision", extra_spec=low))
            with pytest.raises(grpc.RpcError) as limited:
                admin.submit(manifest("r2", gpu="B200", tenant="vision", extra_spec=low))
            assert limited.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        # The first start seeded the store, on the record; the restart wrote nothing at all.
        seeded = [entry for entry in trail if entry[0] == "bootstrap"]
        assert ("bootstrap", "tenant_created", "scratch") in seeded
        assert ("bootstrap", "user_created", "bob") in seeded
        assert ("bootstrap", "token_issued", "bob") in seeded
        last_admin = max(i for i, entry in enumerate(trail) if entry[0] == "admin")
        assert not [e for e in trail[last_admin + 1 :] if e[0] == "bootstrap"], trail[last_admin:]
    finally:
        server.stop()


def test_a_user_the_config_newly_names_is_created_on_restart_and_audited(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    server = ServerProcess(etcd.endpoint, tmp_path / "state", config=_config(tmp_path))
    server.start()
    server.stop()
    server.config = _config(tmp_path, "  - {name: erin, tenant: vision, role: member}")
    server.start()
    try:
        with server.client("erin") as erin:
            assert (erin.whoami().user, erin.whoami().tenant) == ("erin", "vision")
        with server.client("admin") as admin:
            trail = [(e.user, e.action, e.target) for e in admin.list_audit(limit=1000).events]
        assert trail[-2:] == [("bootstrap", "user_created", "erin"), ("bootstrap", "token_issued", "erin")]
    finally:
        server.stop()


def _wait_refused(client: GpufedClient, timeout_s: float = 15.0) -> grpc.StatusCode | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = _refused(client)
        if code is not None:
            return code
        time.sleep(0.3)
    return None
