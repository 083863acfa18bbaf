"""`/capacity`: the scalable node pools, the changes under way, and the capacity plans on a timeline.

Two calls as the signed-in user, the ones `gpufed capacity pools` and `gpufed capacity plan list
--all` make: ListCapacityPools and ListCapacityPlans. The API lets admin, infra and finance read
them; a member is refused, and the console shows its not-found page as for any refused page.

The timeline is an SVG with one bar per plan from its start to its end, coloured by state, and a
line at now; plans that ended more than a week ago are left off (`gpufed capacity plan list --all`
has them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web
from google.protobuf.timestamp_pb2 import Timestamp

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY
from federation.console.charts import Marker, Segment, legend, stacked_bar, table, utc_text
from federation.console.layout import e, html_response, render_page
from federation.console.view import VIEW_KEY, View

HOUR_S = 3600.0
DAY_S = 86400.0
# Plans that ended longer ago than this stay off the page.
KEEP_ENDED_S = 7 * DAY_S
TICK_STEPS_S = (
    HOUR_S,
    3 * HOUR_S,
    6 * HOUR_S,
    12 * HOUR_S,
    DAY_S,
    2 * DAY_S,
    7 * DAY_S,
    14 * DAY_S,
    30 * DAY_S,
    91 * DAY_S,
)
STATES = ("scheduled", "provisioning", "active", "ended", "cancelled")


def seconds(ts: Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


@dataclass(frozen=True, slots=True)
class PlanSpan:
    plan: pb.CapacityPlan
    start_s: float
    end_s: float


def plan_span(plan: pb.CapacityPlan) -> PlanSpan:
    """Where a plan sits in time: a deadline plan has no start of its own and runs from its creation."""
    start = seconds(plan.start) if plan.HasField("start") else seconds(plan.created_at)
    end = seconds(plan.end) if plan.HasField("end") else start
    return PlanSpan(plan, start, max(start, end))


def shown_plans(plans: Sequence[pb.CapacityPlan], now_s: float) -> list[PlanSpan]:
    spans = [plan_span(p) for p in plans]
    return [s for s in spans if s.plan.state not in ("ended", "cancelled") or s.end_s >= now_s - KEEP_ENDED_S]


def _tick_step(span_s: float, most: int = 8) -> float:
    for step in TICK_STEPS_S:
        if span_s / step <= most:
            return step
    return TICK_STEPS_S[-1] * max(1.0, span_s / (TICK_STEPS_S[-1] * most))


def timeline(spans: Sequence[PlanSpan], now_s: float, *, width: int = 960) -> str:
    """An SVG with a bar per plan from start to end, and now marked."""
    label_w, row_h, top, bottom = 190, 24, 26, 8
    lo = min([now_s - 6 * HOUR_S, *(s.start_s for s in spans)])
    hi = max([now_s + 6 * HOUR_S, *(s.end_s for s in spans)])
    # A little room either side, so a bar at an edge is not cut by the frame.
    pad = (hi - lo) * 0.02
    lo, hi = lo - pad, hi + pad
    inner = width - label_w - 10
    height = top + row_h * max(1, len(spans)) + bottom

    def x(at_s: float) -> float:
        return label_w + inner * (at_s - lo) / (hi - lo)

    parts = [
        f'<svg id="plan-timeline" class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{e(_timeline_words(spans, now_s))}">'
    ]
    step = _tick_step(hi - lo)
    fmt = "%m-%d %H:%M" if step < DAY_S else "%Y-%m-%d"
    tick = (lo // step + 1) * step
    while tick < hi:
        tx = x(tick)
        parts.append(
            f'<line class="grid" x1="{tx:.1f}" y1="{top - 6}" x2="{tx:.1f}" y2="{height - bottom}"/>'
            f'<text class="tick" x="{tx:.1f}" y="{top - 10}" text-anchor="middle">'
            f"{e(utc_text(tick, fmt).removesuffix(' UTC'))}</text>"
        )
        tick += step
    for i, span in enumerate(spans):
        p = span.plan
        y = top + i * row_h
        x0, x1 = x(span.start_s), x(span.end_s)
        what = f"{p.gpus} {p.gpu_type}" if p.kind == "fixed" else f"{len(p.job_ids)} job(s), {p.gpu_type}"
        words = (
            f"{p.plan_id} ({p.state}): {what} in {p.cluster}, {utc_text(span.start_s)} to "
            f"{utc_text(span.end_s)}; {p.gpus_now} GPUs held now, ${p.usd_per_hour:,.2f}/h"
        )
        state = p.state if p.state in STATES else "other"
        # The words go after the bar, or before it where they would run off the right edge.
        text_x, anchor = x1 + 4, ""
        if x1 + 160 > width:
            text_x, anchor = (
                (x0 - 4, ' text-anchor="end"') if x0 - 160 > label_w else (width - 4, ' text-anchor="end"')
            )
        parts.append(
            f'<g class="plan" data-plan-id="{e(p.plan_id)}" data-state="{e(state)}">'
            f'<text class="plan-label" x="{label_w - 8}" y="{y + 16}" text-anchor="end">{e(p.plan_id)}</text>'
            f'<rect class="plan-bar state-{e(state)}" x="{x0:.1f}" y="{y + 4}" '
            f'width="{max(2.0, x1 - x0):.1f}" height="{row_h - 8}"><title>{e(words)}</title></rect>'
            f'<text class="plan-text" x="{text_x:.1f}" y="{y + 16}"{anchor}>'
            f"{e(what)} · {e(p.cluster)}</text></g>"
        )
    nx = x(now_s)
    parts.append(
        f'<line id="timeline-now" class="now" x1="{nx:.1f}" y1="{top - 6}" x2="{nx:.1f}" '
        f'y2="{height - bottom}"><title>now, {e(utc_text(now_s))}</title></line>'
        f'<text class="now-label" x="{nx + 3:.1f}" y="{height - 1}">now</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def _timeline_words(spans: Sequence[PlanSpan], now_s: float) -> str:
    if not spans:
        return f"No capacity plans; now is {utc_text(now_s)}"
    return f"{len(spans)} capacity plan(s) on a timeline; now is {utc_text(now_s)}"


def _pending_text(c: pb.PendingPoolChange) -> str:
    parts = [f"{c.nodes_from} → {c.nodes_to} nodes"]
    if c.reason:
        parts.append(c.reason)
    if c.HasField("started_at"):
        parts.append(f"since {utc_text(seconds(c.started_at), '%H:%M:%S')}")
    if c.last_error:
        parts.append(f"FAILED x{c.attempts}: {c.last_error}")
        if c.HasField("next_try_at"):
            parts.append(f"next try {utc_text(seconds(c.next_try_at), '%H:%M:%S')}")
    elif c.HasField("ready_at"):
        parts.append(f"ready ~{utc_text(seconds(c.ready_at), '%H:%M:%S')}")
    # The reconciler's reason usually names the jobs already ("4 node(s) for <job>"): say each once.
    unnamed_jobs = [j for j in c.job_ids if j not in c.reason]
    if unnamed_jobs:
        parts.append("for " + ", ".join(unnamed_jobs))
    unnamed_plans = [p for p in c.plan_ids if p not in c.reason]
    if unnamed_plans:
        parts.append("plans " + ", ".join(unnamed_plans))
    return "; ".join(parts)


def _nodes_bar(p: pb.CapacityPool) -> str:
    idle = max(0, p.ready_nodes - p.busy_nodes)
    booting = max(0, p.nodes - p.ready_nodes)
    words = (
        f"{p.cluster}/{p.pool}: {p.busy_nodes} busy, {idle} idle, {booting} booting nodes "
        f"(min {p.min_nodes}, max {p.max_nodes})"
    )
    markers = [Marker("mark-guarantee", p.min_nodes, f"min {p.min_nodes}")] if p.min_nodes else []
    if p.HasField("pending"):
        markers.append(Marker("mark-target", p.pending.nodes_to, f"target {p.pending.nodes_to}"))
    return stacked_bar(
        [
            Segment("seg-used", p.busy_nodes, f"{p.busy_nodes} busy"),
            Segment("seg-ready", idle, f"{idle} ready, idle"),
            Segment("seg-promised", booting, f"{booting} booting"),
        ],
        scale=max(p.max_nodes, p.nodes, 1),
        label=words,
        markers=markers,
        track=p.max_nodes,
    )


def _pool_rows(pools: Sequence[pb.CapacityPool]) -> str:
    rows = []
    for p in pools:
        # In short: "Operations under way" above says the whole of it.
        pending = "-"
        if p.HasField("pending"):
            pending = f"{p.pending.nodes_from} → {p.pending.nodes_to} nodes"
            if p.pending.last_error:
                pending += f", failing (x{p.pending.attempts})"
        if p.note:
            pending += f" ({p.note})"
        rows.append(
            f'<tr data-cluster="{e(p.cluster)}" data-pool="{e(p.pool)}">'
            f'<th scope="row">{e(p.cluster)}/{e(p.pool)}</th>'
            f"<td>{p.gpus_per_node}&times;{e(p.gpu_type)}</td><td>{e(p.capacity_kind)}</td>"
            f'<td class="num nodes">{p.nodes}</td><td class="num">{p.ready_nodes}</td>'
            f'<td class="num">{p.busy_nodes}</td><td class="num">{p.min_nodes}&ndash;{p.max_nodes}</td>'
            f'<td class="num">${p.usd_per_gpu_hour:,.2f}</td><td class="num">${p.usd_per_hour:,.2f}</td>'
            f'<td class="chart">{_nodes_bar(p)}</td><td class="pending">{e(pending)}</td></tr>'
        )
    return "<tbody>" + "".join(rows) + "</tbody>"


def _failing(p: pb.CapacityPool) -> str:
    return ' class="failing"' if p.pending.last_error else ""


def _operations(pools: Sequence[pb.CapacityPool]) -> str:
    busy = [p for p in pools if p.HasField("pending")]
    if not busy:
        return '<p class="empty" id="no-operations">No pool is growing or shrinking.</p>'
    items = "".join(
        f'<li data-cluster="{e(p.cluster)}" data-pool="{e(p.pool)}"{_failing(p)}>'
        f"<strong>{e(p.cluster)}/{e(p.pool)}</strong> ({p.gpus_per_node}&times;{e(p.gpu_type)}): "
        f"{e(_pending_text(p.pending))}</li>"
        for p in busy
    )
    return f'<ul id="operations">{items}</ul>'


def _plan_rows(spans: Sequence[PlanSpan]) -> str:
    rows = []
    for s in spans:
        p = s.plan
        gpus = f"{p.gpus} {p.gpu_type}" if p.kind == "fixed" else f"{len(p.job_ids)} job(s), {p.gpu_type}"
        rows.append(
            f'<tr data-plan-id="{e(p.plan_id)}"><th scope="row">{e(p.plan_id)}</th><td>{e(p.kind)}</td>'
            f'<td class="state"><span class="badge state-{e(p.state)}">{e(p.state)}</span></td>'
            f"<td>{e(p.cluster)}{('/' + e(p.pool)) if p.pool else ''}</td><td>{e(gpus)}</td>"
            f"<td>{e(utc_text(s.start_s))}</td><td>{e(utc_text(s.end_s))}</td>"
            f'<td class="num">{p.gpus_now}</td><td class="num">${p.usd_per_hour:,.2f}</td>'
            f"<td>{e(p.created_by)}</td><td>{e(p.reason)}{(' — ' + e(p.note)) if p.note else ''}</td></tr>"
        )
    return "<tbody>" + "".join(rows) + "</tbody>"


def render_capacity(
    pools: pb.ListCapacityPoolsResponse, plans: Sequence[pb.CapacityPlan], now_s: float
) -> str:
    ceiling = pools.spend_ceiling_usd_per_hour
    spend = stacked_bar(
        [Segment("seg-used", pools.usd_per_hour, f"${pools.usd_per_hour:,.2f}/h")],
        scale=max(ceiling, pools.usd_per_hour, 1.0),
        label=f"spend ${pools.usd_per_hour:,.2f}/h of a ceiling of "
        + (f"${ceiling:,.2f}/h" if ceiling else "none"),
        track=ceiling or None,
    )
    head = (
        '<dl class="kv" id="capacity-settings">'
        f"<dt>Provisioner</dt><dd>{e(pools.provisioner or '-')}</dd>"
        f"<dt>Lead time</dt><dd>{pools.lead_time_seconds:.0f} s</dd>"
        f"<dt>Idle TTL</dt><dd>{pools.idle_ttl_seconds:.0f} s</dd>"
        f'<dt>Spend</dt><dd id="spend">${pools.usd_per_hour:,.2f}/h (ceiling '
        + (f"${ceiling:,.2f}/h" if ceiling else "none")
        + f") {spend}</dd></dl>"
    )
    spans = shown_plans(plans, now_s)
    return (
        head
        + "<h2>Operations under way</h2>"
        + _operations(pools.pools)
        + "<h2>Scalable pools</h2>"
        + legend(
            [
                ("seg-used", "busy nodes"),
                ("seg-ready", "ready, idle"),
                ("seg-promised", "booting"),
                ("track", "room up to the maximum"),
                ("mark-target", "target of the change under way"),
            ]
        )
        + (
            table(
                table_id="pools",
                heads=[
                    "Pool",
                    "GPUs/node",
                    "Kind",
                    "Nodes",
                    "Ready",
                    "Busy",
                    "Min-max",
                    "$/GPU-h",
                    "$/h",
                    "",
                    "Change",
                ],
                numeric=range(3, 9),
                body=_pool_rows(pools.pools),
            )
            if pools.pools
            else '<p class="empty">No scalable pools.</p>'
        )
        + "<h2>Capacity plans</h2>"
        + legend([(f"state-{s}", s) for s in STATES] + [("now", "now")])
        + timeline(spans, now_s)
        + (
            table(
                table_id="plans",
                heads=["Plan", "Kind", "State", "Where", "GPUs", "From", "To", "Held", "$/h", "By", "Reason"],
                numeric=(7, 8),
                body=_plan_rows(spans),
            )
            if spans
            else '<p class="empty" id="no-plans">No capacity plans.</p>'
        )
    )


async def capacity_page(request: web.Request) -> web.Response:
    view: View = request[VIEW_KEY]
    calls = request.app[CALLS_KEY]
    pools = await calls.call(request, "ListCapacityPools", pb.ListCapacityPoolsRequest())
    plans = await calls.call(request, "ListCapacityPlans", pb.ListCapacityPlansRequest(include_ended=True))
    body = render_capacity(pools, list(plans.plans), view.now_s)
    return html_response(render_page(view, page="capacity", title="Capacity", body=body))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/capacity", capacity_page)
