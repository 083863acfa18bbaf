"""The Capacity service: the infra team's capacity plans and the scalable pools, over gRPC.

Who may do what (kept here with the calls, as the capacity rules concern no tenant): infra and
admins create and cancel plans; admin, infra and finance read plans and pools (finance for their
cost); members are refused, since plans and pools span every tenant (a member's `explain` says what
capacity is doing for its job). Every request is checked field by field before anything is stored,
and a refusal names the field. A plan is then checked against what the pools can hold (their
maximums, the clouds' GPU limits, the spend ceiling: `federation.capacity.admit`): refused with the
shortfall, or, when the caller allows it, kept as a partial plan for what fits. A deadline plan names
waiting jobs of one tenant that may run on its GPU type. A plan's HELD is what the pools' ready nodes
hold for it, and its delivered GPU-hours and cost outlive it.
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
from federation.capacity.admit import Admission, PlanHeld, admit, held_by_plan
from federation.capacity.pools import PoolKey, ScalablePoolEntry, scalable_pools
from federation.capacity.preview import held_now, plan_state, pool_states, preview
from federation.capacity.records import (
    CapacitySettings,
    PendingOp,
    PlanHeldRecord,
    PlanKind,
    PlanRecord,
    ProvisionerKind,
)
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
from iac.decide import Limits
from iac.pool_state import PoolState
from placement.model import ClusterName, ClusterState, GpuType, JobId, JobPhase

log = structlog.get_logger("gpufed.api")

MAX_PLAN_GPUS = 65_536
MAX_PLAN_JOBS = 256
MAX_REASON_LENGTH = 500
MAX_ID_LENGTH = 128
# Plans are for the weeks ahead, not for years: a typo in a year should not hold GPUs for one.
MAX_AHEAD_S = 400 * 86_400.0
# Ended and cancelled plans stay in `plan list` this long after they stopped (all of them with --all).
ENDED_SHOWN_S = 30 * 86_400.0


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

    async def _check_named_jobs(self, who: Principal, plan: PlanRecord) -> PlanRecord:
        """Each job a deadline plan names exists and the caller may read it. One etcd read per job
        whatever the answer, and one message for "missing" and "not yours" (finance reads plans,
        not jobs), so a preview is no oracle for other tenants' job ids. Then each is still waiting
        (a job placed or ended needs no capacity bought for it), may run on the plan's GPU type,
        and is of the same tenant as the first: a deadline plan is one team's deadline, and its
        cost is that team's. Returns the plan with its tenant."""
        tenant = ""
        # A job names a family (A100) or a memory floor as often as a variant: the plan's type must be
        # one the placer may give it, as the registry expands what it asked for.
        registry = (await self._store.get_settings()).gpu_registry()
        for i, job_id in enumerate(plan.job_ids):
            stored = await self._store.get_job(job_id)
            if stored is None or not can_read_tenant(who, stored.value.tenant):
                raise InvalidArgument(f"job_ids[{i}]: no job {shown(job_id)}")
            job = stored.value
            if job.phase is not JobPhase.QUEUED:
                what = "has ended" if job.phase.is_terminal else "is placed already"
                raise InvalidArgument(
                    f"job_ids[{i}]: job {job_id} {what} ({job.phase.value}); a deadline plan buys "
                    "capacity for jobs still waiting"
                )
            accepted = registry.expand(job.spec.gpu_types, job.spec.min_gpu_memory_gib)
            if plan.gpu_type not in accepted:
                asked = ", ".join(job.spec.gpu_types) or f"GPUs of {job.spec.min_gpu_memory_gib} GiB or more"
                raise InvalidArgument(
                    f"job_ids[{i}]: job {job_id} runs on {asked}, not on the plan's {plan.gpu_type}"
                )
            if tenant and job.tenant != tenant:
                raise InvalidArgument(
                    f"job_ids[{i}]: job {job_id} is tenant {job.tenant}'s, job_ids[0] is {tenant}'s; "
                    "a deadline plan is for one tenant's jobs (make one plan per tenant)"
                )
            tenant = job.tenant
        return replace(plan, tenant=tenant)

    async def _audit(self, who: Principal, action: str, target: str, detail: str) -> None:
        # Plans buy GPUs: who asked for what stays on record, with the admins' own actions.
        log.info("capacity_plan_changed", action=action, plan_id=target, by=who.user, role=who.role.value)
        if self._security is not None:
            event = AuditEvent(self._clock(), who.user, who.role.value, action, target, detail)
            await self._security.append_audit(event)

    async def _pools(self) -> tuple[CapacitySettings, dict[PoolKey, ScalablePoolEntry]]:
        settings = await self._capacity.get_settings()
        return settings, scalable_pools(await self._store.list_clusters(), settings)

    async def _pool_view(
        self, pools: dict[PoolKey, ScalablePoolEntry]
    ) -> tuple[list[PoolState], dict[PoolKey, int]]:
        """The pools as the reconciler sees them (nodes on the way included), and each pool's ready
        nodes as its cluster lists them (what plans hold)."""
        states = {s.name: s for s in await self._inventories()}
        recorded = {(r.cluster, r.pool): r.nodes for r in await self._capacity.list_pools()}
        nodes, busy, ready = {}, {}, {}
        for key, entry in pools.items():
            there, used, _ = pool_usage(states.get(entry.cluster), entry.config.name)
            nodes[key] = recorded.get(key, there) or there
            busy[key] = used
            ready[key] = there
        return pool_states(pools, nodes, busy), ready

    def _plan_pb(
        self,
        p: PlanRecord,
        now: float,
        settings: CapacitySettings,
        held: PlanHeld | None = None,
        delivered: PlanHeldRecord | None = None,
    ) -> pb.CapacityPlan:
        gpu_s, usd = delivered.delivered(min(now, p.stop_s)) if delivered is not None else (0.0, 0.0)
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
            gpus_now=held.gpus if held is not None else 0,
            usd_per_hour=held.usd_per_hour if held is not None else 0.0,
            cancelled_by=p.cancelled_by,
            requested_gpus=p.requested_gpus or p.gpus,
            shortfall_gpus=max(0, p.requested_gpus - p.gpus),
            held_back_by=p.held_back_by,
            gpu_hours=gpu_s / 3600.0,
            total_usd=usd,
            tenant=p.tenant,
        )
        if settings.provisioner.value == "none":
            out.note = (
                "no provisioner is configured (capacity.provisioner): plans are kept but not provisioned"
            )
        return out

    @staticmethod
    def _limits(settings: CapacitySettings) -> Limits:
        return Limits(
            max_gpus_by_provider=dict(settings.cloud_gpu_limits),
            max_usd_per_hour=settings.spend_ceiling_usd_per_hour,
            lead_time_s=settings.lead_time_s,
            idle_ttl_s=settings.idle_ttl_s,
        )

    async def _admission(
        self,
        plan: PlanRecord,
        earlier: list[PlanRecord],
        settings: CapacitySettings,
        pools: dict[PoolKey, ScalablePoolEntry],
        now: float,
    ) -> tuple[Admission, list[PoolState]]:
        """Whether the pools can hold `plan` after the `earlier` plans."""
        states, _ = await self._pool_view(pools)
        others = plan_values(earlier, self._job, now)
        mine = plan_values([replace(plan, cancelled_at_s=None)], self._job, now)[0]
        return admit(mine, others, states, self._limits(settings), now_s=now), states

    async def CreateCapacityPlan(self, request: pb.CapacityPlanRequest, context: Ctx) -> pb.CapacityPlan:
        async def body(who: Principal, req: pb.CapacityPlanRequest) -> pb.CapacityPlan:
            check_change_plans(who)
            if req.plan_id:
                raise InvalidArgument("plan_id: chosen by the server; give it only to preview a stored plan")
            now = self._clock()
            settings, pools = await self._pools()
            plan = plan_from_request(req, who, now_s=now, pools=pools)
            if req.allow_partial and plan.kind is PlanKind.DEADLINE:
                raise InvalidArgument(
                    "allow_partial: a deadline plan is all or nothing (fewer GPUs miss its deadline)"
                )
            plan = await self._check_named_jobs(who, plan)
            if settings.provisioner is not ProvisionerKind.NONE:
                # Without a provisioner no pool changes: a plan is a record (its note says so).
                earlier = await self._capacity.list_plans()
                got, _ = await self._admission(plan, earlier, settings, pools, now)
                plan = _admitted(plan, got, allow_partial=req.allow_partial)
            if not await self._capacity.create_plan(plan):
                raise Conflict(f"plan id {plan.plan_id} was taken; try again")
            what = f"{plan.kind.value} {plan.gpus or len(plan.job_ids)} {plan.gpu_type} in {plan.cluster}"
            if plan.requested_gpus:
                what += f" (partial: {plan.requested_gpus} asked)"
            await self._audit(who, "capacity_plan_created", plan.plan_id, f"{what}: {plan.reason}"[:500])
            return self._plan_pb(plan, now, settings)

        return await self._h.unary("CreateCapacityPlan", request, context, body)

    async def ListCapacityPlans(
        self, request: pb.ListCapacityPlansRequest, context: Ctx
    ) -> pb.ListCapacityPlansResponse:
        async def body(who: Principal, req: pb.ListCapacityPlansRequest) -> pb.ListCapacityPlansResponse:
            check_read_capacity(who)
            now = self._clock()
            settings, pools = await self._pools()
            records = sorted(await self._capacity.list_plans(), key=lambda p: (p.start_s, p.plan_id))
            states, ready = await self._pool_view(pools)
            needs = held_now(
                plan_values(records, self._job, now), states, now_s=now, lead_time_s=settings.lead_time_s
            )
            held = held_by_plan(list(needs.values()), states, ready)
            delivered = {h.plan_id: h for h in await self._capacity.list_held()}
            out = []
            for p in records:
                stopped = plan_state(p, now, settings.lead_time_s) in ("ended", "cancelled")
                if stopped and not req.include_ended and now - p.stop_s > ENDED_SHOWN_S:
                    continue
                here = None if stopped else held.get(p.plan_id)
                out.append(self._plan_pb(p, now, settings, here, delivered.get(p.plan_id)))
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
                order = (plan.created_at_s, plan.plan_id)
                earlier = [p for p in records if (p.created_at_s, p.plan_id) < order]
            else:
                plan = plan_from_request(req, who, now_s=now, pools=pools)
                if plan.job_ids:
                    check_name_jobs_in_plan(who)
                plan = await self._check_named_jobs(who, plan)
                earlier = records
            got, states = await self._admission(plan, earlier, settings, pools, now)
            if settings.provisioner is ProvisionerKind.NONE:
                got = Admission(0, 0)  # nothing is provisioned, so nothing is checked (as on create)
            if plan.kind is PlanKind.FIXED and got.granted_gpus and got.shortfall_gpus:
                # What it would hold if accepted as partial: the cost shown is what would be spent.
                plan = replace(plan, gpus=got.granted_gpus, requested_gpus=got.requested_gpus)
            others = plan_values(earlier, self._job, now)
            mine = plan_values([replace(plan, cancelled_at_s=None)], self._job, now)[0]
            shown_plan = preview(mine, plan, others, states, now_s=now, lead_time_s=settings.lead_time_s)
            held_back = "; ".join(got.held_back_by)
            return pb.CapacityPreview(
                plan=self._plan_pb(replace(plan, held_back_by=held_back), now, settings),
                changes=[
                    pb.PoolChangePreview(
                        cluster=c.key[0],
                        pool=c.key[1],
                        nodes_from=c.nodes_from,
                        nodes_to=c.nodes_to,
                        usd_per_hour_before=c.usd_per_hour_before,
                        usd_per_hour_after=c.usd_per_hour_after,
                    )
                    for c in shown_plan.changes
                ],
                gpus=shown_plan.gpus if not got.held_back_by or got.granted_gpus else 0,
                usd_per_hour=shown_plan.usd_per_hour if not got.held_back_by or got.granted_gpus else 0.0,
                total_usd=shown_plan.total_usd if not got.held_back_by or got.granted_gpus else 0.0,
                shortfall_gpus=got.shortfall_gpus if got.held_back_by else 0,
                meetable=got.meetable,
                note="; ".join(
                    x for x in (f"held back by {held_back}" if held_back else "", shown_plan.note) if x
                ),
                provision_at=_ts(shown_plan.provision_at_s),
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
            return self._plan_pb(cancelled, now, settings)

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


def _admitted(plan: PlanRecord, got: Admission, *, allow_partial: bool) -> PlanRecord:
    """The plan to store, or FailedPrecondition saying what the pools cannot hold and why."""
    if not got.meetable:
        raise FailedPrecondition(
            "job_ids: the deadline cannot be met: a job alone runs past it, even on new nodes "
            "(which are ready only after the lead time)"
        )
    if got.whole:
        return plan
    why = "; ".join(got.held_back_by)
    asked = f"{got.requested_gpus} {plan.gpu_type} GPU(s) in {plan.cluster}"
    if plan.kind is PlanKind.DEADLINE:
        raise FailedPrecondition(f"job_ids: the jobs need {asked}, more than the pools can hold: {why}")
    if not allow_partial or not got.granted_gpus:
        hint = (
            f"; allow a partial plan (--allow-partial) to hold the {got.granted_gpus} that fit"
            if got.granted_gpus
            else ""
        )
        raise FailedPrecondition(
            f"gpus: the pools can hold {got.granted_gpus} of the {asked} asked "
            f"(shortfall: {got.shortfall_gpus}), held back by {why}{hint}"
        )
    return replace(plan, gpus=got.granted_gpus, requested_gpus=got.requested_gpus, held_back_by=why)


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
