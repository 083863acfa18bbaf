"""Kubernetes `Status` failures as one exception type.

Clients decide what to do from the `Status` body (the python client's `ApiException.status`,
kubectl's messages, a watch's 410 `Expired`), so every failure the simulator answers is built here
in the same shape a real API server uses.
"""

from __future__ import annotations

from typing import Any

from clusters.sim.resources import ResourceType

Obj = dict[str, Any]


class ApiError(Exception):
    """A failed API call, carrying the HTTP code and the `Status` reason."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(rt: ResourceType, name: str) -> Obj:
    return {"name": name, "group": rt.group, "kind": rt.plural}


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.group_resource} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{rt.group_resource} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rt.group_resource} "{name}": {why}',
        _details(rt, name),
    )


def invalid(rt: ResourceType, name: str, field: str, why: str) -> ApiError:
    details = _details(rt, name)
    details["kind"] = rt.kind
    details["causes"] = [{"reason": "FieldValueInvalid", "message": why, "field": field}]
    return ApiError(422, "Invalid", f'{rt.kind} "{name}" is invalid: {field}: {why}', details)


def namespace_terminating(rt: ResourceType, name: str, namespace: Obj) -> ApiError:
    """A create in a namespace being deleted, as the NamespaceLifecycle admission plugin words it."""
    ns = namespace["metadata"]["name"]
    details = _details(rt, name)
    details["causes"] = [
        {
            "reason": "NamespaceTerminating",
            "message": f"namespace {ns} is being terminated",
            "field": "metadata.namespace",
        }
    ]
    return ApiError(
        403,
        "Forbidden",
        f'{rt.group_resource} "{name}" is forbidden: unable to create new content in namespace {ns} '
        "because it is being terminated",
        details,
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def not_allowed(message: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media(content_type: str) -> ApiError:
    return ApiError(
        415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
    )


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def too_many_requests() -> ApiError:
    return ApiError(
        429,
        "TooManyRequests",
        "the server has received too many requests and has asked us to try again later",
        {"retryAfterSeconds": 1},
    )


def unavailable() -> ApiError:
    return ApiError(503, "ServiceUnavailable", "the server is currently unable to handle the request")


def invalid_query(field: str, why: str) -> ApiError:
    """A list or watch parameter the server refuses: `422 Invalid` naming the parameter."""
    return ApiError(
        422,
        "Invalid",
        f'ListOptions.meta.k8s.io "" is invalid: {field}: {why}',
        {
            "kind": "ListOptions",
            "group": "meta.k8s.io",
            "causes": [{"reason": "FieldValueForbidden", "message": why, "field": field}],
        },
    )
