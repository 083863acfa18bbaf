"""`/readyz`: whether a server is serving, in the sense a restart is timed by (issue 19).

gRPC's health service says SERVING as soon as the port is bound, and by then the job cache and the
ledger cache have been listed (`FederationServer.start` lists them first). That is not yet a
federation that works: the leader has not reconciled its clusters or run a scheduling cycle, so a
queued job would not be admitted and a budget not checked against the archived hours. So a server
is ready when

* its job cache and ledger cache are listed and following etcd (a relist after a broken watch
  makes it unready until it is listed again), and
* it leads and has completed its first pass (a reconciler tick and a scheduling cycle, which reads
  the archived usage from SQL before it plans), or it does not lead and another server holds the
  leader key (a standby serves reads; the leader is someone else's readiness).

A server that neither leads nor sees a leader (just started, or between leaders) is not ready.
A server of role `api` (`gpufed serve --role api`, federation.runtime.role) never leads, and is
ready once its caches are listed, leader or none: its reads need no leader, and a submission is
stored and waits for one, as between leaders; were it unready without a leader, a Service would
take every API server out of rotation the moment the scheduler's servers were all down.
The decision is `judge`, pure; the HTTP handler gathers its inputs. Answers 200 with "ready: ..."
or 503 with "not ready: ...", one line of text, to anyone (it tells nothing a probe may not know).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True, slots=True)
class ReadinessInputs:
    grpc_serving: bool
    jobs_listed: bool
    ledger_listed: bool
    leading: bool
    first_pass_done: bool
    # The identity in the leader key when this server does not lead (None: no key).
    leader_elsewhere: str | None
    # A server of role `api`: never leads, and does not wait for a leader.
    api_only: bool = False


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    why: str


def judge(inputs: ReadinessInputs) -> Readiness:
    if not inputs.grpc_serving:
        return Readiness(False, "gRPC port not serving yet")
    if not inputs.jobs_listed:
        return Readiness(False, "job cache not listed")
    if not inputs.ledger_listed:
        return Readiness(False, "ledger cache not listed")
    if inputs.api_only:
        if inputs.leader_elsewhere is None:
            return Readiness(True, "api, no leader: submissions wait for one")
        return Readiness(True, f"api, leader {inputs.leader_elsewhere}")
    if inputs.leading:
        if inputs.first_pass_done:
            return Readiness(True, "leader, first pass done")
        return Readiness(False, "leader, first pass not done")
    if inputs.leader_elsewhere is not None:
        return Readiness(True, f"standby, leader {inputs.leader_elsewhere}")
    return Readiness(False, "no leader yet")


def readyz_handler(
    gather: Callable[[], Awaitable[ReadinessInputs]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def readyz(request: web.Request) -> web.StreamResponse:
        try:
            verdict = judge(await gather())
        except Exception as error:  # etcd away while reading the leader key: not ready, say why
            verdict = Readiness(False, f"readiness unknown: {error}")
        text = f"{'ready' if verdict.ready else 'not ready'}: {verdict.why}\n"
        return web.Response(text=text, status=200 if verdict.ready else 503)

    return readyz
