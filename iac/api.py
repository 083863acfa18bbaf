"""What federation asks of node-pool provisioning: the `Provisioner` protocol and its values.

It lives here, beside the values it returns, as `clusters/api.py` does for `ClusterBackend`: the
capacity reconciler in `federation` consumes it, and `iac` may not import `federation`. Three
implementations: `PulumiProvisioner` (the Automation API, `iac/automation.py`),
`SimulatedProvisioner` (resizes the simulated clusters after a lead time) and
`InMemoryProvisioner` (unit tests), both in `iac/simulated.py`.

Every change can be previewed with its cost per hour before and after, so a person (or the spend
ceiling) can refuse it before anything is paid for. No provisioner removes a node that runs a job:
the caller says how many nodes are busy, and a change below that is refused (`BusyNodesProtected`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from iac.errors import (
    BusyNodesProtected,
    CapacityUnavailable,
    IacError,
    InvalidConfig,
    InvalidPoolSpec,
    NetworkError,
    OperationTimedOut,
    PermanentIacError,
    PermissionDenied,
    QuotaExceeded,
    RetryableIacError,
    StackBusy,
    Throttled,
)
from iac.pools import PoolSpec

__all__ = [
    "BusyNodesProtected",
    "CapacityUnavailable",
    "ChangePreview",
    "ChangeResult",
    "IacError",
    "InvalidConfig",
    "InvalidPoolSpec",
    "NetworkError",
    "Operation",
    "OperationTimedOut",
    "PendingOperation",
    "PermanentIacError",
    "PermissionDenied",
    "PoolStatus",
    "Provisioner",
    "QuotaExceeded",
    "RetryableIacError",
    "StackBusy",
    "Throttled",
    "check_not_below_busy",
    "usd_per_hour",
]


class Operation(StrEnum):
    PREVIEW = "preview"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    DESTROY = "destroy"
    REFRESH = "refresh"


@dataclass(frozen=True, slots=True)
class ChangePreview:
    """What scaling a pool to `nodes_after` would do and cost; nothing has been applied."""

    pool_id: str
    nodes_before: int
    nodes_after: int
    usd_per_hour_before: float
    usd_per_hour_after: float
    # What Pulumi would do, by operation ("create", "update", "same", ...), where Pulumi was asked.
    steps: tuple[tuple[str, int], ...] = field(default=())

    @property
    def usd_per_hour_delta(self) -> float:
        return self.usd_per_hour_after - self.usd_per_hour_before


@dataclass(frozen=True, slots=True)
class ChangeResult:
    pool_id: str
    nodes_before: int
    nodes: int
    # When the nodes are expected to be ready (now plus the provisioning lead time for a scale-up,
    # now for a scale-down), on the provisioner's clock.
    ready_at_s: float
    usd_per_hour_before: float = 0.0
    usd_per_hour_after: float = 0.0


@dataclass(frozen=True, slots=True)
class PendingOperation:
    """An operation under way on a pool: started, not yet finished (or its nodes not yet ready)."""

    pool_id: str
    operation: Operation
    nodes_from: int
    nodes_to: int
    started_at_s: float
    # When it is expected to be done (None: not known, e.g. a Pulumi call still running).
    ready_at_s: float | None = None


@dataclass(frozen=True, slots=True)
class PoolStatus:
    pool_id: str
    # Whether the pool exists at all (a destroyed or never-created pool does not).
    exists: bool
    # The node count asked for (including nodes still booting) and the nodes ready now.
    nodes: int
    ready_nodes: int
    usd_per_hour: float
    pending: tuple[PendingOperation, ...] = ()


def usd_per_hour(spec: PoolSpec, nodes: int) -> float:
    """What `nodes` nodes of the pool cost per hour: nodes x GPUs per node x price per GPU-hour."""
    return nodes * spec.node_gpus * spec.usd_per_gpu_hour


def check_not_below_busy(spec: PoolSpec, nodes: int, busy_nodes: int) -> None:
    """Refuse a change that would leave fewer nodes than run jobs now."""
    if nodes < busy_nodes:
        raise BusyNodesProtected(
            f"{spec.pool_id}: {nodes} node(s) asked for, but {busy_nodes} run jobs; "
            "gpufed never removes a node that runs a job"
        )


class Provisioner(Protocol):
    """Node pools, one at a time per pool. Every method takes the pool's full spec, so a
    provisioner needs no registry of its own; errors are `IacError`s (see `iac/errors.py`)."""

    async def preview(self, spec: PoolSpec, nodes: int) -> ChangePreview:
        """What scaling (or creating) the pool to `nodes` would change and cost; nothing is applied."""
        ...

    async def apply(self, spec: PoolSpec, nodes: int, *, busy_nodes: int = 0) -> ChangeResult:
        """Scale (or create) the pool to `nodes`. `busy_nodes` is how many of its nodes run jobs now
        (from the cluster's inventory): asking for fewer raises `BusyNodesProtected`. For a pool an
        autoscaler owns, `nodes` becomes the autoscaler's floor (its minimum)."""
        ...

    async def destroy(self, spec: PoolSpec, *, busy_nodes: int = 0) -> ChangeResult:
        """Remove the pool entirely (refused while any node runs a job)."""
        ...

    async def refresh(self, spec: PoolSpec) -> PoolStatus:
        """Read the pool back from its cloud (or simulated cluster): the real node count."""
        ...

    async def status(self, spec: PoolSpec) -> PoolStatus:
        """What this provisioner knows of the pool without asking the cloud: the count asked for,
        the nodes ready, and the operations still pending."""
        ...
