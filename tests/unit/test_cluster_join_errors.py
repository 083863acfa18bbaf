"""`cluster join` and `cluster check` against a cluster that is not there: a clear word, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clusters.kubernetes.check import Verdict, check
from clusters.kubernetes.join import JoinFailed, join
from datasync.loopback_ports import free_port


@pytest.fixture
def dead_kubeconfig(tmp_path: Path) -> Path:
    # A port nothing listens on: the connection is refused at once.
    server = f"https://127.0.0.1:{free_port()}"
    path = tmp_path / "dead.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "d", "cluster": {"server": server}}],
                "users": [{"name": "d", "user": {"token": "t"}}],
                "contexts": [{"name": "d", "context": {"cluster": "d", "user": "d"}}],
                "current-context": "d",
            }
        )
    )
    return path


def test_join_says_the_api_did_not_answer(dead_kubeconfig: Path) -> None:
    with pytest.raises(JoinFailed, match=r"the cluster's API at https://127\.0\.0\.1:\d+ did not answer"):
        join(dead_kubeconfig, None, timeout_s=3)


def test_join_says_the_admin_kubeconfig_cannot_be_loaded(tmp_path: Path) -> None:
    broken = tmp_path / "broken.kubeconfig"
    broken.write_text("clusters: [")
    with pytest.raises(JoinFailed, match="cannot load the admin kubeconfig"):
        join(broken, None, timeout_s=3)


def test_check_names_reachability_as_missing(dead_kubeconfig: Path) -> None:
    report = check("gone", dead_kubeconfig, None, timeout_s=3)
    assert not report.ok
    [finding] = report.findings
    assert (finding.check, finding.verdict) == ("reachable", Verdict.MISSING)
    assert "join again" in finding.fix
