"""`HttpPoolResizer`: resizes simulated clusters over loopback, as a cloud resizes a node group.

Nodes come from the simulator's admin API (`POST /sim/v1/pools/<pool>/nodes`). Which nodes a pool
has, and which of them run a job, come from its Kubernetes API (nodes labelled `gpufed.io/pool`,
pods not yet finished), and a node leaves the way it would leave a real cluster safely: cordoned
(`spec.unschedulable`), checked again for pods, then deleted with its resourceVersion as a
precondition. A node that picked up a pod before the cordon took effect is uncordoned and kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from iac.errors import InvalidConfig, NetworkError
from iac.pools import LABEL_POOL
from iac.resize import PoolNodes

log = structlog.get_logger("gpufed.iac")
_UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True, slots=True)
class SimEndpoint:
    """Where one simulated cluster answers: its Kubernetes API URL and bearer token, if any."""

    url: str
    token: str | None = None


class HttpPoolResizer:
    def __init__(self, clusters: Mapping[str, SimEndpoint], *, timeout_s: float = 10.0) -> None:
        self._clusters = dict(clusters)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    def _endpoint(self, cluster: str) -> SimEndpoint:
        endpoint = self._clusters.get(cluster)
        if endpoint is None:
            raise InvalidConfig(f"no simulated cluster {cluster!r}")
        return endpoint

    async def _call(
        self,
        cluster: str,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (200, 201),
    ) -> tuple[int, Any]:
        endpoint = self._endpoint(cluster)
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        if endpoint.token:
            headers["Authorization"] = f"Bearer {endpoint.token}"
        url = endpoint.url.rstrip("/") + path
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout) as session,
                session.request(method, url, params=params, json=body, headers=headers) as reply,
            ):
                payload = await reply.json(content_type=None) if reply.content_length != 0 else None
                if reply.status not in ok:
                    if reply.status in (429,) or reply.status >= 500:
                        raise NetworkError(f"{cluster}: {method} {path} answered {reply.status}")
                    if reply.status not in (404, 409):
                        raise InvalidConfig(f"{cluster}: {method} {path} answered {reply.status}: {payload}")
                return reply.status, payload
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise NetworkError(f"{cluster}: {method} {path} failed: {error}") from error

    async def pool_nodes(self, cluster: str, pool: str) -> PoolNodes:
        _, nodes = await self._call(
            cluster, "GET", "/api/v1/nodes", params={"labelSelector": f"{LABEL_POOL}={pool}"}
        )
        items = sorted(
            (n for n in (nodes or {}).get("items", []) if not n["metadata"].get("deletionTimestamp")),
            key=lambda n: (n["metadata"].get("creationTimestamp", ""), n["metadata"]["name"]),
        )
        names = tuple(n["metadata"]["name"] for n in items)
        busy = await self._busy(cluster, names)
        return PoolNodes(names, busy)

    async def _busy(self, cluster: str, names: Sequence[str]) -> frozenset[str]:
        _, pods = await self._call(cluster, "GET", "/api/v1/pods", params={"fieldSelector": _UNFINISHED})
        on = {(p.get("spec") or {}).get("nodeName") for p in (pods or {}).get("items", [])}
        return frozenset(n for n in names if n in on)

    async def add_nodes(self, cluster: str, pool: str, count: int) -> tuple[str, ...]:
        status, reply = await self._call(
            cluster, "POST", f"/sim/v1/pools/{pool}/nodes", body={"count": count}
        )
        if status == 404:
            raise InvalidConfig(f"{cluster} has no pool {pool!r}")
        return tuple((reply or {}).get("added", ()))

    async def remove_idle_nodes(self, cluster: str, pool: str, names: Sequence[str]) -> tuple[str, ...]:
        removed: list[str] = []
        for name in names:
            if await self._remove_if_idle(cluster, name):
                removed.append(name)
        log.info("sim_nodes_removed", cluster=cluster, pool=pool, asked=len(names), removed=len(removed))
        return tuple(removed)

    async def _remove_if_idle(self, cluster: str, name: str) -> bool:
        path = f"/api/v1/nodes/{name}"
        merge = "application/merge-patch+json"
        status, node = await self._call(
            cluster, "PATCH", path, body={"spec": {"unschedulable": True}}, content_type=merge
        )
        if status == 404:
            return False
        if await self._busy(cluster, [name]):
            await self._call(
                cluster, "PATCH", path, body={"spec": {"unschedulable": None}}, content_type=merge
            )
            log.info("sim_node_kept_busy", cluster=cluster, node=name)
            return False
        version = node["metadata"]["resourceVersion"]
        status, _ = await self._call(
            cluster, "DELETE", path, body={"preconditions": {"resourceVersion": version}}, ok=(200, 202)
        )
        return status in (200, 202)
