"""Fixtures of the integration tier: the worker's one pair of SeaweedFS stores.

Each test worker starts one `weed mini` for the on-prem store and one for the cloud store the first
time a test asks, and stops them at the end of its session (about 1.5 s to start and 2 to 10 s to
stop each, which the four datasync modules used to pay once per module). Tests stay apart by
bucket (one per module where a module lists or empties a whole bucket) and by key prefix
(`seaweed.own_prefix`: the module's and the test's name), never by sharing keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from datasync.seaweed_process import SeaweedProcess

# Buckets of the on-prem store and of the cloud store. The fence tests empty their cache between
# cases, so they have a bucket of their own on the cloud side.
ONPREM_BUCKETS = ("datasets", "home", "lean")
CLOUD_BUCKETS = ("cache", "fence-cache")


@pytest.fixture(scope="session")
def seaweed_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SeaweedProcess, SeaweedProcess]]:
    root = tmp_path_factory.mktemp("seaweed")
    onprem = SeaweedProcess(root / "onprem", buckets=ONPREM_BUCKETS)
    cloud = SeaweedProcess(root / "cloud", buckets=CLOUD_BUCKETS)
    try:
        onprem.start()
        cloud.start()
        yield onprem, cloud
    finally:
        # Both stop at once: weed's graceful stop takes seconds.
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(SeaweedProcess.stop, (onprem, cloud)))
