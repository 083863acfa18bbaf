"""An in-memory simulated cluster: the member cluster of the embedded default, tests and benchmarks.

Until simulated clusters serve the Kubernetes API, federation drives this `ClusterBackend`. It places
each gang on whole nodes as a gang scheduler would (every replica or none, best fit), runs it for its
simulated duration against an injected clock, and can be hurt on purpose (unreachable, eviction, node
loss) so that tests can watch federation recover. Given a journal it outlives its process, as a real
cluster outlives a control-plane crash: every change is one fsynced JSON line, replayed on start.

Completion is never journaled: a gang's end is fixed when it is dispatched, so replaying the events in
order, each at the time it happened, finishes exactly the gangs that had finished then.
"""

from __future__ import annotations

import heapq
import json
import os
import time
from bisect import insort
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from clusters.api import (
    ClusterError,
    ClusterUnreachable,
    GangEvent,
    GangPhase,
    GangRejected,
    GangStatus,
    GangWorkload,
    LogOptions,
    LogUnavailable,
    ReplicaState,
    gang_name,
)
from clusters.memory_logs import fake_log, fake_replicas
from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    GpuType,
    JobId,
    NodeShare,
    PoolSpec,
    Provider,
    TenantId,
)

log = structlog.get_logger("gpufed.clusters.memory")


# A pool of identical simulated nodes, all free and healthy at start: the shared PoolSpec.
MemoryPool = PoolSpec


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """The node one replica runs on, named by its pool and its index in the pool's node list."""

    task: str
    replica_index: int
    pool: str
    node_index: int
    gpu_count: int


@dataclass(frozen=True, slots=True)
class SimGang:
    """A gang as the simulation placed it, for tests to inspect."""

    job_id: JobId
    attempt: int
    tenant: TenantId
    gpu_type: GpuType
    kind: CapacityKind
    replicas: tuple[ReplicaPlacement, ...]
    started_at_s: float
    ends_at_s: float


def listed_nodes(node_count: int, failed: Collection[int]) -> tuple[int, ...]:
    """A pool's nodes in the order the inventory lists them, each by its index in the pool.

    Failed nodes are left out, so a node's position here, not its index in the pool, is what
    `free_gpus_per_node` and a running gang's `NodeShare.node_index` mean. Both read this one order,
    so a share always names the node the inventory shows at that position.
    """
    return tuple(i for i in range(node_count) if i not in failed)


class JournalError(ClusterError):
    """The journal cannot be replayed onto this cluster: corrupt, or written for other pools."""

    retryable = False


@dataclass(slots=True)
class _Gang:
    name: str
    sim: SimGang
    # What the gang ends as if nothing stops it first, fixed at dispatch.
    end_phase: GangPhase
    end_message: str
    # Tells this gang's entry in the end-time heap from one of a forgotten gang of the same name.
    seq: int
    phase: GangPhase = GangPhase.RUNNING
    message: str = ""
    finished_at_s: float | None = None
    # Preempted: when its grace period ends (it is EVICTED then, unless it finishes first).
    evicting_at_s: float | None = None

    def status(self, nodes: tuple[NodeShare, ...]) -> GangStatus:
        return GangStatus(
            job_id=self.sim.job_id,
            attempt=self.sim.attempt,
            phase=self.phase,
            message=self.message,
            started_at_s=self.sim.started_at_s,
            finished_at_s=self.finished_at_s,
            nodes=nodes if self.phase is GangPhase.RUNNING else (),
        )


