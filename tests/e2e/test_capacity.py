"""Capacity on demand, end to end: `gpufed serve` with the simulated provisioner against a simulated
cloud cluster in its own process, driven only through the gRPC client.

What the simulator holds is read with the official `kubernetes` client (nodes labelled with their
pool), never from gpufed's own records: a pool has grown when the cluster has the nodes.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

from federation.api.capacity_client import CapacityClient, plan_request
from federation.api.client import GpufedClient, wait_until_serving
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.embedded import ENDPOINT_FILE, default_config_path, read_endpoint
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import serve_clusters

pytestmark = pytest.mark.e2e

# Seconds, not a cloud's minutes, but each as long as a busy machine needs: the boot is the time a
# test has to see a scale-up under way (in `explain` and the pool's pending change); the lead time
# covers the boot with seconds to spare, so that a plan's nodes are ready before it starts; the idle
# TTL is how long a grown pool stays grown with nodes idle, for a test to see it.
LEAD_S = 6.0
BOOT_S = 2.0
TTL_S = 3.0
# The first retry of a lost scale-up comes this long after it was found lost (the default is 2 s).
RETRY_BASE_S = 0.5

CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "aws-us-east-1",
        "provider": "aws",
        "region": "us-east-1",
        "scalable": True,
        "pools": [
            # p5.48xlarge, 8 x H100: two nodes, 16 GPUs; a 32-GPU gang fits nowhere.
            {
                "name": "h100-od",
                "gpuType": "H100",
                "kind": "on_demand",
                "usdPerGpuHour": 6.88,
                "gpusPerNode": 8,
                "nodes": 2,
            }
        ],
    },
]


def _serve(etcd: EtcdProcess, tmp_path: Path, sims: SimProcess) -> AbstractContextManager[ServerProcess]:
    """`gpufed serve` with the simulated provisioner over `sims`, its state under `tmp_path`."""
    return serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=30,
        tenants=[{"name": "platform"}, {"name": "nlp"}],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "infra", "tenant": "platform", "role": "infra"},
            {"name": "fin", "tenant": "platform", "role": "finance"},
            {"name": "bob", "tenant": "nlp"},
        ],
        capacity={
            "provisioner": "simulated",
            "leadTimeSeconds": LEAD_S,
            "simulatedBootSeconds": BOOT_S,
            "idleTtlSeconds": TTL_S,
            "spendCeilingUsdPerHour": 1000,
            "cloudGpuLimits": {"aws": 64},
            "maxNodesPerPool": 8,
            "retrySeconds": {"base": RETRY_BASE_S},
        },
    )


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with _serve(etcd, tmp_path, sims) as process:
        yield process


def sim_nodes(sims: SimProcess | Path, pool: str = "h100-od") -> list[str]:
    """The pool's nodes as the cluster itself reports them (through the simulator's kubeconfig)."""
    kubeconfig = sims if isinstance(sims, Path) else sims.kubeconfig
    with k8s_config.new_client_from_config(config_file=str(kubeconfig), context="aws-us-east-1") as api:
        nodes = k8s.CoreV1Api(api).list_node(label_selector=f"gpufed.io/pool={pool}")
    return sorted(n.metadata.name for n in nodes.items if n.metadata.deletion_timestamp is None)


class PoolNodeCounts:
    """Every node count a pool has had, as its cluster reports each change through a watch: a count
    that lasts a few seconds (a grown pool before its idle nodes go) is seen however slowly a busy
    machine runs the test's own calls, which a poll between them could miss."""

    def __init__(self, kubeconfig: Path, pool: str = "h100-od") -> None:
        self._api = k8s_config.new_client_from_config(config_file=str(kubeconfig), context="aws-us-east-1")
        self._watch = k8s_watch.Watch()
        self._names: set[str] = set()
        self._created: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self.counts: list[int] = []
        self.errors: list[str] = []
        threading.Thread(target=self._follow, args=(pool,), daemon=True, name=f"nodes-{pool}").start()
        # The watch starts with the nodes there are (one event each): counting starts from them.
        wait_for(lambda: self.counts or self.errors, timeout_s=30)
        assert not self.errors, self.errors

    def _follow(self, pool: str) -> None:
        core = k8s.CoreV1Api(self._api)
        try:
            for event in self._watch.stream(
                core.list_node, label_selector=f"gpufed.io/pool={pool}", timeout_seconds=600
            ):
                node = event["object"]
                with self._lock:
                    if event["type"] == "DELETED" or node.metadata.deletion_timestamp is not None:
                        self._names.discard(node.metadata.name)
                    else:
                        self._names.add(node.metadata.name)
                        self._created[node.metadata.name] = node.metadata.creation_timestamp.timestamp()
                    if not self.counts or self.counts[-1] != len(self._names):
                        self.counts.append(len(self._names))
        except Exception as error:  # the simulator going away at teardown ends the stream
            if not self._stopped:
                self.errors.append(repr(error))

    def seen(self, count: int) -> bool:
        with self._lock:
            return count in self.counts

    def created_at(self) -> dict[str, float]:
        """When the cluster stamped each node it has had: in whole seconds, rounded down."""
        with self._lock:
            return dict(self._created)

    def most(self) -> int:
        assert not self.errors, self.errors
        with self._lock:
            return max(self.counts)

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()
        self._api.close()


