"""checkov, a policy linter, over every example's render: no check fails, and each waived one is
waived on its object with a reason and listed in docs/deploy.md. checkov takes 9 s of CPU to start
(9 s on a quiet machine, 20 to 45 s beside other work), over the suite's budget for a module once
the suite's workers share the cores, so this module runs in
`make chart-policy`, which `.ci/run` calls after `make test` (tests/deploy/conftest.py keeps it out
of the suite's collection)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.deploy.chart import CHECKOV, DEPLOY_DOC, EXAMPLES, ensure_tools, template

# Each waiver, and why, is in the chart beside the object (a `checkov.io/skipN` annotation) and in
# docs/deploy.md ("Policy check (checkov) and its waivers").
WAIVED = {"CKV_K8S_43", "CKV_K8S_15", "CKV_K8S_35"}


def _checkov(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(CHECKOV), "-d", str(directory), "--framework", "kubernetes", "--compact", "--skip-download",
         "-o", "json"],
        capture_output=True,
        text=True,
        timeout=170,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr[-2000:]
    reports = json.loads(result.stdout)
    return reports if isinstance(reports, list) else [reports]


def test_checkov_passes_every_example_with_only_documented_waivers(tmp_path: Path) -> None:
    ensure_tools("deploy-tools", ".venv-checkov/bin/checkov")
    for path in EXAMPLES:
        render = template(path)
        assert render.code == 0, render.stderr
        (tmp_path / path.name).write_text(render.stdout)
    (report,) = _checkov(tmp_path)
    results = report["results"]
    failed = [(c["check_id"], c["check_name"], c["resource"]) for c in results["failed_checks"]]
    assert failed == []
    assert report["summary"]["parsing_errors"] == 0
    objects = sum(len(template(p).docs) for p in EXAMPLES)
    # checkov counts each workload's containers as resources of their own, besides the objects.
    assert report["summary"]["resource_count"] >= objects
    assert report["summary"]["passed"] > 100
    skipped = results["skipped_checks"]
    assert {c["check_id"] for c in skipped} <= WAIVED
    for check in skipped:
        # A waiver without a reason is no waiver.
        assert len(check["check_result"].get("suppress_comment") or "") > 30, check["check_id"]
    documented = DEPLOY_DOC.read_text().split("### Policy check (checkov) and its waivers", 1)[1]
    for check_id in WAIVED:
        assert check_id in documented
