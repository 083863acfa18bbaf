"""The Datasets calls for the CLI and tests, on a `GpufedClient`'s channel and token."""

from __future__ import annotations

from collections.abc import Sequence

from federation.api.client import GpufedClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc

# Registering reads and hashes every object under the prefix: far longer than an ordinary call.
REGISTER_TIMEOUT_S = 600.0
TIMEOUT_S = 30.0


class DatasetsClient:
    def __init__(self, client: GpufedClient) -> None:
        self._stub = pb_grpc.DatasetsStub(client.channel)
        self._metadata = client.metadata

    def register(
        self,
        name: str,
        version: str,
        *,
        store: str,
        prefix: str,
        shared_with: Sequence[str] = (),
        tenant: str = "",
    ) -> pb.DatasetVersionInfo:
        request = pb.RegisterDatasetRequest(
            name=name, version=version, store=store, prefix=prefix, shared_with=shared_with, tenant=tenant
        )
        return self._stub.RegisterDataset(request, metadata=self._metadata, timeout=REGISTER_TIMEOUT_S)

    def list(self, *, tenant: str = "") -> pb.ListDatasetsResponse:
        return self._stub.ListDatasets(
            pb.ListDatasetsRequest(tenant=tenant), metadata=self._metadata, timeout=TIMEOUT_S
        )

    def get(self, name: str) -> pb.DatasetInfo:
        return self._stub.GetDataset(
            pb.GetDatasetRequest(name=name), metadata=self._metadata, timeout=TIMEOUT_S
        )

    def sync(self, name: str, *, store: str, version: str = "", dry_run: bool = False) -> pb.SyncStatus:
        request = pb.SyncDatasetRequest(name=name, version=version, store=store, dry_run=dry_run)
        return self._stub.SyncDataset(request, metadata=self._metadata, timeout=TIMEOUT_S)

    def status(self, name: str, *, store: str = "") -> pb.ListSyncStatusResponse:
        return self._stub.GetSyncStatus(
            pb.GetSyncStatusRequest(name=name, store=store), metadata=self._metadata, timeout=TIMEOUT_S
        )

    def evict(self, name: str, *, store: str, version: str = "") -> pb.EvictDatasetResponse:
        return self._stub.EvictDataset(
            pb.EvictDatasetRequest(name=name, version=version, store=store),
            metadata=self._metadata,
            timeout=TIMEOUT_S,
        )

    def verify(
        self, name: str, *, store: str, version: str = "", repair: bool = False
    ) -> pb.VerifyDatasetResponse:
        # Re-reads and hashes every object of the copy: as long as registering it.
        return self._stub.VerifyDataset(
            pb.VerifyDatasetRequest(name=name, version=version, store=store, repair=repair),
            metadata=self._metadata,
            timeout=REGISTER_TIMEOUT_S,
        )

    def grants(self, *, store: str = "", tenant: str = "") -> pb.ListDatasetGrantsResponse:
        return self._stub.ListDatasetGrants(
            pb.ListDatasetGrantsRequest(store=store, tenant=tenant),
            metadata=self._metadata,
            timeout=TIMEOUT_S,
        )

    def set_grant(self, *, store: str, tenant: str, prefixes: Sequence[str]) -> pb.DatasetGrant:
        return self._stub.SetDatasetGrant(
            pb.DatasetGrant(store=store, tenant=tenant, prefixes=list(prefixes)),
            metadata=self._metadata,
            timeout=TIMEOUT_S,
        )

    def lineage(self, name: str, *, version: str = "") -> pb.DatasetLineage:
        return self._stub.GetDatasetLineage(
            pb.GetDatasetLineageRequest(name=name, version=version),
            metadata=self._metadata,
            timeout=TIMEOUT_S,
        )

    def outputs(self, job_id: str) -> pb.JobOutputs:
        return self._stub.GetJobOutputs(
            pb.GetJobOutputsRequest(job_id=job_id), metadata=self._metadata, timeout=TIMEOUT_S
        )
