"""The federation config: the shipped default parses, and mistakes name their field."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from federation.errors import InvalidSpec
from federation.runtime.config import parse_config
from federation.runtime.embedded import default_config_path
from federation.scheduling.members import MemberClusters, kubernetes_config
from federation.spec.validate import name_field
from placement.model import CapacityKind, GpuType


def test_the_shipped_default_parses() -> None:
    config = parse_config(default_config_path().read_text())
    assert {t.name for t in config.tenants} >= {"vision", "nlp"}
    assert {u.role.value for u in config.users} >= {"admin", "member"}
    assert len(config.clusters) == 3
    users = {u.name: u for u in config.users}
    assert users["ivan"].max_priority_class == "normal", "the intern's limit is kept"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param("- a\n", "config", id="not-a-mapping"),
        pytest.param("tenants: [{name: Bad_Name}]", "tenants[0].name", id="tenant-name"),
        pytest.param(
            "tenants: [{name: a}]\nusers: [{name: u, tenant: b}]", "users[0].tenant", id="user-unknown-tenant"
        ),
        pytest.param(
            "tenants: [{name: a}]\nusers: [{name: u, tenant: a, role: god}]", "users[0].role", id="role"
        ),
        pytest.param(
            "tenants: [{name: a}]\nusers: [{name: u, tenant: a, maxPriorityClass: royal}]",
            "users[0].maxPriorityClass",
            id="user-max-class",
        ),
        pytest.param("clusters: [{name: c, provider: mars}]", "clusters[0].provider", id="provider"),
        pytest.param(
            "clusters: [{name: c, provider: aws, pools: [{name: p, gpuType: A100, kind: on_demand, "
            "usdPerGpuHour: -1, gpusPerNode: 8, nodes: 1}]}]",
            "clusters[0].pools[0].usdPerGpuHour",
            id="negative-price",
        ),
        pytest.param(
            "clusters: [{name: c, provider: aws, backend: eks}]", "clusters[0].backend", id="backend"
        ),
        pytest.param(
            "clusters: [{name: c, provider: aws, backend: kubernetes}]",
            "clusters[0].kubeconfig",
            id="kubeconfig",
        ),
        pytest.param(
            "clusters: [{name: c, provider: aws, backend: sim, timeScale: fast}]",
            "clusters[0].timeScale",
            id="sim-time-scale",
        ),
        pytest.param(
            "clusters: [{name: c, provider: aws, scalable: maybe}]", "clusters[0].scalable", id="flag"
        ),
    ],
)
def test_config_errors_name_the_field(text: str, field: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_config(text)
    assert caught.value.field == field


SIM_CLUSTER = """
clusters:
  - name: onprem
    backend: sim
    provider: private
    volcano: false
    timeScale: 2
    pools: [{name: a100, gpuType: A100, kind: private, usdPerGpuHour: 1.1, gpusPerNode: 8, nodes: 2}]
  - name: real
    backend: kubernetes
    kubeconfig: /etc/gpufed/real.kubeconfig
    context: prod
    provider: aws
    scalable: true
    pools: [{name: h100, gpuType: H100, kind: on_demand, usdPerGpuHour: 6.88, gpusPerNode: 8, nodes: 1}]
"""


def test_sim_clusters_become_kubernetes_clusters_behind_the_simulators_kubeconfig(tmp_path: Path) -> None:
    config = parse_config(SIM_CLUSTER)
    # The simulator gets the entry as written, with its own keys (timeScale) kept.
    assert [c["name"] for c in config.simulated] == ["onprem"]
    assert config.simulated[0]["timeScale"] == 2
    started = config.with_simulators_at(tmp_path / "kubeconfig")
    onprem, real = started.clusters
    assert (onprem.backend, onprem.kubeconfig, onprem.context) == (
        "kubernetes",
        str(tmp_path / "kubeconfig"),
        "onprem",
    )
    assert onprem.volcano is False
    assert started.simulated == ()
    assert real == config.clusters[1]
    assert (real.kubeconfig, real.context, real.scalable) == ("/etc/gpufed/real.kubeconfig", "prod", True)


def test_a_kubernetes_record_gives_the_backend_its_prices_kubeconfig_and_a_silence_threshold() -> None:
    real = parse_config(SIM_CLUSTER).clusters[1]
    backend = kubernetes_config(real)
    assert backend.kubeconfig == Path("/etc/gpufed/real.kubeconfig")
    assert backend.context == "prod"
    assert backend.price(GpuType("H100"), CapacityKind.ON_DEMAND) == 6.88
    assert backend.scalable
    assert backend.settings.use_volcano is None  # where the cluster serves it
    # The default grace (120 s) is detected after the backend's own 30 s ceiling; a short one sooner.
    assert backend.settings.unreachable_after_s == 30.0
    short = kubernetes_config(replace(real, unreachable_grace_s=4.0, volcano=False))
    assert short.settings.unreachable_after_s == 1.0
    assert short.settings.use_volcano is False


def test_a_record_with_a_backend_no_server_can_drive_is_refused_by_name() -> None:
    sim = parse_config(SIM_CLUSTER).clusters[0]
    with pytest.raises(ValueError, match=r"onprem.*'sim' cannot be served"):
        MemberClusters.build([sim], state_dir=None)


@pytest.mark.parametrize("value", ["alice\n", "alice\r\n", "\nalice", "alice\x00", " alice", "nlp\n"])
def test_a_name_with_a_trailing_newline_or_other_stray_character_is_refused(value: str) -> None:
    """`^...$` with re.match accepts "alice\\n" (`$` matches before a final newline): names are
    checked whole, so a user "alice\\n" can never sit beside "alice"."""
    with pytest.raises(InvalidSpec, match="must be a DNS label"):
        name_field(value, "name")
    with pytest.raises(InvalidSpec) as caught:
        parse_config(yaml.safe_dump({"tenants": [{"name": value}]}))
    assert caught.value.field == "tenants[0].name"
    clean = value.strip(" \r\n\x00")
    assert name_field(clean, "name") == clean
