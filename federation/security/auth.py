"""Who is calling, and what they may do.

A bearer token maps to a user, a tenant and a role. Tokens are stored only as SHA-256 hashes, so a
leaked etcd snapshot does not leak credentials. Every authorization rule about jobs is a function
here, so the tenant-isolation rules can be read (and tested) in one place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from federation.errors import NotFound, PermissionDenied, RateLimited, StoreUnavailable, Unauthenticated
from federation.security.auth_limits import AuthLimits
from federation.security.tokens import TOKEN_ID_DIGITS, token_hash
from federation.spec.validate import shown
from federation.store.job_store import JobStore
from federation.store.records import Role, UserRecord
from placement.model import TenantId

# A resolved token is trusted this long before etcd is asked again: revocation takes effect within it.
TOKEN_CACHE_TTL_S = 5.0
MAX_TOKEN_LENGTH = 512

log = structlog.get_logger("gpufed.auth")


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    tenant: TenantId
    role: Role
    # The highest priority class this user may submit at (None: the tenant's limit only).
    max_priority_class: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The token from `authorization: Bearer <token>` metadata, or Unauthenticated."""
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode() if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("authorization metadata must be 'Bearer <token>'")
        token = token.strip()
        if len(token) > MAX_TOKEN_LENGTH:
            raise Unauthenticated("token is too long")
        return token
    raise Unauthenticated("missing 'authorization: Bearer <token>' metadata")


def _principal(user: UserRecord) -> Principal:
    return Principal(
        user=user.name, tenant=user.tenant, role=user.role, max_priority_class=user.max_priority_class
    )


