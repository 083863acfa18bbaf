"""The Members service: an admin registers a member cluster while the server runs (`gpufed cluster join`).

Clusters were configured only in the config file, read at start. `gpufed cluster join` makes an
account on the member cluster and then registers the cluster here, with the same keys as the config
file's `clusters:` entries, parsed by the same code (`federation.runtime.config`), which is why this
servicer lives in `runtime` rather than `api`. The record goes to etcd (`/gpufed/clusters/<name>`,
where the config's clusters go too), the answering server drives the cluster at once, and other
replicas at their next start. A kubeconfig the answering server cannot load is refused, and
nothing is stored. Registering a name again replaces its record: a join repeated after a
token rotation updates, never duplicates. Admin only; the audit trail says who registered what.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import structlog

from federation.api.service import CallHandlers, Ctx
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.datasets.stores import StoreDirectory
from federation.errors import FailedPrecondition, InvalidArgument, InvalidSpec
from federation.metrics import Metrics
from federation.runtime.config import parse_config
from federation.security.auth import Authenticator, Principal, check_admin
from federation.security.tokens import AuditEvent, SecurityStore
from federation.spec.manifest_text import load_manifest_text
from federation.spec.validate import shown
from federation.store.job_store import KvStore
from federation.store.records import ClusterRecord

log = structlog.get_logger("gpufed.members")

# Only clusters reached through a kubeconfig join at run time: "sim" is `gpufed up`'s own, and
# "memory" is for tests and has nothing to join.
JOINABLE_BACKENDS = ("kubernetes",)


class MembersService(pb_grpc.MembersServicer):
    def __init__(
        self,
        *,
        store: KvStore,
        security: SecurityStore,
        auth: Authenticator,
        metrics: Metrics,
        drive: Callable[[ClusterRecord], Awaitable[None]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._security = security
        self._h = CallHandlers(auth, metrics)
        self._drive = drive
        self._clock = clock

    async def RegisterCluster(  # noqa: N802 (the gRPC method's name)
        self, request: pb.RegisterClusterRequest, context: Ctx
    ) -> pb.RegisterClusterResponse:
        async def body(who: Principal, req: pb.RegisterClusterRequest) -> pb.RegisterClusterResponse:
            check_admin(who, "register a member cluster")
            if not req.document.strip():
                raise InvalidArgument("document: empty; give the cluster in the config file's keys")
            doc = load_manifest_text(req.document)
            if not isinstance(doc, dict):
                raise InvalidSpec("document", "must be a mapping with the config file's cluster keys")
            record = await self._parse(dict(doc))
            created = await self._store.get_cluster(record.name) is None
            try:
                # First, so that a kubeconfig this server cannot read is refused with nothing stored.
                await self._drive(record)
            except Exception as error:  # the client's loader raises ConfigException, OSError, ValueError
                path, why = shown(record.kubeconfig, 200), shown(str(error), 200)
                raise FailedPrecondition(
                    f"cluster {record.name}: this server cannot use kubeconfig {path}: {why}"
                ) from error
            await self._store.put_cluster(record)
            action = "cluster_registered" if created else "cluster_updated"
            log.info(action, cluster=record.name, by=who.user, kubeconfig=record.kubeconfig)
            await self._security.append_audit(
                AuditEvent(self._clock(), who.user, who.role.value, action, record.name, req.document[:2000])
            )
            return pb.RegisterClusterResponse(name=record.name, created=created)

        return await self._h.unary("RegisterCluster", request, context, body)

    async def _parse(self, doc: dict[str, object]) -> ClusterRecord:
        backend = doc.setdefault("backend", "kubernetes")
        if backend not in JOINABLE_BACKENDS:
            raise InvalidSpec("backend", f"must be one of {list(JOINABLE_BACKENDS)}, got {shown(backend)}")
        # The object store is checked against the stores this federation knows, not the document's.
        object_store = doc.pop("objectStore", None)
        try:
            record = parse_config(json.dumps({"clusters": [doc]})).clusters[0]
        except InvalidSpec as error:
            # The config's messages name `clusters[0].<field>`; here the document is the one cluster.
            raise InvalidSpec(
                error.field.removeprefix("clusters[0]").lstrip(".") or "document", error.rule
            ) from None
        if object_store is not None:
            if (
                not isinstance(object_store, str)
                or await StoreDirectory(self._store.kv).get(object_store) is None
            ):
                raise InvalidSpec(
                    "objectStore", f"{shown(object_store)} is not an object store of this federation"
                )
            record = replace(record, object_store=object_store)
        return record
