"""The `capacity:` config section: defaults, every key, errors that name the key; the pool catalogue
and the provisioner each setting selects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.capacity.config import parse_capacity
from federation.capacity.pools import build_provisioner, scalable_pools
from federation.capacity.records import (
    CapacitySettings,
    ProvisionerKind,
    settings_from_dict,
    settings_to_dict,
)
from federation.errors import InvalidSpec
from federation.runtime.config import load_config
from federation.runtime.embedded import default_config_path
from federation.store.records import ClusterRecord, PoolConfig
from iac.automation import PulumiProvisioner
from iac.simulated import SimulatedProvisioner
from placement.model import CapacityKind, ClusterName, GpuType, Provider


def test_no_section_means_no_provisioner() -> None:
    assert parse_capacity({}) == CapacitySettings()


def test_every_key_is_read_and_survives_etcd() -> None:
    settings = parse_capacity(
        {
            "capacity": {
                "provisioner": "pulumi",
                "leadTimeSeconds": 300,
                "idleTtlSeconds": 900,
                "spendCeilingUsdPerHour": 250.5,
                "cloudGpuLimits": {"aws": 64, "gcp": 8},
                "maxNodesPerPool": 4,
                "pulumiBackendUrl": "s3://state-bucket",
                "clusterSettings": {"aws-1": {"eksCluster": "prod", "subnetIds": "subnet-1,subnet-2"}},
                "retrySeconds": {"base": 1, "max": 60},
                "simulatedBootSeconds": 5,
            }
        }
    )
    assert settings.provisioner is ProvisionerKind.PULUMI
    assert (settings.lead_time_s, settings.idle_ttl_s, settings.spend_ceiling_usd_per_hour) == (
        300,
        900,
        250.5,
    )
    assert dict(settings.cloud_gpu_limits) == {Provider.AWS: 64, Provider.GCP: 8}
    assert settings.cluster_settings == (
        ("aws-1", (("eksCluster", "prod"), ("subnetIds", "subnet-1,subnet-2"))),
    )
    assert (settings.retry_base_s, settings.retry_max_s, settings.simulated_boot_s) == (1, 60, 5)
    assert settings_from_dict(settings_to_dict(settings)) == settings


@pytest.mark.parametrize(
    ("section", "key"),
    [
        pytest.param({"provisioner": "terraform"}, "capacity.provisioner", id="provisioner"),
        pytest.param({"leadTimeSeconds": -1}, "capacity.leadTimeSeconds", id="lead-negative"),
        pytest.param({"idleTtlSeconds": "soon"}, "capacity.idleTtlSeconds", id="ttl-text"),
        pytest.param({"spendCeilingUsdPerHour": -5}, "capacity.spendCeilingUsdPerHour", id="ceiling"),
        pytest.param({"cloudGpuLimits": {"oracle": 8}}, "capacity.cloudGpuLimits.oracle", id="cloud"),
        pytest.param({"cloudGpuLimits": {"aws": 1.5}}, "capacity.cloudGpuLimits.aws", id="limit"),
        pytest.param({"cloudGpuLimits": [8]}, "capacity.cloudGpuLimits", id="limits-list"),
        pytest.param({"maxNodesPerPool": 0}, "capacity.maxNodesPerPool", id="max-nodes"),
        pytest.param({"pulumiBackendUrl": "ftp://x"}, "capacity.pulumiBackendUrl", id="backend"),
        pytest.param({"clusterSettings": {"c": {"k": [1]}}}, "capacity.clusterSettings.c.k", id="setting"),
        pytest.param({"retrySeconds": {"base": 10, "max": 1}}, "capacity.retrySeconds.max", id="retry"),
        pytest.param({"leadTime": 5}, "capacity.leadTime", id="unknown-key"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(section: dict[str, Any], key: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_capacity({"capacity": section})
    assert refused.value.field == key


def test_the_embedded_default_provisions_its_simulated_cloud_pools() -> None:
    config = load_config(default_config_path())
    assert config.capacity.provisioner is ProvisionerKind.SIMULATED
    pools = scalable_pools(config.clusters, config.capacity)
    assert {c for c, _ in pools} == {"aws-us-east-1", "gcp-us-east4"}  # the private cluster never grows
    assert all(e.spec is not None for e in pools.values())
    h100 = pools[(ClusterName("aws-us-east-1"), "h100-od")]
    assert (h100.min_nodes, h100.max_nodes, h100.spec and h100.spec.instance_type) == (2, 16, "p5.48xlarge")


def _cluster(tmp_path: Path, gpus_per_node: int = 8) -> ClusterRecord:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "aws-1", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "aws-1", "user": {"token": "t"}}],
                "contexts": [{"name": "aws-1", "context": {"cluster": "aws-1", "user": "aws-1"}}],
            }
        )
    )
    pool = PoolConfig("h100-od", GpuType("H100"), CapacityKind.ON_DEMAND, 6.88, gpus_per_node, 2)
    return ClusterRecord(
        ClusterName("aws-1"),
        Provider.AWS,
        "us-east-1",
        (pool,),
        backend="kubernetes",
        kubeconfig=str(kubeconfig),
        context="aws-1",
        scalable=True,
    )


def test_a_pool_no_known_instance_carries_is_listed_but_not_provisioned(tmp_path: Path) -> None:
    settings = CapacitySettings(provisioner=ProvisionerKind.SIMULATED)
    (entry,) = scalable_pools([_cluster(tmp_path, gpus_per_node=3)], settings).values()
    assert entry.spec is None
    assert "instance_type" in entry.note


def test_the_setting_selects_the_provisioner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [_cluster(tmp_path)]
    assert build_provisioner(CapacitySettings(), records, state_dir=tmp_path) is None
    simulated = CapacitySettings(provisioner=ProvisionerKind.SIMULATED)
    assert isinstance(build_provisioner(simulated, records, state_dir=tmp_path), SimulatedProvisioner)
    pulumi = CapacitySettings(provisioner=ProvisionerKind.PULUMI, pulumi_backend_url="s3://bucket")
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    with pytest.raises(InvalidSpec) as refused:
        build_provisioner(pulumi, records, state_dir=tmp_path)
    assert refused.value.field == "capacity.provisioner"
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "secret")
    assert isinstance(build_provisioner(pulumi, records, state_dir=tmp_path), PulumiProvisioner)
