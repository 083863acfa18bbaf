"""Datasets end to end on the embedded default (`gpufed up`: etcd, simulated clusters and two real
SeaweedFS servers), through the gRPC client only; the test touches the stores directly only to put the
data there first and to check the copies byte for byte.

A job whose dataset lives only in the private store, placed on the public cloud (it asks for H100s,
which only aws-us-east-1 has), waits in STAGING while the version is copied and verified, then runs;
the next job of the same dataset there starts without copying. Datasets stay within their tenant unless
shared (a job naming data its tenant may not use is refused at submission), a sync whose source object
is gone fails the job naming the object, and bad fields are refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from datasync import ObjectStore, open_store
from datasync.seaweed_process import SeaweedProcess
from datasync.store_config import S3StoreConfig
from federation.api.client import GpufedClient, wait_until_serving
from federation.api.datasets_client import DatasetsClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.embedded import ENDPOINT_FILE, read_endpoint
from tests.e2e.harness import manifest, wait_for

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
FINAL = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}


class Embedded:
    """`gpufed up` as its own process on a fresh state dir."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        log = (state_dir.parent / "up.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "federation", "--state-dir", str(state_dir), "up", "--port", "0",
             "--metrics-port", "0"],
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )  # fmt: skip
        # A start that fails here leaves no fixture to stop it: stop it before raising (a failed
        # start once left `gpufed up` and its children running for the rest of the run).
        try:
            wait_for(
                lambda: (state_dir / ENDPOINT_FILE).exists() or self.proc.poll() is not None, timeout_s=90
            )
            assert self.proc.poll() is None, (state_dir.parent / "up.log").read_text()[-3000:]
            self.target = read_endpoint(state_dir)["grpc"]
            wait_until_serving(self.target)
        except BaseException:
            self.stop()
            raise

    def client(self, user: str) -> GpufedClient:
        token = (self.state_dir / "tokens" / f"{user}.token").read_text().strip()
        return GpufedClient(self.target, token)

    def store(self, name: str) -> ObjectStore:
        """A client of one of the embedded stores, with the keys gpufed up keeps in its state dir."""
        where = json.loads((self.state_dir / "stores.json").read_text())[name]
        secret = SeaweedProcess(Path(where["seaweed_dir"])).secret_access_key
        config = S3StoreConfig(
            where["bucket"], endpoint=where["endpoint"], region="us-east-1",
            access_key_id_env="K", secret_access_key_env="S",
        )  # fmt: skip
        return open_store(name, config, env={"K": "gpufed", "S": secret})

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedded]:
    embedded = Embedded(tmp_path_factory.mktemp("datasets") / "state")
    try:
        yield embedded
    finally:
        embedded.stop()


def _put(up: Embedded, store: str, objects: dict[str, bytes]) -> None:
    async def run() -> None:
        client = up.store(store)
        for path, data in objects.items():
            await client.put(path, data)
        await client.close()

    asyncio.run(run())


def _delete(up: Embedded, store: str, path: str) -> None:
    async def run() -> None:
        client = up.store(store)
        await client.delete([path])
        await client.close()

    asyncio.run(run())


def _hashes(up: Embedded, store: str, prefix: str) -> dict[str, str]:
    async def run() -> dict[str, str]:
        client = up.store(store)
        out = {}
        async for page in client.list_prefix(prefix):
            for meta in page:
                rel = meta.path[len(prefix) :]
                if not rel.startswith(".gpufed/"):
                    out[rel] = hashlib.sha256(bytes(await client.get(meta.path))).hexdigest()
        await client.close()
        return out

    return asyncio.run(run())


def _run_job(client: GpufedClient, dataset: str, name: str) -> pb.Job:
    spec = manifest(name, gpu="H100", duration="1s", extra_spec=f"  dataset: {dataset}\n")
    job_id = client.submit(spec).job_id
    job: pb.Job = wait_for(
        lambda: (j := client.get(job_id)).phase in FINAL and j, timeout_s=120, interval_s=0.3
    )
    return job


def _phases(job: pb.Job) -> list[str]:
    return [pb.JobPhase.Name(e.phase).removeprefix("JOB_PHASE_") for e in job.events]


