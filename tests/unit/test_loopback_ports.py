"""Ports for local servers come from outside the range outgoing connections take theirs from.

Stop 27's CI failed when a killed etcd member restarted on its remembered port and found it held:
the port had been picked by binding to 0, inside the kernel's ephemeral range, and a reconnecting
peer's outgoing connection had taken it as its local port.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from datasync import loopback_ports
from datasync.loopback_ports import HIGHEST, LOWEST, ephemeral_range, free_port, free_ports, port_free
from datasync.seaweed_process import _GRPC_OFFSET, free_port_pairs


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
        monkeypatch.setattr(loopback_ports.random, "randrange", lambda _n: next(draws))
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
    monkeypatch.setattr(loopback_ports.random, "randrange", lambda _n: next(draws))
    assert free_ports(3) == [LOWEST + 5, LOWEST + 7, LOWEST + 9]
