"""`/queues`: per tenant, GPUs running and queued by GPU type against guarantee, borrowing and cap,
and each tenant's fair share as the placer counts it.

Three calls as the signed-in user: ListTenants (the quotas: a member gets its own tenant only),
ListClusters (the federation's reachable GPUs per type, what fair share divides by) and
SummarizeJobs (GPUs and jobs per tenant, GPU type and phase group, summed by the servicer over the
whole queue from its job cache; a member's holds only its own tenant; the finance role may not read
jobs, and then the page shows the quotas alone). No job is shown, only sums.

The arithmetic follows `placement.quota` and `placement.fairshare`: a tenant's usage includes its
child tenants' (caps and borrowing limits are checked up the tree), borrowed GPUs are those held
beyond the guarantee, the cap is the tighter of `cap` and guarantee + borrowing limit, and the
dominant share is the largest of (GPUs held of a type / the federation's reachable GPUs of that
type), divided by the tenant's weight, counting the tenant's own jobs. With `fairShareHistory` on,
the placer adds recent usage to that; the page shows what is held now.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import grpc
from aiohttp import web

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY, CallRefused
from federation.console.charts import Marker, Segment, legend, stacked_bar, table
from federation.console.layout import e, html_response, render_page
from federation.console.view import VIEW_KEY, View
from federation.store.config_policy import parse_tenant
from federation.store.records import TenantRecord
from placement.model import GpuType, TenantId


@dataclass(slots=True)
class Tally:
    """GPUs per (tenant, GPU type), and jobs per tenant, from the summary of the live jobs."""

    held: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    queued: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    running_jobs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    queued_jobs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # False when the caller's role may not read jobs (finance): usage is then unknown, not zero.
    known: bool = True

    def add(self, summary: pb.JobSummary) -> None:
        # Held: admitted, staging, dispatched and running (placed jobs hold their GPUs); a queued job
        # that accepts several types is counted by the servicer under each of them.
        for row in summary.rows:
            into = self.queued if row.group == pb.JOB_GROUP_QUEUED else self.held
            into[(row.tenant, row.gpu_type)] += row.gpus
        for count in summary.tenants:
            into_jobs = self.queued_jobs if count.group == pb.JOB_GROUP_QUEUED else self.running_jobs
            into_jobs[count.tenant] += count.jobs


@dataclass(frozen=True, slots=True)
class TypeRow:
    gpu_type: str
    # Including child tenants' (what caps and borrowing limits are checked against).
    running: int
    queued: int
    guaranteed: int
    # The tighter of the cap and guarantee + borrowing limit (None: no limit).
    limit: int | None
    borrowing_limit: int | None

    @property
    def borrowed(self) -> int:
        return max(0, self.running - self.guaranteed)


@dataclass(frozen=True, slots=True)
class TenantQueue:
    name: str
    parent: str | None
    depth: int
    weight: float
    rows: tuple[TypeRow, ...]
    running_jobs: int
    queued_jobs: int
    # The placer's weighted dominant share of the tenant's own jobs, and the type it comes from.
    share: float
    share_type: str | None
    has_children: bool


@dataclass(frozen=True, slots=True)
class QueuesView:
    tenants: tuple[TenantQueue, ...]
    capacity: dict[str, int]
    usage_known: bool


def tenant_record(tenant: pb.Tenant) -> TenantRecord:
    """The tenant's record from the document the API returns (the config file's keys)."""
    doc: Any = json.loads(tenant.document)
    # The class was checked when the tenant was set; it names itself here as the only known class.
    classes = [doc["maxPriorityClass"]] if isinstance(doc, dict) and "maxPriorityClass" in doc else []
    return parse_tenant(doc, "tenant", priority_classes=classes)


def capacity_by_type(clusters: Iterable[pb.Cluster]) -> dict[str, int]:
    """The reachable clusters' GPUs per type: what fair share divides by (as the placer's inventory)."""
    out: dict[str, int] = defaultdict(int)
    for cluster in clusters:
        if not cluster.reachable:
            continue
        for pool in cluster.pools:
            out[pool.gpu_type] += pool.gpus_per_node * pool.node_count
    return dict(out)


def _tree_order(records: dict[str, TenantRecord]) -> list[tuple[str, int]]:
    """Tenants depth first under their parents, by name; a parent the caller cannot see is a root."""
    children: dict[str | None, list[str]] = defaultdict(list)
    for name, record in records.items():
        parent = record.parent if record.parent in records else None
        children[parent].append(name)
    out: list[tuple[str, int]] = []
    seen: set[str] = set()

    def walk(parent: str | None, depth: int) -> None:
        for name in sorted(children.get(parent, [])):
            if name in seen:
                continue
            seen.add(name)
            out.append((name, depth))
            walk(name, depth + 1)

    walk(None, 0)
    # A cycle (refused by the API, but never trust a picture to it) leaves tenants unwalked.
    out += [(name, 0) for name in sorted(records) if name not in seen]
    return out


def _ancestors(records: dict[str, TenantRecord], name: str) -> list[str]:
    out, seen = [name], {name}
    record = records.get(name)
    while record is not None and record.parent is not None and record.parent not in seen:
        out.append(record.parent)
        seen.add(record.parent)
        record = records.get(record.parent)
    return out


def build_queues(tenants: Sequence[pb.Tenant], clusters: Sequence[pb.Cluster], tally: Tally) -> QueuesView:
    """What the page shows, from the API's replies: pure, so it is tested without a server."""
    records = {t.name: tenant_record(t) for t in tenants}
    # Tenants with live jobs but no record the caller can read (deleted since) still show their usage.
    for tenant, _ in [*tally.held, *tally.queued]:
        if tenant not in records:
            records[tenant] = TenantRecord(name=TenantId(tenant))
    capacity = capacity_by_type(clusters)
    # Usage rolls up the tree: an organisation's caps count its teams' jobs.
    held: dict[tuple[str, str], int] = defaultdict(int)
    queued: dict[tuple[str, str], int] = defaultdict(int)
    for (tenant, gpu_type), gpus in tally.held.items():
        for who in _ancestors(records, tenant):
            held[(who, gpu_type)] += gpus
    for (tenant, gpu_type), gpus in tally.queued.items():
        for who in _ancestors(records, tenant):
            queued[(who, gpu_type)] += gpus
    running_jobs: dict[str, int] = defaultdict(int)
    queued_jobs: dict[str, int] = defaultdict(int)
    for tenant, n in tally.running_jobs.items():
        for who in _ancestors(records, tenant):
            running_jobs[who] += n
    for tenant, n in tally.queued_jobs.items():
        for who in _ancestors(records, tenant):
            queued_jobs[who] += n
    parents = {r.parent for r in records.values() if r.parent is not None}
    out = []
    for name, depth in _tree_order(records):
        record = records[name]
        quota = record.quota()
        types = (
            {g for g, _ in record.gpu_caps}
            | {q.gpu_type for q in record.quotas}
            | {g for (t, g) in held if t == name}
            | {g for (t, g) in queued if t == name}
        )
        rows = []
        for gpu_type in sorted(types):
            share = quota.quota_for(GpuType(gpu_type))
            guaranteed = share.guaranteed_gpus if share is not None else 0
            borrowing = share.borrowing_limit_gpus if share is not None else None
            limits = [quota.cap_for(GpuType(gpu_type))]
            if borrowing is not None:
                limits.append(guaranteed + borrowing)
            bounds = [limit for limit in limits if limit is not None]
            rows.append(
                TypeRow(
                    gpu_type=gpu_type,
                    running=held.get((name, gpu_type), 0),
                    queued=queued.get((name, gpu_type), 0),
                    guaranteed=guaranteed,
                    limit=min(bounds) if bounds else None,
                    borrowing_limit=borrowing,
                )
            )
        # Fair share counts the tenant's own jobs (placement.fairshare), not its teams'.
        weight = record.weight if record.weight > 0 else 1.0
        shares = [
            (gpus / capacity[g], g) for (t, g), gpus in tally.held.items() if t == name and capacity.get(g)
        ]
        top, top_type = max(shares, default=(0.0, None))
        out.append(
            TenantQueue(
                name=name,
                parent=record.parent,
                depth=depth,
                weight=weight,
                rows=tuple(rows),
                running_jobs=running_jobs.get(name, 0),
                queued_jobs=queued_jobs.get(name, 0),
                share=top / weight,
                share_type=top_type,
                has_children=name in parents,
            )
        )
    return QueuesView(
        tenants=tuple(out),
        capacity=capacity,
        usage_known=tally.known,
    )


