"""`explain` on a real server: a member waiting on its parent tenant's cap is told why, without the
parent's name or figures (which include its sibling tenants' usage); an admin reads them.

Tenant `research` caps A100 at 4 GPUs for itself and its children `vision` and `nlp`. Bob (nlp)
runs a 2-GPU job under that cap; alice's (vision) 4-GPU job then waits on research's cap, whose
figures ("holds 2") are bob's usage.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from tests.e2e.harness import CONFIG, ServerProcess, manifest, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def capped(etcd: EtcdProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    text = CONFIG.read_text().replace(
        "  - name: vision\n  - name: nlp\n",
        "  - name: research\n    gpuCaps: {A100: 4}\n"
        "  - {name: vision, parent: research}\n  - {name: nlp, parent: research}\n",
    )
    assert "research" in text
    config = tmp_path / "federation.yaml"
    config.write_text(text)
    server = ServerProcess(etcd.endpoint, tmp_path / "state", config=config)
    server.start()
    yield server
    server.stop()


def test_a_member_is_told_a_parent_cap_holds_its_job_without_the_parents_name_or_usage(
    capped: ServerProcess,
) -> None:
    with capped.client("bob") as bob:
        running = bob.submit(manifest("bobs-run", gpus=1, duration="10m")).job_id
        wait_for(lambda: bob.get(running).phase == pb.JOB_PHASE_RUNNING, timeout_s=30)
    with capped.client("alice") as alice:
        waiting = alice.submit(manifest("alices-run", gpus=2, duration="1m")).job_id
        reply = wait_for(lambda: r if (r := alice.explain(waiting)).reasons else None, timeout_s=30)
        texts = [reply.summary, *(r.message for r in reply.reasons)]
        assert any(r.code == "tenant_cap_reached" for r in reply.reasons), texts
        joined = "\n".join(texts)
        assert "a parent tenant you cannot read holds as many GPUs of A100 as it may; job needs 4" in joined
        for secret in ("research", "holds 2", "may hold 4", "nlp"):
            assert secret not in joined
    with capped.client("admin") as admin:
        full = "\n".join(r.message for r in admin.explain(waiting).reasons)
        assert "tenant research may hold 4 GPUs of A100, holds 2, job needs 4" in full