# The module's `gpufed up` starts with its first test and counts in that test's time (about 10 s, more
# on a busy machine): a test of a few calls goes first, so that no test adds that start to a long run
# of its own. The tests use datasets of their own names and do not depend on their order.
def test_datasets_stay_within_their_tenant_unless_shared(up: Embedded) -> None:
    _put(up, "onprem-s3", {"vision/secret/v1/a.bin": b"x" * 1000, "vision/open/v1/a.bin": b"y" * 1000})
    with up.client("alice") as alice, up.client("bob") as bob, up.client("admin") as admin:
        mine, theirs = DatasetsClient(alice), DatasetsClient(bob)
        mine.register("secret", "v1", store="onprem-s3", prefix="vision/secret/v1/")
        mine.register("open", "v1", store="onprem-s3", prefix="vision/open/v1/", shared_with=["nlp"])
        # Another tenant's dataset is named `tenant/name`; a bare name is always the caller's own.
        for ref in ("vision/secret", "secret"):
            for call in (
                lambda ref=ref: theirs.get(ref),
                lambda ref=ref: theirs.status(ref),
                lambda ref=ref: theirs.sync(ref, store="s3-us-east-1", dry_run=True),
                lambda ref=ref: theirs.evict(ref, store="s3-us-east-1"),
            ):
                with pytest.raises(grpc.RpcError) as caught:
                    call()
                assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        names = {d.name for d in theirs.list().datasets}
        assert "vision/open" in names
        assert "vision/secret" not in names
        assert theirs.get("vision/open").tenant == "vision"
        with pytest.raises(grpc.RpcError) as caught:
            theirs.evict("vision/open", store="s3-us-east-1")  # shared to use, not to manage
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as caught:
            theirs.list(tenant="vision")
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert {"vision/open", "vision/secret"} <= {d.name for d in DatasetsClient(admin).list().datasets}


