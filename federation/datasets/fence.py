"""One writer per cached copy at a time, fenced in etcd: a sync, an eviction and a repair of the same copy
(store, dataset, version) exclude each other, whichever server or leader runs them.

Without it an eviction could delete a copy's objects while a re-sync of the same version was writing
them, and the sync would then record the copy complete and verified with half its objects gone; and two
leaders (an old one that has not noticed it lost its lease) could both write one copy.

The fence is a key created only when absent, under a lease kept alive while its holder works, so a holder
that dies frees it within the lease's TTL (the config's `datasync.fenceTtlSeconds`, 30 s by default). Its
value names the holder uniquely; every write that concludes the work (recording the copy, deleting its
record) is a transaction that compares that value, so a holder that lost its fence (its lease expired
while it was paused) cannot record anything.

Key: /gpufed/copy-fences/<store>/<name>/<version> -> {"holder": "<kind>:<uuid>", "kind", "since_s"}
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog

from datasync import CopyKey
from federation.datasets.executor import get_settings
from federation.errors import FailedPrecondition
from federation.store.kv import Compare, KeyValueStore, LeaseNotFound, Put
from federation.store.schema_version import dumps, loads

log = structlog.get_logger("gpufed.staging")

FENCES = b"/gpufed/copy-fences/"
# Keepalives per TTL (every 5 s with the default 30 s TTL): a few may be missed before the fence is lost.
KEEPALIVES_PER_TTL = 6


def fence_key(key: CopyKey) -> bytes:
    return FENCES + f"{key.store}/{key.dataset}/{key.version}".encode()


@dataclass(frozen=True, slots=True)
class Fence:
    key: bytes
    value: bytes
    kind: str

    @property
    def held(self) -> Compare:
        """The compare every concluding write carries: the fence is still ours."""
        return Compare.value_is(self.key, self.value)


class CopyBusy(FailedPrecondition):
    """Another sync, eviction or repair holds the copy's fence."""


async def holder_of(kv: KeyValueStore, key: CopyKey) -> str | None:
    """The kind of work holding the copy's fence ('sync', 'evict', 'repair'), or None when it is free."""
    held = await kv.get(fence_key(key))
    return None if held is None else str(loads(held.value, held.key).get("kind", "?"))


async def _keep_alive(kv: KeyValueStore, lease: int, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        try:
            await kv.keepalive(lease)
        except LeaseNotFound:
            # The fence is gone; the holder's concluding write will fail its compare and say so.
            log.warning("copy_fence_lost", lease=lease)
            return
        except Exception:  # etcd briefly unreachable: try again; the TTL covers a few misses
            continue


@contextlib.asynccontextmanager
async def fenced(kv: KeyValueStore, key: CopyKey, kind: str) -> AsyncIterator[Fence]:
    """Hold the copy's fence for the block; raise `CopyBusy` (nothing done) when another holds it."""
    value = dumps(
        {"holder": f"{kind}:{uuid.uuid4().hex}", "kind": kind, "since_s": time.time()}, sort_keys=True
    )
    fkey = fence_key(key)
    # Read at each fence (a rare, long operation): the TTL bootstrap stored from the config.
    ttl_s = (await get_settings(kv)).fence_ttl_s
    lease = await kv.grant_lease(ttl_s)
    result = await kv.txn([Compare.absent(fkey)], [Put(fkey, value, lease=lease)])
    if not result.succeeded:
        with contextlib.suppress(Exception):
            await kv.revoke_lease(lease)
        other = await holder_of(kv, key)
        raise CopyBusy(
            f"the copy of {key.dataset}@{key.version} in {key.store} is busy: "
            f"{'a ' + other if other else 'another operation'} of it runs; try again when it ends"
        )
    keeper = asyncio.create_task(
        _keep_alive(kv, lease, ttl_s / KEEPALIVES_PER_TTL), name=f"fence-{key.store}/{key.dataset}"
    )
    try:
        yield Fence(fkey, value, kind)
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        # Revoking the lease deletes the fence key with it; if etcd is unreachable the TTL frees it.
        with contextlib.suppress(Exception):
            await kv.revoke_lease(lease)
