"""A job's outputs become dataset versions when it succeeds (issue 34).

A job declares `outputs: [{dataset, path, version}]`. Each attempt writes an output under a prefix
of its own, `<path><job id>/a<attempt>/`, in the object store of the cluster it runs on; the
attempt is told where in its environment (`GPUFED_OUTPUT_<DATASET>`, see `output_env`). So a failed,
evicted or cancelled attempt's partial output never mixes with the attempt that succeeds, and only
the succeeded attempt's prefix is ever read.

Registration (`Registrar.register`, driven by `OutputsController` on every server) of a SUCCEEDED job:
1. where: the job's cluster's store; the prefix must be granted to the job's tenant there (the server
   reads it with its own credentials, as for `RegisterDataset`);
2. what: the manifest (sizes, sha256) of the prefix, refused when any object there was written after
   the job ended (a third party on the same bucket), checked again by a listing after hashing;
3. lineage first (`federation.datasets.lineage`: job, attempt, images, parameters, input versions),
   then the version (copied and verified into the dataset's home store first when the job ran
   elsewhere), then the output's record. Each step is idempotent: the version's name is fixed by the
   spec (or is the job id), a retried `add_version` of the same content is a no-op, and a restart
   between any two steps finds the lineage and finishes. Two servers registering at once register
   one version.

Output records: /gpufed/outputs/<job id>/<index> -> {state, dataset, version, store, prefix, reason}.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

import structlog

from datasync import (
    DatasetName,
    DatasetVersion,
    DatasyncError,
    Manifest,
    ObjectStore,
    StoreLocation,
    StoreName,
    VersionId,
    build_manifest,
    sync_version,
)
from datasync.store import list_all
from federation.datasets.grants import GrantDirectory, allows
from federation.datasets.lineage import Lineage, LineageStore
from federation.datasets.registry import DatasetRegistry, qualified
from federation.datasets.stores import StoreDirectory
from federation.errors import Conflict, GpufedError
from federation.spec.jobspec import OutputSpec
from federation.store.job_store import JobStore
from federation.store.jobs import JobRecord
from federation.store.kv import Compare, KeyValueStore, Put
from federation.store.schema_version import dumps, loads
from placement.model import JobPhase, TenantId

log = structlog.get_logger("gpufed.outputs")

OUTPUTS = b"/gpufed/outputs/"
ENV_PREFIX = "GPUFED_OUTPUT_"
# S3 keeps Last-Modified to the second: an object written in the job's last second may read as up to
# a second later than the end the status reconciler recorded.
_CLOCK_SLACK_S = 1.0
DEFAULT_INTERVAL_S = 2.0
_CONCURRENCY = 16
_CAS_ATTEMPTS = 5


class OutputState(StrEnum):
    PENDING = "pending"  # the job has not succeeded (yet)
    REGISTERING = "registering"  # succeeded; not yet registered
    REGISTERED = "registered"
    REFUSED = "refused"
    NOT_REGISTERED = "not_registered"  # failed or cancelled: partial output is never registered


# What no later pass changes: the archiver may move the job once each output is in one of these.
SETTLED_STATES = frozenset({OutputState.REGISTERED, OutputState.REFUSED, OutputState.NOT_REGISTERED})


@dataclass(frozen=True, slots=True)
class OutputRecord:
    state: OutputState
    dataset: str
    version: str
    store: str = ""
    prefix: str = ""
    reason: str = ""


def env_name(dataset: str) -> str:
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", dataset).upper()


def attempt_prefix(output: OutputSpec, job_id: str, attempt: int) -> str:
    """Where one attempt writes: its own prefix, so that no other attempt's objects are in it."""
    return f"{output.path}{job_id}/a{attempt}/"


def version_of(output: OutputSpec, job_id: str) -> str:
    return output.version or job_id


def output_env(job: JobRecord) -> tuple[tuple[str, str], ...]:
    """What the attempt's pods are told: the prefix each output goes under, in its cluster's store."""
    return tuple((env_name(o.dataset), attempt_prefix(o, job.job_id, job.attempt)) for o in job.spec.outputs)


