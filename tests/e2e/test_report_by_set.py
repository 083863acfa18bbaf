"""Issue 34, finance by job set and by sweep, from the user's side: `gpufed report --by set`.

`gpufed serve` on the e2e federation (private A100s at $1.10, cloud H100s at $6.88 per GPU-hour)
with its history in SQLite and `history.retainInEtcd` of a few seconds. vision (alice) runs an
array of three copies called `shards`, a grid sweep of three trials called `lr` and a job alone;
nlp (bob) runs its own array also called `shards`, on the cloud's H100s. When every job has ended:

* finance's `gpufed report --by set -o csv` (parsed) has one row per tenant and set, and each set's
  GPU-hours and cost are the sum of its jobs' ledger intervals (`gpufed report ledger -o json`, the
  jobs named by `GetJobSet`), the cost to the micro-dollar; the two tenants' `shards` are two rows;
  the job alone is under `-`; the rows add up to the ungrouped report's total;
* `--by sweep` has vision's `lr` and puts the arrays' hours under `-`;
* a member's `--by set` names only its own tenant's sets, and asking for the other tenant's is
  NOT_FOUND, as for every usage report;
* the console's finance page shows finance both tenants' `shards` rows in its usage-by-set table and
  bob only nlp's; its `/finance.csv?by=set` download is the same rows, per reader;
* once the leader has archived every job to SQL (gone from etcd), the same report reads the same,
  byte for byte.
"""

from __future__ import annotations

import csv
import http.client
import io
import json
import re
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from datasync.loopback_ports import free_port
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from tests.e2e.harness import CONFIG, ServerProcess, manifest, run_cli, wait_for
from tests.etcdctl import etcdctl

pytestmark = pytest.mark.e2e

RETAIN_S = 10


@pytest.fixture
def server(etcd: EtcdProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    config = tmp_path / "federation.yaml"
    config.write_text(CONFIG.read_text() + f"history:\n  retainInEtcd: {RETAIN_S}s\n")
    # The console is served on the metrics port.
    process = ServerProcess(
        etcd.endpoint, tmp_path / "state", config=config, extra_args=("--metrics-port", str(free_port()))
    )
    process.start()
    try:
        yield process
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


def _sweep(tmp_path: Path) -> Path:
    path = tmp_path / "lr.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "gpufed.io/v1",
                "kind": "Sweep",
                "metadata": {"name": "lr"},
                "spec": {
                    "maxParallel": 3,
                    "parameters": {"lr": [0.1, 0.01, 0.001]},
                    "metric": {"name": "loss", "goal": "minimize"},
                    "template": {
                        "metadata": {"name": "trainer", "annotations": {"sim.gpufed.io/duration": "2s"}},
                        "spec": {
                            "gpuTypes": ["A100"],
                            "tasks": [
                                {"name": "main", "replicas": 1, "gpus": 2, "image": "pytorch/pytorch:2.3"}
                            ],
                        },
                    },
                },
            }
        )
    )
    return path


