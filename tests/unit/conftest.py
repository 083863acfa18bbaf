"""Fixtures for unit tests that need more than one file: the session's one Ray."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from tests.waits import LoopClock


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """Ray started once for the whole session (about 5 s and 0.7 GiB), on loopback only."""
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


@pytest.fixture
async def loop_clock() -> LoopClock:
    """The test's event loop with a clock the test moves forward (tests/waits.py)."""
    return LoopClock(asyncio.get_running_loop())
