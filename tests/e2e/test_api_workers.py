"""`gpufed serve --api-workers 2` (issue 33): three processes serve the API on one port, on one real etcd.

What a user of the port must not be able to tell, whichever process the kernel gave their connection:
- connections are spread over the server and its workers (the kernel's own socket table, read from
  /proc, says which process holds each accepted connection);
- every accepted submission is in etcd (`etcdctl` counts the keys), once;
- an idempotency key retried over every connection gives one job, created once;
- a tenant sees only its own jobs through every connection, and another tenant's job is "not found";
- each worker's config, which may hold the history database's password, is the server user's alone;
- a worker SIGKILLed is started again and the port keeps answering; the server's SIGTERM stops every
  worker with it.
And a second server started on a port already served fails to bind rather than sharing it unnoticed
(gRPC's own default would let it).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.runtime.etcd_process import EtcdProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.etcdctl import etcdctl
from tests.procnet import ESTABLISHED, LISTEN, api_worker_pids, sockets_on_port

pytestmark = pytest.mark.e2e

WORKERS = 2
# Connections opened: with 3 processes each gets at least one unless the kernel's hash is very
# unlucky ((2/3)^36 per process, about 1 in 2,000,000 runs).
CONNECTIONS = 36


def _channel(target: str) -> grpc.Channel:
    # A pool of its own: channels to one target otherwise share one TCP connection in a process.
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def _token(server: ServerProcess, user: str) -> tuple[tuple[str, str]]:
    token = (server.state_dir / "tokens" / f"{user}.token").read_text().strip()
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[EtcdProcess, ServerProcess]]:
    etcd = EtcdProcess(tmp_path / "etcd")
    etcd.start()
    server = ServerProcess(etcd.endpoint, tmp_path / "state", extra_args=("--api-workers", str(WORKERS)))
    try:
        server.start()
        yield etcd, server
    finally:
        server.stop()
        etcd.stop()


def test_api_workers_share_the_port_and_the_store(served: tuple[EtcdProcess, ServerProcess]) -> None:
    etcd, server = served
    assert server.proc is not None
    state = server.state_dir
    workers = wait_for(lambda: p if len(p := api_worker_pids(state)) == WORKERS else None, timeout_s=60)
    processes = [server.proc.pid, *workers]
    # Each worker's config (a history DSN may hold a password) is readable by the server's user only.
    for i in range(WORKERS):
        assert (state / "api-workers" / str(i) / "config.pickle").stat().st_mode & 0o777 == 0o600
    wait_for(lambda: all(sockets_on_port(p, server.port, LISTEN) for p in processes), timeout_s=90)
    # The workers log on the server's own stderr (what `kubectl logs` reads), each line naming it.
    for i in range(WORKERS):
        assert wait_for(lambda i=i: f"-api{i}" in server.current_log() or None, timeout_s=30)
    assert not list(state.glob("api-workers/*/worker.log"))

    alice, bob = _token(server, "alice"), _token(server, "bob")
    channels = [_channel(server.target) for _ in range(CONNECTIONS)]
    try:
        stubs = [pb_grpc.JobServiceStub(c) for c in channels]
        submitted: dict[str, str] = {}  # job id -> tenant
        for i, stub in enumerate(stubs):
            who, tenant = (alice, "vision") if i % 2 == 0 else (bob, "nlp")
            reply = stub.SubmitJob(pb.SubmitJobRequest(manifest=manifest(f"w{i}")), metadata=who, timeout=30)
            assert reply.created
            submitted[reply.job_id] = tenant

        # The kernel dealt the connections to every process on the port.
        held = {p: sockets_on_port(p, server.port, ESTABLISHED) for p in processes}
        assert all(held.values()), f"established connections per process on the port: {held}"
        assert sum(held.values()) >= CONNECTIONS

        # Durable before acknowledged, once each: etcd holds exactly the jobs answered.
        keys = etcdctl(etcd.endpoint, "get", "/gpufed/jobs/", "--prefix", "--keys-only").stdout.split()
        assert sorted(k.rsplit("/", 1)[1] for k in keys) == sorted(submitted)

        # One idempotency key over every connection (every process): one job, created once.
        key = uuid.uuid4().hex
        replies = [
            stub.SubmitJob(
                pb.SubmitJobRequest(manifest=manifest("once"), idempotency_key=key),
                metadata=alice,
                timeout=30,
            )
            for stub in stubs
        ]
        assert len({r.job_id for r in replies}) == 1
        assert sum(r.created for r in replies) == 1
        submitted[replies[0].job_id] = "vision"

        # Each tenant sees its own jobs, all of them, through every connection; never the other's.
        for who, tenant in ((alice, "vision"), (bob, "nlp")):
            own = {j for j, t in submitted.items() if t == tenant}
            for stub in stubs:

                def listed(
                    stub: pb_grpc.JobServiceStub = stub, who: tuple[tuple[str, str]] = who
                ) -> set[str]:
                    reply = stub.ListJobs(pb.ListJobsRequest(page_size=500), metadata=who, timeout=30)
                    return {j.job_id for j in reply.jobs}

                # A worker's cache learns of another process's write from etcd's watch a moment later.
                assert wait_for(lambda listed=listed, own=own: listed() == own or None, timeout_s=30)
        other = next(j for j, t in submitted.items() if t == "vision")
        for stub in stubs:
            with pytest.raises(grpc.RpcError) as refused:
                stub.GetJob(pb.GetJobRequest(job_id=other), metadata=bob, timeout=30)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND

        # A worker that dies is started again, and the port answers meanwhile and after.
        os.kill(workers[0], signal.SIGKILL)
        again = wait_for(
            lambda: p if len(p := api_worker_pids(state)) == WORKERS and workers[0] not in p else None,
            timeout_s=60,
        )
        wait_for(lambda: all(sockets_on_port(p, server.port, LISTEN) for p in again), timeout_s=90)
        fresh = _channel(server.target)
        try:
            reply = pb_grpc.JobServiceStub(fresh).SubmitJob(
                pb.SubmitJobRequest(manifest=manifest("after")), metadata=alice, timeout=30
            )
            assert reply.created
        finally:
            fresh.close()
    finally:
        for channel in channels:
            channel.close()

    # The server's stop takes its workers with it.
    server.stop()
    assert wait_for(lambda: not api_worker_pids(state), timeout_s=30)


def test_a_second_server_on_a_served_port_fails_to_bind(
    served: tuple[EtcdProcess, ServerProcess], tmp_path: Path
) -> None:
    etcd, server = served
    second = ServerProcess(etcd.endpoint, tmp_path / "second", identity="second")
    second.port = server.port
    try:
        # The harness's wait for the port is answered by the first server: the second's exit says.
        second.start()
        assert second.proc is not None
        wait_for(lambda: second.proc is not None and second.proc.poll() is not None, timeout_s=60)
        assert second.proc.returncode != 0
        assert "Failed to bind" in second.current_log()
    finally:
        second.stop()
