"""Datasets you can trust (issue 15), end to end on the embedded default (`gpufed up` with two real
SeaweedFS servers) through the gRPC client and the CLI.

The third party that damages a cached copy is a plain obstore client on the cloud bucket with the bucket's
keys (not gpufed's code): it deletes one object and overwrites another with bytes of the same size. The
next job must not run on that copy: it goes through STAGING, which copies only the two bad objects again.
`gpufed dataset verify` re-hashes a copy and repairs it; registration is limited to granted prefixes,
which only admins change, each change in the audit trail.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import obstore
import pytest
from obstore.store import S3Store

from datasync.seaweed_process import SeaweedProcess
from federation.api.datasets_client import DatasetsClient
from federation.api.v1 import gpufed_pb2 as pb
from tests.e2e.harness import run_cli, wait_for
from tests.e2e.test_datasets import Embedded, _hashes, _phases, _put, _run_job

pytestmark = pytest.mark.e2e

CLOUD = "s3-us-east-1"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedded]:
    embedded = Embedded(tmp_path_factory.mktemp("datasets-trust") / "state")
    try:
        yield embedded
    finally:
        embedded.stop()


def third_party(up: Embedded, store: str) -> S3Store:
    """Someone else with the bucket's keys: obstore straight on the bucket, no gpufed code in between."""
    where = json.loads((up.state_dir / "stores.json").read_text())[store]
    secret = SeaweedProcess(Path(where["seaweed_dir"])).secret_access_key
    return S3Store(
        where["bucket"], endpoint=where["endpoint"], region="us-east-1", access_key_id="gpufed",
        secret_access_key=secret, virtual_hosted_style_request=False, client_options={"allow_http": True},
    )  # fmt: skip


def _objects(name: str) -> dict[str, bytes]:
    return {
        f"vision/{name}/v1/{f}": os.urandom(n)
        for f, n in (("a.bin", 300_000), ("b.bin", 70_000), ("c.json", 999))
    }


def _want(name: str, objects: dict[str, bytes]) -> dict[str, str]:
    return {p.removeprefix(f"vision/{name}/v1/"): hashlib.sha256(d).hexdigest() for p, d in objects.items()}


