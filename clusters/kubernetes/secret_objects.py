"""The gang's Secret: the tenant's secrets its pods reference, copied into its namespace for its life.

One Secret per attempt, named after the gang (`<gang>-secrets`), labelled as gpufed's and as the
gang's, holding each referenced secret's keys as `<secret>.<key>` (a secret's name is a DNS label,
without dots, so the split is unambiguous). The pods' templates are rewritten to read from it:

- `env[].valueFrom.secretKeyRef {name: hf, key: token}` -> `{name: <gang>-secrets, key: hf.token}`;
- `envFrom[].secretRef {name: hf, prefix: P}` -> one `env` entry per key of `hf` (`P<key>`), put before
  the container's own `env`, which therefore still wins over it, as it wins over `envFrom`;
- a `secret` volume or projected `secret` source of `hf` -> the gang's Secret with `items` that map
  each key of `hf` (or each item asked for) to the same path as before.

Its name is a function of the gang's, so the writer deletes it by name with the gang, whatever ended
the attempt, and the account needs only `create` and `delete` on Secrets: never `get` or `list`,
which would let gpufed (and whoever holds its kubeconfig) read every Secret on the cluster.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import replace
from typing import Any

from clusters.api import GangWorkload

Json = dict[str, Any]
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


def secret_object_name(gang_object_name: str) -> str:
    return f"{gang_object_name}-secrets"


def secret_manifest(gang: GangWorkload, metadata: Json) -> Json:
    """The Secret, with the gang's metadata (`manifests._metadata` of its name)."""
    data = {
        f"{s.name}.{key}": base64.b64encode(value).decode() for s in gang.secrets for key, value in s.data
    }
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": metadata, "data": data}


def _keys(secrets: dict[str, tuple[str, ...]], name: str) -> tuple[str, ...]:
    return secrets.get(name, ())


def _bind_container(container: Json, target: str, secrets: dict[str, tuple[str, ...]]) -> None:
    for entry in container.get("env") or ():
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        if ref is not None:
            ref["key"] = f"{ref.get('name')}.{ref.get('key')}"
            ref["name"] = target
    kept, expanded = [], []
    for source in container.get("envFrom") or ():
        ref = source.get("secretRef")
        if ref is None:
            kept.append(source)
            continue
        prefix = str(source.get("prefix") or "")
        for key in _keys(secrets, str(ref.get("name"))):
            # As the kubelet does for envFrom: a key that is no variable name is skipped.
            if _ENV_NAME.fullmatch(prefix + key):
                expanded.append(
                    {
                        "name": prefix + key,
                        "valueFrom": {"secretKeyRef": {"name": target, "key": f"{ref.get('name')}.{key}"}},
                    }
                )
    if expanded:
        container["env"] = expanded + list(container.get("env") or ())
    if "envFrom" in container:
        if kept:
            container["envFrom"] = kept
        else:
            del container["envFrom"]


def _bind_source(source: Json, name_field: str, target: str, secrets: dict[str, tuple[str, ...]]) -> None:
    name = str(source.get(name_field))
    items = source.get("items") or [{"key": key, "path": key} for key in _keys(secrets, name)]
    source["items"] = [{**item, "key": f"{name}.{item['key']}"} for item in items]
    source[name_field] = target


def bind_template(template: Json, target: str, secrets: dict[str, tuple[str, ...]]) -> Json:
    """The template reading from the gang's Secret `target` (`secrets`: each name's keys)."""
    spec = template.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or ():
            _bind_container(container, target, secrets)
    for volume in spec.get("volumes") or ():
        if volume.get("secret") is not None:
            _bind_source(volume["secret"], "secretName", target, secrets)
        for source in (volume.get("projected") or {}).get("sources") or ():
            if source.get("secret") is not None:
                _bind_source(source["secret"], "name", target, secrets)
    return template


def bound_gang(gang: GangWorkload, target: str) -> GangWorkload:
    """The gang with every replica's template reading from its Secret `target`."""
    if not gang.secrets:
        return gang
    keys = {s.name: tuple(k for k, _ in s.data) for s in gang.secrets}
    replicas = tuple(
        replace(
            r,
            pod_template=json.dumps(bind_template(json.loads(r.pod_template), target, keys), sort_keys=True),
        )
        if r.pod_template
        else r
        for r in gang.replicas
    )
    return replace(gang, replicas=replicas)
