"""Errors of the official client turned into `clusters.api` errors, in one place.

The client raises `ApiException` for an HTTP answer it did not like and lets urllib3's and the
socket's errors through for no answer at all. Federation needs only two questions answered: could
trying again help (the cluster is unreachable, overloaded or timing out), or will the cluster never
take this gang as written.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from clusters.api import ClusterError, ClusterUnreachable, GangRejected


class ApiRefused(ClusterError):
    """The API answered a call other than a dispatch with a client error (forbidden, invalid)."""

    retryable = False


class NamespaceTerminating(ClusterError):
    """The tenant's namespace is being deleted: objects cannot be created in it until it is gone."""

    retryable = True


# Answers that say "not now" rather than "not this": worth trying again, perhaps elsewhere.
_RETRYABLE_STATUS = frozenset({0, 408, 425, 429})
# Expired or refused credentials: a rotated token may fix it; the cluster is unusable meanwhile.
_AUTH_STATUS = frozenset({401, 403})

NO_ANSWER: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError, OSError, TimeoutError)


def status_of(error: BaseException) -> int | None:
    if isinstance(error, ApiException):
        return int(error.status or 0)
    return None


def reason_of(error: ApiException) -> str:
    """The Status message from the body when there is one (it says what was invalid)."""
    body: Any = error.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        try:
            status = json.loads(body)
        except ValueError:
            return body[:500]
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])
    return str(error.reason or "")


def is_no_answer(error: BaseException) -> bool:
    """Did the call fail for want of an answer (rather than because of what the API said)?"""
    if isinstance(error, ApiException):
        status = int(error.status or 0)
        return status in _RETRYABLE_STATUS or status >= 500
    return isinstance(error, NO_ANSWER)


def translate(error: BaseException, cluster: str, doing: str, *, dispatching: bool = False) -> ClusterError:
    """The `clusters.api` error for a failed call; `dispatching` makes client errors rejections."""
    if isinstance(error, ClusterError):
        return error
    if not isinstance(error, ApiException):
        return ClusterUnreachable(f"cluster {cluster}: {doing}: no answer from the API ({error!r})")
    status = int(error.status or 0)
    message = f"cluster {cluster}: {doing}: HTTP {status} {reason_of(error)}".rstrip()
    if status in _RETRYABLE_STATUS or status >= 500:
        return ClusterUnreachable(message)
    if status == 403 and "being terminated" in message:
        # A real API server refuses new objects while a deleted namespace empties; it is made
        # again once gone, so this is "not now", not "not this".
        return NamespaceTerminating(f"{message} (the namespace is being deleted; it is recreated once gone)")
    if status == 403:
        # RBAC refused one verb: the message names it; `cluster check` lists every one missing.
        return ClusterUnreachable(
            f"{message} (gpufed's account on the cluster lacks this permission: "
            f"`gpufed cluster check {cluster}` lists what is missing)"
        )
    if status in _AUTH_STATUS:
        return ClusterUnreachable(f"{message} (credentials refused)")
    if dispatching:
        return GangRejected(message)
    return ApiRefused(message)
