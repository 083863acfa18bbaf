"""A synced Kubernetes backend on a simulated member cluster, with an official client of it: the
world of the integration tests that count the calls a gang costs (issue 33)."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from clusters.kubernetes import KubernetesBackend
from tests.integration.test_kubernetes_backend import open_world

SETUP_CALLS = ("create_namespace", "label_namespace", "create_queue", "delete_secret", "delete_service")


class Counted:
    """The backend's `KubeApi` with each of `names` counted by method name (the API is still called)."""

    def __init__(self, backend: KubernetesBackend, names: tuple[str, ...] = SETUP_CALLS) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        api = backend._api
        for name in names:
            setattr(api, name, self._wrap(name, getattr(api, name)))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            self.calls[name] += 1
            return fn(*args)

        return counted


async def sim_backend(tmp_path: Path, *, volcano: bool) -> AsyncIterator[tuple[KubernetesBackend, Any]]:
    """A synced backend on a simulated cluster (Volcano or Indexed Jobs), and an official client of it."""
    async for world in open_world(tmp_path, volcano=volcano):
        yield world.backend, world.api


@pytest.fixture(params=["indexed", "volcano"], name="world")
async def world_fixture(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[KubernetesBackend, Any]]:
    async for pair in sim_backend(tmp_path, volcano=request.param == "volcano"):
        yield pair
