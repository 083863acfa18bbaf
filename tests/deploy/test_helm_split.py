"""The chart's split deployment (`scheduler.separate: true`; docs/deploy.md, "Splitting the API from
the scheduler"), judged by the real helm's render and by its containers run as pods would run.

The render: the API servers (`--role api`) and the leader candidates (`--role scheduler`) in two
Deployments whose selectors cannot overlap, the clients' Services reaching the API servers only, a
network policy and a disruption budget for each, etcd open to both, every object valid for each
supported Kubernetes (kubernetes-validate), gpufed's own CLI taking both command lines, and SQLite
history refused. The pods: on a real etcd and PostgreSQL, the scheduler's pod leads (etcdctl says),
the API pod is ready naming it, and with the scheduler's pod killed (SIGKILL, as a node dies) and
its lease run out, the API pod stays ready and keeps answering the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from federation.cli.main import cli
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import PostgresProcess
from tests.deploy.chart import (
    CHART,
    KUBE_VALIDATE_PYTHON,
    Pod,
    Render,
    ensure_tools,
    helm,
    readyz,
    start_pod,
    template,
)
from tests.deploy.test_helm_chart import SUPPORTED_KUBERNETES
from tests.e2e.harness import wait_for
from tests.etcdctl import etcdctl

POD_ADDRESS = "127.0.0.2"
SECRET = ("gpufed-history-dsn", "dsn")
VALUES: dict[str, Any] = {
    "replicas": 3,
    "scheduler": {"separate": True, "replicas": 2, "resources": {}},
    # gpufed serve --lease-ttl-s 2: a dead scheduler's key is gone 2 s after its last refresh.
    "server": {"leaseTtlS": 2},
    "history": {"backend": "postgresql", "postgresql": {"dsnSecret": {"name": SECRET[0], "key": SECRET[1]}}},
    "networkPolicy": {"postgresql": {"cidrs": ["127.0.0.1/32"]}},
    "config": {
        "tenants": [{"name": "platform"}, {"name": "vision"}],
        "users": [
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision", "role": "member"},
        ],
    },
}
API, SCHEDULER = "gpufed", "gpufed-scheduler"


@pytest.fixture(scope="module")
def values_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ensure_tools("deploy-tools")
    path = tmp_path_factory.mktemp("helm-split") / "values.yaml"
    path.write_text(yaml.safe_dump(VALUES))
    return path


@pytest.fixture(scope="module")
def split(values_file: Path) -> Render:
    return template(values_file)


def _pod_template(render: Render, deployment: str) -> dict[str, Any]:
    return dict(render.one("Deployment", deployment)["spec"]["template"])


def _container(render: Render, deployment: str) -> dict[str, Any]:
    return dict(_pod_template(render, deployment)["spec"]["containers"][0])


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_api_servers_and_the_leader_candidates_are_two_deployments_apart(split: Render) -> None:
    api, scheduler = split.one("Deployment", API), split.one("Deployment", SCHEDULER)
    assert api["spec"]["replicas"] == 3
    assert scheduler["spec"]["replicas"] == 2
    assert "--role=api" in _container(split, API)["args"]
    assert "--role=scheduler" in _container(split, SCHEDULER)["args"]
    # Each Deployment's selector takes its own pods and never the other's: overlapping selectors
    # would make the two controllers fight over each other's pods.
    for own, other in ((api, scheduler), (scheduler, api)):
        selector = own["spec"]["selector"]["matchLabels"]
        assert _selects(selector, own["spec"]["template"]["metadata"]["labels"])
        assert not _selects(selector, other["spec"]["template"]["metadata"]["labels"])
    # Both roll one new pod in before an old one goes, and spread over nodes among their own kind.
    for deployment in (api, scheduler):
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        term = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ][0]["podAffinityTerm"]
        assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    # With no resources of its own, the scheduler gets the servers'.
    assert _container(split, SCHEDULER)["resources"] == _container(split, API)["resources"]


def test_clients_reach_only_the_api_servers_and_both_are_scraped(split: Render) -> None:
    api_labels = _pod_template(split, API)["metadata"]["labels"]
    scheduler_labels = _pod_template(split, SCHEDULER)["metadata"]["labels"]
    for name in ("gpufed-grpc", "gpufed-console", "gpufed-metrics"):
        selector = split.one("Service", name)["spec"]["selector"]
        assert _selects(selector, api_labels), name
        assert not _selects(selector, scheduler_labels), name
    scheduler_metrics = split.one("Service", "gpufed-scheduler-metrics")["spec"]
    assert _selects(scheduler_metrics["selector"], scheduler_labels)
    assert not _selects(scheduler_metrics["selector"], api_labels)
    assert [p["targetPort"] for p in scheduler_metrics["ports"]] == ["http"]


def test_each_kind_of_pod_has_its_network_policy_and_disruption_budget(split: Render) -> None:
    api_labels = _pod_template(split, API)["metadata"]["labels"]
    scheduler_labels = _pod_template(split, SCHEDULER)["metadata"]["labels"]
    server_policy = split.one("NetworkPolicy", "gpufed")["spec"]
    scheduler_policy = split.one("NetworkPolicy", "gpufed-scheduler")["spec"]
    assert _selects(server_policy["podSelector"]["matchLabels"], api_labels)
    assert _selects(scheduler_policy["podSelector"]["matchLabels"], scheduler_labels)
    # The same rules: in on the two served ports only, out to the same destinations only.
    for key in ("policyTypes", "ingress", "egress"):
        assert scheduler_policy[key] == server_policy[key], key
    # etcd takes clients from both kinds of server.
    etcd = split.one("NetworkPolicy", "gpufed-etcd")["spec"]
    clients = [r for r in etcd["ingress"] if [p["port"] for p in r["ports"]] == [2379]]
    (rule,) = clients
    selectors = [f["podSelector"]["matchLabels"] for f in rule["from"]]
    assert any(_selects(s, api_labels) for s in selectors)
    assert any(_selects(s, scheduler_labels) for s in selectors)
    for name, labels in (("gpufed", api_labels), ("gpufed-scheduler", scheduler_labels)):
        budget = split.one("PodDisruptionBudget", name)["spec"]
        assert budget["maxUnavailable"] == 1
        assert _selects(budget["selector"]["matchLabels"], labels)


def test_gpufed_serve_takes_both_command_lines(split: Render) -> None:
    for deployment in (API, SCHEDULER):
        container = _container(split, deployment)
        assert container["command"] == ["gpufed"]
        # The CLI's own parser takes the whole line (an unknown option, or a --role it does not
        # know, fails before --help is acted on).
        parsed = CliRunner().invoke(cli, [*container["args"], "--help"])
        assert parsed.exit_code == 0, parsed.output


def test_api_workers_go_to_the_servers_that_serve_the_api(values_file: Path) -> None:
    """`server.apiWorkers`: more processes on the API's port (docs/deploy.md). In a split they go to
    the API servers only: the leader candidates serve no client. Off by default."""
    assert not [a for a in _container(template(values_file), API)["args"] if a.startswith("--api-workers")]
    render = template(values_file, sets=("server.apiWorkers=3",))
    api_args = _container(render, API)["args"]
    assert "--api-workers=3" in api_args[api_args.index("serve") + 1 :]
    assert not [a for a in _container(render, SCHEDULER)["args"] if a.startswith("--api-workers")]
    parsed = CliRunner().invoke(cli, [*api_args, "--help"])
    assert parsed.exit_code == 0, parsed.output
    (one,) = [d for d in template(sets=("server.apiWorkers=2",)).docs if d["kind"] == "Deployment"]
    assert "--api-workers=2" in one["spec"]["template"]["spec"]["containers"][0]["args"]
    refused = template(sets=("server.apiWorkers=-1",))
    assert refused.code != 0
    assert "apiWorkers" in refused.stderr, refused.stderr


def test_the_split_is_valid_for_each_supported_kubernetes_and_lints(
    split: Render, values_file: Path, tmp_path: Path
) -> None:
    path = tmp_path / "split.yaml"
    path.write_text(split.stdout)
    result = subprocess.run(
        [
            str(KUBE_VALIDATE_PYTHON),
            str(Path(__file__).with_name("kube_validate.py")),
            ",".join(SUPPORTED_KUBERNETES),
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    *failures, summary = [json.loads(line) for line in result.stdout.splitlines()]
    assert failures == []
    assert summary == {"checked": len(split.docs) * len(SUPPORTED_KUBERNETES)}
    linted = helm("lint", "--strict", str(CHART), "--namespace", "gpufed", "-f", str(values_file))
    assert linted.code == 0, linted.stdout + linted.stderr


def test_the_default_is_one_kind_of_server_without_a_role(values_file: Path) -> None:
    render = template()
    (deployment,) = [d for d in render.docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--role")]
    assert not [d for d in render.docs if d["metadata"]["name"].endswith("-scheduler")]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("scheduler.separate=true",), "scheduler.separate=true needs history.backend=postgresql"),
        (("scheduler.replicas=0",), "scheduler.replicas"),
        (("scheduler.separate=yes",), "scheduler.separate"),
        (("scheduler.resources.requests.cpu=1",), "scheduler.resources"),
    ],
    ids=["sqlite", "no-candidates", "not-a-bool", "requests-without-limits"],
)
def test_bad_split_values_are_refused_naming_them(sets: tuple[str, ...], message: str) -> None:
    result = template(sets=sets)
    assert result.code != 0
    assert message in result.stderr, result.stderr


def test_the_scheduler_gets_resources_of_its_own_when_given(values_file: Path) -> None:
    render = template(
        values_file,
        sets=(
            "scheduler.resources.requests.cpu=3",
            "scheduler.resources.requests.memory=6Gi",
            "scheduler.resources.limits.cpu=4",
            "scheduler.resources.limits.memory=8Gi",
        ),
    )
    assert _container(render, SCHEDULER)["resources"] == {
        # `--set` makes 3 a number; Kubernetes takes a quantity either way.
        "requests": {"cpu": 3, "memory": "6Gi"},
        "limits": {"cpu": 4, "memory": "8Gi"},
    }
    assert _container(render, API)["resources"]["requests"]["cpu"] == "1"


@pytest.fixture(scope="module")
def pods(
    split: Render, tmp_path_factory: pytest.TempPathFactory, postgres_process: PostgresProcess
) -> Iterator[tuple[EtcdProcess, Pod, Pod]]:
    work = tmp_path_factory.mktemp("helm-split-pods")
    dsn = postgres_process.create_database(f"helm_split_{uuid.uuid4().hex[:8]}")
    etcd = EtcdProcess(work / "etcd")
    etcd.start()
    started: list[Pod] = []
    try:
        # The API pod first and alone: it bootstraps the config (the first tokens are in its state
        # dir) and is ready with no leader at all.
        api = start_pod(
            split,
            name="gpufed-6c8d-api01",
            etcd=etcd.endpoint,
            work=work,
            secrets={SECRET: dsn},
            deployment=API,
        )
        started.append(api)
        wait_for(lambda: _ready(api), timeout_s=25)
        scheduler = start_pod(
            split,
            name="gpufed-scheduler-7f9b-s01",
            etcd=etcd.endpoint,
            work=work,
            secrets={SECRET: dsn},
            deployment=SCHEDULER,
        )
        started.append(scheduler)
        wait_for(lambda: _ready(scheduler), timeout_s=25)
        yield etcd, api, scheduler
    finally:
        for pod in started:
            pod.stop()
        etcd.stop()


def _ready(pod: Pod) -> bool:
    assert pod.process.poll() is None, pod.log.read_text()[-3000:]
    return readyz(POD_ADDRESS, pod.http_port) == 200


def _readyz_text(pod: Pod) -> str:
    with urllib.request.urlopen(f"http://{POD_ADDRESS}:{pod.http_port}/readyz", timeout=5) as reply:
        return str(reply.read().decode())


def _leader(etcd: EtcdProcess) -> str:
    return etcdctl(etcd.endpoint, "get", "/gpufed/leader", "--print-value-only").stdout.strip()


def _gpufed(pod: Pod, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    token = pod.state_dir / "tokens" / f"{user}.token"
    gpufed = str(Path(sys.executable).with_name("gpufed"))
    return subprocess.run(
        [gpufed, "--server", f"{POD_ADDRESS}:{pod.grpc_port}", "--token-file", str(token), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_scheduler_pod_leads_and_the_api_pod_serves_on_when_it_dies(
    pods: tuple[EtcdProcess, Pod, Pod],
) -> None:
    etcd, api, scheduler = pods
    assert _leader(etcd) == scheduler.name
    assert _readyz_text(api) == f"ready: api, leader {scheduler.name}\n"
    assert "leader_elected" not in api.log.read_text()
    scheduler.process.kill()
    scheduler.process.wait()
    wait_for(lambda: _leader(etcd) == "", timeout_s=15)
    assert _readyz_text(api) == "ready: api, no leader: submissions wait for one\n"
    whoami = _gpufed(api, "alice", "-o", "json", "whoami")
    assert whoami.returncode == 0, whoami.stderr
    assert '"alice"' in whoami.stdout
    listed = _gpufed(api, "alice", "-o", "json", "list")
    assert listed.returncode == 0, listed.stderr
