"""The Capacity service's calls on a `GpufedClient`'s channel and token (CLI, tests, scripts)."""

from __future__ import annotations

from collections.abc import Sequence

from federation.api import convert
from federation.api.client import GpufedClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc


def plan_request(
    *,
    kind: str = "fixed",
    cluster: str = "",
    gpu_type: str = "",
    gpus: int = 0,
    start_s: float | None = None,
    end_s: float | None = None,
    job_ids: Sequence[str] = (),
    pool: str = "",
    reason: str = "",
    plan_id: str = "",
    allow_partial: bool = False,
) -> pb.CapacityPlanRequest:
    request = pb.CapacityPlanRequest(
        kind=kind,
        cluster=cluster,
        gpu_type=gpu_type,
        gpus=gpus,
        job_ids=list(job_ids),
        pool=pool,
        reason=reason,
        plan_id=plan_id,
        allow_partial=allow_partial,
    )
    if start_s is not None:
        request.start.CopyFrom(convert.timestamp(start_s))
    if end_s is not None:
        request.end.CopyFrom(convert.timestamp(end_s))
    return request


class CapacityClient:
    def __init__(self, client: GpufedClient, *, timeout_s: float = 10.0) -> None:
        self._stub = pb_grpc.CapacityStub(client.channel)
        self._metadata = client.metadata
        self._timeout_s = timeout_s

    def create_plan(self, request: pb.CapacityPlanRequest) -> pb.CapacityPlan:
        return self._stub.CreateCapacityPlan(request, metadata=self._metadata, timeout=self._timeout_s)

    def preview_plan(self, request: pb.CapacityPlanRequest) -> pb.CapacityPreview:
        return self._stub.PreviewCapacityPlan(request, metadata=self._metadata, timeout=self._timeout_s)

    def list_plans(self, *, include_ended: bool = False) -> pb.ListCapacityPlansResponse:
        return self._stub.ListCapacityPlans(
            pb.ListCapacityPlansRequest(include_ended=include_ended),
            metadata=self._metadata,
            timeout=self._timeout_s,
        )

    def cancel_plan(self, plan_id: str) -> pb.CapacityPlan:
        return self._stub.CancelCapacityPlan(
            pb.CancelCapacityPlanRequest(plan_id=plan_id), metadata=self._metadata, timeout=self._timeout_s
        )

    def pools(self) -> pb.ListCapacityPoolsResponse:
        return self._stub.ListCapacityPools(
            pb.ListCapacityPoolsRequest(), metadata=self._metadata, timeout=self._timeout_s
        )
