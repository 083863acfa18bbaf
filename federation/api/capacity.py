"""The Capacity service: the infra team's capacity plans and the scalable pools, over gRPC.

Who may do what (kept here with the calls, as the capacity rules concern no tenant): infra and
admins create and cancel plans; admin, infra and finance read plans and pools (finance for their
cost); members are refused, since plans and pools span every tenant (a member's `explain` says what
capacity is doing for its job). Every request is checked field by field before anything is stored,
and a refusal names the field.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import structlog
from google.protobuf.timestamp_pb2 import Timestamp

from federation.api import convert
from federation.api.service import CallHandlers, Ctx
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.capacity.pools import PoolKey, ScalablePoolEntry, scalable_pools
from federation.capacity.preview import held_now, need_usd_per_hour, plan_state, pool_states, preview
from federation.capacity.records import CapacitySettings, PendingOp, PlanKind, PlanRecord
from federation.capacity.store import CapacityStore
from federation.capacity.track import plan_values, pool_usage
from federation.errors import Conflict, FailedPrecondition, InvalidArgument, NotFound
from federation.metrics import Metrics
from federation.security.auth import (
    Authenticator,
    Principal,
    can_read_tenant,
    check_change_plans,
    check_name_jobs_in_plan,
    check_read_capacity,
)
from federation.security.tokens import AuditEvent, SecurityStore
from federation.spec.validate import shown
from federation.store.job_store import JobStore
from federation.store.jobs import JobRecord
from iac.pool_state import PoolState
from placement.model import ClusterName, ClusterState, GpuType, JobId

log = structlog.get_logger("gpufed.api")

MAX_PLAN_GPUS = 65_536
MAX_PLAN_JOBS = 256
MAX_REASON_LENGTH = 500
MAX_ID_LENGTH = 128
# Plans are for the weeks ahead, not for years: a typo in a year should not hold GPUs for one.
MAX_AHEAD_S = 400 * 86_400.0


def _seconds(ts: Timestamp, field: str, now_s: float) -> float:
    value = ts.seconds + ts.nanos / 1e9
    if not math.isfinite(value) or abs(value - now_s) > MAX_AHEAD_S:
        raise InvalidArgument(f"{field}: must be within 400 days of now")
    return value


def plan_from_request(
    req: pb.CapacityPlanRequest,
    who: Principal,
    *,
    now_s: float,
    pools: dict[PoolKey, ScalablePoolEntry],
) -> PlanRecord:
    """The plan a request describes, or InvalidArgument naming the first bad field."""
    if req.kind not in (PlanKind.FIXED.value, PlanKind.DEADLINE.value):
        raise InvalidArgument(f"kind: must be fixed or deadline, got {shown(req.kind)}")
    kind = PlanKind(req.kind)
    clusters = {k[0] for k in pools}
    if req.cluster not in clusters:
        known = ", ".join(sorted(clusters)) or "none"
        raise InvalidArgument(f"cluster: {shown(req.cluster)} is not a scalable cluster (scalable: {known})")
    here = [e for k, e in pools.items() if k[0] == req.cluster]
    types = sorted({e.config.gpu_type for e in here})
    if req.gpu_type not in types:
        raise InvalidArgument(
            f"gpu_type: {req.cluster} has no scalable {shown(req.gpu_type)} pool ({', '.join(types)})"
        )
    if req.pool and not any(e.config.name == req.pool and e.config.gpu_type == req.gpu_type for e in here):
        raise InvalidArgument(
            f"pool: {shown(req.pool)} is not a scalable {req.gpu_type} pool of {req.cluster}"
        )
    if len(req.reason) > MAX_REASON_LENGTH:
        raise InvalidArgument(f"reason: at most {MAX_REASON_LENGTH} characters")
    if not req.HasField("end"):
        raise InvalidArgument("end: required (the end of a fixed plan, the deadline of a deadline plan)")
    end_s = _seconds(req.end, "end", now_s)
    if end_s <= now_s:
        raise InvalidArgument("end: must be in the future")
    base = PlanRecord(
        plan_id=f"plan-{secrets.token_hex(4)}",
        kind=kind,
        cluster=ClusterName(req.cluster),
        gpu_type=GpuType(req.gpu_type),
        created_by=who.user,
        created_at_s=now_s,
        end_s=end_s,
        pool=req.pool,
        reason=req.reason,
    )
    if kind is PlanKind.FIXED:
        if req.job_ids:
            raise InvalidArgument("job_ids: only a deadline plan names jobs")
        if not 1 <= req.gpus <= MAX_PLAN_GPUS:
            raise InvalidArgument(f"gpus: must be 1 to {MAX_PLAN_GPUS}, got {req.gpus}")
        start_s = _seconds(req.start, "start", now_s) if req.HasField("start") else now_s
        if start_s >= end_s:
            raise InvalidArgument("start: must be before end")
        return replace(base, gpus=req.gpus, start_s=start_s)
    if req.gpus:
        raise InvalidArgument("gpus: a deadline plan works out its GPUs from its jobs; leave it 0")
    if req.HasField("start"):
        raise InvalidArgument("start: a deadline plan starts now; give only end (the deadline)")
    if not 1 <= len(req.job_ids) <= MAX_PLAN_JOBS:
        raise InvalidArgument(f"job_ids: 1 to {MAX_PLAN_JOBS} jobs, got {len(req.job_ids)}")
    for i, job_id in enumerate(req.job_ids):
        if not job_id or len(job_id) > MAX_ID_LENGTH:
            raise InvalidArgument(f"job_ids[{i}]: {shown(job_id)} is not a job id")
    return replace(base, start_s=now_s, job_ids=tuple(JobId(j) for j in dict.fromkeys(req.job_ids)))


def _ts(seconds: float) -> Timestamp:
    return convert.timestamp(seconds)


class CapacityService(pb_grpc.CapacityServicer):
    def __init__(
        self,
        *,
        store: JobStore,
        capacity: CapacityStore,
        auth: Authenticator,
        metrics: Metrics,
        inventories: Callable[[], Awaitable[list[ClusterState]]],
        job: Callable[[JobId], JobRecord | None],
        clock: Callable[[], float] = time.time,
        security: SecurityStore | None = None,
    ) -> None:
        self._store = store
        self._security = security
        self._capacity = capacity
        self._h = CallHandlers(auth, metrics)
        self._inventories = inventories
        self._job = job
        self._clock = clock

    async def _check_named_jobs(self, who: Principal, plan: PlanRecord) -> None:
        """Each job a deadline plan names exists and the caller may read it. One etcd read per job
        whatever the answer, and one message for "missing" and "not yours" (finance reads plans,
        not jobs), so a preview is no oracle for other tenants' job ids."""
        for i, job_id in enumerate(plan.job_ids):
            stored = await self._store.get_job(job_id)
            if stored is None or not can_read_tenant(who, stored.value.tenant):
                raise InvalidArgument(f"job_ids[{i}]: no job {shown(job_id)}")

    async def _audit(self, who: Principal, action: str, target: str, detail: str) -> None:
        # Plans buy GPUs: who asked for what stays on record, with the admins' own actions.
        log.info("capacity_plan_changed", action=action, plan_id=target, by=who.user, role=who.role.value)
        if self._security is not None:
            event = AuditEvent(self._clock(), who.user, who.role.value, action, target, detail)
            await self._security.append_audit(event)

    async def _pools(self) -> tuple[CapacitySettings, dict[PoolKey, ScalablePoolEntry]]:
        settings = await self._capacity.get_settings()
        return settings, scalable_pools(await self._store.list_clusters(), settings)

    async def _pool_states(self, pools: dict[PoolKey, ScalablePoolEntry]) -> list[PoolState]:
        states = {s.name: s for s in await self._inventories()}
        recorded = {(r.cluster, r.pool): r.nodes for r in await self._capacity.list_pools()}
        nodes, busy = {}, {}
        for key, entry in pools.items():
            ready, used, _ = pool_usage(states.get(entry.cluster), entry.config.name)
            nodes[key] = recorded.get(key, ready) or ready
            busy[key] = used
        return pool_states(pools, nodes, busy)

    def _plan_pb(
        self, p: PlanRecord, now: float, settings: CapacitySettings, held: int, usd: float
    ) -> pb.CapacityPlan:
        out = pb.CapacityPlan(
            plan_id=p.plan_id,
            kind=p.kind.value,
            cluster=p.cluster,
            gpu_type=p.gpu_type,
            gpus=p.gpus,
            start=_ts(p.start_s),
            end=_ts(p.end_s),
            job_ids=list(p.job_ids),
            pool=p.pool,
            reason=p.reason,
            created_by=p.created_by,
            created_at=_ts(p.created_at_s),
            state=plan_state(p, now, settings.lead_time_s),
            gpus_now=held,
            usd_per_hour=usd,
            cancelled_by=p.cancelled_by,
        )
        if settings.provisioner.value == "none":
            out.note = (
                "no provisioner is configured (capacity.provisioner): plans are kept but not provisioned"
            )
        return out

    async def CreateCapacityPlan(self, request: pb.CapacityPlanRequest, context: Ctx) -> pb.CapacityPlan:
        async def body(who: Principal, req: pb.CapacityPlanRequest) -> pb.CapacityPlan:
            check_change_plans(who)
            if req.plan_id:
                raise InvalidArgument("plan_id: chosen by the server; give it only to preview a stored plan")
            now = self._clock()
            settings, pools = await self._pools()
            plan = plan_from_request(req, who, now_s=now, pools=pools)
            await self._check_named_jobs(who, plan)
            if not await self._capacity.create_plan(plan):
                raise Conflict(f"plan id {plan.plan_id} was taken; try again")
            what = f"{plan.kind.value} {plan.gpus or len(plan.job_ids)} {plan.gpu_type} in {plan.cluster}"
            await self._audit(who, "capacity_plan_created", plan.plan_id, f"{what}: {plan.reason}"[:500])
            return self._plan_pb(plan, now, settings, 0, 0.0)

        return await self._h.unary("CreateCapacityPlan", request, context, body)

    async def ListCapacityPlans(
        self, request: pb.ListCapacityPlansRequest, context: Ctx
    ) -> pb.ListCapacityPlansResponse:
        async def body(who: Principal, req: pb.ListCapacityPlansRequest) -> pb.ListCapacityPlansResponse:
            check_read_capacity(who)
            now = self._clock()
            settings, pools = await self._pools()
            records = sorted(await self._capacity.list_plans(), key=lambda p: (p.start_s, p.plan_id))
            states = await self._pool_states(pools)
            needs = held_now(
                plan_values(records, self._job, now), states, now_s=now, lead_time_s=settings.lead_time_s
            )
            out = []
            for p in records:
                if not req.include_ended and plan_state(p, now, settings.lead_time_s) in (
                    "ended",
                    "cancelled",
                ):
                    continue
                need = needs.get(p.plan_id)
                held = need.gpus if need is not None else 0
                usd = need_usd_per_hour(need, states) if need is not None else 0.0
                out.append(self._plan_pb(p, now, settings, held, usd))
            return pb.ListCapacityPlansResponse(plans=out)

        return await self._h.unary("ListCapacityPlans", request, context, body)

    async def PreviewCapacityPlan(self, request: pb.CapacityPlanRequest, context: Ctx) -> pb.CapacityPreview:
        async def body(who: Principal, req: pb.CapacityPlanRequest) -> pb.CapacityPreview:
            check_read_capacity(who)
            now = self._clock()
            settings, pools = await self._pools()
            records = await self._capacity.list_plans()
            if req.plan_id:
                stored = next((p for p in records if p.plan_id == req.plan_id), None)
                if stored is None:
                    raise NotFound(f"no capacity plan {shown(req.plan_id[:MAX_ID_LENGTH])}")
                plan = stored
            else:
                plan = plan_from_request(req, who, now_s=now, pools=pools)
                if plan.job_ids:
                    check_name_jobs_in_plan(who)
                await self._check_named_jobs(who, plan)
            others = plan_values([p for p in records if p.plan_id != plan.plan_id], self._job, now)
            mine = plan_values([replace(plan, cancelled_at_s=None)], self._job, now)[0]
            states = await self._pool_states(pools)
            got = preview(mine, plan, others, states, now_s=now, lead_time_s=settings.lead_time_s)
            return pb.CapacityPreview(
                plan=self._plan_pb(plan, now, settings, got.gpus, got.usd_per_hour),
                changes=[
                    pb.PoolChangePreview(
                        cluster=c.key[0],
                        pool=c.key[1],
                        nodes_from=c.nodes_from,
                        nodes_to=c.nodes_to,
                        usd_per_hour_before=c.usd_per_hour_before,
                        usd_per_hour_after=c.usd_per_hour_after,
                    )
                    for c in got.changes
                ],
                gpus=got.gpus,
                usd_per_hour=got.usd_per_hour,
                total_usd=got.total_usd,
                shortfall_gpus=got.shortfall_gpus,
                meetable=got.meetable,
                note=got.note,
                provision_at=_ts(got.provision_at_s),
            )

        return await self._h.unary("PreviewCapacityPlan", request, context, body)

    async def CancelCapacityPlan(
        self, request: pb.CancelCapacityPlanRequest, context: Ctx
    ) -> pb.CapacityPlan:
        async def body(who: Principal, req: pb.CancelCapacityPlanRequest) -> pb.CapacityPlan:
            check_change_plans(who)
            if not req.plan_id or len(req.plan_id) > MAX_ID_LENGTH:
                raise InvalidArgument(f"plan_id: {shown(req.plan_id[:MAX_ID_LENGTH])} is not a plan id")
            stored = await self._capacity.get_plan(req.plan_id)
            if stored is None:
                raise NotFound(f"no capacity plan {shown(req.plan_id)}")
            now = self._clock()
            settings = await self._capacity.get_settings()
            plan = stored.value
            state = plan_state(plan, now, settings.lead_time_s)
            if state in ("cancelled", "ended"):
                raise FailedPrecondition(f"plan {plan.plan_id} has {state} already")
            cancelled = replace(plan, cancelled_at_s=now, cancelled_by=who.user)
            if not await self._capacity.update_plan(cancelled, stored.mod_revision):
                raise Conflict(f"plan {plan.plan_id} changed meanwhile; try again")
            await self._audit(who, "capacity_plan_cancelled", plan.plan_id, "")
            return self._plan_pb(cancelled, now, settings, 0, 0.0)

        return await self._h.unary("CancelCapacityPlan", request, context, body)

    async def ListCapacityPools(
        self, request: pb.ListCapacityPoolsRequest, context: Ctx
    ) -> pb.ListCapacityPoolsResponse:
        async def body(who: Principal, req: pb.ListCapacityPoolsRequest) -> pb.ListCapacityPoolsResponse:
            check_read_capacity(who)
            settings, pools = await self._pools()
            states = {s.name: s for s in await self._inventories()}
            recorded = {(r.cluster, r.pool): r.nodes for r in await self._capacity.list_pools()}
            ops = {(o.cluster, o.pool): o for o in await self._capacity.list_ops()}
            out = []
            for key, e in sorted(pools.items()):
                ready, busy, _ = pool_usage(states.get(e.cluster), e.config.name)
                nodes = recorded.get(key) or ready
                item = pb.CapacityPool(
                    cluster=e.cluster,
                    pool=e.config.name,
                    provider=e.provider.value,
                    gpu_type=e.config.gpu_type,
                    capacity_kind=e.config.kind.value,
                    gpus_per_node=e.config.gpus_per_node,
                    usd_per_gpu_hour=e.config.usd_per_gpu_hour,
                    nodes=nodes,
                    ready_nodes=ready,
                    busy_nodes=busy,
                    min_nodes=e.min_nodes,
                    max_nodes=e.max_nodes,
                    usd_per_hour=nodes * e.config.gpus_per_node * e.config.usd_per_gpu_hour,
                    note=e.note,
                )
                if key in ops:
                    item.pending.CopyFrom(_pending_pb(ops[key]))
                out.append(item)
            return pb.ListCapacityPoolsResponse(
                pools=out,
                provisioner=settings.provisioner.value,
                lead_time_seconds=settings.lead_time_s,
                idle_ttl_seconds=settings.idle_ttl_s,
                spend_ceiling_usd_per_hour=settings.spend_ceiling_usd_per_hour or 0.0,
                usd_per_hour=sum(p.usd_per_hour for p in out),
            )

        return await self._h.unary("ListCapacityPools", request, context, body)


def _pending_pb(op: PendingOp) -> pb.PendingPoolChange:
    out = pb.PendingPoolChange(
        nodes_from=op.nodes_from,
        nodes_to=op.nodes_to,
        reason=op.reason,
        job_ids=list(op.job_ids),
        plan_ids=list(op.plan_ids),
        started_at=_ts(op.started_at_s),
        attempts=op.attempts,
        last_error=op.last_error,
        retryable=op.retryable,
    )
    if op.ready_at_s is not None:
        out.ready_at.CopyFrom(_ts(op.ready_at_s))
    if op.last_error:
        out.next_try_at.CopyFrom(_ts(op.next_try_at_s))
    return out
