"""`/clusters`: GPU type by cluster, with free, used and promised GPUs, prices and reachability.

ListClusters gives each cluster's pools as the inventory sees them (nodes, free GPUs, price) and
whether the cluster answers or keeps refusing dispatches, like `gpufed clusters`. Promised GPUs are
those of jobs placed on a cluster but not yet running there (admitted, staging, dispatched): the
inventory still counts them free, so the page takes them out of "free" (`placement.reserve` does
the same before each cycle). They come from ListJobs as the signed-in user: a member counts its own
tenant's jobs only, and a role that may not list jobs sees no promised column.

A dispatched gang is promised only the GPUs of its replicas not yet bound to a node: the bound
ones the inventory already counts used. A gang stuck half-bound (some pods on nodes, the rest
pending) was counted twice, as used and as promised, until issue 30; its bound replicas now come
from DescribeJob, as `placement`'s own reserve (`unbound_replica_gpus`) holds back only the rest.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlencode

import grpc
from aiohttp import web
from google.protobuf.timestamp_pb2 import Timestamp

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY, CallRefused
from federation.console.charts import Segment, legend, stacked_bar, table, utc_text
from federation.console.layout import e, html_response, render_page
from federation.console.queues import list_jobs
from federation.console.view import VIEW_KEY, View

PROMISED_PHASES = (pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_STAGING, pb.JOB_PHASE_DISPATCHED)


@dataclass(frozen=True, slots=True)
class PoolLine:
    name: str
    kind: str
    usd_per_gpu_hour: float
    total: int
    free: int


@dataclass(frozen=True, slots=True)
class Site:
    """One GPU type on one cluster."""

    cluster: str
    gpu_type: str
    reachable: bool
    state: str
    pools: tuple[PoolLine, ...]
    promised: int | None

    @property
    def total(self) -> int:
        return sum(p.total for p in self.pools)

    @property
    def used(self) -> int:
        return self.total - sum(p.free for p in self.pools)

    @property
    def free(self) -> int:
        """Free in the inventory less what is promised already."""
        free = sum(p.free for p in self.pools)
        return max(0, free - (self.promised or 0))


@dataclass(frozen=True, slots=True)
class ClustersView:
    clusters: tuple[pb.Cluster, ...]
    by_type: dict[str, tuple[Site, ...]] = field(default_factory=dict)
    # None: the role may not list jobs, so nothing promised is known.
    promised_known: bool = True
    # A member's promised GPUs are its own tenant's only.
    promised_scope: str = ""


def promised_by_site(
    jobs: Sequence[pb.Job], bound_gpus: Mapping[str, int] | None = None
) -> dict[tuple[str, str], int]:
    """GPUs promised per (cluster, GPU type): each placed job's GPUs less those already bound to
    nodes (`bound_gpus` by job id), which the inventory counts used."""
    bound_gpus = bound_gpus or {}
    out: dict[tuple[str, str], int] = defaultdict(int)
    for job in jobs:
        if job.phase in PROMISED_PHASES and job.cluster:
            out[(job.cluster, job.gpu_type)] += max(0, job.gpu_count - bound_gpus.get(job.job_id, 0))
    return dict(out)


def bound_gpus_of(job: pb.Job, description: pb.JobDescription) -> int:
    """GPUs of `job`'s current attempt whose pods are on a node and not finished. Replicas of one
    gang are taken as equal (gpu_count / replica_count); an uneven gang counts none bound, which
    errs towards less free capacity."""
    if job.replica_count <= 0 or job.gpu_count % job.replica_count:
        return 0
    per_replica = job.gpu_count // job.replica_count
    attempt = next((a for a in description.attempts if a.attempt == job.attempt), None)
    if attempt is None:
        return 0
    bound = sum(1 for r in attempt.replicas if r.node and r.phase not in ("Succeeded", "Failed"))
    return min(job.gpu_count, bound * per_replica)


def build_clusters(
    reply: pb.ListClustersResponse, promised: dict[tuple[str, str], int] | None, *, scope: str = ""
) -> ClustersView:
    sites: dict[str, list[Site]] = defaultdict(list)
    for cluster in reply.clusters:
        pools: dict[str, list[PoolLine]] = defaultdict(list)
        for p in cluster.pools:
            pools[p.gpu_type].append(
                PoolLine(
                    p.name, p.capacity_kind, p.usd_per_gpu_hour, p.gpus_per_node * p.node_count, p.free_gpus
                )
            )
        for gpu_type, lines in pools.items():
            sites[gpu_type].append(
                Site(
                    cluster=cluster.name,
                    gpu_type=gpu_type,
                    reachable=cluster.reachable,
                    state=cluster.state,
                    pools=tuple(lines),
                    promised=None if promised is None else promised.get((cluster.name, gpu_type), 0),
                )
            )
    return ClustersView(
        clusters=tuple(reply.clusters),
        by_type={g: tuple(sorted(s, key=lambda x: x.cluster)) for g, s in sorted(sites.items())},
        promised_known=promised is not None,
        promised_scope=scope,
    )


def _reach(c: pb.Cluster) -> tuple[str, str]:
    """(css class, words) for a cluster's reachability, as `gpufed clusters` says it."""
    if not c.reachable:
        return "unreachable", "unreachable"
    if c.state == "refusing":
        return "refusing", "refusing dispatches"
    return "reachable", "reachable"


