"""Outputs become dataset versions (issue 34), against the real etcd and real local-directory stores:
only a succeeded attempt's own prefix is registered (a failed or cancelled job's partial output never
is, nor an earlier attempt's); registration is idempotent across a restart and two registrars; the
manifest pins what the job wrote (a third party's later write is refused, and one after registration
is caught by verification); a version made where the dataset does not live is copied home, verified;
a job cannot write into another tenant's dataset or outside its granted prefixes."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from datasync import build_manifest, verify
from datasync.store_config import LocalStoreConfig
from federation.datasets.check import DatasetCheck
from federation.datasets.lineage import LineageStore
from federation.datasets.outputs import (
    OutputsController,
    OutputState,
    Registrar,
    attempt_prefix,
    awaited_inputs,
    output_env,
)
from federation.datasets.registry import DatasetRegistry
from federation.datasets.staging import GateKind, Stager
from federation.datasets.staging_run import SyncRunner
from federation.datasets.stores import StoreDirectory, StoreRecord
from federation.datasets.syncs import SyncRecords
from federation.errors import FailedPrecondition, InvalidSpec, PermissionDenied
from federation.scheduling.snapshot import PlacerInputs, build_snapshot
from federation.scheduling.workload import workload_for
from federation.spec.jobspec import DatasetRef, OutputSpec
from federation.spec.training_job import parse_manifest
from federation.store.job_store import KvStore
from federation.store.jobs import JobPlacement, JobRecord, PhaseEvent
from federation.store.kv_etcd import EtcdKv
from federation.store.records import ClusterRecord, SchedulingSettings
from placement.model import CapacityKind, ClusterName, GpuType, JobPhase, Provider, TenantId
from tests.unit.reconcile_world import a_job

OUT = OutputSpec("tokens", "vision/tokens/", "v1")


@dataclass
class World:
    root: Path
    kv: EtcdKv
    store: KvStore
    registry: DatasetRegistry
    stores: StoreDirectory

    def registrar(self) -> Registrar:
        return Registrar(kv=self.kv, store=self.store, registry=self.registry, stores=self.stores)

    def write(self, store: str, path: str, data: bytes, *, at_s: float | None = None) -> None:
        """What a job (or a third party) writes into a store, with its modification time."""
        target = self.root / store / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if at_s is not None:
            os.utime(target, (at_s, at_s))


@pytest.fixture
async def world(etcd_kv: EtcdKv, tmp_path: Path) -> AsyncIterator[World]:
    store = KvStore(etcd_kv)
    stores = StoreDirectory(etcd_kv)
    for name in ("lab", "cloud"):
        await stores.put(StoreRecord(name, LocalStoreConfig(str(tmp_path / name))))
    for cluster, object_store in (("onprem", "lab"), ("aws", "cloud")):
        await store.put_cluster(
            ClusterRecord(ClusterName(cluster), Provider.PRIVATE, "dc1", (), object_store=object_store)
        )
    w = World(tmp_path, etcd_kv, store, DatasetRegistry(etcd_kv), stores)
    yield w
    await stores.close()


def finished(
    phase: JobPhase,
    *,
    outputs: tuple[OutputSpec, ...] = (OUT,),
    attempt: int = 1,
    cluster: str = "onprem",
    ended_at_s: float | None = None,
    tenant: str = "vision",
    dataset: DatasetRef | None = None,
    name: str = "prep",
) -> JobRecord:
    job = a_job(name, tenant=tenant)
    ended = time.time() if ended_at_s is None else ended_at_s
    spec = replace(job.spec, outputs=outputs, dataset=dataset)
    return replace(
        job,
        spec=spec,
        phase=phase,
        attempt=attempt,
        placement=JobPlacement(ClusterName(cluster), GpuType("A100"), CapacityKind.PRIVATE, 1.0),
        events=(
            PhaseEvent(JobPhase.QUEUED, ended - 30, 1),
            PhaseEvent(JobPhase.DISPATCHED, ended - 20, attempt),
            PhaseEvent(phase, ended, attempt),
        ),
    )


def test_each_attempt_is_told_a_prefix_of_its_own() -> None:
    job = finished(JobPhase.RUNNING, attempt=3)
    env = dict(output_env(job))
    assert env == {"GPUFED_OUTPUT_TOKENS": f"vision/tokens/{job.job_id}/a3/"}
    # Every replica's pods get it, beside the task's own variables.
    for replica in workload_for(job).replicas:
        assert ("GPUFED_OUTPUT_TOKENS", f"vision/tokens/{job.job_id}/a3/") in replica.env


async def test_a_succeeded_attempts_prefix_becomes_the_version_with_its_lineage(world: World) -> None:
    job = finished(JobPhase.SUCCEEDED, attempt=2, dataset=None)
    end = job.events[-1].at_s
    # Attempt 1 failed half way: its partial output is under its own prefix, never read.
    world.write("lab", attempt_prefix(OUT, job.job_id, 1) + "part-0.bin", b"partial", at_s=end - 25)
    mine = attempt_prefix(OUT, job.job_id, 2)
    world.write("lab", mine + "part-0.bin", b"a" * 1000, at_s=end - 5)
    world.write("lab", mine + "part-1.bin", b"b" * 10, at_s=end - 5)
    (record,) = await world.registrar().register(job)
    assert record.state is OutputState.REGISTERED, record.reason
    stored = await world.registry.lookup(job.tenant, "tokens")
    assert stored is not None
    version = stored.value.version("v1")  # type: ignore[arg-type]
    assert version is not None
    assert (version.home.store, version.home.prefix) == ("lab", mine)
    assert (version.object_count, version.size_bytes) == (2, 1010)
    manifest = await world.registry.manifest("vision/tokens", "v1")
    assert manifest is not None
    assert [e.path for e in manifest.entries] == ["part-0.bin", "part-1.bin"]
    lineage = await LineageStore(world.kv).get("vision/tokens", "v1")
    assert lineage is not None
    assert (lineage.job_id, lineage.attempt) == (job.job_id, 2)
    assert lineage.images == tuple(dict.fromkeys(t.image for t in job.spec.tasks))
    assert lineage.params == tuple(sorted({kv for t in job.spec.tasks for kv in t.env}))


@pytest.mark.parametrize("phase", [JobPhase.FAILED, JobPhase.CANCELLED], ids=["failed", "cancelled"])
async def test_a_failed_or_cancelled_jobs_partial_output_is_never_registered(
    world: World, phase: JobPhase
) -> None:
    job = finished(phase)
    world.write("lab", attempt_prefix(OUT, job.job_id, 1) + "part-0.bin", b"partial", at_s=time.time() - 60)
    controller = OutputsController(world.registrar(), lambda: [job])
    assert await controller.run_once() == 0
    assert await world.registry.lookup(job.tenant, "tokens") is None
    assert await controller.records.get(job.job_id, 0) is None


async def test_a_restart_between_success_and_registration_registers_once(world: World) -> None:
    job = finished(JobPhase.SUCCEEDED)
    end = job.events[-1].at_s
    world.write("lab", attempt_prefix(OUT, job.job_id, 1) + "x.bin", b"x" * 100, at_s=end - 5)
    # The first server registered the lineage and the version, then died before its record.
    first = world.registrar()
    await first._register_one(job, OUT)
    assert await first.records.get(job.job_id, 0) is None
    # Two servers' controllers (a restarted one and another) pass over the succeeded job at once.
    a = OutputsController(world.registrar(), lambda: [job])
    b = OutputsController(world.registrar(), lambda: [job])
    assert list(await asyncio.gather(a.run_once(), b.run_once())) == [1, 1]
    record = await a.records.get(job.job_id, 0)
    assert record is not None
    assert record.state is OutputState.REGISTERED, record
    stored = await world.registry.lookup(job.tenant, "tokens")
    assert stored is not None
    assert [v.version for v in stored.value.versions] == ["v1"]
    assert await a.run_once() == 0  # done with it


async def test_a_third_partys_write_after_the_job_ended_is_refused_and_nothing_registered(
    world: World,
) -> None:
    job = finished(JobPhase.SUCCEEDED, ended_at_s=time.time() - 10)
    end = job.events[-1].at_s
    prefix = attempt_prefix(OUT, job.job_id, 1)
    world.write("lab", prefix + "x.bin", b"x" * 100, at_s=end - 5)
    world.write("lab", prefix + "planted.bin", b"evil")  # now: after the job ended
    (record,) = await world.registrar().register(job)
    assert record.state is OutputState.REFUSED
    assert "written after the job ended (planted.bin)" in record.reason
    assert await world.registry.lookup(job.tenant, "tokens") is None


async def test_the_manifest_pins_the_version_against_a_later_overwrite(world: World) -> None:
    job = finished(JobPhase.SUCCEEDED)
    end = job.events[-1].at_s
    prefix = attempt_prefix(OUT, job.job_id, 1)
    world.write("lab", prefix + "x.bin", b"x" * 100, at_s=end - 5)
    (record,) = await world.registrar().register(job)
    assert record.state is OutputState.REGISTERED
    registered = await world.registry.manifest("vision/tokens", "v1")
    assert registered is not None
    # A third party on the same bucket overwrites the object with bytes of the same size.
    world.write("lab", prefix + "x.bin", b"y" * 100)
    report = await verify(await world.stores.client("lab"), prefix, registered)
    assert list(report.wrong_hash) == ["x.bin"]
    # The registered version is unchanged: the same manifest, and another pass changes nothing.
    assert await world.registry.manifest("vision/tokens", "v1") == registered
    assert await OutputsController(world.registrar(), lambda: [job]).run_once() == 1
    assert await world.registry.manifest("vision/tokens", "v1") == registered
    assert (await build_manifest(await world.stores.client("lab"), prefix)).digest != registered.digest


async def test_a_version_made_away_from_the_datasets_home_is_copied_home_verified(world: World) -> None:
    first = finished(JobPhase.SUCCEEDED, outputs=(replace(OUT, version="v1"),), name="prep-a")
    world.write(
        "lab", attempt_prefix(OUT, first.job_id, 1) + "x.bin", b"1" * 10, at_s=first.events[-1].at_s - 5
    )
    await world.registrar().register(first)
    second = finished(JobPhase.SUCCEEDED, outputs=(replace(OUT, version="v2"),), cluster="aws", name="prep-b")
    prefix = attempt_prefix(OUT, second.job_id, 1)
    world.write("cloud", prefix + "y.bin", b"2" * 20, at_s=second.events[-1].at_s - 5)
    (record,) = await world.registrar().register(second)
    assert (record.state, record.store) == (OutputState.REGISTERED, "lab"), record
    stored = await world.registry.lookup(second.tenant, "tokens")
    assert stored is not None
    assert {v.version: v.home.store for v in stored.value.versions} == {
        "v1": "lab",
        "v2": "lab",
    }
    assert (world.root / "lab" / prefix / "y.bin").read_bytes() == b"2" * 20


async def test_a_prefix_not_granted_to_the_tenant_is_refused(world: World) -> None:
    outside = OutputSpec("tokens", "nlp/stolen/", "v1")
    job = finished(JobPhase.SUCCEEDED, outputs=(outside,))
    world.write("lab", attempt_prefix(outside, job.job_id, 1) + "x.bin", b"x", at_s=job.events[-1].at_s - 5)
    (record,) = await world.registrar().register(job)
    assert record.state is OutputState.REFUSED
    assert "only under its granted prefixes (vision/)" in record.reason


def test_a_job_cannot_name_another_tenants_dataset_as_output() -> None:
    manifest = """
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: sneaky}
spec:
  gpuTypes: [A100]
  outputs: [{dataset: nlp/corpus, path: vision/x/}]
  tasks: [{name: main, replicas: 1, gpus: 1, image: x}]
