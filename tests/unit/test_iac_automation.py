"""The Automation API driver with an injected `PulumiCommand`: the sequence of CLI calls, the stack
config, the backend settings, error mapping, one operation per stack, and the cost shown first.

The fake command answers as the CLI does (stack outputs, history, the preview's summary event over
the event log), so the real `pulumi.automation` code runs between our driver and it. A test at the
end runs the real CLI where `pulumi` is installed (it is not on the machines this is built on).
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

from iac.api import PermanentIacError, RetryableIacError
from iac.automation import PulumiProvisioner, classify, stack_name
from iac.pools import Cloud, PoolSpec

SPEC = PoolSpec(
    cloud=Cloud.AWS,
    cluster="aws-us-east-1",
    name="h100",
    gpu_type="H100",
    instance_type="p5.48xlarge",
    region="us-east-1",
    max_nodes=8,
    usd_per_gpu_hour=6.88,
    settings=(("eksCluster", "gpu-prod"), ("nodeRoleArn", "arn:aws:iam::1:role/n"), ("subnetIds", "s-1")),
)


class FakePulumi(auto.PulumiCommand):
    """Records every CLI call; answers like the CLI; fails the calls it is told to."""

    def __init__(self, failures: Mapping[str, tuple[str, int]] | None = None, delay_s: float = 0.0) -> None:
        self.command = "pulumi"
        # Before 3.206 the CLI writes engine events to a file rather than a gRPC stream: the simpler
        # protocol to fake, and the Automation API still speaks it.
        self.version = VersionInfo.parse("3.200.0")
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        self.cwds: list[str] = []
        self.failures = dict(failures or {})
        self.delay_s = delay_s
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
            time.sleep(self.delay_s)
            verb = args[0]
            if verb in self.failures:
                stderr, code = self.failures[verb]
                raise auto.errors.create_command_error(CommandResult(stdout="", stderr=stderr, code=code))
            if verb == "preview":
                self._summary_event(args, {"create": 1})
            out = ""
            if args[:2] == ["stack", "output"]:
                out = json.dumps({"pool_id": SPEC.pool_id, "nodes": 3})
            elif args[:2] == ["stack", "history"]:
                out = json.dumps([{"version": 1, "kind": "update", "startTime": "2026-11-24T00:00:00.000Z",
                                   "message": "", "environment": {}, "config": {}, "result": "succeeded",
                                   "endTime": "2026-11-24T00:00:01.000Z", "resourceChanges": {"create": 1}}])  # fmt: skip
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
        return [
            [a for a in args if not a.startswith("--client") and not a.startswith("tcp://")]
            for args, _ in self.calls
        ]


def _provisioner(tmp_path: Path, fake: FakePulumi, **kw: Any) -> PulumiProvisioner:
    return PulumiProvisioner(state_dir=tmp_path, passphrase="s3cret", command=fake, **kw)


async def test_apply_selects_the_pools_own_stack_sets_its_region_and_runs_up(tmp_path: Path) -> None:
    fake = FakePulumi()
    result = await _provisioner(tmp_path, fake, lead_time_s=300.0, clock=lambda: 1000.0).apply(SPEC, 3)
    assert (result.pool_id, result.nodes, result.ready_at_s) == ("aws-us-east-1.h100", 3, 1300.0)
    name = stack_name(SPEC)
    assert name == "aws-us-east-1.h100"
    verbs = [v[:3] for v in fake.verbs()]
    assert verbs[:3] == [
        ["stack", "select", "--stack"],
        ["config", "set-all", "--stack"],
        ["up", "--yes", "--skip-preview"],
    ]
    config = fake.calls[1][0]
    assert "aws:region=us-east-1" in config
    up_args, env = fake.calls[2]
    assert up_args[-2:] == ["--stack", name]
    assert env["PULUMI_CONFIG_PASSPHRASE"] == "s3cret"
    # The project's backend is a local file backend under the state directory, in the project
    # settings the CLI reads from its working directory.
    project = (Path(fake.cwds[0]) / "Pulumi.yaml").read_text()
    assert f"url: file://{tmp_path / 'pulumi'}" in project
    assert (tmp_path / "pulumi").is_dir()


async def test_preview_shows_the_cost_per_hour_before_and_after(tmp_path: Path) -> None:
    fake = FakePulumi()
    provisioner = _provisioner(tmp_path, fake)
    await provisioner.apply(SPEC, 1)
    preview = await provisioner.preview(SPEC, 4)
    assert (preview.nodes_before, preview.nodes_after) == (1, 4)
    assert preview.usd_per_hour_before == pytest.approx(8 * 6.88)
    assert preview.usd_per_hour_after == pytest.approx(4 * 8 * 6.88)
    assert dict(preview.steps) == {"create": 1}
    assert fake.verbs()[-1][0] == "preview"


async def test_destroy_and_refresh_read_back_the_node_count(tmp_path: Path) -> None:
    fake = FakePulumi()
    provisioner = _provisioner(tmp_path, fake)
    assert await provisioner.refresh(SPEC) == 3
    await provisioner.destroy(SPEC)
    verbs = [v[0] for v in fake.verbs()]
    assert "refresh" in verbs
    assert "destroy" in verbs


@pytest.mark.parametrize(
    ("stderr", "code", "retryable"),
    [
        pytest.param(
            "error: [409] Conflict: Another update is currently in progress.",
            255,
            True,
            id="concurrent-update",
        ),
        pytest.param(
            "error: operation error EKS: CreateNodegroup, Throttling: Rate exceeded",
            255,
            True,
            id="throttled",
        ),
        pytest.param("error: dial tcp: connection reset by peer", 255, True, id="network"),
        pytest.param(
            "error: InsufficientInstanceCapacity ... VcpuLimitExceeded: quota", 255, False, id="quota"
        ),
        pytest.param(
            "error: AccessDeniedException: not authorized to perform eks:CreateNodegroup",
            255,
            False,
            id="denied",
        ),
        pytest.param("error: something nobody has seen", 255, False, id="unknown-is-permanent"),
    ],
)
async def test_errors_are_mapped_to_retryable_or_permanent(
    tmp_path: Path, stderr: str, code: int, retryable: bool
) -> None:
    fake = FakePulumi(failures={"up": (stderr, code)})
    with pytest.raises((RetryableIacError, PermanentIacError)) as raised:
        await _provisioner(tmp_path, fake).apply(SPEC, 2)
    assert raised.value.retryable is retryable
    assert isinstance(
        classify(auto.ConcurrentUpdateError(CommandResult("", "conflict", 1))), RetryableIacError
    )


async def test_one_operation_per_stack_at_a_time_and_a_timeout(tmp_path: Path) -> None:
    fake = FakePulumi(delay_s=0.1)
    provisioner = _provisioner(tmp_path, fake)
    await asyncio.gather(provisioner.apply(SPEC, 1), provisioner.apply(SPEC, 2), provisioner.apply(SPEC, 3))
    assert fake.most_in_flight == 1, "two operations ran on one stack at once"
    slow = _provisioner(tmp_path, FakePulumi(delay_s=0.5), timeout_s=0.2)
    with pytest.raises(RetryableIacError, match="did not finish"):
        await slow.apply(SPEC, 1)


def test_the_passphrase_never_shows_in_the_provisioners_repr(tmp_path: Path) -> None:
    assert "s3cret" not in repr(_provisioner(tmp_path, FakePulumi()))


@pytest.mark.skipif(
    shutil.which("pulumi") is None, reason="the Pulumi CLI is not installed here (see README)"
)
async def test_a_real_preview_with_the_pulumi_cli_and_a_local_backend(tmp_path: Path) -> None:
    provisioner = PulumiProvisioner(state_dir=tmp_path, passphrase="test")
    with pytest.raises(PermanentIacError):
        # No AWS credentials in a test: the real CLI runs the program, and the provider refuses.
        await provisioner.preview(SPEC, 1)
