"""The federation's configuration file: tenants, users and member clusters.

`gpufed up` and `gpufed serve --bootstrap` read it and seed etcd with it (`federation.runtime.bootstrap`);
after that etcd is the source of truth. Errors name the offending field like manifest errors do.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from clusters.sim.config import SimConfigError, from_mapping
from federation.capacity.config import parse_capacity
from federation.capacity.records import CapacitySettings
from federation.datasets.executor import DatasyncSettings, parse_datasync
from federation.datasets.stores import StoreRecord, check_cluster_stores, parse_object_stores
from federation.errors import InvalidSpec
from federation.history.config import HistorySettings, parse_history
from federation.joblogs.archive import LogsSettings, parse_logs
from federation.spec.validate import flag_field, int_field, name_field, number_field
from federation.store.config_policy import check_tenant_tree, parse_settings, parse_tenant
from federation.store.records import (
    ClusterRecord,
    PoolConfig,
    Role,
    SchedulingSettings,
    TenantRecord,
    UserRecord,
)
from placement.model import CapacityKind, ClusterName, GpuType, Provider, TenantId

# memory: in-process simulation (unit tests); kubernetes: a real API server through a kubeconfig;
# sim: a simulated Kubernetes cluster that `gpufed up` starts, then drives as kubernetes.
BACKENDS = ("memory", "kubernetes", "sim")


@dataclass(frozen=True, slots=True)
class FederationConfig:
    tenants: tuple[TenantRecord, ...]
    users: tuple[UserRecord, ...]
    clusters: tuple[ClusterRecord, ...]
    # The config entries of the clusters with `backend: sim`, as written (the simulator reads the
    # same keys), for `gpufed up` to start; validated when the config is read.
    simulated: tuple[dict[str, Any], ...] = field(default=())
    settings: SchedulingSettings = field(default_factory=SchedulingSettings)
    # The `objectStores:` section: where datasets live and are cached (see federation.datasets.stores).
    object_stores: tuple[StoreRecord, ...] = field(default=())
    # The `capacity:` section: provisioner, lead time, idle TTL, limits (federation.capacity.config).
    capacity: CapacitySettings = field(default_factory=CapacitySettings)
    # The `logs:` section: kept logs' size and retention, limits of `gpufed logs`
    # (federation.joblogs.archive).
    logs: LogsSettings = field(default_factory=LogsSettings)
    # The `datasync:` section: where staging's copies run (federation.datasets.executor).
    datasync: DatasyncSettings = field(default_factory=DatasyncSettings)
    # The `history:` section: the history database's DSN and how long ended jobs stay in etcd
    # (federation.history.config), and the leader's archiver's switch, batch and rate.
    history: HistorySettings = field(default_factory=HistorySettings)

    def with_simulators_at(self, kubeconfig: Path) -> FederationConfig:
        """The config once its simulated clusters serve: each is a kubernetes cluster from now on,
        reached through the simulator's kubeconfig, one context per cluster named after it."""
        clusters = tuple(
            replace(c, backend="kubernetes", kubeconfig=str(kubeconfig), context=c.name)
            if c.backend == "sim"
            else c
            for c in self.clusters
        )
        return replace(self, clusters=clusters, simulated=())


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key) or []
    if not isinstance(value, list):
        raise InvalidSpec(key, "must be a list")
    return value


