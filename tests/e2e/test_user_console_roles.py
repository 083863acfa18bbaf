"""The console as finance, a member and an admin see it, in a real browser (issue 30, item 7).

Against `gpufed up` as a user runs it: where each role lands after sign-in, that every link a role
is shown answers 200 (a member saw a Capacity link that led to a 404; finance landed on a jobs page
it may not use), the jobs page's Reason column and total, and `/clusters`' free GPUs recomputed
from what kubectl shows of the simulated clusters' nodes and pods while a gang sits stuck with its
pods bound (it was counted twice: as used by the cluster and as promised).
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser

from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.console_harness import (
    ConsoleUp,
    chromium,
    requires_chromium,
    sign_in,
    submit,
    wait_for,
)

pytestmark = [pytest.mark.e2e, requires_chromium]


# A gang whose image never pulls: its pods are bound to nodes (the cluster counts their GPUs used)
# and it stays DISPATCHED, with the reason ImagePullBackOff.
STUCK = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: stuck-gang, annotations: {sim.gpufed.io/fail-image-pull: "true"}}
spec:
  gpuTypes: [A100]
  tasks:
    - {name: worker, replicas: 3, image: "pytorch/pytorch:2.3", gpus: 1}
"""

HOMES = {"admin": "/jobs", "alice": "/jobs", "finance": "/finance"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleUp]:
    instance = ConsoleUp(tmp_path_factory.mktemp("roles") / "state")
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def stuck(up: ConsoleUp) -> str:
    job_id = submit(up, "alice", STUCK)

    def pulling() -> bool:
        return bool(up.job_json("alice", job_id).get("reason") == "ImagePullBackOff")

    wait_for(pulling, timeout_s=20, what="the stuck gang waiting on its image")
    return job_id


@pytest.mark.parametrize("user", ["finance", "alice", "admin"])
def test_each_role_lands_on_a_page_it_can_use_and_every_link_it_sees_answers(
    up: ConsoleUp, browser: Browser, stuck: str, user: str
) -> None:
    context, page = sign_in(browser, up, user)
    assert page.url.endswith(HOMES[user])
    nav = [a.get_attribute("href") or "" for a in page.locator("nav#nav a").all()]
    if user == "alice":
        assert "/capacity" not in nav, "a member is shown Capacity, which the API refuses members"
    if user == "finance":
        assert "/jobs" not in nav, "finance is shown Jobs, which the API refuses finance"
    seen: set[str] = set()
    for href in nav:
        response = page.goto(href)
        assert response is not None
        assert response.status == 200, f"{user}: {href} answered {response.status}"
        for a in page.locator("main a[href^='/']").all():
            seen.add(a.get_attribute("href") or "")
    # Every link in the pages' content too (a job's page, a filtered list, the CSV), at most 40.
    for href in sorted(seen)[:40]:
        answer = context.request.get(href, max_redirects=0)
        assert answer.status == 200, f"{user}: {href} answered {answer.status}"
    context.close()


def test_the_jobs_page_shows_a_reason_column_and_the_total(
    up: ConsoleUp, browser: Browser, stuck: str
) -> None:
    context, page = sign_in(browser, up, "alice")
    heads = [h.inner_text().strip() for h in page.locator("table#jobs thead th").all()]
    assert "Reason" in heads
    row = page.locator(f'table#jobs tr[data-job-id="{stuck}"]')
    # A kubelet retries a failing pull: the reason alternates between ErrImagePull (a try) and
    # ImagePullBackOff (the wait before the next), as the Kubernetes documentation describes.
    assert row.locator("td.reason").inner_text().strip() in {"ImagePullBackOff", "ErrImagePull"}
    with up.client("alice") as c:
        mine = len(c.list_all())
    total = page.locator("#jobs-total")
    assert total.get_attribute("data-total") == str(mine)
    assert f"{mine:,} jobs" in total.inner_text()
    # Filtered: the total counts what the filter matches, not the page.
    page.goto("/jobs?phase=DISPATCHED")
    assert page.locator("#jobs-total").get_attribute("data-total") == "1"
    context.close()


def _kubectl(kubeconfig: Path, context: str, *args: str) -> Any:
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), "--context", context, *args, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    return json.loads(out.stdout)


def _gpus(requests: dict[str, str] | None) -> int:
    return int((requests or {}).get("nvidia.com/gpu", "0"))


def kubectl_free(kubeconfig: Path, context: str) -> int:
    """Free GPUs on one cluster as kubectl shows it: the nodes' allocatable GPUs less what every
    pod not finished requests (bound to a node, or pending: promised to a gang placed there)."""
    nodes = _kubectl(kubeconfig, context, "get", "nodes")["items"]
    pods = _kubectl(kubeconfig, context, "get", "pods", "--all-namespaces")["items"]
    allocatable = sum(_gpus(n["status"].get("allocatable")) for n in nodes)
    taken = 0
    for pod in pods:
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        taken += sum(_gpus(c.get("resources", {}).get("requests")) for c in pod["spec"]["containers"])
    return allocatable - taken


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_clusters_free_gpus_agree_with_kubectl_while_a_gang_is_stuck(
    up: ConsoleUp, browser: Browser, stuck: str
) -> None:
    kubeconfig = up.state_dir / "sim" / "kubeconfig"
    contexts = [c["name"] for c in json.loads(
        subprocess.run([KUBECTL or "kubectl", "--kubeconfig", str(kubeconfig), "config", "view", "-o", "json"],
                       capture_output=True, text=True, check=True).stdout)["contexts"]]  # fmt: skip
    # Nothing but the stuck gang is placed: no job admitted or staging whose pods are not yet made.
    with up.client("admin") as c:
        placed = [j for j in c.list_all() if j.cluster and j.phase not in (6, 7, 8)]
    assert [j.job_id for j in placed] == [stuck]
    context, page = sign_in(browser, up, "admin")
    page.goto("/clusters")
    shown: dict[str, int] = defaultdict(int)
    for row in page.locator("section.gpu-type tr[data-cluster]").all():
        cluster = row.get_attribute("data-cluster") or ""
        shown[cluster] += int(row.locator("td.free").inner_text())
    context.close()
    expected = {ctx: kubectl_free(kubeconfig, ctx) for ctx in contexts if ctx in shown}
    assert expected, f"no kubeconfig context names a cluster on the page ({contexts} vs {sorted(shown)})"
    assert {c: shown[c] for c in expected} == expected
