"""What a server imports to start: not the Kubernetes client when no member is on Kubernetes, not
Alembic when the history database is already migrated, not numpy (reports import it when they run).
Together they were about a third of what a restart spent before its listing began (issue 19,
docs/architecture.md "Restart to serving")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from clusters.memory import InMemoryCluster
from federation.scheduling.members import _kubernetes_backends


def _modules_after(code: str) -> set[str]:
    """Top-level packages loaded in a fresh interpreter after `code` ran."""
    script = f"import sys\n{code}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_server_and_the_command_line_import_neither_kubernetes_alembic_nor_numpy() -> None:
    loaded = _modules_after("import federation.cli.main, federation.runtime.server, federation.runtime.serve")
    assert "federation" in loaded  # the probe itself works
    assert "kubernetes" not in loaded
    assert "alembic" not in loaded
    assert "numpy" not in loaded


def test_the_kubernetes_package_still_exports_its_backend_on_first_use() -> None:
    loaded = _modules_after("from clusters.kubernetes import KubernetesBackend, KubernetesClusterConfig")
    assert "kubernetes" in loaded
    import clusters.kubernetes as package

    with pytest.raises(AttributeError):
        _ = package.NoSuchThing


def test_the_members_kubernetes_backends_are_found_among_the_others() -> None:
    # The members' start and close wait on their Kubernetes backends only: found by class, once
    # the backend's module is loaded (as `build` loads it for a Kubernetes record).
    from clusters.kubernetes.backend import KubernetesBackend

    memory = InMemoryCluster.__new__(InMemoryCluster)
    kube = KubernetesBackend.__new__(KubernetesBackend)
    assert _kubernetes_backends([memory, kube, memory]) == [kube]
    assert _kubernetes_backends([memory]) == []
