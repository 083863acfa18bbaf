"""Which pools gpufed may resize, as `iac` pool specs, and the provisioner the config asks for.

A pool is scalable when its cluster says `scalable: true` and it is cloud capacity (never private).
Its floor is the count the config gives it (gpufed grows pools for waiting gangs and plans, and
shrinks them back to what the config declared, never below), its ceiling `maxNodesPerPool`. The
instance type comes from the GPU type and GPUs per node (`iac.pools.MACHINES`); a pool no known
instance carries is listed but not provisionable, with the reason.

The provisioner: `simulated` resizes simulated clusters over their Kubernetes and `/sim/v1/` APIs,
found through the same kubeconfig the server drives them with; `pulumi` is the Automation API
(the cloud identifiers come from `capacity.clusterSettings`); `none` keeps pools as they are.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from federation.capacity.records import CapacitySettings, ProvisionerKind
from federation.errors import InvalidSpec
from federation.store.records import ClusterRecord, PoolConfig
from iac.api import Provisioner
from iac.errors import InvalidPoolSpec
from iac.pools import MACHINES, REQUIRED_SETTINGS, Cloud, PoolSpec, validate
from iac.sim_http import HttpPoolResizer, SimEndpoint
from placement.model import CapacityKind, ClusterName, Provider

PoolKey = tuple[ClusterName, str]
PASSPHRASE_ENV = "PULUMI_CONFIG_PASSPHRASE"


@dataclass(frozen=True, slots=True)
class ScalablePoolEntry:
    cluster: ClusterName
    provider: Provider
    config: PoolConfig
    min_nodes: int
    max_nodes: int
    # None when gpufed cannot provision this pool (the note says why).
    spec: PoolSpec | None
    note: str = ""

    @property
    def key(self) -> PoolKey:
        return (self.cluster, self.config.name)


def _spec(record: ClusterRecord, pool: PoolConfig, settings: CapacitySettings, max_nodes: int) -> PoolSpec:
    try:
        cloud = Cloud(record.provider.value)
    except ValueError as error:
        raise InvalidPoolSpec(
            "cloud", f"gpufed provisions aws, gcp and azure, not {record.provider}"
        ) from error
    machine = next(
        (m for m in MACHINES[cloud] if m.gpu_type == pool.gpu_type and m.gpus == pool.gpus_per_node), None
    )
    if machine is None:
        raise InvalidPoolSpec(
            "instance_type", f"no known {cloud} instance has {pool.gpus_per_node} x {pool.gpu_type}"
        )
    given = dict(dict(settings.cluster_settings).get(record.name, ()))
    if settings.provisioner is ProvisionerKind.SIMULATED:
        # A simulated cluster has no cloud identifiers; the spec still has to be a valid one.
        for key in REQUIRED_SETTINGS[cloud]:
            given.setdefault(key, f"sim-{record.name}")
    spec = PoolSpec(
        cloud=cloud,
        cluster=record.name,
        name=pool.name,
        gpu_type=pool.gpu_type,
        instance_type=machine.instance_type,
        region=record.region,
        gpus_per_node=pool.gpus_per_node,
        min_nodes=0,
        max_nodes=max_nodes,
        desired_nodes=pool.node_count,
        kind=pool.kind,
        usd_per_gpu_hour=pool.usd_per_gpu_hour,
        settings=tuple(sorted(given.items())),
    )
    return validate(spec)


def scalable_pools(
    records: Sequence[ClusterRecord], settings: CapacitySettings
) -> dict[PoolKey, ScalablePoolEntry]:
    out: dict[PoolKey, ScalablePoolEntry] = {}
    for record in sorted(records, key=lambda r: r.name):
        if not record.scalable:
            continue
        for pool in record.pools:
            if pool.kind is CapacityKind.PRIVATE:
                continue
            max_nodes = max(settings.max_nodes_per_pool, pool.node_count)
            spec: PoolSpec | None = None
            note = ""
            try:
                spec = _spec(record, pool, settings, max_nodes)
            except InvalidPoolSpec as error:
                note = f"not provisionable: {error}"
            entry = ScalablePoolEntry(
                record.name, record.provider, pool, pool.node_count, max_nodes, spec, note
            )
            out[entry.key] = entry
    return out


def _sim_endpoint(record: ClusterRecord) -> SimEndpoint:
    """The cluster's API URL and token from its kubeconfig context (the simulator wrote both)."""
    if record.kubeconfig is None:
        raise InvalidSpec(f"clusters.{record.name}.kubeconfig", "a simulated scalable cluster needs one")
    doc: dict[str, Any] = yaml.safe_load(Path(record.kubeconfig).read_text()) or {}
    context_name = record.context or doc.get("current-context")
    context = next((c["context"] for c in doc.get("contexts", []) if c.get("name") == context_name), None)
    if context is None:
        raise InvalidSpec(f"clusters.{record.name}.context", f"{context_name!r} is not in the kubeconfig")
    cluster = next(c["cluster"] for c in doc.get("clusters", []) if c.get("name") == context["cluster"])
    user = next(
        (u.get("user") or {} for u in doc.get("users", []) if u.get("name") == context.get("user")), {}
    )
    return SimEndpoint(str(cluster["server"]), user.get("token"))


def build_provisioner(
    settings: CapacitySettings, records: Sequence[ClusterRecord], *, state_dir: Path
) -> Provisioner | None:
    """The provisioner the settings name, or None for `none`. Errors name the config key."""
    if settings.provisioner is ProvisionerKind.NONE:
        return None
    if settings.provisioner is ProvisionerKind.SIMULATED:
        from iac.simulated import SimulatedProvisioner

        endpoints: dict[str, SimEndpoint] = {
            r.name: _sim_endpoint(r) for r in records if r.scalable and r.backend == "kubernetes"
        }
        boot_s = settings.lead_time_s if settings.simulated_boot_s is None else settings.simulated_boot_s
        return SimulatedProvisioner(HttpPoolResizer(endpoints), lead_time_s=boot_s)
    passphrase = os.environ.get(PASSPHRASE_ENV)
    if not passphrase:
        raise InvalidSpec(
            "capacity.provisioner", f"pulumi needs the stack passphrase in the environment ({PASSPHRASE_ENV})"
        )
    from iac.automation import PulumiProvisioner

    return PulumiProvisioner(
        state_dir=state_dir / "pulumi",
        passphrase=passphrase,
        backend_url=settings.pulumi_backend_url or None,
        lead_time_s=settings.lead_time_s,
    )
