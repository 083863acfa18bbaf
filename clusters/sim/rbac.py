"""Authentication by ServiceAccount token and RBAC authorization, as a real API server does them.

The simulator's own token (or none, when it has none) is the cluster admin, as before: every
existing test and kubeconfig keeps working. A bearer token held by a `kubernetes.io/service-account-
token` Secret authenticates as `system:serviceaccount:<namespace>:<name>`, and its requests are
decided by Roles, ClusterRoles and their bindings, following "Using RBAC Authorization" in the
Kubernetes documentation: rules only grant (no deny), a ClusterRoleBinding grants everywhere, a
RoleBinding only in its namespace, `*` matches any group, resource or verb, `*/sub` any resource's
subresource, `resourceNames` limit a rule to named objects. Everybody authenticated may read
discovery and the version (`system:discovery`, `system:public-info-viewer`) and ask
SelfSubjectAccessReviews (`system:basic-user`). A refusal is a 403 `Forbidden` Status worded as
kube-apiserver words it. SelfSubjectAccessReviews are answered from the same rules.

This is why `gpufed cluster join`'s tests can show that gpufed works with no more than it asks for.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any

from clusters.sim.errors import ApiError
from clusters.sim.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    SELF_SUBJECT_ACCESS_REVIEWS,
    SERVICE_ACCOUNTS,
    lookup,
)
from clusters.sim.store import Store

Obj = dict[str, Any]
SA_TOKEN_TYPE = "kubernetes.io/service-account-token"
SA_NAME_ANNOTATION = "kubernetes.io/service-account.name"
SA_UID_ANNOTATION = "kubernetes.io/service-account.uid"
# Non-resource URLs every authenticated account may GET (system:discovery, public-info-viewer).
_OPEN_PREFIXES = ("/api", "/apis", "/version", "/openapi", "/healthz", "/livez", "/readyz")


@dataclass(frozen=True, slots=True)
class User:
    name: str
    groups: tuple[str, ...]
    # The cluster's own credentials: not subject to RBAC (system:masters).
    admin: bool = False
    namespace: str = ""
    service_account: str = ""


ADMIN = User("kubernetes-admin", ("system:masters", "system:authenticated"), admin=True)


@dataclass(frozen=True, slots=True)
class Attributes:
    """What RBAC decides on: a resource request, or a non-resource path."""

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    @property
    def is_resource(self) -> bool:
        return bool(self.resource)


def authenticate(store: Store, admin_token: str | None, authorization: str | None) -> User | None:
    """The caller, or None when the credentials are refused (401)."""
    # The scheme is case-insensitive (the client's in-cluster loader writes "bearer").
    scheme, _, credentials = (authorization or "").partition(" ")
    presented = credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None
    if presented is not None and presented == admin_token:
        return ADMIN
    if presented is None:
        # No credentials: the admin of a cluster without a token, as before RBAC; else refused.
        return ADMIN if admin_token is None else None
    user = _service_account(store, presented)
    # A cluster without a token of its own took any credentials before RBAC, and still does.
    return user if user is not None or admin_token is not None else ADMIN


def _service_account(store: Store, presented: str) -> User | None:
    for secret in store.list(SECRETS, None):
        if secret.get("type") != SA_TOKEN_TYPE:
            continue
        token = (secret.get("data") or {}).get("token")
        if not token or _decode(token) != presented:
            continue
        meta = secret["metadata"]
        namespace = meta.get("namespace", "")
        account = (meta.get("annotations") or {}).get(SA_NAME_ANNOTATION, "")
        if store.get(SERVICE_ACCOUNTS, namespace, account) is None:
            # The token controller removes a deleted account's tokens; until then they are dead.
            return None
        return User(
            f"system:serviceaccount:{namespace}:{account}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
            namespace=namespace,
            service_account=account,
        )
    return None


def _decode(value: str) -> str:
    try:
        return base64.b64decode(value).decode()
    except ValueError:
        return ""


def fill_token(secret: Obj) -> None:
    """The token controller, at admission: a service-account-token Secret gets its token at once."""
    if secret.get("type") != SA_TOKEN_TYPE:
        return
    data = secret.setdefault("data", {}) or {}
    secret["data"] = data
    if not data.get("token"):
        data["token"] = base64.b64encode(secrets.token_urlsafe(32).encode()).decode()
    data.setdefault("namespace", base64.b64encode(secret["metadata"]["namespace"].encode()).decode())
    data.setdefault("ca.crt", "")


def attributes(method: str, path: str, query: Any) -> Attributes:
    """The request as RBAC sees it (the server's own path grammar, `namespaces/<ns>/<plural>/...`)."""
    verb_of = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"] and len(parts) > 2:
        group, version, tail = "", "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) > 3:
        group, version, tail = parts[1], parts[2], parts[3:]
    else:
        return Attributes(verb=method.lower(), path=path)
    namespace = ""
    if len(tail) >= 3 and tail[0] == "namespaces" and lookup(group, version, tail[2]) is not None:
        namespace, tail = tail[1], tail[2:]
    resource, name = tail[0], (tail[1] if len(tail) > 1 else "")
    sub = tail[2] if len(tail) > 2 else ""
    if method == "GET":
        watching = str(query.get("watch", "")) in ("true", "1")
        verb = "get" if name else ("watch" if watching else "list")
    elif method == "DELETE" and not name:
        verb = "deletecollection"
    else:
        verb = verb_of.get(method, method.lower())
    return Attributes(verb, group, resource, sub, namespace, name)


def _subject_matches(subject: Obj, user: User) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        return (
            subject.get("name") == user.service_account
            and subject.get("namespace") == user.namespace
            and bool(user.service_account)
        )
    if kind == "User":
        return subject.get("name") == user.name
    if kind == "Group":
        return subject.get("name") in user.groups
    return False


def _rule_allows(rule: Obj, a: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and a.verb not in verbs:
        return False
    if not a.is_resource:
        urls = rule.get("nonResourceURLs") or []
        return any(u == a.path or u == "*" or (u.endswith("*") and a.path.startswith(u[:-1])) for u in urls)
    groups = rule.get("apiGroups") or []
    if "*" not in groups and a.group not in groups:
        return False
    wanted = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    resources = rule.get("resources") or []
    if not any(r in ("*", wanted) or (a.subresource and r == f"*/{a.subresource}") for r in resources):
        return False
    names = rule.get("resourceNames") or []
    return not names or a.name in names


def _role_rules(store: Store, ref: Obj, namespace: str) -> list[Obj]:
    if ref.get("kind") == "ClusterRole":
        role = store.get(CLUSTER_ROLES, "", ref.get("name", ""))
    elif ref.get("kind") == "Role":
        role = store.get(ROLES, namespace, ref.get("name", ""))
    else:
        role = None
    return list((role or {}).get("rules") or [])


def _built_in(a: Attributes) -> bool:
    if not a.is_resource:
        return a.verb == "get" and a.path.startswith(_OPEN_PREFIXES)
    return (a.group, a.resource, a.verb) == ("authorization.k8s.io", "selfsubjectaccessreviews", "create")


def allowed(store: Store, user: User, a: Attributes) -> bool:
    """RBAC's answer: some rule of some binding that names the user grants the request."""
    if user.admin or _built_in(a):
        return True
    for binding in store.list(CLUSTER_ROLE_BINDINGS, None):
        if any(_subject_matches(s, user) for s in binding.get("subjects") or []) and any(
            _rule_allows(rule, a) for rule in _role_rules(store, binding.get("roleRef") or {}, "")
        ):
            return True
    if not a.namespace:
        return False
    for binding in store.list(ROLE_BINDINGS, a.namespace):
        if any(_subject_matches(s, user) for s in binding.get("subjects") or []) and any(
            _rule_allows(rule, a) for rule in _role_rules(store, binding.get("roleRef") or {}, a.namespace)
        ):
            return True
    return False


def forbidden(user: User, a: Attributes) -> ApiError:
    """403 as kube-apiserver words it, naming the verb, resource, group and scope."""
    if not a.is_resource:
        return ApiError(
            403, "Forbidden", f'forbidden: User "{user.name}" cannot {a.verb} path "{a.path}"', {}
        )
    wanted = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    target = f"{a.resource}{'.' + a.group if a.group else ''}"
    subject = f'{target} "{a.name}"' if a.name else target
    scope = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{user.name}" cannot {a.verb} resource "{wanted}" '
        f'in API group "{a.group}" {scope}'
    )
    details: Obj = {"kind": a.resource}
    if a.group:
        details["group"] = a.group
    if a.name:
        details["name"] = a.name
    return ApiError(403, "Forbidden", message, details)


def authorize(store: Store, user: User, method: str, path: str, query: Any) -> None:
    a = attributes(method, path, query)
    if not allowed(store, user, a):
        raise forbidden(user, a)


def review(store: Store, user: User, body: Any) -> Obj:
    """A SelfSubjectAccessReview answered for the caller (201, never stored)."""
    spec = (body or {}).get("spec") or {} if isinstance(body, dict) else {}
    resource = spec.get("resourceAttributes")
    non_resource = spec.get("nonResourceAttributes")
    if isinstance(resource, dict):
        a = Attributes(
            verb=str(resource.get("verb") or ""),
            group=str(resource.get("group") or ""),
            resource=str(resource.get("resource") or ""),
            subresource=str(resource.get("subresource") or ""),
            namespace=str(resource.get("namespace") or ""),
            name=str(resource.get("name") or ""),
        )
    elif isinstance(non_resource, dict):
        a = Attributes(verb=str(non_resource.get("verb") or ""), path=str(non_resource.get("path") or ""))
    else:
        raise ApiError(
            422,
            "Invalid",
            'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: '
            "Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )
    ok = allowed(store, user, a) if a.is_resource or a.path else False
    status: Obj = {"allowed": ok}
    if ok and not user.admin:
        status["reason"] = "RBAC: allowed by a binding of the account"
    return {
        "kind": SELF_SUBJECT_ACCESS_REVIEWS.kind,
        "apiVersion": SELF_SUBJECT_ACCESS_REVIEWS.api_version,
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": status,
    }


__all__ = ["ADMIN", "ROLE_BINDINGS", "User", "allowed", "authenticate", "authorize", "fill_token", "review"]
