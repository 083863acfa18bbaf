"""The Kubernetes REST API of one simulated cluster, over aiohttp.

Paths are parsed by hand rather than with one route per resource: `/api/v1/...` and
`/apis/<group>/<version>/...` share one grammar (optionally `namespaces/<ns>/`, then the plural,
a name and a subresource), so a resource added to `resources.py` is served without touching this
module. Every failure leaves as a `Status` object. A middleware applies the cluster's faults
(unreachable, slow), its bearer token and RBAC for ServiceAccount tokens (`rbac`) to Kubernetes
paths only; `/sim/v1/` stays open.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import structlog
import yaml
from aiohttp import web

from clusters.sim import (
    apply,
    discovery,
    errors,
    faults,
    openapi,
    patch,
    podlog,
    protobuf,
    rbac,
    reads,
    table,
    validation,
    watchstream,
    writes,
)
from clusters.sim.changes import encode_json
from clusters.sim.engine import Engine
from clusters.sim.errors import ApiError
from clusters.sim.faults import Faults, Unreachable
from clusters.sim.resources import PODS, SELF_SUBJECT_ACCESS_REVIEWS, VOLCANO_GROUPS, ResourceType, lookup
from clusters.sim.store import Watcher

Obj = dict[str, Any]
log = structlog.get_logger("gpufed.clusters.sim")
_OPEN_PATHS = ("/sim/", "/healthz", "/livez", "/readyz")
# Who made the request (clusters.sim.rbac), for the SelfSubjectAccessReviews answered about them.
_USER = web.RequestKey("sim_user", rbac.User)


def _json_response(body: Obj, status: int = 200) -> web.Response:
    return web.Response(body=encode_json(body), status=status, content_type="application/json")


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
        self._writes = writes.Writes(engine)
        # Like kube-apiserver's watch caches, which start from a list when the server starts.
        engine.store.start_watch_cache()
        apply.set_clock(engine.clock.wall_s)
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
        self.app.router.add_get("/openapi/v2", self._openapi_v2)
        self.app.router.add_get("/openapi/v3", self._openapi_root)
        self.app.router.add_get("/openapi/v3/", self._openapi_root)
        self.app.router.add_get("/openapi/v3/{path:.+}", self._openapi_document)
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
            store = self._engine.store
            user = rbac.authenticate(store, self._token, request.headers.get("Authorization"))
            if user is None:
                raise errors.unauthorized()
            if not user.admin:
                rbac.authorize(store, user, request.method, request.path, request.query)
            request[_USER] = user
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

    async def _openapi_v2(self, request: web.Request) -> web.Response:
        accept = request.headers.get("Accept", "")
        volcano = self._engine.config.volcano
        if openapi.accepts_protobuf(accept):
            body = openapi.swagger_protobuf(volcano)
            # As kube-openapi answers it: the media type asked for has an "@", which no parser takes.
            return web.Response(body=body, content_type="application/octet-stream")
        if not openapi.accepts_json(accept):
            raise ApiError(
                406, "NotAcceptable", f"only JSON or protobuf is served for /openapi/v2, not {accept}"
            )
        return web.Response(body=openapi.swagger(volcano), content_type="application/json")

    async def _openapi_root(self, _: web.Request) -> web.Response:
        return _json_response(openapi.root(self._engine.config.volcano))

    async def _openapi_document(self, request: web.Request) -> web.Response:
        path = request.match_info["path"].strip("/").split("/")
        group, version = (
            ("", path[1])
            if path[:1] == ["api"] and len(path) == 2
            else ((path[1], path[2]) if path[:1] == ["apis"] and len(path) == 3 else ("?", "?"))
        )
        body = openapi.document(group, version) if self._serves(group) else None
        if body is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        response = web.Response(body=body, content_type="application/json")
        # The URL carries the document's hash, so clients may cache it for good.
        response.headers["Cache-Control"] = "public, immutable"
        return response

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
        if not openapi.accepts_json(request.headers.get("Accept", "")):
            # A real server could answer in protobuf; the simulator answers only JSON, so it says so.
            raise ApiError(
                406,
                "NotAcceptable",
                "only the following media types are accepted: application/json, application/yaml; "
                f"not {request.headers.get('Accept')}",
            )
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
        if rt is SELF_SUBJECT_ACCESS_REVIEWS:
            if request.method != "POST" or name is not None:
                raise errors.not_allowed(f"the server does not allow this method: {request.method}")
            answer = rbac.review(
                self._engine.store, request.get(_USER, rbac.ADMIN), await self._body(request)
            )
            return _json_response(answer, 201)
        if rt is PODS and sub == "log" and name is not None and request.method == "GET":
            return await podlog.serve(request, self._engine, namespace or "", name)
        if sub is not None and sub not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        method = request.method
        if sub == "log":
            raise errors.not_allowed(
                f"the server does not allow this method on the requested resource: {method}"
            )
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
                return await self._evict(request, ns, name)
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
        store = self._engine.store
        if query.get("watch", "") in ("true", "1"):
            labels, fields = reads.selectors(rt, query)
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
        await reads.wait_fresh(store, query)
        items, list_meta = reads.list_objects(store, rt, namespace, query)
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
        media = request.headers.get("Content-Type", "application/json").split(";", 1)[0].strip()
        if media == protobuf.MEDIA:
            return protobuf.decode(raw)
        # CBOR and anything else is refused with 415, on which client-go falls back to JSON.
        if "json" not in media and "yaml" not in media:
            raise errors.unsupported_media(media)
        try:
            # msgspec's decoder, as fast again as json.loads; a malformed body is a ValueError either way.
            return msgspec.json.decode(raw)
        except ValueError as exc:
            if "yaml" in media:
                try:
                    return yaml.safe_load(raw)
                except yaml.YAMLError as yaml_exc:
                    raise errors.bad_request(f"the request body is not YAML: {yaml_exc}") from yaml_exc
            raise errors.bad_request(f"the request body is not JSON: {exc}") from exc

    def _query(self, request: web.Request) -> dict[str, str]:
        """The query, with `fieldManager` defaulted from the User-Agent as a real server does."""
        query = dict(request.query)
        if "dryRun" in request.query:
            values = request.query.getall("dryRun")
            bad = [v for v in values if v != "All"]
            query["dryRun"] = bad[0] if bad else "All"
        if not request.headers.get("Content-Type", "").startswith(patch.APPLY):
            # An apply must name its manager; any other write defaults it from the User-Agent.
            user_agent = request.headers.get("User-Agent", "")
            query.setdefault("fieldManager", apply.manager_of(request.query, user_agent))
        validation.check_mode(query)
        return query

    async def _create(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.Response:
        body = await self._body(request)
        query = self._query(request)
        warnings = validation.check(rt, body, query)
        created = self._writes.create(rt, namespace, body, query)
        return self._warn(self._respond(request, rt, created, 201), warnings)

    async def _replace(
        self, request: web.Request, rt: ResourceType, ns: str, name: str, sub: str | None
    ) -> web.Response:
        body = await self._body(request)
        query = self._query(request)
        warnings = validation.check(rt, body, query)
        return self._warn(
            self._respond(request, rt, self._writes.replace(rt, ns, name, sub, body, query)), warnings
        )

    async def _patch(
        self, request: web.Request, rt: ResourceType, ns: str, name: str, sub: str | None
    ) -> web.Response:
        body = await self._body(request)
        query = self._query(request)
        content_type = request.headers.get("Content-Type", "")
        warnings = validation.check(rt, body, query, partial=not content_type.startswith(patch.APPLY))
        obj, created = self._writes.patch(rt, ns, name, sub, content_type, body, query)
        return self._warn(self._respond(request, rt, obj, 201 if created else 200), warnings)

    @staticmethod
    def _warn(response: web.Response, warnings: list[str]) -> web.Response:
        for text in warnings:
            escaped = text.replace("\\", "\\\\").replace('"', '\\"')
            response.headers.add("Warning", f'299 - "{escaped}"')
        return response

    async def _evict(self, request: web.Request, ns: str, name: str) -> web.Response:
        body = await self._body(request)
        options = (body or {}).get("deleteOptions") if isinstance(body, dict) else None
        if writes.dry_run(request.query, options or {}):
            self._engine.store.require(PODS, ns, name)
        else:
            grace = (options or {}).get("gracePeriodSeconds")
            faults.evict(self._engine, ns, name, None if grace is None else float(grace))
        return _json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
        )

    async def _delete(self, request: web.Request, rt: ResourceType, ns: str, name: str) -> web.Response:
        body = await self._body(request)
        return self._respond(request, rt, self._writes.delete(rt, ns, name, body, request.query))

    async def _delete_collection(
        self, request: web.Request, rt: ResourceType, namespace: str | None
    ) -> web.Response:
        body = await self._body(request)
        return _json_response(self._writes.delete_collection(rt, namespace, body, request.query))
