"""Fixtures of the integration tier: the worker's one pair of SeaweedFS stores, and the session's
one Ray.

Each test worker starts one `weed mini` for the on-prem store and one for the cloud store the first
time a test asks, and stops them at the end of its session (about 1.5 s to start and 2 to 10 s to
stop each, which the four datasync modules used to pay once per module). Tests stay apart by
bucket (one per module where a module lists or empties a whole bucket) and by key prefix
(`seaweed.own_prefix`: the module's and the test's name), never by sharing keys.

A worker runs one test at a time, so after each test that used the stores, a bucket that has grown
past `_BUCKET_KEEP_BYTES` is emptied (deleted and created again): the data of the size tests would
otherwise stay on disk for the whole session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from datasync.seaweed_process import SeaweedProcess
from tests.integration.seaweed import empty_big_buckets

# Buckets of the on-prem store and of the cloud store. The fence tests empty their cache between
# cases, so they have a bucket of their own on the cloud side.
ONPREM_BUCKETS = ("datasets", "home", "lean")
CLOUD_BUCKETS = ("cache", "fence-cache")
# A bucket holding less stays as it is: emptying costs a few requests, and small leftovers under
# other tests' prefixes harm no one.
_BUCKET_KEEP_BYTES = 32 * 2**20


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


@pytest.fixture(autouse=True)
def _empty_big_buckets_after(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "seaweed_pair" not in request.fixturenames:
        return
    pair: tuple[SeaweedProcess, SeaweedProcess] = request.getfixturevalue("seaweed_pair")
    for process in pair:
        if process.running:
            empty_big_buckets(process, _BUCKET_KEEP_BYTES)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """Ray started once for the whole session (about 5 s and 0.7 GiB), on loopback only; its tests
    share one worker (`SHARED_ON_ONE_WORKER` in tests/conftest.py)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    # Another suite may have started Ray in this session already: reuse it, and stop only our own.
    started_here = not ray.is_initialized()
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, _node_ip_address="127.0.0.1")
    try:
        yield
    finally:
        if started_here:
            ray.shutdown()
