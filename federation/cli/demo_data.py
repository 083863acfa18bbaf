"""`gpufed demo`'s datasets step: a dataset staged to the cloud once, then used from the copy.

A few small objects are put in the on-prem store (SeaweedFS, as `gpufed up` runs it; where it is and
its key come from the state dir, as `.gpufed/stores.json` says), alice registers them as a dataset
version, and a job that needs H100s (only the cloud has them) waits in STAGING while the version is
copied to the cloud's store and verified. A second job of the same dataset there starts at once. The
checks read the jobs' own histories and the sync record, and hash the cloud copy byte for byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path

from datasync import ObjectStore, open_store
from datasync.seaweed_process import SeaweedProcess
from datasync.store_config import S3StoreConfig
from federation.api.client import GpufedClient
from federation.api.convert import phase_name
from federation.api.datasets_client import DatasetsClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.dataset import datasets_table, human_bytes, sync_text

HOME, CLOUD = "onprem-s3", "s3-us-east-1"
NAME, VERSION = "flowers", "v1"
PREFIX = f"vision/{NAME}/{VERSION}/"
TENANT = "vision"  # alice's: dataset names are per tenant, and so are the copies' places
# The copy's place in the cloud store (federation.datasets.registry.cache_prefix names it so).
CACHE_PREFIX = f"gpufed-cache/{TENANT}/{NAME}/{VERSION}/"
FINAL = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}


def _job(name: str, dataset: str) -> str:
    return f"""\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: {name}, annotations: {{sim.gpufed.io/duration: "2s"}}}}
spec:
  gpuTypes: [H100]
  dataset: {dataset}
  tasks:
    - {{name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 8}}
"""


def _objects() -> dict[str, bytes]:
    """Three objects, 4 MiB, 1 MiB and a small label file, the same on every run."""
    chunk = hashlib.sha256(b"gpufed demo").digest()
    return {
        f"{PREFIX}train-0.tar": chunk * (4 * 1024 * 1024 // len(chunk)),
        f"{PREFIX}train-1.tar": bytes(reversed(chunk)) * (1024 * 1024 // len(chunk)),
        f"{PREFIX}labels.json": json.dumps({str(i): f"class-{i}" for i in range(100)}).encode(),
    }


def _store(state_dir: Path, name: str) -> ObjectStore:
    where = json.loads((state_dir / "stores.json").read_text())[name]
    secret = SeaweedProcess(Path(where["seaweed_dir"])).secret_access_key
    config = S3StoreConfig(
        where["bucket"],
        endpoint=where["endpoint"],
        region="us-east-1",
        access_key_id_env="KEY_ID",
        secret_access_key_env="SECRET",
    )
    return open_store(name, config, env={"KEY_ID": "gpufed", "SECRET": secret})


def _put(state_dir: Path, objects: dict[str, bytes]) -> None:
    async def run() -> None:
        store = _store(state_dir, HOME)
        try:
            for path, data in objects.items():
                await store.put(path, data)
        finally:
            await store.close()

    asyncio.run(run())


def _hashes(state_dir: Path, store_name: str, prefix: str) -> dict[str, str]:
    async def run() -> dict[str, str]:
        store = _store(state_dir, store_name)
        out = {}
        try:
            async for page in store.list_prefix(prefix):
                for meta in page:
                    rel = meta.path[len(prefix) :]
                    if not rel.startswith(".gpufed/"):
                        out[rel] = hashlib.sha256(bytes(await store.get(meta.path))).hexdigest()
        finally:
            await store.close()
        return out

    return asyncio.run(run())


def _step(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def _follow(alice: GpufedClient, datasets: DatasetsClient, job_id: str) -> pb.Job:
    """Print the job's phases to its end; while it stages, the sync as `dataset status` shows it."""
    for event in alice.watch(job_id=job_id, include_initial=True, timeout_s=90):
        j = event.job
        where = f" on {j.cluster}" if j.cluster else ""
        print(f"{j.job_id:<24} {phase_name(j.phase):<10}{where}", flush=True)
        if j.phase == pb.JOB_PHASE_STAGING:
            print(f"  {j.events[-1].reason if j.events else j.message}")
            _show_sync_once_planned(datasets)
        if j.phase in FINAL:
            return j
    return alice.get(job_id)


