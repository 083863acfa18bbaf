"""Hurting a simulated cluster on purpose, from Python or over HTTP from another process.

gpufed must recover from what real clusters do to it: a node that vanishes, an eviction, an API
server that stops answering or crawls, capacity that comes and goes. Each fault writes what a real
cluster would show (a NotReady node with its pods failed by the taint manager, an evicted pod with
`DisruptionTarget`), so the backend under test sees the same objects it would see in production.
The admin endpoint lives under `/sim/v1/`, outside the Kubernetes paths, and keeps answering while
the Kubernetes API is unreachable.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

import structlog
from aiohttp import web

from clusters.sim import podstatus
from clusters.sim.clock import rfc3339
from clusters.sim.engine import Engine
from clusters.sim.eviction import evict_by_api, evict_by_kubelet
from clusters.sim.resources import NODES, PODS
from clusters.sim.store import clone

Obj = dict[str, Any]
log = structlog.get_logger("gpufed.clusters.sim")
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


class Unreachable(StrEnum):
    """How an unreachable API server fails requests."""

    # Connections are dropped without an answer, as when the network path is gone.
    CLOSE = "close"
    UNAVAILABLE = "503"
    THROTTLED = "429"


def evict(engine: Engine, namespace: str, name: str, grace_s: float | None = None) -> Obj:
    """What the `pods/eviction` subresource does (see `eviction.py`): a graceful, marked delete."""
    return evict_by_api(engine.store, engine.clock, engine.lifecycle, namespace, name, grace_s)


def lose_node(engine: Engine, name: str) -> None:
    """The node stops reporting: NotReady, unreachable taints, and its pods fail with NodeLost."""
    node = engine.store.require(NODES, "", name)
    wall_s = engine.clock.wall_s()
    lost = clone(node)
    for c in lost["status"]["conditions"]:
        c.update(
            status="Unknown",
            reason="NodeStatusUnknown",
            message="Kubelet stopped posting node status.",
            lastTransitionTime=rfc3339(wall_s),
        )
    taints = [t for t in lost["spec"].get("taints") or [] if t.get("key") != UNREACHABLE_TAINT]
    taints += [
        {"key": UNREACHABLE_TAINT, "effect": e, "timeAdded": rfc3339(wall_s)}
        for e in ("NoSchedule", "NoExecute")
    ]
    lost["spec"]["taints"] = taints
    lost = engine.store.update(NODES, lost)
    engine.recorder.record(
        NODES, lost, "NodeNotReady", f"Node {name} status is now: NodeNotReady", component="node-controller"
    )
    for pod in engine.store.pods_on_node(name):
        if podstatus.is_terminal(pod):
            continue
        m = pod["metadata"]
        ended = engine.store.update(
            PODS,
            podstatus.disrupted(
                pod,
                wall_s,
                condition_reason="DeletionByTaintManager",
                condition_message="Taint manager: deleting due to NoExecute taint",
                reason="NodeLost",
                message=f"Node {name} which was running pod {m['name']} is unresponsive",
            ),
        )
        engine.recorder.record(
            PODS,
            ended,
            "TaintManagerEviction",
            f"Marking for deletion Pod {m.get('namespace')}/{m['name']}",
            component="taint-eviction-controller",
        )
    log.info("sim_node_lost", cluster=engine.config.name, node=name)


def restore_node(engine: Engine, name: str) -> None:
    node = engine.store.require(NODES, "", name)
    wall_s = engine.clock.wall_s()
    back = clone(node)
    for c in back["status"]["conditions"]:
        ready = c["type"] == "Ready"
        c.update(
            status="True" if ready else "False",
            reason="KubeletReady" if ready else f"KubeletHasSufficient{c['type'].replace('Pressure', '')}",
            message="kubelet is posting ready status" if ready else "kubelet has no pressure",
            lastTransitionTime=rfc3339(wall_s),
        )
    back["spec"]["taints"] = [
        t for t in back["spec"].get("taints") or [] if t.get("key") != UNREACHABLE_TAINT
    ]
    back = engine.store.update(NODES, back)
    engine.recorder.record(
        NODES, back, "NodeReady", f"Node {name} status is now: NodeReady", component="node-controller"
    )
    log.info("sim_node_restored", cluster=engine.config.name, node=name)


class Faults:
    """The fault switches of one cluster; the HTTP layer reads `unreachable` and `latency_s`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.unreachable: Unreachable | None = None
        self.latency_s = 0.0
        self._listeners: list[Callable[[Unreachable], None]] = []

    def on_unreachable(self, listener: Callable[[Unreachable], None]) -> None:
        self._listeners.append(listener)

    def lose_node(self, name: str) -> None:
        lose_node(self._engine, name)

    def restore_node(self, name: str) -> None:
        restore_node(self._engine, name)

    def evict_pod(self, namespace: str, name: str) -> None:
        """A node-pressure eviction by the kubelet: the pod ends Failed/Evicted and stays listed."""
        evict_by_kubelet(self._engine.store, self._engine.clock, self._engine.recorder, namespace, name)

    def set_unreachable(self, mode: Unreachable | str = Unreachable.CLOSE) -> None:
        self.unreachable = Unreachable(mode)
        for listener in self._listeners:
            listener(self.unreachable)
        log.info("sim_unreachable_set", cluster=self._engine.config.name, mode=self.unreachable.value)

    def set_reachable(self) -> None:
        self.unreachable = None
        log.info("sim_reachable_set", cluster=self._engine.config.name)

    def set_latency(self, seconds: float) -> None:
        self.latency_s = max(0.0, seconds)
        log.info("sim_latency_set", cluster=self._engine.config.name, latency_s=self.latency_s)

    def add_nodes(self, pool: str, count: int) -> list[str]:
        return self._engine.add_nodes(pool, count)

    def remove_nodes(self, pool: str, count: int) -> list[str]:
        """Remove the emptiest nodes first; pods still on a removed node end as on a lost node."""
        nodes = self._engine.pool_nodes(pool)
        busy: dict[str, int] = {
            n["metadata"]["name"]: sum(
                1
                for p in self._engine.store.pods_on_node(n["metadata"]["name"])
                if not podstatus.is_terminal(p)
            )
            for n in nodes
        }
        chosen = sorted(busy, key=lambda n: (busy[n], -int(n.rsplit("-", 1)[1])))[:count]
        for name in chosen:
            if busy[name]:
                lose_node(self._engine, name)
            self._engine.store.remove(NODES, "", name)
        return chosen


