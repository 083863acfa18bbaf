"""Issue 30, item 9, from the user's side: while the history database (a real PostgreSQL, which the
test starts and then stops) is down, every call a member or the finance role makes that reaches it
fails UNAVAILABLE without the database's host, port, DSN or the driver's words; an admin's same call
gets the detail, and the server's log keeps it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from federation.api.client import GpufedClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import PostgresProcess, PostgresUnavailable
from tests.e2e.harness import CONFIG, ServerProcess

pytestmark = pytest.mark.e2e

DSN_ENV = "GPUFED_E2E_LEAK_HISTORY_DSN"
NO_SUCH_JOB = "nosuch-0badf00d"


@pytest.fixture(scope="module")
def down(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, PostgresProcess, str]]:
    """A server whose history is a PostgreSQL of this module's own, stopped once the server serves."""
    try:
        postgres = PostgresProcess()
    except PostgresUnavailable as error:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs a real PostgreSQL: {error}")
        pytest.skip(str(error))
    base = tmp_path_factory.mktemp("leaks")
    etcd = EtcdProcess(base / "etcd")
    etcd.start()
    postgres.start()
    config = base / "federation.yaml"
    config.write_text(CONFIG.read_text() + f"history:\n  dsnEnv: {DSN_ENV}\n")
    server = ServerProcess(etcd.endpoint, base / "state", config=config)
    try:
        with pytest.MonkeyPatch.context() as env:
            # The server process inherits the variable; the config names it, never the DSN.
            dsn = postgres.create_database("history_leaks")
            env.setenv(DSN_ENV, dsn)
            server.start()
        postgres.stop()
        yield server, postgres, dsn
    finally:
        server.stop()
        postgres.stop()
        etcd.stop()


# Every call that reaches the history store, as a member (or finance, for the reports) makes it.
CALLS: dict[str, tuple[str, Callable[[GpufedClient], Any]]] = {
    "GetJob": ("alice", lambda c: c.get(NO_SUCH_JOB)),
    "ListJobs --archived": ("alice", lambda c: c.list_page(include_archived=True)),
    "DescribeJob": ("alice", lambda c: c.describe(NO_SUCH_JOB)),
    "StreamLogs": ("alice", lambda c: list(c.logs(pb.StreamLogsRequest(job_id=NO_SUCH_JOB)))),
    "GetReport (member)": ("alice", lambda c: c.report()),
    "GetReport (finance)": ("fin", lambda c: c.report()),
    "ListLedger": ("alice", lambda c: c.ledger(start_s=0)),
    "ExportFocus": ("fin", lambda c: c.export_focus(start_s=0)),
}
# The calls an admin may make, whose answer names the database.
ADMIN_CALLS: dict[str, Callable[[GpufedClient], Any]] = {
    "GetJob": lambda c: c.get(NO_SUCH_JOB),
    "ListJobs --archived": lambda c: c.list_page(include_archived=True),
    "DescribeJob": lambda c: c.describe(NO_SUCH_JOB),
    "StreamLogs": lambda c: list(c.logs(pb.StreamLogsRequest(job_id=NO_SUCH_JOB))),
    "ListAudit": lambda c: c.list_audit(limit=10, page_token=""),
}


def _error(server: ServerProcess, user: str, call: Callable[[GpufedClient], Any]) -> grpc.RpcError:
    with server.client(user) as client, pytest.raises(grpc.RpcError) as refused:
        call(client)
    return refused.value


def _infrastructure(postgres: PostgresProcess, dsn: str) -> list[str]:
    """What no member may read: the host, the port, the DSN, the driver's words."""
    return ["127.0.0.1", str(postgres.port), dsn, "postgres", "psycopg", "connection", "refused", "port"]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_member_reads_no_database_detail_while_it_is_down(
    down: tuple[ServerProcess, PostgresProcess, str], name: str
) -> None:
    server, postgres, dsn = down
    user, call = CALLS[name]
    error = _error(server, user, call)
    details = error.details() or ""
    assert error.code() == grpc.StatusCode.UNAVAILABLE, details
    assert "history database is unavailable" in details
    for word in _infrastructure(postgres, dsn):
        assert word not in details.lower(), f"{name} told {user} {details!r}"


@pytest.mark.parametrize("name", sorted(ADMIN_CALLS))
def test_an_admin_reads_the_detail(down: tuple[ServerProcess, PostgresProcess, str], name: str) -> None:
    server, postgres, _ = down
    error = _error(server, "admin", ADMIN_CALLS[name])
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    assert str(postgres.port) in (error.details() or ""), error.details()


def test_the_log_keeps_the_detail(down: tuple[ServerProcess, PostgresProcess, str]) -> None:
    server, postgres, _ = down
    _error(server, "alice", CALLS["GetJob"][1])
    assert f"port {postgres.port}" in server.current_log()


def test_calls_that_need_no_history_still_answer(down: tuple[ServerProcess, PostgresProcess, str]) -> None:
    """Calls that do not reach the history still answer: the outage is the history's alone."""
    server, _, _ = down
    with server.client("alice") as alice:
        assert alice.whoami().user == "alice"
        assert alice.list_page().jobs is not None
