"""Whether a submission's idempotency key was accepted before, read without writing.

A client that retries a submission the server already accepted (its reply was lost) must get the
job back, also when its tenant is at its submission rate limit: the retry creates nothing, so
refusing it would only make a careful client look like a flood. The rate limiter asks here, and
only when it would refuse, so an accepted key costs one etcd read at most.
"""

from __future__ import annotations

from federation.store.job_store import JobStore, KvStore, Stored, idempotency_digest, idempotency_key_of
from federation.store.jobs import JobRecord
from federation.store.schema_version import loads
from placement.model import JobId, TenantId


async def accepted_before(
    store: JobStore, tenant: TenantId, key: str, manifest_digest: str
) -> Stored[JobRecord] | None:
    """The job `key` created for `tenant` with this very manifest; None otherwise (a different
    manifest is the create's to refuse, with its own message)."""
    if not key or not isinstance(store, KvStore):
        return None
    # The layout KvStore.create_job writes: the tenant, then the key's SHA-256.
    digest_key = idempotency_key_of(tenant, idempotency_digest(key))
    found = await store.kv.get(digest_key)
    if found is None:
        return None
    first = loads(found.value, found.key)
    if first.get("digest") != manifest_digest:
        return None
    return await store.get_job(JobId(str(first["job_id"])))
