"""What the target cluster offers, read through kubectl, so GPU cases skip where a cluster has no GPUs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.contract.kube.kubectl import Kubectl


def nodes(kubectl: Kubectl) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
    return items


def gpu_nodes(kubectl: Kubectl, at_least: int) -> list[str]:
    """Schedulable nodes with at least `at_least` allocatable GPUs; skips the case if there are none."""
    found = [
        n["metadata"]["name"]
        for n in nodes(kubectl)
        if int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) >= at_least
        and not n["spec"].get("unschedulable")
    ]
    if not found:
        pytest.skip(f"the cluster has no schedulable node with {at_least} GPUs")
    return sorted(found)


def pod(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any] | None:
    result = kubectl.run("get", "pod", name, "-n", ns, "-o", "json", check=False)
    if result.returncode != 0:
        if "NotFound" in result.stderr or "not found" in result.stderr:
            return None
        raise AssertionError(result.stderr)
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def pods(kubectl: Kubectl, ns: str, selector: str | None = None) -> list[dict[str, Any]]:
    args = ["get", "pods", "-n", ns, "-o", "json"]
    if selector:
        args += ["-l", selector]
    items: list[dict[str, Any]] = json.loads(kubectl(*args))["items"]
    return items


def has_resource(kubectl: Kubectl, name: str) -> bool:
    return name in kubectl("api-resources", "-o", "name").split()
