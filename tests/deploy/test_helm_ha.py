"""The chart's HA shape run as pods would run: two server containers of one render (PostgreSQL
history, its DSN given only through the Secret the chart references), on a real etcd and a real
PostgreSQL. One leads and the other stands by, both ready; the history tables are in the Secret's
database (psql says so, not gpufed); when the leader's pod dies as a node does (SIGKILL), the
standby takes the lease (etcdctl says so) and is ready as leader."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import PostgresProcess
from tests.deploy.chart import Pod, ensure_tools, readyz, start_pod, template
from tests.e2e.harness import wait_for
from tests.etcdctl import etcdctl

POD_ADDRESS = "127.0.0.2"
SECRET = ("gpufed-history-dsn", "dsn")
VALUES = {
    "replicas": 2,
    # gpufed serve --lease-ttl-s 2: a standby takes over 2 s after the leader's last refresh.
    "server": {"leaseTtlS": 2},
    "history": {"backend": "postgresql", "postgresql": {"dsnSecret": {"name": SECRET[0], "key": SECRET[1]}}},
    "networkPolicy": {"postgresql": {"cidrs": ["127.0.0.1/32"]}},
    "config": {
        "tenants": [{"name": "platform"}],
        "users": [{"name": "admin", "tenant": "platform", "role": "admin"}],
    },
}


@pytest.fixture(scope="module")
def federation(
    tmp_path_factory: pytest.TempPathFactory, postgres_process: PostgresProcess
) -> Iterator[tuple[EtcdProcess, str, list[Pod]]]:
    ensure_tools("deploy-tools")
    work = tmp_path_factory.mktemp("helm-ha")
    values = work / "values.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    render = template(values)
    assert render.one("Deployment")["spec"]["replicas"] == 2
    dsn = postgres_process.create_database(f"helm_ha_{uuid.uuid4().hex[:8]}")
    etcd = EtcdProcess(work / "etcd")
    etcd.start()
    pods: list[Pod] = []
    try:
        # Both at once, as a Deployment's first rollout starts them: one wins the lease.
        for name in ("gpufed-5f6b-a1", "gpufed-5f6b-b2"):
            pods.append(start_pod(render, name=name, etcd=etcd.endpoint, work=work, secrets={SECRET: dsn}))
        for pod in pods:
            wait_for(lambda pod=pod: _ready(pod), timeout_s=25)
        yield etcd, dsn, pods
    finally:
        for pod in pods:
            pod.stop()
        etcd.stop()


def _ready(pod: Pod) -> bool:
    assert pod.process.poll() is None, pod.log.read_text()[-3000:]
    return readyz(POD_ADDRESS, pod.http_port) == 200


def _leader(etcd: EtcdProcess) -> str:
    return etcdctl(etcd.endpoint, "get", "/gpufed/leader", "--print-value-only").stdout.strip()


def test_one_leads_one_stands_by_and_the_history_is_in_the_secrets_database(
    federation: tuple[EtcdProcess, str, list[Pod]],
) -> None:
    etcd, dsn, pods = federation
    # The leader key names a pod (--identity=$(POD_NAME)); both pods are ready, leader and standby.
    assert _leader(etcd) in {p.name for p in pods}
    assert all(readyz(POD_ADDRESS, p.http_port) == 200 for p in pods)
    tables = subprocess.run(
        [
            "psql",
            dsn,
            "-At",
            "-c",
            "select table_name from information_schema.tables where table_schema = 'public'",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert {"alembic_version", "history_jobs", "history_intervals"} <= set(tables), tables
    # SQLite was not used: no history file in either pod's state directory.
    for pod in pods:
        assert not list(Path(pod.state_dir).glob("*.sqlite3"))


def test_the_standby_takes_over_when_the_leaders_pod_dies(
    federation: tuple[EtcdProcess, str, list[Pod]],
) -> None:
    etcd, _dsn, pods = federation
    (leader,) = [p for p in pods if p.name == _leader(etcd)]
    (standby,) = [p for p in pods if p is not leader]
    leader.process.kill()
    leader.process.wait()
    wait_for(lambda: _leader(etcd) == standby.name, timeout_s=15)
    wait_for(lambda: _ready(standby), timeout_s=15)
