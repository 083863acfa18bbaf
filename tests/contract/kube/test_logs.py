"""Pod logs (API reference, "Read log of the specified Pod"; `kubectl logs`).

GET /api/v1/namespaces/{ns}/pods/{name}/log with `follow`, `tailLines`, `sinceSeconds`, `timestamps`
(each line prefixed with an RFC 3339 time), `limitBytes` and `previous` (the last terminated
instance of the container; a 400 when there is none). `kubectl logs -f` streams lines as they are
written and ends when the container ends.
"""

from __future__ import annotations

import re
import time
from datetime import datetime

import pytest

from tests.contract.kube import facts
from tests.contract.kube.kubectl import Kubectl
from tests.contract.kube.manifests import dump, pod
from tests.contract.kube.official_client import ClientError, OfficialClient, Request
from tests.contract.kube.waits import until

RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)) ")


def _stamp_s(line: str) -> float:
    """The time a `--timestamps` log line was written, in seconds since the epoch."""
    match = RFC3339.match(line)
    assert match, line
    return datetime.fromisoformat(match.group(1).replace("Z", "+00:00")).timestamp()


def _started(kubectl: Kubectl, ns: str, name: str) -> None:
    until(
        lambda: (
            (facts.pod(kubectl, ns, name) or {}).get("status", {}).get("phase") in ("Running", "Succeeded")
        ),
        what=f"pod {name} to start",
    )


def test_logs_tail_timestamps_and_limit(kubectl: Kubectl, official: OfficialClient, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod("talker", seconds=4)))
    until(
        lambda: (facts.pod(kubectl, ns, "talker") or {}).get("status", {}).get("phase") == "Succeeded",
        what="the talker to finish",
    )
    # A finished container's log no longer changes, so whole and tail can be compared.
    whole = kubectl("logs", "talker", "-n", ns).splitlines()
    assert len(whole) >= 3
    tail = kubectl("logs", "talker", "-n", ns, "--tail=2").splitlines()
    assert tail == whole[-2:]
    stamped = kubectl("logs", "talker", "-n", ns, "--timestamps", "--tail=1").splitlines()
    assert len(stamped) == 1
    match = RFC3339.match(stamped[0])
    assert match, stamped
    datetime.fromisoformat(match.group(1).replace("Z", "+00:00"))
    # Both reads in one process of the client (each spends seconds importing it on a busy machine).
    limited, last = official.batch(
        Request.log("talker", ns, limit_bytes=5), Request.log("talker", ns, tail_lines=1)
    )
    assert len(limited.encode()) <= 5
    assert last.strip() == kubectl("logs", "talker", "-n", ns, "--tail=1").strip()


def test_logs_since(kubectl: Kubectl, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod("old-lines", seconds=600)))
    _started(kubectl, ns, "old-lines")
    first = until(
        lambda: kubectl("logs", "old-lines", "-n", ns, "--timestamps").splitlines()[:1],
        what="a first log line",
    )[0]
    # `--since=1s` can leave something out only once a line is older than that: wait until the
    # first is two seconds old (a second of slack for the request and for the clocks' difference).
    until(lambda: time.time() - _stamp_s(first) > 2.0, timeout_s=30, what="the first log line to age")
    recent = kubectl("logs", "old-lines", "-n", ns, "--since=1s", "--timestamps").splitlines()
    everything = kubectl("logs", "old-lines", "-n", ns, "--timestamps").splitlines()
    assert len(recent) < len(everything)
    now = time.time()
    for line in recent:
        match = RFC3339.match(line)
        assert match
        stamp = datetime.fromisoformat(match.group(1).replace("Z", "+00:00")).timestamp()
        assert stamp >= now - 5


def test_logs_follow_streams_and_ends_with_the_container(kubectl: Kubectl, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod("follow-me", seconds=5)))
    _started(kubectl, ns, "follow-me")
    follower = kubectl.popen("logs", "-f", "follow-me", "-n", ns)
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()
        assert first, "a first line arrives while the container runs"
        started = time.monotonic()
        rest = follower.stdout.read()
        assert follower.wait(timeout=60) == 0
        # It ended because the container ended, not because of a request timeout.
        assert time.monotonic() - started < 55
        assert rest.strip(), "more lines were streamed after the first"
    finally:
        follower.kill()
    phase = facts.pod(kubectl, ns, "follow-me")
    assert phase is not None
    assert phase["status"]["phase"] == "Succeeded"


def test_previous_without_a_restart_is_a_400(official: OfficialClient, kubectl: Kubectl, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod("fresh", seconds=600)))
    _started(kubectl, ns, "fresh")
    with pytest.raises(ClientError) as caught:
        official.log("fresh", ns, previous=True)
    assert caught.value.status == 400
    result = kubectl.run("logs", "fresh", "-n", ns, "--previous", check=False)
    assert result.returncode != 0
    assert "previous terminated container" in result.stderr


def test_logs_of_a_missing_pod_is_a_404(official: OfficialClient, ns: str) -> None:
    with pytest.raises(ClientError) as caught:
        official.log("nobody", ns)
    assert caught.value.status == 404
