"""Issue 30, item 5, from the user's side: a token works the moment it exists, on every server that
shares the etcd, even one that refused it a moment before; a lookup etcd could not answer is
UNAVAILABLE and is never remembered as an invalid token; and every refusal is in the server's log
with its reason and the token's id, never the token.

Two `gpufed serve` on one etcd of the module's own (the outage test kills and restarts it).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from federation.api.client import GpufedClient
from federation.runtime.etcd_process import EtcdProcess
from tests.e2e.harness import CONFIG, ServerProcess, manifest, run_cli, wait_for

pytestmark = pytest.mark.e2e

# Each server's etcd calls give up after this: the outage is answered in about a second.
FAST_ETCD = ("--etcd-timeout-s", "1")


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    process = EtcdProcess(tmp_path_factory.mktemp("tokens-etcd") / "etcd")
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def servers(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ...]]:
    base = tmp_path_factory.mktemp("tokens")
    a = ServerProcess(etcd.endpoint, base / "a", identity="a", extra_args=FAST_ETCD)
    a.start()
    b = ServerProcess(etcd.endpoint, base / "b", identity="b", extra_args=FAST_ETCD)
    try:
        b.start()
        # The second server's bootstrap found the users there and wrote no token files: the users'
        # tokens are the first server's.
        for user in ("admin", "alice", "bob"):
            (b.state_dir / "tokens").mkdir(parents=True, exist_ok=True)
            (b.state_dir / "tokens" / f"{user}.token").write_text(
                (a.state_dir / "tokens" / f"{user}.token").read_text()
            )
        yield a, b
    finally:
        b.stop()
        a.stop()


def _cli(server: ServerProcess, user: str, *args: str) -> str:
    token = server.state_dir / "tokens" / f"{user}.token"
    done = run_cli("--server", server.target, "--token-file", str(token), *args, timeout_s=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _issue(server: ServerProcess, user: str, out: Path) -> str:
    """`gpufed token issue USER --out FILE`, as an admin runs it; the token it wrote."""
    _cli(server, "admin", "token", "issue", user, "--out", str(out))
    return out.read_text().strip()


def _whoami(server: ServerProcess, token: str) -> str:
    with GpufedClient(server.target, token) as client:
        return client.whoami().user


def _refused(server: ServerProcess, token: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        _whoami(server, token)
    return refused.value


def _token_id(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def test_an_issued_token_works_at_once_on_both_servers(
    servers: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    a, b = servers
    token = _issue(a, "alice", tmp_path / "alice-new.token")
    # On the server that issued it, and on the other, with no wait between.
    assert _whoami(b, token) == "alice"
    assert _whoami(a, token) == "alice"


def test_a_token_refused_as_unknown_works_at_once_when_it_comes_to_exist(
    servers: tuple[ServerProcess, ServerProcess], etcd: EtcdProcess, tmp_path: Path
) -> None:
    """A third server starts with a config that adds a user, whose token file is already there (a
    replica seeding users, or etcd restored without them): the token exists once its bootstrap has
    run. Server b refused it a moment before; it must not go on refusing it (it did for 30 s)."""
    _, b = servers
    token = "gpf_e2e-" + os.urandom(16).hex()
    config = tmp_path / "federation.yaml"
    config.write_text(
        CONFIG.read_text().replace("users:\n", "users:\n  - {name: dave, tenant: vision, role: member}\n", 1)
    )
    third = ServerProcess(etcd.endpoint, tmp_path / "c", config=config, identity="c", extra_args=FAST_ETCD)
    (third.state_dir / "tokens").mkdir(parents=True, mode=0o700)
    (third.state_dir / "tokens" / "dave.token").write_text(token + "\n")
    (third.state_dir / "tokens" / "dave.token").chmod(0o600)

    assert _refused(b, token).code() == grpc.StatusCode.UNAUTHENTICATED
    third.start()
    try:
        assert _whoami(b, token) == "dave"
    finally:
        third.stop()
    # The refusal is in b's log with its reason and the token's id; the token itself is not.
    log = b.current_log()
    assert "token_refused" in log
    assert "unknown_revoked_or_expired" in log
    assert _token_id(token) in log
    assert token not in log


def test_a_lookup_etcd_cannot_answer_is_unavailable_and_not_remembered_as_invalid(
    servers: tuple[ServerProcess, ServerProcess], etcd: EtcdProcess, tmp_path: Path
) -> None:
    a, b = servers
    fresh = _issue(a, "bob", tmp_path / "bob-new.token")  # never presented to b
    alice = b.client("alice")
    admin = b.client("admin")
    try:
        # Resolved just now: b trusts both tokens for a few seconds without etcd.
        assert alice.whoami().user == "alice"
        assert admin.whoami().user == "admin"
        etcd.kill()
        try:
            refused = _refused(b, fresh)
            assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused.details()
            # etcd's endpoint is infrastructure: a caller b could not even identify does not read it.
            host_port = etcd.endpoint.removeprefix("http://")
            assert host_port not in (refused.details() or "")
            assert "etcd at" not in (refused.details() or "")
            # A member's write while etcd is down: UNAVAILABLE, without the endpoint; an admin's
            # same call names it.
            with pytest.raises(grpc.RpcError) as member_error:
                alice.submit(manifest("during-outage"), idempotency_key="m-outage")
            assert member_error.value.code() == grpc.StatusCode.UNAVAILABLE
            assert host_port not in (member_error.value.details() or "")
            assert "unavailable" in (member_error.value.details() or "")
            with pytest.raises(grpc.RpcError) as admin_error:
                admin.submit(manifest("during-outage", tenant="vision"), idempotency_key="a-outage")
            assert admin_error.value.code() == grpc.StatusCode.UNAVAILABLE
            assert host_port in (admin_error.value.details() or "")
        finally:
            etcd.start()

        # Back: the token that could not be checked works at the first call etcd answers.
        def answered() -> str | None:
            try:
                return _whoami(b, fresh)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise AssertionError(f"refused once etcd was back: {error.details()}") from error
                return None

        assert wait_for(answered, timeout_s=15) == "bob"
    finally:
        alice.close()
        admin.close()
    log = b.current_log()
    assert "token_lookup_failed" in log
    assert "store_unavailable" in log
    assert fresh not in log
