"""Every error `iac` lets out, in one tree: a root, then retryable and permanent branches.

The capacity reconciler decides what to do with a failed provisioning call from the class alone:
retry a `RetryableIacError` later (another operation held the stack, the cloud throttled us, the
network blinked, the cloud had no capacity in the zone just now, the call ran out of time), and
give up on a `PermanentIacError` until a person changes something (quota, permissions, an invalid
pool). Subclasses name the condition so that the federation's one error map can turn each into the
right gRPC status and the right wait reason.
"""

from __future__ import annotations

from typing import ClassVar


class IacError(Exception):
    """Root of provisioning errors. `retryable` says whether the same call may succeed later."""

    retryable: ClassVar[bool] = False


class RetryableIacError(IacError):
    retryable = True


class PermanentIacError(IacError):
    retryable = False


class StackBusy(RetryableIacError):
    """Another operation holds the stack (ours, or Pulumi's lock held by another process)."""


class Throttled(RetryableIacError):
    """The cloud's API refused for a rate limit."""


class NetworkError(RetryableIacError):
    """The cloud, the state backend or the simulated cluster did not answer."""


class OperationTimedOut(RetryableIacError):
    """The operation did not finish within its timeout; its stack stays locked until it does."""


class CapacityUnavailable(RetryableIacError):
    """The cloud has no such instances in the zone right now (not a quota: it may come back)."""


class QuotaExceeded(PermanentIacError):
    """The account's quota (GPUs, vCPUs, instances) does not allow the change."""


class PermissionDenied(PermanentIacError):
    """The credentials may not make the change."""


class InvalidConfig(PermanentIacError):
    """The cloud or Pulumi refused the request as invalid, or an error nobody recognised."""


class BusyNodesProtected(PermanentIacError):
    """The change would remove a node that runs a job; gpufed never does that."""


class InvalidPoolSpec(InvalidConfig, ValueError):
    """A pool spec gpufed will not hand to Pulumi; `field` names the offending field."""

    def __init__(self, field_name: str, rule: str) -> None:
        super().__init__(f"{field_name}: {rule}")
        self.field = field_name
        self.rule = rule
