"""One job's page: its spec, attempts, describe view, wait reasons and logs, and the cancel form.

Three reads, at once: GetJob (the canonical manifest and the phase history), DescribeJob (attempts,
replicas, Kubernetes events: the `gpufed describe` view), ExplainJob (the wait reasons of the last
scheduling cycle). Another tenant's job is NOT_FOUND from each, so the page is the one 404. The
phase follows the job by `/jobs/{id}/events`; the logs by `/jobs/{id}/logs/events` (StreamLogs).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
from aiohttp import web

from federation.api import convert
from federation.api.v1 import gpufed_pb2 as pb
from federation.console import sse
from federation.console.calls import CALLS_KEY, CallRefused
from federation.console.jobs import TERMINAL, job_state
from federation.console.layout import e, html_response, render_page, see_other, table, when
from federation.console.view import VIEW_KEY, View
from federation.store.money import format_usd, micro_usd_of

LOG_TAIL_LINES = 500
# The plain-text log download: more, but still bounded.
LOG_TEXT_TAIL_LINES = 20_000
MAX_CANCEL_REASON = 256
# Between tries to read the logs of a job whose pods have not started yet.
LOG_RETRY_S = 1.0


def _seconds(ts: object) -> float:
    return float(getattr(ts, "seconds", 0)) + float(getattr(ts, "nanos", 0)) / 1e9


def _kv(pairs: list[tuple[str, str]]) -> str:
    return '<dl class="kv">' + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in pairs) + "</dl>"


def _cost(job: pb.Job) -> str:
    """As `gpufed get` says it: to the cent from the API's exact figure, or that it never ran."""
    if not job.cost_usd:
        return "none: no attempt has run"
    so_far = "" if job.phase in TERMINAL else " so far"
    return f"${format_usd(micro_usd_of(job.cost_usd), places=2)}{so_far} (USD {job.cost_usd})"


def _spec(job: pb.Job, description: pb.JobDescription | None) -> str:
    pairs = [
        ("Job id", job.job_id),
        ("Name", job.name),
        ("Tenant", job.tenant),
        ("User", job.user),
        ("Priority class", f"{job.priority_class} ({job.priority})"),
        ("GPUs", f"{job.gpu_count} in {job.replica_count} replicas"),
        ("GPU types", " | ".join(job.gpu_types)),
        ("Dataset", job.dataset or "none"),
        ("Submitted", when(_seconds(job.submitted_at))),
    ]
    if job.cluster:
        pairs.append(
            (
                "Placed on",
                f"{job.cluster}: {job.gpu_type}, {job.capacity_kind}, ${job.usd_per_gpu_hour:.2f}/GPU-hour",
            )
        )
    pairs.append(("Cost", _cost(job)))
    summary = ""
    if description is not None and description.spec_summary:
        summary = "<ul>" + "".join(f"<li>{e(line)}</li>" for line in description.spec_summary) + "</ul>"
    manifest = (
        f"<details><summary>Manifest (canonical)</summary><pre>{e(job.manifest)}</pre></details>"
        if job.manifest
        else ""
    )
    head = '<section id="spec" aria-labelledby="spec-h"><h2 id="spec-h">Spec</h2>'
    return f"{head}{_kv(pairs)}{summary}{manifest}</section>"


def _attempts(description: pb.JobDescription | None, unavailable: str) -> str:
    head = '<section id="attempts" aria-labelledby="attempts-h"><h2 id="attempts-h">Attempts</h2>'
    if description is None:
        return f'{head}<p class="muted">{e(unavailable)}</p></section>'
    if not description.attempts:
        return f'{head}<p class="muted">No attempt yet: the job has not been placed.</p></section>'
    rows = "".join(
        "<tr>"
        f'<td class="num">{a.attempt}</td><td>{e(a.cluster)}</td><td>{e(a.gpu_type)}</td>'
        f'<td>{e(a.capacity_kind)}</td><td class="num">{a.usd_per_gpu_hour:.2f}</td>'
        f"<td>{e(when(_seconds(a.started_at)))}</td><td>{e(when(_seconds(a.finished_at)))}</td>"
        f"<td>{e(a.outcome or 'running')}</td><td>{e(a.reason)}</td><td>{e(a.note)}</td>"
        "</tr>"
        for a in description.attempts
    )
    headers = ("Attempt", "Cluster", "GPU type", "Kind", "$/GPU-hour", "Started", "Finished", "Outcome")
    columns = (*headers, "Reason", "Note")
    return f"{head}{table(columns, rows, numeric=('Attempt', '$/GPU-hour'))}</section>"


