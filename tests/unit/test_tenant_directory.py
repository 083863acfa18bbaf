"""The submission path's tenants (`TenantDirectory`) after an admin's write on the same server.

A server re-reads its tenants for submissions at most every TENANT_REFRESH_S. The server that takes
an admin's change reads them again at once: an admin who deletes a tenant, or lowers what its pods
may do, is not followed by seconds of submissions on the old record there. The clock here never
moves, so only that re-read can make the change seen.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from federation.api.admin import AdminService
from federation.api.service import JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CallContext, CallRefused
from federation.datasets.check import DatasetCheck
from federation.datasets.registry import DatasetRegistry
from federation.metrics import Metrics
from federation.runtime.server import TenantDirectory
from federation.security.auth import Authenticator
from federation.security.tokens import SecurityStore
from federation.spec.jobspec import PodSecurityLevel
from federation.store.job_cache import JobCache
from federation.store.job_store import InMemoryJobStore, KvStore
from federation.store.records import Role, TenantRecord, UserRecord
from placement.model import TenantId

PEER = "ipv4:127.0.0.1:40000"
PRIVILEGED_JOB = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: probe}
spec:
  tenant: vision
  gpuTypes: [A100]
  tasks:
    - name: worker
      replicas: 1
      image: "eval:1"
      gpus: 1
      template: {spec: {containers: [{name: main, securityContext: {privileged: true}}]}}
"""


def root() -> Any:
    """The admin's call context (enough of grpc's for the servicers)."""
    return CallContext("root-token", PEER)


async def world() -> tuple[KvStore, TenantDirectory, AdminService, JobService, JobCache]:
    store = InMemoryJobStore()
    await store.put_tenant(TenantRecord(TenantId("platform")))
    await store.put_tenant(TenantRecord(TenantId("vision"), pod_security=PodSecurityLevel.PRIVILEGED))
    await store.put_tenant(TenantRecord(TenantId("retired")))
    await store.put_user(UserRecord("root", TenantId("platform"), Role.ADMIN))
    await store.put_token("root-token", "root")
    cache = JobCache(store)
    await cache.start()
    auth, metrics = Authenticator(store), Metrics()
    frozen = TenantDirectory(store, clock=lambda: 1000.0)
    admin = AdminService(
        store=store,
        security=SecurityStore(store.kv),
        cache=cache,
        auth=auth,
        metrics=metrics,
        tenants_changed=frozen.forget,
    )
    jobs = JobService(
        store=store,
        cache=cache,
        auth=auth,
        metrics=metrics,
        tenants=frozen,
        datasets=DatasetCheck(DatasetRegistry(store.kv)),
    )
    return store, frozen, admin, jobs, cache


async def test_a_deleted_tenant_takes_no_submission_on_the_server_that_deleted_it() -> None:
    _store, directory, admin, jobs, cache = await world()
    try:
        assert await directory.get(TenantId("retired")) is not None  # read before the delete
        await admin.DeleteTenant(pb.DeleteTenantRequest(name="retired"), root())
        assert await directory.get(TenantId("retired")) is None
        with pytest.raises(CallRefused) as refused:
            await jobs.SubmitJob(
                pb.SubmitJobRequest(manifest=PRIVILEGED_JOB.replace("vision", "retired")),
                root(),
            )
        assert "tenant 'retired' does not exist" in refused.value.details
    finally:
        await cache.stop()


async def test_a_lowered_pod_security_level_holds_at_once_on_the_server_that_set_it() -> None:
    store, _directory, admin, jobs, cache = await world()
    try:
        ctx = root()
        # Accepted while vision is privileged; this reads the tenants into the directory.
        await jobs.SubmitJob(pb.SubmitJobRequest(manifest=PRIVILEGED_JOB, idempotency_key="one"), ctx)
        await admin.SetTenant(pb.SetTenantRequest(document="name: vision\npodSecurity: baseline\n"), ctx)
        with pytest.raises(CallRefused) as refused:
            await jobs.SubmitJob(pb.SubmitJobRequest(manifest=PRIVILEGED_JOB, idempotency_key="two"), ctx)
        assert "privileged" in refused.value.details
        listed, _ = await store.list_jobs()
        assert len(listed) == 1
    finally:
        await cache.stop()


async def test_without_a_write_the_directory_keeps_what_it_read() -> None:
    """The control: a change made behind the server's back waits for the refresh (the clock here
    never moves), so the two tests above pass only through the admin's re-read."""
    store, directory, _admin, _jobs, cache = await world()
    try:
        assert await directory.get(TenantId("retired")) is not None
        await store.delete_tenant("retired")
        assert await directory.get(TenantId("retired")) is not None
    finally:
        await cache.stop()


async def test_a_tenant_with_a_live_job_is_not_deleted_and_others_jobs_do_not_hold_it() -> None:
    store, _directory, admin, jobs, cache = await world()
    try:
        ctx = root()
        # vision has a job in the queue: it is not deleted. retired has none: it is, whatever
        # vision's jobs (the check reads the tenant's own jobs from the cache's index).
        submitted = await jobs.SubmitJob(pb.SubmitJobRequest(manifest=PRIVILEGED_JOB), ctx)
        await cache.wait_for_revision((await store.kv.txn((), (), ())).revision)
        with pytest.raises(CallRefused) as refused:
            await admin.DeleteTenant(pb.DeleteTenantRequest(name="vision"), ctx)
        assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert f"has 1 jobs that have not finished (first: {submitted.job_id})" in refused.value.details
        assert await store.get_tenant(TenantId("vision")) is not None
        await admin.DeleteTenant(pb.DeleteTenantRequest(name="retired"), ctx)
        assert await store.get_tenant(TenantId("retired")) is None
    finally:
        await cache.stop()


async def test_a_read_in_flight_across_the_write_does_not_bring_the_old_record_back() -> None:
    """Reads overlap: a submission, or the set controller reading its queue room, may be listing the
    tenants as an admin's write is taken. That read ended after the write and was kept as fresh, so
    the server's next submissions saw the old record for TENANT_REFRESH_S."""
    store, directory, admin, _jobs, cache = await world()
    real_list = store.list_tenants
    hold = True
    listed_old = asyncio.Event()
    release = asyncio.Event()

    async def list_tenants() -> list[TenantRecord]:
        nonlocal hold
        listed = await real_list()
        if hold:
            hold = False
            listed_old.set()
            await release.wait()
        return listed

    store.list_tenants = list_tenants  # type: ignore[method-assign]
    try:
        in_flight = asyncio.create_task(directory.get(TenantId("retired")))
        await listed_old.wait()  # it holds the tenants as they were before the delete
        await admin.DeleteTenant(pb.DeleteTenantRequest(name="retired"), root())
        assert await directory.get(TenantId("retired")) is None
        release.set()
        await in_flight  # began before the delete: what it answers is its own
        assert await directory.get(TenantId("retired")) is None, "the old record came back"
    finally:
        await cache.stop()