class InMemoryCluster:
    """A simulated cluster behind `clusters.api.ClusterBackend`, with fault injection for tests.

    Fault injection (`set_reachable`, `inject_eviction`, `fail_node`) and `forget` act on the simulated world,
    so they work while the cluster is unreachable; only the protocol calls raise then.
    """

    def __init__(
        self,
        name: ClusterName,
        *,
        provider: Provider,
        region: str,
        pools: Sequence[MemoryPool],
        object_store: str | None = None,
        journal_path: Path | None = None,
        clock: Callable[[], float] = time.time,
        default_duration_s: float = 5.0,
    ) -> None:
        names = [p.name for p in pools]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster {name}: pool names repeat: {names}")
        for p in pools:
            if p.gpus_per_node < 1 or p.node_count < 0:
                raise ValueError(
                    f"cluster {name}: pool {p.name} needs gpus_per_node >= 1 and node_count >= 0"
                )
        self._name = name
        self._provider = provider
        self._region = region
        self._object_store = object_store
        self._pools = tuple(pools)
        self._pool_pos = {p.name: pos for pos, p in enumerate(self._pools)}
        self._free = [[p.gpus_per_node] * p.node_count for p in self._pools]
        self._failed: list[set[int]] = [set() for _ in self._pools]
        # Per pool: the inventory's node order, and each listed node's position in it (see listed_nodes).
        self._listed = [listed_nodes(p.node_count, ()) for p in self._pools]
        self._listed_at = [{node: i for i, node in enumerate(nodes)} for nodes in self._listed]
        self._gangs: dict[str, _Gang] = {}
        self._running: dict[str, _Gang] = {}
        self._ends: list[tuple[float, int, str]] = []
        self._dispatches: Counter[str] = Counter()
        self._seq = 0
        # The latest time seen: a clock that steps back must not un-finish a gang.
        self._now_s = float("-inf")
        self._clock = clock
        self._default_duration_s = default_duration_s
        self._reachable = True
        # Set by `refuse_dispatches`: every dispatch is refused with this reason (and counted).
        self._refusing: str | None = None
        self.refused_dispatches = 0
        self._inventory: ClusterState | None = None
        # Each gang's status kept current as it changes, so that listing them copies, never rebuilds.
        self._status_of: dict[str, GangStatus] = {}
        self._statuses: tuple[GangStatus, ...] | None = None
        self._log = log.bind(cluster=name)
        self._journal = journal_path
        if journal_path is not None:
            self._replay(journal_path)

    # ---- ClusterBackend --------------------------------------------------------------------------

    @property
    def name(self) -> ClusterName:
        return self._name

    @property
    def reachable(self) -> bool:
        return self._reachable

    async def inventory(self) -> ClusterState:
        self._check_reachable()
        self._now()
        return self._inventory_view()

    def _inventory_view(self) -> ClusterState:
        if self._inventory is None:
            self._inventory = ClusterState(
                name=self._name,
                provider=self._provider,
                region=self._region,
                pools=tuple(
                    p.with_free(tuple(self._free[pos][i] for i in self._listed[pos]))
                    for pos, p in enumerate(self._pools)
                ),
                reachable=self._reachable,
                object_store=self._object_store,
            )
        return self._inventory

    async def dispatch(self, gang: GangWorkload) -> None:
        self._check_reachable()
        now = self._now()
        if gang.name in self._gangs:
            return
        if self._refusing is not None:
            self.refused_dispatches += 1
            raise GangRejected(f"cluster {self._name}: {self._refusing}")
        try:
            replicas = self._place(gang)
        except GangRejected as rejected:
            self._log.info("gang_rejected", job_id=gang.job_id, attempt=gang.attempt, reason=str(rejected))
            raise
        duration_s, end_phase, end_message = self._planned_end(gang)
        self._commit(
            {
                "op": "dispatch",
                "at_s": now,
                "job_id": gang.job_id,
                "attempt": gang.attempt,
                "tenant": gang.tenant,
                "gpu_type": gang.gpu_type,
                "kind": gang.kind.value,
                "replicas": [[r.task, r.replica_index, r.pool, r.node_index, r.gpu_count] for r in replicas],
                "ends_at_s": now + duration_s,
                "exit_code": gang.sim_exit_code,
                "end_phase": end_phase.value,
                "end_message": end_message,
            }
        )
        self._log.info(
            "gang_dispatched",
            job_id=gang.job_id,
            attempt=gang.attempt,
            gpu_count=gang.gpu_count,
            node_count=len({(r.pool, r.node_index) for r in replicas}),
        )

    async def statuses(self) -> Sequence[GangStatus]:
        self._check_reachable()
        self._now()
        return self._statuses_view()

    def _statuses_view(self) -> tuple[GangStatus, ...]:
        if self._statuses is None:
            self._statuses = tuple(self._status_of.values())
        return self._statuses

    async def observe(self) -> tuple[Sequence[GangStatus], ClusterState]:
        # One advance of the clock for both: a gang that ended between two would be running in the
        # statuses and gone from the inventory.
        self._check_reachable()
        self._now()
        return self._statuses_view(), self._inventory_view()

    async def cancel(self, job_id: JobId, attempt: int, grace_period_s: float) -> None:
        """Cancel a running gang (it stays listed as CANCELLED); a finished gang is deleted instead."""
        self._check_reachable()
        now = self._now()
        name = gang_name(job_id, attempt)
        if name not in self._gangs:
            return
        running = name in self._running
        self._commit(
            {
                "op": "cancel",
                "at_s": now,
                "job_id": job_id,
                "attempt": attempt,
                "grace_period_s": grace_period_s,
            }
        )
        if running:
            self._log.info("gang_cancelled", job_id=job_id, attempt=attempt, grace_period_s=grace_period_s)
        else:
            self._log.info("gang_deleted", job_id=job_id, attempt=attempt)

    async def release_secrets(self, tenant: TenantId, job_id: JobId, attempt: int) -> None:
        """This fake keeps no secrets (a gang's `secrets` live only in the workload it was sent)."""
        self._check_reachable()

    async def evict(self, job_id: JobId, attempt: int, grace_period_s: float, reason: str) -> None:
        """Preempt a running gang: it keeps its GPUs for the grace period, then ends EVICTED.

        A gang that would finish on its own within the grace period finishes as it would have; a
        missing or finished gang is fine; evicting twice keeps the earlier end.
        """
        self._check_reachable()
        now = self._now()
        gang = self._running.get(gang_name(job_id, attempt))
        if gang is None:
            return
        evict_at_s = now + max(0.0, grace_period_s)
        if gang.evicting_at_s is not None and gang.evicting_at_s <= evict_at_s:
            return
        self._commit(
            {
                "op": "preempt",
                "at_s": now,
                "job_id": job_id,
                "attempt": attempt,
                "evict_at_s": evict_at_s,
                "reason": reason,
            }
        )
        self._log.info(
            "gang_preempted", job_id=job_id, attempt=attempt, grace_period_s=grace_period_s, reason=reason
        )
        # A grace period of 0 ends the gang now: the next status must already say EVICTED.
        self._now()

    # ---- clusters.api.GangInspector: a fake (clusters.memory_logs) --------------------------------

    async def replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        self._check_reachable()
        gang = self._gangs.get(gang_name(job_id, attempt))
        if gang is None or gang.sim.tenant != tenant:
            return []
        self._now()
        places = [(r.task, r.replica_index, f"{r.pool}-{r.node_index}") for r in gang.sim.replicas]
        return fake_replicas(
            gang.name, gang.phase, gang.message, places, gang.sim.started_at_s, gang.finished_at_s
        )

    async def events(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[GangEvent]:
        self._check_reachable()
        return []

    async def pod_log(
        self, tenant: TenantId, replica: ReplicaState, options: LogOptions
    ) -> AsyncIterator[bytes]:
        self._check_reachable()
        if not any(
            replica.pod.startswith(f"{g.name}-") and g.sim.tenant == tenant for g in self._gangs.values()
        ):
            raise LogUnavailable(f"pod {replica.pod} not found")
        async for chunk in fake_log(replica, options):
            yield chunk

    # ---- fault injection and introspection -------------------------------------------------------

    def set_reachable(self, reachable: bool) -> None:
        """While unreachable, every protocol call raises ClusterUnreachable (the gangs run on)."""
        self._reachable = reachable
        self._inventory = None

    def refuse_dispatches(self, reason: str | None) -> None:
        """Fault: refuse every new gang with `reason` (an admission webhook, a namespace stuck
        terminating) until called with None. Reads and gangs already there are unaffected."""
        self._refusing = reason

    def inject_eviction(self, job_id: JobId, attempt: int, reason: str = "node lost") -> None:
        """Fault: end a running gang as EVICTED now and free its GPUs. A finished gang is left as it is."""
        now = self._now()
        name = gang_name(job_id, attempt)
        if name not in self._gangs:
            raise KeyError(f"cluster {self._name} has no gang {name}")
        if name not in self._running:
            return
        self._commit({"op": "evict", "at_s": now, "job_id": job_id, "attempt": attempt, "reason": reason})
        self._log.info("gang_evicted", job_id=job_id, attempt=attempt, reason=reason)

    def fail_node(self, pool: str, index: int) -> None:
        """Lose a node for good: it leaves the inventory, and every gang with a replica on it is EVICTED."""
        if pool not in self._pool_pos:
            raise KeyError(f"cluster {self._name} has no pool {pool}")
        if not 0 <= index < self._pools[self._pool_pos[pool]].node_count:
            raise IndexError(f"pool {pool} on cluster {self._name} has no node {index}")
        now = self._now()
        if index in self._failed[self._pool_pos[pool]]:
            return
        self._commit({"op": "fail_node", "at_s": now, "pool": pool, "index": index})
        self._log.warning("node_failed", pool=pool, node_index=index)

    def forget(self, job_id: JobId, attempt: int) -> None:
        """Delete a gang's record (freeing its GPUs if it still runs); a later dispatch runs it anew."""
        now = self._now()
        if gang_name(job_id, attempt) not in self._gangs:
            return
        self._commit({"op": "forget", "at_s": now, "job_id": job_id, "attempt": attempt})

    def dispatch_count(self, job_id: JobId, attempt: int) -> int:
        """How many times this gang was created (repeated dispatches of a known gang do not count)."""
        return self._dispatches[gang_name(job_id, attempt)]

    def running_gangs(self) -> list[SimGang]:
        self._now()
        return [g.sim for g in self._running.values()]

    # ---- placement -------------------------------------------------------------------------------

    def _place(self, gang: GangWorkload) -> tuple[ReplicaPlacement, ...]:
        """Best fit decreasing: largest replica first, onto the fullest node that still holds it."""
        if not gang.replicas:
            raise GangRejected(f"gang {gang.name} has no replicas")
        for r in gang.replicas:
            if r.gpu_count < 0:
                raise GangRejected(
                    f"gang {gang.name}: replica {r.task}-{r.index} asks for {r.gpu_count} GPUs"
                )
        eligible = [
            pos for pos, p in enumerate(self._pools) if p.gpu_type == gang.gpu_type and p.kind == gang.kind
        ]
        if not eligible:
            raise GangRejected(f"cluster {self._name} has no {gang.kind.value} {gang.gpu_type} pool")
        top = max(self._pools[pos].gpus_per_node for pos in eligible)
        # Nodes by free count, each bucket sorted by (pool, node) so that ties go to pool order.
        buckets: list[list[tuple[int, int]]] = [[] for _ in range(top + 1)]
        for pos in eligible:
            for i, free in enumerate(self._free[pos]):
                if i not in self._failed[pos]:
                    buckets[free].append((pos, i))
        chosen: dict[int, ReplicaPlacement] = {}
        for k in sorted(range(len(gang.replicas)), key=lambda k: -gang.replicas[k].gpu_count):
            replica = gang.replicas[k]
            need = replica.gpu_count
            for free in range(need, top + 1):
                if buckets[free]:
                    pos, i = buckets[free].pop(0)
                    insort(buckets[free - need], (pos, i))
                    chosen[k] = ReplicaPlacement(replica.task, replica.index, self._pools[pos].name, i, need)
                    break
            else:
                raise GangRejected(self._no_fit_message(gang, eligible))
        return tuple(chosen[k] for k in range(len(gang.replicas)))

    def _no_fit_message(self, gang: GangWorkload, eligible: list[int]) -> str:
        free = [f for pos in eligible for i, f in enumerate(self._free[pos]) if i not in self._failed[pos]]
        sizes = "+".join(str(r.gpu_count) for r in sorted(gang.replicas, key=lambda r: -r.gpu_count))
        return (
            f"gang {gang.name} does not fit on cluster {self._name}: needs {gang.gpu_count} "
            f"{gang.kind.value} {gang.gpu_type} GPUs as replicas of {sizes} (each on one node); "
            f"{sum(free)} free across {len(free)} nodes, largest free block {max(free, default=0)}"
        )

    def _planned_end(self, gang: GangWorkload) -> tuple[float, GangPhase, str]:
        duration_s = self._default_duration_s if gang.sim_duration_s is None else gang.sim_duration_s
        duration_s = max(0.0, duration_s)
        if gang.max_runtime_s > 0 and duration_s > gang.max_runtime_s:
            return (
                float(gang.max_runtime_s),
                GangPhase.FAILED,
                f"exceeded maxRuntime ({gang.max_runtime_s} s)",
            )
        if gang.sim_exit_code != 0:
            return duration_s, GangPhase.FAILED, f"exited with code {gang.sim_exit_code}"
        return duration_s, GangPhase.SUCCEEDED, "completed"

    # ---- state changes: each one a journal record, applied the same way live and on replay ---------

    def _commit(self, record: dict[str, Any]) -> None:
        """Journal first: a change that could not be made durable is not made at all."""
        if self._journal is not None:
            line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
            with self._journal.open("ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        self._apply(record)

    def _apply(self, record: dict[str, Any]) -> None:
        op = record["op"]
        at_s = float(record["at_s"])
        if op == "fail_node":
            self._apply_fail_node(record["pool"], int(record["index"]), at_s)
            return
        name = gang_name(JobId(record["job_id"]), int(record["attempt"]))
        if op == "dispatch":
            self._apply_dispatch(name, record)
            return
        gang = self._gangs[name]
        if op == "cancel":
            if gang.phase is GangPhase.RUNNING:
                message = f"cancelled with a grace period of {record['grace_period_s']} s"
                self._finish(gang, GangPhase.CANCELLED, message, at_s)
            else:
                self._remove(name)
        elif op == "evict":
            self._finish(gang, GangPhase.EVICTED, record["reason"], at_s)
        elif op == "preempt":
            self._apply_preempt(gang, float(record["evict_at_s"]), str(record["reason"]))
        elif op == "forget":
            self._remove(name)
        else:
            raise JournalError(f"unknown journal operation {op!r}")

    def _apply_dispatch(self, name: str, record: dict[str, Any]) -> None:
        if name in self._gangs:
            raise JournalError(f"gang {name} dispatched twice")
        replicas = tuple(
            ReplicaPlacement(str(task), int(index), str(pool), int(node), int(gpus))
            for task, index, pool, node, gpus in record["replicas"]
        )
        for r in replicas:
            pos = self._pool_pos.get(r.pool)
            if (
                pos is None
                or not 0 <= r.node_index < len(self._free[pos])
                or r.node_index in self._failed[pos]
            ):
                raise JournalError(
                    f"gang {name} is on node {r.pool}/{r.node_index}, which this cluster lacks"
                )
            self._free[pos][r.node_index] -= r.gpu_count
            if self._free[pos][r.node_index] < 0:
                raise JournalError(f"gang {name} overfills node {r.pool}/{r.node_index}")
        self._seq += 1
        sim = SimGang(
            job_id=JobId(record["job_id"]),
            attempt=int(record["attempt"]),
            tenant=TenantId(record["tenant"]),
            gpu_type=GpuType(record["gpu_type"]),
            kind=CapacityKind(record["kind"]),
            replicas=replicas,
            started_at_s=float(record["at_s"]),
            ends_at_s=float(record["ends_at_s"]),
        )
        gang = _Gang(name, sim, GangPhase(record["end_phase"]), str(record["end_message"]), self._seq)
        self._gangs[name] = gang
        self._status_of[name] = self._status(gang)
        self._running[name] = gang
        self._dispatches[name] += 1
        heapq.heappush(self._ends, (sim.ends_at_s, gang.seq, name))
        self._changed(capacity=True)

    def _apply_preempt(self, gang: _Gang, evict_at_s: float, reason: str) -> None:
        if self._running.get(gang.name) is not gang or evict_at_s >= gang.sim.ends_at_s:
            return  # it ends on its own first
        if gang.evicting_at_s is not None and gang.evicting_at_s <= evict_at_s:
            return
        # A new sequence number retires the gang's planned end in the heap.
        self._seq += 1
        gang.seq = self._seq
        gang.evicting_at_s = evict_at_s
        gang.end_phase = GangPhase.EVICTED
        gang.end_message = reason
        heapq.heappush(self._ends, (evict_at_s, gang.seq, gang.name))

    def _apply_fail_node(self, pool: str, index: int, at_s: float) -> None:
        pos = self._pool_pos[pool]
        lost = [
            g
            for g in self._running.values()
            if any(r.pool == pool and r.node_index == index for r in g.sim.replicas)
        ]
        for gang in lost:
            self._finish(gang, GangPhase.EVICTED, f"node {pool}/{index} lost", at_s)
        self._failed[pos].add(index)
        self._free[pos][index] = 0
        self._listed[pos] = listed_nodes(self._pools[pos].node_count, self._failed[pos])
        self._listed_at[pos] = {node: i for i, node in enumerate(self._listed[pos])}
        # The inventory lists healthy nodes only, so the position of every later node in the pool moved.
        for gang in self._running.values():
            self._status_of[gang.name] = self._status(gang)
        self._changed(capacity=True)

    def _status(self, gang: _Gang) -> GangStatus:
        held: dict[tuple[str, int], int] = defaultdict(int)
        for r in gang.sim.replicas:
            index = self._listed_at[self._pool_pos[r.pool]].get(r.node_index)
            if index is None:
                # Part of it sits where the inventory does not look: a partial location would make
                # the placer miscount what evicting it frees, so report none.
                return gang.status(())
            held[(r.pool, index)] += r.gpu_count
        return gang.status(
            tuple(NodeShare(pool, index, gpus) for (pool, index), gpus in sorted(held.items()))
        )

    def _finish(self, gang: _Gang, phase: GangPhase, message: str, at_s: float) -> None:
        gang.phase = phase
        gang.message = message
        gang.finished_at_s = at_s
        self._status_of[gang.name] = self._status(gang)
        self._release(gang)
        self._changed(capacity=False)

    def _remove(self, name: str) -> None:
        gang = self._gangs.pop(name)
        del self._status_of[name]
        self._release(gang)
        self._changed(capacity=False)

    def _release(self, gang: _Gang) -> None:
        if self._running.get(gang.name) is not gang:
            return
        del self._running[gang.name]
        for r in gang.sim.replicas:
            self._free[self._pool_pos[r.pool]][r.node_index] += r.gpu_count
        self._changed(capacity=True)

    def _changed(self, *, capacity: bool) -> None:
        self._statuses = None
        if capacity:
            self._inventory = None

    # ---- time ------------------------------------------------------------------------------------

    def _now(self) -> float:
        self._advance(self._clock())
        return self._now_s

    def _advance(self, now_s: float) -> None:
        """Finish every running gang whose planned end has come, at its planned end."""
        self._now_s = max(self._now_s, now_s)
        while self._ends and self._ends[0][0] <= self._now_s:
            ends_at_s, seq, name = heapq.heappop(self._ends)
            gang = self._running.get(name)
            if gang is None or gang.seq != seq:
                continue
            self._finish(gang, gang.end_phase, gang.end_message, ends_at_s)
            self._log.debug(
                "gang_finished", job_id=gang.sim.job_id, attempt=gang.sim.attempt, phase=gang.phase
            )

    def _check_reachable(self) -> None:
        if not self._reachable:
            raise ClusterUnreachable(f"cluster {self._name} is unreachable (simulated)")

    # ---- journal replay --------------------------------------------------------------------------

    def _replay(self, path: Path) -> None:
        """Rebuild the state from the journal, dropping a torn last line left by a crash mid-write."""
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
            # The file's directory entry must be durable too, or a crash could lose the whole journal.
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            return
        data = path.read_bytes()
        complete, _, tail = data.rpartition(b"\n")
        lines = complete.split(b"\n") if complete else []
        records: list[dict[str, Any]] = []
        kept_bytes = 0
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not an object")
            except ValueError as error:
                if number == len(lines) and not tail:
                    break
                raise JournalError(f"journal {path} line {number} is corrupt: {error}") from error
            records.append(record)
            kept_bytes += len(line) + 1
        if kept_bytes < len(data):
            # Cut the torn bytes off, or the next record would be appended onto them.
            os.truncate(path, kept_bytes)
            self._log.warning(
                "journal_torn_tail_dropped", path=str(path), dropped_bytes=len(data) - kept_bytes
            )
        for number, record in enumerate(records, start=1):
            try:
                self._advance(float(record["at_s"]))
                self._apply(record)
            except (KeyError, TypeError, ValueError) as error:
                raise JournalError(f"journal {path} line {number} does not apply: {error!r}") from error
        self._log.info("journal_replayed", path=str(path), records=len(records), gangs=len(self._gangs))
