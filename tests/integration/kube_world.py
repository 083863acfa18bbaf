"""A synced Kubernetes backend on a simulated member cluster, with an official client of it: the
world of the integration tests that count the calls a gang costs (issue 33)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config as k8s_config

from clusters.kubernetes import KubernetesBackend
from tests.contract.conftest import POOLS, kube_config
from tests.contract.simulated import running_sim

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
    async with running_sim(tmp_path, POOLS, volcano=volcano) as (_, kubeconfig):
        config = kube_config("sim", kubeconfig)
        settings = dataclasses.replace(config.settings, use_volcano=None if volcano else False)
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        try:
            async with KubernetesBackend(dataclasses.replace(config, settings=settings)) as backend:
                assert await backend.wait_synced()
                yield backend, api
        finally:
            api.close()


@pytest.fixture(params=["indexed", "volcano"], name="world")
async def world_fixture(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[KubernetesBackend, Any]]:
    async for pair in sim_backend(tmp_path, volcano=request.param == "volcano"):
        yield pair
