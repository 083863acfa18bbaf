"""The Datasets calls about trust, mixed into `DatasetService`: verifying (and repairing) a copy, and the
prefixes each tenant may register datasets under (listed by who may read them, changed by admins only,
every change in the audit trail).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from datasync import CopyKey, DatasetVersion, DatasyncError, StoreName, verify_copy
from federation.api.service import CallHandlers, Ctx
from federation.api.v1 import gpufed_pb2 as pb
from federation.datasets.grants import MAX_PREFIXES, Grant, GrantDirectory, grant_rows
from federation.datasets.registry import DatasetRegistry, prefix_field
from federation.datasets.stores import StoreDirectory
from federation.datasets.trust import VerifyOutcome, verify_cached
from federation.errors import FailedPrecondition, InvalidSpec, NotFound, StoreUnavailable
from federation.security.auth import Principal, check_admin, listable_tenant
from federation.security.tokens import AuditEvent, SecurityStore
from federation.spec.validate import name_field, shown
from federation.store.job_store import JobStore

log = structlog.get_logger("gpufed.api")
T = TypeVar("T")


async def store_call(what: str, call: Awaitable[T]) -> T:
    """Run an object-store call, turning datasync's errors into federation's (retryable or not)."""
    try:
        return await call
    except DatasyncError as error:
        text = f"{what}: {str(error)[:400]}"
        raise (StoreUnavailable(text) if error.retryable else FailedPrecondition(text)) from error


def grant_to_pb(g: Grant) -> pb.DatasetGrant:
    return pb.DatasetGrant(store=g.store, tenant=g.tenant, prefixes=list(g.prefixes), source=g.source)


class DatasetTrustCalls:
    _store: JobStore
    _registry: DatasetRegistry
    _stores: StoreDirectory
    _h: CallHandlers
    _clock: Callable[[], float]
    _grants: GrantDirectory
    _security: SecurityStore

    async def _target(
        self, who: Principal, name: str, version: str, store: str, *, evict: bool = False
    ) -> tuple[object, DatasetVersion, str]:
        raise NotImplementedError  # DatasetService's

    async def VerifyDataset(self, request: pb.VerifyDatasetRequest, context: Ctx) -> pb.VerifyDatasetResponse:
        async def body(who: Principal, req: pb.VerifyDatasetRequest) -> pb.VerifyDatasetResponse:
            _dataset, version, store = await self._target(who, req.name, req.version, req.store)
            if store == version.home.store:
                if req.repair:
                    raise FailedPrecondition(
                        f"store: {store} holds the home copy of {version.dataset}, the source of any "
                        "repair; verify it without --repair"
                    )
                manifest = await self._registry.manifest(version.dataset, version.version)
                if manifest is None:
                    raise FailedPrecondition(f"dataset {version.dataset}@{version.version} has no manifest")
                home = await store_call(f"store {store}", self._stores.client(store))
                found = await store_call(
                    f"verifying {store}", verify_copy(home, version.home.prefix, manifest)
                )
                outcome = VerifyOutcome(
                    found.objects_checked, found.missing, found.wrong_size, found.wrong_hash
                )
            else:
                key = CopyKey(StoreName(store), version.dataset, version.version)
                outcome = await store_call(
                    f"verifying the copy in {store}",
                    verify_cached(self._registry, self._stores, key, repair=req.repair, clock=self._clock),
                )
            log.info(
                "dataset_verified",
                by=who.user,
                dataset=version.dataset,
                version=version.version,
                store=store,
                ok=outcome.ok,
                repaired=len(outcome.repaired),
            )
            return pb.VerifyDatasetResponse(
                dataset=version.dataset,
                version=version.version,
                store=store,
                objects_checked=outcome.objects_checked,
                missing=list(outcome.missing),
                wrong_size=list(outcome.wrong_size),
                wrong_hash=list(outcome.wrong_hash),
                repaired=list(outcome.repaired),
                ok=outcome.ok,
                unexpected=list(outcome.unexpected),
            )

        return await self._h.unary("VerifyDataset", request, context, body)

    async def ListDatasetGrants(
        self, request: pb.ListDatasetGrantsRequest, context: Ctx
    ) -> pb.ListDatasetGrantsResponse:
        async def body(who: Principal, req: pb.ListDatasetGrantsRequest) -> pb.ListDatasetGrantsResponse:
            if req.tenant:
                name_field(req.tenant, "tenant")
            scope = listable_tenant(who, req.tenant, "dataset grants")
            store = name_field(req.store, "store") if req.store else None
            records = [await self._stores.require(store)] if store else await self._stores.list()
            tenants = [scope] if scope is not None else [t.name for t in await self._store.list_tenants()]
            rows = grant_rows(
                {r.name: r.dataset_prefixes for r in records}, await self._grants.admin_grants(store), tenants
            )
            return pb.ListDatasetGrantsResponse(grants=[grant_to_pb(g) for g in rows])

        return await self._h.unary("ListDatasetGrants", request, context, body)

    async def SetDatasetGrant(self, request: pb.DatasetGrant, context: Ctx) -> pb.DatasetGrant:
        async def body(who: Principal, req: pb.DatasetGrant) -> pb.DatasetGrant:
            check_admin(who, "grant dataset prefixes")
            store = name_field(req.store, "store")
            tenant = name_field(req.tenant, "tenant")
            if len(req.prefixes) > MAX_PREFIXES:
                raise InvalidSpec("prefixes", f"at most {MAX_PREFIXES}")
            prefixes = tuple(prefix_field(p, f"prefixes[{i}]") for i, p in enumerate(req.prefixes))
            record = await self._stores.require(store)
            if await self._store.get_tenant(tenant) is None:
                raise NotFound(f"tenant {shown(tenant)} not found")
            now = self._clock()
            await self._grants.set(store, tenant, prefixes, by=who.user, at_s=now)
            detail = f"prefixes={','.join(prefixes)}" if prefixes else "cleared: the config's prefixes apply"
            log.info("dataset_grant_set", by=who.user, store=store, tenant=tenant, detail=detail)
            await self._security.append_audit(
                AuditEvent(now, who.user, who.role.value, "dataset_grant_set", f"{store}/{tenant}", detail)
            )
            return grant_to_pb(await self._grants.effective(store, tenant, record.dataset_prefixes))

        return await self._h.unary("SetDatasetGrant", request, context, body)
