"""End to end through the gRPC client: a real etcd and `gpufed serve` as its own process."""

from __future__ import annotations

import json
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from federation.api.client import GpufedClient
from federation.api.v1 import gpufed_pb2 as pb
from tests.e2e.harness import ServerProcess, manifest, wait_for

pytestmark = pytest.mark.e2e

TERMINAL = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}


def _phases(job: pb.Job) -> list[str]:
    return [pb.JobPhase.Name(e.phase).removeprefix("JOB_PHASE_") for e in job.events]


def test_a_job_goes_from_submit_to_succeeded_and_watch_streams_every_phase(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        # Long enough to be seen running: a gang that ends before the reconciler's first look after
        # its dispatch goes from DISPATCHED straight to SUCCEEDED (rightly: it was never seen
        # running), and at 1 s a busy machine's leader round could take that long.
        reply = alice.submit(manifest("resnet", workers=2, gpus=2, duration="5s"), idempotency_key="k1")
        assert reply.created
        seen = [
            pb.JobPhase.Name(e.job.phase).removeprefix("JOB_PHASE_")
            for e in alice.watch(job_id=reply.job_id, timeout_s=30)
        ]
        job = alice.get(reply.job_id)
    assert seen[-1] == "SUCCEEDED"
    assert _phases(job) == ["ADMITTED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    assert job.cluster == "onprem"
    assert job.gpu_type == "A100"
    assert job.gpu_count == 6
    assert job.tenant == "vision"
    assert job.user == "alice"
    assert "kind: TrainingJob" in job.manifest


def test_another_tenant_cannot_get_list_watch_explain_or_cancel_the_job(server: ServerProcess) -> None:
    with server.client("alice") as alice, server.client("bob") as bob:
        job_id = alice.submit(manifest("private-work", duration="30s")).job_id
        for call in (
            lambda: bob.get(job_id),
            lambda: bob.cancel(job_id),
            lambda: bob.explain(job_id),
            lambda: list(bob.watch(job_id=job_id, timeout_s=5)),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)
        assert job_id not in {j.job_id for j in bob.list_all()}
        with pytest.raises(grpc.RpcError) as caught:
            bob.list_page(tenant="vision")
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The job is untouched by bob's attempts, and alice still owns it.
        assert not alice.get(job_id).cancel_requested
        alice.cancel(job_id)


def test_an_invalid_spec_is_refused_naming_the_field_and_nothing_is_stored(server: ServerProcess) -> None:
    with server.client("alice") as alice, server.client("admin") as admin:
        before = len(admin.list_all())
        bad = manifest("bad").replace("replicas: 1,", "replicas: 0,")
        with pytest.raises(grpc.RpcError) as caught:
            alice.submit(bad, idempotency_key="bad-1")
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.tasks[0].replicas" in (caught.value.details() or "")
        # The rejected key was not consumed: a corrected spec under the same key is a new job.
        assert alice.submit(manifest("good"), idempotency_key="bad-1").created
        assert len(admin.list_all()) == before + 1


def test_a_member_cannot_submit_to_another_tenant(server: ServerProcess) -> None:
    with server.client("alice") as alice, pytest.raises(grpc.RpcError) as caught:
        alice.submit(manifest("sneaky", tenant="nlp"))
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_the_same_idempotency_key_twice_gives_one_job(server: ServerProcess) -> None:
    key = str(uuid.uuid4())
    with server.client("alice") as alice, server.client("admin") as admin:
        first = alice.submit(manifest("once"), idempotency_key=key)
        second = alice.submit(manifest("once"), idempotency_key=key)
        assert first.created
        assert not second.created
        assert first.job_id == second.job_id
        assert [j.job_id for j in admin.list_all()].count(first.job_id) == 1
        with pytest.raises(grpc.RpcError) as caught:
            alice.submit(manifest("different", workers=3), idempotency_key=key)
        assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_calls_without_a_valid_token_are_unauthenticated(server: ServerProcess) -> None:
    with GpufedClient(server.target, "not-a-token") as stranger:
        with pytest.raises(grpc.RpcError) as caught:
            stranger.list_page()
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(server.target) as channel:
        from federation.api.v1 import gpufed_pb2_grpc as pb_grpc

        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.JobServiceStub(channel).ListJobs(pb.ListJobsRequest(), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_waiting_job_is_explained_and_can_be_cancelled(server: ServerProcess) -> None:
    with server.client("bob") as bob:
        job_id = bob.submit(manifest("needs-b200", gpu="B200")).job_id
        reply = wait_for(lambda: r if (r := bob.explain(job_id)).reasons else None, timeout_s=15)
        assert reply.phase == pb.JOB_PHASE_QUEUED
        assert reply.reasons[0].code == "no_cluster_has_gpu_type"
        assert "B200" in reply.reasons[0].message
        bob.cancel(job_id, reason="wrong GPU")
        job = wait_for(lambda: (j := bob.get(job_id)).phase in TERMINAL and j, timeout_s=15)
        assert job.phase == pb.JOB_PHASE_CANCELLED


def test_cancelling_a_running_job_stops_its_gang(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        job_id = alice.submit(manifest("long", duration="60s")).job_id
        wait_for(lambda: alice.get(job_id).phase == pb.JOB_PHASE_RUNNING, timeout_s=15)
        alice.cancel(job_id)
        job = wait_for(lambda: (j := alice.get(job_id)).phase in TERMINAL and j, timeout_s=15)
    assert job.phase == pb.JOB_PHASE_CANCELLED
    journal = (server.state_dir / "clusters" / "onprem.journal").read_text().splitlines()
    assert any(json.loads(line).get("op") == "cancel" for line in journal if line.strip())


def test_gangs_queue_when_the_cluster_is_full_and_run_when_it_frees(server: ServerProcess) -> None:
    # onprem has 2 nodes x 8 A100: two 8-GPU gangs of 1 master + 1 worker (4 GPUs each) fill it.
    with server.client("alice") as alice:
        ids = [alice.submit(manifest(f"fill-{i}", gpus=4, duration="6s")).job_id for i in range(3)]

        def one_queued_while_two_run() -> bool:
            # The queued one is read between two reads that see the other two running, so it was
            # queued while they held the cluster. (Two 2 s gangs, read once, could end and free the
            # cluster between the reads on a busy machine, or end before both were seen running.)
            before = [alice.get(i).phase for i in ids]
            if sorted(before) != sorted([pb.JOB_PHASE_QUEUED, pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_RUNNING]):
                return False
            running = [i for i, phase in zip(ids, before, strict=True) if phase == pb.JOB_PHASE_RUNNING]
            return all(alice.get(i).phase == pb.JOB_PHASE_RUNNING for i in running)

        wait_for(one_queued_while_two_run, timeout_s=30)
        wait_for(lambda: all(alice.get(i).phase == pb.JOB_PHASE_SUCCEEDED for i in ids), timeout_s=60)


def test_health_reflection_and_metrics_are_served(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.target) as channel:
        # types-grpcio-health-checking declares HealthStub without its generated methods.
        health = health_pb2_grpc.HealthStub(channel)
        status: health_pb2.HealthCheckResponse = health.Check(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(), timeout=5
        )
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        # types-grpcio-reflection types the stub's method as binascii's Incomplete (an exception
        # class it imported by mistake for typeshed's placeholder), so it is not callable to mypy.
        replies = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(  # type: ignore[operator]
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert {"gpufed.v1.JobService", "gpufed.v1.FederationService", "grpc.health.v1.Health"} <= names
