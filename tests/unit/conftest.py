"""Fixtures for unit tests that need more than one file."""

from __future__ import annotations

import asyncio

import pytest

from tests.waits import LoopClock


@pytest.fixture
async def loop_clock() -> LoopClock:
    """The test's event loop with a clock the test moves forward (tests/waits.py)."""
    return LoopClock(asyncio.get_running_loop())
