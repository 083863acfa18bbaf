"""Ids and enumerations every placement value type refers to.

They live apart from the value types so that the model can be split into small modules (jobs and
clusters, tenants and policy, the plan) without import cycles. `placement.model` re-exports them;
import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import NewType

from placement.model_values import keep_as_values

JobId = NewType("JobId", str)
TenantId = NewType("TenantId", str)
ClusterName = NewType("ClusterName", str)
# A GPU product as the placer compares them: "A100", "H100", "L4", ...
GpuType = NewType("GpuType", str)


class JobPhase(StrEnum):
    """Where a job is in its life. Transitions are checked against one table (federation.store.jobs)."""

    QUEUED = "QUEUED"
    ADMITTED = "ADMITTED"
    STAGING = "STAGING"
    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_PHASES

    @property
    def holds_capacity(self) -> bool:
        """Phases in which the job's gang counts against quota and cluster capacity."""
        return self in _CAPACITY_PHASES


_TERMINAL_PHASES = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED})
_CAPACITY_PHASES = frozenset({JobPhase.ADMITTED, JobPhase.STAGING, JobPhase.DISPATCHED, JobPhase.RUNNING})


class Provider(StrEnum):
    PRIVATE = "private"
    AWS = "aws"
    GCP = "gcp"
    AZURE = "azure"
    LAMBDA = "lambda"
    NEBIUS = "nebius"


class CapacityKind(StrEnum):
    """How a GPU is paid for: owned capacity at an internal rate, or cloud on demand or spot."""

    PRIVATE = "private"
    ON_DEMAND = "on_demand"
    SPOT = "spot"


class GpuTypePolicy(StrEnum):
    """How a job's list of acceptable GPU types is read."""

    # Try the types in the order given; a later type is used only when no earlier one fits.
    ORDERED = "ordered"
    # Any type in the set is acceptable; the cheapest expected cost wins (speeds count).
    ANY = "any"


@dataclass(frozen=True, slots=True)
class Pinning:
    """Where a job may run, as its manifest's `spec.placement` says (data residency, say).

    Each "only" list, when not empty, must name the cluster's value; each "not" list must not.
    Clouds are `Provider` values ("private", "aws", ...). The empty default allows every cluster.
    """

    clusters: tuple[str, ...] = ()
    exclude_clusters: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    exclude_regions: tuple[str, ...] = ()
    clouds: tuple[str, ...] = ()
    exclude_clouds: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(
            self.clusters
            or self.exclude_clusters
            or self.regions
            or self.exclude_regions
            or self.clouds
            or self.exclude_clouds
        )

    # The dataclass's equality and hash, written out (the dataclass leaves a class's own): compiled,
    # the generated ones are Python functions, and every gang's decision key holds its rules, hashed
    # and compared as the cycle numbers kinds. The same values (`test_placement_values`).
    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Pinning:
            return NotImplemented
        assert isinstance(other, Pinning)
        return (
            self.clusters == other.clusters
            and self.exclude_clusters == other.exclude_clusters
            and self.regions == other.regions
            and self.exclude_regions == other.exclude_regions
            and self.clouds == other.clouds
            and self.exclude_clouds == other.exclude_clouds
        )

    def __hash__(self) -> int:
        return hash(
            (
                self.clusters,
                self.exclude_clusters,
                self.regions,
                self.exclude_regions,
                self.clouds,
                self.exclude_clouds,
            )
        )

    def allows_site(self, region: str, cloud: str) -> bool:
        """`allows`' test of the region and cloud alone (the cluster's name aside)."""
        if self.regions and region not in self.regions:
            return False
        if self.clouds and cloud not in self.clouds:
            return False
        return region not in self.exclude_regions and cloud not in self.exclude_clouds

    def allows(self, cluster: str, region: str, cloud: str) -> bool:
        # Tested in place, with no pairs built per call: asked for every cluster of every distinct
        # rule in each cycle (`Inventory.eligible`).
        if self.clusters and cluster not in self.clusters:
            return False
        if self.regions and region not in self.regions:
            return False
        if self.clouds and cloud not in self.clouds:
            return False
        return (
            cluster not in self.exclude_clusters
            and region not in self.exclude_regions
            and cloud not in self.exclude_clouds
        )


NO_PINNING = Pinning()
# Its fields' names, in order. Read from the dataclass, not `__slots__`: a compiled (mypyc) class has none.
PINNING_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Pinning))


keep_as_values(Pinning)
