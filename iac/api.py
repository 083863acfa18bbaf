"""What federation asks of node-pool provisioning: the `Provisioner` protocol and its values.

It lives here, beside the values it returns, as `clusters/api.py` does for `ClusterBackend`: the
capacity reconciler in `federation` consumes it, and `iac` may not import `federation`. Three
implementations: `PulumiProvisioner` (the Automation API), `SimulatedProvisioner` (resizes the
simulated clusters after a lead time) and `InMemoryProvisioner` (unit tests).

Every change is previewed with its cost per hour before and after, so a person (or the spend
ceiling) can refuse it before anything is paid for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from iac.pools import PoolSpec


class IacError(Exception):
    """Root of provisioning errors. `retryable` says whether the same call may succeed later."""

    retryable: bool = False


class RetryableIacError(IacError):
    """Another operation holds the stack, the cloud throttled us, the network blinked, a timeout."""

    retryable = True


class PermanentIacError(IacError):
    """Quota, permissions, an invalid request: retrying the same call will not help."""

    retryable = False


@dataclass(frozen=True, slots=True)
class ChangePreview:
    pool_id: str
    nodes_before: int
    nodes_after: int
    usd_per_hour_before: float
    usd_per_hour_after: float
    # What Pulumi would do, by operation ("create", "update", "same", ...), when it was asked.
    steps: tuple[tuple[str, int], ...] = field(default=())

    @property
    def usd_per_hour_delta(self) -> float:
        return self.usd_per_hour_after - self.usd_per_hour_before


@dataclass(frozen=True, slots=True)
class ChangeResult:
    pool_id: str
    nodes: int
    # When the nodes are expected to be ready (a provisioning lead time), on the caller's clock.
    ready_at_s: float


def usd_per_hour(spec: PoolSpec, nodes: int) -> float:
    return nodes * spec.gpus_per_node * spec.usd_per_gpu_hour


class Provisioner(Protocol):
    async def preview(self, spec: PoolSpec, nodes: int) -> ChangePreview:
        """What scaling the pool to `nodes` would change and cost; nothing is applied."""
        ...

    async def apply(self, spec: PoolSpec, nodes: int) -> ChangeResult:
        """Scale (or create) the pool to `nodes`. One operation per pool at a time."""
        ...

    async def destroy(self, spec: PoolSpec) -> None:
        """Remove the pool entirely."""
        ...

    async def refresh(self, spec: PoolSpec) -> int:
        """Read the pool's real node count back from its cloud."""
        ...