@pytest.fixture
def node_counts(sims: SimProcess) -> Iterator[PoolNodeCounts]:
    counts = PoolNodeCounts(sims.kubeconfig)
    yield counts
    counts.stop()


def _code(fn: Callable[[], object]) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()
        return code
    return grpc.StatusCode.OK


def test_a_gang_that_fits_nowhere_grows_a_pool_runs_and_the_pool_shrinks_after_the_ttl(
    fed: ServerProcess, sims: SimProcess, node_counts: PoolNodeCounts
) -> None:
    assert len(sim_nodes(sims)) == 2
    with fed.client("bob") as bob:
        # As long as the idle TTL: the pool's idle nodes may expire while the gang runs beside them.
        duration = f"{TTL_S:g}s"
        job_id = bob.submit(manifest("big", workers=3, gpus=8, gpu="H100", duration=duration)).job_id

        # While the nodes boot, the job says capacity is on the way.
        def provisioning() -> bool:
            reasons = bob.explain(job_id).reasons
            return any(r.code == "capacity_requested" and "provisioned" in r.message for r in reasons)

        wait_for(provisioning, timeout_s=30)
        with fed.client("infra") as infra:
            (pool,) = CapacityClient(infra).pools().pools
            assert pool.HasField("pending")
            assert (pool.pending.nodes_from, pool.pending.nodes_to) == (2, 6)
            assert list(pool.pending.job_ids) == [job_id]

        wait_for(lambda: node_counts.seen(6), timeout_s=30)
        done = wait_for(lambda: (j := bob.get(job_id)).phase == pb.JOB_PHASE_SUCCEEDED and j, timeout_s=60)
        # No node under the gang was taken away: it ran once, to the end.
        assert done.attempt == 1
        assert done.cluster == "aws-us-east-1"

    # Idle for the TTL, the added nodes go: the cluster is back to the configured two.
    wait_for(lambda: len(sim_nodes(sims)) == 2, timeout_s=TTL_S + 30)
    with fed.client("fin") as fin:
        (pool,) = CapacityClient(fin).pools().pools
        assert not pool.HasField("pending")
        # The added nodes' time, less what the gang used of it, is the pool's idle cost.
        report = fin.report(fmt="table").content
        assert "Idle provisioned capacity" in report
        assert "h100-od" in report.split("Idle provisioned capacity")[1]


