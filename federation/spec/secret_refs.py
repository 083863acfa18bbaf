"""A job's references to its tenant's secrets: the short form `secretEnv`, and every place in a pod
template that names a Secret.

Every Secret a template names is one of the tenant's gpufed secrets (docs/jobs.md, "Secrets"): a job
may run on any member cluster, and a Secret made there by hand would exist on some clusters and not
others. The places are a container's `env[].valueFrom.secretKeyRef`, its `envFrom[].secretRef`, a
`secret` volume and a projected volume's `secret` source, in containers and init containers alike.
`imagePullSecrets` are not gpufed secrets: they name pull secrets on the member cluster (not checked).

This module only parses and finds the references; whether each exists in the job's own tenant is
checked at submission (`federation.api.secrets_check`), and the dispatcher copies them to the member
cluster (`clusters.kubernetes.secret_objects`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from federation.errors import InvalidSpec
from federation.spec.pod_template import owned_env_name
from federation.spec.validate import name_field, shown

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
MAX_SECRET_ENV = 64
_SECRET_ENV_KEYS = ("name", "secret", "key")


@dataclass(frozen=True, slots=True)
class SecretRef:
    """One reference: the secret, the key it reads ("" for all of them), and where it is written."""

    secret: str
    key: str
    field: str
    # Kubernetes' `optional`: a missing key is no error. The secret itself must exist all the same.
    optional: bool = False


def parse_secret_env(raw: object, path: str, *, taken: set[str]) -> list[dict[str, Any]]:
    """`secretEnv: [{name, secret, key}]` as the Kubernetes env entries it stands for.

    `taken`: the main container's other variable names (the short `env`, the template's), which a
    secret variable may not repeat."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_SECRET_ENV:
        raise InvalidSpec(
            path, f"must be a list of at most {MAX_SECRET_ENV} {{name, secret, key}}, got {shown(raw, 60)}"
        )
    out = []
    seen = set(taken)
    for i, item in enumerate(raw):
        at = f"{path}[{i}]"
        if not isinstance(item, dict):
            raise InvalidSpec(at, f"must be a mapping {{name, secret, key}}, got {shown(item, 60)}")
        for key in item:
            if key not in _SECRET_ENV_KEYS:
                raise InvalidSpec(f"{at}.{key}", "unknown field; an entry has name, secret and key")
        for key in _SECRET_ENV_KEYS:
            if key not in item:
                raise InvalidSpec(f"{at}.{key}", "is required")
        name = item["name"]
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise InvalidSpec(
                f"{at}.name", f"must be a variable name ([A-Za-z_][A-Za-z0-9_]*), got {shown(name)}"
            )
        if owned_env_name(name):
            raise InvalidSpec(f"{at}.name", f"{name} is set by gpufed, which owns the rendezvous environment")
        if name in seen:
            raise InvalidSpec(f"{at}.name", f"duplicate variable {name} (the task sets it already)")
        seen.add(name)
        secret = name_field(item["secret"], f"{at}.secret")
        key = item["key"]
        if not isinstance(key, str) or not _SECRET_KEY.fullmatch(key) or len(key) > 253:
            raise InvalidSpec(
                f"{at}.key", f"must be a secret's key (letters, digits, '-', '_', '.'), got {shown(key)}"
            )
        out.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return out


def with_secret_env(
    template: dict[str, Any] | None,
    raw: object,
    path: str,
    *,
    task: str,
    short_env: tuple[tuple[str, str], ...],
) -> dict[str, Any] | None:
    """The task's template with `secretEnv` added to its main container's env (a template is made for
    a short-form task that has none: one container named after the task, as the short form makes)."""
    if raw is None:
        return template
    main_env = [] if template is None else template["spec"]["containers"][0].get("env") or []
    taken = {n for n, _ in short_env} | {str(e.get("name")) for e in main_env}
    entries = parse_secret_env(raw, path, taken=taken)
    if not entries:
        return template
    made: dict[str, Any] = template if template is not None else {"spec": {"containers": [{"name": task}]}}
    main: dict[str, Any] = made["spec"]["containers"][0]
    main["env"] = list(main.get("env") or []) + entries
    return made


def _env_refs(container: dict[str, Any], at: str) -> Iterator[SecretRef]:
    for j, entry in enumerate(container.get("env") or ()):
        ref = ((entry.get("valueFrom") or {}).get("secretKeyRef")) or None
        if ref is not None:
            yield SecretRef(
                str(ref.get("name") or ""),
                str(ref.get("key") or ""),
                f"{at}.env[{j}].valueFrom.secretKeyRef",
                bool(ref.get("optional")),
            )
    for j, entry in enumerate(container.get("envFrom") or ()):
        ref = entry.get("secretRef")
        if ref is not None:
            yield SecretRef(
                str(ref.get("name") or ""), "", f"{at}.envFrom[{j}].secretRef", bool(ref.get("optional"))
            )


def template_refs(template: dict[str, Any], path: str = "template") -> Iterator[SecretRef]:
    """Every Secret the template names, with the field that names it."""
    spec = template.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or ()):
            yield from _env_refs(container, f"{path}.spec.{kind}[{i}]")
    for i, volume in enumerate(spec.get("volumes") or ()):
        at = f"{path}.spec.volumes[{i}]"
        secret = volume.get("secret")
        if secret is not None:
            optional = bool(secret.get("optional"))
            name = str(secret.get("secretName") or "")
            items = secret.get("items") or ()
            if not items:
                yield SecretRef(name, "", f"{at}.secret", optional)
            for j, item in enumerate(items):
                yield SecretRef(name, str(item.get("key") or ""), f"{at}.secret.items[{j}]", optional)
        for j, source in enumerate((volume.get("projected") or {}).get("sources") or ()):
            projected = source.get("secret")
            if projected is None:
                continue
            optional = bool(projected.get("optional"))
            name = str(projected.get("name") or "")
            items = projected.get("items") or ()
            if not items:
                yield SecretRef(name, "", f"{at}.projected.sources[{j}].secret", optional)
            for k, item in enumerate(items):
                yield SecretRef(
                    name,
                    str(item.get("key") or ""),
                    f"{at}.projected.sources[{j}].secret.items[{k}]",
                    optional,
                )


def task_refs(template_json: str, path: str) -> list[SecretRef]:
    """The references of a stored task template (compact JSON, "" for none)."""
    if not template_json:
        return []
    return list(template_refs(json.loads(template_json), path))
