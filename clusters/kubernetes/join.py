"""Making gpufed's own account on a member cluster, with the cluster admin's credentials.

`gpufed cluster join` calls `join`: in the namespace `gpufed` (never a tenant's: those are
`gpufed-<tenant>`), a ServiceAccount, a long-lived token for it, a ClusterRole holding exactly
`permissions.PERMISSIONS` and a ClusterRoleBinding to the account. Every step creates, or on a
second join updates (the role's rules: a newer gpufed may need one more verb), never duplicates.

The token is a `kubernetes.io/service-account-token` Secret rather than a TokenRequest: a
TokenRequest token expires (the API server caps it, often at a day or less) and a kubeconfig cannot
renew it, while gpufed drives the cluster for months. The Secret's token lives until the Secret or the
account is deleted, which is also how an operator revokes it; joining again after deleting the Secret
rotates it. The admin credentials are used for these calls only and never stored.
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from clusters.kubernetes.errors import NO_ANSWER, reason_of
from clusters.kubernetes.kube import MERGE_PATCH, Json, api_client, call, json_of
from clusters.kubernetes.permissions import cluster_role_rules

MANAGED = {"app.kubernetes.io/managed-by": "gpufed"}
SA_TOKEN_TYPE = "kubernetes.io/service-account-token"


class JoinFailed(Exception):
    """The admin's credentials could not make the account; the message says which step and why."""


@dataclass(frozen=True, slots=True)
class JoinNames:
    namespace: str = "gpufed"
    account: str = "gpufed"
    secret: str = "gpufed-token"
    role: str = "gpufed-member"
    binding: str = "gpufed-member"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"


@dataclass(frozen=True, slots=True)
class Joined:
    server: str
    token: str
    # The cluster's CA (PEM, base64) when the admin kubeconfig had one; else the TLS setting it had.
    ca_data: str | None
    insecure: bool
    names: JoinNames
    created: tuple[str, ...] = field(default=())
    updated: tuple[str, ...] = field(default=())


class _Admin:
    def __init__(self, client: Any, timeout_s: float) -> None:
        self.client = client
        self._timeout = (min(5.0, timeout_s), timeout_s)

    def request(self, method: str, path: str, body: Json | None = None, *, patch: bool = False) -> Json:
        return json_of(
            call(
                self.client,
                method,
                path,
                timeout=self._timeout,
                body=body,
                content_type=MERGE_PATCH if patch else "application/json",
            )
        )


def _ensure(
    admin: _Admin, kind: str, collection: str, body: Json, update: Json | None, done: dict[str, list[str]]
) -> None:
    """Create, or when it exists apply `update` (a merge patch) to it."""
    name = body["metadata"]["name"]
    what = f"{kind} {name}"
    try:
        admin.request("POST", collection, body)
        done["created"].append(what)
        return
    except ApiException as error:
        if error.status != 409:
            raise JoinFailed(f"could not create {what}: HTTP {error.status} {reason_of(error)}") from error
    if update is not None:
        try:
            admin.request("PATCH", f"{collection}/{name}", update, patch=True)
        except ApiException as error:
            raise JoinFailed(f"could not update {what}: HTTP {error.status} {reason_of(error)}") from error
        done["updated"].append(what)


def join(
    admin_kubeconfig: Path, context: str | None, names: JoinNames = JoinNames(), *, timeout_s: float = 30.0
) -> Joined:
    """Make (or update) the account; its token once the token controller has filled it in."""
    try:
        client = api_client(admin_kubeconfig, context, pool_size=2)
    except Exception as error:  # the client raises ConfigException, OSError or YAML errors
        raise JoinFailed(f"cannot load the admin kubeconfig {admin_kubeconfig}: {error}") from error
    admin = _Admin(client, timeout_s)
    done: dict[str, list[str]] = {"created": [], "updated": []}
    ns = names.namespace
    try:
        _ensure(
            admin,
            "namespace",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": MANAGED}},
            None,
            done,
        )
        _ensure(
            admin,
            "serviceaccount",
            f"/api/v1/namespaces/{ns}/serviceaccounts",
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": names.account, "labels": MANAGED},
            },
            None,
            done,
        )
        _ensure(
            admin,
            "secret",
            f"/api/v1/namespaces/{ns}/secrets",
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": SA_TOKEN_TYPE,
                "metadata": {
                    "name": names.secret,
                    "labels": MANAGED,
                    "annotations": {"kubernetes.io/service-account.name": names.account},
                },
            },
            None,
            done,
        )
        rules = cluster_role_rules()
        _ensure(
            admin,
            "clusterrole",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": names.role, "labels": MANAGED},
                "rules": rules,
            },
            {"rules": rules},
            done,
        )
        subjects = [{"kind": "ServiceAccount", "name": names.account, "namespace": ns}]
        _ensure(
            admin,
            "clusterrolebinding",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": names.binding, "labels": MANAGED},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": names.role,
                },
                "subjects": subjects,
            },
            {"subjects": subjects},
            done,
        )
        secret = _token_secret(admin, names, timeout_s)
    except NO_ANSWER as error:
        raise JoinFailed(
            f"the cluster's API at {client.configuration.host} did not answer: {error}"
        ) from error
    finally:
        client.close()
    configuration = client.configuration
    ca_path = configuration.ssl_ca_cert
    ca_data = base64.b64encode(Path(ca_path).read_bytes()).decode() if ca_path else None
    if ca_data is None and (secret.get("data") or {}).get("ca.crt"):
        ca_data = str(secret["data"]["ca.crt"])
    return Joined(
        server=str(configuration.host),
        token=base64.b64decode(secret["data"]["token"]).decode(),
        ca_data=ca_data,
        insecure=not configuration.verify_ssl,
        names=names,
        created=tuple(done["created"]),
        updated=tuple(done["updated"]),
    )


def _token_secret(admin: _Admin, names: JoinNames, timeout_s: float) -> Json:
    path = f"/api/v1/namespaces/{names.namespace}/secrets/{names.secret}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            secret = admin.request("GET", path)
        except ApiException as error:
            raise JoinFailed(
                f"could not read secret {names.secret}: HTTP {error.status} {reason_of(error)}"
            ) from error
        if secret.get("type") != SA_TOKEN_TYPE:
            raise JoinFailed(
                f"secret {names.namespace}/{names.secret} exists but is not a {SA_TOKEN_TYPE}: "
                "delete it or choose another name"
            )
        if (secret.get("data") or {}).get("token"):
            return secret
        if time.monotonic() >= deadline:
            raise JoinFailed(
                f"the token controller did not fill secret {names.namespace}/{names.secret} "
                f"in {timeout_s:.0f} s"
            )
        time.sleep(0.2)


def kubeconfig(joined: Joined, cluster: str) -> Json:
    """A kubeconfig with one context: the cluster's API as the joined account."""
    entry: Json = {"server": joined.server}
    if joined.ca_data:
        entry["certificate-authority-data"] = joined.ca_data
    elif joined.insecure:
        entry["insecure-skip-tls-verify"] = True
    user = f"{joined.names.user.replace(':', '-')}@{cluster}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": entry}],
        "users": [{"name": user, "user": {"token": joined.token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }


def write_private(path: Path, doc: Json) -> None:
    """The kubeconfig holds a token: mode 0600 from its first byte, replaced whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(doc, sort_keys=False))
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)