def test_a_job_stages_its_dataset_to_the_cloud_and_the_next_one_reuses_the_copy(up: Embedded) -> None:
    objects = {
        f"vision/mini/v1/{name}": os.urandom(size)
        for name, size in (("train-0.tar", 40 * MIB), ("train-1.tar", 3 * MIB), ("labels.json", 1234))
    }
    _put(up, "onprem-s3", objects)
    total = sum(len(d) for d in objects.values())
    with up.client("alice") as alice:
        datasets = DatasetsClient(alice)
        registered = datasets.register("mini", "v1", store="onprem-s3", prefix="vision/mini/v1/")
        assert (registered.size_bytes, registered.object_count) == (total, 3)
        plan = datasets.sync("mini", store="s3-us-east-1", dry_run=True)
        assert (plan.state, plan.bytes_to_copy, plan.objects_to_copy) == ("planned", total, 3)
        assert plan.egress_usd_per_gb == 0.0  # the config prices our own uplink at zero

        first = _run_job(alice, "mini@v1", "staged")
        assert first.phase == pb.JOB_PHASE_SUCCEEDED, first.message
        assert first.cluster == "aws-us-east-1"
        assert _phases(first) == ["ADMITTED", "STAGING", "DISPATCHED", "RUNNING", "SUCCEEDED"]
        staging = next(e for e in first.events if e.phase == pb.JOB_PHASE_STAGING)
        assert "from onprem-s3 to s3-us-east-1" in staging.reason

        (sync,) = datasets.status("mini", store="s3-us-east-1").syncs
        assert (sync.state, sync.verified, sync.bytes_copied) == ("done", True, total)
        assert first.job_id in sync.job_ids
        assert sync.progress.bytes_done == sync.progress.bytes_total == total
        # The copy in the cloud store is the data, byte for byte.
        want = {p.removeprefix("vision/mini/v1/"): hashlib.sha256(d).hexdigest() for p, d in objects.items()}
        assert _hashes(up, "s3-us-east-1", "gpufed-cache/vision/mini/v1/") == want

        second = _run_job(alice, "mini", "reuses")
        assert second.phase == pb.JOB_PHASE_SUCCEEDED, second.message
        assert second.cluster == "aws-us-east-1"
        assert _phases(second) == ["ADMITTED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
        (again,) = datasets.status("mini", store="s3-us-east-1").syncs
        assert again.updated_at == sync.updated_at
        assert again.bytes_copied == total

        shown = datasets.get("mini")
        (copy,) = shown.copies
        assert (copy.store, copy.version, copy.size_bytes) == ("s3-us-east-1", "v1", total)
        # Pins go once the jobs are done; then the copy may be evicted, never the home one.
        wait_for(lambda: not datasets.get("mini").copies[0].pinned_by, timeout_s=15)
        with pytest.raises(grpc.RpcError) as home:
            datasets.evict("mini", store="onprem-s3")
        assert home.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert datasets.evict("mini", store="s3-us-east-1").freed_bytes == total
        assert not datasets.get("mini").copies
        assert _hashes(up, "s3-us-east-1", "gpufed-cache/vision/mini/v1/") == {}

    status = subprocess.run(
        [sys.executable, "-m", "federation", "--state-dir", str(up.state_dir), "--user", "alice",
         "dataset", "status", "mini"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    # Issue 15: an evicted copy no longer shows done and verified.
    assert "onprem-s3 -> s3-us-east-1: evicted" in status.stdout
    assert "verified: yes" not in status.stdout


def test_a_job_naming_a_dataset_its_tenant_cannot_use_is_refused_at_submission(up: Embedded) -> None:
    _put(up, "onprem-s3", {"vision/private/v1/a.bin": b"p" * 1000, "vision/public/v1/a.bin": b"q" * 1000})
    with up.client("alice") as alice, up.client("bob") as bob:
        mine = DatasetsClient(alice)
        mine.register("private", "v1", store="onprem-s3", prefix="vision/private/v1/")
        mine.register("public", "v1", store="onprem-s3", prefix="vision/public/v1/", shared_with=["nlp"])
        before = bob.list_all()
        # alice's unshared dataset reads exactly like one that does not exist; a version that does not
        # exist is refused too; and the same, whatever the idempotency key.
        for ref in (
            "vision/private@v1",
            "vision/private",
            "private@v1",
            "no-such-data@v1",
            "vision/public@v9",
        ):
            spec = manifest("peek", gpu="A100", duration="1s", extra_spec=f"  dataset: {ref}\n")
            with pytest.raises(grpc.RpcError) as caught:
                bob.submit(spec, idempotency_key=f"peek-{ref}")
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, ref
            details = caught.value.details() or ""
            assert details.startswith("spec.dataset: "), details
            assert ref.split("@")[0] in details
        assert bob.list_all() == before, "a refused job must not be stored"
        # Shared with bob's tenant: accepted, and it runs (its home store is the cluster's).
        spec = manifest("shared", gpu="A100", duration="1s", extra_spec="  dataset: vision/public@v1\n")
        accepted = bob.submit(spec, idempotency_key="peek-vision/public@v1")
        assert accepted.created
        job = wait_for(
            lambda: (j := bob.get(accepted.job_id)).phase in FINAL and j, timeout_s=60, interval_s=0.3
        )
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, job.message
        # The refused submission's key was not kept: shared now (with a new version; sharing is per
        # dataset), the same key makes a new job, accepted at once although the server's view is older.
        mine.register("private", "v2", store="onprem-s3", prefix="vision/private/v1/", shared_with=["nlp"])
        spec = manifest("peek", gpu="A100", duration="1s", extra_spec="  dataset: vision/private@v1\n")
        assert bob.submit(spec, idempotency_key="peek-vision/private@v1").created


def test_two_tenants_datasets_of_one_name_are_two_and_each_job_stages_its_own(up: Embedded) -> None:
    """Issue 16: dataset names are per tenant. alice (vision) and bob (nlp) each register `twin`, with
    different data; a bare `twin` is the job's own tenant's, `vision/twin` is alice's for whom she shared
    it with, and for anyone else reads exactly like a dataset that does not exist."""
    ours, theirs = os.urandom(50_000), os.urandom(60_000)
    _put(up, "onprem-s3", {"vision/twin/v1/a.bin": ours, "nlp/twin/v1/a.bin": theirs})
    cloud = "s3-us-east-1"
    with up.client("alice") as alice, up.client("bob") as bob:
        mine, bobs = DatasetsClient(alice), DatasetsClient(bob)
        first = mine.register("twin", "v1", store="onprem-s3", prefix="vision/twin/v1/")
        second = bobs.register("twin", "v1", store="onprem-s3", prefix="nlp/twin/v1/")  # not "taken"
        assert (first.dataset, second.dataset) == ("vision/twin", "nlp/twin")
        assert (mine.get("twin").tenant, bobs.get("twin").tenant) == ("vision", "nlp")
        assert mine.get("twin").versions[0].manifest_digest != bobs.get("twin").versions[0].manifest_digest

        job = _run_job(alice, "twin@v1", "twin-a")
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, job.message
        assert "STAGING" in _phases(job)
        assert _hashes(up, cloud, "gpufed-cache/vision/twin/v1/") == {
            "a.bin": hashlib.sha256(ours).hexdigest()
        }
        assert _hashes(up, cloud, "gpufed-cache/nlp/twin/v1/") == {}

        # bob naming alice's unshared `twin` is told what naming nothing tells him.
        answers = []
        for ref in ("vision/twin@v1", "vision/elsewhere@v1"):
            spec = manifest("peek", gpu="H100", duration="1s", extra_spec=f"  dataset: {ref}\n")
            with pytest.raises(grpc.RpcError) as caught:
                bob.submit(spec)
            answers.append((caught.value.code(), (caught.value.details() or "").replace(ref, "<ref>")))
        assert answers[0] == answers[1]
        assert answers[0][0] == grpc.StatusCode.FAILED_PRECONDITION

        job = _run_job(bob, "twin@v1", "twin-b")
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, job.message
        assert _hashes(up, cloud, "gpufed-cache/nlp/twin/v1/") == {
            "a.bin": hashlib.sha256(theirs).hexdigest()
        }
        assert _hashes(up, cloud, "gpufed-cache/vision/twin/v1/") == {
            "a.bin": hashlib.sha256(ours).hexdigest()
        }

        # Shared with bob's tenant, `vision/twin` is alice's data, from the copy already in the cloud.
        mine.register("twin", "v2", store="onprem-s3", prefix="vision/twin/v1/", shared_with=["nlp"])
        job = _run_job(bob, "vision/twin@v1", "twin-shared")
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, job.message
        assert _phases(job) == ["ADMITTED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
        assert bobs.get("vision/twin").tenant == "vision"
        assert {s.dataset for s in bobs.status("vision/twin", store=cloud).syncs} == {"vision/twin"}
        assert {s.dataset for s in bobs.status("twin", store=cloud).syncs} == {"nlp/twin"}


def test_a_sync_whose_source_object_is_gone_fails_the_job_naming_it(up: Embedded) -> None:
    _put(up, "onprem-s3", {"vision/broken/v1/ok.bin": b"o" * 5000, "vision/broken/v1/gone.bin": b"g" * 7000})
    with up.client("alice") as alice:
        DatasetsClient(alice).register("broken", "v1", store="onprem-s3", prefix="vision/broken/v1/")
        _delete(up, "onprem-s3", "vision/broken/v1/gone.bin")
        job = _run_job(alice, "broken@v1", "broken")
        assert job.phase == pb.JOB_PHASE_FAILED
        assert _phases(job) == ["ADMITTED", "STAGING", "FAILED"]
        assert "sync of vision/broken@v1 to s3-us-east-1 failed" in job.message
        assert "gone.bin" in job.message
        (sync,) = DatasetsClient(alice).status("broken").syncs
        assert sync.state == "failed"
        assert "gone.bin" in sync.error


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("name", {"name": "Not A Name"}),
        ("version", {"version": "../v1"}),
        ("store", {"store": "No_Such"}),
        ("prefix", {"prefix": "/etc/"}),
        ("prefix", {"prefix": "a/../b/"}),
        ("shared_with[0]", {"shared_with": ["Bad Tenant"]}),
    ],
)
def test_bad_fields_are_refused_naming_them_and_nothing_is_stored(
    up: Embedded, field: str, change: dict[str, object]
) -> None:
    args: dict[str, object] = {"name": "fine", "version": "v1", "store": "onprem-s3", "prefix": "vision/x/"}
    args.update(change)
    with up.client("alice") as alice:
        datasets = DatasetsClient(alice)
        before = datasets.list()
        with pytest.raises(grpc.RpcError) as caught:
            datasets.register(**args)  # type: ignore[arg-type]
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (caught.value.details() or "").startswith(f"{field}:")
        assert datasets.list() == before
