"""The capacity reconciler: the placer's capacity requests and the infra team's plans become pool
changes through a `Provisioner`; idle pools shrink after a TTL. It runs on the leader, after the
scheduling cycle, and keeps what a successor needs in etcd (`federation.capacity.store`).

Passive transitions (mirror what the world reports), each tick:
1. each scalable pool's nodes from the provisioner's status and busy/idle nodes from the cluster's
   inventory; the idle clocks follow the idle count;
2. a scale-up whose nodes have all shown up is done (its provisioned interval opens); one that
   should have landed long ago and did not (lost with a restarted provisioner) is asked again.

Active transitions (decide and act):
3. `iac.decide.decide` over the pools, the latest capacity requests, the live plans and the limits
   (per cloud GPUs, spend per hour, lead time, idle TTL); a pool with an operation under way is
   left alone, and jobs whose nodes are on the way are not asked for twice;
4. each change is recorded as the pool's pending operation (fenced) before the provisioner is
   called, so a crash in between leaves an operation to retry, never an unknown one; the node
   count asked for is absolute, so a repeat is harmless;
5. a failure keeps the operation with its error and a retry time: retryable ones back off
   exponentially, permanent ones wait the longest interval; waiting jobs say so in `explain`;
6. what each plan holds of the pools' ready nodes (`federation.capacity.admit.held_by_plan`) is
   recorded whenever it changes, so a plan's delivered GPU-hours and cost outlive it.

No node that runs a job is removed: the busy count goes to the provisioner, which refuses a change
below it, and the simulated one removes only nodes still idle when it reaches them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace

import structlog

from federation.capacity.admit import PlanHeld, held_by_plan
from federation.capacity.pools import PoolKey, ScalablePoolEntry
from federation.capacity.records import CapacitySettings, PendingOp, PlanHeldRecord, PlanRecord, PoolRecord
from federation.capacity.store import CapacityStore
from federation.capacity.track import (
    advance_held,
    annotate,
    backoff_s,
    grown,
    plan_values,
    pool_usage,
    reserved_nodes,
    shrunk,
    update_idle,
    wait_notes,
)
from federation.ledger.report.idle import ProvisionedInterval
from federation.store.job_store import Fence
from federation.store.jobs import JobRecord
from iac.api import IacError, PoolStatus, Provisioner
from iac.decide import Decision, Limits, decide
from iac.errors import BusyNodesProtected
from iac.pool_state import PoolState
from placement.model import (
    CapacityRequest,
    ClusterName,
    ClusterState,
    JobId,
    ScalablePool,
    Waiting,
    WaitReason,
)

log = structlog.get_logger("gpufed.capacity")

# A scale-up not landed this long after its expected time is taken as lost and asked again.
LANDING_GRACE_S = 10.0


class CapacityReconciler:
    def __init__(
        self,
        *,
        store: CapacityStore,
        provisioner: Provisioner,
        settings: CapacitySettings,
        pools: Mapping[PoolKey, ScalablePoolEntry],
        inventories: Callable[[], Awaitable[list[ClusterState]]],
        job: Callable[[JobId], JobRecord | None],
        clock: Callable[[], float] = time.time,
        live_jobs: Callable[[], Iterable[JobRecord]] = tuple,
    ) -> None:
        self._live_jobs = live_jobs
        self._store = store
        self._provisioner = provisioner
        self._settings = settings
        self._pools = {k: e for k, e in pools.items() if e.spec is not None}
        self._inventories = inventories
        self._job = job
        self._clock = clock
        self._limits = Limits(
            max_gpus_by_provider=dict(settings.cloud_gpu_limits),
            max_usd_per_hour=settings.spend_ceiling_usd_per_hour,
            lead_time_s=settings.lead_time_s,
            idle_ttl_s=settings.idle_ttl_s,
        )
        self._requests: tuple[CapacityRequest, ...] = ()
        self._starts: dict[JobId, float] = {}
        self._notes: dict[JobId, WaitReason] = {}
        # What this leader loaded from etcd; reloaded whenever the fence changes.
        self._fence: Fence | None = None
        self._loaded = False
        self._ops: dict[PoolKey, PendingOp] = {}
        self._records: dict[PoolKey, PoolRecord] = {}
        self._intervals: dict[bytes, ProvisionedInterval] = {}
        self._status: dict[PoolKey, PoolStatus] = {}
        self._held: dict[str, PlanHeldRecord] = {}
        self.last_decision: Decision | None = None

    # ---- what the scheduler hands over and reads back, each cycle

    def offer(self, requests: Sequence[CapacityRequest], starts_at_s: Mapping[JobId, float]) -> None:
        """The placer's latest capacity requests and reservations (it repeats them every cycle)."""
        self._requests = tuple(requests)
        self._starts = dict(starts_at_s)

    def annotate(self, waiting: Sequence[Waiting]) -> Sequence[Waiting]:
        return annotate(waiting, self._notes)

    def with_scalable_pools(self, states: Sequence[ClusterState]) -> list[ClusterState]:
        """The inventories with each scalable pool's room to grow, for the placer to ask of."""
        out = []
        for state in states:
            extra = []
            for (cluster, name), entry in sorted(self._pools.items()):
                if cluster != state.name:
                    continue
                nodes, _, _ = pool_usage(state, name)
                op = self._ops.get(entry.key)
                asked = max(0, op.nodes_to - nodes) if op is not None else 0
                pool = entry.config
                extra.append(
                    ScalablePool(
                        name=name,
                        gpu_type=pool.gpu_type,
                        kind=pool.kind,
                        usd_per_gpu_hour=pool.usd_per_gpu_hour,
                        gpus_per_node=pool.gpus_per_node,
                        node_count=nodes,
                        max_nodes=entry.max_nodes,
                        requested_nodes=asked,
                        restart_risk_per_hour=pool.reclaims_per_node_hour,
                    )
                )
            out.append(replace(state, scalable_pools=state.scalable_pools + tuple(extra)) if extra else state)
        return out

    # ---- one tick on the leader

    async def _load(self, fence: Fence | None) -> None:
        if self._loaded and fence == self._fence:
            return
        self._ops = {(o.cluster, o.pool): o for o in await self._store.list_ops()}
        self._records = {(r.cluster, r.pool): r for r in await self._store.list_pools()}
        self._intervals = await self._store.keyed_intervals()
        self._held = {h.plan_id: h for h in await self._store.list_held()}
        self._status = {}
        for key, entry in self._pools.items():
            assert entry.spec is not None
            try:
                # A new leader asks the world once: its provisioner may have lost what it knew.
                self._status[key] = await self._provisioner.refresh(entry.spec)
            except IacError as error:
                log.warning("capacity_refresh_failed", cluster=key[0], pool=key[1], error=str(error))
        self._fence, self._loaded = fence, True
        log.info("capacity_state_loaded", pending=len(self._ops), pools=len(self._pools))

    async def tick(self, fence: Fence | None) -> Decision | None:
        if not self._pools:
            return None
        await self._load(fence)
        now = self._clock()
        states = {s.name: s for s in await self._inventories()}
        records = await self._store.list_plans()
        plans = plan_values(records, self._job, now)
        pool_states: list[PoolState] = []
        for key, entry in self._pools.items():
            assert entry.spec is not None
            try:
                self._status[key] = await self._provisioner.status(entry.spec)
            except IacError as error:
                log.warning("capacity_status_failed", cluster=key[0], pool=key[1], error=str(error))
            pool_states.append(await self._observe(entry, states.get(entry.cluster), now, fence))

        busy = {p.key: p.busy_nodes for p in pool_states}
        decision = decide(
            pools=pool_states,
            requests=self._requests,
            plans=plans,
            limits=self._limits,
            now_s=now,
            provisioning_for=frozenset(j for op in self._ops.values() for j in op.job_ids),
            starts_at_s=self._starts,
        )
        self.last_decision = decision
        for change in decision.changes:
            key = (ClusterName(change.cluster), change.pool)
            if key in self._ops:
                continue
            op = PendingOp(
                key[0],
                change.pool,
                change.nodes_from,
                change.nodes_to,
                now,
                change.reason,
                change.job_ids,
                change.plan_ids,
            )
            await self._put_op(op, fence)
            await self._apply(op, busy.get(key, 0), now, fence)
        for key, op in list(self._ops.items()):
            # Failed ones once their backoff is over, and any a crashed leader recorded but never
            # got to apply (no attempt yet, no retry time).
            if not op.applied and op.next_try_at_s <= now:
                await self._apply(op, busy.get(key, 0), now, fence)
        for refusal in decision.refused:
            log.info(
                "capacity_request_refused",
                cluster=refusal.request.cluster,
                pool=refusal.request.pool,
                code=refusal.code.value,
                jobs=list(refusal.request.job_ids),
            )
        self._notes = wait_notes(decision.refused, self._ops.values(), now)
        ready = {key: pool_usage(states.get(key[0]), key[1])[0] for key in self._pools}
        await self._record_held(records, held_by_plan(decision.plans, pool_states, ready), now, fence)
        return decision

    async def _record_held(
        self,
        records: Sequence[PlanRecord],
        held: Mapping[str, PlanHeld],
        now: float,
        fence: Fence | None,
    ) -> None:
        changed = [
            fresh
            for p in records
            if (fresh := advance_held(self._held.get(p.plan_id), p, held.get(p.plan_id), now)) is not None
        ]
        await self._store.put_held(changed, fence=fence)
        for fresh in changed:
            self._held[fresh.plan_id] = fresh
            log.info("capacity_plan_held_changed", plan_id=fresh.plan_id, gpus=fresh.gpus)

    async def _observe(
        self, entry: ScalablePoolEntry, state: ClusterState | None, now: float, fence: Fence | None
    ) -> PoolState:
        """Passive: the pool as the world reports it; closes a scale-up whose nodes arrived."""
        key = entry.key
        ready, busy, idle = pool_usage(state, entry.config.name)
        # Gangs just admitted here hold their nodes before their pods show on them.
        held = min(ready, busy + reserved_nodes(entry, self._live_jobs()))
        idle = max(0, idle - (held - busy))
        busy = held
        status = self._status.get(key)
        nodes = status.nodes if status is not None and status.exists else ready
        record = self._records.get(key, PoolRecord(entry.cluster, entry.config.name))
        fresh = replace(record, idle_since_s=update_idle(record.idle_since_s, idle, now), nodes=nodes)
        if fresh != record:
            await self._store.put_pool(fresh, fence=fence)
            self._records[key] = fresh
        op = self._ops.get(key)
        if op is not None and op.applied and op.nodes_to > op.nodes_from:
            pending = status is not None and bool(status.pending)
            if ready >= op.nodes_to:
                # The pool grew for waiting work, which may not show as busy yet (admitted this very
                # cycle): every idle clock starts again, so the old nodes do not go as the new arrive.
                restarted = replace(self._records.get(key, fresh), idle_since_s=(now,) * idle)
                await self._store.put_pool(restarted, fence=fence)
                self._records[key] = restarted
                await self._open_intervals(entry, op.nodes_to - op.nodes_from, now, fence)
                await self._store.delete_op(*key, fence=fence)
                del self._ops[key]
                log.info("pool_scaled_up", cluster=key[0], pool=key[1], nodes=ready, jobs=list(op.job_ids))
            elif not pending and now > (op.ready_at_s or now) + max(
                LANDING_GRACE_S, self._limits.lead_time_s
            ):
                attempts = op.attempts + 1
                wait = backoff_s(attempts, self._settings.retry_base_s, self._settings.retry_max_s)
                lost = replace(
                    op,
                    ready_at_s=None,
                    attempts=attempts,
                    last_error="the new nodes never arrived",
                    next_try_at_s=now + wait,
                )
                await self._put_op(lost, fence)
                log.warning("pool_scale_up_lost", cluster=key[0], pool=key[1], nodes_to=op.nodes_to)
        op = self._ops.get(key)
        if op is not None and op.nodes_to > nodes:
            nodes = op.nodes_to  # what is on the way counts, for limits, spend and the next request
        return PoolState(
            cluster=entry.cluster,
            pool=entry.config.name,
            provider=entry.provider,
            gpu_type=entry.config.gpu_type,
            kind=entry.config.kind,
            gpus_per_node=entry.config.gpus_per_node,
            usd_per_gpu_hour=entry.config.usd_per_gpu_hour,
            nodes=nodes,
            busy_nodes=busy,
            max_nodes=entry.max_nodes,
            min_nodes=entry.min_nodes,
            idle_since_s=self._records.get(key, fresh).idle_since_s,
        )

    async def _put_op(self, op: PendingOp, fence: Fence | None) -> None:
        await self._store.put_op(op, fence=fence)
        self._ops[(op.cluster, op.pool)] = op

    async def _apply(self, op: PendingOp, busy_nodes: int, now: float, fence: Fence | None) -> None:
        """Active: ask the provisioner for the op's node count; record the outcome."""
        key = (op.cluster, op.pool)
        entry = self._pools[key]
        assert entry.spec is not None
        bound = log.bind(cluster=op.cluster, pool=op.pool, nodes_from=op.nodes_from, nodes_to=op.nodes_to)
        try:
            result = await self._provisioner.apply(entry.spec, op.nodes_to, busy_nodes=busy_nodes)
        except BusyNodesProtected as error:
            # A node picked up a job since the decision: nothing to do, the TTL will come round again.
            await self._store.delete_op(*key, fence=fence)
            del self._ops[key]
            bound.info("pool_scale_down_skipped", reason=str(error))
            return
        except IacError as error:
            attempts = op.attempts + 1
            wait = (
                backoff_s(attempts, self._settings.retry_base_s, self._settings.retry_max_s)
                if error.retryable
                else self._settings.retry_max_s
            )
            failed = replace(
                op,
                attempts=attempts,
                last_error=str(error),
                retryable=error.retryable,
                next_try_at_s=now + wait,
            )
            await self._put_op(failed, fence)
            bound.warning(
                "pool_change_failed", error=str(error), retryable=error.retryable, attempts=attempts
            )
            return
        if op.nodes_to > op.nodes_from:
            applied = replace(op, ready_at_s=result.ready_at_s, last_error="")
            await self._put_op(applied, fence)
            bound.info("pool_scale_up_started", ready_at_s=result.ready_at_s, jobs=list(op.job_ids))
            return
        removed = max(0, op.nodes_from - result.nodes)
        await self._close_intervals(entry, removed, now, fence)
        record = self._records.get(key)
        if record is not None:
            # The nodes that went were idle the longest: their clocks go with them, or the next
            # node to fall idle would inherit an expired clock and go at once.
            record = replace(record, idle_since_s=record.idle_since_s[removed:], nodes=result.nodes)
            await self._store.put_pool(record, fence=fence)
            self._records[key] = record
        await self._store.delete_op(*key, fence=fence)
        del self._ops[key]
        bound.info("pool_scaled_down", nodes=result.nodes, reason=op.reason)

    async def _open_intervals(
        self, entry: ScalablePoolEntry, nodes: int, now: float, fence: Fence | None
    ) -> None:
        added = grown(entry, nodes, now)
        await self._store.put_intervals(added, fence=fence)
        self._intervals.update(added)

    async def _close_intervals(
        self, entry: ScalablePoolEntry, nodes: int, now: float, fence: Fence | None
    ) -> None:
        open_ = {
            k: iv
            for k, iv in self._intervals.items()
            if iv.end_s is None and (iv.cluster, iv.pool) == entry.key
        }
        changes = shrunk(open_, nodes * entry.config.gpus_per_node, now)
        await self._store.put_intervals(changes, fence=fence)
        self._intervals.update(changes)

    # ---- for the API (read on the leader; other servers read etcd)

    def pending(self) -> dict[PoolKey, PendingOp]:
        return dict(self._ops)

    def status(self) -> dict[PoolKey, PoolStatus]:
        return dict(self._status)
