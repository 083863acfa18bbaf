"""The Automation API driver with an injected `PulumiCommand`: the sequence of CLI calls, the stack
config, the backend settings, error mapping, one operation per stack, timeouts, and the cost shown
before a change is applied.

The fake command answers as the CLI does (stack outputs, state exports, history, the preview's
summary event over the event log), so the real `pulumi.automation` code runs between our driver and
it. A test at the end runs the real CLI where `pulumi` is installed (it is not on the machines this
is built on).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult, OnOutput
from semver import VersionInfo

from iac import errors
from iac.api import Operation
from iac.automation import PulumiProvisioner, classify, nodes_in_state, stack_name
from iac.pools import Cloud, PoolSpec
from placement.model import ClusterName, GpuType

SPEC = PoolSpec(
    cloud=Cloud.AWS,
    cluster=ClusterName("aws-us-east-1"),
    name="h100",
    gpu_type=GpuType("H100"),
    instance_type="p5.48xlarge",
    region="us-east-1",
    max_nodes=8,
    usd_per_gpu_hour=6.88,
    settings=(("eksCluster", "gpu-prod"), ("nodeRoleArn", "arn:aws:iam::1:role/n"), ("subnetIds", "s-1")),
)
NODE_GROUP_STATE = {
    "version": 3,
    "deployment": {
        "resources": [
            {"urn": "urn:pulumi:s::p::pulumi:pulumi:Stack::p-s", "type": "pulumi:pulumi:Stack"},
            {
                "urn": "urn:x",
                "type": "aws:eks/nodeGroup:NodeGroup",
                "outputs": {"scalingConfig": {"desiredSize": 5}},
            },
        ]
    },
}


class FakePulumi(auto.PulumiCommand):
    """Records every CLI call; answers like the CLI; fails the calls it is told to."""

    def __init__(
        self,
        failures: Mapping[str, tuple[str, int]] | None = None,
        delay_s: float = 0.0,
        nodes: int | None = 1,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.command = "pulumi"
        # Before 3.206 the CLI writes engine events to a file rather than a gRPC stream: the simpler
        # protocol to fake, and the Automation API still speaks it.
        self.version = VersionInfo.parse("3.200.0")
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        self.cwds: list[str] = []
        self.failures = dict(failures or {})
        self.delay_s = delay_s
        self.nodes = nodes
        self.state = state or {"version": 3, "deployment": {"resources": []}}
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0

    def run(
        self,
        args: list[str],
        cwd: str,
        additional_env: Mapping[str, str],
        on_output: OnOutput | None = None,
        on_error: OnOutput | None = None,
    ) -> CommandResult:
        with self.lock:
            self.calls.append((list(args), dict(additional_env)))
            self.cwds.append(cwd)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            verb = args[0]
            if verb in ("up", "preview", "destroy", "refresh"):
                time.sleep(self.delay_s)
            key = args[1] if verb == "stack" else verb
            if key in self.failures:
                stderr, code = self.failures.pop(key) if key == "select" else self.failures[key]
                raise auto.errors.create_command_error(CommandResult(stdout="", stderr=stderr, code=code))
            if verb == "preview":
                self._summary_event(args, {"update": 1, "same": 1})
            out = ""
            if args[:2] == ["stack", "output"]:
                out = json.dumps({} if self.nodes is None else {"pool_id": SPEC.pool_id, "nodes": self.nodes})
            elif args[:2] == ["stack", "export"]:
                out = json.dumps(self.state)
            elif args[:2] == ["stack", "history"]:
                out = json.dumps([{"version": 1, "kind": "update", "startTime": "2026-11-24T00:00:00.000Z",
                                   "message": "", "environment": {}, "config": {}, "result": "succeeded",
                                   "endTime": "2026-11-24T00:00:01.000Z", "resourceChanges": {"update": 1}}])  # fmt: skip
            return CommandResult(stdout=out, stderr="", code=0)
        finally:
            with self.lock:
                self.in_flight -= 1

    @staticmethod
    def _summary_event(args: list[str], changes: dict[str, int]) -> None:
        # The preview's result arrives as engine events in the log the Automation API reads.
        path = Path(args[args.index("--event-log") + 1])
        event = {"sequence": 1, "timestamp": 0, "summaryEvent": {"maybeCorrupt": False, "durationSeconds": 0,
                                                                 "resourceChanges": changes, "policyPacks": {}}}  # fmt: skip
        with path.open("a") as log:
            log.write(json.dumps(event) + "\n")

    def verbs(self) -> list[list[str]]:
        """The calls without the per-run flags (event logs, engine addresses, exec kinds)."""
        skip = ("--client", "--event-log", "--exec-kind", "--exec-agent")
        out = []
        for args, _ in self.calls:
            kept: list[str] = []
            drop_next = False
            for a in args:
                if drop_next:
                    drop_next = False
                    continue
                if a.startswith(skip):
                    drop_next = "=" not in a and a not in ("--client",)
                    continue
                if a.startswith(("tcp://", "127.0.0.1:")):
                    continue
                kept.append(a)
            out.append(kept)
        return out


def _provisioner(tmp_path: Path, fake: FakePulumi, **kw: Any) -> PulumiProvisioner:
    return PulumiProvisioner(state_dir=tmp_path, passphrase="s3cret", command=fake, **kw)


async def test_apply_selects_the_pools_own_stack_sets_its_config_and_runs_up(tmp_path: Path) -> None:
    fake = FakePulumi(nodes=1)
    result = await _provisioner(tmp_path, fake, clock=lambda: 1000.0).apply(SPEC, 3)
    assert (result.pool_id, result.nodes_before, result.nodes, result.ready_at_s) == (
        "aws-us-east-1.h100",
        1,
        3,
        1000.0,
    )
    assert (result.usd_per_hour_before, result.usd_per_hour_after) == pytest.approx((8 * 6.88, 3 * 8 * 6.88))
    name = stack_name(SPEC)
    assert name == "aws-us-east-1.h100"
    verbs = [v[:2] for v in fake.verbs()]
    assert verbs == [
        ["stack", "select"],
        ["config", "set-all"],
        ["stack", "output"],
        ["stack", "output"],
        ["up", "--yes"],
        ["stack", "output"],
        ["stack", "output"],
        ["stack", "history"],
    ], fake.verbs()
    assert fake.calls[0][0] == ["stack", "select", "--stack", name]
    assert "aws:region=us-east-1" in fake.calls[1][0]
    up_args, env = fake.calls[4]
    assert "--skip-preview" in up_args
    assert up_args[-2:] == ["--stack", name]
    backend = f"file://{tmp_path / 'pulumi'}"
    assert env["PULUMI_CONFIG_PASSPHRASE"] == "s3cret"
    assert env["PULUMI_BACKEND_URL"] == backend
    # The same backend in the project settings the CLI reads from its working directory, which
    # is the stack's own under the state directory.
    assert set(fake.cwds) == {str(tmp_path / "work" / name)}
    assert f"url: {backend}" in (tmp_path / "work" / name / "Pulumi.yaml").read_text()
    assert (tmp_path / "pulumi").is_dir()


async def test_a_pool_without_a_stack_gets_one_with_passphrase_secrets(tmp_path: Path) -> None:
    fake = FakePulumi(
        nodes=None, failures={"select": ("error: no stack named 'aws-us-east-1.h100' found", 255)}
    )
    await _provisioner(tmp_path, fake).apply(SPEC, 1)
    assert [v[:2] for v in fake.verbs()][:3] == [
        ["stack", "select"],
        ["stack", "init"],
        ["config", "set-all"],
    ]
    init = fake.calls[1][0]
    assert init[init.index("--secrets-provider") + 1] == "passphrase"
    assert init[2] == "aws-us-east-1.h100"


async def test_a_bucket_backend_is_passed_through(tmp_path: Path) -> None:
    fake = FakePulumi()
    provisioner = PulumiProvisioner(
        state_dir=tmp_path, passphrase="p", backend_url="s3://gpufed-state?region=us-east-1", command=fake
    )
    await provisioner.apply(SPEC, 1)
    assert {env["PULUMI_BACKEND_URL"] for _, env in fake.calls} == {"s3://gpufed-state?region=us-east-1"}
    assert not (tmp_path / "pulumi").exists()


@pytest.mark.parametrize(
    ("spec_change", "expected"),
    [
        pytest.param({}, {"aws:region": "us-east-1"}, id="aws"),
        pytest.param(
            {
                "cloud": Cloud.GCP,
                "instance_type": "a3-highgpu-8g",
                "region": "us-east4",
                "settings": (("gkeCluster", "c"), ("project", "ml-prod")),
            },
            {"gcp:project": "ml-prod", "gcp:region": "us-east4"},
            id="gcp",
        ),
        pytest.param(
            {
                "cloud": Cloud.AZURE,
                "name": "ndh100",
                "instance_type": "Standard_ND96isr_H100_v5",
                "region": "eastus",
                "settings": (("resourceGroup", "rg"), ("aksCluster", "aks")),
            },
            {"azure-native:location": "eastus"},
            id="azure",
        ),
    ],
)
async def test_the_stack_config_names_the_region_per_cloud(
    tmp_path: Path, spec_change: dict[str, Any], expected: dict[str, str]
) -> None:
    from dataclasses import replace

    fake = FakePulumi()
    await _provisioner(tmp_path, fake).apply(replace(SPEC, **spec_change), 1)
    config = fake.calls[1][0]
    assert config[:2] == ["config", "set-all"]
    assert {a for a in config if "=" in a} == {f"{k}={v}" for k, v in expected.items()}


async def test_preview_shows_the_cost_per_hour_before_and_after_and_applies_nothing(tmp_path: Path) -> None:
    fake = FakePulumi(nodes=1)
    preview = await _provisioner(tmp_path, fake).preview(SPEC, 4)
    assert (preview.nodes_before, preview.nodes_after) == (1, 4)
    assert preview.usd_per_hour_before == pytest.approx(8 * 6.88)
    assert preview.usd_per_hour_after == pytest.approx(4 * 8 * 6.88)
    assert preview.usd_per_hour_delta == pytest.approx(3 * 8 * 6.88)
    assert dict(preview.steps) == {"update": 1, "same": 1}
    verbs = [v[0] for v in fake.verbs()]
    assert "preview" in verbs
    assert "up" not in verbs


async def test_a_new_pool_previews_from_zero(tmp_path: Path) -> None:
    preview = await _provisioner(tmp_path, FakePulumi(nodes=None)).preview(SPEC, 2)
    assert (preview.nodes_before, preview.usd_per_hour_before) == (0, 0.0)


async def test_refresh_reads_the_real_count_from_the_refreshed_state(tmp_path: Path) -> None:
    fake = FakePulumi(nodes=3, state=NODE_GROUP_STATE)
    status = await _provisioner(tmp_path, fake).refresh(SPEC)
    assert (status.exists, status.nodes, status.ready_nodes) == (True, 5, 5)
    verbs = [v[0] if v[0] != "stack" else f"stack {v[1]}" for v in fake.verbs()]
    assert verbs.index("refresh") < verbs.index("stack export"), verbs


@pytest.mark.parametrize(
    ("cloud", "resource", "count"),
    [
        pytest.param(Cloud.AWS, {"type": "aws:eks/nodeGroup:NodeGroup", "outputs": {"scalingConfig": {"desiredSize": 4}}}, 4, id="eks"),
        pytest.param(Cloud.GCP, {"type": "gcp:container/nodePool:NodePool", "outputs": {"nodeCount": 2}}, 2, id="gke"),
        pytest.param(Cloud.AZURE, {"type": "azure-native:containerservice:AgentPool", "outputs": {"count": 7}}, 7, id="aks"),
        pytest.param(Cloud.AWS, {"type": "gcp:container/nodePool:NodePool", "outputs": {"nodeCount": 2}}, None, id="no-such-pool"),
    ],
)  # fmt: skip
def test_the_node_count_is_read_from_each_clouds_state(
    cloud: Cloud, resource: dict[str, Any], count: int | None
) -> None:
    from dataclasses import replace

    assert nodes_in_state(replace(SPEC, cloud=cloud), {"resources": [resource]}) == count


async def test_destroy_runs_destroy_on_the_pools_stack(tmp_path: Path) -> None:
    fake = FakePulumi(nodes=2)
    result = await _provisioner(tmp_path, fake).destroy(SPEC)
    assert (result.nodes_before, result.nodes, result.usd_per_hour_after) == (2, 0, 0.0)
    verbs = [v[0] if v[0] != "stack" else f"stack {v[1]}" for v in fake.verbs()]
    assert verbs[:2] == ["stack select", "config"]
    assert "destroy" in verbs
    assert "up" not in verbs


async def test_nothing_runs_when_busy_nodes_would_be_removed(tmp_path: Path) -> None:
    fake = FakePulumi(nodes=4)
    provisioner = _provisioner(tmp_path, fake)
    with pytest.raises(errors.BusyNodesProtected):
        await provisioner.apply(SPEC, 1, busy_nodes=2)
    with pytest.raises(errors.BusyNodesProtected):
        await provisioner.destroy(SPEC, busy_nodes=1)
    assert fake.calls == []


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        pytest.param("error: [409] Conflict: Another update is currently in progress.", errors.StackBusy, id="concurrent-update"),
        pytest.param("error: the stack is currently locked by 1 lock(s). Either wait for the other process(es) to end", errors.StackBusy, id="file-backend-lock"),
        pytest.param("error: operation error EKS: CreateNodegroup, https response error StatusCode: 400, Throttling: Rate exceeded", errors.Throttled, id="throttled"),
        pytest.param("error: googleapi: Error 429: Too Many Requests", errors.Throttled, id="gcp-429"),
        pytest.param("error: dial tcp: lookup eks.us-east-1.amazonaws.com: no such host", errors.NetworkError, id="dns"),
        pytest.param("error: read tcp 10.0.0.1:443: connection reset by peer", errors.NetworkError, id="reset"),
        pytest.param("error: waiting for EKS Node Group create: timeout while waiting for state to become 'ACTIVE'", errors.OperationTimedOut, id="cloud-timeout"),
        pytest.param("error: InsufficientInstanceCapacity: We currently do not have sufficient p5.48xlarge capacity", errors.CapacityUnavailable, id="no-capacity-aws"),
        pytest.param("error: googleapi: Error 503: ZONE_RESOURCE_POOL_EXHAUSTED", errors.CapacityUnavailable, id="no-capacity-gcp"),
        pytest.param("error: VcpuLimitExceeded: You have requested more vCPU capacity than your current vCPU limit", errors.QuotaExceeded, id="quota-aws"),
        pytest.param("error: Quota 'NVIDIA_H100_GPUS' exceeded. Limit: 0.0 in region us-east4.", errors.QuotaExceeded, id="quota-gcp"),
        pytest.param("error: AccessDeniedException: User is not authorized to perform eks:CreateNodegroup", errors.PermissionDenied, id="denied"),
        pytest.param("error: AuthorizationFailed: The client does not have authorization to perform action", errors.PermissionDenied, id="azure-denied"),
        pytest.param("error: InvalidParameterException: Subnet s-1 does not exist", errors.InvalidConfig, id="invalid"),
        pytest.param("error: something nobody has seen", errors.InvalidConfig, id="unknown-is-permanent"),
    ],
)  # fmt: skip
async def test_cli_errors_are_mapped_to_retryable_or_permanent(
    tmp_path: Path, stderr: str, kind: type[errors.IacError]
) -> None:
    fake = FakePulumi(failures={"up": (stderr, 255)})
    with pytest.raises(errors.IacError) as raised:
        await _provisioner(tmp_path, fake).apply(SPEC, 2)
    assert type(raised.value) is kind
    retryable = issubclass(kind, errors.RetryableIacError)
    assert raised.value.retryable is retryable
    assert isinstance(raised.value, errors.RetryableIacError if retryable else errors.PermanentIacError)
    assert stderr.removeprefix("error: ")[:30] in str(raised.value)


def test_pulumis_own_concurrent_update_error_is_retryable() -> None:
    mapped = classify(auto.ConcurrentUpdateError(CommandResult("", "conflict", 1)))
    assert isinstance(mapped, errors.StackBusy)
    assert mapped.retryable


async def test_one_operation_per_stack_at_a_time_but_stacks_run_side_by_side(tmp_path: Path) -> None:
    from dataclasses import replace

    fake = FakePulumi(delay_s=0.1)
    provisioner = _provisioner(tmp_path, fake)
    await asyncio.gather(*(provisioner.apply(SPEC, n) for n in (1, 2, 3)))
    assert fake.most_in_flight == 1, "two operations ran on one stack at once"
    other = FakePulumi(delay_s=0.3)
    two = _provisioner(tmp_path, other)
    await asyncio.gather(two.apply(SPEC, 1), two.apply(replace(SPEC, name="h100-b"), 1))
    assert other.most_in_flight == 2, "different pools' stacks should not wait for each other"


async def test_a_timed_out_operation_keeps_its_stack_locked_until_the_cli_ends(tmp_path: Path) -> None:
    fake = FakePulumi(delay_s=0.5)
    provisioner = _provisioner(tmp_path, fake, timeout_s=0.2, clock=lambda: 50.0)
    with pytest.raises(errors.OperationTimedOut, match=r"did not finish in 0\.2s"):
        await provisioner.apply(SPEC, 3)
    status = await provisioner.status(SPEC)
    assert [(p.operation, p.nodes_to, p.started_at_s) for p in status.pending] == [
        (Operation.SCALE_UP, 3, 50.0)
    ]
    fake.delay_s = 0.0
    await asyncio.wait_for(provisioner.apply(SPEC, 3), timeout=5)
    assert fake.most_in_flight == 1, "a second operation started beside the one that timed out"
    assert (await provisioner.status(SPEC)).pending == ()


def test_the_passphrase_never_shows_in_the_provisioners_repr(tmp_path: Path) -> None:
    assert "s3cret" not in repr(_provisioner(tmp_path, FakePulumi()))


@pytest.mark.skipif(
    shutil.which("pulumi") is None, reason="the Pulumi CLI is not installed on this machine (see docs/iac.md)"
)
async def test_a_real_preview_with_the_pulumi_cli_and_a_local_backend(tmp_path: Path) -> None:
    provisioner = PulumiProvisioner(state_dir=tmp_path, passphrase="test", timeout_s=600)
    # No AWS credentials in a test: the real CLI creates the stack in the file backend, runs the
    # program, and the provider refuses for want of credentials (a permanent error).
    with pytest.raises(errors.PermanentIacError):
        await provisioner.preview(SPEC, 1)
    assert list((tmp_path / "pulumi").rglob("*.json")), "the stack was not created in the file backend"