def awaited_inputs(jobs: Iterable[JobRecord], registered: Callable[[str], object | None]) -> frozenset[str]:
    """The queued jobs (ids) whose input version a live job among `jobs` will make and the registry
    does not hold yet (`registered(tenant/name@version)` is None): held out of the placer's queue, so
    that a consumer holds no GPUs while its producer runs (or waits for the very GPUs it holds).
    Pure, over the cycle's jobs and locations; a version whose maker has just succeeded is not held
    here but waited for in STAGING until it is registered (`federation.datasets.staging`)."""
    made: set[str] = set()
    for job in jobs:
        if job.spec.outputs and not job.phase.is_terminal:
            made.update(
                f"{qualified(job.tenant, o.dataset)}@{version_of(o, job.job_id)}" for o in job.spec.outputs
            )
    if not made:
        return frozenset()
    held = set()
    # Run by every cycle over every live job: an enum member read once, not once a job.
    queued = JobPhase.QUEUED
    for job in jobs:
        ref = job.spec.dataset
        if ref is None or ref.version is None or job.phase is not queued:
            continue
        wanted = f"{qualified(job.tenant, ref.name)}@{ref.version}"
        if wanted in made and registered(wanted) is None:
            held.add(job.job_id)
    return frozenset(held)


def _key(job_id: str, index: int) -> bytes:
    return OUTPUTS + f"{job_id}/{index}".encode()


class OutputRecords:
    """Each output's record, written only over the version its writer read (`settle`): the servers'
    registrars and the leader's archiver settle the same records, and the last write must never
    turn a registered version into a refused one, or the reverse."""

    def __init__(self, kv: KeyValueStore) -> None:
        self._kv = kv

    async def get(self, job_id: str, index: int) -> OutputRecord | None:
        return (await self.read(job_id, index))[0]

    async def read(self, job_id: str, index: int) -> tuple[OutputRecord | None, int]:
        """The record and its mod revision (0: none), for `settle`."""
        kv = await self._kv.get(_key(job_id, index))
        if kv is None:
            return None, 0
        d = loads(kv.value, kv.key)
        record = OutputRecord(
            OutputState(d["state"]), d["dataset"], d["version"], d["store"], d["prefix"], d["reason"]
        )
        return record, kv.mod_revision

    async def settle(self, job_id: str, index: int, record: OutputRecord, read_at: int) -> OutputRecord:
        """Write `record` unless the record changed since it was read at mod revision `read_at` (0:
        absent). Returns what stands: `record`, or the settled record another writer put first."""
        key = _key(job_id, index)
        body = {
            "state": record.state.value,
            "dataset": record.dataset,
            "version": record.version,
            "store": record.store,
            "prefix": record.prefix,
            "reason": record.reason,
        }
        guard = Compare.absent(key) if read_at == 0 else Compare.mod_revision_is(key, read_at)
        result = await self._kv.txn([guard], [Put(key, dumps(body, sort_keys=True))])
        if result.succeeded:
            return record
        now, _ = await self.read(job_id, index)
        if now is not None and now.state in SETTLED_STATES:
            return now
        raise OutputRaced(f"output {index} of job {job_id}: its record changed while it was being settled")


class OutputRaced(GpufedError):
    """An output record changed under its writer without being settled: retried at the next pass."""


class Refused(Exception):
    """An output that will not become a version; the reason is the user's to read."""


def ended_at_s(job: JobRecord) -> float:
    return next((e.at_s for e in reversed(job.events) if e.phase is JobPhase.SUCCEEDED), job.submitted_at_s)


def _dispatched_at_s(job: JobRecord) -> float:
    return next(
        (e.at_s for e in reversed(job.events) if e.phase is JobPhase.DISPATCHED and e.attempt == job.attempt),
        ended_at_s(job),
    )


