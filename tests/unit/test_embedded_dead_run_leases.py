"""`gpufed up` holds its state dir's lock, so leases a crashed run of that dir left in its etcd are
revoked at the next start instead of waited out (its leadership: 5 s; its sync's copy fence: the
fence's whole TTL, 30 s by default). A leadership held under another identity (a server someone
attached to this etcd by hand) is not the dead run's, and stays."""

from __future__ import annotations

from federation.datasets.fence import FENCES
from federation.runtime.embedded import EMBEDDED_IDENTITY, release_leases_of_a_dead_run
from federation.store.job_store import LEADER_KEY
from federation.store.kv_memory import MemoryKv


async def _held(kv: MemoryKv, key: bytes, value: bytes) -> int:
    lease = await kv.grant_lease(30)
    await kv.put(key, value, lease=lease)
    return lease


async def test_the_dead_runs_leadership_and_fences_are_revoked() -> None:
    kv = MemoryKv()
    leader = await _held(kv, LEADER_KEY, EMBEDDED_IDENTITY.encode())
    fence = await _held(kv, FENCES + b"cloud/vision/crashy/v1", b'{"holder": "sync:1", "kind": "sync"}')
    await kv.put(b"/gpufed/tenants/vision", b"{}")  # no lease: nothing to revoke

    assert sorted(await release_leases_of_a_dead_run(kv)) == sorted([leader, fence])
    assert await kv.get(LEADER_KEY) is None
    assert (await kv.range_prefix(FENCES)).kvs == ()
    assert await kv.get(b"/gpufed/tenants/vision") is not None
    assert await release_leases_of_a_dead_run(kv) == []


async def test_a_leadership_under_another_identity_stays() -> None:
    kv = MemoryKv()
    await _held(kv, LEADER_KEY, b"standby-1")
    assert await release_leases_of_a_dead_run(kv) == []
    held = await kv.get(LEADER_KEY)
    assert held is not None
    assert held.value == b"standby-1"
