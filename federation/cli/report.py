"""`gpufed report ...`: finance's GPU-hour and cost reports from the usage ledger (ReportService).

The server computes and renders; the CLI picks the period and the grouping and writes the result to
the terminal or a file. Finance reads every tenant; a member reads only its own tenant.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from federation.cli.output import OutputHolder
from federation.cli.render import FORMATS, as_dict, structured
from federation.store.money import MICRO_PER_USD, format_usd

# A set's name is its tenant's own: by set or sweep, the server groups by tenant too (issue 34).
GROUPS = ("tenant", "user", "cluster", "provider", "gpu_type", "kind", "set", "sweep")
# The savings report's groupings (issue 35), with the job set and the sweep (issue 34).
SAVINGS_GROUPS = ("tenant", "user", "cluster", "gpu_type", "kind", "set", "sweep")
BUCKETS = ("", "day", "week", "month")
REPORT_FORMATS = ("table", "csv", "json", "yaml", "html")
FOCUS_FORMATS = ("csv", "json", "yaml")


def _remember(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """`gpufed report -o json ledger`: a format every command knows applies to the subcommand too."""
    holder = ctx.find_object(OutputHolder)
    if value in FORMATS and holder is not None:
        holder.output = value
    return value


def report_format(given: str | None, chosen: str) -> str:
    """The report's own `-o`, else the one `gpufed -o` (or `-o` after a subcommand) chose."""
    return given or chosen


def focus_format(given: str | None, chosen: str) -> str:
    """FOCUS rows have no table: csv unless JSON or YAML was asked for, here or before `report`."""
    return given or (chosen if chosen in FOCUS_FORMATS else "csv")


def _fetch_as(fmt: str) -> str:
    # The server renders json, not YAML: YAML is the same document converted here.
    return "json" if fmt == "yaml" else fmt


def _converted(content: str, fmt: str) -> str:
    return structured(json.loads(content), "yaml") + "\n" if fmt == "yaml" else content


