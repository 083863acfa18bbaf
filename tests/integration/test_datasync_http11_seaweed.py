"""The lean HTTP/1.1 client against the real SeaweedFS: signed GETs (whole and ranged) and PUTs of
small and larger bodies, awkward keys, errors mapped as S3Requests maps them, and keep-alive reuse
(many requests over few connections, also after the server's side of a connection went away)."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from datasync.credentials import AwsCredentials, Secret
from datasync.errors import AccessDenied, ObjectNotFound
from datasync.s3_requests import S3Requests
from datasync.seaweed_process import SeaweedProcess
from datasync.store import Blob

pytestmark = pytest.mark.integration


@pytest.fixture
def seaweed(seaweed_pair: tuple[SeaweedProcess, SeaweedProcess]) -> SeaweedProcess:
    """The worker's on-prem store (tests/integration/conftest.py); this module alone uses its `lean` bucket."""
    return seaweed_pair[0]


def client(process: SeaweedProcess, secret: str | None = None) -> S3Requests:
    credentials = AwsCredentials(process.access_key_id, Secret(secret or process.secret_access_key))
    return S3Requests(process.endpoint, "lean", "us-east-1", credentials)


async def test_small_objects_round_trip_over_few_connections(seaweed: SeaweedProcess) -> None:
    s3 = client(seaweed)
    bodies = {f"small/{i:04d}.bin": os.urandom(4096 + i) for i in range(300)}
    slots = asyncio.Semaphore(16)

    async def put(key: str, body: bytes) -> str | None:
        async with slots:
            return await s3.put_object(key, body)

    etags = await asyncio.gather(*(put(k, b) for k, b in bodies.items()))
    for etag, body in zip(etags, bodies.values(), strict=True):
        assert etag is not None
        assert etag.strip('"') == hashlib.md5(body).hexdigest()

    async def get(key: str) -> Blob:
        async with slots:
            return await s3.get_object(key)

    got = await asyncio.gather(*(get(k) for k in bodies))
    assert got == list(bodies.values())
    pool = s3._pool
    assert pool is not None
    # 600 requests, at most 16 at a time: kept-alive connections carried them.
    assert pool.connections_made <= 16
    listed = [m async for page in s3.list_objects("small/") for m in page]
    assert len(listed) == len(bodies)
    await s3.close()


async def test_ranged_get_empty_and_larger_bodies_and_awkward_keys(seaweed: SeaweedProcess) -> None:
    s3 = client(seaweed)
    big = os.urandom(5 * 1024 * 1024 + 11)
    for key, body in {
        "odd/a b+c%d.bin": b"spaces and plus",
        "odd/ends-in-slash/": b"",
        "odd/line\nbreak\x01ctl": b"control characters",
        "odd/\u00e9t\u00e9.bin": b"utf-8",
        "odd/big.bin": big,
    }.items():
        etag = await s3.put_object(key, body)
        assert etag is not None, key
        assert etag.strip('"') == hashlib.md5(body).hexdigest(), key
        assert await s3.get_object(key) == body, key
    assert await s3.get_object("odd/big.bin", 1000, 2000) == big[1000:2000]
    assert await s3.get_object("odd/big.bin", len(big) - 5) == big[-5:]
    await s3.close()


async def test_errors_are_mapped_and_the_connection_kept(seaweed: SeaweedProcess) -> None:
    s3 = client(seaweed)
    await s3.put_object("err/present", b"x")
    with pytest.raises(ObjectNotFound):
        await s3.get_object("err/absent")
    assert await s3.get_object("err/present") == b"x"
    assert s3._pool is not None
    assert s3._pool.connections_made == 1
    wrong = client(seaweed, secret="not-the-secret")
    with pytest.raises(AccessDenied):
        await wrong.get_object("err/present")
    await wrong.close()
    await s3.close()


async def test_connections_the_client_dropped_are_replaced(seaweed: SeaweedProcess) -> None:
    s3 = client(seaweed)
    await s3.put_object("drop/a", b"first")
    pool = s3._pool
    assert pool is not None
    # Close the server-facing sockets under the pool, as a server's idle timeout would.
    for conn in list(pool._idle):
        assert conn.transport is not None
        conn.transport.close()
    await asyncio.sleep(0.05)
    assert await s3.get_object("drop/a") == b"first"
    assert pool.connections_made == 2
    await s3.close()
