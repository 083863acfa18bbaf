"""The exceptions that cross federation's boundaries, in one tree.

Every error is either retryable (the same call may succeed later) or permanent. `federation.api.status`
is the one place that maps them to gRPC status codes; nothing else picks codes.
"""

from __future__ import annotations


class GpufedError(Exception):
    """Root of federation's errors."""

    retryable: bool = False
    # What a caller who is not an admin reads instead of the message, for errors whose message names
    # infrastructure (hosts, ports, endpoints, DSNs, a database driver's words). None: the message is
    # the caller's to read (`federation.api.redact.error_text`).
    public_message: str | None = None


class InvalidSpec(GpufedError):
    """A manifest or request field breaks a rule. Names the field so the user can fix it."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class InvalidArgument(GpufedError):
    """A request argument (not a manifest field) is unusable."""


class NotFound(GpufedError):
    pass


class PermissionDenied(GpufedError):
    pass


class Unauthenticated(GpufedError):
    pass


class IdempotencyConflict(GpufedError):
    """The idempotency key was used before with a different manifest."""


class InvalidTransition(GpufedError):
    """A phase change the transition table forbids: a bug in the caller, never retried."""


class FailedPrecondition(GpufedError):
    """The object is not in a state that allows the call (for example cancelling a finished job)."""


class StoreUnavailable(GpufedError):
    """etcd did not answer. Nothing was half-written: every write is one transaction."""

    retryable = True
    public_message = "the federation's store is unavailable; retry shortly (the server's log says why)"


class Conflict(GpufedError):
    """A compare-and-swap lost a race. Re-read and decide again."""

    retryable = True


class JobIdTaken(Conflict):
    """A new job's id (its name and 64 random bits) is already a live job's: the submission draws
    another id and tries again, so a caller never sees it (`federation.api.service`)."""


class RateLimited(GpufedError):
    """A tenant submits faster than its limit: try again after the time the message gives."""

    retryable = True


class QueueFull(GpufedError):
    """A submission would take a tenant's queued jobs (or the federation's) past their limit
    (`maxQueuedJobs`): try again once some of them have been placed or cancelled."""

    retryable = True


class NotLeader(GpufedError):
    """This server does not hold the leader lease, so it may not commit scheduling decisions."""

    retryable = True
