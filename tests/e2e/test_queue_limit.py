"""End to end, issue 33's bound on memory (`maxQueuedJobs`, federation/api/queue_limit.py), against
`gpufed serve` through the CLI as users meet it:

- a tenant at its queue limit is refused by `gpufed submit` with RESOURCE_EXHAUSTED and the limit
  named, and nothing more of it is stored; its neighbour still submits; an admin who raises the limit
  with `gpufed tenant set` lets the next submission through at once;
- a job set submitted while the tenant's queue is full is accepted with every member held, says why,
  and releases a member as soon as a queued job leaves the queue.

The jobs ask for H100s, which no member cluster has, so they stay queued for as long as the test
needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, run_cli_as, wait_for
from tests.e2e.kube import onprem_a100, serve_clusters

pytestmark = pytest.mark.e2e

CLUSTERS: list[dict[str, Any]] = [onprem_a100(nodes=1)]


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=8,
        tenants=[{"name": "platform"}, {"name": "vision", "maxQueuedJobs": 2}, {"name": "nlp"}],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
            {"name": "bob", "tenant": "nlp"},
        ],
    ) as process:
        yield process


# The CLI as one of the fixture's users (tests/e2e/harness.py).
cli = run_cli_as


def waiting_job(path: Path, name: str) -> Path:
    path.write_text(
        "apiVersion: gpufed.io/v1\nkind: TrainingJob\n"
        f"metadata:\n  name: {name}\n"
        "spec:\n  gpuTypes: [H100]\n"
        '  tasks:\n    - {name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}\n'
    )
    return path


def queued_ids(fed: ServerProcess, user: str) -> list[str]:
    with fed.client(user) as client:
        return [j.job_id for j in client.list_all(phases=[pb.JOB_PHASE_QUEUED])]


def test_a_full_queue_refuses_its_tenant_not_its_neighbour_until_an_admin_raises_it(
    fed: ServerProcess, tmp_path: Path
) -> None:
    for n in (1, 2):
        done = cli(fed, "alice", "submit", str(waiting_job(tmp_path / f"a{n}.yaml", f"a{n}")))
        assert done.returncode == 0, done.stderr
    refused = cli(fed, "alice", "submit", str(waiting_job(tmp_path / "a3.yaml", "a3")))
    assert refused.returncode != 0, refused.stdout
    assert "RESOURCE_EXHAUSTED" in refused.stderr, refused.stderr
    assert "tenant vision has 2 jobs queued and its limit is 2 (maxQueuedJobs)" in refused.stderr
    assert len(queued_ids(fed, "alice")) == 2

    for n in (1, 2, 3):
        done = cli(fed, "bob", "submit", str(waiting_job(tmp_path / f"b{n}.yaml", f"b{n}")))
        assert done.returncode == 0, done.stderr

    document = tmp_path / "vision.yaml"
    document.write_text("name: vision\nmaxQueuedJobs: 3\n")
    raised = cli(fed, "admin", "tenant", "set", "-f", str(document))
    assert raised.returncode == 0, raised.stderr
    shown = cli(fed, "admin", "tenant", "get", "vision")
    assert "maxQueuedJobs: 3" in shown.stdout, shown.stdout
    done = cli(fed, "alice", "submit", str(waiting_job(tmp_path / "a3.yaml", "a3")))
    assert done.returncode == 0, done.stderr
    assert len(queued_ids(fed, "alice")) == 3


def test_a_set_waits_for_room_in_the_queue_and_takes_it_as_it_opens(
    fed: ServerProcess, tmp_path: Path
) -> None:
    first = cli(fed, "alice", "submit", str(waiting_job(tmp_path / "a1.yaml", "a1")))
    assert first.returncode == 0, first.stderr
    second = cli(fed, "alice", "submit", str(waiting_job(tmp_path / "a2.yaml", "a2")))
    assert second.returncode == 0, second.stderr

    done = cli(fed, "alice", "submit", str(waiting_job(tmp_path / "shard.yaml", "shard")), "--array", "0-2")
    assert done.returncode == 0, done.stderr
    assert "held=3" in done.stdout, done.stdout
    described = cli(fed, "alice", "describe", "set", "shard")
    assert "queue is at its limit (maxQueuedJobs)" in described.stdout, described.stdout

    # One queued job leaves the queue: the controller releases one member into the room, no more.
    cancelled = cli(fed, "alice", "cancel", queued_ids(fed, "alice")[0])
    assert cancelled.returncode == 0, cancelled.stderr

    def one_released() -> pb.JobSet | None:
        with fed.client("alice") as alice:
            shown = alice.get_set("shard")
        held = sum(1 for m in shown.members if m.held)
        return shown if held == 2 else None

    wait_for(one_released, timeout_s=30, interval_s=0.2)
    # The list is the server's job cache, which learns of the released member's job from etcd's
    # watch a moment after the set's record shows the release.
    wait_for(lambda: len(queued_ids(fed, "alice")) == 2, timeout_s=30, interval_s=0.2)
    assert one_released() is not None, "a second member was released past the limit"