def _describe(job: pb.Job, description: pb.JobDescription | None) -> str:
    parts = ['<section id="describe" aria-labelledby="describe-h"><h2 id="describe-h">Describe</h2>']
    if description is not None:
        for a in description.attempts:
            parts.append(f"<h3>Attempt {a.attempt} on {e(a.cluster or 'no cluster')}</h3>")
            if a.replicas:
                rows = "".join(
                    f"<tr><td>{e(r.task)}-{r.replica}</td><td>{e(r.pod)}</td><td>{e(r.node)}</td>"
                    f'<td>{e(r.phase)}</td><td class="num">{r.restarts}</td>'
                    f"<td>{'' if not r.HasField('exit_code') else r.exit_code}</td>"
                    f"<td>{e(r.reason)}</td><td>{e(r.message)}</td></tr>"
                    for r in a.replicas
                )
                columns = ("Replica", "Pod", "Node", "Phase", "Restarts", "Exit", "Reason", "Message")
                parts.append(table(columns, rows, numeric=("Restarts",)))
            if a.events:
                items = "".join(
                    f"<li>{e(when(_seconds(ev.last_at)))} {e(ev.type)} "
                    f"{e(ev.object_kind)}/{e(ev.object_name)}: "
                    f"{e(ev.reason)} {e(ev.message)}{f' (x{ev.count})' if ev.count > 1 else ''}</li>"
                    for ev in a.events
                )
                parts.append(f"<ul>{items}</ul>")
    history = "".join(
        f"<tr><td>{e(when(_seconds(ev.at)))}</td><td>{e(convert.phase_name(ev.phase))}</td>"
        f'<td class="num">{ev.attempt}</td><td>{e(ev.reason)}</td></tr>'
        for ev in job.events
    )
    parts.append(
        "<h3>Phase history</h3>" + table(("When", "Phase", "Attempt", "Why"), history, numeric=("Attempt",))
    )
    if job.message:
        parts.append(f"<p>Message: {e(job.message)}</p>")
    parts.append("</section>")
    return "".join(parts)


def _where(reason: pb.WaitReason) -> str:
    where = ", ".join(x for x in (reason.cluster, reason.gpu_type) if x)
    return f" ({e(where)})" if where else ""


def _wait_reasons(explain: pb.ExplainJobResponse | None) -> str:
    head = '<section id="wait-reasons" aria-labelledby="wait-h"><h2 id="wait-h">Wait reasons</h2>'
    if explain is None:
        return f'{head}<p class="muted">Not available.</p></section>'
    reasons = "".join(
        f"<li><strong>{e(r.code)}</strong>: {e(r.message)}{_where(r)}</li>" for r in explain.reasons
    )
    listing = f"<ul>{reasons}</ul>" if reasons else ""
    return f'{head}<p id="job-summary">{e(explain.summary)}</p>{listing}</section>'


def _logs(job: pb.Job) -> str:
    live = job.phase not in TERMINAL
    base = f"/jobs/{e(job.job_id)}/logs"
    return (
        '<section id="logs" aria-labelledby="logs-h"><h2 id="logs-h">Logs</h2>'
        '<p><label class="inline-check"><input type="checkbox" id="log-follow"'
        f"{' checked' if live else ''}> Follow</label> "
        f'<a href="{base}">Plain text</a> <span id="log-notice" class="muted" role="status"></span></p>'
        f'<pre id="log-output" data-events="{base}/events" tabindex="0" aria-label="Log output"></pre>'
        "</section>"
    )


