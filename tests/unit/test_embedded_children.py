"""`gpufed up` starts its children (the simulator, the object stores, etcd) side by side and stops
them side by side: every start and every stop runs to its end whatever the others do, and the first
failure (in the order simulator, stores, etcd when starting; etcd, stores, simulator when stopping)
is what the caller sees. A start still under way when the stop comes would leave a child behind; a
stop that gave up at the first failure would leave the others running.

The children here are stand-ins that record what was asked of them: the real ones are started and
stopped by the end-to-end tests of `gpufed up` (tests/e2e/test_cli_up.py, test_up_crash.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest

from federation.datasets.stores import StoreRecord
from federation.runtime import embedded
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.seaweed import EmbeddedStores
from federation.runtime.sim_process import SimProcess


class Child:
    """A child process's start and stop, each a blocking call (run on a thread, as the real ones)."""

    def __init__(
        self, name: str, log: list[str], *, start_fails: bool = False, stop_fails: bool = False
    ) -> None:
        self.name = name
        self.log = log
        self.start_fails = start_fails
        self.stop_fails = stop_fails
        self.started = threading.Event()
        self.endpoints = {"onprem": "http://127.0.0.1:1"}
        self.pid = 4242

    def start(self) -> None:
        self.log.append(f"start {self.name}")
        if self.start_fails:
            raise RuntimeError(f"{self.name} would not start")
        self.started.set()

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        if self.stop_fails:
            raise RuntimeError(f"{self.name} would not stop")


class Stores(Child):
    needed = True

    async def start(self) -> tuple[StoreRecord, ...]:  # type: ignore[override]
        # The stores start on the event loop; give the others a turn first, as a real start does.
        await asyncio.sleep(0)
        super().start()
        return ()


def _children(
    log: list[str], **faults: bool
) -> tuple[SimProcess, EmbeddedStores, EtcdProcess, dict[str, Child]]:
    sims = Child(
        "sims", log, start_fails=faults.get("sims_start", False), stop_fails=faults.get("sims_stop", False)
    )
    stores = Stores(
        "stores",
        log,
        start_fails=faults.get("stores_start", False),
        stop_fails=faults.get("stores_stop", False),
    )
    etcd = Child(
        "etcd", log, start_fails=faults.get("etcd_start", False), stop_fails=faults.get("etcd_stop", False)
    )
    return (
        cast(SimProcess, sims),
        cast(EmbeddedStores, stores),
        cast(EtcdProcess, etcd),
        {"sims": sims, "stores": stores, "etcd": etcd},
    )


async def test_all_three_start_and_the_store_records_come_back() -> None:
    log: list[str] = []
    sims, stores, etcd, children = _children(log)
    assert await embedded._start_children(sims, stores, etcd) == ()
    assert sorted(log) == ["start etcd", "start sims", "start stores"]
    assert all(c.started.is_set() for c in children.values())


async def test_without_simulated_clusters_or_stores_only_etcd_starts() -> None:
    log: list[str] = []
    _sims, stores, etcd, _ = _children(log)
    cast(Any, stores).needed = False
    assert await embedded._start_children(None, stores, etcd) is None
    assert log == ["start etcd"]


@pytest.mark.parametrize(
    ("faults", "raised"),
    [
        pytest.param({"sims_start": True}, "sims would not start", id="simulator"),
        pytest.param({"stores_start": True}, "stores would not start", id="stores"),
        pytest.param({"etcd_start": True}, "etcd would not start", id="etcd"),
        pytest.param(
            {"sims_start": True, "etcd_start": True}, "sims would not start", id="first-in-order-wins"
        ),
    ],
)
async def test_a_failed_start_lets_the_others_finish_and_raises_the_first_failure(
    faults: dict[str, bool], raised: str
) -> None:
    log: list[str] = []
    sims, stores, etcd, children = _children(log, **faults)
    with pytest.raises(RuntimeError, match=raised):
        await embedded._start_children(sims, stores, etcd)
    # Every start was made and ran to its end: none is still under way for the stop that follows.
    assert sorted(log) == ["start etcd", "start sims", "start stores"]
    for name, child in children.items():
        assert child.started.is_set() is not faults.get(f"{name}_start", False)


@pytest.mark.parametrize(
    ("faults", "raised"),
    [
        pytest.param({}, None, id="clean"),
        pytest.param({"stores_stop": True}, "stores would not stop", id="stores"),
        pytest.param({"etcd_stop": True, "sims_stop": True}, "etcd would not stop", id="first-in-order-wins"),
    ],
)
async def test_every_child_is_stopped_even_when_one_stop_fails(
    faults: dict[str, bool], raised: str | None
) -> None:
    log: list[str] = []
    sims, stores, etcd, _ = _children(log, **faults)
    if raised is None:
        await embedded._stop_children(sims, stores, etcd)
    else:
        with pytest.raises(RuntimeError, match=raised):
            await embedded._stop_children(sims, stores, etcd)
    assert sorted(log) == ["stop etcd", "stop sims", "stop stores"]


async def test_without_simulated_clusters_the_rest_are_stopped() -> None:
    log: list[str] = []
    _sims, stores, etcd, _ = _children(log)
    await embedded._stop_children(None, stores, etcd)
    assert sorted(log) == ["stop etcd", "stop stores"]


def test_the_first_failure_among_outcomes_is_raised_and_results_pass() -> None:
    first, second = RuntimeError("first"), ValueError("second")
    embedded._raise_first_failure([None, (), "ok"])
    with pytest.raises(RuntimeError, match="first"):
        embedded._raise_first_failure([None, first, second])
