"""The lease stall limit's bounds (federation.scheduling.leader, lease_keeper)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from federation.cli.main import cli
from federation.errors import InvalidSpec
from federation.scheduling.leader import LeaderElection
from federation.scheduling.lease_keeper import DEFAULT_STALL_LIMIT_S
from federation.store.kv_memory import MemoryKv


def test_a_stall_limit_shorter_than_the_ttl_is_refused_naming_both() -> None:
    with pytest.raises(InvalidSpec, match=r"lease stall limit.*4 s is shorter than the lease's TTL \(5 s\)"):
        LeaderElection(MemoryKv(), "me", ttl_s=5, stall_limit_s=4)


def test_the_default_stall_limit_is_10_s_or_the_ttl_if_longer() -> None:
    assert DEFAULT_STALL_LIMIT_S == 10.0
    assert LeaderElection(MemoryKv(), "me", ttl_s=3)._stall_limit_s == 10.0
    assert LeaderElection(MemoryKv(), "me", ttl_s=30)._stall_limit_s == 30.0
    assert LeaderElection(MemoryKv(), "me", ttl_s=3, stall_limit_s=3)._stall_limit_s == 3


def test_gpufed_serve_refuses_a_stall_limit_under_the_ttl_before_it_starts() -> None:
    # By the election's own rule (`stall_limit_for`), named by the flag, before any etcd is asked for:
    # the endpoint given is one nothing listens on.
    result = CliRunner().invoke(
        cli,
        ["serve", "--etcd", "127.0.0.1:1", "--lease-ttl-s", "5", "--lease-stall-limit-s", "4"],
    )
    assert result.exit_code == 2, result.output
    assert "--lease-stall-limit-s" in result.output
    assert "4 s is shorter than the lease's TTL (5 s)" in result.output