def _cancel(view: View, job: pb.Job) -> str:
    if job.phase in TERMINAL or view.role not in ("admin", "member"):
        return ""
    if job.cancel_requested:
        return '<p class="muted">Cancellation requested; the job stops shortly.</p>'
    return (
        f'<form id="cancel" method="post" action="/jobs/{e(job.job_id)}/cancel" class="inline">'
        f'<input type="hidden" name="csrf" value="{e(view.csrf)}">'
        f'<label>Reason (optional)<input name="reason" maxlength="{MAX_CANCEL_REASON}"></label>'
        '<button type="submit" class="danger">Cancel job</button></form>'
    )


async def job_page(request: web.Request) -> web.StreamResponse:
    view = request[VIEW_KEY]
    job_id = request.match_info["job_id"]
    calls = request.app[CALLS_KEY]
    job: pb.Job = await calls.call(request, "GetJob", pb.GetJobRequest(job_id=job_id))
    # The job is the caller's to read (else GetJob was NOT_FOUND): describe and explain at once.
    described: object
    explained: object
    described, explained = await asyncio.gather(
        calls.call(request, "DescribeJob", pb.DescribeJobRequest(job_id=job_id)),
        calls.call(request, "ExplainJob", pb.ExplainJobRequest(job_id=job_id)),
        return_exceptions=True,
    )
    for outcome in (described, explained):
        if isinstance(outcome, BaseException) and not isinstance(outcome, CallRefused):
            raise outcome
        if isinstance(outcome, CallRefused) and outcome.code is grpc.StatusCode.NOT_FOUND:
            raise outcome
    description = described if isinstance(described, pb.JobDescription) else None
    unavailable = described.details if isinstance(described, CallRefused) else ""
    explain = explained if isinstance(explained, pb.ExplainJobResponse) else None
    phase = convert.phase_name(job.phase)
    body = (
        f'<p>Phase: <span id="job-phase" class="phase" data-events="/jobs/{e(job.job_id)}/events" '
        f'role="status">{e(phase)}</span>'
        f"{' (cancellation requested)' if job.cancel_requested and job.phase not in TERMINAL else ''}"
        f" · attempt {job.attempt}{f' · {e(job.reason)}' if job.reason else ''}</p>"
        + _cancel(view, job)
        + _spec(job, description)
        + _attempts(description, unavailable)
        + _describe(job, description)
        + _wait_reasons(explain)
        + _logs(job)
    )
    title = f"Job {job.name}"
    return html_response(render_page(view, page="job", title=title, body=body))


async def job_events(request: web.Request) -> web.StreamResponse:
    job_id = request.match_info["job_id"]
    calls = request.app[CALLS_KEY]
    last: dict[str, object] = {}
    # Read once before the stream opens: a foreign or unknown id is the one 404, not an event.
    await calls.call(request, "GetJob", pb.GetJobRequest(job_id=job_id))

    async def fetch() -> tuple[list[sse.Event], bool]:
        job: pb.Job = await calls.call(request, "GetJob", pb.GetJobRequest(job_id=job_id))
        state = job_state(job)
        if state == last:
            return [], False
        last.clear()
        last.update(state)
        explain: pb.ExplainJobResponse = await calls.call(
            request, "ExplainJob", pb.ExplainJobRequest(job_id=job_id)
        )
        return [("job", {**state, "summary": explain.summary})], job.phase in TERMINAL

    return await sse.poll(request, fetch)


def _log_request(job_id: str, *, follow: bool, tail: int) -> pb.StreamLogsRequest:
    return pb.StreamLogsRequest(job_id=job_id, follow=follow, tail_lines=tail)


