"""A real server's leader lease: refreshed from the lease keeper's thread, through a stall of the server's
own event loop, and given back with no thread left when the server stops (federation.runtime.server's
election wiring, federation.scheduling.lease_keeper). etcdctl is the judge of the lease and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation.runtime.bootstrap import bootstrap
from federation.runtime.config import load_config
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.server import FederationServer, ServerConfig
from federation.store.job_store import KvStore
from federation.store.kv_etcd import EtcdKv
from tests.lease_judge import block_the_loop, keeper_threads, leader_key, lease_ttl_left
from tests.waits import until

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).parents[1] / "e2e" / "federation.yaml"
TTL_S = 2


@pytest.fixture
async def state(etcd_kv: EtcdKv, tmp_path: Path) -> Path:
    await bootstrap(KvStore(etcd_kv), load_config(CONFIG), tmp_path / "tokens")
    return tmp_path


def _leading(server: FederationServer) -> float:
    value = server.metrics.registry.get_sample_value("gpufed_leader")
    return 0.0 if value is None else value


async def test_a_server_keeps_its_lease_through_a_stall_of_its_loop_and_gives_it_back_on_stop(
    etcd_process: EtcdProcess, state: Path
) -> None:
    endpoint = etcd_process.endpoint
    server = FederationServer(
        ServerConfig(
            etcd_endpoint=endpoint,
            state_dir=state / "a",
            identity="stall-a",
            cycle_interval_s=0.2,
            lease_ttl_s=TTL_S,
        )
    )
    await server.start()
    stopped = False
    try:
        await until(
            lambda: server.first_pass_done, "the server leads and has run its first pass", timeout_s=30
        )
        election = server._election
        assert election is not None
        fence = election.fence
        assert fence is not None
        lease = election._lease
        assert [t.name for t in keeper_threads()] == ["gpufed-lease-stall-a"]

        # The server's own loop blocked for 2.5 TTLs: etcd sees the lease alive and the key unchanged.
        seen = block_the_loop(2.5 * TTL_S, lambda: (lease_ttl_left(endpoint, lease), leader_key(endpoint)))
        assert [ttl for ttl, _ in seen if ttl <= 0] == []
        assert {key for _, key in seen} == {("stall-a", fence.create_revision)}
        cycles = server.metrics.registry.get_sample_value("gpufed_scheduling_cycle_seconds_count") or 0.0

        # And the same term goes on: it schedules again, still leading with the same fence.
        await until(
            lambda: (
                (server.metrics.registry.get_sample_value("gpufed_scheduling_cycle_seconds_count") or 0.0)
                > cycles
            ),
            "a scheduling cycle after the stall",
        )
        assert election.is_leader
        assert election.fence == fence
        assert _leading(server) == 1

        await server.stop()
        stopped = True
        # A clean stop: no keeper's thread left, the lease revoked and the key gone at once.
        assert keeper_threads() == []
        assert lease_ttl_left(endpoint, lease) == -1
        assert leader_key(endpoint) is None
    finally:
        if not stopped:
            await server.stop()
