"""Issue 30, item 13: a copy is verified only by a listing of the destination taken after the sync's last
write, from the user's side on the embedded default (`gpufed up`, two SeaweedFS servers).

A third party with the cache bucket's keys (`rclone`, not gpufed's code) deletes the objects a sync has
written so far while it runs, and puts a stray object under the copy's prefix. The sync must copy the
deleted objects again and delete the stray before it says `done, verified`; `rclone check --checksum` is
the judge of the finished copy. `dataset verify --no-repair` (`VerifyDataset`, as the CLI renders it) names a stray put there later, and the next
`dataset sync` deletes it. `dataset evict` while a first sync runs is refused.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from datasync import open_store
from datasync.seaweed_process import SeaweedProcess
from datasync.store_config import S3StoreConfig
from federation.api.datasets_client import DatasetsClient
from federation.cli.dataset import verify_text
from federation.runtime.embedded import default_config_path
from tests.e2e.harness import wait_for
from tests.e2e.test_up_crash import Up, processes_mentioning

pytestmark = pytest.mark.e2e

KIB, MIB = 1024, 1024 * 1024
HOME, CACHE = "onprem-s3", "s3-us-east-1"
# Below the multipart threshold (MD5 ETags, so `rclone check --checksum` compares every object), paced
# by `datasync.maxBytesPerSecond` so that the sync runs for about 5 s whatever the machine.
OBJECTS, OBJECT_BYTES = 40, 32 * KIB
SYNC_BYTES_PER_S = MIB // 4
HOME_PREFIX = "vision/racy/v1/"
COPY_PREFIX = "gpufed-cache/vision/racy/v1/"


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    federation = yaml.safe_load(default_config_path().read_text())
    # The history database: SQLite under the state dir (the default's may name one by environment).
    federation.pop("history", None)
    federation["datasync"] = {**federation.get("datasync", {}), "maxBytesPerSecond": SYNC_BYTES_PER_S}
    config = tmp_path / "federation.yaml"
    config.write_text(yaml.safe_dump(federation, sort_keys=False))
    instance = Up(tmp_path / "state", config)
    instance.begin()
    try:
        yield instance
    finally:
        instance.stop()
        for pid in processes_mentioning(str(instance.state_dir)):
            os.kill(pid, 9)


def _put_dataset(up: Up) -> None:
    where = up.stores()[HOME]
    secret = SeaweedProcess(Path(where["seaweed_dir"])).secret_access_key
    config = S3StoreConfig(
        where["bucket"], endpoint=where["endpoint"], region="us-east-1",
        access_key_id_env="K", secret_access_key_env="S",
    )  # fmt: skip

    async def run() -> None:
        store = open_store(HOME, config, env={"K": "gpufed", "S": secret})
        await asyncio.gather(
            *(store.put(f"{HOME_PREFIX}part-{i:03d}.bin", os.urandom(OBJECT_BYTES)) for i in range(OBJECTS))
        )
        await store.close()

    asyncio.run(run())


def _rclone(up: Up, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """rclone with `home:` and `cache:` remotes on the two buckets' S3 endpoints, with their keys."""
    env = dict(os.environ)
    for remote, name in (("HOME", HOME), ("CACHE", CACHE)):
        where = up.stores()[name]
        prefix = f"RCLONE_CONFIG_{remote}_"
        env |= {
            prefix + "TYPE": "s3",
            prefix + "PROVIDER": "SeaweedFS",
            prefix + "ENDPOINT": where["endpoint"],
            prefix + "ACCESS_KEY_ID": "gpufed",
            prefix + "SECRET_ACCESS_KEY": SeaweedProcess(Path(where["seaweed_dir"])).secret_access_key,
            prefix + "REGION": "us-east-1",
        }
    rclone = Path(sys.executable).parent / "rclone"
    return subprocess.run(
        [str(rclone), *args], env=env, input=stdin, capture_output=True, text=True, timeout=60
    )


def _copy_listing(up: Up) -> list[str]:
    listed = _rclone(up, "lsf", "-R", "--files-only", f"cache:{up.stores()[CACHE]['bucket']}/{COPY_PREFIX}")
    assert listed.returncode == 0 or "directory not found" in listed.stderr, listed.stderr[-2000:]
    return [p for p in listed.stdout.splitlines() if not p.startswith(".gpufed/")]