def test_a_plan_is_provisioned_before_its_start_and_released_after_its_end(
    fed: ServerProcess, sims: SimProcess, node_counts: PoolNodeCounts
) -> None:
    configured = set(sim_nodes(sims))
    # Time for the calls below before the plan's provisioning starts (it is "scheduled" until then).
    # Its nodes are ready about LEAD_S - BOOT_S before it starts and held idle until it ends: longer
    # than the idle TTL, which must not release them, and time for the checks while they are held.
    start = time.time() + LEAD_S + 4
    end = start + 4
    request = plan_request(
        kind="fixed",
        cluster="aws-us-east-1",
        gpu_type="H100",
        gpus=32,
        start_s=start,
        end_s=end,
        reason="e2e",
    )
    with fed.client("bob") as bob:
        assert _code(lambda: CapacityClient(bob).create_plan(request)) == grpc.StatusCode.PERMISSION_DENIED
    with fed.client("infra") as infra:
        capacity = CapacityClient(infra)
        preview = capacity.preview_plan(request)
        assert [(c.pool, c.nodes_from, c.nodes_to) for c in preview.changes] == [("h100-od", 2, 4)]
        assert preview.usd_per_hour == pytest.approx(32 * 6.88)
        assert preview.total_usd == pytest.approx(32 * 6.88 * (end - (start - LEAD_S)) / 3600, rel=0.05)
        assert capacity.list_plans().plans == []  # a preview stores nothing

        plan = capacity.create_plan(request)
        assert plan.state == "scheduled"
        assert len(sim_nodes(sims)) == 2

        # The lead time before its start, the pool grows; the nodes are there when it starts: by
        # when the cluster stamped them, not when this test sees them (a busy machine delays that).
        wait_for(lambda: node_counts.seen(4), timeout_s=start - time.time() + 30)
        added = [at for name, at in node_counts.created_at().items() if name not in configured]
        assert len(added) == 2
        assert max(added) + 1 <= start, "the plan's nodes should be ready before it starts"
        (listed,) = capacity.list_plans().plans
        assert listed.plan_id == plan.plan_id
        assert listed.state in ("provisioning", "active")
        assert listed.gpus_now == 32

        # Held until its end, whatever the idle TTL says, then released.
        wait_for(lambda: len(sim_nodes(sims)) == 2, timeout_s=end - time.time() + TTL_S + 30)
        assert time.time() >= end, "the plan's nodes went before its end"
        # An ended plan stays listed (issue 30), with what it delivered.
        (ended,) = capacity.list_plans().plans
        assert ended.state == "ended"
        assert ended.gpu_hours > 0


