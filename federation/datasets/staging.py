"""STAGING: what the dispatcher asks before it creates a gang whose job reads a dataset.

`prepare` (an ADMITTED job) and `poll` (a STAGING job) answer with a `Gate`:
  READY   the version is in the store of the job's cluster (its home, or a cached copy, now pinned by
          the job): dispatch
  STAGE   a sync into that store was requested (or joined): ADMITTED -> STAGING
  WAIT    the sync runs: stay in STAGING (progress is in the sync record, not the job record)
  FAIL    the sync failed, or the dataset cannot be used: the reason says why, `retryable` whether
          the job's restart policy may requeue it

The copying itself runs in the background (`federation.datasets.staging_run`), started from `tick`, which also
releases the pins of jobs that are done with their copies. A job whose dataset the registry does not
know goes on as before (the config's `datasets:` list may still describe where it is, for the placer).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

import structlog

from datasync import CopyKey, Dataset, DatasetName, DatasetVersion, StoreName, VersionId, pin, unpin
from federation.datasets.check import Declared, not_registered
from federation.datasets.registry import DatasetRegistry, qualified, resolve
from federation.datasets.staging_run import SyncRunner
from federation.datasets.syncs import SyncRecord, SyncRecords, SyncState
from federation.store.jobs import JobRecord, Owner
from placement.model import ClusterName, JobPhase

log = structlog.get_logger("gpufed.staging")

# Phases in which a job may hold a pin: it is pinned just before its dispatch (from ADMITTED or STAGING)
# and released once it finishes or goes back to the queue.
_USING = frozenset({JobPhase.ADMITTED, JobPhase.STAGING, JobPhase.DISPATCHED, JobPhase.RUNNING})


class GateKind(StrEnum):
    READY = "ready"
    STAGE = "stage"
    WAIT = "wait"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Gate:
    kind: GateKind
    reason: str = ""
    retryable: bool = False


READY = Gate(GateKind.READY)
WAIT = Gate(GateKind.WAIT)


class Stager:
    def __init__(
        self,
        *,
        registry: DatasetRegistry,
        syncs: SyncRecords,
        runner: SyncRunner,
        cluster_store: Callable[[ClusterName], str | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self._syncs = syncs
        self._runner = runner
        self._cluster_store = cluster_store
        self._clock = clock
        # Set by the outputs controller's wiring (`federation.datasets.check.Declared`).
        self.declared: Declared | None = None

    async def _target(self, job: JobRecord) -> tuple[DatasetVersion, str] | Gate:
        """The version the job reads and the store it must be in, or the gate when there is nothing to do."""
        ref = job.spec.dataset
        if ref is None or job.placement is None:
            return READY
        store = self._cluster_store(job.placement.cluster)
        # A bare name is the job's tenant's dataset; `tenant/name` another tenant's (shared with it).
        stored = await self._registry.lookup(job.tenant, ref.name)
        awaited = self._awaited(job, stored.value if stored is not None else None)
        if awaited is not None:
            return awaited
        if stored is None and ref.version is not None and self.declared is not None:
            # Accepted at submission only as a version a live job would make (neither the registry nor
            # the config's `datasets:` knows it), and that job is no longer making it.
            settings = await self._runner.settings()
            if (
                settings.dataset(str(ref)) is None
                and settings.dataset(f"{qualified(job.tenant, ref.name)}@{ref.version}") is None
            ):
                return Gate(
                    GateKind.FAIL,
                    f"dataset {ref} does not exist: no job made it (the job that declared it as its output "
                    "did not succeed)",
                )
        if stored is None or store is None:
            return READY
        if not stored.value.visible_to(job.tenant):
            # No longer shared since the job was submitted: said as for a dataset the tenant cannot name.
            return Gate(GateKind.FAIL, not_registered(ref, job.tenant))
        version = resolve(stored.value, ref.version)
        if version is None:
            return Gate(GateKind.FAIL, f"dataset {ref} has no such version")
        return version, store

    def _awaited(self, job: JobRecord, dataset: Dataset | None) -> Gate | None:
        """The wait of a job whose input version another job will make and has not yet (issue 34)."""
        ref = job.spec.dataset
        if ref is None or ref.version is None or self.declared is None:
            return None
        if dataset is not None and dataset.version(VersionId(ref.version)) is not None:
            return None
        name = qualified(job.tenant, ref.name)
        owner = name.partition("/")[0]
        if owner != job.tenant and (dataset is None or not dataset.visible_to(job.tenant)):
            return None
        maker = self.declared(owner, name, ref.version)
        if maker is None:
            return None
        # Another tenant's job is not named to this one (it may read the data, not the owner's jobs).
        who = (
            f"job {maker.job_id} ({maker.phase.value.lower()})" if owner == job.tenant else "its owner's job"
        )
        return Gate(
            GateKind.STAGE,
            f"waiting for its input {name}@{ref.version}, the declared output of {who}; "
            "it goes on once that job succeeds and the version is registered",
        )

    async def prepare(self, job: JobRecord) -> Gate:
        target = await self._target(job)
        if isinstance(target, Gate):
            return target
        version, store = target
        if await self._present(job, version, store):
            return READY
        assert job.placement is not None
        record = await self._syncs.request(
            SyncRecord.requested(version, store, self._clock()), job_id=job.job_id
        )
        await self._runner.start_missing()
        return Gate(
            GateKind.STAGE,
            f"staging {version.dataset}@{version.version} ({version.size_bytes} bytes, "
            f"{version.object_count} objects) from {version.home.store} to {store} "
            f"for {job.placement.cluster}; sync {record.state.value}",
        )

    async def check(self, job: JobRecord) -> Gate:
        return await (self.prepare(job) if job.phase is JobPhase.ADMITTED else self.poll(job))

    async def poll(self, job: JobRecord) -> Gate:
        target = await self._target(job)
        if isinstance(target, Gate):
            # Still waiting for an input another job makes: stay in STAGING.
            return WAIT if target.kind is GateKind.STAGE else target
        version, store = target
        held = await self._syncs.get(store, version.dataset, version.version)
        if held is not None and held[0].state is SyncState.FAILED:
            record = held[0]
            return Gate(
                GateKind.FAIL,
                f"sync of {version.dataset}@{version.version} to {store} failed: {record.error}",
                retryable=record.retryable,
            )
        if held is not None and held[0].state.active:
            # The copy is being written (a first sync, or a re-sync repairing it): not usable yet.
            return WAIT
        if await self._present(job, version, store):
            return READY
        # The record is gone, or done while the copy was evicted or found damaged: ask again.
        gate = await self.prepare(job)
        return WAIT if gate.kind is GateKind.STAGE else gate

    async def _present(self, job: JobRecord, version: DatasetVersion, store: str) -> bool:
        """Whether the store holds the version; a cached copy is checked against etcd's record (one
        listing: sizes and ETags) and pinned by the job before dispatch. A copy that fails the check is
        not used: the caller asks for a sync, which copies again only what is missing or changed."""
        if store == version.home.store:
            return True
        key = CopyKey(StoreName(store), DatasetName(version.dataset), VersionId(version.version))
        if await self._registry.get_copy(key) is None:
            return False
        bad = await self._runner.check(key)
        if bad:
            log.warning(
                "copy_damaged", job_id=job.job_id, store=store, dataset=version.dataset, objects=len(bad)
            )
            return False
        for _ in range(5):
            held = await self._registry.get_copy(key)
            if held is None:
                return False
            copy, revision = held
            if job.job_id in copy.pinned_by:
                return True
            state = await self._registry.copies(store)
            pinned = pin(state, key, job.job_id, self._clock()).get(key)
            assert pinned is not None
            if await self._registry.put_copy(pinned, expect_revision=revision):
                log.info("copy_pinned", job_id=job.job_id, store=store, dataset=version.dataset)
                return True
        return False

    async def tick(self, jobs: Iterable[JobRecord]) -> None:
        """Start syncs that have no task here (new, or left by a previous leader); release old pins;
        start the periodic scrub of one copy when it is due."""
        await self._runner.start_missing()
        self._runner.scrub_tick()
        copies = (await self._registry.copies()).copies
        if not any(copy.pinned_by for copy in copies):
            # Nothing pinned, nothing to release: no walk of every live job (3 % of the leader's
            # CPU in bench/scale.py at 100 clusters, once a reconciler look).
            return
        using = {
            (j.job_id, self._cluster_store(j.placement.cluster))
            for j in jobs
            if j.phase in _USING and j.placement is not None
        }
        for copy in copies:
            done = {j for j in copy.pinned_by if (j, copy.key.store) not in using}
            if not done:
                continue
            held = await self._registry.get_copy(copy.key)
            if held is None:
                continue
            current, revision = held
            state = await self._registry.copies(copy.key.store)
            for job_id in done:
                state = unpin(state, copy.key, job_id, self._clock())
            released = state.get(copy.key)
            if released is not None and await self._registry.put_copy(
                replace(released, pinned_by=current.pinned_by - done), expect_revision=revision
            ):
                log.info("copy_released", store=copy.key.store, dataset=copy.key.dataset, jobs=sorted(done))

    async def stop(self) -> None:
        await self._runner.stop()


def gate_transition(job: JobRecord, gate: Gate, now_s: float) -> JobRecord | None:
    """The dispatcher's transition for a gate that is not READY (None: nothing to write yet).

    ADMITTED cannot go straight to FAILED (the transition table), so a job that cannot be staged at
    all enters STAGING with the reason and fails from there on the next tick. A failed sync fails
    the job, or requeues it (a new attempt, charged as a retry) when the failure may pass and its
    restart policy has retries left.
    """
    if gate.kind is GateKind.WAIT:
        return None
    if gate.kind is GateKind.STAGE or job.phase is JobPhase.ADMITTED:
        return job.transition(JobPhase.STAGING, by=Owner.DISPATCHER, at_s=now_s, reason=gate.reason)
    if gate.retryable and job.retries_used < job.spec.restart_policy.max_retries:
        return job.transition(
            JobPhase.QUEUED,
            by=Owner.DISPATCHER,
            at_s=now_s,
            reason=f"attempt {job.attempt}: {gate.reason}; requeued "
            f"(retry {job.retries_used + 1} of {job.spec.restart_policy.max_retries})",
            attempt=job.attempt + 1,
            retries_used=job.retries_used + 1,
            placement=None,
        )
    return job.transition(JobPhase.FAILED, by=Owner.DISPATCHER, at_s=now_s, reason=gate.reason)
