"""Spot's reclaim rate and the placer's spot rules reach the leader from the federation config, are
kept in etcd, and a wrong value is refused naming its field."""

from __future__ import annotations

import pytest

from clusters.kubernetes.inventory import NodeInfo, cluster_state
from federation.errors import InvalidSpec
from federation.runtime.config import parse_config
from federation.runtime.embedded import default_config_path
from federation.store.config_policy import parse_settings
from federation.store.records import cluster_from_dict, cluster_to_dict, settings_from_dict, settings_to_dict
from placement.model import CapacityKind, ClusterName, GpuType, Provider

SPOT_CLUSTER = """
clusters:
  - name: aws
    provider: aws
    pools:
      - {name: a100-spot, gpuType: A100, kind: spot, usdPerGpuHour: 0.31, gpusPerNode: 8, nodes: 2,
         reclaimsPerNodeHour: 0.05}
      - {name: a100-od, gpuType: A100, kind: on_demand, usdPerGpuHour: 2.74, gpusPerNode: 8, nodes: 2}
"""


def test_a_spot_pools_reclaim_rate_reaches_the_placer_and_survives_etcd() -> None:
    (cluster,) = parse_config(SPOT_CLUSTER).clusters
    spot, on_demand = cluster.pools
    assert (spot.kind, spot.reclaims_per_node_hour) == (CapacityKind.SPOT, 0.05)
    assert on_demand.reclaims_per_node_hour == 0.0
    assert spot.with_free((8, 8)).restart_risk_per_hour == 0.05
    assert cluster_from_dict(cluster_to_dict(cluster)) == cluster


def test_a_cluster_stored_before_reclaim_rates_reads_as_none() -> None:
    (cluster,) = parse_config(SPOT_CLUSTER).clusters
    stored = cluster_to_dict(cluster)
    for pool in stored["pools"]:
        del pool["reclaims_per_node_hour"]
    assert [p.reclaims_per_node_hour for p in cluster_from_dict(stored).pools] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        ("kind: spot, reclaimsPerNodeHour: -0.1", "reclaimsPerNodeHour"),
        ("kind: spot, reclaimsPerNodeHour: often", "reclaimsPerNodeHour"),
        ("kind: on_demand, reclaimsPerNodeHour: 0.05", "spot pools only"),
    ],
)
def test_a_bad_reclaim_rate_is_refused_naming_it(pool: str, message: str) -> None:
    text = (
        "clusters: [{name: c, provider: aws, pools: [{name: p, gpuType: A100, "
        f"{pool}, usdPerGpuHour: 1, gpusPerNode: 8, nodes: 1}}]}}]"
    )
    with pytest.raises(InvalidSpec, match=message) as caught:
        parse_config(text)
    assert "clusters[0].pools[0].reclaimsPerNodeHour" in str(caught.value)


def test_the_spot_rules_are_set_by_name_and_survive_etcd() -> None:
    settings = parse_settings({"policy": {"spotMaxRestartSlowdown": 0.3, "preferPrivate": True}})
    assert (settings.policy.spot_max_restart_slowdown, settings.policy.prefer_private) == (0.3, True)
    assert settings_from_dict(settings_to_dict(settings)).policy == settings.policy
    off = parse_settings({"policy": {}}).policy
    assert (off.spot_max_restart_slowdown, off.prefer_private) == (None, False)


@pytest.mark.parametrize(("key", "value"), [("spotMaxRestartSlowdown", -1), ("preferPrivate", "yes")])
def test_a_bad_spot_rule_is_refused_naming_it(key: str, value: object) -> None:
    with pytest.raises(InvalidSpec, match=rf"policy\.{key}"):
        parse_settings({"policy": {key: value}})


def test_the_shipped_config_prices_spot_reclaims_and_takes_idle_private_gpus_first() -> None:
    config = parse_config(default_config_path().read_text())
    spot = [p for c in config.clusters for p in c.pools if p.kind is CapacityKind.SPOT]
    assert spot, "the shipped config has spot pools"
    assert all(p.reclaims_per_node_hour > 0 for p in spot)
    assert config.settings.policy.prefer_private is True


def test_the_kubernetes_backend_gives_spot_pools_their_reclaim_rate() -> None:
    # What a member cluster reports reaches the placer with the config's rate for its spot pools.
    def node(name: str, kind: CapacityKind) -> NodeInfo:
        return NodeInfo(name, f"a100-{kind.value}", None, "NVIDIA-A100", GpuType("A100"), kind, 8, None, True)

    prices = {(GpuType("A100"), CapacityKind.SPOT): 0.31, (GpuType("A100"), CapacityKind.ON_DEMAND): 2.74}
    state = cluster_state(
        name=ClusterName("aws"),
        provider=Provider.AWS,
        region="us-east-1",
        object_store=None,
        prices=prices,
        nodes=[node("n1", CapacityKind.SPOT), node("n2", CapacityKind.ON_DEMAND)],
        pods=[],
        reachable=True,
        reclaims={(GpuType("A100"), CapacityKind.SPOT): 0.05},
    )
    assert {p.kind: p.restart_risk_per_hour for p in state.pools} == {
        CapacityKind.SPOT: 0.05,
        CapacityKind.ON_DEMAND: 0.0,
    }