def _checked(up: Up) -> None:
    """rclone, the judge: every object of the version is in the copy with the home's MD5."""
    checked = _rclone(
        up, "check", "--checksum", "--one-way", "--exclude", ".gpufed/**",
        f"home:{up.stores()[HOME]['bucket']}/{HOME_PREFIX}", f"cache:{up.stores()[CACHE]['bucket']}/{COPY_PREFIX}",
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert f"{OBJECTS} matching files" in checked.stderr, checked.stderr[-3000:]


def test_a_copy_damaged_mid_sync_is_verified_only_by_a_listing_after_the_last_write(up: Up) -> None:
    up.wait_stores()
    _put_dataset(up)
    up.wait_up()
    bucket = up.stores()[CACHE]["bucket"]
    with up.client("alice") as alice:
        datasets = DatasetsClient(alice)
        datasets.register("racy", "v1", store=HOME, prefix=HOME_PREFIX)
        datasets.sync("racy", store=CACHE)

        # Evicting while the first sync writes the copy is refused, not answered "0 B freed".
        with pytest.raises(grpc.RpcError) as refused:
            datasets.evict("racy", store=CACHE)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
        assert "a sync of it runs" in str(refused.value.details())
        (sync,) = datasets.status("racy", store=CACHE).syncs
        assert sync.state in ("requested", "running"), sync
        with up.client("bob") as bob:
            # Another tenant learns nothing of it.
            with pytest.raises(grpc.RpcError) as hidden:
                DatasetsClient(bob).evict("vision/racy", store=CACHE)
            assert "sync" not in str(hidden.value.details()), hidden.value

        # Mid-sync, with some objects written: a third party deletes them all and adds a stray.
        def copying() -> bool:
            (s,) = datasets.status("racy", store=CACHE).syncs
            return s.state == "running" and s.progress.objects_done >= 4

        wait_for(copying, timeout_s=20, interval_s=0.05)
        deleted = _rclone(up, "delete", "-v", f"cache:{bucket}/{COPY_PREFIX}", "--exclude", ".gpufed/**")
        assert deleted.returncode == 0, deleted.stderr[-2000:]
        assert deleted.stderr.count(": Deleted") >= 4, deleted.stderr[-2000:]
        stray = _rclone(up, "rcat", f"cache:{bucket}/{COPY_PREFIX}stray.txt", stdin="not of the version\n")
        assert stray.returncode == 0, stray.stderr[-2000:]
        (sync,) = datasets.status("racy", store=CACHE).syncs
        # Still copying (else this run shows nothing: the damage came after the sync's end).
        assert sync.state == "running", sync
        assert sync.progress.objects_done < OBJECTS, sync.progress

        def ended() -> bool:
            (s,) = datasets.status("racy", store=CACHE).syncs
            assert s.state != "failed", s.error
            return s.state == "done"

        wait_for(ended, timeout_s=30, interval_s=0.2)
        (sync,) = datasets.status("racy", store=CACHE).syncs
        assert sync.verified
        # The objects copied again are counted once in what is done, not past the version's totals.
        assert (sync.progress.objects_done, sync.progress.bytes_done) == (OBJECTS, OBJECTS * OBJECT_BYTES)
        _checked(up)
        assert "stray.txt" not in _copy_listing(up)

        # A stray put there later: verify names it (without repairing), the next sync deletes it.
        stray = _rclone(up, "rcat", f"cache:{bucket}/{COPY_PREFIX}later.txt", stdin="stray\n")
        assert stray.returncode == 0, stray.stderr[-2000:]
        report = datasets.verify("racy", store=CACHE, repair=False)
        assert not report.ok
        assert list(report.unexpected) == ["later.txt"], report
        # What `gpufed dataset verify --no-repair` prints (and it exits 1, the copy not being ok).
        assert "  unexpected: later.txt" in verify_text(report).splitlines(), verify_text(report)
        assert "later.txt" in _copy_listing(up)
        datasets.sync("racy", store=CACHE)
        wait_for(ended, timeout_s=20, interval_s=0.2)
        (sync,) = datasets.status("racy", store=CACHE).syncs
        assert sync.verified
        assert sorted(_copy_listing(up)) == [f"part-{i:03d}.bin" for i in range(OBJECTS)]
        _checked(up)