def parse_when(text: str, what: str) -> float:
    """A UTC date (`2026-11-01`) or ISO 8601 time (`2026-11-01T08:00`, with or without a zone)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError as error:
        raise click.BadParameter(
            f"{text!r} is not a date (YYYY-MM-DD) or ISO 8601 time", param_hint=what
        ) from error
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def month_period(text: str) -> tuple[float, float]:
    """`2026-11` -> [2026-11-01, 2026-12-01) in UTC."""
    try:
        first = datetime.strptime(text, "%Y-%m").replace(tzinfo=UTC)
    except ValueError as error:
        raise click.BadParameter(f"{text!r} is not a month (YYYY-MM)", param_hint="--month") from error
    nxt = (
        first.replace(year=first.year + 1, month=1)
        if first.month == 12
        else first.replace(month=first.month + 1)
    )
    return first.timestamp(), nxt.timestamp()


def period(since: str | None, until: str | None, month: str | None) -> tuple[float | None, float | None]:
    if month is not None:
        if since is not None or until is not None:
            raise click.BadParameter("give either --month or --from/--to", param_hint="--month")
        return month_period(month)
    return (
        None if since is None else parse_when(since, "--from"),
        None if until is None else parse_when(until, "--to"),
    )


def _groups(text: str, known: tuple[str, ...]) -> list[str]:
    groups = [g.strip() for g in text.split(",") if g.strip()]
    unknown = [g for g in groups if g not in known]
    if unknown:
        raise click.BadParameter(
            f"unknown grouping {', '.join(unknown)} (known: {', '.join(known)})", param_hint="--by"
        )
    return groups


def _write(content: str, out: str | None, what: str) -> None:
    if out is None:
        click.echo(content, nl=not content.endswith("\n"))
        return
    Path(out).write_text(content)
    click.echo(f"{what} written to {out}", err=True)


def _period_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--month", default=None, help="a calendar month, YYYY-MM (UTC)")(fn)
    fn = click.option(
        "--to", "until", default=None, help="end (exclusive): date or ISO time, UTC (default now)"
    )(fn)
    fn = click.option(
        "--from", "since", default=None, help="start: date or ISO time, UTC (default: first of this month)"
    )(fn)
    fn = click.option("--tenant", default="", help="one tenant (finance: any; members: their own)")(fn)
    return click.option("--out", default=None, help="write to this file instead of the terminal")(fn)


def _bucket_and_format(*, remember: bool) -> Callable[[Any], Any]:
    """`--bucket` and `-o` as every report command takes them (`remember`: the group's `-o` is
    kept for its subcommands)."""

    def add(fn: Any) -> Any:
        fn = click.option(
            "-o",
            "--output",
            "fmt",
            type=click.Choice(REPORT_FORMATS),
            default=None,
            callback=_remember if remember else None,
            help="table, csv, json, yaml or html (default: gpufed -o, else table)",
        )(fn)
        return click.option(
            "--bucket",
            type=click.Choice(BUCKETS),
            default="",
            help="split by day, week (ISO) or month as well",
        )(fn)

    return add


def register(cli: click.Group, rpc: Callable[[Any], Any]) -> None:
    @cli.group(invoke_without_command=True)
    @_period_options
    @click.option(
        "--by",
        "group_by",
        default="tenant",
        show_default=True,
        help=f"comma-separated grouping: {', '.join(GROUPS)}",
    )
    @_bucket_and_format(remember=True)
    @click.pass_context
    @rpc
    def report(ctx: click.Context, /, **kw: Any) -> None:
        """GPU-hours and cost from the usage ledger, with quota share, budget and forecast."""
        if ctx.invoked_subcommand is not None:
            return
        groups = _groups(kw["group_by"], GROUPS)
        start_s, end_s = period(kw["since"], kw["until"], kw["month"])
        fmt = report_format(kw["fmt"], ctx.obj.output)
        with ctx.obj.client() as client:
            reply = client.report(
                start_s=start_s,
                end_s=end_s,
                group_by=groups,
                bucket=kw["bucket"],
                tenant=kw["tenant"],
                fmt=_fetch_as(fmt),
            )
        _write(_converted(reply.content, fmt), kw["out"], "report")

    @report.command()
    @_period_options
    @click.option(
        "--by",
        "group_by",
        default="tenant,gpu_type",
        show_default=True,
        help=f"comma-separated grouping: {', '.join(SAVINGS_GROUPS)}",
    )
    @_bucket_and_format(remember=False)
    @click.pass_obj
    @rpc
    def savings(opts: Any, /, **kw: Any) -> None:
        """What waiting for private GPUs saved: cloud cost paid against bursting every attempt at once
        (at the offer the placer recorded), the saving and the extra queueing time."""
        groups = _groups(kw["group_by"], SAVINGS_GROUPS)
        start_s, end_s = period(kw["since"], kw["until"], kw["month"])
        fmt = report_format(kw["fmt"], opts.output)
        with opts.client() as client:
            reply = client.report(
                start_s=start_s,
                end_s=end_s,
                group_by=groups,
                bucket=kw["bucket"],
                tenant=kw["tenant"],
                fmt=_fetch_as(fmt),
                report="savings",
            )
        _write(_converted(reply.content, fmt), kw["out"], "savings report")

    @report.command()
    @_period_options
    @click.option(
        "-o",
        "--output",
        "fmt",
        type=click.Choice(FOCUS_FORMATS),
        default=None,
        help="csv, json or yaml (default: gpufed -o if json or yaml, else csv)",
    )
    @click.pass_obj
    @rpc
    def focus(opts: Any, /, **kw: Any) -> None:
        """Export FOCUS-style rows (one per interval and day) for finance tools."""
        start_s, end_s = period(kw["since"], kw["until"], kw["month"])
        fmt = focus_format(kw["fmt"], opts.output)
        with opts.client() as client:
            reply = client.export_focus(start_s=start_s, end_s=end_s, tenant=kw["tenant"], fmt=_fetch_as(fmt))
        _write(_converted(reply.content, fmt), kw["out"], "FOCUS export")

    @report.command()
    @_period_options
    @click.pass_obj
    @rpc
    def ledger(opts: Any, /, **kw: Any) -> None:
        """The ledger's intervals themselves: who held which GPUs, where, when and at what price."""
        start_s, end_s = period(kw["since"], kw["until"], kw["month"])
        with opts.client() as client:
            reply = client.ledger(start_s=start_s, end_s=end_s, tenant=kw["tenant"])
        if opts.output != "table":
            _write(structured(as_dict(reply), opts.output), kw["out"], "ledger")
            return
        rows = [
            (
                "JOB",
                "ATT",
                "TENANT",
                "USER",
                "CLUSTER",
                "GPU",
                "N",
                "KIND",
                "START",
                "END",
                "GPU-H",
                "USD",
                "ENDED",
            )
        ]
        for iv in reply.intervals:
            rows.append(
                (
                    iv.job_id,
                    str(iv.attempt),
                    iv.tenant,
                    iv.user,
                    iv.cluster,
                    iv.gpu_type,
                    str(iv.gpu_count),
                    iv.kind,
                    _utc(iv.start_s),
                    _utc(iv.end_s) if iv.end_s else "running",
                    f"{iv.gpu_hours:.3f}",
                    # The exact micro-dollars back from the double, to the cent half to even: as
                    # `gpufed get` rounds a job's cost.
                    format_usd(round(iv.cost_usd * MICRO_PER_USD), places=2),
                    iv.ended or "-",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
        _write(text + "\n", kw["out"], "ledger")


def _utc(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%d %H:%M:%S")
