"""The one place that maps federation's exceptions to gRPC status codes."""

from __future__ import annotations

import grpc

from federation.errors import (
    Conflict,
    FailedPrecondition,
    GpufedError,
    IdempotencyConflict,
    InvalidArgument,
    InvalidSpec,
    InvalidTransition,
    NotFound,
    NotLeader,
    PermissionDenied,
    QueueFull,
    RateLimited,
    StoreUnavailable,
    Unauthenticated,
)

_CODES: tuple[tuple[type[GpufedError], grpc.StatusCode], ...] = (
    (InvalidSpec, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (IdempotencyConflict, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
    (NotLeader, grpc.StatusCode.UNAVAILABLE),
    (RateLimited, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Conflict, grpc.StatusCode.ABORTED),
    (InvalidTransition, grpc.StatusCode.INTERNAL),
)


def status_code_for(error: GpufedError) -> grpc.StatusCode:
    for error_type, code in _CODES:
        if isinstance(error, error_type):
            return code
    return grpc.StatusCode.UNAVAILABLE if error.retryable else grpc.StatusCode.INTERNAL
