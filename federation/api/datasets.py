"""The Datasets service: register versions (the server builds the manifest), list and show them with
their copies, plan or request a sync (egress estimate first), read progress, evict a copy.

Every field is checked before anything is read from a store or written to etcd, and a refused request
writes nothing. Errors from the object stores (datasync's) become FAILED_PRECONDITION when retrying
cannot help (a missing bucket, bad credentials) and UNAVAILABLE when it may.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import replace

from datasync import (
    CachedCopy,
    CopyKey,
    Dataset,
    DatasetVersion,
    StoreLocation,
    StoreName,
    build_manifest,
    plan_sync,
)
from federation.api import convert
from federation.api.datasets_trust import DatasetTrustCalls
from federation.api.datasets_trust import store_call as _store_call
from federation.api.service import CallHandlers, Ctx
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.datasets.fence import CopyBusy
from federation.datasets.grants import GrantDirectory, allows
from federation.datasets.lineage import LineageStore, Node, walk
from federation.datasets.outputs import (
    OutputRecord,
    OutputsController,
    OutputState,
    Registrar,
    attempt_prefix,
    version_of,
)
from federation.datasets.registry import (
    DatasetRegistry,
    cache_prefix,
    dataset_name_field,
    dataset_ref_field,
    prefix_field,
    reference,
    resolve,
    version_field,
)
from federation.datasets.staging_run import egress_rate, evict_copy
from federation.datasets.stores import StoreDirectory
from federation.datasets.syncs import SyncRecord, SyncRecords
from federation.errors import FailedPrecondition, InvalidSpec, NotFound, PermissionDenied
from federation.metrics import Metrics
from federation.security.auth import (
    Authenticator,
    Principal,
    acting_tenant,
    can_read_tenant,
    check_read_dataset,
    check_sync_dataset,
    job_not_found,
    listable_tenant,
)
from federation.security.tokens import SecurityStore
from federation.spec.validate import name_field, shown
from federation.store.job_cache import JobCache
from federation.store.job_store import JobStore
from federation.store.jobs import JobRecord
from federation.store.records import Role
from placement.model import JobId, JobPhase, TenantId

MAX_SHARED = 100
BUILD_CONCURRENCY = 16


def version_to_pb(v: DatasetVersion) -> pb.DatasetVersionInfo:
    return pb.DatasetVersionInfo(
        dataset=v.dataset,
        version=v.version,
        store=v.home.store,
        prefix=v.home.prefix,
        manifest_digest=v.manifest_digest,
        size_bytes=v.size_bytes,
        object_count=v.object_count,
        created_at=convert.timestamp(v.created_at_s),
    )


def dataset_to_pb(
    d: Dataset, copies: tuple[CachedCopy, ...], shown_jobs: dict[str, tuple[list[str], int]] | None = None
) -> pb.DatasetInfo:
    """`shown_jobs`: per copy (store/version), the pinning jobs the caller may read, and how many others."""
    shown_jobs = shown_jobs or {}
    return pb.DatasetInfo(
        name=reference(d),
        tenant=d.tenant,
        home_store=d.home_store,
        shared_with=sorted(d.shared_with),
        versions=[version_to_pb(v) for v in sorted(d.versions, key=lambda v: v.created_at_s)],
        copies=[
            pb.CachedCopyInfo(
                store=c.key.store,
                version=c.key.version,
                size_bytes=c.size_bytes,
                last_used=convert.timestamp(c.last_used_s),
                pinned_by=shown_jobs.get(f"{c.key.store}/{c.key.version}", (sorted(c.pinned_by), 0))[0],
                pinned_by_others=shown_jobs.get(f"{c.key.store}/{c.key.version}", ([], 0))[1],
            )
            for c in copies
            if c.key.dataset == d.name
        ],
    )


def sync_to_pb(r: SyncRecord, shown_jobs: tuple[list[str], int] | None = None) -> pb.SyncStatus:
    jobs, others = shown_jobs if shown_jobs is not None else (list(r.job_ids), 0)
    return pb.SyncStatus(
        dataset=r.dataset,
        version=r.version,
        store=r.store,
        source_store=r.source_store,
        state=r.state.value,
        progress=pb.SyncProgressInfo(
            bytes_done=r.bytes_done,
            bytes_total=r.bytes_total,
            objects_done=r.objects_done,
            objects_total=r.objects_total,
            rate_bytes_per_s=r.rate_bytes_per_s,
            eta_s=-1.0 if r.eta_s is None else r.eta_s,
            elapsed_s=r.elapsed_s,
            objects_up_to_date=r.objects_up_to_date,
            objects_copied=r.objects_copied,
            objects_reused=r.objects_reused,
            objects_failed=r.objects_failed,
            bytes_transferred=r.bytes_transferred,
            bytes_server_copied=r.bytes_server_copied,
            bytes_reused=r.bytes_reused,
            bytes_resumed=r.bytes_resumed,
        ),
        bytes_to_copy=r.bytes_to_copy,
        objects_to_copy=r.objects_to_copy,
        egress_usd=r.egress_usd,
        egress_usd_per_gb=r.egress_usd_per_gb,
        bytes_copied=r.bytes_copied,
        error=r.error,
        job_ids=jobs,
        other_job_count=others,
        updated_at=convert.timestamp(r.updated_at_s),
        verified=r.verified,
    )


_SUCCEEDED = (JobPhase.SUCCEEDED,)
# The phases of a job that may yet register an output, or has one to: live, or succeeded.
_MAKERS = tuple(p for p in JobPhase if not p.is_terminal or p is JobPhase.SUCCEEDED)


class DatasetService(DatasetTrustCalls, pb_grpc.DatasetsServicer):
    def __init__(
        self,
        *,
        store: JobStore,
        registry: DatasetRegistry,
        stores: StoreDirectory,
        syncs: SyncRecords,
        auth: Authenticator,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        cache: JobCache | None = None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._stores = stores
        self._syncs = syncs
        self._h = CallHandlers(auth, metrics)
        self._clock = clock
        self._grants = GrantDirectory(registry.kv)
        self._security = SecurityStore(registry.kv)
        self._lineage = LineageStore(registry.kv)
        # Outputs of succeeded jobs become versions (issue 34); run by `outputs_controller_running`.
        registrar = Registrar(kv=registry.kv, store=store, registry=registry, stores=stores, clock=clock)
        # Only succeeded jobs have outputs to register, and only a tenant's live or succeeded jobs
        # can still make a version: read those from the cache's index. Every job of the cache, every
        # pass, was a walk (and a decode) of the whole queue every 2 s: 8 % of a server's CPU with
        # 100,000 queued jobs (bench/scale.py's depth part, issue 33).
        if cache is None:
            self.outputs = OutputsController(registrar, lambda: ())
        else:
            self.outputs = OutputsController(
                registrar,
                lambda: [s.value for s in cache.jobs()],
                succeeded=lambda: [s.value for s in cache.ordered(None, _SUCCEEDED)],
                of_tenant=lambda tenant: [s.value for s in cache.ordered(TenantId(tenant), _MAKERS)],
            )

    async def _readable_jobs(self, who: Principal, job_ids: Iterable[str]) -> tuple[list[str], int]:
        """The job ids the caller may read, and how many others there are: a shared dataset's copies
        and syncs are used by other tenants' jobs, whose ids are theirs to see."""
        ids = sorted(set(job_ids))
        if who.role in (Role.ADMIN, Role.INFRA):
            return ids, 0
        shown_ids = []
        for job_id in ids:
            stored = await self._store.get_job(JobId(job_id))
            if stored is not None and can_read_tenant(who, stored.value.tenant):
                shown_ids.append(job_id)
        return shown_ids, len(ids) - len(shown_ids)

    async def _copy_jobs(
        self, who: Principal, d: Dataset, copies: tuple[CachedCopy, ...]
    ) -> dict[str, tuple[list[str], int]]:
        return {
            f"{c.key.store}/{c.key.version}": await self._readable_jobs(who, c.pinned_by)
            for c in copies
            if c.key.dataset == d.name and c.pinned_by
        }

    async def _visible(self, who: Principal, name: str) -> Dataset:
        """The dataset `name` (bare: the caller's tenant's; `tenant/name`: another's) if the caller may
        read it. Missing and not visible raise the same NotFound, after the same reads."""
        stored = await self._registry.lookup(who.tenant, name)
        if stored is None:
            raise NotFound(f"dataset {shown(name)} not found")
        d = stored.value
        check_read_dataset(who, d.tenant, d.shared_with, name)
        return d

    async def RegisterDataset(
        self, request: pb.RegisterDatasetRequest, context: Ctx
    ) -> pb.DatasetVersionInfo:
        async def body(who: Principal, req: pb.RegisterDatasetRequest) -> pb.DatasetVersionInfo:
            name = dataset_name_field(req.name)
            version = version_field(req.version)
            store_name = name_field(req.store, "store")
            prefix = prefix_field(req.prefix)
            if len(req.shared_with) > MAX_SHARED:
                raise InvalidSpec("shared_with", f"at most {MAX_SHARED} tenants")
            shared = frozenset(
                TenantId(name_field(t, f"shared_with[{i}]")) for i, t in enumerate(req.shared_with)
            )
            if req.tenant:
                name_field(req.tenant, "tenant")
            tenant = acting_tenant(who, req.tenant, action="register datasets", field="tenant")
            if tenant != who.tenant and await self._store.get_tenant(tenant) is None:
                raise InvalidSpec("tenant", f"no tenant {shown(tenant)}")
            store_record = await self._stores.require(store_name)
            if not who.is_admin:
                # The server reads the prefix with its own credentials: a member may name only data its
                # tenant was granted, never another tenant's.
                grant = await self._grants.effective(store_name, tenant, store_record.dataset_prefixes)
                if not allows(grant.prefixes, prefix):
                    granted = ", ".join(grant.prefixes) or "none"
                    raise PermissionDenied(
                        f"prefix: tenant {tenant} may register datasets in store {store_name} only under "
                        f"its granted prefixes ({granted}), not {shown(prefix)}; an admin grants more"
                    )
            client = await _store_call(f"store {store_name}", self._stores.client(store_name))
            manifest = await _store_call(
                f"reading {store_name}/{prefix}",
                build_manifest(client, prefix, concurrency=BUILD_CONCURRENCY),
            )
            if manifest.object_count == 0:
                raise FailedPrecondition(f"prefix: no objects under {shown(prefix)} in store {store_name}")
            record = DatasetVersion(
                dataset=name,
                version=version,
                home=StoreLocation(StoreName(store_name), prefix),
                manifest_digest=manifest.digest,
                size_bytes=manifest.total_size_bytes,
                object_count=manifest.object_count,
                created_at_s=self._clock(),
            )
            dataset, _created = await self._registry.add_version(tenant, record, manifest, shared)
            kept = dataset.version(version)
            assert kept is not None
            return version_to_pb(kept)

        return await self._h.unary("RegisterDataset", request, context, body)

    async def ListDatasets(self, request: pb.ListDatasetsRequest, context: Ctx) -> pb.ListDatasetsResponse:
        async def body(who: Principal, req: pb.ListDatasetsRequest) -> pb.ListDatasetsResponse:
            if req.tenant:
                name_field(req.tenant, "tenant")
            scope = listable_tenant(who, req.tenant, "datasets")
            copies = (await self._registry.copies()).copies
            datasets = sorted(await self._registry.list(), key=reference)
            if who.role is Role.MEMBER:
                # A member sees its tenant's datasets and those other tenants shared with it.
                datasets = [d for d in datasets if d.visible_to(who.tenant)]
            elif scope is not None:
                datasets = [d for d in datasets if d.tenant == scope]
            return pb.ListDatasetsResponse(
                datasets=[dataset_to_pb(d, copies, await self._copy_jobs(who, d, copies)) for d in datasets]
            )

        return await self._h.unary("ListDatasets", request, context, body)

    async def GetDataset(self, request: pb.GetDatasetRequest, context: Ctx) -> pb.DatasetInfo:
        async def body(who: Principal, req: pb.GetDatasetRequest) -> pb.DatasetInfo:
            dataset = await self._visible(who, dataset_ref_field(req.name))
            copies = (await self._registry.copies()).copies
            return dataset_to_pb(dataset, copies, await self._copy_jobs(who, dataset, copies))

        return await self._h.unary("GetDataset", request, context, body)

    async def _target(
        self, who: Principal, name: str, version: str, store: str, *, evict: bool = False
    ) -> tuple[Dataset, DatasetVersion, str]:
        name = dataset_ref_field(name)
        wanted = version_field(version) if version else None
        store = name_field(store, "store")
        dataset = await self._visible(who, name)
        check_sync_dataset(who, dataset.tenant, evict=evict)
        found = resolve(dataset, wanted)
        if found is None:
            raise NotFound(f"version: dataset {name} has no version {shown(version or 'at all')}")
        await self._stores.require(store)
        return dataset, found, store

    async def SyncDataset(self, request: pb.SyncDatasetRequest, context: Ctx) -> pb.SyncStatus:
        async def body(who: Principal, req: pb.SyncDatasetRequest) -> pb.SyncStatus:
            _dataset, version, store = await self._target(who, req.name, req.version, req.store)
            if store == version.home.store:
                raise FailedPrecondition(f"store: {store} is the home of {version.dataset}; nothing to copy")
            manifest = await self._registry.manifest(version.dataset, version.version)
            if manifest is None or manifest.digest != version.manifest_digest:
                raise FailedPrecondition(
                    f"dataset {version.dataset}@{version.version} has no usable manifest"
                )
            source = await _store_call(f"store {version.home.store}", self._stores.client(version.home.store))
            target = await _store_call(f"store {store}", self._stores.client(store))
            # Planned as the leader's sync will run it: against etcd's record of the copy (not the
            # bucket's marker), reusing other versions' copies there.
            recorded = await self._registry.copy_etags(
                CopyKey(StoreName(store), version.dataset, version.version)
            )
            plan = await _store_call(
                f"planning the copy to {store}",
                plan_sync(
                    source,
                    version.home.prefix,
                    target,
                    cache_prefix(version.dataset, version.version),
                    manifest,
                    recorded_etags=None if recorded is None else recorded.etags,
                    reuse=await self._registry.reusable(store, version.dataset, version.version),
                ),
            )
            rate = egress_rate(await self._store.get_settings(), version.home.store, store)
            record = replace(
                SyncRecord.requested(version, store, self._clock()),
                bytes_total=plan.total_bytes,
                objects_total=plan.total_objects,
                bytes_done=plan.total_bytes - plan.copy_bytes,
                objects_done=plan.total_objects - len(plan.to_copy),
                bytes_to_copy=plan.copy_bytes,
                objects_to_copy=len(plan.to_copy),
                egress_usd=plan.egress(rate).usd,
                egress_usd_per_gb=rate,
            )
            if req.dry_run:
                reply = sync_to_pb(record)
                reply.state = "planned"
                return reply
            # The leader's stager runs it (and says so in the record); this server only asks.
            requested = await self._syncs.request(record)
            return sync_to_pb(requested, await self._readable_jobs(who, requested.job_ids))

        return await self._h.unary("SyncDataset", request, context, body)

    async def GetSyncStatus(
        self, request: pb.GetSyncStatusRequest, context: Ctx
    ) -> pb.ListSyncStatusResponse:
        async def body(who: Principal, req: pb.GetSyncStatusRequest) -> pb.ListSyncStatusResponse:
            name = dataset_ref_field(req.name)
            store = name_field(req.store, "store") if req.store else None
            dataset = await self._visible(who, name)
            records = await self._syncs.list(store=store, dataset=dataset.name)
            return pb.ListSyncStatusResponse(
                syncs=[sync_to_pb(r, await self._readable_jobs(who, r.job_ids)) for r in records]
            )

        return await self._h.unary("GetSyncStatus", request, context, body)

    async def EvictDataset(self, request: pb.EvictDatasetRequest, context: Ctx) -> pb.EvictDatasetResponse:
        async def body(who: Principal, req: pb.EvictDatasetRequest) -> pb.EvictDatasetResponse:
            _dataset, version, store = await self._target(who, req.name, req.version, req.store, evict=True)
            if store == version.home.store:
                raise FailedPrecondition(
                    f"store: {store} holds the home copy of {version.dataset}, never evicted"
                )
            key = CopyKey(StoreName(store), version.dataset, version.version)
            held = await self._registry.get_copy(key)
            if held is None:
                # A first sync writes objects before any record of the copy exists: refused as any
                # eviction while a sync runs is, not answered "0 B freed" while the copy grows.
                syncing = await self._syncs.get(store, version.dataset, version.version)
                if syncing is not None and syncing[0].state.active:
                    raise CopyBusy(
                        f"the copy of {version.dataset}@{version.version} in {store} is busy: "
                        f"a sync of it runs ({syncing[0].state.value}); try again when it ends"
                    )
                # Nothing cached there: evicting is a no-op, as deleting a missing object is.
                return pb.EvictDatasetResponse(freed_bytes=0)
            copy, revision = held
            if copy.pinned:
                named, others = await self._readable_jobs(who, copy.pinned_by)
                users = ", ".join([*named, *([f"{others} job(s) of other tenants"] if others else [])])
                raise FailedPrecondition(f"the copy in {store} is used by {users}; evict it later")
            target = await _store_call(f"store {store}", self._stores.client(store))
            await _store_call(
                f"evicting from {store}", evict_copy(self._registry, self._syncs, target, key, revision)
            )
            return pb.EvictDatasetResponse(freed_bytes=copy.size_bytes)

        return await self._h.unary("EvictDataset", request, context, body)

    # ---- outputs and lineage (issue 34)

    async def GetDatasetLineage(
        self, request: pb.GetDatasetLineageRequest, context: Ctx
    ) -> pb.DatasetLineage:
        async def body(who: Principal, req: pb.GetDatasetLineageRequest) -> pb.DatasetLineage:
            name = dataset_ref_field(req.name)
            wanted = version_field(req.version) if req.version else None
            dataset = await self._visible(who, name)
            found = resolve(dataset, wanted)
            if found is None:
                raise NotFound(f"version: dataset {name} has no version {shown(req.version or 'at all')}")
            view = walk(
                f"{dataset.name}@{found.version}",
                datasets=await self._registry.list(),
                records=await self._lineage.list(),
                may_see=lambda d: who.role in (Role.ADMIN, Role.INFRA) or d.visible_to(who.tenant),
                may_read_tenant=lambda tenant: can_read_tenant(who, TenantId(tenant)),
            )
            return pb.DatasetLineage(
                version=node_to_pb(view.node),
                ancestors=[node_to_pb(n) for n in view.ancestors],
                descendants=[node_to_pb(n) for n in view.descendants],
                hidden_descendants=view.hidden_descendants,
            )

        return await self._h.unary("GetDatasetLineage", request, context, body)

    async def GetJobOutputs(self, request: pb.GetJobOutputsRequest, context: Ctx) -> pb.JobOutputs:
        async def body(who: Principal, req: pb.GetJobOutputsRequest) -> pb.JobOutputs:
            if not req.job_id or len(req.job_id) > 253:
                raise InvalidSpec("job_id", "must be a job id")
            stored = await self._store.get_job(JobId(req.job_id))
            if stored is None or not can_read_tenant(who, stored.value.tenant):
                raise NotFound(job_not_found(req.job_id))
            job = stored.value
            outputs = []
            for index, output in enumerate(job.spec.outputs):
                record = await self.outputs.records.get(job.job_id, index) or _unrecorded(job, index)
                outputs.append(
                    pb.JobOutput(
                        dataset=record.dataset,
                        version=record.version,
                        path=output.path,
                        state=record.state.value,
                        reason=record.reason,
                        store=record.store,
                        prefix=record.prefix,
                    )
                )
            return pb.JobOutputs(job_id=job.job_id, outputs=outputs)

        return await self._h.unary("GetJobOutputs", request, context, body)


