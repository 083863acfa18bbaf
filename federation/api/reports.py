"""ReportService: finance's view of the usage ledger, over gRPC.

Reports are computed from the server's in-memory ledger cache (kept current by watch) for etcd's
intervals, plus, with a history store, GROUP BY sums in SQL for the archived closed ones (issue 19):
a report over years reads sums, not the archived intervals. ListLedger and the FOCUS export list
intervals one by one, so they read the archived ones a page at a time.

Who reads what is one rule, `auth.report_scope`: finance reads every tenant, a member only its own,
nobody else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from federation.api import convert, history_reads
from federation.api.service import CallHandlers, Ctx
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.errors import InvalidArgument
from federation.history.protocol import HistoryStore
from federation.ledger.cache import LedgerCache
from federation.ledger.job_cost import interval_micro_usd
from federation.ledger.report import (
    Bucket,
    Dim,
    Report,
    ReportQuery,
    archived,
    focus_rows,
    render_csv,
    render_focus_csv,
    render_focus_json,
    render_html,
    render_json,
    render_table,
)
from federation.ledger.report.compute import finish_report, idle_sites
from federation.ledger.report.idle import ProvisionedInterval
from federation.ledger.report.savings import SavingsDim, SavingsQuery, SavingsReport, compute_savings
from federation.ledger.report.savings_render import (
    render_savings_csv,
    render_savings_html,
    render_savings_json,
    render_savings_table,
)
from federation.ledger.report.sums import ReportSums, interval_sums
from federation.ledger.usage import month_start_s
from federation.metrics import Metrics
from federation.security.auth import Authenticator, Principal, report_scope
from federation.spec.validate import shown
from federation.store.intervals import LedgerInterval
from federation.store.job_store import JobStore
from federation.store.money import usd
from placement.model import TenantId

RENDERERS: dict[str, tuple[Callable[[Report], str], str]] = {
    "table": (render_table, "text/plain"),
    "csv": (render_csv, "text/csv"),
    "json": (render_json, "application/json"),
    "html": (render_html, "text/html"),
}

SAVINGS_RENDERERS: dict[str, tuple[Callable[[SavingsReport], str], str]] = {
    "table": (render_savings_table, "text/plain"),
    "csv": (render_savings_csv, "text/csv"),
    "json": (render_savings_json, "application/json"),
    "html": (render_savings_html, "text/html"),
}
REPORTS = ("usage", "savings")


def savings_dims(names: Sequence[str]) -> tuple[SavingsDim, ...]:
    """The savings report's grouping from the request (default: tenant, GPU type); a clear error
    names an unknown one."""
    dims: list[SavingsDim] = []
    for name in names or ["tenant", "gpu_type"]:
        if name not in {d.value for d in SavingsDim}:
            known = ", ".join(d.value for d in SavingsDim)
            raise InvalidArgument(f"group_by: {shown(name)} is not one of {known}")
        if SavingsDim(name) not in dims:
            dims.append(SavingsDim(name))
    return tuple(dims)


def interval_to_pb(iv: LedgerInterval, now_s: float) -> pb.LedgerInterval:
    out = pb.LedgerInterval(
        job_id=iv.job_id,
        attempt=iv.attempt,
        tenant=iv.tenant,
        user=iv.user,
        cluster=iv.cluster,
        provider=iv.provider,
        region=iv.region,
        gpu_type=iv.gpu_type,
        gpu_count=iv.gpu_count,
        kind=iv.kind.value,
        start=convert.timestamp(iv.start_s),
        usd_per_gpu_hour=iv.usd_per_gpu_hour,
        ended="" if iv.ended is None else iv.ended.value,
        gpu_hours=iv.gpu_hours(until_s=now_s),
        # As every report counts it, in whole micro-dollars (what `gpufed get` shows for the job).
        cost_usd=usd(interval_micro_usd(iv, now_s=now_s)),
        start_s=iv.start_s,
        end_s=0.0 if iv.end_s is None else iv.end_s,
    )
    if iv.end_s is not None:
        out.end.CopyFrom(convert.timestamp(iv.end_s))
    return out


def period(
    start: Timestamp, end: Timestamp, *, has_start: bool, has_end: bool, now_s: float
) -> tuple[float, float]:
    """[start, end) from the request, defaulting to this month so far; refuses an empty period."""
    start_s = start.ToNanoseconds() / 1e9 if has_start else month_start_s(now_s)
    end_s = end.ToNanoseconds() / 1e9 if has_end else now_s
    if end_s <= start_s:
        raise InvalidArgument("end: must be after start")
    return start_s, end_s


def visible(intervals: list[LedgerInterval], tenant: TenantId | None) -> list[LedgerInterval]:
    return intervals if tenant is None else [iv for iv in intervals if iv.tenant == tenant]


class ReportService(pb_grpc.ReportServiceServicer):
    def __init__(
        self,
        *,
        ledger: LedgerCache,
        store: JobStore,
        auth: Authenticator,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        provisioned: Callable[[], Awaitable[Sequence[ProvisionedInterval]]] | None = None,
        history: HistoryStore | None = None,
    ) -> None:
        # Closed intervals of archived jobs, in SQL (issue 19); None: etcd's ledger only.
        self._history = history
        # The node-pool intervals the capacity reconciler recorded, for the idle cost of a report
        # over every tenant (a member's report shows none: idle says what others used).
        self._provisioned = provisioned
        self._ledger = ledger
        self._store = store
        self._h = CallHandlers(auth, metrics)
        self._clock = clock

    async def _intervals(
        self, since_s: float, until_s: float, tenant: TenantId | None
    ) -> list[LedgerInterval]:
        """etcd's intervals (the ledger cache) plus the archived ones that overlap [since_s, until_s),
        one by one: for the reads that list intervals (ListLedger, the FOCUS export's line items).

        While the archiver has committed a job to SQL and not yet deleted it from etcd, its closed
        intervals are in both: SQL's copy is kept and etcd's left out, by interval id (job, attempt),
        so none is counted twice. Open intervals are only ever in etcd. etcd is read first: the
        archiver commits to SQL before it deletes from etcd, so an interval gone from etcd's copy is
        in SQL by the time SQL is read, and one read from SQL is left out of etcd's.
        """
        live = self._ledger.intervals()
        if self._history is None or until_s <= since_s:
            return live
        archived, held = await asyncio.to_thread(
            history_reads.archived_intervals, self._history, since_s, until_s, tenant
        )
        merged = [iv for iv in live if (iv.job_id, iv.attempt) not in held] + archived
        # One order whichever store holds an interval: float sums then add in the same order, so a
        # report reads the same to the last digit before, during and after archiving.
        merged.sort(key=lambda iv: (iv.start_s, iv.job_id, iv.attempt))
        return merged

    async def _report_sums(self, query: ReportQuery, pools: Sequence[ProvisionedInterval]) -> ReportSums:
        """The report's sums: etcd's intervals summed here, the archived ones summed in SQL.

        The store answers its sums and which of etcd's closed intervals it holds from one snapshot,
        read after etcd's: those are left out of etcd's side, so an interval the archiver is moving
        counts once (as in `_intervals`). Open intervals are only ever in etcd.
        """
        live = self._ledger.intervals()
        sites = idle_sites(pools, query)
        if self._history is None:
            return interval_sums(live, query, idle_sites=sites)
        check = tuple((iv.job_id, iv.attempt) for iv in live if iv.end_s is not None)
        asked = archived.report_read(query, check=check, idle_sites=sites)
        answer = await asyncio.to_thread(history_reads.read_report, self._history, asked.read)
        return archived.both_stores(live, query, asked, answer, idle_sites=sites)

    def _query(
        self,
        who: Principal,
        req: pb.GetReportRequest | pb.ExportFocusRequest,
        group_by: tuple[Dim, ...],
        bucket: str,
    ) -> ReportQuery:
        tenant = report_scope(who, req.tenant)
        now = self._clock()
        start_s, end_s = period(
            req.start, req.end, has_start=req.HasField("start"), has_end=req.HasField("end"), now_s=now
        )
        if bucket and bucket not in {b.value for b in Bucket}:
            raise InvalidArgument(f"bucket: {shown(bucket)} is not one of day, week, month")
        return ReportQuery(
            start_s=start_s,
            end_s=end_s,
            now_s=now,
            group_by=group_by,
            bucket=Bucket(bucket) if bucket else None,
            tenants=None if tenant is None else frozenset({tenant}),
        )

    async def _savings(self, who: Principal, req: pb.GetReportRequest) -> pb.RenderedReport:
        """The savings report (issue 35): per interval, so the archived intervals are read one by one
        with their recorded offers, like ListLedger's (a sum in SQL would need the offers summed
        at each one's price; see docs/finance.md, "Savings")."""
        # Who may read which tenant first (`auth.report_scope`), then what was asked.
        base = self._query(who, req, (Dim.TENANT,), req.bucket)
        dims = savings_dims(req.group_by)
        fmt = req.format or "table"
        if fmt not in SAVINGS_RENDERERS:
            raise InvalidArgument(f"format: {shown(fmt)} is not one of {', '.join(SAVINGS_RENDERERS)}")
        query = SavingsQuery(
            start_s=base.start_s,
            end_s=base.end_s,
            now_s=base.now_s,
            group_by=dims,
            bucket=base.bucket,
            tenants=base.tenants,
        )
        tenant = None if query.tenants is None else next(iter(query.tenants))
        intervals = visible(await self._intervals(query.start_s, query.until_s, tenant), tenant)
        render, content_type = SAVINGS_RENDERERS[fmt]
        return pb.RenderedReport(content=render(compute_savings(intervals, query)), content_type=content_type)

    async def GetReport(self, request: pb.GetReportRequest, context: Ctx) -> pb.RenderedReport:
        async def body(who: Principal, req: pb.GetReportRequest) -> pb.RenderedReport:
            if req.report not in ("", *REPORTS):
                raise InvalidArgument(f"report: {shown(req.report)} is not one of {', '.join(REPORTS)}")
            if req.report == "savings":
                return await self._savings(who, req)
            dims = []
            for name in req.group_by or ["tenant"]:
                if name not in {d.value for d in Dim}:
                    known = ", ".join(d.value for d in Dim)
                    raise InvalidArgument(f"group_by: {shown(name)} is not one of {known}")
                if Dim(name) not in dims:
                    dims.append(Dim(name))
            fmt = req.format or "table"
            if fmt not in RENDERERS:
                raise InvalidArgument(f"format: {shown(fmt)} is not one of {', '.join(RENDERERS)}")
            query = self._query(who, req, tuple(dims), req.bucket)
            tenants = await self._store.list_tenants()
            pools = list(await self._provisioned()) if self._provisioned and query.tenants is None else []
            sums = await self._report_sums(query, pools)
            report = finish_report(sums, tenants, query, provisioned=pools)
            render, content_type = RENDERERS[fmt]
            return pb.RenderedReport(content=render(report), content_type=content_type)

        return await self._h.unary("GetReport", request, context, body)

    async def ExportFocus(self, request: pb.ExportFocusRequest, context: Ctx) -> pb.RenderedReport:
        async def body(who: Principal, req: pb.ExportFocusRequest) -> pb.RenderedReport:
            fmt = req.format or "csv"
            if fmt not in ("csv", "json"):
                raise InvalidArgument(f"format: {shown(fmt)} is not csv or json")
            query = self._query(who, req, (Dim.TENANT,), "")
            # One row per interval and day: these are line items, so the archived intervals are read
            # one by one (a page at a time), not summed.
            tenant = None if query.tenants is None else next(iter(query.tenants))
            rows = focus_rows(await self._intervals(query.start_s, query.until_s, tenant), query)
            if fmt == "csv":
                return pb.RenderedReport(content=render_focus_csv(rows), content_type="text/csv")
            return pb.RenderedReport(content=render_focus_json(rows), content_type="application/json")

        return await self._h.unary("ExportFocus", request, context, body)

    async def ListLedger(self, request: pb.ListLedgerRequest, context: Ctx) -> pb.ListLedgerResponse:
        async def body(who: Principal, req: pb.ListLedgerRequest) -> pb.ListLedgerResponse:
            tenant = report_scope(who, req.tenant)
            now = self._clock()
            start_s, end_s = period(
                req.start, req.end, has_start=req.HasField("start"), has_end=req.HasField("end"), now_s=now
            )
            found = [
                iv
                for iv in visible(await self._intervals(start_s, end_s, tenant), tenant)
                if iv.start_s < end_s and (iv.end_s is None or iv.end_s > start_s)
            ]
            found.sort(key=lambda iv: (iv.start_s, iv.job_id, iv.attempt))
            return pb.ListLedgerResponse(intervals=[interval_to_pb(iv, now) for iv in found])

        return await self._h.unary("ListLedger", request, context, body)
