"""A `weed mini` started again on a data dir that holds objects is ready only when it can serve them:
S3 and the buckets answered before the volume server's first heartbeat told the master where its
volumes were, and a GET then failed with 500 "volume 1 not found" (a sync resumed at once after a
restart of `gpufed up` failed on 29 of its objects in a fresh-clone run; weed's log said so).

On a quiet machine the heartbeat wins the race and this test passes without the fix too: it guards the
readiness rule (every volume on disk known to the master) rather than reproducing the busy run.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from datasync import open_store
from datasync.credentials import AwsCredentials, Secret
from datasync.seaweed_process import SeaweedProcess, request_status
from datasync.store_config import S3StoreConfig

pytestmark = pytest.mark.integration

BUCKET = "restarted"


def _store(weed: SeaweedProcess):  # type: ignore[no-untyped-def]
    assert weed.endpoint is not None
    config = S3StoreConfig(
        BUCKET, endpoint=weed.endpoint, region="us-east-1", access_key_id_env="K", secret_access_key_env="S"
    )
    return open_store("restarted", config, env={"K": weed.access_key_id, "S": weed.secret_access_key})


def test_every_object_is_served_the_moment_a_restarted_weed_says_it_is_ready(tmp_path: Path) -> None:
    weed = SeaweedProcess(tmp_path / "weed", buckets=[BUCKET])
    objects = {f"part-{i:02d}.bin": os.urandom(64 * 1024) for i in range(8)}

    async def put_all() -> None:
        store = _store(weed)
        for key, data in objects.items():
            await store.put(key, data)

    async def get_all() -> dict[str, bytes]:
        store = _store(weed)
        return {key: bytes(await store.get(key)) for key in objects}

    weed.start()
    try:
        asyncio.run(put_all())
        weed.kill()  # as the kernel kills it with a SIGKILLed `gpufed up`
        weed.start()
        # At once, one plain signed GET each, with no retry (a client's retries hid the 500s).
        assert weed.endpoint is not None
        statuses = {
            key: request_status(
                "GET",
                f"{weed.endpoint}/{BUCKET}/{key}",
                AwsCredentials(weed.access_key_id, Secret(weed.secret_access_key)),
                timeout_s=10.0,
            )
            for key in objects
        }
        assert statuses == dict.fromkeys(objects, 200)
        assert asyncio.run(get_all()) == objects
    finally:
        weed.stop()
