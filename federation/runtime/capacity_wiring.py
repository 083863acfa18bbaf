"""Capacity for one server: the Capacity API on every server, the reconciler on the leader.

Built from what etcd holds (the capacity settings bootstrap wrote, the cluster records), so every
server of a federation provisions the same way. The server calls `tick` after each scheduling
cycle while it leads; a failure there is logged and never stops scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from federation.api.capacity import CapacityService
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.capacity.pools import build_provisioner, scalable_pools
from federation.capacity.reconciler import CapacityReconciler
from federation.capacity.store import CapacityStore
from federation.metrics import Metrics
from federation.scheduling.members import MemberClusters
from federation.security.auth import Authenticator
from federation.security.tokens import SecurityStore
from federation.store.job_cache import JobCache
from federation.store.job_store import Fence, JobStore
from federation.store.jobs import JobRecord
from federation.store.kv import KeyValueStore
from iac.api import Provisioner
from placement.model import JobId

log = structlog.get_logger("gpufed.capacity")


@dataclass(slots=True)
class CapacityWiring:
    service: CapacityService
    reconciler: CapacityReconciler | None
    provisioner: Provisioner | None

    @classmethod
    async def build(
        cls,
        *,
        kv: KeyValueStore,
        store: JobStore,
        cache: JobCache,
        members: MemberClusters,
        auth: Authenticator,
        metrics: Metrics,
        state_dir: Path,
    ) -> CapacityWiring:
        capacity = CapacityStore(kv)
        settings = await capacity.get_settings()
        records = await store.list_clusters()

        def job(job_id: JobId) -> JobRecord | None:
            stored = cache.get(job_id)
            return None if stored is None else stored.value

        service = CapacityService(
            store=store,
            capacity=capacity,
            auth=auth,
            metrics=metrics,
            inventories=members.inventories,
            job=job,
            security=SecurityStore(kv),
        )
        provisioner = build_provisioner(settings, records, state_dir=state_dir)
        reconciler = None
        pools = scalable_pools(records, settings)
        if provisioner is not None and any(e.spec is not None for e in pools.values()):
            reconciler = CapacityReconciler(
                store=capacity,
                provisioner=provisioner,
                settings=settings,
                pools=pools,
                inventories=members.inventories,
                job=job,
                # The jobs past the queue are the ones that can hold a pool's nodes (admitted,
                # staging, dispatched): read from those, not from every live job, which at depth is
                # a million queued ones per pool and pass.
                live_jobs=lambda: [s.value for s in cache.acting_jobs()],
            )
        log.info(
            "capacity_configured",
            provisioner=settings.provisioner.value,
            pools=sorted(f"{c}/{p}" for c, p in pools),
            lead_time_s=settings.lead_time_s,
            idle_ttl_s=settings.idle_ttl_s,
        )
        return cls(service, reconciler, provisioner)

    def register(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_CapacityServicer_to_server(self.service, server)

    async def tick(self, fence: Fence) -> None:
        if self.reconciler is None:
            return
        try:
            await self.reconciler.tick(fence)
        except Exception as error:
            # Capacity is an optimisation of the queue, never a reason to stop scheduling it.
            log.exception("capacity_tick_failed", error=str(error))

    async def close(self) -> None:
        close = getattr(self.provisioner, "close", None)
        if close is not None:
            await close()