def _unrecorded(job: JobRecord, index: int) -> OutputRecord:
    """What an output with no record yet is, from its job's phase."""
    output = job.spec.outputs[index]
    name = f"{job.tenant}/{output.dataset}"
    version = version_of(output, job.job_id)
    if job.phase is JobPhase.SUCCEEDED:
        prefix = attempt_prefix(output, job.job_id, job.attempt)
        return OutputRecord(OutputState.REGISTERING, name, version, prefix=prefix)
    if job.phase.is_terminal:
        return OutputRecord(
            OutputState.NOT_REGISTERED,
            name,
            version,
            reason=f"the job {job.phase.value.lower()}: a partial output is never registered",
        )
    return OutputRecord(OutputState.PENDING, name, version)


def node_to_pb(n: Node) -> pb.LineageNode:
    if n.redacted:
        return pb.LineageNode(redacted=True, depth=n.depth)
    dataset, _, version = n.ref.rpartition("@")
    out = pb.LineageNode(dataset=dataset, version=version, depth=n.depth, inputs=list(n.inputs))
    if n.version is not None:
        out.store = n.version.home.store
        out.prefix = n.version.home.prefix
        out.manifest_digest = n.version.manifest_digest
        out.created_at.CopyFrom(convert.timestamp(n.version.created_at_s))
    if n.made_by is not None:
        m = n.made_by
        out.job_id = m.job_id
        out.attempt = m.attempt
        out.job_name = m.job_name
        out.images.extend(m.images)
        out.params.extend(f"{k}={v}" for k, v in m.params)
        out.job_set = m.job_set
    return out


@contextlib.asynccontextmanager
async def outputs_controller_running(servicers: Sequence[object]) -> AsyncIterator[OutputsController | None]:
    """The registration of succeeded jobs' outputs running while the block runs (every server runs
    it: registration is idempotent, so two never register a version twice)."""
    service = next((s for s in servicers if isinstance(s, DatasetService)), None)
    if service is None:
        yield None
        return
    stop = asyncio.Event()
    task = asyncio.create_task(service.outputs.run(stop), name="gpufed-outputs")
    try:
        yield service.outputs
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
