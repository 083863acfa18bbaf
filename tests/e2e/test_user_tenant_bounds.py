"""Issue 30, item 16: every number an admin sets in a tenant document or the config has a sane bound.
`gpufed tenant set -f` against a live server refuses a weight of 1.0e+308 (YAML reads a bare 1e308
as a string, which was refused already) and each other number out of its range, with an error naming
the field, and the stored tenant is unchanged; a config file with such a weight is refused by
`gpufed serve --bootstrap` at start, naming the field.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from federation.cli.main import cli
from federation.runtime.etcd_process import EtcdProcess
from tests.e2e.harness import CONFIG, ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("bounds")
    etcd = EtcdProcess(base / "etcd")
    etcd.start()
    process = ServerProcess(etcd.endpoint, base / "state")
    try:
        process.start()
        yield process
    finally:
        process.stop()
        etcd.stop()


def _gpufed(server: ServerProcess, *args: str, stdin: str = "") -> tuple[int, str]:
    token = server.state_dir / "tokens" / "admin.token"
    result = CliRunner().invoke(
        cli, ["--server", server.target, "--token-file", str(token), *args], input=stdin
    )
    return result.exit_code, result.output


# Each document is the vision tenant with one number out of range, and the field the error must name.
OUT_OF_RANGE = {
    "weight": ("weight: 1.0e+308", "weight", "from 0.001 to 1,000"),
    "weight just over": ("weight: 1000.5", "weight", "from 0.001 to 1,000"),
    "gpuCaps": ("gpuCaps: {A100: 1000000000000}", "gpuCaps.A100", "from 0 to 1,000,000"),
    "quota cap": ("quotas: {A100: {guaranteed: 8, cap: 10000000000}}", "quotas.A100.cap", "1,000,000"),
    "quota guarantee": ("quotas: {A100: {guaranteed: 10000000000}}", "quotas.A100.guaranteed", "1,000,000"),
    "budget": ("monthlyBudgetGpuHours: 1.0e+300", "monthlyBudgetGpuHours", "from 0 to"),
    "submit rate": ("submitRateLimit: {perSecond: 1.0e+300}", "submitRateLimit.perSecond", "from 0.001 to"),
    "queue limit": ("maxQueuedJobs: 1000000000000", "maxQueuedJobs", "from 1 to 100,000,000"),
    "no queue at all": ("maxQueuedJobs: 0", "maxQueuedJobs", "from 1 to 100,000,000"),
    "submit burst": (
        "submitRateLimit: {perSecond: 5, burst: 10000000000}",
        "submitRateLimit.burst",
        "from 1",
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_tenant_set_refuses_a_number_out_of_range_naming_it(server: ServerProcess, case: str) -> None:
    line, field, bound = OUT_OF_RANGE[case]
    before = _gpufed(server, "tenant", "get", "vision", "-o", "json")
    code, output = _gpufed(server, "tenant", "set", "-f", "-", stdin=f"name: vision\n{line}\n")
    assert code != 0, output
    assert "INVALID_ARGUMENT" in output, output
    assert field in output, output
    assert bound in output, output
    assert _gpufed(server, "tenant", "get", "vision", "-o", "json") == before


def test_the_largest_weight_is_taken(server: ServerProcess) -> None:
    code, output = _gpufed(server, "tenant", "set", "-f", "-", stdin="name: nlp\nweight: 1000\n")
    assert code == 0, output
    code, output = _gpufed(server, "tenant", "get", "nlp")
    assert code == 0, output
    assert "1000" in output, output


def test_a_config_with_a_huge_weight_is_refused_at_start_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "federation.yaml"
    config.write_text(
        CONFIG.read_text().replace("  - name: vision\n", "  - name: vision\n    weight: 1.0e+308\n", 1)
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "federation",
            "--state-dir",
            str(tmp_path / "s"),
            "serve",
            "--etcd",
            "http://127.0.0.1:1",
            "--bootstrap",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    assert "tenants[1].weight" in done.stdout + done.stderr, done.stderr[-2000:]
