"""End to end, what a company needs to run gpufed: TLS (and mutual TLS) on the gRPC port, tokens an
admin issues and revokes, an audit trail of admin actions, and per-tenant submission limits.

Certificates are made for each test with the `openssl` command (a self-signed CA, a server
certificate for 127.0.0.1, a client certificate), as an operator would.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from federation.api.client import GpufedClient, TlsClient
from federation.runtime.etcd_process import EtcdProcess
from tests.e2e.harness import CONFIG, ServerProcess, manifest

pytestmark = pytest.mark.e2e


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    d = tmp_path / "pki"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=gpufed test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "alice")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "1", "-extfile", "san.cnf", "-out", f"{name}.pem", cwd=d)  # fmt: skip
    return d


def _limited_config(tmp_path: Path) -> Path:
    config = yaml.safe_load(CONFIG.read_text())
    for tenant in config["tenants"]:
        if tenant["name"] == "nlp":
            # A token back every 50 s: the refusals below come a few calls after the burst, and at
            # 0.2/s (a token every 5 s) a machine slow enough to spread them over 5 s let one through.
            tenant["submitRateLimit"] = {"perSecond": 0.02, "burst": 3}
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def mtls_server(etcd: EtcdProcess, pki: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    tls = TlsClient(
        ca_pem=(pki / "ca.pem").read_bytes(),
        cert_pem=(pki / "client.pem").read_bytes(),
        key_pem=(pki / "client.key").read_bytes(),
    )
    args = ("--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
            "--tls-client-ca", str(pki / "ca.pem"))  # fmt: skip
    process = ServerProcess(
        etcd.endpoint, tmp_path / "state", config=_limited_config(tmp_path), extra_args=args, tls=tls
    )
    process.start()
    yield process
    process.stop()


def _token(server: ServerProcess, user: str) -> str:
    return (server.state_dir / "tokens" / f"{user}.token").read_text().strip()


def test_mutual_tls_refuses_plaintext_and_clients_without_a_certificate(
    mtls_server: ServerProcess, pki: Path
) -> None:
    with mtls_server.client("alice") as alice:
        assert alice.whoami().user == "alice"
    token = _token(mtls_server, "alice")
    with (
        GpufedClient(mtls_server.target, token, timeout_s=3) as plain,
        pytest.raises(grpc.RpcError) as no_tls,
    ):
        plain.whoami()
    assert no_tls.value.code() == grpc.StatusCode.UNAVAILABLE
    server_only = TlsClient(ca_pem=(pki / "ca.pem").read_bytes())
    with (
        GpufedClient(mtls_server.target, token, timeout_s=3, tls=server_only) as anonymous,
        pytest.raises(grpc.RpcError) as no_cert,
    ):
        anonymous.whoami()
    assert no_cert.value.code() == grpc.StatusCode.UNAVAILABLE


def test_admins_issue_and_revoke_tokens_and_every_admin_action_is_audited(mtls_server: ServerProcess) -> None:
    with mtls_server.client("admin") as admin:
        admin.set_user("carol", tenant="vision", role="member")
        issued = admin.issue_token("carol")
        token_id = issued.info.token_id
        assert issued.token
        assert token_id
        assert token_id in {t.token_id for t in admin.list_tokens(user="carol").tokens}
        assert issued.token not in str(admin.list_tokens())  # only ids are ever shown again

    with GpufedClient(mtls_server.target, issued.token, tls=mtls_server.tls) as carol:
        assert (carol.whoami().user, carol.whoami().tenant) == ("carol", "vision")
        with pytest.raises(grpc.RpcError) as not_admin:
            carol.issue_token("carol")
        assert not_admin.value.code() == grpc.StatusCode.PERMISSION_DENIED

        with mtls_server.client("admin") as admin:
            admin.revoke_token(token_id)
        # Servers trust a resolved token for a few seconds at most.
        deadline = time.monotonic() + 15
        refused: grpc.StatusCode | None = None
        while refused is None and time.monotonic() < deadline:
            try:
                carol.whoami()
                time.sleep(0.5)
            except grpc.RpcError as error:
                refused = error.code()
        assert refused == grpc.StatusCode.UNAUTHENTICATED, "a revoked token kept working"

    with mtls_server.client("admin") as admin:
        trail = [(e.user, e.action, e.target) for e in admin.list_audit().events]
    assert trail[-3:] == [("admin", "user_set", "carol"), ("admin", "token_issued", "carol"),
                          ("admin", "token_revoked", "carol")]  # fmt: skip
    with mtls_server.client("alice") as alice, pytest.raises(grpc.RpcError) as member:
        alice.list_audit()
    assert member.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_tenant_over_its_submission_limit_is_told_to_slow_down_and_others_are_not(
    mtls_server: ServerProcess,
) -> None:
    with mtls_server.client("bob") as bob:
        accepted = [bob.submit(manifest(f"burst-{i}", gpu="B200")).job_id for i in range(3)]
        with pytest.raises(grpc.RpcError) as limited:
            bob.submit(manifest("one-too-many", gpu="B200"))
        assert limited.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "nlp submits faster than its limit of 0.02/s (burst 3)" in (limited.value.details() or "")
        assert len(bob.list_all()) == len(accepted) == 3, "nothing stored for the refused submission"
    with mtls_server.client("alice") as alice:
        for i in range(5):
            alice.submit(manifest(f"vision-{i}", gpu="B200"))


def test_a_retry_of_an_accepted_submission_is_answered_not_charged_nor_refused(
    mtls_server: ServerProcess,
) -> None:
    """A client whose reply was lost retries with the same idempotency key: it gets its job back,
    also when its tenant is at its limit, and the retry costs the tenant nothing."""
    with mtls_server.client("bob") as bob:
        first = bob.submit(manifest("keyed-0", gpu="B200"), idempotency_key="key-0")
        # Retries while under the limit create nothing and leave the burst as it was.
        for _ in range(3):
            again = bob.submit(manifest("keyed-0", gpu="B200"), idempotency_key="key-0")
            assert (again.job_id, again.created) == (first.job_id, False)
        for i in (1, 2):  # the rest of the burst of 3: only the first submission was charged
            assert bob.submit(manifest(f"keyed-{i}", gpu="B200"), idempotency_key=f"key-{i}").created
        with pytest.raises(grpc.RpcError) as limited:
            bob.submit(manifest("keyed-3", gpu="B200"), idempotency_key="key-3")
        assert limited.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # At the limit, a retry of an accepted key is still answered with its job.
        again = bob.submit(manifest("keyed-1", gpu="B200"), idempotency_key="key-1")
        assert again.created is False
        # The same key with another manifest is not a retry: the limit answers it.
        with pytest.raises(grpc.RpcError) as other:
            bob.submit(manifest("keyed-1", gpu="B200", workers=2), idempotency_key="key-1")
        assert other.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(bob.list_all()) == 3
