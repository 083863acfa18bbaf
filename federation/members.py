"""The member clusters this server drives, built from their stored records.

Federation sees every cluster only through `clusters.api.ClusterBackend`; this module picks the
backend for each record and turns a cluster that does not answer into a value (unreachable), never
an exception that would stop a scheduling cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import structlog

from clusters.api import ClusterBackend, ClusterError, GangStatus
from clusters.memory import InMemoryCluster
from federation.records import ClusterRecord
from placement.model import ClusterName, ClusterState, JobId

log = structlog.get_logger("gpufed.members")

GangKey = tuple[JobId, int]


def _unreachable_state(record: ClusterRecord) -> ClusterState:
    return ClusterState(
        name=record.name,
        provider=record.provider,
        region=record.region,
        pools=tuple(p.with_free(()) for p in record.pools),
        reachable=False,
        object_store=record.object_store,
    )


class MemberClusters:
    def __init__(
        self, records: Sequence[ClusterRecord], backends: Mapping[ClusterName, ClusterBackend]
    ) -> None:
        self._records = {r.name: r for r in records}
        self._backends = dict(backends)

    @classmethod
    def build(
        cls,
        records: Sequence[ClusterRecord],
        *,
        state_dir: Path | None,
        clock: Callable[[], float] = time.time,
    ) -> MemberClusters:
        backends: dict[ClusterName, ClusterBackend] = {}
        for record in records:
            if record.backend != "memory":
                raise ValueError(f"cluster {record.name}: backend {record.backend!r} is not available yet")
            journal = None
            if state_dir is not None:
                (state_dir / "clusters").mkdir(parents=True, exist_ok=True)
                journal = state_dir / "clusters" / f"{record.name}.journal"
            backends[record.name] = InMemoryCluster(
                record.name,
                provider=record.provider,
                region=record.region,
                pools=record.pools,
                object_store=record.object_store,
                journal_path=journal,
                clock=clock,
            )
        return cls(records, backends)

    @property
    def names(self) -> list[ClusterName]:
        return sorted(self._backends)

    def get(self, name: ClusterName) -> ClusterBackend | None:
        return self._backends.get(name)

    def unreachable_grace_s(self, name: ClusterName) -> float:
        record = self._records.get(name)
        return 120.0 if record is None else record.unreachable_grace_s

    async def inventories(self) -> list[ClusterState]:
        states = []
        for name in self.names:
            try:
                states.append(await self._backends[name].inventory())
            except ClusterError as error:
                log.warning("cluster_inventory_failed", cluster=name, error=str(error))
                states.append(_unreachable_state(self._records[name]))
        return states

    async def statuses(self) -> dict[ClusterName, dict[GangKey, GangStatus] | None]:
        """Each cluster's gangs by (job, attempt); None for a cluster that did not answer."""
        result: dict[ClusterName, dict[GangKey, GangStatus] | None] = {}
        for name in self.names:
            try:
                result[name] = {(s.job_id, s.attempt): s for s in await self._backends[name].statuses()}
            except ClusterError as error:
                log.warning("cluster_status_failed", cluster=name, error=str(error))
                result[name] = None
        return result