def _ts(ts: Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def _cluster_rows(view: ClustersView) -> str:
    rows = []
    for c in view.clusters:
        css, words = _reach(c)
        total = sum(p.gpus_per_node * p.node_count for p in c.pools)
        free = sum(p.free_gpus for p in c.pools)
        note = ""
        if c.state == "refusing":
            note = (
                f"since {e(utc_text(_ts(c.refusing_since), '%H:%M:%S'))}, {c.refused_jobs} job(s); next try "
                f"{e(utc_text(_ts(c.next_try), '%H:%M:%S'))}; last error: {e(c.last_error)}"
            )
        rows.append(
            f'<tr data-cluster="{e(c.name)}"><th scope="row">{e(c.name)}</th>'
            f"<td>{e(c.provider)}</td><td>{e(c.region)}</td>"
            f'<td class="reach {css}"><span class="badge {css}">{e(words)}</span></td>'
            f'<td class="num">{total}</td><td class="num">{free}</td><td class="note">{note}</td></tr>'
        )
    return "<tbody>" + "".join(rows) + "</tbody>"


def _jobs_on(cluster: str) -> str:
    return "/jobs?" + urlencode({"cluster": cluster})


def _prices(site: Site) -> str:
    return "<br>".join(
        f'<span class="pool">{e(p.name)}</span> {e(p.kind)} ${p.usd_per_gpu_hour:,.2f}' for p in site.pools
    )


def _site_row(site: Site, known: bool) -> str:
    promised = site.promised or 0
    free = site.free
    used = site.used
    segments = [
        Segment("seg-used", used, f"{used} used"),
        Segment("seg-promised", promised, f"{promised} promised"),
        Segment("seg-free", free, f"{free} free"),
    ]
    words = (
        f"{site.cluster} {site.gpu_type}: {used} used, "
        + (f"{promised} promised, " if known else "")
        + f"{free} free of {site.total}"
    )
    bar = stacked_bar(segments, scale=max(site.total, used + promised + free, 1), label=words)
    css = "unreachable" if not site.reachable else ("refusing" if site.state == "refusing" else "reachable")
    return (
        f'<tr data-cluster="{e(site.cluster)}" data-gpu-type="{e(site.gpu_type)}" class="{css}">'
        # The jobs there, for a role that may list jobs (finance may not: no link to a 403).
        + (
            f'<th scope="row"><a href="{e(_jobs_on(site.cluster))}">{e(site.cluster)}</a></th>'
            if known
            else f'<th scope="row">{e(site.cluster)}</th>'
        )
        + f'<td class="reach"><span class="badge {css}">{e(css)}</span></td>'
        f'<td class="prices">{_prices(site)}</td>'
        f'<td class="num total">{site.total}</td><td class="num used">{used}</td>'
        f'<td class="num promised">{promised if known else "-"}</td><td class="num free">{free}</td>'
        f'<td class="chart">{bar}</td></tr>'
    )


def render_clusters(view: ClustersView) -> str:
    parts = [
        table(
            table_id="clusters",
            heads=["Cluster", "Provider", "Region", "Reachable", "GPUs", "Free", "Note"],
            numeric=(4, 5),
            body=_cluster_rows(view),
            caption="Member clusters",
        )
    ]
    if not view.promised_known:
        parts.append(
            '<p class="note" id="promised-hidden">Your role may not list jobs: promised GPUs are not '
            "shown.</p>"
        )
    elif view.promised_scope:
        parts.append(
            f'<p class="note" id="promised-scope">Promised GPUs count the jobs of {e(view.promised_scope)} '
            "only: the only ones you may see.</p>"
        )
    parts.append(
        '<p class="explain">Used: GPUs the cluster reports taken. Promised: GPUs of jobs placed there that '
        "are not running yet (admitted, staging, dispatched). Free: what is left. Prices per GPU-hour, per "
        "pool.</p>"
    )
    parts.append(legend([("seg-used", "used"), ("seg-promised", "promised"), ("seg-free", "free")]))
    if not view.by_type:
        parts.append('<p class="empty">No clusters.</p>')
    for gpu_type, sites in view.by_type.items():
        total = sum(s.total for s in sites)
        free = sum(s.free for s in sites if s.reachable)
        parts.append(
            f'<section class="gpu-type" data-gpu-type="{e(gpu_type)}"><h2>{e(gpu_type)} '
            f'<span class="sub">{free} free of {total}</span></h2>'
            + table(
                table_id=f"gpu-{gpu_type}",
                heads=["Cluster", "State", "Pools and prices", "GPUs", "Used", "Promised", "Free", ""],
                numeric=range(3, 7),
                body="<tbody>" + "".join(_site_row(s, view.promised_known) for s in sites) + "</tbody>",
            )
            + "</section>"
        )
    return "".join(parts)


async def gather(request: web.Request, view: View) -> ClustersView:
    calls = request.app[CALLS_KEY]
    reply = await calls.call(request, "ListClusters", pb.ListClustersRequest())
    jobs: list[pb.Job] = []
    known, _ = await list_jobs(request, PROMISED_PHASES, jobs.extend)
    bound: dict[str, int] = {}
    for job in jobs:
        if job.phase == pb.JOB_PHASE_DISPATCHED and job.cluster:
            try:
                described = await calls.call(request, "DescribeJob", pb.DescribeJobRequest(job_id=job.job_id))
            except CallRefused as refused:
                if refused.code is not grpc.StatusCode.NOT_FOUND:
                    raise
                continue  # ended and gone between the two reads
            bound[job.job_id] = bound_gpus_of(job, described)
    promised = promised_by_site(jobs, bound) if known else None
    scope = view.tenant if view.role == "member" else ""
    return build_clusters(reply, promised, scope=scope)


async def clusters_page(request: web.Request) -> web.Response:
    view: View = request[VIEW_KEY]
    data = await gather(request, view)
    return html_response(render_page(view, page="clusters", title="Clusters", body=render_clusters(data)))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/clusters", clusters_page)
