"""End to end, etcd going away under a running server: calls fail with UNAVAILABLE instead of
hanging, nothing is half-written, and everything carries on when etcd is back; a retry with the
same idempotency key never makes a second job, whether the first attempt's write landed or not.

Two ways etcd goes away: the process dies (connections refused), and it hangs (SIGSTOP: connected
but silent, which only a deadline catches).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.procstop import wait_until_stopped

pytestmark = pytest.mark.e2e

_T = TypeVar("_T")


@pytest.fixture
def etcd(own_etcd: EtcdProcess) -> EtcdProcess:
    """This module kills and pauses etcd: an etcd of its own, not the worker's shared one."""
    return own_etcd


def _refused(fn: object) -> tuple[grpc.StatusCode, float]:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        fn()  # type: ignore[operator]
    return error.value.code(), time.monotonic() - started


@pytest.mark.parametrize("outage", ["killed", "hung"])
def test_an_etcd_outage_fails_calls_cleanly_and_the_server_recovers(
    etcd: EtcdProcess, server: ServerProcess, outage: str
) -> None:
    with server.client("alice") as alice:
        # Long enough to be seen RUNNING and still run when etcd goes: a gang that ended before the
        # reconciler's first look goes from DISPATCHED straight to SUCCEEDED, which a busy machine
        # made likely for a 3 s job (the wait below then never held).
        before = alice.submit(manifest("before", duration="12s"), idempotency_key="before").job_id
        wait_for(lambda: alice.get(before).phase == pb.JOB_PHASE_RUNNING, timeout_s=30)

        if outage == "killed":
            etcd.kill()
        else:
            assert etcd.pid is not None
            os.kill(etcd.pid, signal.SIGSTOP)
            # The signal lands asynchronously: on a busy machine etcd stored the submission below
            # before it stopped (run r7). Hung means every thread stopped.
            wait_until_stopped(etcd.pid)
        try:
            code, took_s = _refused(
                lambda: alice.submit(manifest("during", duration="1s"), idempotency_key="during")
            )
            assert code == grpc.StatusCode.UNAVAILABLE
            assert took_s < 9, "a submission must fail at its deadline, not hang"
        finally:
            if outage == "killed":
                etcd.start()  # same data dir, same ports
            else:
                assert etcd.pid is not None
                os.kill(etcd.pid, signal.SIGCONT)

        # Back: the refused submission was not half-stored, so its retry creates it now, once; the
        # job that was running when etcd went away finishes.
        retried = wait_for(
            lambda: _try(lambda: alice.submit(manifest("during", duration="1s"), idempotency_key="during")),
            timeout_s=30,
        )
        if outage == "killed":
            # etcd refused the connection: the write never reached it.
            assert retried.created, "nothing was stored for the refused submission"
        # A hung etcd may still apply a write it had received before it stopped answering: the
        # server could only say UNAVAILABLE (outcome unknown). The retry with the same key then
        # finds that job instead of making a second one; either way there is exactly one.
        again = alice.submit(manifest("during", duration="1s"), idempotency_key="during")
        assert (again.created, again.job_id) == (False, retried.job_id)
        for job_id in (before, retried.job_id):
            wait_for(lambda j=job_id: alice.get(j).phase == pb.JOB_PHASE_SUCCEEDED, timeout_s=60)
        assert sorted(j.name for j in alice.list_all()) == ["before", "during"]


def _try(fn: Callable[[], _T]) -> _T | None:
    """fn's value, or None while etcd is unavailable (what wait_for reads as "not yet")."""
    try:
        return fn()
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return None
