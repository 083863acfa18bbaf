"""ConsoleCalls: servicers found by method name, run with the session's token, refusals raised."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.console.calls import CallRefused, ConsoleCalls


class FakeFederation(pb_grpc.FederationServiceServicer):
    def __init__(self) -> None:
        self.seen: list[tuple[tuple[tuple[str, str], ...], str]] = []

    async def WhoAmI(self, request: pb.WhoAmIRequest, context: Any) -> pb.Identity:
        self.seen.append((context.invocation_metadata(), context.peer()))
        if context.invocation_metadata()[0][1] != "Bearer good":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked token")
        return pb.Identity(user="alice", tenant="vision", role="member")

    async def ListClusters(self, request: pb.ListClustersRequest, context: Any) -> pb.ListClustersResponse:
        return pb.ListClustersResponse()


async def test_a_call_carries_the_token_and_the_browsers_address() -> None:
    fake = FakeFederation()
    calls = ConsoleCalls([fake])
    who = await calls.call_token("good", "console:127.0.0.1", "WhoAmI", pb.WhoAmIRequest())
    assert who.user == "alice"
    assert fake.seen == [((("authorization", "Bearer good"),), "console:127.0.0.1")]


async def test_an_abort_becomes_call_refused() -> None:
    calls = ConsoleCalls([FakeFederation()])
    with pytest.raises(CallRefused) as refused:
        await calls.call_token("bad", "console:", "WhoAmI", pb.WhoAmIRequest())
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details == "unknown or revoked token"


async def test_a_method_no_servicer_serves_is_unimplemented() -> None:
    calls = ConsoleCalls([FakeFederation()])
    assert calls.has("WhoAmI")
    assert calls.has("ListClusters")
    assert not calls.has("ListJobs")
    with pytest.raises(CallRefused) as refused:
        await calls.call_token("good", "console:", "ListJobs", pb.ListJobsRequest())
    assert refused.value.code is grpc.StatusCode.UNIMPLEMENTED
