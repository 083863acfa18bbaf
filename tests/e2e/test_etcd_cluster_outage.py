"""`gpufed serve` on a three-member etcd cluster while its members die under load (issue 16).

One member killed: the clients notice only latency (the server's etcd client moves to another
member). Two killed: the cluster has no quorum, so calls fail with UNAVAILABLE within their
deadline instead of hanging. Both back: service resumes, and every job the server acknowledged is
there once and finishes. The member killed first is the one the server talks to (the first listed),
the worst case. Figures (latency with one member down, time to UNAVAILABLE with two down, time to
resume) are printed, and written to `<tmp>/figures.json`, for docs/reliability.md.

And `gpufed serve` on a cluster that demands TLS client certificates: with `--etcd-cacert`,
`--etcd-cert` and `--etcd-key` it serves (through a member's death too); with the CA alone it exits
naming etcd.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from federation.api.client import GpufedClient
from federation.api.v1 import gpufed_pb2 as pb
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.etcd_cluster import EtcdCluster, make_certs

# With the other three-member-cluster tests, one at a time (tests/conftest.py, ETCD_CLUSTER_GROUP).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("etcd-cluster")]

# Each phase lasts until the load has made this many answered submissions in it, rather than a fixed
# time: on a busy machine the calls are slower, and a fixed phase held fewer of them. One down, the
# submissions need a leader, so the phase also outlasts the election of a new one when the member
# killed was the leader.
BASELINE_SUBMITS = 20
ONE_DOWN_SUBMITS = 20
BACK_SUBMITS = 5
# How long each job runs: the jobs only have to finish once the members are back. At 1 s each, the
# two hundred the load made in fixed phases took 40 s to run through the federation's 16 GPUs.
JOB_DURATION = "100ms"
# The server's leader lease (etcd's least, instead of 5 s): with no quorum the leader loses it, and
# once the members are back the server leads again only after the old lease has run out, while the
# jobs wait to be scheduled.
LEASE_TTL_ARGS = ("--lease-ttl-s", "2")
# The server's per-member etcd deadline (`gpufed serve --etcd-timeout-s`, 5 s by default): how long a
# call waits on a member that does not answer before it tries the next, or fails with no quorum. Set
# as an operator who wants outages to fail fast would; the bounds below scale with it. (At 5 s, the
# two-down phase alone took 15 s: the call caught by the kill meets two deadlines, the next one more.)
ETCD_TIMEOUT_S = 2.5
SERVER_ARGS = (*LEASE_TTL_ARGS, "--etcd-timeout-s", str(ETCD_TIMEOUT_S))
# A call that meets one deadline and is then answered by another member, with room for a busy machine.
ONE_RETRY_S = 2 * ETCD_TIMEOUT_S + 2.0


@dataclass
class Call:
    phase: str
    op: str
    started_s: float
    took_s: float
    code: str  # "OK" or the gRPC status code's name


@dataclass
class Load:
    """One client submitting (each with a key of its own) and reading back, call after call."""

    server: ServerProcess
    phase: str = "baseline"
    calls: list[Call] = field(default_factory=list)
    acked: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    refused: list[str] = field(default_factory=list)  # keys whose submission failed
    stop: threading.Event = field(default_factory=threading.Event)

    def _call(self, op: str, fn: object) -> object:
        phase, started = self.phase, time.monotonic()
        try:
            result = fn()  # type: ignore[operator]
            code = "OK"
        except grpc.RpcError as error:
            result, code = None, error.code().name
        self.calls.append(Call(phase, op, started, time.monotonic() - started, code))
        return result

    def run(self) -> None:
        token = (self.server.state_dir / "tokens" / "alice.token").read_text().strip()
        with GpufedClient(self.server.target, token, timeout_s=15) as alice:
            i = 0
            while not self.stop.is_set():
                key = f"k{i}"
                reply = self._call(
                    "submit",
                    lambda k=key: alice.submit(manifest(k, duration=JOB_DURATION), idempotency_key=k),
                )
                if isinstance(reply, pb.SubmitJobResponse):
                    self.acked[key] = reply.job_id
                    self._call("get", lambda j=reply.job_id: alice.get(j))
                else:
                    self.refused.append(key)
                i += 1
                time.sleep(0.05)

    def of(self, phase: str) -> list[Call]:
        return [c for c in self.calls if c.phase == phase]

    def answered_submits(self, phase: str, *, started_after: float = 0.0) -> int:
        return sum(
            c.op == "submit" and c.code == "OK" and c.started_s > started_after for c in self.of(phase)
        )


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def test_one_member_down_costs_latency_two_fail_fast_and_their_return_loses_nothing(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path / "etcd")
    cluster.start()
    server = ServerProcess(cluster.endpoint, tmp_path / "state", extra_args=SERVER_ARGS)
    server.start()
    load = Load(server)
    thread = threading.Thread(target=load.run, daemon=True, name="load")
    figures: dict[str, float] = {}
    try:
        thread.start()
        wait_for(lambda: load.answered_submits("baseline") >= BASELINE_SUBMITS, timeout_s=60)

        load.phase = "one-down"
        cluster.kill(0)
        first_dead_at = time.monotonic()
        wait_for(
            lambda: load.answered_submits("one-down", started_after=first_dead_at) >= ONE_DOWN_SUBMITS,
            timeout_s=60,
        )

        load.phase = "two-down"
        killed_at = time.monotonic()
        cluster.kill(1)
        # The load is one call at a time: a call caught by the kill itself can take two deadlines.
        # Keep the phase until a submission that began after the kill has settled.
        wait_for(
            lambda: any(c.op == "submit" and c.started_s > killed_at + 1.0 for c in load.of("two-down")),
            timeout_s=60,
        )
        # (The load's next call is already under way; it may end after the restart below.)

        load.phase = "back"
        back_at = time.monotonic()
        cluster.restart(0)
        cluster.restart(1)
        members_back_s = time.monotonic() - back_at
        wait_for(lambda: any(c.code == "OK" and c.started_s > back_at for c in load.of("back")), timeout_s=60)
        # Service resumed, not one lucky call: the load goes on being answered.
        wait_for(lambda: load.answered_submits("back", started_after=back_at) >= BACK_SUBMITS, timeout_s=60)
    finally:
        load.stop.set()
        thread.join(timeout=30)

    try:
        baseline, one_down, two_down, back = (
            load.of(p) for p in ("baseline", "one-down", "two-down", "back")
        )
        # One member down: nothing but latency. A submission in flight at the very instant of the
        # kill may have its outcome unknown (UNAVAILABLE; its retry with the same key is safe): at
        # most that one call, and no read. (A read caught by a slow election once failed here at
        # 5.01 s: the server's etcd client gave up after one round of the members, though the last
        # live one had just answered "leader changed". It now goes round again on that answer.)
        failed = [c for c in one_down if c.code != "OK"]
        assert len(failed) <= 1, failed
        assert all(c.op == "submit" and c.code == "UNAVAILABLE" for c in failed), failed
        assert len(one_down) > 10, "the load kept going"
        # Latency only: every call under the server's per-member deadline, except the one caught by
        # the kill, which may meet that deadline at the dying member (or at a member electing a new
        # leader) and then be answered by another: one deadline plus the retry, as in the two-down
        # phase below. (Seen at 5.02 s on a loaded machine with the default 5 s deadline.)
        slow = [c for c in one_down if c.took_s >= ETCD_TIMEOUT_S]
        assert len(slow) <= 1, slow
        assert max(c.took_s for c in one_down) < ONE_RETRY_S

        # Two down: no quorum, so every submission that started after the kill and ended before the
        # members came back fails with UNAVAILABLE, each within its deadline (the client's own is
        # 15 s): no hang. (A call still in flight at the restart may succeed: it is not counted.) A
        # read of a job the server already holds is answered from its watch-fed cache (GetJob reads
        # etcd only for a job it does not hold), so reads may still succeed. (Not counted either: a
        # call begun just after the kill, which may queue behind a transaction the kill caught, sent
        # first by group commit, and so meet two deadlines.)
        settled = [c for c in two_down if c.started_s > killed_at + 1.0 and c.started_s + c.took_s < back_at]
        assert settled, ("calls were made with two members down", two_down, back, killed_at)
        submits = [c for c in settled if c.op == "submit"]
        assert submits, ("a submission was made with two members down", settled)
        assert {c.code for c in submits} == {"UNAVAILABLE"}, (killed_at, back_at, submits)
        assert {c.code for c in settled} <= {"UNAVAILABLE", "OK"}, {c.code for c in settled}
        # A call that began after the kill meets one deadline at the member left without a quorum;
        # the one in flight at the kill may meet the dying member's first. None reaches the client's
        # own 15 s: UNAVAILABLE, never a hang.
        assert max(c.took_s for c in settled) < ONE_RETRY_S
        assert max(c.took_s for c in two_down) < 15.0
        first_refusal = min(
            (c for c in two_down if c.code == "UNAVAILABLE"), key=lambda c: c.started_s + c.took_s
        )

        first_ok = min((c for c in back if c.code == "OK"), key=lambda c: c.started_s + c.took_s)
        ok = [c.took_s for c in baseline if c.code == "OK"]
        ok_one = [c.took_s for c in one_down if c.code == "OK"]
        figures = {
            "baseline_p50_ms": 1000 * _p(ok, 50),
            "baseline_max_ms": 1000 * max(ok),
            "one_down_p50_ms": 1000 * _p(ok_one, 50),
            "one_down_max_ms": 1000 * max(ok_one),
            "one_down_failed_calls": len(failed),
            "two_down_first_unavailable_after_s": first_refusal.started_s + first_refusal.took_s - killed_at,
            "two_down_call_max_s": max(c.took_s for c in two_down),
            "members_back_healthy_s": members_back_s,
            "resumed_after_restart_s": first_ok.started_s + first_ok.took_s - back_at,
            "calls": len(load.calls),
        }
        print(json.dumps(figures, indent=2))
        (tmp_path / "figures.json").write_text(json.dumps(figures, indent=2))

        # Back: everything acknowledged is there, once, and finishes; what was refused during the
        # outage is retried with its key and made exactly once.
        with server.client("alice") as alice:
            for key in load.refused[:3]:
                reply = alice.submit(manifest(key, duration=JOB_DURATION), idempotency_key=key)
                again = alice.submit(manifest(key, duration=JOB_DURATION), idempotency_key=key)
                assert (again.created, again.job_id) == (False, reply.job_id)
                load.acked[key] = reply.job_id
            wait_for(
                lambda: all(
                    j.phase == pb.JOB_PHASE_SUCCEEDED
                    for j in alice.list_all()
                    if j.job_id in load.acked.values()
                ),
                timeout_s=120,
            )
            jobs = alice.list_all()
        ids = [j.job_id for j in jobs]
        assert set(load.acked.values()) <= set(ids), "an acknowledged job was lost"
        assert len(ids) == len(set(ids))
        names = [j.name for j in jobs]
        assert len(names) == len(set(names)), "a submission was made twice"
    finally:
        server.stop()
        cluster.stop()


def test_serve_on_a_tls_cluster_with_a_client_certificate_and_not_without(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    cluster = EtcdCluster(tmp_path / "etcd", tls=certs.server)
    cluster.start()
    assert certs.client.cert is not None
    assert certs.client.key is not None
    flags = ("--etcd-cacert", str(certs.client.ca), "--etcd-cert", str(certs.client.cert),
             "--etcd-key", str(certs.client.key))  # fmt: skip
    server = ServerProcess(cluster.endpoint, tmp_path / "state", extra_args=flags)
    # The CA alone (no client certificate): etcd refuses the handshake, and serve says so and exits.
    # Started now, beside the server with a certificate, which it needs nothing of: one after the
    # other, the two spent about 5 s each, most of it starting Python.
    refused = subprocess.Popen(
        [sys.executable, "-m", "federation", "--state-dir", str(tmp_path / "other"), "serve",
         "--etcd", cluster.endpoint, "--etcd-cacert", str(certs.client.ca), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        server.start()
        with server.client("alice") as alice:
            job_id = alice.submit(manifest("over-tls", duration=JOB_DURATION), idempotency_key="tls").job_id
            cluster.kill(0)
            wait_for(lambda: alice.get(job_id).phase == pb.JOB_PHASE_SUCCEEDED, timeout_s=60)
        _, refused_stderr = refused.communicate(timeout=60)
    finally:
        if refused.poll() is None:
            refused.kill()
            refused.communicate()
        server.stop()
        cluster.stop()
    assert refused.returncode != 0
    assert "etcd at" in refused_stderr, refused_stderr[-2000:]