# ---- rendering


def _count(value: int | None, known: bool = True) -> str:
    if not known:
        return "-"
    return "-" if value is None else str(value)


def _bar(row: TypeRow, known: bool) -> str:
    scale = max(row.limit or 0, row.running + (row.queued if known else 0), row.guaranteed, 1)
    within = min(row.running, row.guaranteed)
    segments = (
        [
            Segment("seg-guaranteed", within, f"{within} running within the guarantee"),
            Segment("seg-borrowed", row.borrowed, f"{row.borrowed} borrowed beyond the guarantee"),
            Segment("seg-queued", row.queued, f"{row.queued} queued"),
        ]
        if known
        else []
    )
    markers = (
        [Marker("mark-guarantee", row.guaranteed, f"guarantee {row.guaranteed}")] if row.guaranteed else []
    )
    if row.limit is not None:
        markers.append(Marker("mark-cap", row.limit, f"cap {row.limit}"))
    words = (
        f"{row.gpu_type}: {row.running} running ({row.borrowed} borrowed), {row.queued} queued"
        if known
        else f"{row.gpu_type}: usage not shown to this role"
    )
    words += f", guarantee {row.guaranteed}, cap {_count(row.limit).replace('-', 'none')}"
    return stacked_bar(segments, scale=scale, label=words, markers=markers, track=row.limit, css="queue-bar")


