"""The Helm chart as a platform team meets it: the real helm lints and renders it with each example
values file; kubernetes-validate checks every rendered object against the schemas of each Kubernetes
version the chart supports; gpufed's own CLI and config loader, and etcd's own binary, judge the
arguments and config the chart hands them; bad values are refused naming the field; the security
context and the network policy are the ones docs/deploy.md describes. (checkov's policy check is
`make chart-policy`: tests/deploy/test_helm_policy.py.)"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from federation.cli.main import cli
from federation.runtime.config import parse_config
from federation.runtime.etcd_process import etcd_binary
from federation.store.records import DEFAULT_MAX_QUEUED_JOBS
from tests.deploy.chart import (
    CHART,
    EXAMPLES,
    KUBE_VALIDATE_PYTHON,
    REPO,
    Render,
    documented_block,
    ensure_tools,
    helm,
    pod_specs,
    template,
)

# The versions Chart.yaml's kubeVersion admits and the docs name (docs/deploy.md, "Requirements").
SUPPORTED_KUBERNETES = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0")
EXAMPLE_IDS = [p.stem for p in EXAMPLES]


@pytest.fixture(scope="module", autouse=True)
def tools() -> None:
    """helm and kubernetes-validate, for every test here (`make deploy-tools`, a no-op once made)."""
    ensure_tools("deploy-tools")


@pytest.fixture(scope="module")
def renders(tools: None) -> dict[str, Render]:
    return {path.stem: template(path) for path in EXAMPLES}


def _example(name: str) -> Path:
    return CHART / "examples" / f"{name}.yaml"


def test_the_three_deployments_are_shipped_as_examples() -> None:
    assert EXAMPLE_IDS == ["external-etcd", "ha-postgresql", "single-sqlite"]


def test_helm_lint_strict_passes_with_defaults_and_each_example(renders: dict[str, Render]) -> None:
    for values in [None, *EXAMPLES]:
        args = ["lint", "--strict", str(CHART), "--namespace", "gpufed"]
        if values is not None:
            args += ["-f", str(values)]
        result = helm(*args)
        assert result.code == 0, f"helm lint {values}:\n{result.stdout}{result.stderr}"
        assert "0 chart(s) failed" in result.stdout


def test_each_example_renders_the_objects_of_its_deployment(renders: dict[str, Render]) -> None:
    single, ha, external = renders["single-sqlite"], renders["ha-postgresql"], renders["external-etcd"]
    common = {
        ("ConfigMap", "gpufed-config"),
        ("Deployment", "gpufed"),
        ("NetworkPolicy", "gpufed"),
        ("PodDisruptionBudget", "gpufed"),
        ("Service", "gpufed-console"),
        ("Service", "gpufed-grpc"),
        ("Service", "gpufed-metrics"),
        ("ServiceAccount", "gpufed"),
    }
    etcd = {
        ("NetworkPolicy", "gpufed-etcd"),
        ("PodDisruptionBudget", "gpufed-etcd"),
        ("Service", "gpufed-etcd"),
        ("StatefulSet", "gpufed-etcd"),
    }
    assert set(single.kinds()) == common | etcd | {("PersistentVolumeClaim", "gpufed-state")}
    assert set(ha.kinds()) == common | etcd
    assert set(external.kinds()) == common
    assert single.one("Deployment")["spec"]["replicas"] == 1
    assert single.one("Deployment")["spec"]["strategy"]["type"] == "Recreate"
    assert ha.one("Deployment")["spec"]["replicas"] == 3
    assert ha.one("Deployment")["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert ha.one("StatefulSet")["spec"]["replicas"] == 3


def test_every_rendered_object_is_valid_for_each_supported_kubernetes(
    renders: dict[str, Render], tmp_path: Path
) -> None:
    files = []
    for name, render in renders.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(render.stdout)
        files.append(str(path))
    result = subprocess.run(
        [
            str(KUBE_VALIDATE_PYTHON),
            str(Path(__file__).with_name("kube_validate.py")),
            ",".join(SUPPORTED_KUBERNETES),
            *files,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    *failures, summary = lines
    assert failures == []
    objects = sum(len(r.docs) for r in renders.values())
    assert summary == {"checked": objects * len(SUPPORTED_KUBERNETES)}


def test_a_kubernetes_older_than_supported_is_refused() -> None:
    result = template(_example("single-sqlite"), kube_version="1.28.0")
    assert result.code != 0
    assert "kubeVersion" in result.stderr
    assert "1.28.0" in result.stderr


def _server_container(render: Render) -> dict[str, Any]:
    containers: list[dict[str, Any]] = render.one("Deployment")["spec"]["template"]["spec"]["containers"]
    return containers[0]


def _options_of(help_text: str) -> set[str]:
    return set(re.findall(r"(?m)^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", help_text))


@pytest.fixture(scope="module")
def serve_options() -> tuple[set[str], set[str]]:
    """The options `gpufed --help` and `gpufed serve --help` list, from the CLI a user runs."""

    def help_of(*command: str) -> set[str]:
        result = CliRunner().invoke(cli, [*command, "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        return _options_of(result.output)

    return help_of(), help_of("serve")


@pytest.mark.parametrize("example", EXAMPLE_IDS)
def test_the_server_gets_only_options_gpufed_serve_has(
    renders: dict[str, Render], serve_options: tuple[set[str], set[str]], example: str
) -> None:
    container = _server_container(renders[example])
    assert container["command"] == ["gpufed"]
    args = container["args"]
    split = args.index("serve")
    global_options, options = serve_options

    def flags(part: list[str]) -> set[str]:
        return {a.split("=", 1)[0] for a in part if a.startswith("--")}

    assert flags(args[:split]) <= global_options, "global options gpufed does not have"
    assert flags(args[split + 1 :]) <= options, "options gpufed serve does not have"
    # And the CLI's own parser takes the whole line: an unknown option or a missing value fails
    # before --help is acted on.
    parsed = CliRunner().invoke(cli, [*args, "--help"])
    assert parsed.exit_code == 0, parsed.output


def test_etcd_gets_only_flags_etcd_has(renders: dict[str, Render]) -> None:
    container = renders["ha-postgresql"].one("StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    known = subprocess.run([str(etcd_binary()), "--help"], capture_output=True, text=True, timeout=30).stdout
    for arg in container["args"]:
        flag = arg.split("=", 1)[0]
        assert re.search(rf"(?m)^\s+{re.escape(flag)}\b", known), f"etcd has no {flag}"
    assert "--initial-cluster=gpufed-etcd-0=http://gpufed-etcd-0.gpufed-etcd.gpufed.svc:2380," in " ".join(
        container["args"]
    )


@pytest.mark.parametrize("example", EXAMPLE_IDS)
def test_the_config_is_one_gpufed_loads(renders: dict[str, Render], example: str) -> None:
    render = renders[example]
    config = parse_config(render.one("ConfigMap")["data"]["federation.yaml"])
    container = _server_container(render)
    env = {e["name"]: e for e in container.get("env", [])}
    if example == "single-sqlite":
        assert config.history.dsn is None
        assert config.history.dsn_env is None
        assert "GPUFED_HISTORY_DSN" not in env
    else:
        # The variable the config names is the one the Secret feeds, and only by reference.
        assert config.history.dsn_env == "GPUFED_HISTORY_DSN"
        assert env["GPUFED_HISTORY_DSN"]["valueFrom"]["secretKeyRef"] == {
            "name": "gpufed-history-dsn",
            "key": "dsn",
        }
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    for cluster in config.clusters:
        assert cluster.kubeconfig is not None
        assert str(Path(cluster.kubeconfig).parent) in mounted, cluster.name


@pytest.mark.parametrize(
    ("values", "field"),
    [
        (("replicas=two",), "replicas"),
        (("server.grpcPort=70000",), "server.grpcPort"),
        (("server.bogus=1",), "bogus"),
        (("history.backend=mysql",), "history.backend"),
        (("etcd.statefulset.replicas=2",), "etcd.statefulset.replicas"),
        (("networkPolicy.memberApiServers.cidrs={not-a-cidr}",), "networkPolicy.memberApiServers.cidrs.0"),
        (("image.digest=latest",), "image.digest"),
        (("server.leaseTtlS=1",), "server.leaseTtlS"),
        (("server.leaseStallLimitS=1",), "server.leaseStallLimitS"),
        (("config.clsuters={}",), "clsuters"),
    ],
    ids=lambda v: v[0] if isinstance(v, tuple) else v,
)
def test_the_schema_refuses_bad_values_naming_the_field(
    renders: dict[str, Render], values: tuple[str, ...], field: str
) -> None:
    result = template(sets=values)
    assert result.code != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert field in result.stderr, result.stderr


def test_the_lease_s_stall_limit_is_gpufed_s_own_unless_set_and_then_passed_as_serve_takes_it() -> None:
    plain = template(_example("single-sqlite"))
    assert not any(a.startswith("--lease-stall-limit-s") for a in _server_container(plain)["args"])
    asked = template(_example("single-sqlite"), sets=("server.leaseTtlS=5", "server.leaseStallLimitS=15"))
    args = _server_container(asked)["args"]
    assert "--lease-stall-limit-s=15" in args[args.index("serve") + 1 :]
    parsed = CliRunner().invoke(cli, [*args, "--help"])
    assert parsed.exit_code == 0, parsed.output


@pytest.mark.parametrize(
    ("example", "values", "message"),
    [
        ("single-sqlite", ("replicas=2",), "replicas=2 needs history.backend=postgresql"),
        (
            "single-sqlite",
            ("history.backend=postgresql", "networkPolicy.postgresql.cidrs={10.0.0.1/32}"),
            "needs history.postgresql.dsnSecret.name",
        ),
        ("single-sqlite", ("etcd.mode=external",), "etcd.mode=external needs etcd.external.endpoints"),
        (
            "single-sqlite",
            ("etcd.external.endpoints={etcd:2379}",),
            "etcd.external.endpoints is set but etcd.mode is statefulset",
        ),
        (
            "single-sqlite",
            ("config.history.dsn=postgresql://db/gpufed",),
            "config.history.dsn and config.history.dsnEnv are the chart's",
        ),
        ("single-sqlite", ("config.clusters[0].backend=sim",), "config.clusters[0].backend=sim"),
        (
            "single-sqlite",
            ("config.clusters[0].kubeconfig=/root/.kube/config",),
            "config.clusters[0].kubeconfig must be a file of members.kubeconfigSecret",
        ),
        (
            "single-sqlite",
            ("networkPolicy.memberApiServers.cidrs=null",),
            "networkPolicy.memberApiServers.cidrs must hold",
        ),
        ("single-sqlite", ("members.kubeconfigSecret=",), "members.kubeconfigSecret must name the Secret"),
        ("ha-postgresql", ("networkPolicy.postgresql.cidrs=null",), "needs networkPolicy.postgresql.cidrs"),
        ("external-etcd", ("etcd.external.cidrs=null",), "needs etcd.external.cidrs"),
        ("single-sqlite", ("tls.clientCaKey=ca.crt",), "tls.clientCaKey (mutual TLS) needs tls.secretName"),
    ],
    ids=lambda v: v[0] if isinstance(v, tuple) else v,
)
def test_invalid_combinations_fail_at_render_time(
    renders: dict[str, Render], example: str, values: tuple[str, ...], message: str
) -> None:
    result = template(_example(example), sets=values)
    assert result.code != 0
    assert message in result.stderr, result.stderr


def test_the_control_cluster_as_a_member_mounts_the_account_token_only_then() -> None:
    values = (_example("single-sqlite"),)
    in_cluster = "config.clusters[0].kubeconfig=in-cluster"
    refused = template(*values, sets=(in_cluster,))
    assert "set serviceAccount.automountToken=true" in refused.stderr
    render = template(*values, sets=(in_cluster, "serviceAccount.automountToken=true"))
    pod = render.one("Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert (
        parse_config(render.one("ConfigMap")["data"]["federation.yaml"]).clusters[0].kubeconfig
        == "in-cluster"
    )


def test_pods_run_with_the_security_context_the_docs_describe(renders: dict[str, Render]) -> None:
    container_context = documented_block("container-securityContext")
    pod_context = documented_block("pod-securityContext")
    for example, render in renders.items():
        for name, pod in pod_specs(render.docs):
            at = f"{example}: {name}"
            assert pod["automountServiceAccountToken"] is False, at
            context = {k: v for k, v in pod["securityContext"].items() if k in pod_context}
            assert context == pod_context, at
            assert pod["securityContext"]["runAsUser"] > 0, at
            for container in pod["containers"]:
                context = {k: v for k, v in container["securityContext"].items() if k in container_context}
                assert context == container_context, at
                assert set(container["resources"]) == {"requests", "limits"}, at
                # Secrets only as read-only files or by reference: never a literal value (a `*_FILE`
                # variable's value is the path of a mounted file).
                for env in container.get("env", []):
                    literal = "value" in env and not env["name"].endswith("_FILE")
                    assert not literal or not re.search(r"(?i)pass|secret|token|dsn", env["name"]), at
                    if env["name"].endswith("_FILE"):
                        assert env["value"].startswith("/etc/gpufed/"), at
                secret_volumes = {v["name"] for v in pod.get("volumes", []) if "secret" in v}
                for mount in container["volumeMounts"]:
                    if mount["name"] in secret_volumes:
                        assert mount.get("readOnly") is True, f"{at}: {mount['name']}"
    sa = renders["ha-postgresql"].one("ServiceAccount")
    assert sa["automountServiceAccountToken"] is False


def test_no_secret_reaches_a_configmap_or_the_args(renders: dict[str, Render]) -> None:
    for example, render in renders.items():
        assert not [d for d in render.docs if d["kind"] == "Secret"], f"{example}: the chart writes no Secret"
        text = render.one("ConfigMap")["data"]["federation.yaml"] + " ".join(
            _server_container(render)["args"]
        )
        assert not re.search(r"postgres(ql)?://[^ ]*:[^ ]*@", text), example


def test_secrets_are_mounted_where_the_docs_say(renders: dict[str, Render]) -> None:
    documented = documented_block("secret-mounts")
    pod = renders["ha-postgresql"].one("Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in pod["containers"][0]["volumeMounts"]}
    seen = {path: v["secret"]["secretName"] for path, v in mounts.items() if "secret" in v}
    assert seen == {
        k: v
        for k, v in documented.items()
        if k in ("/etc/gpufed/tls", "/etc/gpufed/kubeconfigs", "/etc/gpufed/cloud", "/etc/gpufed/secrets-key")
    }
    # The key that seals tenants' secrets is named to the server as the file the Secret's key mounts as.
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["GPUFED_SECRETS_KEY_FILE"] == "/etc/gpufed/secrets-key/secrets.key"
    single = renders["single-sqlite"].one("Deployment")["spec"]["template"]["spec"]
    assert "GPUFED_SECRETS_KEY_FILE" not in {e["name"] for e in single["containers"][0]["env"]}
    external = renders["external-etcd"].one("Deployment")["spec"]["template"]["spec"]
    assert {v["secret"]["secretName"] for v in external["volumes"] if "secret" in v} >= {
        documented["/etc/gpufed/etcd-tls"]
    }
    for volume in pod["volumes"]:
        if "secret" in volume:
            assert volume["secret"]["defaultMode"] == 0o440


def _ports(rule: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(p["protocol"], p["port"]) for p in rule["ports"]]


def test_the_network_policy_is_the_one_the_docs_describe(renders: dict[str, Render]) -> None:
    ha = renders["ha-postgresql"]
    policy = ha.one("NetworkPolicy", "gpufed")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    # In: only the two served ports, from whom the values say.
    (ingress,) = policy["ingress"]
    assert _ports(ingress) == [("TCP", "grpc"), ("TCP", "http")]
    assert ingress["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ml-platform"}}},
        {"ipBlock": {"cidr": "10.0.0.0/8"}},
    ]
    container = _server_container(ha)
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named == {"grpc": 50051, "http": 8080}
    assert "--port=50051" in container["args"]
    assert "--metrics-port=8080" in container["args"]
    # Out: each destination the docs list, and nothing else.
    egress = [
        (sorted(json.dumps(t, sort_keys=True) for t in rule["to"]), _ports(rule)) for rule in policy["egress"]
    ]
    documented = documented_block("server-egress")
    expected = []
    for rule in documented:
        to = rule["to"]
        expected.append(
            (
                sorted(json.dumps(t, sort_keys=True) for t in to),
                [("TCP" if p != "53/UDP" else "UDP", int(str(p).split("/")[0])) for p in rule["ports"]],
            )
        )
    etcd_selector = {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/component": "etcd",
                "app.kubernetes.io/instance": "gpufed",
                "app.kubernetes.io/name": "gpufed",
            }
        }
    }
    resolved = [
        (sorted(json.dumps(etcd_selector, sort_keys=True) if t == '"etcd-pods"' else t for t in to), ports)
        for to, ports in expected
    ]
    assert egress == resolved
    # etcd: clients only from the servers, peers only from members.
    etcd = ha.one("NetworkPolicy", "gpufed-etcd")["spec"]
    assert [
        (r["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"], _ports(r))
        for r in etcd["ingress"]
    ] == [
        ("server", [("TCP", 2379)]),
        ("etcd", [("TCP", 2380)]),
    ]


def test_probes_ask_readyz_and_grpc_health_on_the_served_ports(renders: dict[str, Render]) -> None:
    single = _server_container(renders["single-sqlite"])
    assert single["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", "scheme": "HTTP"}
    assert single["livenessProbe"]["grpc"] == {"port": 50051}
    assert single["startupProbe"]["grpc"] == {"port": 50051}
    # With TLS the console is HTTPS, and the kubelet's gRPC probe (no TLS) gives way to a TCP check.
    ha = _server_container(renders["ha-postgresql"])
    assert ha["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert ha["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert "--tls-cert=/etc/gpufed/tls/tls.crt" in ha["args"]


def test_values_schema_is_strict_where_it_matters() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    def strict(node: dict[str, Any], path: str) -> Iterator[str]:
        if node.get("type") == "object" and "properties" in node:
            if node.get("additionalProperties") is not False:
                yield path
            for key, child in node["properties"].items():
                yield from strict(child, f"{path}.{key}")

    loose = [p for p in strict(schema, "") if p not in ("",)]
    assert loose == []
    assert schema["additionalProperties"] is False
    assert REPO.joinpath("deploy/helm/gpufed/values.yaml").is_file()


def test_compressed_wait_reasons_are_off_unless_asked_and_then_passed_as_serve_takes_them() -> None:
    # Off by default: the release before reads only the JSON list (docs/deploy.md, the read-ahead rule).
    plain = template(_example("single-sqlite"))
    assert "--compress-wait-reasons" not in _server_container(plain)["args"]
    asked = template(_example("single-sqlite"), sets=("server.compressWaitReasons=true",))
    args = _server_container(asked)["args"]
    assert "--compress-wait-reasons" in args[args.index("serve") + 1 :]
    parsed = CliRunner().invoke(cli, [*args, "--help"])
    assert parsed.exit_code == 0, parsed.output


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        pytest.param((), 400_000, id="sized-with-the-memory-limit"),
        pytest.param(("config.policy.maxQueuedJobs=77",), 77, id="the-config-wins"),
        pytest.param(("server.maxQueuedJobs=null",), DEFAULT_MAX_QUEUED_JOBS, id="gpufeds-default"),
    ],
)
def test_the_queue_limit_is_sized_with_the_servers_memory_unless_the_config_sets_it(
    tools: None, sets: tuple[str, ...], expected: int
) -> None:
    """A default install's memory limit (2Gi) holds about 400,000 queued jobs: the chart bounds the
    queue there, so a burst is refused rather than the server killed for memory (and killed again as
    it lists the same jobs at its restart)."""
    render = template(_example("single-sqlite"), sets=sets)
    config = parse_config(render.one("ConfigMap")["data"]["federation.yaml"])
    assert config.settings.max_queued_jobs == expected