def _optional_text(value: Any, field: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidSpec(field, f"must be a string, got {value!r}")
    return value


def parse_config(text: str) -> FederationConfig:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InvalidSpec("config", f"is not valid YAML: {error}") from error
    if not isinstance(doc, dict):
        raise InvalidSpec("config", "must be a mapping with tenants, users and clusters")

    settings = parse_settings(doc)
    class_names = [c.name for c in settings.priority_classes]
    tenants = [
        parse_tenant(t, f"tenants[{i}]", priority_classes=class_names)
        for i, t in enumerate(_list(doc, "tenants"))
    ]
    check_tenant_tree(tenants)
    tenant_names = {t.name for t in tenants}

    users = []
    for i, u in enumerate(_list(doc, "users")):
        at = f"users[{i}]"
        tenant = name_field(u.get("tenant"), f"{at}.tenant")
        if tenant not in tenant_names:
            raise InvalidSpec(f"{at}.tenant", f"tenant {tenant!r} is not defined under tenants")
        try:
            role = Role(u.get("role", "member"))
        except ValueError as error:
            raise InvalidSpec(f"{at}.role", f"must be one of {[r.value for r in Role]}") from error
        max_class = u.get("maxPriorityClass")
        if max_class is not None and max_class not in class_names:
            raise InvalidSpec(f"{at}.maxPriorityClass", f"{max_class!r} is not a priority class")
        users.append(
            UserRecord(
                name=name_field(u.get("name"), f"{at}.name"),
                tenant=TenantId(tenant),
                role=role,
                max_priority_class=max_class,
            )
        )

    clusters = []
    simulated: list[dict[str, Any]] = []
    for i, c in enumerate(_list(doc, "clusters")):
        at = f"clusters[{i}]"
        try:
            provider = Provider(c.get("provider"))
        except ValueError as error:
            raise InvalidSpec(f"{at}.provider", f"must be one of {[p.value for p in Provider]}") from error
        pools = []
        for j, p in enumerate(c.get("pools") or []):
            pat = f"{at}.pools[{j}]"
            try:
                kind = CapacityKind(p.get("kind"))
            except ValueError as error:
                raise InvalidSpec(
                    f"{pat}.kind", f"must be one of {[k.value for k in CapacityKind]}"
                ) from error
            reclaims = number_field(p.get("reclaimsPerNodeHour", 0), f"{pat}.reclaimsPerNodeHour", minimum=0)
            if reclaims > 0 and kind is not CapacityKind.SPOT:
                raise InvalidSpec(
                    f"{pat}.reclaimsPerNodeHour", f"applies to spot pools only; this pool is {kind.value}"
                )
            pools.append(
                PoolConfig(
                    name=name_field(p.get("name"), f"{pat}.name"),
                    gpu_type=GpuType(str(p.get("gpuType"))),
                    kind=kind,
                    usd_per_gpu_hour=number_field(p.get("usdPerGpuHour"), f"{pat}.usdPerGpuHour", minimum=0),
                    gpus_per_node=int_field(p.get("gpusPerNode"), f"{pat}.gpusPerNode", minimum=1),
                    node_count=int_field(p.get("nodes"), f"{pat}.nodes", minimum=0),
                    reclaims_per_node_hour=reclaims,
                )
            )
        backend = c.get("backend", "memory")
        if backend not in BACKENDS:
            raise InvalidSpec(f"{at}.backend", f"must be one of {list(BACKENDS)}, got {backend!r}")
        if backend == "sim":
            try:
                from_mapping(c, at)
            except SimConfigError as error:
                # The simulator's messages start with the field's path: keep the one path.
                path, _, rule = str(error).partition(" ")
                raise InvalidSpec(path, rule) from error
            simulated.append(dict(c))
        kubeconfig = c.get("kubeconfig")
        if backend == "kubernetes" and not isinstance(kubeconfig, str):
            raise InvalidSpec(f"{at}.kubeconfig", "is required for a kubernetes cluster: a kubeconfig path")
        clusters.append(
            ClusterRecord(
                name=ClusterName(name_field(c.get("name"), f"{at}.name")),
                provider=provider,
                region=str(c.get("region", "")),
                pools=tuple(pools),
                backend=backend,
                object_store=c.get("objectStore"),
                kubeconfig=kubeconfig,
                context=_optional_text(c.get("context"), f"{at}.context"),
                scalable=flag_field(c.get("scalable", False), f"{at}.scalable"),
                volcano=flag_field(c.get("volcano", True), f"{at}.volcano"),
                unreachable_grace_s=number_field(
                    c.get("unreachableGraceSeconds", 120), f"{at}.unreachableGraceSeconds", minimum=0
                ),
            )
        )
    object_stores = parse_object_stores(doc)
    check_cluster_stores([(c.name, c.object_store) for c in clusters], object_stores)
    return FederationConfig(
        tenants=tuple(tenants),
        users=tuple(users),
        clusters=tuple(clusters),
        simulated=tuple(simulated),
        settings=settings,
        object_stores=object_stores,
        capacity=parse_capacity(doc),
        datasync=parse_datasync(doc),
        logs=parse_logs(doc),
        history=parse_history(doc),
    )


def load_config(path: Path) -> FederationConfig:
    return parse_config(path.read_text())
