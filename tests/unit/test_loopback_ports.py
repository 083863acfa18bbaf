"""Ports for local servers come from outside the range outgoing connections take theirs from.

Stop 27's CI failed when a killed etcd member restarted on its remembered port and found it held:
the port had been picked by binding to 0, inside the kernel's ephemeral range, and a reconnecting
peer's outgoing connection had taken it as its local port.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from datasync import loopback_ports
from datasync.loopback_ports import (
    HIGHEST,
    LOWEST,
    SLOT_ENV,
    ephemeral_range,
    free_port,
    free_ports,
    port_free,
    port_slot,
)
from datasync.seaweed_process import _GRPC_OFFSET, free_port_pairs


@pytest.fixture(autouse=True)
def no_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's workers each run in a port slot (tests/conftest.py); these tests choose their own."""
    monkeypatch.delenv(SLOT_ENV, raising=False)


def test_an_outgoing_connections_local_port_is_ephemeral_and_blocks_a_listener_there() -> None:
    # The failure itself: the kernel gives a connection a local port from the ephemeral range, and a
    # Go server (SO_REUSEADDR) cannot listen on that port while the connection lives.
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as out,
    ):
        local = out.getsockname()[1]
        low, high = ephemeral_range()
        assert low <= local <= high
        assert not port_free(local, reuse_addr=True)


def test_picked_ports_lie_outside_the_ephemeral_range_and_are_free() -> None:
    low, high = ephemeral_range()
    assert high - low < HIGHEST - LOWEST, "this machine's range leaves no room; the fallback test covers it"
    picks = [free_port() for _ in range(300)]
    assert all(LOWEST <= p <= HIGHEST and not low <= p <= high for p in picks)
    assert len(set(picks)) > 250, "the picks are spread, so two starts rarely try the same port"
    assert all(port_free(p) for p in picks[:20])


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        taken = busy.getsockname()[1]
        # The first draw is the busy port, the next ones are not.
        monkeypatch.setattr(loopback_ports, "ephemeral_range", lambda: (taken + 1, HIGHEST))
        draws = iter([taken - LOWEST, taken - LOWEST, 0, 1, 2, 3])
        monkeypatch.setattr(random, "randrange", lambda _n: next(draws))
        got = free_port(also=lambda p: p != LOWEST)
        assert got != taken
        assert got == LOWEST + 1


def test_without_room_outside_the_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    wide = tmp_path / "ip_local_port_range"
    wide.write_text("1024\t65535\n")
    monkeypatch.setattr(loopback_ports, "_RANGE_FILE", wide)
    assert ephemeral_range() == (1024, 65535)
    assert port_free(free_port())


def test_an_unreadable_range_falls_back_to_linuxs_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(loopback_ports, "_RANGE_FILE", tmp_path / "missing")
    assert ephemeral_range() == (32768, 60999)


def test_seaweed_port_pairs_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low, _ = ephemeral_range()
    pairs = free_port_pairs(4)
    ports = [q for p in pairs for q in (p, p + _GRPC_OFFSET)]
    assert len(set(ports)) == 8
    assert all(LOWEST <= q < low for q in ports)
    assert all(port_free(q) for q in ports)


def test_ports_drawn_together_are_distinct_even_when_the_draws_repeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A cluster's six ports are drawn at once; two equal draws must not give two members one port.
    draws = iter([5, 5, 5, 7, 5, 7, 9])
    monkeypatch.setattr(random, "randrange", lambda _n: next(draws))
    assert free_ports(3) == [LOWEST + 5, LOWEST + 7, LOWEST + 9]


def test_ports_drawn_in_a_slot_all_lie_in_it_and_pairs_keep_their_grpc_port_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SLOT_ENV, "3/8")
    assert port_slot() == (3, 8)
    picks = [free_port() for _ in range(200)] + free_ports(6)
    assert all(p % 8 == 3 for p in picks)
    pairs = free_port_pairs(5)
    assert all(p % 8 == 3 and (p + _GRPC_OFFSET) % 8 == 3 for p in pairs)


def test_two_slots_never_draw_the_same_port(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same random draws in two slots: what one instance draws, the other never does.
    drawn: dict[str, set[int]] = {}
    for slot in ("0/4", "1/4"):
        monkeypatch.setenv(SLOT_ENV, slot)
        monkeypatch.setattr(random, "randrange", _counting())
        drawn[slot] = {free_port() for _ in range(100)}
    assert drawn["0/4"].isdisjoint(drawn["1/4"])
    assert {p % 4 for p in drawn["0/4"]} == {0}
    assert {p % 4 for p in drawn["1/4"]} == {1}


def _counting() -> Callable[[int], int]:
    """Draws 0, 3, 6, ...: the same sequence for each slot."""
    counter = iter(range(0, 10**6, 3))
    return lambda _n: next(counter)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("2", "expected i/n"),
        ("a/4", "expected i/n"),
        ("1/3", "must divide 10000"),
        ("4/4", "less than n"),
        ("-1/4", "at least 0"),
        ("0/0", "must divide"),
    ],
)
def test_a_bad_slot_is_refused_with_what_is_wrong(
    monkeypatch: pytest.MonkeyPatch, value: str, named: str
) -> None:
    monkeypatch.setenv(SLOT_ENV, value)
    with pytest.raises(ValueError, match=SLOT_ENV) as refused:
        free_port()
    assert named in str(refused.value)


def test_each_test_worker_has_its_own_slot() -> None:
    from tests.conftest import _port_slot_of_this_worker

    slots = []
    for worker in range(6):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
            patch.setenv("PYTEST_XDIST_WORKER_COUNT", "6")
            slots.append(_port_slot_of_this_worker())
    assert slots == ["0/8", "1/8", "2/8", "3/8", "4/8", "5/8"]