def _show_sync_once_planned(datasets: DatasetsClient) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        syncs = datasets.status(NAME, store=CLOUD).syncs
        if syncs and (syncs[0].objects_to_copy or syncs[0].state in ("done", "failed")):
            print("  $ gpufed dataset status " + NAME)
            print("\n".join("  " + line for line in sync_text(syncs[0]).splitlines()), flush=True)
            return
        time.sleep(0.2)


def _phases(job: pb.Job) -> list[str]:
    return [phase_name(e.phase) for e in job.events]


def run(alice: GpufedClient, state_dir: Path) -> tuple[list[tuple[str, bool]], set[str]]:
    """The datasets step; returns its checks and the ids of the jobs that ran."""
    datasets = DatasetsClient(alice)
    checks: list[tuple[str, bool]] = []

    _step(f"datasets: alice puts 3 objects in the on-prem store ({HOME}) and registers them")
    objects = _objects()
    _put(state_dir, objects)
    total = sum(len(d) for d in objects.values())
    reg = datasets.register(NAME, VERSION, store=HOME, prefix=PREFIX)
    print(
        f"registered {reg.dataset}@{reg.version}: {human_bytes(reg.size_bytes)} in {reg.object_count} "
        f"objects (manifest sha256 {reg.manifest_digest[:16]})"
    )
    print(datasets_table(datasets.list()))
    checks.append(
        ("the dataset's manifest holds every object", (reg.size_bytes, reg.object_count) == (total, 3))
    )

    _step(f"alice's H100 job needs {NAME}@{VERSION}: only the cloud has H100s, so it stages there first")
    first = _follow(alice, datasets, alice.submit(_job("vit-train", f"{NAME}@{VERSION}")).job_id)
    syncs = datasets.status(NAME, store=CLOUD).syncs
    print("$ gpufed dataset status " + NAME)
    print("\n".join(sync_text(s) for s in syncs))
    want = {p.removeprefix(PREFIX): hashlib.sha256(d).hexdigest() for p, d in objects.items()}
    copied = _hashes(state_dir, CLOUD, CACHE_PREFIX)
    print(f"the cloud copy, hashed here: {len(copied)} objects, {'equal' if copied == want else 'NOT equal'}")
    checks.append(
        (
            "the first job staged its data on the cloud, then succeeded",
            first.phase == pb.JOB_PHASE_SUCCEEDED
            and first.cluster == "aws-us-east-1"
            and _phases(first) == ["ADMITTED", "STAGING", "DISPATCHED", "RUNNING", "SUCCEEDED"],
        )
    )
    sync = syncs[0] if len(syncs) == 1 else None
    checks.append(
        (
            "the dataset was copied once, every byte, and verified",
            sync is not None
            and (sync.state, sync.verified, sync.bytes_copied) == ("done", True, total)
            and copied == want,
        )
    )

    _step(f"a second job of {NAME} on the same cluster starts from the copy")
    second = _follow(alice, datasets, alice.submit(_job("vit-eval", NAME)).job_id)
    after = datasets.status(NAME, store=CLOUD).syncs
    again = after[0] if len(after) == 1 else None
    print(f"{second.job_id}: {' -> '.join(_phases(second))}")
    checks.append(
        (
            "the second job ran without STAGING",
            second.phase == pb.JOB_PHASE_SUCCEEDED
            and second.cluster == first.cluster
            and "STAGING" not in _phases(second),
        )
    )
    checks.append(
        (
            "no second copy was made",
            sync is not None
            and again is not None
            and again.updated_at == sync.updated_at
            and again.bytes_copied == total,
        )
    )
    return checks, {first.job_id, second.job_id}