def _cli(up: Embedded, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--state-dir", str(up.state_dir), "--user", user, *args, timeout_s=120)


def test_a_damaged_copy_is_caught_before_the_next_job_runs_and_repaired(up: Embedded) -> None:
    objects = _objects("trust")
    _put(up, "onprem-s3", objects)
    with up.client("alice") as alice:
        datasets = DatasetsClient(alice)
        datasets.register("trust", "v1", store="onprem-s3", prefix="vision/trust/v1/")
        first = _run_job(alice, "trust@v1", "first")
        assert first.phase == pb.JOB_PHASE_SUCCEEDED, first.message
        assert "STAGING" in _phases(first)
        assert _hashes(up, CLOUD, "gpufed-cache/vision/trust/v1/") == _want("trust", objects)

        # A third party on the cloud bucket deletes one object and overwrites another, same size.
        bucket = third_party(up, CLOUD)
        obstore.delete(bucket, "gpufed-cache/vision/trust/v1/c.json")
        obstore.put(bucket, "gpufed-cache/vision/trust/v1/b.bin", os.urandom(70_000))
        assert _hashes(up, CLOUD, "gpufed-cache/vision/trust/v1/") != _want("trust", objects)

        second = _run_job(alice, "trust@v1", "second")
        assert second.phase == pb.JOB_PHASE_SUCCEEDED, second.message
        # Caught before dispatch: the job staged again instead of running on the damaged copy.
        assert _phases(second) == ["ADMITTED", "STAGING", "DISPATCHED", "RUNNING", "SUCCEEDED"]
        assert _hashes(up, CLOUD, "gpufed-cache/vision/trust/v1/") == _want("trust", objects)
        (sync,) = datasets.status("trust", store=CLOUD).syncs
        assert (sync.state, sync.verified) == ("done", True)
        # Only the two bad objects were copied again; the good one was trusted from etcd's record.
        p = sync.progress
        assert (p.objects_copied, p.objects_up_to_date, p.objects_failed) == (2, 1, 0), p
        assert p.bytes_transferred >= 70_000 + 999


def test_dataset_verify_rehashes_a_copy_reports_and_repairs_it(up: Embedded) -> None:
    objects = _objects("verif")
    _put(up, "onprem-s3", objects)
    with up.client("alice") as alice:
        datasets = DatasetsClient(alice)
        datasets.register("verif", "v1", store="onprem-s3", prefix="vision/verif/v1/")
        datasets.sync("verif", store=CLOUD)
        wait_for(lambda: datasets.status("verif", store=CLOUD).syncs[0].state == "done", timeout_s=60)

    clean = _cli(up, "alice", "dataset", "verify", "verif@v1", "--store", CLOUD)
    assert clean.returncode == 0, clean.stderr
    assert "3 objects checked; all match the manifest" in clean.stdout

    obstore.put(third_party(up, CLOUD), "gpufed-cache/vision/verif/v1/a.bin", os.urandom(300_000))
    report = _cli(up, "alice", "dataset", "verify", "verif@v1", "--store", CLOUD, "--no-repair")
    assert report.returncode == 1, report.stdout + report.stderr
    assert "wrong sha256: a.bin" in report.stdout
    assert "STILL DAMAGED" in report.stdout
    assert _hashes(up, CLOUD, "gpufed-cache/vision/verif/v1/") != _want("verif", objects)

    repaired = _cli(up, "alice", "dataset", "verify", "verif@v1", "--store", CLOUD)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "1 bad, 1 repaired; whole now" in repaired.stdout
    assert _hashes(up, CLOUD, "gpufed-cache/vision/verif/v1/") == _want("verif", objects)
    # Another tenant cannot even see it; the home copy verifies too (without repair).
    other = _cli(up, "bob", "dataset", "verify", "vision/verif@v1", "--store", CLOUD)
    assert other.returncode != 0
    assert "not found" in other.stderr
    # ... nor tell it from a dataset that does not exist (issue 16): the same words, name aside.
    nothing = _cli(up, "bob", "dataset", "verify", "vision/nothing@v1", "--store", CLOUD)
    assert (nothing.returncode, nothing.stderr.replace("nothing", "verif")) == (
        other.returncode,
        other.stderr,
    )
    home = _cli(up, "alice", "dataset", "verify", "verif@v1", "--store", "onprem-s3", "--no-repair")
    assert home.returncode == 0, home.stderr


def test_registration_is_limited_to_granted_prefixes_and_admin_grants_are_audited(up: Embedded) -> None:
    _put(up, "onprem-s3", {"nlp/corpus/v1/a.txt": b"nlp's own", "shared/vision/set/a.bin": b"vision's too"})
    with up.client("alice") as alice, up.client("admin") as admin, up.client("bob") as bob:
        mine = DatasetsClient(alice)
        with pytest.raises(grpc.RpcError) as other:
            mine.register("stolen", "v1", store="onprem-s3", prefix="nlp/corpus/v1/")
        assert other.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "vision/" in str(other.value.details())  # it says what the tenant may use
        with pytest.raises(grpc.RpcError) as cache:
            mine.register("cached", "v1", store="onprem-s3", prefix="gpufed-cache/vision/trust/v1/")
        assert cache.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as outside:
            mine.register("set", "v1", store="onprem-s3", prefix="shared/vision/")
        assert outside.value.code() == grpc.StatusCode.PERMISSION_DENIED

        (own,) = mine.grants(store="onprem-s3").grants
        assert (own.tenant, list(own.prefixes), own.source) == ("vision", ["vision/"], "config")
        with pytest.raises(grpc.RpcError) as member:
            mine.set_grant(store="onprem-s3", tenant="vision", prefixes=["shared/"])
        assert member.value.code() == grpc.StatusCode.PERMISSION_DENIED

        granted = DatasetsClient(admin).set_grant(
            store="onprem-s3", tenant="vision", prefixes=["vision/", "shared/vision/"]
        )
        assert (list(granted.prefixes), granted.source) == (["vision/", "shared/vision/"], "admin")
        assert mine.register("set", "v1", store="onprem-s3", prefix="shared/vision/").object_count == 1
        # Bob's tenant is untouched by vision's grant.
        with pytest.raises(grpc.RpcError) as bobs:
            DatasetsClient(bob).register("set", "v1", store="onprem-s3", prefix="shared/vision/")
        assert bobs.value.code() == grpc.StatusCode.PERMISSION_DENIED
        cleared = DatasetsClient(admin).set_grant(store="onprem-s3", tenant="vision", prefixes=[])
        assert (list(cleared.prefixes), cleared.source) == (["vision/"], "config")
        events = [e for e in admin.list_audit(limit=200).events if e.action == "dataset_grant_set"]
        assert [(e.user, e.target) for e in events] == [("admin", "onprem-s3/vision")] * 2
        assert "shared/vision/" in " ".join(e.detail for e in events)


def test_a_new_version_copies_only_what_changed_and_evicting_the_old_one_leaves_it_whole(
    up: Embedded,
) -> None:
    v1 = _objects("grow")
    _put(up, "onprem-s3", v1)
    v2 = {p.replace("/v1/", "/v2/"): d for p, d in v1.items()}
    v2["vision/grow/v2/c.json"] = b"changed" * 100
    _put(up, "onprem-s3", v2)
    with up.client("alice") as alice:
        datasets = DatasetsClient(alice)
        datasets.register("grow", "v1", store="onprem-s3", prefix="vision/grow/v1/")
        datasets.register("grow", "v2", store="onprem-s3", prefix="vision/grow/v2/")
        assert _run_job(alice, "grow@v1", "v1").phase == pb.JOB_PHASE_SUCCEEDED
        second = _run_job(alice, "grow@v2", "v2")
        assert second.phase == pb.JOB_PHASE_SUCCEEDED, second.message
        (sync,) = [s for s in datasets.status("grow", store=CLOUD).syncs if s.version == "v2"]
        p = sync.progress
        # Two objects came from v1's copy in the same bucket, server-side; one crossed from home.
        assert (p.objects_reused, p.objects_copied, p.objects_failed) == (2, 1, 0), p
        assert p.bytes_transferred == len(b"changed" * 100)
        want = {k.removeprefix("vision/grow/v2/"): hashlib.sha256(d).hexdigest() for k, d in v2.items()}
        assert _hashes(up, CLOUD, "gpufed-cache/vision/grow/v2/") == want
        wait_for(lambda: all(not c.pinned_by for c in datasets.get("grow").copies), timeout_s=15)
        datasets.evict("grow", version="v1", store=CLOUD)
        assert _hashes(up, CLOUD, "gpufed-cache/vision/grow/v1/") == {}
        assert _hashes(up, CLOUD, "gpufed-cache/vision/grow/v2/") == want


def test_a_shared_datasets_copies_and_syncs_name_only_jobs_the_caller_may_read(up: Embedded) -> None:
    objects = {"vision/pub/v1/a.bin": os.urandom(2_000_000)}
    _put(up, "onprem-s3", objects)
    with up.client("alice") as alice, up.client("bob") as bob:
        DatasetsClient(alice).register(
            "pub", "v1", store="onprem-s3", prefix="vision/pub/v1/", shared_with=["nlp"]
        )
        job = _run_job(bob, "vision/pub@v1", "bobs")
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, job.message
        (theirs,) = DatasetsClient(bob).status("vision/pub", store=CLOUD).syncs
        assert (list(theirs.job_ids), theirs.other_job_count) == ([job.job_id], 0)
        (mine,) = DatasetsClient(alice).status("pub", store=CLOUD).syncs
        # Alice owns the data, not bob's job: she learns that one job of another tenant used it.
        assert (list(mine.job_ids), mine.other_job_count) == ([], 1)
        assert job.job_id not in str(DatasetsClient(alice).get("pub"))
