"""AdminService: tenants, users' class limits and approvals, over gRPC.

Writes need an admin; infra and finance read every tenant; members read their own tenant and its
approvals (another tenant answers NOT_FOUND, so names cannot be probed). The scheduler re-reads
these records every few seconds, so a change applies at the next cycle after that.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import replace

import structlog

from federation.api import convert
from federation.api.admin_access import AccessAdmin, user_to_pb
from federation.api.service import CallHandlers, Ctx
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.errors import FailedPrecondition, InvalidArgument, InvalidSpec, NotFound
from federation.history.protocol import HistoryStore
from federation.metrics import Metrics
from federation.security.auth import (
    Authenticator,
    Principal,
    check_admin,
    check_read_tenant_config,
    readable_tenants,
)
from federation.security.tokens import SecurityStore
from federation.spec.manifest_text import load_manifest_text
from federation.spec.validate import free_text, name_field, shown
from federation.store.config_policy import check_tenant_tree, parse_tenant, tenant_document
from federation.store.job_cache import LIVE_PHASES, JobCache
from federation.store.job_store import JobStore
from federation.store.records import ApprovalRecord, TenantRecord
from placement.model import TenantId

log = structlog.get_logger("gpufed.admin")

# Approvals are for a deadline or a submission, not a standing privilege.
MAX_APPROVAL_S = 30 * 24 * 3600.0
MAX_REASON_LENGTH = 500


def tenant_to_pb(t: TenantRecord) -> pb.Tenant:
    return pb.Tenant(name=t.name, document=json.dumps(tenant_document(t), sort_keys=True))


def approval_to_pb(a: ApprovalRecord, now_s: float) -> pb.Approval:
    return pb.Approval(
        approval_id=a.approval_id,
        tenant=a.tenant,
        user=a.user or "",
        priority_class=a.priority_class,
        expires_at=convert.timestamp(a.expires_at_s),
        reason=a.reason,
        granted_by=a.granted_by,
        granted_at=convert.timestamp(a.granted_at_s),
        expired=a.expires_at_s <= now_s,
    )


class AdminService(AccessAdmin, pb_grpc.AdminServiceServicer):
    def __init__(
        self,
        *,
        store: JobStore,
        security: SecurityStore,
        cache: JobCache,
        auth: Authenticator,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        history: HistoryStore | None = None,
        tenants_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        # Called after this service writes or deletes a tenant: the submission path's cached tenants
        # (`TenantDirectory.forget`) are read again, so this server's next submission sees the write.
        self._tenants_changed = tenants_changed
        self._security = security
        # Audit records archived to SQL (issue 19); None: etcd's trail only.
        self._history = history
        self._cache = cache
        self._h = CallHandlers(auth, metrics)
        self._clock = clock

    # ---- tenants

    async def SetTenant(self, request: pb.SetTenantRequest, context: Ctx) -> pb.Tenant:
        async def body(who: Principal, req: pb.SetTenantRequest) -> pb.Tenant:
            check_admin(who, "set a tenant")
            if not req.document.strip():
                raise InvalidArgument("document: empty; give the tenant in the config file's keys")
            doc = load_manifest_text(req.document)
            tenant = parse_tenant(doc, "tenant", priority_classes=await self._class_names())
            others = [t for t in await self._store.list_tenants() if t.name != tenant.name]
            # The whole tree must stay sound: the parent exists and no cycle appears.
            check_tenant_tree([*others, tenant], "tenant")
            await self._store.put_tenant(tenant)
            self._tenants_changed()
            await self.audit(who, "tenant_set", tenant.name, req.document[:2000])
            return tenant_to_pb(tenant)

        return await self._h.unary("SetTenant", request, context, body)

    async def GetTenant(self, request: pb.GetTenantRequest, context: Ctx) -> pb.Tenant:
        async def body(who: Principal, req: pb.GetTenantRequest) -> pb.Tenant:
            name = TenantId(name_field(req.name, "name"))
            check_read_tenant_config(who, name)
            tenant = await self._store.get_tenant(name)
            if tenant is None:
                raise NotFound(f"tenant {shown(name)} not found")
            return tenant_to_pb(tenant)

        return await self._h.unary("GetTenant", request, context, body)

    async def ListTenants(self, request: pb.ListTenantsRequest, context: Ctx) -> pb.ListTenantsResponse:
        async def body(who: Principal, _req: pb.ListTenantsRequest) -> pb.ListTenantsResponse:
            only = readable_tenants(who)
            tenants = sorted(await self._store.list_tenants(), key=lambda t: t.name)
            return pb.ListTenantsResponse(
                tenants=[tenant_to_pb(t) for t in tenants if only is None or t.name == only]
            )

        return await self._h.unary("ListTenants", request, context, body)

    async def DeleteTenant(self, request: pb.DeleteTenantRequest, context: Ctx) -> pb.DeleteTenantResponse:
        async def body(who: Principal, req: pb.DeleteTenantRequest) -> pb.DeleteTenantResponse:
            check_admin(who, "delete a tenant")
            name = TenantId(name_field(req.name, "name"))
            if await self._store.get_tenant(name) is None:
                raise NotFound(f"tenant {shown(name)} not found")
            children = sorted(t.name for t in await self._store.list_tenants() if t.parent == name)
            if children:
                raise FailedPrecondition(f"tenant {shown(name)} has child tenants: {', '.join(children)}")
            users = sorted(u.name for u in await self._store.list_users() if u.tenant == name)
            if users:
                raise FailedPrecondition(f"tenant {shown(name)} still has users: {', '.join(users)}")
            # The tenant's own live jobs, from the cache's index (not a walk of every tenant's).
            live = sorted(s.value.job_id for s in self._cache.ordered(name, LIVE_PHASES))
            if live:
                raise FailedPrecondition(
                    f"tenant {shown(name)} has {len(live)} jobs that have not finished (first: {live[0]}); "
                    "cancel them or let them finish"
                )
            await self._store.delete_tenant(name)
            self._tenants_changed()
            await self.audit(who, "tenant_deleted", name)
            return pb.DeleteTenantResponse()

        return await self._h.unary("DeleteTenant", request, context, body)

    # ---- users

    async def SetUserPriority(self, request: pb.SetUserPriorityRequest, context: Ctx) -> pb.User:
        async def body(who: Principal, req: pb.SetUserPriorityRequest) -> pb.User:
            check_admin(who, "set a user's priority limit")
            user = await self._store.get_user(name_field(req.user, "user"))
            if user is None:
                raise NotFound(f"user {shown(req.user)} not found")
            limit = req.max_priority_class or None
            if limit is not None and limit not in await self._class_names():
                raise InvalidSpec("max_priority_class", f"{shown(limit)} is not a priority class")
            updated = replace(user, max_priority_class=limit)
            await self._store.put_user(updated)
            await self.audit(who, "user_priority_set", user.name, f"max_class={limit}")
            return user_to_pb(updated)

        return await self._h.unary("SetUserPriority", request, context, body)

    # ---- approvals

    async def GrantApproval(self, request: pb.GrantApprovalRequest, context: Ctx) -> pb.Approval:
        async def body(who: Principal, req: pb.GrantApprovalRequest) -> pb.Approval:
            check_admin(who, "grant an approval")
            tenant = TenantId(name_field(req.tenant, "tenant"))
            if await self._store.get_tenant(tenant) is None:
                raise NotFound(f"tenant {shown(tenant)} not found")
            user = req.user or None
            if user is not None:
                found = await self._store.get_user(user)
                if found is None or found.tenant != tenant:
                    raise InvalidSpec("user", f"{shown(user)} is not a user of tenant {shown(tenant)}")
            settings = await self._store.get_settings()
            cls = settings.priority_class(req.priority_class)
            if cls is None:
                raise InvalidSpec("priority_class", f"{shown(req.priority_class)} is not a priority class")
            if not cls.needs_approval:
                raise InvalidSpec("priority_class", f"{shown(cls.name)} needs no approval")
            if not 0 < req.duration_seconds <= MAX_APPROVAL_S:
                raise InvalidSpec(
                    "duration_seconds", f"must be more than 0 and at most {MAX_APPROVAL_S:.0f} (30 days)"
                )
            reason = free_text(req.reason.strip(), "reason")
            if not reason or len(reason) > MAX_REASON_LENGTH:
                raise InvalidSpec(
                    "reason",
                    f"required, at most {MAX_REASON_LENGTH} characters: say why (a deadline, a paper)",
                )
            now = self._clock()
            approval = ApprovalRecord(
                approval_id=f"ap-{secrets.token_hex(6)}",
                tenant=tenant,
                priority_class=cls.name,
                expires_at_s=now + req.duration_seconds,
                reason=reason,
                granted_by=who.user,
                granted_at_s=now,
                user=user,
            )
            await self._store.put_approval(approval)
            await self.audit(
                who,
                "approval_granted",
                tenant,
                f"approval_id={approval.approval_id} user={user} class={cls.name} "
                f"expires_at_s={approval.expires_at_s:.0f} reason={reason}",
            )
            return approval_to_pb(approval, now)

        return await self._h.unary("GrantApproval", request, context, body)

    async def ListApprovals(self, request: pb.ListApprovalsRequest, context: Ctx) -> pb.ListApprovalsResponse:
        async def body(who: Principal, req: pb.ListApprovalsRequest) -> pb.ListApprovalsResponse:
            only = readable_tenants(who)
            if req.tenant:
                check_read_tenant_config(who, TenantId(req.tenant))
                only = TenantId(req.tenant)
            now = self._clock()
            approvals = sorted(
                (
                    a
                    for a in await self._store.list_approvals()
                    if (only is None or a.tenant == only) and (req.include_expired or a.expires_at_s > now)
                ),
                key=lambda a: (a.tenant, a.expires_at_s, a.approval_id),
            )
            return pb.ListApprovalsResponse(approvals=[approval_to_pb(a, now) for a in approvals])

        return await self._h.unary("ListApprovals", request, context, body)

    async def RevokeApproval(
        self, request: pb.RevokeApprovalRequest, context: Ctx
    ) -> pb.RevokeApprovalResponse:
        async def body(who: Principal, req: pb.RevokeApprovalRequest) -> pb.RevokeApprovalResponse:
            check_admin(who, "revoke an approval")
            if not req.approval_id:
                raise InvalidArgument("approval_id: required")
            if not await self._store.delete_approval(req.approval_id):
                raise NotFound(f"approval {shown(req.approval_id)} not found")
            # Jobs it admitted keep running: only new admissions need a valid approval.
            await self.audit(who, "approval_revoked", req.approval_id)
            return pb.RevokeApprovalResponse()

        return await self._h.unary("RevokeApproval", request, context, body)
