"""Request bodies in Kubernetes protobuf (`application/vnd.kubernetes.protobuf`), decoded to JSON.

kubectl's typed clients (`create namespace`, `create job`, `create configmap`, `drain`'s evictions)
send built-in objects as protobuf and do not fall back to JSON on `415`, so a server that cannot read
protobuf cannot serve them. The simulator decodes the envelope (`k8s\\0` and a `runtime.Unknown`) and
the messages of the kinds it serves from a table of field numbers (those of k8s.io/api's
generated.proto), and answers in JSON, which these clients accept. Non-pointer fields that protobuf
writes even when empty are dropped when zero, as JSON would have omitted them. A field the table
does not know, carrying a value, is refused with `415` naming it, rather than silently lost.
"""

from __future__ import annotations

import base64
from typing import Any

from clusters.sim import errors
from clusters.sim.clock import rfc3339

Obj = dict[str, Any]
MEDIA = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"

# Field types: s string, i integer, b bool, y bytes, t Time, q Quantity, io IntOrString,
# ms map<string,string>, mq map<string,Quantity>, my map<string,bytes>, <Name> a message,
# `-` a field read and dropped (server-owned, like status). `*` repeated, `?` a pointer (kept when zero).
_MESSAGES: dict[str, dict[int, tuple[str, str]]] = {
    "Unknown": {
        1: ("typeMeta", "TypeMeta"),
        2: ("raw", "y"),
        3: ("contentEncoding", "s"),
        4: ("contentType", "s"),
    },
    "TypeMeta": {1: ("apiVersion", "s"), 2: ("kind", "s")},
    "ObjectMeta": {
        1: ("name", "s"),
        2: ("generateName", "s"),
        3: ("namespace", "s"),
        4: ("selfLink", "s"),
        5: ("uid", "s"),
        6: ("resourceVersion", "s"),
        7: ("generation", "i"),
        8: ("creationTimestamp", "t"),
        9: ("deletionTimestamp", "t"),
        10: ("deletionGracePeriodSeconds", "?i"),
        11: ("labels", "ms"),
        12: ("annotations", "ms"),
        13: ("ownerReferences", "*OwnerReference"),
        14: ("finalizers", "*s"),
        17: ("managedFields", "-"),
    },
    "OwnerReference": {
        1: ("kind", "s"),
        3: ("name", "s"),
        4: ("uid", "s"),
        5: ("apiVersion", "s"),
        6: ("controller", "?b"),
        7: ("blockOwnerDeletion", "?b"),
    },
    "Time": {1: ("seconds", "i"), 2: ("nanos", "i")},
    "Quantity": {1: ("string", "s")},
    "IntOrString": {1: ("type", "i"), 2: ("intVal", "i"), 3: ("strVal", "s")},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec"), 3: ("status", "-")},
    "NamespaceSpec": {1: ("finalizers", "*s")},
    "ConfigMap": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "ms"),
        3: ("binaryData", "my"),
        4: ("immutable", "?b"),
    },
    "PriorityClass": {
        1: ("metadata", "ObjectMeta"),
        2: ("value", "?i"),
        3: ("globalDefault", "b"),
        4: ("description", "s"),
        5: ("preemptionPolicy", "?s"),
    },
    "Lease": {1: ("metadata", "ObjectMeta"), 2: ("spec", "LeaseSpec")},
    "LeaseSpec": {
        1: ("holderIdentity", "?s"),
        2: ("leaseDurationSeconds", "?i"),
        3: ("acquireTime", "t"),
        4: ("renewTime", "t"),
        5: ("leaseTransitions", "?i"),
    },
    "Job": {1: ("metadata", "ObjectMeta"), 2: ("spec", "JobSpec"), 3: ("status", "-")},
    "JobSpec": {
        1: ("parallelism", "?i"),
        2: ("completions", "?i"),
        3: ("activeDeadlineSeconds", "?i"),
        4: ("selector", "LabelSelector"),
        5: ("manualSelector", "?b"),
        6: ("template", "PodTemplateSpec"),
        7: ("backoffLimit", "?i"),
        8: ("ttlSecondsAfterFinished", "?i"),
        9: ("completionMode", "?s"),
        10: ("suspend", "?b"),
        12: ("backoffLimitPerIndex", "?i"),
        13: ("maxFailedIndexes", "?i"),
        14: ("podReplacementPolicy", "?s"),
        15: ("managedBy", "?s"),
    },
    "LabelSelector": {1: ("matchLabels", "ms"), 2: ("matchExpressions", "*LabelSelectorRequirement")},
    "LabelSelectorRequirement": {1: ("key", "s"), 2: ("operator", "s"), 3: ("values", "*s")},
    "PodTemplateSpec": {1: ("metadata", "ObjectMeta"), 2: ("spec", "PodSpec")},
    "PodSpec": {
        2: ("containers", "*Container"),
        3: ("restartPolicy", "s"),
        4: ("terminationGracePeriodSeconds", "?i"),
        5: ("activeDeadlineSeconds", "?i"),
        6: ("dnsPolicy", "s"),
        7: ("nodeSelector", "ms"),
        8: ("serviceAccountName", "s"),
        9: ("serviceAccount", "s"),
        10: ("nodeName", "s"),
        11: ("hostNetwork", "b"),
        16: ("hostname", "s"),
        17: ("subdomain", "s"),
        19: ("schedulerName", "s"),
        20: ("initContainers", "*Container"),
        22: ("tolerations", "*Toleration"),
        24: ("priorityClassName", "s"),
        25: ("priority", "?i"),
    },
    "Container": {
        1: ("name", "s"),
        2: ("image", "s"),
        3: ("command", "*s"),
        4: ("args", "*s"),
        5: ("workingDir", "s"),
        6: ("ports", "*ContainerPort"),
        7: ("env", "*EnvVar"),
        8: ("resources", "ResourceRequirements"),
        13: ("terminationMessagePath", "s"),
        14: ("imagePullPolicy", "s"),
        16: ("stdin", "b"),
        17: ("stdinOnce", "b"),
        18: ("tty", "b"),
        20: ("terminationMessagePolicy", "s"),
    },
    "ContainerPort": {
        1: ("name", "s"),
        2: ("hostPort", "i"),
        3: ("containerPort", "i"),
        4: ("protocol", "s"),
        5: ("hostIP", "s"),
    },
    "EnvVar": {1: ("name", "s"), 2: ("value", "s")},
    "ResourceRequirements": {1: ("limits", "mq"), 2: ("requests", "mq")},
    "Toleration": {
        1: ("key", "s"),
        2: ("operator", "s"),
        3: ("value", "s"),
        4: ("effect", "s"),
        5: ("tolerationSeconds", "?i"),
    },
    "Service": {1: ("metadata", "ObjectMeta"), 2: ("spec", "ServiceSpec"), 3: ("status", "-")},
    "ServiceSpec": {
        1: ("ports", "*ServicePort"),
        2: ("selector", "ms"),
        3: ("clusterIP", "s"),
        4: ("type", "s"),
        5: ("externalIPs", "*s"),
        7: ("sessionAffinity", "s"),
        10: ("externalName", "s"),
        13: ("publishNotReadyAddresses", "b"),
        17: ("ipFamilyPolicy", "?s"),
        18: ("clusterIPs", "*s"),
        19: ("ipFamilies", "*s"),
        22: ("internalTrafficPolicy", "?s"),
    },
    "ServicePort": {
        1: ("name", "s"),
        2: ("protocol", "s"),
        3: ("port", "i"),
        4: ("targetPort", "io"),
        5: ("nodePort", "i"),
        6: ("appProtocol", "?s"),
    },
    "Eviction": {1: ("metadata", "ObjectMeta"), 2: ("deleteOptions", "DeleteOptions")},
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "?i"),
        2: ("preconditions", "Preconditions"),
        3: ("orphanDependents", "?b"),
        4: ("propagationPolicy", "?s"),
        5: ("dryRun", "*s"),
    },
    "Preconditions": {1: ("uid", "?s"), 2: ("resourceVersion", "?s")},
    # `kubectl auth can-i` (k8s.io/api/authorization/v1); the answer's status is the server's.
    "SelfSubjectAccessReview": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "SelfSubjectAccessReviewSpec"),
        3: ("status", "-"),
    },
    "SelfSubjectAccessReviewSpec": {
        1: ("resourceAttributes", "ResourceAttributes"),
        2: ("nonResourceAttributes", "NonResourceAttributes"),
    },
    "ResourceAttributes": {
        1: ("namespace", "s"),
        2: ("verb", "s"),
        3: ("group", "s"),
        4: ("version", "s"),
        5: ("resource", "s"),
        6: ("subresource", "s"),
        7: ("name", "s"),
        8: ("fieldSelector", "-"),
        9: ("labelSelector", "-"),
    },
    "NonResourceAttributes": {1: ("path", "s"), 2: ("verb", "s")},
}
# The message of each kind a protobuf body may carry.
_KINDS = {
    "Namespace": "Namespace",
    "ConfigMap": "ConfigMap",
    "PriorityClass": "PriorityClass",
    "Lease": "Lease",
    "Job": "Job",
    "Service": "Service",
    "Eviction": "Eviction",
    "DeleteOptions": "DeleteOptions",
    "SelfSubjectAccessReview": "SelfSubjectAccessReview",
}