@pytest.fixture(scope="class")
def refusing_fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for a class of cases, on an etcd and a simulator of its own (the worker's etcd is
    emptied by each test that takes it; an etcd starts in a fraction of a second)."""
    root = tmp_path_factory.mktemp("refused-plans")
    etcd = EtcdProcess(root / "etcd")
    etcd.start()
    try:
        with SimProcess(root / "sim", CLUSTERS) as sims, _serve(etcd, root, sims) as process:
            yield process
    finally:
        etcd.stop()


class TestRefusedPlans:
    """Plans refused as invalid, one case a field. A refusal stores nothing (each case checks it), so
    the cases cannot affect each other and share one server (`refusing_fed`) for as long as the
    class runs: starting a server is most of what a case would otherwise take."""

    @pytest.mark.parametrize(
        ("fields", "field"),
        [
            pytest.param({"cluster": "nowhere"}, "cluster", id="unknown-cluster"),
            pytest.param({"gpu_type": "B200"}, "gpu_type", id="gpu-type-not-there"),
            pytest.param({"gpus": 0}, "gpus", id="no-gpus"),
            pytest.param({"gpus": -8}, "gpus", id="negative-gpus"),
            pytest.param({"start_offset_s": 100.0, "end_offset_s": 50.0}, "start", id="start-after-end"),
            pytest.param({"end_offset_s": -10.0}, "end", id="end-in-the-past"),
            pytest.param({"pool": "a100-od"}, "pool", id="unknown-pool"),
            pytest.param({"kind": "forever"}, "kind", id="unknown-kind"),
            pytest.param(
                {"kind": "deadline", "gpus": 0, "job_ids": ["no-such-job"]}, "job_ids[0]", id="unknown-job"
            ),
        ],
    )
    def test_bad_plans_are_refused_naming_the_field_and_nothing_is_stored(
        self, refusing_fed: ServerProcess, fields: dict[str, Any], field: str
    ) -> None:
        now = time.time()
        args: dict[str, Any] = {
            "kind": "fixed",
            "cluster": "aws-us-east-1",
            "gpu_type": "H100",
            "gpus": 16,
            "start_s": now + fields.pop("start_offset_s", 60.0),
            "end_s": now + fields.pop("end_offset_s", 120.0),
        }
        args.update(fields)
        if args["kind"] == "deadline":
            args.pop("start_s")
        with refusing_fed.client("admin") as admin:
            capacity = CapacityClient(admin)
            # The server is the class's: a plan an earlier case let through would show here.
            assert capacity.list_plans(include_ended=True).plans == [], "an earlier case stored a plan"
            with pytest.raises(grpc.RpcError) as refused:
                capacity.create_plan(plan_request(**args))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (refused.value.details() or "").startswith(f"{field}:"), refused.value.details()
            assert capacity.list_plans(include_ended=True).plans == []


def test_plans_are_cancelled_by_infra_and_admins_only(fed: ServerProcess) -> None:
    now = time.time()
    request = plan_request(
        kind="fixed", cluster="aws-us-east-1", gpu_type="H100", gpus=8, start_s=now + 3600, end_s=now + 7200
    )
    with fed.client("admin") as admin:
        plan = CapacityClient(admin).create_plan(request)
    with fed.client("fin") as fin:
        assert (
            _code(lambda: CapacityClient(fin).cancel_plan(plan.plan_id)) == grpc.StatusCode.PERMISSION_DENIED
        )
        assert [p.plan_id for p in CapacityClient(fin).list_plans().plans] == [plan.plan_id]
    with fed.client("infra") as infra:
        cancelled = CapacityClient(infra).cancel_plan(plan.plan_id)
        assert (cancelled.state, cancelled.cancelled_by) == ("cancelled", "infra")
        again = _code(lambda: CapacityClient(infra).cancel_plan(plan.plan_id))
        assert again == grpc.StatusCode.FAILED_PRECONDITION
        assert [p.state for p in CapacityClient(infra).list_plans().plans] == ["cancelled"]
    with fed.client("admin") as admin:
        trail = [(e.user, e.action, e.target) for e in admin.list_audit().events]
        assert ("admin", "capacity_plan_created", plan.plan_id) in trail
        assert ("infra", "capacity_plan_cancelled", plan.plan_id) in trail


def test_a_server_killed_while_nodes_boot_resumes_the_operation_without_asking_twice(
    fed: ServerProcess, node_counts: PoolNodeCounts
) -> None:
    with fed.client("bob") as bob:
        job_id = bob.submit(manifest("big", workers=3, gpus=8, gpu="H100", duration="1s")).job_id
    with fed.client("infra") as infra:
        wait_for(lambda: CapacityClient(infra).pools().pools[0].HasField("pending"), timeout_s=30)
    # The scale-up was in the killed server's simulated cloud: it never lands. The next leader finds
    # the operation in etcd, sees the nodes did not come, and asks for the same count again.
    fed.kill()
    fed.start()

    def succeeded() -> bool:
        with fed.client("bob") as bob:
            return bob.get(job_id).phase == pb.JOB_PHASE_SUCCEEDED

    wait_for(succeeded, timeout_s=90, interval_s=0.5)
    assert node_counts.most() == 6, "the pool should have grown by the gang's four nodes exactly once"
    with fed.client("bob") as bob:
        assert bob.get(job_id).attempt == 1


def test_the_embedded_default_grows_its_simulated_cloud_for_a_gang_and_shrinks_it_again(
    tmp_path: Path,
) -> None:
    """`gpufed up` as shipped, with only the lead time and idle TTL made short."""
    config = tmp_path / "federation.yaml"
    text = default_config_path().read_text()
    # The shipped config boots nodes in the lead time. The TTL is how long the grown pool stays at
    # six nodes before its idle two go: the time the checks below have to see it.
    for key, value in (("leadTimeSeconds", "1"), ("idleTtlSeconds", "3")):
        text, n = re.subn(rf"(\n  {key}: )\S+", rf"\g<1>{value}", text)
        assert n == 1, key
    config.write_text(text)
    state = tmp_path / "state"
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "-m", "federation", "--state-dir", str(state), "up", "--config", str(config),
         "--port", "0", "--metrics-port", "0"],
        stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
    )  # fmt: skip
    node_counts: PoolNodeCounts | None = None
    try:
        wait_for(lambda: (state / ENDPOINT_FILE).exists() or up.poll() is not None, timeout_s=90)
        assert up.poll() is None, "gpufed up exited"
        target = read_endpoint(state)["grpc"]
        wait_until_serving(target)
        kubeconfig = state / "sim" / "kubeconfig"
        assert len(sim_nodes(kubeconfig)) == 2
        node_counts = counts = PoolNodeCounts(kubeconfig)
        with GpufedClient(target, (state / "tokens" / "bob.token").read_text().strip()) as bob:
            job_id = bob.submit(manifest("big", workers=3, gpus=8, gpu="H100", duration="2s")).job_id
            wait_for(lambda: counts.seen(6), timeout_s=60)
            done = wait_for(
                lambda: (j := bob.get(job_id)).phase == pb.JOB_PHASE_SUCCEEDED and j, timeout_s=60
            )
            assert (done.attempt, done.cluster) == (1, "aws-us-east-1")
        wait_for(lambda: len(sim_nodes(kubeconfig)) == 2, timeout_s=60)
    finally:
        if node_counts is not None:
            node_counts.stop()
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        log.close()