"""
    with pytest.raises(InvalidSpec) as refused:
        parse_manifest(manifest, priority_classes=["normal"])
    assert refused.value.field == "spec.outputs[0].dataset"
    assert "cannot write into another tenant's dataset" in str(refused.value)


async def test_two_servers_registering_at_once_make_one_version(world: World) -> None:
    jobs = [
        finished(JobPhase.SUCCEEDED, outputs=(replace(OUT, version=f"v{i}"),), name=f"prep-{i}")
        for i in range(4)
    ]
    for job in jobs:
        world.write(
            "lab", attempt_prefix(OUT, job.job_id, 1) + "x.bin", job.job_id.encode(), at_s=time.time() - 60
        )
    servers = [OutputsController(world.registrar(), lambda: jobs) for _ in range(3)]
    await asyncio.gather(*(s.run_once() for s in servers))
    stored = await world.registry.lookup(jobs[0].tenant, "tokens")
    assert stored is not None
    assert sorted(v.version for v in stored.value.versions) == ["v0", "v1", "v2", "v3"]
    for job in jobs:
        record = await servers[0].records.get(job.job_id, 0)
        assert record is not None
        assert record.state is OutputState.REGISTERED, record


async def test_a_job_may_name_a_version_a_live_job_will_make_and_waits_in_staging_for_it(
    world: World,
) -> None:
    producer = finished(JobPhase.RUNNING)
    jobs = [producer]
    controller = OutputsController(world.registrar(), lambda: jobs)
    check = DatasetCheck(world.registry)
    check.declared = controller.declared
    settings = SchedulingSettings()
    await check.check(TenantId("vision"), DatasetRef("tokens", "v1"), settings)
    with pytest.raises(FailedPrecondition):  # no live job makes v2
        await check.check(TenantId("vision"), DatasetRef("tokens", "v2"), settings)
    with pytest.raises(FailedPrecondition) as other:  # nlp may not name vision's, made or not
        await check.check(TenantId("nlp"), DatasetRef("vision/tokens", "v1"), settings)
    assert "is not registered for tenant nlp" in str(other.value)

    syncs = SyncRecords(world.kv)

    async def no_settings() -> SchedulingSettings:
        return settings

    runner = SyncRunner(
        registry=world.registry, syncs=syncs, stores=world.stores, settings=no_settings,
        journal_dir=world.root / "journal",
    )  # fmt: skip
    stager = Stager(registry=world.registry, syncs=syncs, runner=runner, cluster_store=lambda c: "lab")
    stager.declared = controller.declared
    consumer = finished(JobPhase.ADMITTED, outputs=(), dataset=DatasetRef("tokens", "v1"), name="train")
    gate = await stager.prepare(consumer)
    assert gate.kind is GateKind.STAGE
    assert (
        f"waiting for its input vision/tokens@v1, the declared output of job {producer.job_id}" in gate.reason
    )
    staging = replace(consumer, phase=JobPhase.STAGING)
    assert (await stager.poll(staging)).kind is GateKind.WAIT

    # The producer succeeds, and its output is registered: the consumer goes on.
    jobs[0] = finished(JobPhase.SUCCEEDED)
    world.write("lab", attempt_prefix(OUT, producer.job_id, 1) + "x.bin", b"x", at_s=time.time() - 60)
    assert await controller.run_once() == 1
    assert (await stager.poll(staging)).kind is GateKind.READY
    await stager.stop()


async def test_outputs_are_checked_at_submission(world: World) -> None:
    check = DatasetCheck(world.registry)
    outside = parse_manifest(
        """
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: sneaky}
spec:
  gpuTypes: [A100]
  outputs: [{dataset: corpus, path: nlp/corpus/}]
  tasks: [{name: main, replicas: 1, gpus: 1, image: x}]
