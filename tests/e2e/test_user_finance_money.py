"""Issue 30, item 8, from the user's side: costs in exact money, and a job's cost where users look.

`gpufed serve` on the e2e federation (prices $1.10 and $6.88 per GPU-hour: not binary fractions),
with its history in SQLite or in a real PostgreSQL, and `history.retainInEtcd` of a few seconds:

* finance's `gpufed report -o json` over a fixed period, taken while the ended jobs are still in
  etcd and again once the leader has archived them to SQL, gives the same figures digit by digit;
* the database's own SUM (the `sqlite3` or `psql` client, not gpufed) over the stored micro-dollars
  equals the report's total for the tenant;
* `gpufed get` and `gpufed describe` show each job's cost, equal to the micro-dollar to the sum of
  its rows in `gpufed report ledger` (and its table's cents), before and after archiving; the
  console's job page shows the same line; a job that has not run says so;
* another tenant's `get`/`describe` of the job is refused, as before, and names no cost.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from datasync.loopback_ports import free_port
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import PostgresProcess
from federation.store.money import format_usd, micro_usd_of
from tests.e2e.harness import CONFIG, ServerProcess, manifest, run_cli, wait_for
from tests.etcdctl import etcdctl

pytestmark = pytest.mark.e2e

DSN_ENV = "GPUFED_E2E_MONEY_DSN"
# Long enough that the first report is taken before the leader archives the ended jobs, even on a
# busy machine (5 s was not: the CLI calls before the first report took longer under load); the
# wait for the archive starts after those calls, so a larger figure costs the test little time.
RETAIN_S = 10


@pytest.fixture(params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, etcd: EtcdProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ServerProcess, str]]:
    history = f"history:\n  retainInEtcd: {RETAIN_S}s\n"
    dsn = ""
    if request.param == "postgres":
        postgres: PostgresProcess = request.getfixturevalue("postgres_process")
        dsn = postgres.create_database(f"history_money_{free_port()}")
        monkeypatch.setenv(DSN_ENV, dsn)
        history = f"history:\n  dsnEnv: {DSN_ENV}\n  retainInEtcd: {RETAIN_S}s\n"
    config = tmp_path / "federation.yaml"
    config.write_text(CONFIG.read_text() + history)
    process = ServerProcess(
        etcd.endpoint, tmp_path / "state", config=config, extra_args=("--metrics-port", str(free_port()))
    )
    process.start()
    try:
        yield process, dsn or str(tmp_path / "state" / "history.sqlite3")
    finally:
        process.stop()


def _gpufed(
    server: ServerProcess, user: str, *args: str, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    token = server.state_dir / "tokens" / f"{user}.token"
    done = run_cli("--server", server.target, "--token-file", str(token), *args, timeout_s=30)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def _iso(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _report(server: ServerProcess, since: str, until: str) -> dict[str, Any]:
    out = _gpufed(
        server, "fin", "report", "--from", since, "--to", until, "--by", "tenant,gpu_type", "-o", "json"
    )
    found: dict[str, Any] = json.loads(out.stdout)
    # What does not depend on the moment asked: the period's rows and totals, each tenant's period
    # and month-to-date figures (every interval has ended), GPU-hours by type.
    return {
        "rows": found["rows"],
        "total": found["total"],
        "tenants": [
            (t["tenant"], t["gpu_hours"], t["cost_usd"], t["month_gpu_hours"], t["month_cost_usd"])
            for t in found["tenants"]
        ],
        "gpu_hours_by_type": found["gpu_hours_by_type"],
    }


def _ledger(server: ServerProcess, since: str, until: str) -> dict[str, int]:
    """`gpufed report ledger -o json`: per job, its rows' exact cost summed (micro-dollars)."""
    period = ("--from", since, "--to", until)
    found = json.loads(_gpufed(server, "fin", "report", "-o", "json", "ledger", *period).stdout)
    exact: dict[str, int] = {}
    for iv in found.get("intervals", []):
        exact[iv["job_id"]] = exact.get(iv["job_id"], 0) + round(iv["cost_usd"] * 1_000_000)
    return exact


def _ledger_cents(server: ServerProcess, since: str, until: str) -> dict[str, list[str]]:
    """`gpufed report ledger`'s table: per job, its rows' USD column (the cell before ENDED)."""
    cents: dict[str, list[str]] = {}
    for line in _gpufed(
        server, "fin", "report", "ledger", "--from", since, "--to", until
    ).stdout.splitlines()[1:]:
        cells = line.split()
        cents.setdefault(cells[0], []).append(cells[-2])
    return cents


def _cost_line(text: str) -> str:
    found = [line for line in text.splitlines() if line.startswith("Cost:")]
    assert len(found) == 1, text
    return found[0]


def _shown_cost(server: ServerProcess, user: str, job_id: str) -> tuple[str, str]:
    """The job's cost line as `gpufed get` and `gpufed describe` print it."""
    got = _cost_line(_gpufed(server, user, "get", job_id).stdout)
    return got, _cost_line(_gpufed(server, user, "describe", job_id).stdout)


def _sql_sum(dsn: str, tenant: str) -> int:
    query = f"SELECT SUM(cost_micro_usd) FROM history_usage_days WHERE tenant = '{tenant}'"
    if dsn.startswith("postgresql"):
        argv = [
            "psql",
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            dsn.replace("+psycopg", ""),
            "-c",
            query,
        ]
    else:
        argv = ["sqlite3", dsn, query]
    return int(subprocess.run(argv, check=True, capture_output=True, text=True, timeout=20).stdout.strip())