def _chunk_text(chunk: pb.LogChunk) -> str:
    prefix = f"[{chunk.task}-{chunk.replica}] " if chunk.task else ""
    return "".join(f"{prefix}{line}\n" for line in chunk.lines)


def _chunk_events(chunk: pb.LogChunk) -> list[sse.Event]:
    events: list[sse.Event] = []
    if chunk.notice:
        events.append(("notice", chunk.notice))
    if chunk.lines:
        events.append(("log", _chunk_text(chunk)))
    return events


async def log_events(request: web.Request) -> web.StreamResponse:
    job_id = request.match_info["job_id"]
    follow = request.query.get("follow", "1") == "1"
    calls = request.app[CALLS_KEY]
    # Read the job first, so a foreign or unknown id is the one 404 before any stream opens.
    await calls.call(request, "GetJob", pb.GetJobRequest(job_id=job_id))
    return await sse.relay(request, _followed(request, job_id, follow=follow), _chunk_events)


async def _followed(request: web.Request, job_id: str, *, follow: bool) -> AsyncIterator[pb.LogChunk]:
    """StreamLogs, and with `follow` what `gpufed logs -f` leaves to its user: a page opened while the
    job still waits keeps waiting for its pods, and a requeued job's next attempt is followed too."""
    calls = request.app[CALLS_KEY]
    streamed = 0  # the last attempt streamed to its end
    said_waiting = False
    while True:
        job: pb.Job = await calls.call(request, "GetJob", pb.GetJobRequest(job_id=job_id))
        if job.attempt <= streamed:
            if not follow or job.phase in TERMINAL:
                return
            await asyncio.sleep(LOG_RETRY_S)
            continue
        message = _log_request(job_id, follow=follow, tail=LOG_TAIL_LINES)
        message.attempt = job.attempt
        try:
            async with contextlib.aclosing(calls.stream(request, "StreamLogs", message)) as chunks:
                async for chunk in chunks:
                    yield chunk
        except CallRefused as refusal:
            # FAILED_PRECONDITION: not started yet; NOT_FOUND (the job is ours: GetJob said so just
            # now): placed, but no pod to read yet.
            waiting = refusal.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)
            if not (follow and waiting and job.phase not in TERMINAL):
                raise
            if not said_waiting:
                said_waiting = True
                yield pb.LogChunk(notice="waiting for the job's pods to start")
            await asyncio.sleep(LOG_RETRY_S)
            continue
        streamed = job.attempt
        if not follow:
            return


async def log_text(request: web.Request) -> web.StreamResponse:
    job_id = request.match_info["job_id"]
    calls = request.app[CALLS_KEY]
    await calls.call(request, "GetJob", pb.GetJobRequest(job_id=job_id))
    parts: list[str] = []
    try:
        async for chunk in calls.stream(
            request, "StreamLogs", _log_request(job_id, follow=False, tail=LOG_TEXT_TAIL_LINES)
        ):
            if chunk.notice:
                parts.append(f"# {chunk.notice}\n")
            parts.append(_chunk_text(chunk))
    except CallRefused as refusal:
        if refusal.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED):
            raise
        parts.append(f"# logs unavailable: {refusal.details}\n")
    return web.Response(text="".join(parts), content_type="text/plain")


async def cancel(request: web.Request) -> web.StreamResponse:
    job_id = request.match_info["job_id"]
    form = await request.post()
    reason = form.get("reason")
    text = reason.strip()[:MAX_CANCEL_REASON] if isinstance(reason, str) else ""
    await request.app[CALLS_KEY].call(request, "CancelJob", pb.CancelJobRequest(job_id=job_id, reason=text))
    return see_other(f"/jobs/{job_id}")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/jobs/{job_id}", job_page)
    app.router.add_get("/jobs/{job_id}/events", job_events)
    app.router.add_get("/jobs/{job_id}/logs", log_text)
    app.router.add_get("/jobs/{job_id}/logs/events", log_events)
    app.router.add_post("/jobs/{job_id}/cancel", cancel)
