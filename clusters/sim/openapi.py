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

from clusters.sim import patch
from clusters.sim.resources import ALL, ResourceType

Obj = dict[str, Any]
_CORE = "io.k8s.api.core.v1."
_META = "io.k8s.apimachinery.pkg.apis.meta.v1."
# Field types: string, integer, boolean, number, quantity, int-or-string, time, object (open),
# `#Name` a described type, `[]T` a list, `{}T` a map.
_TYPES: dict[str, tuple[str, dict[str, str]]] = {
    "ObjectMeta": (
        "Standard object's metadata.",
        {
            "name": "string",
            "generateName": "string",
            "namespace": "string",
            "uid": "string",
            "resourceVersion": "string",
            "generation": "integer",
            "creationTimestamp": "time",
            "deletionTimestamp": "time",
            "deletionGracePeriodSeconds": "integer",
            "labels": "{}string",
            "annotations": "{}string",
            "ownerReferences": "[]#OwnerReference",
            "finalizers": "[]string",
            "managedFields": "[]object",
            "selfLink": "string",
        },
    ),
    "OwnerReference": (
        "An object that owns this one.",
        {
            "apiVersion": "string",
            "kind": "string",
            "name": "string",
            "uid": "string",
            "controller": "boolean",
            "blockOwnerDeletion": "boolean",
        },
    ),
    "LabelSelector": (
        "A label query over a set of resources.",
        {"matchLabels": "{}string", "matchExpressions": "[]object"},
    ),
    "Pod": (
        "Pod is a collection of containers that can run on a host.",
        {"spec": "#PodSpec", "status": "object"},
    ),
    "PodSpec": (
        "A description of a pod.",
        {
            "containers": "[]#Container",
            "initContainers": "[]#Container",
            "restartPolicy": "string",
            "terminationGracePeriodSeconds": "integer",
            "activeDeadlineSeconds": "integer",
            "dnsPolicy": "string",
            "nodeSelector": "{}string",
            "serviceAccountName": "string",
            "serviceAccount": "string",
            "automountServiceAccountToken": "boolean",
            "nodeName": "string",
            "hostNetwork": "boolean",
            "hostPID": "boolean",
            "hostIPC": "boolean",
            "securityContext": "object",
            "imagePullSecrets": "[]object",
            "hostname": "string",
            "subdomain": "string",
            "affinity": "object",
            "schedulerName": "string",
            "tolerations": "[]#Toleration",
            "priorityClassName": "string",
            "priority": "integer",
            "preemptionPolicy": "string",
            "enableServiceLinks": "boolean",
            "volumes": "[]object",
            "topologySpreadConstraints": "[]object",
            "schedulingGates": "[]object",
            "readinessGates": "[]object",
            "runtimeClassName": "string",
            "overhead": "{}quantity",
            "shareProcessNamespace": "boolean",
            "hostAliases": "[]object",
            "dnsConfig": "object",
            "resourceClaims": "[]object",
            "resources": "#ResourceRequirements",
        },
    ),
    "Container": (
        "A single application container that you want to run within a pod.",
        {
            "name": "string",
            "image": "string",
            "command": "[]string",
            "args": "[]string",
            "workingDir": "string",
            "ports": "[]#ContainerPort",
            "env": "[]#EnvVar",
            "envFrom": "[]object",
            "resources": "#ResourceRequirements",
            "volumeMounts": "[]object",
            "livenessProbe": "object",
            "readinessProbe": "object",
            "startupProbe": "object",
            "lifecycle": "object",
            "terminationMessagePath": "string",
            "terminationMessagePolicy": "string",
            "imagePullPolicy": "string",
            "securityContext": "object",
            "stdin": "boolean",
            "stdinOnce": "boolean",
            "tty": "boolean",
            "restartPolicy": "string",
            "resizePolicy": "[]object",
            "volumeDevices": "[]object",
        },
    ),
    "ContainerPort": (
        "A network port in a single container.",
        {
            "name": "string",
            "hostPort": "integer",
            "containerPort": "integer",
            "protocol": "string",
            "hostIP": "string",
        },
    ),
    "EnvVar": ("An environment variable.", {"name": "string", "value": "string", "valueFrom": "object"}),
    "ResourceRequirements": (
        "Compute resource requirements.",
        {"limits": "{}quantity", "requests": "{}quantity", "claims": "[]object"},
    ),
    "Toleration": (
        "The pod this Toleration is attached to tolerates any taint that matches the triple "
        "<key,value,effect>.",
        {
            "key": "string",
            "operator": "string",
            "value": "string",
            "effect": "string",
            "tolerationSeconds": "integer",
        },
    ),
    "PodTemplateSpec": (
        "Data a pod should have when created from a template.",
        {"metadata": "#ObjectMeta", "spec": "#PodSpec"},
    ),
    "Node": ("Node is a worker node in Kubernetes.", {"spec": "#NodeSpec", "status": "object"}),
    "NodeSpec": (
        "Attributes of a node.",
        {
            "podCIDR": "string",
            "podCIDRs": "[]string",
            "providerID": "string",
            "unschedulable": "boolean",
            "taints": "[]object",
            "externalID": "string",
        },
    ),
    "Namespace": ("Namespace provides a scope for Names.", {"spec": "#NamespaceSpec", "status": "object"}),
    "NamespaceSpec": ("Attributes of a namespace.", {"finalizers": "[]string"}),
    "Service": ("A named abstraction of software service.", {"spec": "#ServiceSpec", "status": "object"}),
    "ServiceSpec": (
        "Attributes of a service.",
        {
            "ports": "[]#ServicePort",
            "selector": "{}string",
            "clusterIP": "string",
            "clusterIPs": "[]string",
            "type": "string",
            "externalIPs": "[]string",
            "sessionAffinity": "string",
            "externalName": "string",
            "publishNotReadyAddresses": "boolean",
            "ipFamilies": "[]string",
            "ipFamilyPolicy": "string",
            "internalTrafficPolicy": "string",
            "externalTrafficPolicy": "string",
            "loadBalancerIP": "string",
            "sessionAffinityConfig": "object",
            "allocateLoadBalancerNodePorts": "boolean",
        },
    ),
    "ServicePort": (
        "A port the service exposes.",
        {
            "name": "string",
            "protocol": "string",
            "appProtocol": "string",
            "port": "integer",
            "targetPort": "int-or-string",
            "nodePort": "integer",
        },
    ),
    "Event": (
        "A report of an event somewhere in the cluster.",
        {
            "involvedObject": "object",
            "reason": "string",
            "message": "string",
            "source": "object",
            "firstTimestamp": "time",
            "lastTimestamp": "time",
            "count": "integer",
            "type": "string",
            "eventTime": "string",
            "series": "object",
            "action": "string",
            "related": "object",
            "reportingComponent": "string",
            "reportingInstance": "string",
        },
    ),
    "ConfigMap": (
        "ConfigMap holds configuration data for pods to consume.",
        {"data": "{}string", "binaryData": "{}string", "immutable": "boolean"},
    ),
    "Lease": ("Lease defines a lease concept.", {"spec": "#LeaseSpec"}),
    "LeaseSpec": (
        "The specification of a Lease.",
        {
            "holderIdentity": "string",
            "leaseDurationSeconds": "integer",
            "acquireTime": "string",
            "renewTime": "string",
            "leaseTransitions": "integer",
            "strategy": "string",
            "preferredHolder": "string",
        },
    ),
    "PriorityClass": (
        "PriorityClass defines mapping from a priority class name to the priority integer value.",
        {
            "value": "integer",
            "globalDefault": "boolean",
            "description": "string",
            "preemptionPolicy": "string",
        },
    ),
    "Job": ("Job represents the configuration of a single job.", {"spec": "#JobSpec", "status": "object"}),
    "JobSpec": (
        "The specification of a job.",
        {
            "parallelism": "integer",
            "completions": "integer",
            "activeDeadlineSeconds": "integer",
            "podFailurePolicy": "object",
            "successPolicy": "object",
            "backoffLimit": "integer",
            "backoffLimitPerIndex": "integer",
            "maxFailedIndexes": "integer",
            "selector": "#LabelSelector",
            "manualSelector": "boolean",
            "template": "#PodTemplateSpec",
            "ttlSecondsAfterFinished": "integer",
            "completionMode": "string",
            "suspend": "boolean",
            "podReplacementPolicy": "string",
            "managedBy": "string",
        },
    ),
    "VolcanoJob": ("A Volcano batch job.", {"spec": "object", "status": "object"}),
    "PodGroup": ("A Volcano pod group: a gang scheduled together.", {"spec": "object", "status": "object"}),
    "Queue": ("A Volcano queue.", {"spec": "object", "status": "object"}),
}
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
        "time": {"type": "string", "format": "date-time"},
        "quantity": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "int-or-string": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
        },
        "object": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    }
    return scalars[type_text]


def _schema(name: str, kind_of: ResourceType | None) -> Obj:
    description, props = _TYPES[name]
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
    entry = _TYPES.get(type_name)
    return None if entry is None else entry[1]


def _refs(name: str, seen: set[str]) -> None:
    if name in seen:
        return
    seen.add(name)
    for type_text in _TYPES[name][1].values():
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
