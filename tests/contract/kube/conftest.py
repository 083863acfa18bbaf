"""Fixtures of the Kubernetes conformance suite: a target cluster, kubectl and the official client.

`target` is shared by a module's cases (each works in a namespace of its own); `fresh_target` is a
cluster of its own for the cases that cordon, drain or delete nodes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.kube.kubectl import KUBECTL, Kubectl
from tests.contract.kube.official_client import OfficialClient, ensure_client_venv
from tests.contract.kube.target import KubeTarget, real_target, simulator_process

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


@pytest.fixture(scope="session")
def client_python() -> Path:
    return ensure_client_venv()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeTarget]:
    real = real_target()
    if real is not None:
        yield real
        return
    with simulator_process(tmp_path_factory.mktemp("sim")) as sim:
        yield sim


@pytest.fixture
def fresh_target(tmp_path: Path) -> Iterator[KubeTarget]:
    real = real_target()
    if real is not None:
        if not real.may_change_nodes:
            pytest.skip("set GPUFED_TEST_KUBE_ALLOW_NODE_CHANGES=1 to cordon, drain and delete real nodes")
        yield real
        return
    with simulator_process(tmp_path) as sim:
        yield sim


@pytest.fixture
def kubectl(target: KubeTarget, tmp_path: Path) -> Kubectl:
    return Kubectl(target, tmp_path / "kubectl-cache")


@pytest.fixture
def fresh_kubectl(fresh_target: KubeTarget, tmp_path: Path) -> Kubectl:
    return Kubectl(fresh_target, tmp_path / "kubectl-cache-fresh")


@pytest.fixture
def official(target: KubeTarget, client_python: Path) -> OfficialClient:
    return OfficialClient(client_python, target)


@pytest.fixture
def fresh_official(fresh_target: KubeTarget, client_python: Path) -> OfficialClient:
    return OfficialClient(client_python, fresh_target)


def _namespace(kubectl: Kubectl) -> Iterator[str]:
    name = f"conf-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def ns(kubectl: Kubectl) -> Iterator[str]:
    """A namespace of the case's own, made with `kubectl create namespace` (itself under test)."""
    yield from _namespace(kubectl)


@pytest.fixture
def fresh_ns(fresh_kubectl: Kubectl) -> Iterator[str]:
    yield from _namespace(fresh_kubectl)
