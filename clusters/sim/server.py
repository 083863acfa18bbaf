"""The Kubernetes REST API of one simulated cluster, over aiohttp.

Paths are parsed by hand rather than with one route per resource: `/api/v1/...` and
`/apis/<group>/<version>/...` share one grammar (optionally `namespaces/<ns>/`, then the plural,
a name and a subresource), so a resource added to `resources.py` is served without touching this
module. Every failure leaves as a `Status` object. A middleware applies the cluster's faults
(unreachable, slow) and its bearer token to Kubernetes paths only; `/sim/v1/` stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import structlog
from aiohttp import web

from clusters.sim import discovery, errors, faults, paging, patch, podstatus, table, watchstream
from clusters.sim.engine import Engine
from clusters.sim.errors import ApiError
from clusters.sim.faults import Faults, Unreachable
from clusters.sim.resources import PODS, VOLCANO_GROUPS, ResourceType, lookup
from clusters.sim.selectors import parse_field_selector, parse_label_selector
from clusters.sim.store import Watcher, clone

Obj = dict[str, Any]
log = structlog.get_logger("gpufed.clusters.sim")
_OPEN_PATHS = ("/sim/", "/healthz", "/livez", "/readyz")


def _json_response(body: Obj, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body).encode(), status=status, content_type="application/json")


def _error_response(exc: ApiError) -> web.Response:
    response = _json_response(exc.status(), exc.code)
    if exc.code == 429:
        response.headers["Retry-After"] = "1"
    return response


class ApiServer:
    def __init__(self, engine: Engine, fault_switches: Faults, token: str | None, describe: Any) -> None:
        self._engine = engine
        self._faults = fault_switches
        self._token = token
        self._streams: dict[Watcher, web.Request] = {}
        self.app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        self.app.add_routes(faults.admin_routes(engine, fault_switches, describe))
        discovery_routes = [
            ("/api", self._core_versions),
            ("/apis", self._groups),
            ("/api/v1", self._core_resources),
            ("/apis/{group}", self._group),
            ("/apis/{group}/{version}", self._group_resources),
        ]
        # Clients ask for discovery documents both with and without a trailing slash.
        for path, handler in discovery_routes:
            self.app.router.add_get(path, handler)
            self.app.router.add_get(f"{path}/", handler)
        for path in ("/healthz", "/livez", "/readyz"):
            self.app.router.add_get(path, self._ok)
        self.app.router.add_get("/version", self._version)
        self.app.router.add_get("/version/", self._version)
        self.app.router.add_route("*", "/api/v1/{tail:.+}", self._core)
        self.app.router.add_route("*", "/apis/{group}/{version}/{tail:.+}", self._grouped)
        self.app.router.add_route("*", "/{tail:.*}", self._not_found)
        fault_switches.on_unreachable(self._cut_watches)

    def _cut_watches(self, mode: Unreachable) -> None:
        """Open watches end when the API becomes unreachable, abruptly if connections are dropped."""
        for watcher, request in list(self._streams.items()):
            if mode is Unreachable.CLOSE and request.transport is not None:
                request.transport.abort()
            self._engine.store.unwatch(watcher)
        self._streams.clear()

    def close_watches(self) -> None:
        self._engine.store.close_watches()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith(_OPEN_PATHS):
            return await handler(request)  # type: ignore[no-any-return]
        try:
            mode = self._faults.unreachable
            if mode is Unreachable.CLOSE:
                if request.transport is not None:
                    request.transport.abort()
                raise errors.unavailable()
            if mode is Unreachable.UNAVAILABLE:
                raise errors.unavailable()
            if mode is Unreachable.THROTTLED:
                raise errors.too_many_requests()
            if self._faults.latency_s > 0:
                await asyncio.sleep(self._faults.latency_s)
            if self._token is not None and request.headers.get("Authorization") != f"Bearer {self._token}":
                raise errors.unauthorized()
            return await handler(request)  # type: ignore[no-any-return]
        except ApiError as exc:
            return _error_response(exc)
        except web.HTTPException:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # A body the simulator could not make sense of: a real server would have refused it as
            # invalid, so the client gets a Status rather than a bare 500 page.
            log.warning("sim_request_failed", path=request.path, method=request.method, error=repr(exc))
            return _error_response(ApiError(422, "Invalid", f"the request could not be processed: {exc!r}"))

    # -- discovery ----------------------------------------------------------------------------

    async def _not_found(self, _: web.Request) -> web.Response:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    async def _ok(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _version(self, _: web.Request) -> web.Response:
        return _json_response(discovery.version(self._engine.config.kubernetes_version))

    async def _core_versions(self, request: web.Request) -> web.Response:
        return _json_response(discovery.core_versions(request.host))

    async def _groups(self, _: web.Request) -> web.Response:
        return _json_response(discovery.groups(self._engine.config.volcano))

    async def _core_resources(self, _: web.Request) -> web.Response:
        return _json_response(discovery.resources("", "v1") or {})

    def _serves(self, group: str) -> bool:
        return self._engine.config.volcano or group not in VOLCANO_GROUPS

    async def _group(self, request: web.Request) -> web.Response:
        body = (
            discovery.group(request.match_info["group"])
            if self._serves(request.match_info["group"])
            else None
        )
        if body is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _json_response(body)

    async def _group_resources(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        body = discovery.resources(group, request.match_info["version"]) if self._serves(group) else None
        if body is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _json_response(body)

    # -- resources ----------------------------------------------------------------------------

    async def _core(self, request: web.Request) -> web.StreamResponse:
        return await self._resource(request, "", "v1", request.match_info["tail"])

    async def _grouped(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        return await self._resource(request, info["group"], info["version"], info["tail"])

    async def _resource(
        self, request: web.Request, group: str, version: str, tail: str
    ) -> web.StreamResponse:
        parts = [p for p in tail.split("/") if p]
        namespace: str | None = None
        if len(parts) >= 3 and parts[0] == "namespaces" and lookup(group, version, parts[2]) is not None:
            namespace, parts = parts[1], parts[2:]
        rt = lookup(group, version, parts[0])
        if rt is not None and rt.group in VOLCANO_GROUPS and not self._engine.config.volcano:
            rt = None
        if rt is None or len(parts) > 3 or (namespace is not None and not rt.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        if sub is not None and sub not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        method = request.method
        if name is None:
            if method == "GET":
                return await self._list_or_watch(request, rt, namespace)
            if method == "POST":
                return await self._create(request, rt, namespace)
            if method == "DELETE":
                return await self._delete_collection(request, rt, namespace)
        else:
            ns = namespace or ""
            if method == "GET":
                return self._respond(request, rt, self._engine.store.require(rt, ns, name))
            if method == "POST" and sub == "eviction":
                faults.evict(self._engine, ns, name)
                return _json_response(
                    {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
                    201,
                )
            if method == "PUT":
                return await self._replace(request, rt, ns, name, sub)
            if method == "PATCH":
                return await self._patch(request, rt, ns, name, sub)
            if method == "DELETE" and sub is None:
                return await self._delete(request, rt, ns, name)
        raise errors.not_allowed(f"the server does not allow this method on the requested resource: {method}")

    def _respond(self, request: web.Request, rt: ResourceType, obj: Obj, status: int = 200) -> web.Response:
        if table.wants_table(request.headers.get("Accept", "")):
            body = table.render(
                rt,
                [obj],
                self._engine.clock.wall_s(),
                obj["metadata"].get("resourceVersion", ""),
                request.query.get("includeObject", "Metadata"),
            )
            return _json_response(body, status)
        return _json_response(obj, status)

    async def _list_or_watch(
        self, request: web.Request, rt: ResourceType, namespace: str | None
    ) -> web.StreamResponse:
        query = request.query
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"))
        store = self._engine.store
        if query.get("watch", "") in ("true", "1"):
            return await watchstream.serve(
                request,
                store,
                rt,
                namespace,
                labels,
                fields,
                bookmark_interval_s=self._engine.config.bookmark_interval_s,
                now_wall_s=self._engine.clock.wall_s,
                streams=self._streams,
            )
        items = store.list(rt, namespace, labels, fields)
        list_meta: Obj = {"resourceVersion": str(store.resource_version)}
        items = paging.page(items, list_meta, query.get("limit", ""), query.get("continue", ""))
        if table.wants_table(request.headers.get("Accept", "")):
            include = query.get("includeObject", "Metadata")
            body = table.render(rt, items, self._engine.clock.wall_s(), list_meta["resourceVersion"], include)
            body["metadata"] = list_meta
            return _json_response(body)
        return _json_response(
            {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": list_meta, "items": items}
        )

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        media = request.headers.get("Content-Type", "application/json")
        # Protobuf and CBOR are refused with 415, on which client-go falls back to JSON.
        if "json" not in media and "yaml" not in media:
            raise errors.unsupported_media(media)
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise errors.bad_request(f"the request body is not JSON: {exc}") from exc

    async def _create(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.Response:
        body = await self._body(request)
        obj = self._engine.admission.admit_create(rt, body, namespace)
        created = self._engine.store.create(rt, obj)
        return self._respond(request, rt, created, 201)

    def _merge_for_update(self, rt: ResourceType, old: Obj, new: Obj, sub: str | None) -> Obj:
        """Status is written only through `/status`, and `/status` writes nothing else."""
        if sub == "status":
            merged = clone(old)
            merged["status"] = new.get("status") or {}
            merged["metadata"]["resourceVersion"] = (new.get("metadata") or {}).get("resourceVersion")
            return merged
        merged = clone(new)
        m = merged.setdefault("metadata", {})
        for kept in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            if kept in old["metadata"]:
                m[kept] = old["metadata"][kept]
        if rt.has_status:
            merged["status"] = clone(old.get("status") or {})
        if rt is PODS and podstatus.node_name(old):
            merged.setdefault("spec", {})["nodeName"] = podstatus.node_name(old)
        return merged

    def _check_name(self, rt: ResourceType, body: Any, name: str) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the body must be a JSON object")
        body_name = (body.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            raise errors.bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        body.setdefault("metadata", {})["name"] = name
        checked: Obj = body
        return checked

    async def _replace(
        self, request: web.Request, rt: ResourceType, ns: str, name: str, sub: str | None
    ) -> web.Response:
        body = self._check_name(rt, await self._body(request), name)
        store = self._engine.store
        old = store.require(rt, ns, name)
        merged = self._merge_for_update(rt, old, body, sub)
        expect = (body.get("metadata") or {}).get("resourceVersion")
        merged["metadata"]["namespace"] = old["metadata"].get("namespace")
        return self._respond(request, rt, store.update(rt, merged, expect_rv=expect))

    async def _patch(
        self, request: web.Request, rt: ResourceType, ns: str, name: str, sub: str | None
    ) -> web.Response:
        body = await self._body(request)
        store = self._engine.store
        old = store.require(rt, ns, name)
        patched = patch.apply(request.headers.get("Content-Type", ""), old, body)
        patched = self._check_name(rt, patched, name)
        expect = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        merged = self._merge_for_update(rt, old, patched, sub)
        merged["metadata"]["namespace"] = old["metadata"].get("namespace")
        return self._respond(request, rt, store.update(rt, merged, expect_rv=expect))

    async def _delete_options(self, request: web.Request) -> tuple[float | None, str | None, Obj]:
        body = await self._body(request)
        options: Obj = body if isinstance(body, dict) else {}
        query = request.query
        grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        policy = options.get("propagationPolicy", query.get("propagationPolicy"))
        orphan = options.get("orphanDependents", query.get("orphanDependents"))
        if policy is None and orphan is not None:
            policy = "Orphan" if str(orphan).lower() == "true" else "Background"
        try:
            grace_s = None if grace is None else float(grace)
        except ValueError as exc:
            raise errors.bad_request(f"invalid gracePeriodSeconds: {grace}") from exc
        if policy not in (None, "Foreground", "Background", "Orphan"):
            raise errors.bad_request(f"invalid propagationPolicy: {policy}")
        return grace_s, policy, options.get("preconditions") or {}

    async def _delete(self, request: web.Request, rt: ResourceType, ns: str, name: str) -> web.Response:
        grace_s, policy, preconditions = await self._delete_options(request)
        current = self._engine.store.require(rt, ns, name)
        for field in ("uid", "resourceVersion"):
            wanted = preconditions.get(field)
            if wanted and wanted != current["metadata"].get(field):
                raise errors.conflict(
                    rt,
                    name,
                    f"Precondition failed: {field} in precondition: {wanted}, "
                    f"{field} in object meta: {current['metadata'].get(field)}",
                )
        gone = self._engine.lifecycle.delete(rt, ns, name, grace_s=grace_s, propagation=policy)
        return self._respond(request, rt, gone)

    async def _delete_collection(
        self, request: web.Request, rt: ResourceType, namespace: str | None
    ) -> web.Response:
        grace_s, policy, _ = await self._delete_options(request)
        labels = parse_label_selector(request.query.get("labelSelector"))
        fields = parse_field_selector(request.query.get("fieldSelector"))
        store = self._engine.store
        removed = []
        for obj in store.list(rt, namespace, labels, fields):
            ns, name = obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
            with contextlib.suppress(ApiError):
                removed.append(
                    self._engine.lifecycle.delete(rt, ns, name, grace_s=grace_s, propagation=policy)
                )
        return _json_response(
            {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(store.resource_version)},
                "items": removed,
            }
        )
