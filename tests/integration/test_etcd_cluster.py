"""`EtcdKv` on a three-member etcd cluster, and on one that demands TLS client certificates.

Real etcd members on loopback. A member killed under the client is noticed only as latency (calls
move to the next member); an etcd that wants client certificates lets in a client holding one signed
by its CA, and refuses a client with none, one from another CA, or no TLS at all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from federation.errors import StoreUnavailable
from federation.store.kv_etcd import EtcdKv
from federation.store.kv_etcd_channel import EtcdTls
from tests.etcd_cluster import Certs, EtcdCluster, make_certs

# With the other three-member-cluster tests, one at a time (tests/conftest.py, ETCD_CLUSTER_GROUP):
# two of this module's clusters ran at once on two workers, 610 MiB of WAL between them.
pytestmark = pytest.mark.xdist_group("etcd-cluster")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path / "etcd") as c:
        yield c


async def test_a_killed_member_costs_latency_only_and_its_return_is_seamless(cluster: EtcdCluster) -> None:
    # The production default deadline (5 s). When the victim was the Raft leader, the first write on
    # a survivor waits for the election (about a second idle, several on a loaded 2-core CI box):
    # it must be answered within the deadline, not fail. How long it took is the bench's business
    # (docs/reliability.md), so no clock is asserted here.
    kv = await EtcdKv.connect(cluster.endpoint)
    try:
        await kv.put(b"/t/k", b"v0")
        victim = [m.endpoint for m in cluster.members].index(kv.current_endpoint)
        cluster.kill(victim)
        for i in range(50):
            await kv.put(b"/t/k", f"v{i + 1}".encode())
            got = await kv.get(b"/t/k")
            assert got is not None
            assert got.value == f"v{i + 1}".encode()
        assert kv.current_endpoint != cluster.members[victim].endpoint
        # A watch opened now lives on a surviving member and sees the writes.
        rev = (await kv.range_prefix(b"/t/")).revision
        cluster.restart(victim)
        await kv.put(b"/t/k", b"back")
        events = kv.watch_prefix(b"/t/", start_revision=rev + 1)
        first = await asyncio.wait_for(anext(events), 5)
        await events.aclose()
        assert first.kv.value == b"back"
    finally:
        await kv.close()


async def test_two_members_down_fail_calls_within_the_deadline_and_nothing_is_lost(
    cluster: EtcdCluster,
) -> None:
    kv = await EtcdKv.connect(cluster.endpoint, timeout_s=2.0)
    try:
        await kv.put(b"/t/kept", b"1")
        cluster.kill(0)
        cluster.kill(1)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await kv.get(b"/t/kept")
        # One deadline on the member without a quorum, two refused connections.
        assert time.monotonic() - started < 2.0 * 2, time.monotonic() - started
        cluster.restart(0)
        cluster.restart(1)
        got = await kv.get(b"/t/kept")
        assert got is not None
        assert got.value == b"1"
    finally:
        await kv.close()


async def test_client_certificates_are_required_and_must_come_from_the_cluster_ca(
    tmp_path: Path, certs: Certs
) -> None:
    with EtcdCluster(tmp_path / "etcd", tls=certs.server) as cluster:
        assert cluster.endpoint.startswith("https://")
        kv = await EtcdKv.connect(cluster.endpoint, tls=certs.client, timeout_s=3.0)
        try:
            await kv.put(b"/t/tls", b"ok")
            cluster.kill(0)
            got = await kv.get(b"/t/tls")
            assert got is not None
            assert got.value == b"ok"
        finally:
            await kv.close()
        cluster.restart(0)
        # From the environment, as `gpufed serve` hands them on.
        env = {
            "GPUFED_ETCD_CACERT": str(certs.client.ca),
            "GPUFED_ETCD_CERT": str(certs.client.cert),
            "GPUFED_ETCD_KEY": str(certs.client.key),
        }
        from_env = EtcdTls.from_env(env)
        assert from_env == certs.client
        refused = [
            EtcdTls(ca=certs.client.ca),  # no client certificate
            certs.stranger,  # a client certificate from another CA
        ]
        for tls in refused:
            with pytest.raises(StoreUnavailable):
                await EtcdKv.connect(cluster.endpoint, tls=tls, timeout_s=2.0)
        plain = ",".join(m.endpoint for m in cluster.members)
        with pytest.raises(StoreUnavailable):
            await EtcdKv.connect(plain, timeout_s=2.0)
