"""The users, tokens and audit half of AdminService, kept apart from tenants and approvals.

Only admins create users, issue and revoke tokens, and read the audit trail. A token is returned once,
in the reply that issues it; etcd keeps its hash. Every admin write in AdminService goes through
`audit`, which logs it and appends it to the trail in etcd with who did it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable

import structlog

from federation.api import convert, history_reads
from federation.api.service import CallHandlers, Ctx
from federation.api.v1 import gpufed_pb2 as pb
from federation.errors import InvalidArgument, InvalidSpec, NotFound
from federation.history.protocol import HistoryStore
from federation.security.auth import Principal, check_admin
from federation.security.tokens import AuditEvent, SecurityStore, TokenRecord, new_token, token_hash
from federation.spec.validate import name_field, shown
from federation.store.job_store import JobStore
from federation.store.records import Role, UserRecord
from placement.model import TenantId

log = structlog.get_logger("gpufed.admin")

MAX_TOKEN_TTL_S = 366 * 24 * 3600.0
MAX_AUDIT_EVENTS = 10_000
# etcd's list reads the whole prefix whatever the limit; ask for all of it to page across stores.
ALL_AUDIT_EVENTS = 1 << 62


def user_to_pb(u: UserRecord) -> pb.User:
    return pb.User(
        name=u.name, tenant=u.tenant, role=u.role.value, max_priority_class=u.max_priority_class or ""
    )


def token_to_pb(t: TokenRecord) -> pb.TokenInfo:
    info = pb.TokenInfo(
        token_id=t.token_id, user=t.user, issued_by=t.issued_by, issued_at=convert.timestamp(t.issued_at_s)
    )
    if t.expires_at_s is not None:
        info.expires_at.CopyFrom(convert.timestamp(t.expires_at_s))
    return info


class AccessAdmin:
    """Mixed into AdminService: users, tokens and the audit trail."""

    _store: JobStore
    _security: SecurityStore
    _h: CallHandlers
    _clock: Callable[[], float]
    _history: HistoryStore | None

    async def audit(self, who: Principal, action: str, target: str, detail: str = "") -> None:
        log.info(
            "admin_action", action=action, target=target, by=who.user, role=who.role.value, detail=detail
        )
        event = AuditEvent(self._clock(), who.user, who.role.value, action, target, detail)
        await self._security.append_audit(event)

    async def _class_names(self) -> set[str]:
        return set((await self._store.get_settings()).class_values())

    async def SetUser(self, request: pb.SetUserRequest, context: Ctx) -> pb.User:
        async def body(who: Principal, req: pb.SetUserRequest) -> pb.User:
            check_admin(who, "create or change a user")
            name = name_field(req.name, "name")
            tenant = TenantId(name_field(req.tenant, "tenant"))
            if await self._store.get_tenant(tenant) is None:
                raise NotFound(f"tenant {shown(tenant)} not found")
            try:
                role = Role(req.role or "member")
            except ValueError:
                known = ", ".join(r.value for r in Role)
                raise InvalidSpec("role", f"{shown(req.role)} is not a role (known: {known})") from None
            limit = req.max_priority_class or None
            if limit is not None and limit not in await self._class_names():
                raise InvalidSpec("max_priority_class", f"{shown(limit)} is not a priority class")
            user = UserRecord(name=name, tenant=tenant, role=role, max_priority_class=limit)
            await self._store.put_user(user)
            await self.audit(who, "user_set", name, f"tenant={tenant} role={role.value} max_class={limit}")
            return user_to_pb(user)

        return await self._h.unary("SetUser", request, context, body)

    async def ListUsers(self, request: pb.ListUsersRequest, context: Ctx) -> pb.ListUsersResponse:
        async def body(who: Principal, _req: pb.ListUsersRequest) -> pb.ListUsersResponse:
            check_admin(who, "list users")
            users = sorted(await self._store.list_users(), key=lambda u: u.name)
            return pb.ListUsersResponse(users=[user_to_pb(u) for u in users])

        return await self._h.unary("ListUsers", request, context, body)

    async def IssueToken(self, request: pb.IssueTokenRequest, context: Ctx) -> pb.IssuedToken:
        async def body(who: Principal, req: pb.IssueTokenRequest) -> pb.IssuedToken:
            check_admin(who, "issue a token")
            user = await self._store.get_user(name_field(req.user, "user"))
            if user is None:
                raise NotFound(f"user {shown(req.user)} not found")
            if not 0 <= req.ttl_seconds <= MAX_TOKEN_TTL_S:
                raise InvalidSpec(
                    "ttl_seconds", f"must be 0 (until revoked) to {MAX_TOKEN_TTL_S:.0f} (366 days)"
                )
            now = self._clock()
            token = new_token()
            record = TokenRecord(
                token_id=token_hash(token)[:12],
                user=user.name,
                issued_by=who.user,
                issued_at_s=now,
                expires_at_s=now + req.ttl_seconds if req.ttl_seconds else None,
            )
            await self._security.put_token(token, record)
            self._h.token_issued(token, user)
            await self.audit(who, "token_issued", user.name, f"token_id={record.token_id}")
            return pb.IssuedToken(token=token, info=token_to_pb(record))

        return await self._h.unary("IssueToken", request, context, body)

    async def ListTokens(self, request: pb.ListTokensRequest, context: Ctx) -> pb.ListTokensResponse:
        async def body(who: Principal, req: pb.ListTokensRequest) -> pb.ListTokensResponse:
            check_admin(who, "list tokens")
            tokens = [t for t in await self._security.list_tokens() if not req.user or t.user == req.user]
            tokens.sort(key=lambda t: (t.user, t.issued_at_s, t.token_id))
            return pb.ListTokensResponse(tokens=[token_to_pb(t) for t in tokens])

        return await self._h.unary("ListTokens", request, context, body)

    async def RevokeToken(self, request: pb.RevokeTokenRequest, context: Ctx) -> pb.RevokeTokenResponse:
        async def body(who: Principal, req: pb.RevokeTokenRequest) -> pb.RevokeTokenResponse:
            check_admin(who, "revoke a token")
            token_id = req.token_id.strip().lower()
            if len(token_id) < 8 or any(c not in "0123456789abcdef" for c in token_id):
                raise InvalidArgument(
                    "token_id: give the token's id (hex, at least 8 digits) from `token list`"
                )
            revoked = await self._security.revoke_token_id(token_id)
            if revoked is None:
                raise NotFound(f"token {shown(token_id)} not found (or the prefix matches several)")
            await self.audit(who, "token_revoked", revoked.user, f"token_id={revoked.token_id}")
            return pb.RevokeTokenResponse()

        return await self._h.unary("RevokeToken", request, context, body)

    async def ListAudit(self, request: pb.ListAuditRequest, context: Ctx) -> pb.ListAuditResponse:
        async def body(who: Principal, req: pb.ListAuditRequest) -> pb.ListAuditResponse:
            check_admin(who, "read the audit trail")
            limit = req.limit or 1000
            if not 0 < limit <= MAX_AUDIT_EVENTS:
                raise InvalidArgument(f"limit: must be 1 to {MAX_AUDIT_EVENTS}")
            before = decode_audit_token(req.page_token)
            live = await self._security.list_audit(limit=ALL_AUDIT_EVENTS)
            if before is None and self._history is None:
                events, more = live[-limit:], False
            else:
                events, more = await self._audit_page(live, before, limit)
            return pb.ListAuditResponse(
                next_page_token=encode_audit_token(events[0]) if more else "",
                events=[
                    pb.AuditEvent(
                        at=convert.timestamp(e.at_s),
                        user=e.user,
                        role=e.role,
                        action=e.action,
                        target=e.target,
                        detail=e.detail,
                    )
                    for e in events
                ],
            )

        return await self._h.unary("ListAudit", request, context, body)

    async def _audit_page(
        self, live: list[AuditEvent], before: AuditEvent | None, limit: int
    ) -> tuple[list[AuditEvent], bool]:
        """The newest `limit` events of etcd's and SQL's before `before`, oldest first; more left?

        An event is known by its content (etcd's list does not carry its key): a record the archiver
        has copied to SQL and not yet deleted from etcd is the same event in both and is shown once.
        """
        archived: list[AuditEvent] = []
        if self._history is not None:
            rows = await asyncio.to_thread(
                history_reads.audit_before, self._history, None if before is None else before.at_s, limit + 1
            )
            archived = [AuditEvent(r.at_s, r.user, r.role, r.action, r.target, r.detail) for r in rows]
        found = {_audit_key(e): e for e in [*live, *archived]}
        ordered = sorted(found.values(), key=_audit_key, reverse=True)
        if before is not None:
            edge = _audit_key(before)
            ordered = [e for e in ordered if _audit_key(e) < edge]
        page = ordered[:limit]
        page.reverse()
        return page, len(ordered) > limit


def _audit_key(e: AuditEvent) -> tuple[float, str, str, str, str, str]:
    return (e.at_s, e.user, e.role, e.action, e.target, e.detail)


def encode_audit_token(e: AuditEvent) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(_audit_key(e))).encode()).decode()


def decode_audit_token(token: str) -> AuditEvent | None:
    if not token:
        return None
    try:
        at_s, user, role, action, target, detail = json.loads(base64.urlsafe_b64decode(token.encode()))
        return AuditEvent(float(at_s), str(user), str(role), str(action), str(target), str(detail))
    except (ValueError, TypeError) as error:
        raise InvalidArgument("page_token: not a token this server issued") from error