def _varint(data: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(data):
            raise errors.bad_request("truncated protobuf body")
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, i


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    out: list[tuple[int, int, Any]] = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            out.append((number, wire, value))
        elif wire == 2:
            length, i = _varint(data, i)
            out.append((number, wire, data[i : i + length]))
            i += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            out.append((number, wire, data[i : i + width]))
            i += width
        else:
            raise errors.bad_request(f"unsupported protobuf wire type {wire}")
    return out


def _scalar(kind: str, raw: Any, where: str) -> Any:
    if kind == "s":
        return bytes(raw).decode()
    if kind == "y":
        return base64.b64encode(bytes(raw)).decode()
    if kind == "i":
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if kind == "b":
        return bool(raw)
    if kind == "t":
        seconds = message("Time", raw, where).get("seconds", 0)
        return rfc3339(float(seconds)) if seconds else None
    if kind == "q":
        return message("Quantity", raw, where).get("string", "")
    if kind == "io":
        value = message("IntOrString", raw, where)
        return value.get("strVal", "") if value.get("type") == 1 else value.get("intVal", 0)
    return message(kind, raw, where)


def _zero(value: Any) -> bool:
    return value is None or value in ("", 0, False) or value == {} or value == []


def message(name: str, data: bytes, where: str = "") -> Obj:
    """One protobuf message as the JSON object it stands for."""
    table = _MESSAGES[name]
    out: Obj = {}
    for number, _wire, raw in _fields(bytes(data)):
        spec = table.get(number)
        if spec is None:
            if raw in (0, b""):
                continue
            raise errors.unsupported_media(
                f"{MEDIA}: field {number} of {name} (at {where or name}) is not one the simulator decodes; "
                "send the object as JSON"
            )
        field, kind = spec
        if kind == "-":
            continue
        pointer, repeated = kind.startswith("?"), kind.startswith("*")
        kind = kind.lstrip("?*")
        path = f"{where}.{field}" if where else field
        if kind in ("ms", "mq", "my"):
            entry = {n: r for n, _w, r in _fields(bytes(raw))}
            value_kind = {"ms": "s", "mq": "q", "my": "y"}[kind]
            key = bytes(entry.get(1, b"")).decode()
            out.setdefault(field, {})[key] = _scalar(value_kind, entry.get(2, b""), f"{path}[{key}]")
            continue
        value = _scalar(kind, raw, path)
        if repeated:
            out.setdefault(field, []).append(value)
        elif pointer or not _zero(value):
            out[field] = value
    return {k: v for k, v in out.items() if not (isinstance(v, dict) and not v and k not in ("data",))}


def decode(body: bytes) -> Obj:
    """A whole request body: the envelope, then the object of the kind it names."""
    if not body.startswith(_MAGIC):
        raise errors.bad_request("a protobuf body must start with the k8s\\0 envelope")
    unknown = message("Unknown", body[len(_MAGIC) :])
    type_meta = unknown.get("typeMeta") or {}
    kind = str(type_meta.get("kind", ""))
    if kind not in _KINDS:
        raise errors.unsupported_media(
            f"{MEDIA}: the simulator decodes protobuf only for {', '.join(sorted(_KINDS))}, not {kind!r}; "
            "send the object as JSON"
        )
    raw = base64.b64decode(unknown.get("raw", ""))
    obj = message(_KINDS[kind], raw, kind)
    obj["apiVersion"] = type_meta.get("apiVersion", "")
    obj["kind"] = kind
    return obj