def admin_routes(engine: Engine, faults: Faults, describe: Callable[[], Obj]) -> list[web.RouteDef]:
    """`/sim/v1/...`: the same faults for a test that drives the cluster from another process."""

    async def _json(request: web.Request) -> Obj:
        if not request.can_read_body:
            return {}
        body = await request.json()
        return body if isinstance(body, dict) else {}

    def _ok(**extra: Any) -> web.Response:
        return web.json_response({"ok": True, **extra})

    def _missing(exc: Exception) -> web.Response:
        return web.json_response({"ok": False, "error": str(exc)}, status=404)

    async def state(_: web.Request) -> web.Response:
        return web.json_response(describe())

    async def lose(request: web.Request) -> web.Response:
        try:
            faults.lose_node(request.match_info["node"])
        except Exception as exc:
            return _missing(exc)
        return _ok()

    async def restore(request: web.Request) -> web.Response:
        try:
            faults.restore_node(request.match_info["node"])
        except Exception as exc:
            return _missing(exc)
        return _ok()

    async def evict_route(request: web.Request) -> web.Response:
        try:
            faults.evict_pod(request.match_info["namespace"], request.match_info["name"])
        except Exception as exc:
            return _missing(exc)
        return _ok()

    async def unreachable(request: web.Request) -> web.Response:
        body = await _json(request)
        try:
            faults.set_unreachable(str(body.get("mode", Unreachable.CLOSE.value)))
        except ValueError as exc:
            return web.json_response({"ok": False, "error": str(exc)}, status=400)
        return _ok()

    async def reachable(_: web.Request) -> web.Response:
        faults.set_reachable()
        return _ok()

    async def latency(request: web.Request) -> web.Response:
        body = await _json(request)
        faults.set_latency(float(body.get("seconds", 0.0)))
        return _ok()

    async def add(request: web.Request) -> web.Response:
        body = await _json(request)
        try:
            names = faults.add_nodes(request.match_info["pool"], int(body.get("count", 1)))
        except KeyError as exc:
            return _missing(exc)
        return _ok(added=names)

    async def remove(request: web.Request) -> web.Response:
        try:
            names = faults.remove_nodes(request.match_info["pool"], int(request.query.get("count", "1")))
        except KeyError as exc:
            return _missing(exc)
        return _ok(removed=names)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    return [
        web.get("/sim/v1/healthz", health),
        web.get("/sim/v1/state", state),
        web.post("/sim/v1/faults/nodes/{node}/lose", lose),
        web.post("/sim/v1/faults/nodes/{node}/restore", restore),
        web.post("/sim/v1/faults/pods/{namespace}/{name}/evict", evict_route),
        web.post("/sim/v1/faults/unreachable", unreachable),
        web.delete("/sim/v1/faults/unreachable", reachable),
        web.post("/sim/v1/faults/latency", latency),
        web.post("/sim/v1/pools/{pool}/nodes", add),
        web.delete("/sim/v1/pools/{pool}/nodes", remove),
    ]
