"""OpenAPI v3 documents for the kinds the simulator serves, built from compact tables.

kubectl reads `/openapi/v3` for three things: `kubectl explain` (schemas and descriptions), whether
the server checks fields itself (a `fieldValidation` query parameter on the PATCH operation of the
kind, tagged with `x-kubernetes-group-version-kind`; then `kubectl apply` sends
`fieldValidation=Strict` instead of failing for want of `/openapi/v2`), and the strategic-merge
keys of lists (`x-kubernetes-patch-merge-key`, taken from `patch.MERGE_KEYS`). The same tables
drive the server's own unknown-field check (`validation`). A type written `object` is open: its
fields are not described and not checked, which is where these documents are thinner than a real
server's.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from typing import Any

from clusters.sim import openapi_proto, patch
from clusters.sim.resources import ALL, ResourceType
from clusters.sim.schemas import TYPES

Obj = dict[str, Any]
_CORE = "io.k8s.api.core.v1."
_META = "io.k8s.apimachinery.pkg.apis.meta.v1."
# The kind each served type's schema is named after, where it differs from the kind.
_SCHEMA_OF = {("batch.volcano.sh", "Job"): "VolcanoJob"}


def schema_name(rt: ResourceType) -> str:
    return _SCHEMA_OF.get((rt.group, rt.kind), rt.kind)


def _qualified(name: str, rt_group: str = "") -> str:
    if name in ("ObjectMeta", "OwnerReference", "LabelSelector"):
        return _META + name
    if name in ("Job", "JobSpec"):
        return "io.k8s.api.batch.v1." + name
    if name in ("Lease", "LeaseSpec"):
        return "io.k8s.api.coordination.v1." + name
    if name == "PriorityClass":
        return "io.k8s.api.scheduling.v1." + name
    if name == "VolcanoJob":
        return "sh.volcano.batch.v1alpha1.Job"
    if name in ("PodGroup", "Queue"):
        return "sh.volcano.scheduling.v1beta1." + name
    return _CORE + name


# Scalar types with a name of their own, as a real server's documents name them.
_SCALARS = {
    "time": "io.k8s.apimachinery.pkg.apis.meta.v1.Time",
    "quantity": "io.k8s.apimachinery.pkg.api.resource.Quantity",
    "int-or-string": "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
}
_SCALAR_SCHEMAS: dict[str, Obj] = {
    _SCALARS["time"]: {
        "description": "Time is a wrapper around time.Time, serialised in RFC 3339.",
        "type": "string",
        "format": "date-time",
    },
    _SCALARS["quantity"]: {
        "description": "Quantity is a fixed-point representation of a number (`500m`, `4Gi`, `2`).",
        "oneOf": [{"type": "string"}, {"type": "number"}],
    },
    _SCALARS["int-or-string"]: {
        "description": "IntOrString is a type that can hold an int32 or a string.",
        "type": "string",
        "format": "int-or-string",
    },
}


def _field(type_text: str) -> Obj:
    if type_text.startswith("[]"):
        return {"type": "array", "items": _field(type_text[2:])}
    if type_text.startswith("{}"):
        return {"type": "object", "additionalProperties": _field(type_text[2:])}
    if type_text.startswith("#"):
        return {"allOf": [{"$ref": f"#/components/schemas/{_qualified(type_text[1:])}"}], "default": {}}
    scalars: dict[str, Obj] = {
        "string": {"type": "string"},
        "integer": {"type": "integer", "format": "int64"},
        "boolean": {"type": "boolean"},
        "number": {"type": "number"},
        "time": {"allOf": [{"$ref": f"#/components/schemas/{_SCALARS['time']}"}]},
        "quantity": {"allOf": [{"$ref": f"#/components/schemas/{_SCALARS['quantity']}"}]},
        "int-or-string": {"allOf": [{"$ref": f"#/components/schemas/{_SCALARS['int-or-string']}"}]},
        "object": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    }
    return scalars[type_text]


def _schema(name: str, kind_of: ResourceType | None) -> Obj:
    description, props = TYPES[name]
    fields = dict(props)
    if kind_of is not None:
        fields = {"apiVersion": "string", "kind": "string", "metadata": "#ObjectMeta", **fields}
    properties: Obj = {}
    for field, type_text in fields.items():
        prop = _field(type_text)
        prop["description"] = f"{field} of the {name}."
        key = patch.merge_key(_parent_hint(name), field)
        if key is not None and type_text.startswith("[]"):
            prop["x-kubernetes-patch-strategy"] = "merge"
            if key:
                prop["x-kubernetes-patch-merge-key"] = key
                prop["x-kubernetes-list-type"] = "map"
                prop["x-kubernetes-list-map-keys"] = [key]
        properties[field] = prop
    schema: Obj = {"description": description, "type": "object", "properties": properties}
    if kind_of is not None:
        schema["x-kubernetes-group-version-kind"] = [
            {"group": kind_of.group, "version": kind_of.version, "kind": kind_of.kind}
        ]
    return schema


def _parent_hint(type_name: str) -> str:
    """The field name that holds a type in `patch.MERGE_KEYS`' terms."""
    return {"Container": "containers", "ObjectMeta": "metadata"}.get(type_name, "spec")