def _tenant_rows(t: TenantQueue, known: bool) -> str:
    jobs_link = "/jobs?" + urlencode({"tenant": t.name})
    head = (
        f'<th scope="rowgroup" class="tenant depth-{min(t.depth, 4)}" rowspan="{max(1, len(t.rows))}">'
        # The tenant's jobs, for a role that may list them (finance may not: no link to a 403).
        + (f'<a href="{e(jobs_link)}">{e(t.name)}</a>' if known else e(t.name))
        + (f'<span class="sub">in {e(t.parent)}</span>' if t.parent else "")
        + ('<span class="sub">its teams included</span>' if t.has_children else "")
        + "</th>"
    )
    if not t.rows:
        return (
            f'<tbody class="tenant" data-tenant="{e(t.name)}"><tr class="empty">{head}'
            '<td colspan="7">no quotas, nothing running or queued</td></tr></tbody>'
        )
    rows = []
    for i, r in enumerate(t.rows):
        rows.append(
            f'<tr data-tenant="{e(t.name)}" data-gpu-type="{e(r.gpu_type)}">'
            + (head if i == 0 else "")
            + f'<td class="gpu-type">{e(r.gpu_type)}</td>'
            f'<td class="num running">{_count(r.running, known)}</td>'
            f'<td class="num queued">{_count(r.queued, known)}</td>'
            f'<td class="num guaranteed">{r.guaranteed}</td>'
            f'<td class="num borrowed">{_count(r.borrowed, known)}</td>'
            f'<td class="num cap">{_count(r.limit)}</td>'
            f'<td class="chart">{_bar(r, known)}</td></tr>'
        )
    return f'<tbody class="tenant" data-tenant="{e(t.name)}">{"".join(rows)}</tbody>'


def _share_rows(view: QueuesView) -> str:
    top = max((t.share for t in view.tenants), default=0.0)
    rows = []
    for t in view.tenants:
        known = view.usage_known
        share = f"{100 * t.share:.1f}%" if known else "-"
        bar = (
            stacked_bar(
                [Segment("seg-share", t.share, f"dominant share {share}")],
                scale=max(top, 0.01),
                label=f"{t.name}: dominant share {share}",
                css="share-bar",
            )
            if known
            else ""
        )
        rows.append(
            f'<tr data-tenant="{e(t.name)}"><th scope="row">{e(t.name)}</th>'
            f'<td class="num weight">{t.weight:g}</td>'
            f'<td class="num running-jobs">{_count(t.running_jobs, known)}</td>'
            f'<td class="num queued-jobs">{_count(t.queued_jobs, known)}</td>'
            f'<td class="num share">{share}</td>'
            f'<td class="share-type">{e(t.share_type or "-") if known else "-"}</td>'
            f'<td class="chart">{bar}</td></tr>'
        )
    return "<tbody>" + "".join(rows) + "</tbody>"


