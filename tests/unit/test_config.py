"""The federation config: the shipped default parses, and mistakes name their field."""

from __future__ import annotations

import pytest

from federation.config import parse_config
from federation.embedded import default_config_path
from federation.errors import InvalidSpec


def test_the_shipped_default_parses() -> None:
    config = parse_config(default_config_path().read_text())
    assert {t.name for t in config.tenants} >= {"vision", "nlp"}
    assert {u.role.value for u in config.users} >= {"admin", "member"}
    assert len(config.clusters) == 3


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
        pytest.param("clusters: [{name: c, provider: mars}]", "clusters[0].provider", id="provider"),
        pytest.param(
            "clusters: [{name: c, provider: aws, pools: [{name: p, gpuType: A100, kind: on_demand, "
            "usdPerGpuHour: -1, gpusPerNode: 8, nodes: 1}]}]",
            "clusters[0].pools[0].usdPerGpuHour",
            id="negative-price",
        ),
    ],
)
def test_config_errors_name_the_field(text: str, field: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_config(text)
    assert caught.value.field == field
