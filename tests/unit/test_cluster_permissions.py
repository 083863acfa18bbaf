"""The cluster client asks for nothing beyond `clusters.kubernetes.permissions.PERMISSIONS`.

The client's calls all go through `kube.call` (or `KubeApi._json`, which calls it) with the method
and the path written out; this walks the package's code, evaluates every such pair and checks that
the list covers it. A call added later with no entry in the list, or one whose path cannot be read
from the code, fails here.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import pytest

from clusters.kubernetes import permissions
from clusters.kubernetes.kube import KubeApi, ListPath
from clusters.kubernetes.permissions import (
    PERMISSIONS,
    Request,
    covering,
    granted_to_everyone,
    is_discovery,
    request_of,
)

PACKAGE = Path(permissions.__file__).parent
# Functions that pass a path they were given (the informers' ListPaths) rather than one of their own.
GENERIC = {("kube", "_json"), ("kube", "watch"), ("kube", "list_page")}
# `gpufed cluster join` runs with the cluster admin's credentials, to make the account: not the client.
ADMIN_SIDE = {"join"}


def _evaluate(node: ast.expr, namespace: dict[str, Any]) -> str | None:
    if isinstance(node, ast.Constant | ast.JoinedStr):
        # Through its source text: compiling a node of the parsed tree again trips CPython 3.11's
        # "AST constructor recursion depth mismatch" in some processes.
        value = eval(ast.unparse(node), namespace)
        return str(value)
    return None


def _calls_in_code() -> list[tuple[str, str, str, str]]:
    """(module, function, method, path) for every request the package's code makes."""
    found: list[tuple[str, str, str, str]] = []
    for source in sorted(PACKAGE.glob("*.py")):
        module = source.stem
        if module in ADMIN_SIDE:
            continue
        namespace = vars(importlib.import_module(f"clusters.kubernetes.{module}"))
        tree = ast.parse(source.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef):
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.Call):
                    continue
                callee = node.func
                if isinstance(callee, ast.Name) and callee.id == "call":
                    args = node.args[1:3]
                elif isinstance(callee, ast.Attribute) and callee.attr == "_json":
                    args = node.args[0:2]
                else:
                    continue
                method, path = (_evaluate(a, namespace) for a in args)
                if method is None or path is None:
                    assert (module, func.name) in GENERIC, (
                        f"{module}.{func.name} makes a request whose method or path is not written out: "
                        "write it out, so this test can check it against the permission list"
                    )
                    continue
                found.append((module, func.name, method, path))
    return found


# Walked once, at collection: CPython 3.11's parser can fail with "AST constructor recursion depth
# mismatch" when called after some other tests have run in the same process.
CALLS = _calls_in_code()


def test_the_walk_finds_the_clients_calls() -> None:
    # A walk that found nothing would pass every check below.
    paths = {(method, path) for _, _, method, path in CALLS}
    assert ("POST", "/api/v1/namespaces") in paths
    assert ("GET", "/api/v1/namespaces/{namespace}/pods/{name}/log") in paths
    assert len(paths) >= 15


@pytest.mark.parametrize(
    ("module", "function", "method", "path"), CALLS, ids=lambda v: str(v).replace("/", "_")
)
def test_every_call_is_in_the_list(module: str, function: str, method: str, path: str) -> None:
    if is_discovery(path) or granted_to_everyone(request_of(method, path)):
        return
    request = request_of(method, path)
    assert covering(request) is not None, (
        f"{module}.{function} calls {method} {path} ({request}), which PERMISSIONS does not grant"
    )


@pytest.mark.parametrize(
    "path", [v for k, v in vars(KubeApi).items() if k.startswith("list_") and isinstance(v, str)]
)
def test_every_informer_collection_may_be_listed_and_watched(path: ListPath) -> None:
    for watch in (False, True):
        request = request_of("GET", path, watch=watch)
        assert covering(request) is not None, f"an informer reads {path} ({request}), not in PERMISSIONS"


def test_no_call_bypasses_kube_call() -> None:
    # The generated API classes, or the ApiClient's own call_api, would escape the walk above.
    for source in PACKAGE.glob("*.py"):
        text = source.read_text()
        for bypass in ("V1Api(", "CustomObjectsApi") + (
            ("call_api(", "param_serialize(") if source.stem != "kube" else ()
        ):
            assert bypass not in text, f"{source.name} uses {bypass}"


def test_every_entry_is_used() -> None:
    # The list grants nothing the client does not call: an entry nobody uses is privilege to spare.
    used: set[tuple[str, str, str, str]] = set()
    requests = [
        request_of(m, p)
        for _, _, m, p in CALLS
        if not is_discovery(p) and not granted_to_everyone(request_of(m, p))
    ]
    for path in (KubeApi.list_nodes, KubeApi.list_pods, KubeApi.list_jobs, KubeApi.list_volcano_jobs):
        requests += [request_of("GET", path), request_of("GET", path, watch=True)]
    for request in requests:
        p = covering(request)
        assert p is not None
        used.add((p.group, p.resource_path, request.verb, p.scope.value))
    granted = {(p.group, p.resource_path, v, p.scope.value) for p in PERMISSIONS for v in p.verbs}
    assert granted - used == set()


@pytest.mark.parametrize(
    ("method", "path", "watch", "expected"),
    [
        ("GET", "/api/v1/pods", True, Request("", "pods", "", "watch", False)),
        ("GET", "/api/v1/nodes", False, Request("", "nodes", "", "list", False)),
        ("GET", "/api/v1/namespaces/a/pods/p/log", False, Request("", "pods", "log", "get", True)),
        ("DELETE", "/apis/batch/v1/namespaces/a/jobs/j", False, Request("batch", "jobs", "", "delete", True)),
        (
            "DELETE",
            "/apis/batch/v1/namespaces/a/jobs",
            False,
            Request("batch", "jobs", "", "deletecollection", True),
        ),
        ("PATCH", "/apis/batch/v1/namespaces/a/jobs/j", False, Request("batch", "jobs", "", "patch", True)),
        ("POST", "/api/v1/namespaces", False, Request("", "namespaces", "", "create", False)),
    ],
    ids=["watch-pods", "list-nodes", "pod-log", "delete-job", "deletecollection", "patch", "create-ns"],
)
def test_request_of(method: str, path: str, watch: bool, expected: Request) -> None:
    assert request_of(method, path, watch=watch) == expected


def test_rules_hold_exactly_the_list() -> None:
    rules = permissions.cluster_role_rules()
    granted: set[tuple[str, str, str]] = set()
    for r in rules:
        groups, resources, verbs = r["apiGroups"], r["resources"], r["verbs"]
        assert isinstance(groups, list)
        assert isinstance(resources, list)
        assert isinstance(verbs, list)
        granted |= {(groups[0], resources[0], v) for v in verbs}
    assert granted == {(p.group, p.resource_path, v) for p in PERMISSIONS for v in p.verbs}
    assert all("*" not in str(r) for r in rules)
