"""The `capacity:` section of the federation config, read with errors that name the key.

```yaml
capacity:
  provisioner: simulated          # none (default), simulated, or pulumi
  leadTimeSeconds: 600            # how long new nodes take; plans are provisioned this far ahead
  idleTtlSeconds: 1800            # an added node idle this long is released
  spendCeilingUsdPerHour: 500     # what scalable pools may cost per hour in total
  cloudGpuLimits: {aws: 256}      # GPUs gpufed may hold per cloud (the account's quota)
  maxNodesPerPool: 16
  pulumiBackendUrl: s3://bucket   # pulumi only; default a file backend under the state dir
  clusterSettings: {aws-us-east-1: {eksCluster: prod, nodeRoleArn: arn:..., subnetIds: subnet-1}}
  retrySeconds: {base: 2, max: 300}
  simulatedBootSeconds: 5         # simulated only: how long new nodes take (default: the lead time)
```
"""

from __future__ import annotations

from typing import Any

from federation.capacity.records import CapacitySettings, ProvisionerKind
from federation.errors import InvalidSpec
from federation.spec.validate import int_field, number_field, shown
from placement.model import Provider

KEYS = (
    "provisioner",
    "leadTimeSeconds",
    "idleTtlSeconds",
    "spendCeilingUsdPerHour",
    "cloudGpuLimits",
    "maxNodesPerPool",
    "pulumiBackendUrl",
    "clusterSettings",
    "retrySeconds",
    "simulatedBootSeconds",
)
BACKEND_SCHEMES = ("file://", "s3://", "gs://", "azblob://", "https://")


def _mapping(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidSpec(field, f"must be a mapping, got {shown(value)}")
    return value


def parse_capacity(doc: dict[str, Any]) -> CapacitySettings:
    section = _mapping(doc.get("capacity"), "capacity")
    for key in section:
        if key not in KEYS:
            raise InvalidSpec(f"capacity.{key}", f"is not a capacity setting (known: {', '.join(KEYS)})")
    try:
        provisioner = ProvisionerKind(section.get("provisioner", "none"))
    except ValueError as error:
        known = ", ".join(k.value for k in ProvisionerKind)
        raise InvalidSpec("capacity.provisioner", f"must be one of {known}") from error
    ceiling = section.get("spendCeilingUsdPerHour")
    limits = []
    for name, count in _mapping(section.get("cloudGpuLimits"), "capacity.cloudGpuLimits").items():
        try:
            provider = Provider(name)
        except ValueError as error:
            raise InvalidSpec(f"capacity.cloudGpuLimits.{name}", "is not a cloud provider") from error
        limits.append((provider, int_field(count, f"capacity.cloudGpuLimits.{name}", minimum=0)))
    backend = section.get("pulumiBackendUrl", "")
    if not isinstance(backend, str) or (backend and not backend.startswith(BACKEND_SCHEMES)):
        raise InvalidSpec("capacity.pulumiBackendUrl", f"must be a URL ({', '.join(BACKEND_SCHEMES)}...)")
    cluster_settings = []
    for cluster, values in _mapping(section.get("clusterSettings"), "capacity.clusterSettings").items():
        at = f"capacity.clusterSettings.{cluster}"
        pairs = []
        for key, value in _mapping(values, at).items():
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise InvalidSpec(f"{at}.{key}", f"must be a string, got {shown(value)}")
            pairs.append((str(key), str(value)))
        cluster_settings.append((str(cluster), tuple(sorted(pairs))))
    retry = _mapping(section.get("retrySeconds"), "capacity.retrySeconds")
    base = number_field(retry.get("base", 2.0), "capacity.retrySeconds.base", minimum=0.01)
    most = number_field(retry.get("max", 300.0), "capacity.retrySeconds.max", minimum=base)
    return CapacitySettings(
        provisioner=provisioner,
        lead_time_s=number_field(section.get("leadTimeSeconds", 600), "capacity.leadTimeSeconds", minimum=0),
        idle_ttl_s=number_field(section.get("idleTtlSeconds", 1800), "capacity.idleTtlSeconds", minimum=0),
        spend_ceiling_usd_per_hour=(
            None if ceiling is None else number_field(ceiling, "capacity.spendCeilingUsdPerHour", minimum=0)
        ),
        cloud_gpu_limits=tuple(limits),
        max_nodes_per_pool=int_field(
            section.get("maxNodesPerPool", 16), "capacity.maxNodesPerPool", minimum=1
        ),
        pulumi_backend_url=backend,
        cluster_settings=tuple(cluster_settings),
        retry_base_s=base,
        retry_max_s=most,
        simulated_boot_s=(
            None
            if section.get("simulatedBootSeconds") is None
            else number_field(section["simulatedBootSeconds"], "capacity.simulatedBootSeconds", minimum=0)
        ),
    )