""",
        priority_classes=["normal"],
    )
    with pytest.raises(PermissionDenied) as refused:
        await check.check_outputs(TenantId("vision"), outside)
    assert "spec.outputs[0].path: tenant vision may write datasets only under its granted prefixes" in str(
        refused.value
    )
    # A version that exists already is refused: versions are immutable.
    job = finished(JobPhase.SUCCEEDED)
    world.write("lab", attempt_prefix(OUT, job.job_id, 1) + "x.bin", b"x", at_s=time.time() - 60)
    await world.registrar().register(job)
    again = replace(outside, outputs=(OUT,))
    with pytest.raises(FailedPrecondition) as exists:
        await check.check_outputs(TenantId("vision"), again)
    assert "spec.outputs[0].version: vision/tokens@v1 exists already" in str(exists.value)


def test_a_consumer_is_held_out_of_the_placers_queue_while_its_producer_lives() -> None:
    producer = finished(JobPhase.RUNNING)
    consumer = replace(
        finished(JobPhase.QUEUED, outputs=(), dataset=DatasetRef("tokens", "v1"), name="train"),
        placement=None,
    )
    unrelated = replace(
        finished(JobPhase.QUEUED, outputs=(), dataset=DatasetRef("tokens", "v2"), name="other"),
        placement=None,
    )
    nothing: dict[str, object] = {}
    assert awaited_inputs([producer, consumer, unrelated], nothing.get) == {consumer.job_id}
    # Registered already (the placer's locations know it), or its maker ended: not held.
    assert awaited_inputs([producer, consumer], {"vision/tokens@v1": object()}.get) == frozenset()
    assert awaited_inputs([replace(producer, phase=JobPhase.FAILED), consumer], nothing.get) == frozenset()
    # The cycle's snapshot leaves the held job out of its queue.
    snapshot = build_snapshot(
        [producer, consumer, unrelated], PlacerInputs(SchedulingSettings(), (), {}, ()), []
    )
    assert [q.job_id for q in snapshot.queued] == [unrelated.job_id]


async def test_a_consumer_whose_producer_failed_fails_in_staging_saying_why(world: World) -> None:
    jobs = [finished(JobPhase.FAILED)]
    controller = OutputsController(world.registrar(), lambda: jobs)
    syncs = SyncRecords(world.kv)

    async def settings() -> SchedulingSettings:
        return SchedulingSettings()

    runner = SyncRunner(
        registry=world.registry, syncs=syncs, stores=world.stores, settings=settings,
        journal_dir=world.root / "journal",
    )  # fmt: skip
    stager = Stager(registry=world.registry, syncs=syncs, runner=runner, cluster_store=lambda c: "lab")
    stager.declared = controller.declared
    consumer = finished(JobPhase.ADMITTED, outputs=(), dataset=DatasetRef("tokens", "v1"), name="train")
    gate = await stager.prepare(consumer)
    assert gate.kind is GateKind.FAIL
    assert gate.reason == (
        "dataset tokens@v1 does not exist: no job made it (the job that declared it as its output did not succeed)"
    )
    await stager.stop()


async def test_two_jobs_declaring_one_version_make_it_once_and_the_lineage_names_the_maker(
    world: World,
) -> None:
    jobs = [finished(JobPhase.SUCCEEDED, name=f"twin-{i}") for i in range(2)]
    for job in jobs:
        world.write(
            "lab", attempt_prefix(OUT, job.job_id, 1) + "x.bin", job.job_id.encode(), at_s=time.time() - 60
        )
    results = await asyncio.gather(*(world.registrar().register(job) for job in jobs))
    states = sorted((r.state.value, job.job_id) for (r,), job in zip(results, jobs, strict=True))
    assert [s for s, _ in states] == ["refused", "registered"], results
    maker = next(j for s, j in states if s == "registered")
    lineage = await LineageStore(world.kv).get("vision/tokens", "v1")
    assert lineage is not None
    assert lineage.job_id == maker
    refused = next(r for (r,) in results if r.state is OutputState.REFUSED)
    assert "vision/tokens@v1" in refused.reason
    assert maker in refused.reason or "exists already" in refused.reason
