"""The lease stall limit's bounds (federation.scheduling.leader, lease_keeper)."""

from __future__ import annotations

import pytest

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
