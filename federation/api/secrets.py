"""The Secrets service: put, list and delete a tenant's secrets. No call returns a value.

Members manage their own tenant's secrets, admins any tenant's (`--tenant`); infra and finance
neither read nor write them. A secret of another tenant is answered as a missing one (NOT_FOUND,
same words), so its existence cannot be probed. The server's log and the audit trail record who
put or deleted which secret, with its version and key names, never its values.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import structlog

from federation.api import convert
from federation.api.service import CallHandlers, Ctx
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.errors import InvalidSpec, NotFound, PermissionDenied
from federation.metrics import Metrics
from federation.secrets.store import SecretInfo, SecretStore, secret_not_found
from federation.security.auth import Authenticator, Principal, acting_tenant
from federation.security.tokens import AuditEvent, SecurityStore
from federation.spec.validate import name_field
from federation.store.records import Role

log = structlog.get_logger("gpufed.api.secrets")


def info_to_pb(info: SecretInfo) -> pb.SecretInfo:
    return pb.SecretInfo(
        tenant=info.tenant,
        name=info.name,
        version=info.version,
        keys=list(info.keys),
        created_at=convert.timestamp(info.created_at_s),
        updated_at=convert.timestamp(info.updated_at_s),
        updated_by=info.updated_by,
    )


def _tenant(who: Principal, requested: str, action: str) -> str:
    if requested:
        name_field(requested, "tenant")
    return acting_tenant(who, requested, action=action, field="tenant")


class SecretService(pb_grpc.SecretsServicer):
    def __init__(
        self,
        *,
        secrets: SecretStore,
        auth: Authenticator,
        metrics: Metrics,
        tenant_exists: Callable[[str], Awaitable[bool]],
        security: SecurityStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._secrets = secrets
        # Puts and deletes go to the audit trail (None: not recorded, for tests of the rest).
        self._security = security
        self._h = CallHandlers(auth, metrics)
        self._tenant_exists = tenant_exists
        self._clock = clock

    async def _audit(self, who: Principal, action: str, info: SecretInfo) -> None:
        if self._security is None:
            return
        detail = f"version={info.version} keys={','.join(info.keys)}"
        event = AuditEvent(
            self._clock(), who.user, who.role.value, action, f"{info.tenant}/{info.name}", detail
        )
        await self._security.append_audit(event)

    async def PutSecret(self, request: pb.PutSecretRequest, context: Ctx) -> pb.SecretInfo:
        async def body(who: Principal, req: pb.PutSecretRequest) -> pb.SecretInfo:
            tenant = _tenant(who, req.tenant, "put secrets")
            name = name_field(req.name, "name")
            if tenant != who.tenant and not await self._tenant_exists(tenant):
                raise InvalidSpec("tenant", f"no tenant {tenant!r}")
            info = await self._secrets.put(tenant, name, dict(req.data), by=who.user, at_s=self._clock())
            await self._audit(who, "secret_put", info)
            log.info(
                "secret_put",
                tenant=tenant,
                secret=name,
                version=info.version,
                keys=list(info.keys),
                user=who.user,
            )
            return info_to_pb(info)

        return await self._h.unary("PutSecret", request, context, body)

    async def ListSecrets(self, request: pb.ListSecretsRequest, context: Ctx) -> pb.ListSecretsResponse:
        async def body(who: Principal, req: pb.ListSecretsRequest) -> pb.ListSecretsResponse:
            if req.tenant:
                name_field(req.tenant, "tenant")
            if who.role is Role.MEMBER:
                if req.tenant and req.tenant != who.tenant:
                    raise PermissionDenied(f"members may list only their own tenant's secrets ({who.tenant})")
                scope: str | None = who.tenant
            elif who.is_admin:
                scope = req.tenant or None
            else:
                raise PermissionDenied(f"role {who.role} may not list secrets")
            found = sorted(await self._secrets.list(scope), key=lambda i: (i.tenant, i.name))
            return pb.ListSecretsResponse(secrets=[info_to_pb(i) for i in found])

        return await self._h.unary("ListSecrets", request, context, body)

    async def DeleteSecret(self, request: pb.DeleteSecretRequest, context: Ctx) -> pb.SecretInfo:
        async def body(who: Principal, req: pb.DeleteSecretRequest) -> pb.SecretInfo:
            tenant = _tenant(who, req.tenant, "delete secrets")
            name = name_field(req.name, "name")
            if await self._secrets.info(tenant, name) is None:
                raise NotFound(secret_not_found(tenant, name))
            info = await self._secrets.delete(tenant, name)
            await self._audit(who, "secret_deleted", info)
            log.info("secret_deleted", tenant=tenant, secret=name, version=info.version, user=who.user)
            return info_to_pb(info)

        return await self._h.unary("DeleteSecret", request, context, body)