def _console(server: ServerProcess, user: str, path: str) -> tuple[int, str]:
    """Sign in to the console with the user's token, as a browser does, and read a page."""
    port = int(server.extra_args[server.extra_args.index("--metrics-port") + 1])
    token = (server.state_dir / "tokens" / f"{user}.token").read_text().strip()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        body = urllib.parse.urlencode({"token": token})
        headers = {"Origin": f"http://127.0.0.1:{port}", "Content-Type": "application/x-www-form-urlencoded"}
        conn.request("POST", "/login", body=body, headers=headers)
        signed = conn.getresponse()
        signed.read()
        assert signed.status == 303
        cookie = re.search(r"gpufed_session=([^;]+)", signed.getheader("Set-Cookie") or "")
        assert cookie
        conn.request("GET", path, headers={"Cookie": f"gpufed_session={cookie.group(1)}"})
        page = conn.getresponse()
        return page.status, page.read().decode()
    finally:
        conn.close()


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_each_sets_usage_is_the_sum_of_its_jobs_ledger_intervals_before_and_after_archiving(
    server: ServerProcess, etcd: EtcdProcess, tmp_path: Path
) -> None:
    began = time.time()
    vision_array = tmp_path / "vision-shards.yaml"
    vision_array.write_text(manifest("shard", gpus=1, duration="2s"))
    nlp_array = tmp_path / "nlp-shards.yaml"
    nlp_array.write_text(manifest("shard", gpus=2, gpu="H100", duration="2s"))
    alone = tmp_path / "alone.yaml"
    alone.write_text(manifest("alone", gpus=1, duration="2s"))
    _gpufed(server, "alice", "submit", str(vision_array), "--array", "0-2%3", "--set", "shards")
    _gpufed(server, "alice", "submit", str(_sweep(tmp_path)))
    _gpufed(server, "alice", "submit", str(alone))
    _gpufed(server, "bob", "submit", str(nlp_array), "--array", "0-1%2", "--set", "shards")

    alice, bob = server.client("alice"), server.client("bob")
    sets = {("vision", "shards"): alice, ("vision", "lr"): alice, ("nlp", "shards"): bob}

    def every_set_done() -> bool:
        return all(client.get_set(name).done for (_, name), client in sets.items())

    wait_for(every_set_done, timeout_s=120)
    members = {key: [m.job_id for m in client.get_set(key[1]).members] for key, client in sets.items()}
    assert [len(members[k]) for k in sets] == [3, 3, 2]
    every_job = alice.list_all() + bob.list_all()
    wait_for(
        lambda: all(j.phase == pb.JOB_PHASE_SUCCEEDED for j in alice.list_all() + bob.list_all()),
        timeout_s=60,
    )
    (lone,) = [j.job_id for j in every_job if j.name == "alone"]
    in_set = {job: key for key, jobs in members.items() for job in jobs}

    period = ("--from", _iso(began - 60), "--to", _iso(time.time() + 3600))
    ledger = json.loads(_gpufed(server, "fin", "report", "-o", "json", "ledger", *period).stdout)["intervals"]
    # Per (tenant, set): the ledger's GPU-hours and exact micro-dollars of its jobs' intervals.
    hours: dict[tuple[str, str], float] = {}
    micro: dict[tuple[str, str], int] = {}
    for iv in ledger:
        key = in_set.get(iv["job_id"], (iv["tenant"], "-"))
        hours[key] = hours.get(key, 0.0) + iv["gpu_hours"]
        micro[key] = micro.get(key, 0) + round(iv["cost_usd"] * 1_000_000)
    assert ("vision", "-") in hours
    assert lone in {iv["job_id"] for iv in ledger}

    by_set_text = _gpufed(server, "fin", "report", "--by", "set", "-o", "csv", *period).stdout
    by_set = _rows(by_set_text)
    assert list(by_set[0]) == ["tenant", "set", "gpu_hours", "cost_usd", "intervals"]
    got = {(r["tenant"], r["set"]): r for r in by_set}
    # Two tenants' `shards`: two rows, never one.
    assert set(got) == {("vision", "shards"), ("vision", "lr"), ("vision", "-"), ("nlp", "shards")}
    assert set(got) == set(hours)
    for key, row in got.items():
        assert float(row["gpu_hours"]) == pytest.approx(hours[key], rel=1e-9), key
        assert round(float(row["cost_usd"]) * 1_000_000) == micro[key], key
    assert int(got[("vision", "shards")]["intervals"]) == 3
    assert int(got[("nlp", "shards")]["intervals"]) == 2
    plain = json.loads(_gpufed(server, "fin", "report", "-o", "json", *period).stdout)
    assert round(sum(float(r["cost_usd"]) for r in by_set) * 1_000_000) == round(
        plain["total"]["cost_usd"] * 1_000_000
    )
    assert sum(float(r["gpu_hours"]) for r in by_set) == pytest.approx(plain["total"]["gpu_hours"], rel=1e-9)

    by_sweep = {
        (r["tenant"], r["sweep"]): r
        for r in _rows(_gpufed(server, "fin", "report", "--by", "sweep", "-o", "csv", *period).stdout)
    }
    assert set(by_sweep) == {("vision", "lr"), ("vision", "-"), ("nlp", "-")}
    assert by_sweep[("vision", "lr")]["gpu_hours"] == got[("vision", "lr")]["gpu_hours"]

    # A member: its own tenant's sets only, and never another tenant's.
    mine = _rows(_gpufed(server, "bob", "report", "--by", "set", "-o", "csv", *period).stdout)
    assert [(r["tenant"], r["set"]) for r in mine] == [("nlp", "shards")]
    assert mine[0] == got[("nlp", "shards")]
    refused = _gpufed(server, "bob", "report", "--by", "set", "--tenant", "vision", *period, ok=False)
    assert refused.returncode != 0
    assert "not found" in refused.stderr.lower()
    assert "vision" not in _gpufed(server, "bob", "report", "--by", "set", "-o", "json", *period).stdout

    # The console's finance page and its download, under the same rule.
    status, page = _console(server, "fin", "/finance?period=7d")
    assert status == 200
    table = page[page.index('id="usage-sets"') :]
    for tenant, name in got:
        assert f'<tr data-tenant="{tenant}" data-set="{name}">' in table
    status, page = _console(server, "bob", "/finance?period=7d")
    assert status == 200
    table = page[page.index('id="usage-sets"') :]
    assert '<tr data-tenant="nlp" data-set="shards">' in table
    assert 'data-tenant="vision"' not in table
    assert 'href="/finance.csv?period=7d&amp;by=set"' in page
    for user, expected in (("fin", set(got)), ("bob", {("nlp", "shards")})):
        status, text = _console(server, user, "/finance.csv?period=7d&by=set")
        assert status == 200
        assert {(r["tenant"], r["set"]) for r in _rows(text)} == expected
    status, _ = _console(server, "fin", "/finance.csv?period=7d&by=pipeline")
    assert status == 400

    # Archived to SQL and gone from etcd: the same report, summed from the history's day rows.
    jobs = set(in_set) | {lone}

    def archived() -> bool:
        keys = etcdctl(etcd.endpoint, "get", "--prefix", "--keys-only", "/gpufed/jobs/").stdout.split()
        return not any(k.rsplit("/", 1)[-1] in jobs for k in keys)

    wait_for(archived, timeout_s=RETAIN_S + 60)
    assert _gpufed(server, "fin", "report", "--by", "set", "-o", "csv", *period).stdout == by_set_text