class Authenticator:
    def __init__(self, store: JobStore, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._clock = clock
        # By token: when it was resolved, and its user's Principal (made once a resolution, not at
        # every call).
        self._cache: dict[str, tuple[float, Principal]] = {}
        # Failed authentications per peer, checked before a lookup of a token new to this server.
        self.limits = AuthLimits(clock=clock)

    def issued(self, token: str, user: UserRecord) -> None:
        """A token this server just stored: it works on its first call, resolved as a known token
        is (so not behind its address's failed-authentication gate either)."""
        self._cache[token] = (self._clock(), _principal(user))

    async def authenticate(
        self,
        metadata: Iterable[tuple[str, str | bytes]] | None,
        *,
        max_age_s: float = TOKEN_CACHE_TTL_S,
        peer: str = "",
    ) -> Principal:
        """The caller, from a resolution at most `max_age_s` old (an open stream asks with less, so
        that its re-checks plus their spacing stay within the cache's TTL).

        Every refusal is logged (`token_refused`, with the reason and the token's id, never the
        token), so an admin can tell a revoked token from a peer out of failures from a store that
        did not answer."""
        try:
            token = bearer_token(metadata)
        except Unauthenticated as error:
            log.info("token_refused", reason="malformed", detail=str(error), peer=peer)
            raise
        now = self._clock()
        hit = self._cache.get(token)
        if hit is not None and now - hit[0] < min(max_age_s, TOKEN_CACHE_TTL_S):
            return hit[1]
        return await self._resolve(token, now, known=hit is not None, peer=peer)

    async def _resolve(self, token: str, now: float, *, known: bool, peer: str) -> Principal:
        token_id = token_hash(token)[:TOKEN_ID_DIGITS]
        # A token this server resolved before (its entry only aged out) is re-checked without the
        # peer's failed-authentication gate: strangers flooding from the same address (one NAT, one
        # notebook host) must not lock out a user they cannot impersonate. That costs at most one
        # read per known token per TTL; if it was revoked meanwhile, its entry goes and the next
        # try is gated like any other token.
        if not known:
            try:
                self.limits.before_lookup(peer)
            except RateLimited as error:
                log.info(
                    "token_refused",
                    reason="peer_out_of_failures",
                    token_id=token_id,
                    peer=peer,
                    detail=str(error),
                )
                raise
        try:
            resolved = await self._store.resolve_token(token)
        except StoreUnavailable as error:
            # Not the caller's failure, and not an answer about the token: nothing is cached or
            # charged, and the call is UNAVAILABLE (retry), never UNAUTHENTICATED.
            log.warning(
                "token_lookup_failed",
                reason="store_unavailable",
                token_id=token_id,
                peer=peer,
                error=str(error),
            )
            raise
        if resolved is None:
            self._cache.pop(token, None)
            self.limits.unknown(peer)
            log.info("token_refused", reason="unknown_revoked_or_expired", token_id=token_id, peer=peer)
            raise Unauthenticated("unknown or revoked token")
        if len(self._cache) > 10_000:
            self._cache.clear()
        principal = _principal(resolved)
        self._cache[token] = (now, principal)
        return principal


# ---- job authorization: members act within their tenant; admins anywhere; infra reads everything.


def can_read_tenant(who: Principal, tenant: TenantId) -> bool:
    if who.role in (Role.ADMIN, Role.INFRA):
        return True
    if who.role is Role.MEMBER:
        return who.tenant == tenant
    return False


def job_not_found(job_id: str) -> str:
    """The one answer for a job that does not exist and for a job the caller may not read."""
    return f"job {shown(job_id)} not found"


def check_read_job(who: Principal, tenant: TenantId, job_id: str = "") -> None:
    """Raise NotFound (not PermissionDenied), worded as for a missing job, so a caller cannot probe
    other tenants' job ids."""
    if not can_read_tenant(who, tenant):
        raise NotFound(job_not_found(job_id))


def check_write_job(who: Principal, tenant: TenantId, job_id: str = "") -> None:
    check_read_job(who, tenant, job_id)
    if who.role not in (Role.ADMIN, Role.MEMBER):
        raise PermissionDenied(f"role {who.role} may not change jobs")


def acting_tenant(who: Principal, requested: str | None, *, action: str, field: str) -> TenantId:
    """The tenant a write (a submission, a dataset registration) is for: members act only for their
    own tenant, admins for any they name; nobody else writes."""
    if who.role not in (Role.ADMIN, Role.MEMBER):
        raise PermissionDenied(f"role {who.role} may not {action}")
    if not requested or requested == who.tenant:
        return who.tenant
    if who.is_admin:
        return TenantId(requested)
    raise PermissionDenied(f"{field}: members may {action} only for their own tenant ({who.tenant})")


def listable_tenant(who: Principal, requested: str, what: str = "jobs") -> TenantId | None:
    """The tenant filter a list or watch call of `what` runs with (None: all tenants)."""
    if who.role is Role.MEMBER:
        if requested and requested != who.tenant:
            raise PermissionDenied(f"members may list only their own tenant's {what} ({who.tenant})")
        return who.tenant
    if who.role in (Role.ADMIN, Role.INFRA):
        return TenantId(requested) if requested else None
    raise PermissionDenied(f"role {who.role} may not list {what}")


# ---- administration: admins write; infra and finance read everything; members read their tenant.


def check_admin(who: Principal, action: str) -> None:
    if not who.is_admin:
        raise PermissionDenied(f"only an admin may {action} (you are {who.user}, role {who.role})")


def check_read_tenant_config(who: Principal, tenant: TenantId) -> None:
    """Raise NotFound for a tenant the caller may not read, so names cannot be probed."""
    if who.role in (Role.ADMIN, Role.INFRA, Role.FINANCE):
        return
    if who.role is Role.MEMBER and who.tenant == tenant:
        return
    raise NotFound(f"tenant {shown(tenant)} not found")


def readable_tenants(who: Principal) -> TenantId | None:
    """The one tenant a caller may list admin records of (None: every tenant)."""
    return None if who.role in (Role.ADMIN, Role.INFRA, Role.FINANCE) else who.tenant


# ---- finance reports: the finance role reads every tenant; a member only its own; nobody else.


def report_scope(who: Principal, requested: str) -> TenantId | None:
    """The one tenant the caller's report covers (None: every tenant). Admins and infra run the
    fleet, not its bills: they are refused, as the finance rules say."""
    if who.role is Role.FINANCE:
        return TenantId(requested) if requested else None
    if who.role is Role.MEMBER:
        if requested and requested != who.tenant:
            # Another tenant's figures are not there for a member, and its name is not confirmed.
            raise NotFound(f"tenant {shown(requested)} not found")
        return who.tenant
    raise PermissionDenied(
        "only the finance role or a tenant's members read usage reports "
        f"(you are {who.user}, role {who.role})"
    )


# ---- datasets: a member reads its tenant's datasets and those shared with it, and writes its own;
# admins everything; infra reads everything (it runs the stores); finance has no business here.


def check_read_dataset(who: Principal, owner: TenantId, shared_with: frozenset[TenantId], name: str) -> None:
    """Raise NotFound for a dataset the caller may not see, so names cannot be probed."""
    if who.role in (Role.ADMIN, Role.INFRA):
        return
    if who.role is Role.MEMBER and (who.tenant == owner or who.tenant in shared_with):
        return
    raise NotFound(f"dataset {shown(name)} not found")


def check_sync_dataset(who: Principal, owner: TenantId, evict: bool = False) -> None:
    """Copies cost egress and space: admins, and members who may read the dataset (evict: who own it)."""
    if who.is_admin or (who.role is Role.MEMBER and (not evict or who.tenant == owner)):
        return
    raise PermissionDenied(
        f"only an admin or a member of the owning tenant may {'evict' if evict else 'sync'} datasets "
        f"(you are {who.user}, role {who.role})"
    )


# ---- capacity: plans buy GPUs for everyone, so only infra and admins change them; finance reads
# them (and the pools) to foresee the bill; members see their own jobs' capacity only through explain.


def check_change_plans(who: Principal) -> None:
    if who.role not in (Role.ADMIN, Role.INFRA):
        raise PermissionDenied(
            f"only infra and admins may change capacity plans (you are {who.user}, {who.role})"
        )


def check_name_jobs_in_plan(who: Principal) -> None:
    """A deadline plan names jobs of any tenant: only who reads every job may preview one, so that a
    preview can never tell a caller whether a job id it may not read exists."""
    if who.role not in (Role.ADMIN, Role.INFRA):
        raise PermissionDenied(
            f"job_ids: a plan naming jobs is previewed by admin and infra, who read every job (you are "
            f"{who.role}); preview a stored plan by plan_id instead"
        )


def check_read_capacity(who: Principal) -> None:
    if who.role not in (Role.ADMIN, Role.INFRA, Role.FINANCE):
        raise PermissionDenied(
            f"capacity plans and pools are for admin, infra and finance (you are {who.role})"
        )