def _console_page(server: ServerProcess, user: str, path: str) -> str:
    """Sign in to the console with the user's token, as a browser does, and read a page."""
    port = int(server.extra_args[server.extra_args.index("--metrics-port") + 1])
    token = (server.state_dir / "tokens" / f"{user}.token").read_text().strip()
    origin = f"http://127.0.0.1:{port}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        body = urllib.parse.urlencode({"token": token})
        headers = {"Origin": origin, "Content-Type": "application/x-www-form-urlencoded"}
        conn.request("POST", "/login", body=body, headers=headers)
        signed = conn.getresponse()
        signed.read()
        assert signed.status == 303
        cookie = re.search(r"gpufed_session=([^;]+)", signed.getheader("Set-Cookie") or "")
        assert cookie
        conn.request("GET", path, headers={"Cookie": f"gpufed_session={cookie.group(1)}"})
        page = conn.getresponse()
        assert page.status == 200
        return page.read().decode()
    finally:
        conn.close()


def test_costs_hold_to_the_digit_across_archiving_and_a_job_shows_its_cost(
    server: tuple[ServerProcess, str], etcd: EtcdProcess
) -> None:
    process, dsn = server
    since = _iso(time.time() - 60)
    with process.client("alice") as alice, process.client("bob") as bob:
        ran = [
            alice.submit(manifest("a100-pair", gpus=2, duration="1.3s"), idempotency_key="m1").job_id,
            alice.submit(manifest("h100", gpu="H100", gpus=3, duration="1.7s"), idempotency_key="m2").job_id,
            alice.submit(manifest("a100-one", duration="0.9s"), idempotency_key="m3").job_id,
        ]
        theirs = bob.submit(manifest("nlp", gpus=1, duration="1.1s"), idempotency_key="m4").job_id
        # 2 x 8 H100s: more than the federation has, so it waits and never runs.
        waiting = alice.submit(manifest("too-big", gpu="H100", gpus=8), idempotency_key="m5").job_id
        for job_id, who in [*((j, alice) for j in ran), (theirs, bob)]:
            wait_for(lambda j=job_id, c=who: c.get(j).phase == pb.JobPhase.JOB_PHASE_SUCCEEDED, timeout_s=30)
    until = _iso(time.time() + 1)
    wait_for(lambda: time.time() > datetime.fromisoformat(until).timestamp(), timeout_s=5)
    # While the ended jobs are still in etcd (retainInEtcd), summed in Python from etcd's ledger.
    before = _report(process, since, until)
    with process.client("alice") as alice:
        exact = {j: alice.get(j).cost_usd for j in [*ran, waiting]}
    ledger = _ledger(process, since, until)
    jobs_in_etcd = etcdctl(etcd.endpoint, "get", "--prefix", "--keys-only", "/gpufed/jobs/").stdout.split()
    assert f"/gpufed/jobs/{ran[0]}" in jobs_in_etcd, "archived before the first report: raise RETAIN_S"
    assert before["total"]["cost_usd"] > 0

    # A job that never ran says so, and is charged nothing.
    assert exact[waiting] == ""
    assert waiting not in ledger
    assert (
        _cost_line(_gpufed(process, "alice", "get", waiting).stdout) == "Cost:      none: no attempt has run"
    )
    # Another tenant: refused as before, and nothing of the cost in the answer.
    for verb in ("get", "describe"):
        refused = _gpufed(process, "bob", verb, ran[1], ok=False)
        assert refused.returncode != 0
        assert "not found" in refused.stderr.lower()
        assert "Cost" not in refused.stdout + refused.stderr
        assert exact[ran[1]] not in refused.stdout + refused.stderr

    # Each job's cost is its rows in `report ledger`, to the micro-dollar, and to the cent as shown.
    cents = _ledger_cents(process, since, until)
    for job_id in ran:
        micro = micro_usd_of(exact[job_id])
        assert micro > 0
        assert ledger[job_id] == micro, job_id
        assert cents[job_id] == [format_usd(micro, places=2)]
    line = f"Cost:      ${format_usd(micro_usd_of(exact[ran[1]]), places=2)} (USD {exact[ran[1]]})"
    assert _shown_cost(process, "alice", ran[1]) == (line, line)
    page = _console_page(process, "alice", f"/jobs/{ran[1]}")
    assert line.removeprefix("Cost:      ") in page

    # The leader archives the ended jobs to SQL and deletes them from etcd: only the waiting job stays.
    def archived() -> bool:
        keys = etcdctl(etcd.endpoint, "get", "--prefix", "--keys-only", "/gpufed/jobs/").stdout.split()
        return [k for k in keys if k] == [f"/gpufed/jobs/{waiting}"]

    wait_for(archived, timeout_s=RETAIN_S + 10)
    # Now summed in SQL: the same figures, digit by digit; the same costs, read from the history.
    assert _report(process, since, until) == before
    with process.client("alice") as alice:
        assert {j: alice.get(j).cost_usd for j in [*ran, waiting]} == exact
    assert _ledger(process, since, until) == ledger
    assert _shown_cost(process, "alice", ran[1]) == (line, line)
    # The database's own sum over what it stores, against the report's figure for the tenant.
    vision = [t for t in before["tenants"] if t[0] == "vision"]
    assert vision
    assert _sql_sum(dsn, "vision") / 1_000_000 == vision[0][2]