def fields_of(type_name: str) -> dict[str, str] | None:
    """A described type's fields (`validation` walks them); None for an unknown type."""
    entry = TYPES.get(type_name)
    return None if entry is None else entry[1]


def _refs(name: str, seen: set[str]) -> None:
    if name in seen:
        return
    seen.add(name)
    for type_text in TYPES[name][1].values():
        inner = type_text.lstrip("[]{}")
        if inner.startswith("#"):
            _refs(inner[1:], seen)


def _operation(rt: ResourceType, verb: str, op_id: str) -> Obj:
    params = [{"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]
    if verb in ("post", "put", "patch"):
        params += [
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
        ]
    if verb == "patch":
        params.append({"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": True}})
    ref = {"$ref": f"#/components/schemas/{_qualified(schema_name(rt))}"}
    return {
        "operationId": op_id,
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}},
        "x-kubernetes-action": {
            "post": "post",
            "put": "put",
            "patch": "patch",
            "get": "get",
            "delete": "delete",
        }[verb],
        "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
    }


def group_versions() -> list[tuple[str, str]]:
    return sorted({(rt.group, rt.version) for rt in ALL})


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


@cache
def document(group: str, version: str) -> bytes | None:
    types = [rt for rt in ALL if rt.group == group and rt.version == version]
    if not types:
        return None
    paths: Obj = {}
    schemas: Obj = {}
    prefix = "/" + _gv_path(group, version)
    for rt in types:
        scope = f"{prefix}/namespaces/{{namespace}}" if rt.namespaced else prefix
        verb_id = rt.kind + ("Namespaced" if rt.namespaced else "")
        paths[f"{scope}/{rt.plural}"] = {
            "get": _operation(rt, "get", f"list{verb_id}"),
            "post": _operation(rt, "post", f"create{verb_id}"),
        }
        paths[f"{scope}/{rt.plural}/{{name}}"] = {
            "get": _operation(rt, "get", f"read{verb_id}"),
            "put": _operation(rt, "put", f"replace{verb_id}"),
            "patch": _operation(rt, "patch", f"patch{verb_id}"),
            "delete": _operation(rt, "delete", f"delete{verb_id}"),
        }
        schemas.update(_SCALAR_SCHEMAS)
        needed: set[str] = set()
        _refs(schema_name(rt), needed)
        _refs("ObjectMeta", needed)
        for name in needed:
            kind_of = rt if name == schema_name(rt) else None
            schemas[_qualified(name)] = _schema(name, kind_of)
    doc = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "unversioned"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    return json.dumps(doc).encode()


def root(volcano: bool) -> Obj:
    paths: Obj = {}
    for group, version in group_versions():
        if not volcano and group.endswith("volcano.sh"):
            continue
        body = document(group, version) or b""
        digest = hashlib.sha512(body).hexdigest()[:64].upper()
        path = _gv_path(group, version)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}


def _v2_operation(op: Obj) -> Obj:
    out = {k: v for k, v in op.items() if k not in ("parameters", "responses")}
    out["parameters"] = [
        {"name": p["name"], "in": p["in"], "type": p["schema"]["type"], "uniqueItems": True}
        for p in op.get("parameters", [])
    ]
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]
    out["responses"] = {"200": {"description": "OK", "schema": schema}}
    return out


@cache
def swagger(volcano: bool) -> bytes:
    """`/openapi/v2`: the same schemas and operations as Swagger 2.0, in JSON."""
    paths: Obj = {}
    definitions: Obj = {}
    for group, version in group_versions():
        if not volcano and group.endswith("volcano.sh"):
            continue
        text = (document(group, version) or b"{}").decode().replace("#/components/schemas/", "#/definitions/")
        doc = json.loads(text)
        definitions.update(doc["components"]["schemas"])
        for path, ops in doc["paths"].items():
            paths[path] = {verb: _v2_operation(op) for verb, op in ops.items()}
    body = {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "unversioned"},
        "paths": paths,
        "definitions": definitions,
    }
    return json.dumps(body).encode()


@cache
def swagger_protobuf(volcano: bool) -> bytes:
    return openapi_proto.document(json.loads(swagger(volcano)))


def accepts_protobuf(accept: str) -> bool:
    return openapi_proto.MEDIA in accept or "application/com.github.proto-openapi.spec.v2" in accept


def accepts_json(accept: str) -> bool:
    """Whether a client takes JSON (or says nothing of what it takes)."""
    if not accept.strip():
        return True
    media = [part.split(";", 1)[0].strip() for part in accept.split(",")]
    return any(m in ("application/json", "application/yaml", "*/*", "application/*") for m in media)