def render_queues(view: QueuesView) -> str:
    """The page's body (escaped HTML)."""
    parts = []
    if not view.usage_known:
        parts.append(
            '<p class="note" id="usage-hidden">Your role may not list jobs: the quotas are shown, '
            "not what runs or waits.</p>"
        )
    parts.append(
        '<p class="explain">Running: GPUs held by admitted, staging, dispatched and running jobs, a '
        "tenant's teams included. Queued: GPUs asked for by queued jobs (a job that accepts several GPU "
        "types counts under each). Borrowed: running beyond the guarantee. Cap: the tighter of the cap and "
        "guarantee + borrowing limit.</p>"
    )
    parts.append(
        legend(
            [
                ("seg-guaranteed", "running within the guarantee"),
                ("seg-borrowed", "borrowed"),
                ("seg-queued", "queued"),
                ("track", "room up to the cap"),
                ("mark-guarantee", "guarantee"),
                ("mark-cap", "cap"),
            ]
        )
    )
    parts.append(
        table(
            table_id="queues",
            heads=["Tenant", "GPU type", "Running", "Queued", "Guaranteed", "Borrowed", "Cap", ""],
            numeric=range(2, 7),
            body="".join(_tenant_rows(t, view.usage_known) for t in view.tenants),
            caption="GPUs by tenant and type",
        )
    )
    parts.append("<h2>Fair share</h2>")
    parts.append(
        '<p class="explain">Within a priority, the tenant with the lowest dominant share goes next: its '
        "largest share of any GPU type's reachable capacity, held by its own jobs now, divided by its "
        "weight.</p>"
    )
    parts.append(
        table(
            table_id="fair-share",
            heads=["Tenant", "Weight", "Jobs running", "Jobs queued", "Dominant share", "Of type", ""],
            numeric=range(1, 5),
            body=_share_rows(view),
        )
    )
    if view.capacity:
        cap = ", ".join(f"{e(g)} {n}" for g, n in sorted(view.capacity.items()))
        parts.append(f'<p class="note" id="capacity-by-type">Reachable GPUs: {cap}.</p>')
    return "".join(parts)


# ---- gathering


PAGE_SIZE = 500
# A bound on the pages one view reads (500 jobs each): far beyond any placed set, never unbounded.
MAX_PAGES = 200


async def list_jobs(
    request: web.Request,
    phases: Sequence[pb.JobPhase.ValueType],
    on_page: Callable[[Sequence[pb.Job]], None],
) -> tuple[bool, bool]:
    """Page through ListJobs over `phases`, handing each page to `on_page` (the clusters page reads
    the placed jobs, bounded by the clusters' GPUs, this way). Returns (known, truncated): known is
    False when the caller's role may not list jobs (finance); truncated past MAX_PAGES."""
    calls = request.app[CALLS_KEY]
    token = ""
    for _ in range(MAX_PAGES):
        try:
            reply = await calls.call(
                request,
                "ListJobs",
                pb.ListJobsRequest(phases=list(phases), page_size=PAGE_SIZE, page_token=token),
            )
        except CallRefused as refused:
            if refused.code is grpc.StatusCode.PERMISSION_DENIED:
                return False, False
            raise
        on_page(reply.jobs)
        token = reply.next_page_token
        if not token:
            return True, False
    return True, True


async def gather(request: web.Request) -> QueuesView:
    calls = request.app[CALLS_KEY]
    tenants = await calls.call(request, "ListTenants", pb.ListTenantsRequest())
    clusters = await calls.call(request, "ListClusters", pb.ListClustersRequest())
    tally = Tally()
    try:
        tally.add(await calls.call(request, "SummarizeJobs", pb.SummarizeJobsRequest()))
    except CallRefused as refused:
        if refused.code is not grpc.StatusCode.PERMISSION_DENIED:
            raise
        tally.known = False
    return build_queues(list(tenants.tenants), list(clusters.clusters), tally)


async def queues_page(request: web.Request) -> web.Response:
    view: View = request[VIEW_KEY]
    data = await gather(request)
    return html_response(render_page(view, page="queues", title="Queues", body=render_queues(data)))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/queues", queues_page)