class Registrar:
    """Registers a succeeded job's outputs; every step idempotent (see the module's docstring)."""

    def __init__(
        self,
        *,
        kv: KeyValueStore,
        store: JobStore,
        registry: DatasetRegistry,
        stores: StoreDirectory,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._registry = registry
        self._stores = stores
        self._grants = GrantDirectory(kv)
        self._lineage = LineageStore(kv)
        self.records = OutputRecords(kv)
        self._clock = clock

    async def register(self, job: JobRecord) -> list[OutputRecord]:
        """Every output of a SUCCEEDED job registered (or refused, saying why); what is done is kept."""
        assert job.phase is JobPhase.SUCCEEDED
        results = []
        for index, output in enumerate(job.spec.outputs):
            held, read_at = await self.records.read(job.job_id, index)
            if held is not None and held.state in SETTLED_STATES:
                results.append(held)
                continue
            try:
                record = await self._register_one(job, output)
            except Refused as refused:
                record = OutputRecord(
                    OutputState.REFUSED, output.dataset, version_of(output, job.job_id), reason=str(refused)
                )
                log.warning("output_refused", job_id=job.job_id, dataset=output.dataset, reason=str(refused))
            results.append(await self.records.settle(job.job_id, index, record, read_at))
        return results

    async def _store_of(self, job: JobRecord) -> str:
        assert job.placement is not None
        cluster = await self._store.get_cluster(job.placement.cluster)
        if cluster is None or cluster.object_store is None:
            raise Refused(f"cluster {job.placement.cluster} has no object store for outputs")
        return cluster.object_store

    async def _check_grant(self, store: str, tenant: str, prefix: str) -> None:
        record = await self._stores.get(store)
        if record is None:
            raise Refused(f"object store {store} is not configured")
        grant = await self._grants.effective(store, tenant, record.dataset_prefixes)
        if not allows(grant.prefixes, prefix):
            raise Refused(
                f"path: tenant {tenant} may write datasets in store {store} only under its granted "
                f"prefixes ({', '.join(grant.prefixes) or 'none'}), not {prefix}"
            )

    async def _register_one(self, job: JobRecord, output: OutputSpec) -> OutputRecord:
        tenant = job.tenant
        name = qualified(tenant, output.dataset)
        version = version_of(output, job.job_id)
        store = await self._store_of(job)
        prefix = attempt_prefix(output, job.job_id, job.attempt)
        done = OutputRecord(OutputState.REGISTERED, name, version, store, prefix)
        existing = await self._registry.lookup(tenant, output.dataset)
        made = await self._lineage.get(existing.value.name if existing else name, version)
        if existing is not None and existing.value.version(VersionId(version)) is not None:
            if made is not None and made.job_id == job.job_id:
                # Registered before a restart; only the record was left to write.
                return replace(done, store=made.store, prefix=made.prefix)
            raise Refused(f"version: {name}@{version} exists already (made by another job or by hand)")
        if made is not None and made.job_id != job.job_id:
            raise Refused(f"version: {name}@{version} is being made by another job ({made.job_id})")
        await self._check_grant(store, tenant, prefix)
        source = await self._stores.client(store)
        manifest = await self._manifest(source, prefix, ended_at_s(job), store)
        home_store, home_prefix = store, prefix
        if existing is not None and existing.value.home_store != store:
            # Versions live in their dataset's home store: copy there, verified against the manifest.
            home_store = existing.value.home_store
            await self._check_grant(home_store, tenant, prefix)
            target = await self._stores.client(home_store)
            try:
                await sync_version(source, prefix, target, prefix, manifest)
            except DatasyncError as error:
                raise Refused(f"copying to the home store {home_store} failed: {error}") from error
        inputs = await self._inputs(job)
        kept = await self._lineage.create(
            Lineage(
                dataset=existing.value.name if existing else name,
                version=version,
                tenant=tenant,
                job_id=job.job_id,
                attempt=job.attempt,
                job_name=job.spec.name,
                images=tuple(dict.fromkeys(t.image for t in job.spec.tasks)),
                params=tuple(sorted({kv for t in job.spec.tasks for kv in t.env})),
                inputs=inputs,
                store=home_store,
                prefix=home_prefix,
                created_at_s=self._clock(),
                job_set=job.job_set,
            )
        )
        if kept.job_id != job.job_id:
            raise Refused(f"version: {name}@{version} is being made by another job ({kept.job_id})")
        record = DatasetVersion(
            dataset=DatasetName(output.dataset),
            version=VersionId(version),
            home=StoreLocation(StoreName(home_store), home_prefix),
            manifest_digest=manifest.digest,
            size_bytes=manifest.total_size_bytes,
            object_count=manifest.object_count,
            created_at_s=self._clock(),
        )
        for attempt in range(_CAS_ATTEMPTS):
            try:
                await self._registry.add_version(TenantId(tenant), record, manifest, frozenset())
                break
            except Conflict:
                # Another registrar (or a user's register) changed the dataset meanwhile: again; the
                # same content under the version is then a no-op.
                if attempt == _CAS_ATTEMPTS - 1:
                    raise
            except GpufedError as error:
                raise Refused(str(error)) from error
        log.info("output_registered", job_id=job.job_id, dataset=name, version=version, store=home_store)
        return OutputRecord(OutputState.REGISTERED, name, version, home_store, home_prefix)

    async def _manifest(self, source: ObjectStore, prefix: str, end_s: float, store: str) -> Manifest:
        try:
            late = [
                m.path for m in await list_all(source, prefix) if m.last_modified_s > end_s + _CLOCK_SLACK_S
            ]
            if late:
                raise Refused(_late(late, prefix, store))
            manifest = await build_manifest(source, prefix, concurrency=_CONCURRENCY)
            # Written while it was hashed? A listing after: the same objects, none newer than the end.
            after = {m.path: m for m in await list_all(source, prefix)}
        except DatasyncError as error:
            raise Refused(f"reading {store}/{prefix} failed: {error}") from error
        late = [p for p, m in after.items() if m.last_modified_s > end_s + _CLOCK_SLACK_S]
        if late:
            raise Refused(_late(late, prefix, store))
        if manifest.object_count == 0:
            raise Refused(f"the job wrote nothing under {prefix} in store {store}")
        sizes = {prefix + e.path: e.size_bytes for e in manifest.entries}
        if {p: m.size_bytes for p, m in after.items() if not p.startswith(prefix + ".gpufed/")} != sizes:
            raise Refused(f"objects under {prefix} in store {store} changed while they were hashed")
        return manifest

    async def _inputs(self, job: JobRecord) -> tuple[str, ...]:
        """The input version the job read: the one it named, or the latest when its attempt started."""
        ref = job.spec.dataset
        if ref is None:
            return ()
        stored = await self._registry.lookup(job.tenant, ref.name)
        if stored is None:
            return (str(ref),)  # a config-listed dataset, outside the registry
        d = stored.value
        if ref.version is not None:
            return (f"{d.name}@{ref.version}",)
        started = _dispatched_at_s(job)
        older = [v for v in d.versions if v.created_at_s <= started] or list(d.versions)
        latest = max(older, key=lambda v: v.created_at_s)
        return (f"{d.name}@{latest.version}",)


def _late(paths: list[str], prefix: str, store: str) -> str:
    shown = ", ".join(p.removeprefix(prefix) for p in sorted(paths)[:5])
    return (
        f"{len(paths)} object(s) under {prefix} in store {store} were written after the job ended "
        f"({shown}); an output holds only what its job wrote"
    )


class OutputsController:
    """Registers the outputs of succeeded jobs, on every server (registration is idempotent), every
    `interval_s`; a job is looked at until its every output is registered or refused."""

    def __init__(
        self,
        registrar: Registrar,
        jobs: Callable[[], Iterable[JobRecord]],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        succeeded: Callable[[], Iterable[JobRecord]] | None = None,
        of_tenant: Callable[[str], Iterable[JobRecord]] | None = None,
    ) -> None:
        """`jobs`: every job. A server passes narrower reads of its job cache's index too, so that
        neither a pass nor a check walks (and decodes) a deep queue: `succeeded`, the succeeded jobs
        (a pass reads only those), and `of_tenant`, one tenant's jobs that are live or succeeded
        (`declared` reads only those)."""
        self._registrar = registrar
        self.records = registrar.records
        self._jobs = jobs
        self._succeeded = succeeded or jobs
        self._of_tenant = of_tenant
        self._interval_s = interval_s
        self._done: set[str] = set()

    async def run_once(self) -> int:
        """One pass; how many jobs it finished with."""
        finished = 0
        for job in list(self._succeeded()):
            if job.phase is not JobPhase.SUCCEEDED or not job.spec.outputs or job.job_id in self._done:
                continue
            try:
                await self._registrar.register(job)
            except (GpufedError, DatasyncError, OSError) as error:
                # Retried next pass: a store or etcd that does not answer now may later.
                log.warning("output_registration_failed", job_id=job.job_id, error=str(error))
                continue
            self._done.add(job.job_id)
            finished += 1
        return finished

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.run_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)

    def declared(self, tenant: str, dataset: str, version: str) -> JobRecord | None:
        """A job of `tenant` that will make `dataset@version` (`tenant/name`), and has not yet."""
        for job in self._jobs() if self._of_tenant is None else self._of_tenant(tenant):
            if job.tenant != tenant or job.job_id in self._done:
                continue
            if job.phase.is_terminal and job.phase is not JobPhase.SUCCEEDED:
                continue
            for o in job.spec.outputs:
                if qualified(tenant, o.dataset) == dataset and version_of(o, job.job_id) == version:
                    return job
        return None
