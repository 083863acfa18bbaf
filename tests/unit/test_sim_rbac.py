"""The simulator's RBAC decides as "Using RBAC Authorization" (kubernetes.io) says it does.

Rules only grant; a ClusterRoleBinding grants everywhere, a RoleBinding only in its namespace (also
when it refers to a ClusterRole); `*` matches any group, resource or verb; `resourceNames` limits a
rule to named objects; a subresource (`pods/log`) is granted only by naming it. ServiceAccount tokens
authenticate only while their account exists; the simulator's own token stays the admin.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest

from clusters.sim import rbac
from clusters.sim.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    NAMESPACES,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    SERVICE_ACCOUNTS,
)
from clusters.sim.store import Store

SA = {"kind": "ServiceAccount", "name": "robot", "namespace": "ops"}
TOKEN = "robot-token"


def _obj(name: str, namespace: str | None = None, **rest: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"metadata": meta, **rest}


def _world(*objects: tuple[Any, dict[str, Any]]) -> Store:
    store = Store(time.time)
    for ns in ("ops", "team-a", "team-b"):
        store.create(NAMESPACES, _obj(ns))
    store.create(SERVICE_ACCOUNTS, _obj("robot", "ops"))
    secret = _obj("robot-token", "ops", type=rbac.SA_TOKEN_TYPE)
    secret["metadata"]["annotations"] = {rbac.SA_NAME_ANNOTATION: "robot"}
    secret["data"] = {"token": base64.b64encode(TOKEN.encode()).decode()}
    store.create(SECRETS, secret)
    for rt, obj in objects:
        store.create(rt, obj)
    return store


def _robot(store: Store) -> rbac.User:
    user = rbac.authenticate(store, "admin-token", f"Bearer {TOKEN}")
    assert user is not None
    return user


def _rule(groups: list[str], resources: list[str], verbs: list[str], **rest: Any) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **rest}


def _cluster_grant(*rules: dict[str, Any]) -> tuple[tuple[Any, dict[str, Any]], ...]:
    return (
        (CLUSTER_ROLES, _obj("r", rules=list(rules))),
        (CLUSTER_ROLE_BINDINGS, _obj("b", roleRef={"kind": "ClusterRole", "name": "r"}, subjects=[SA])),
    )


def _a(verb: str, resource: str, namespace: str = "", group: str = "", **rest: str) -> rbac.Attributes:
    return rbac.Attributes(verb=verb, group=group, resource=resource, namespace=namespace, **rest)


CASES = [
    (
        "cluster-binding-grants-everywhere",
        _cluster_grant(_rule([""], ["pods"], ["list"])),
        _a("list", "pods", "team-a"),
        True,
    ),
    (
        "cluster-binding-grants-all-namespaces",
        _cluster_grant(_rule([""], ["pods"], ["list"])),
        _a("list", "pods"),
        True,
    ),
    (
        "other-verb-refused",
        _cluster_grant(_rule([""], ["pods"], ["list"])),
        _a("delete", "pods", "team-a"),
        False,
    ),
    (
        "other-group-refused",
        _cluster_grant(_rule([""], ["jobs"], ["create"])),
        _a("create", "jobs", "team-a", "batch"),
        False,
    ),
    (
        "wildcard-verb",
        _cluster_grant(_rule(["batch"], ["jobs"], ["*"])),
        _a("patch", "jobs", "team-a", "batch"),
        True,
    ),
    (
        "wildcard-group-and-resource",
        _cluster_grant(_rule(["*"], ["*"], ["get"])),
        _a("get", "nodes", name="n1"),
        True,
    ),
    (
        "subresource-needs-naming",
        _cluster_grant(_rule([""], ["pods"], ["get"])),
        _a("get", "pods", "team-a", subresource="log", name="p"),
        False,
    ),
    (
        "subresource-named",
        _cluster_grant(_rule([""], ["pods/log"], ["get"])),
        _a("get", "pods", "team-a", subresource="log", name="p"),
        True,
    ),
    (
        "star-slash-subresource",
        _cluster_grant(_rule([""], ["*/log"], ["get"])),
        _a("get", "pods", "team-a", subresource="log", name="p"),
        True,
    ),
    (
        "resource-names-match",
        _cluster_grant(_rule([""], ["nodes"], ["get"], resourceNames=["n1"])),
        _a("get", "nodes", name="n1"),
        True,
    ),
    (
        "resource-names-other",
        _cluster_grant(_rule([""], ["nodes"], ["get"], resourceNames=["n1"])),
        _a("get", "nodes", name="n2"),
        False,
    ),
    (
        "resource-names-no-list",
        _cluster_grant(_rule([""], ["nodes"], ["list"], resourceNames=["n1"])),
        _a("list", "nodes"),
        False,
    ),
    (
        "role-binding-only-its-namespace",
        (
            (ROLES, _obj("r", "team-a", rules=[_rule([""], ["pods"], ["list"])])),
            (ROLE_BINDINGS, _obj("b", "team-a", roleRef={"kind": "Role", "name": "r"}, subjects=[SA])),
        ),
        _a("list", "pods", "team-b"),
        False,
    ),
    (
        "role-binding-in-its-namespace",
        (
            (ROLES, _obj("r", "team-a", rules=[_rule([""], ["pods"], ["list"])])),
            (ROLE_BINDINGS, _obj("b", "team-a", roleRef={"kind": "Role", "name": "r"}, subjects=[SA])),
        ),
        _a("list", "pods", "team-a"),
        True,
    ),
    (
        "role-binding-to-cluster-role-is-namespaced",
        (
            (CLUSTER_ROLES, _obj("r", rules=[_rule([""], ["secrets"], ["get"])])),
            (ROLE_BINDINGS, _obj("b", "team-a", roleRef={"kind": "ClusterRole", "name": "r"}, subjects=[SA])),
        ),
        _a("get", "secrets", "team-b", name="s"),
        False,
    ),
    (
        "role-binding-no-cluster-scope",
        (
            (CLUSTER_ROLES, _obj("r", rules=[_rule([""], ["pods"], ["list"])])),
            (ROLE_BINDINGS, _obj("b", "team-a", roleRef={"kind": "ClusterRole", "name": "r"}, subjects=[SA])),
        ),
        _a("list", "pods"),
        False,
    ),
    (
        "group-subject",
        (
            (CLUSTER_ROLES, _obj("r", rules=[_rule([""], ["nodes"], ["list"])])),
            (
                CLUSTER_ROLE_BINDINGS,
                _obj(
                    "b",
                    roleRef={"kind": "ClusterRole", "name": "r"},
                    subjects=[{"kind": "Group", "name": "system:serviceaccounts:ops"}],
                ),
            ),
        ),
        _a("list", "nodes"),
        True,
    ),
    (
        "other-account-not-granted",
        (
            (CLUSTER_ROLES, _obj("r", rules=[_rule([""], ["nodes"], ["list"])])),
            (
                CLUSTER_ROLE_BINDINGS,
                _obj("b", roleRef={"kind": "ClusterRole", "name": "r"}, subjects=[{**SA, "name": "other"}]),
            ),
        ),
        _a("list", "nodes"),
        False,
    ),
    ("nothing-bound", (), _a("list", "nodes"), False),
    ("discovery-open", (), rbac.Attributes(verb="get", path="/apis"), True),
    ("access-review-open", (), _a("create", "selfsubjectaccessreviews", group="authorization.k8s.io"), True),
]


@pytest.mark.parametrize(
    ("objects", "attributes", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rbac_decides(objects: Any, attributes: rbac.Attributes, expected: bool) -> None:
    store = _world(*objects)
    assert rbac.allowed(store, _robot(store), attributes) is expected


def test_review_answers_from_the_same_rules() -> None:
    store = _world(*_cluster_grant(_rule(["batch"], ["jobs"], ["create"])))
    robot = _robot(store)
    spec = {"resourceAttributes": {"group": "batch", "resource": "jobs", "verb": "create", "namespace": "x"}}
    assert rbac.review(store, robot, {"spec": spec})["status"]["allowed"] is True
    spec["resourceAttributes"]["verb"] = "delete"
    assert rbac.review(store, robot, {"spec": spec})["status"]["allowed"] is False


def test_forbidden_is_worded_as_kube_apiserver_words_it() -> None:
    store = _world()
    error = rbac.forbidden(_robot(store), _a("delete", "nodes", name="n1"))
    assert error.code == 403
    assert error.message == (
        'nodes "n1" is forbidden: User "system:serviceaccount:ops:robot" cannot delete resource "nodes" '
        'in API group "" at the cluster scope'
    )
    scoped = rbac.forbidden(_robot(store), _a("create", "jobs", "team-a", "batch.volcano.sh"))
    assert scoped.message.endswith(
        'cannot create resource "jobs" in API group "batch.volcano.sh" in the namespace "team-a"'
    )


@pytest.mark.parametrize(
    ("admin_token", "header", "who"),
    [
        ("admin-token", "Bearer admin-token", "kubernetes-admin"),
        ("admin-token", f"Bearer {TOKEN}", "system:serviceaccount:ops:robot"),
        ("admin-token", "Bearer wrong", None),
        ("admin-token", None, None),
        (None, None, "kubernetes-admin"),
    ],
    ids=["admin", "service-account", "unknown-token", "no-credentials", "open-cluster"],
)
def test_authentication(admin_token: str | None, header: str | None, who: str | None) -> None:
    user = rbac.authenticate(_world(), admin_token, header)
    assert (user.name if user else None) == who


def test_a_deleted_accounts_token_no_longer_authenticates() -> None:
    store = _world()
    store.remove(SERVICE_ACCOUNTS, "ops", "robot")
    assert rbac.authenticate(store, "admin-token", f"Bearer {TOKEN}") is None


def test_the_token_controller_fills_a_service_account_token_secret() -> None:
    secret = _obj("t", "ops", type=rbac.SA_TOKEN_TYPE)
    rbac.fill_token(secret)
    assert len(base64.b64decode(secret["data"]["token"])) >= 32
    other = _obj("o", "ops", type="Opaque")
    rbac.fill_token(other)
    assert "data" not in other
