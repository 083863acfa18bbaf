"""`gpufed capacity ...`: the scalable pools and the infra team's capacity plans (Capacity service).

    gpufed capacity pools
    gpufed capacity plan create --cluster aws-us-east-1 --gpu-type H100 --gpus 64 \
        --from 2026-11-30T08:00 --to 2026-12-04T20:00 --reason "launch week" [--allow-partial]
    gpufed capacity plan create --cluster aws-us-east-1 --gpu-type A100 --deadline 2026-12-04 \
        --job train-a-1f2e3d4c --job train-b-5a6b7c8d
    gpufed capacity plan preview ...same options... | --id PLAN
    gpufed capacity plan list [--all]
    gpufed capacity plan cancel PLAN

Infra and admins create and cancel plans; admin, infra and finance read plans and pools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import click
from google.protobuf.timestamp_pb2 import Timestamp

from federation.api.capacity_client import CapacityClient, plan_request
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.report import parse_when


def _when(ts: Timestamp) -> str:
    return datetime.fromtimestamp(ts.seconds, UTC).strftime("%Y-%m-%d %H:%M:%S") if ts.seconds else "-"


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def pools_text(reply: pb.ListCapacityPoolsResponse) -> str:
    rows = [("CLUSTER", "POOL", "GPU", "KIND", "NODES", "READY", "BUSY", "MIN-MAX", "$/H", "PENDING")]
    for p in reply.pools:
        pending = "-"
        if p.HasField("pending"):
            c = p.pending
            pending = f"{c.nodes_from}->{c.nodes_to}"
            if c.last_error:
                pending += f" FAILED x{c.attempts}: {c.last_error[:60]} (next try {_when(c.next_try_at)})"
            elif c.HasField("ready_at"):
                pending += f" ready ~{_when(c.ready_at)}"
            if c.job_ids:
                pending += f" for {', '.join(c.job_ids)}"
            if c.plan_ids:
                pending += f" plans {', '.join(c.plan_ids)}"
        rows.append(
            (
                p.cluster,
                p.pool,
                f"{p.gpus_per_node}x{p.gpu_type}",
                p.capacity_kind,
                str(p.nodes),
                str(p.ready_nodes),
                str(p.busy_nodes),
                f"{p.min_nodes}-{p.max_nodes}",
                f"{p.usd_per_hour:,.2f}",
                pending + (f" ({p.note})" if p.note else ""),
            )
        )
    ceiling = f"${reply.spend_ceiling_usd_per_hour:,.2f}/h" if reply.spend_ceiling_usd_per_hour else "none"
    head = (
        f"provisioner {reply.provisioner}, lead time {reply.lead_time_seconds:.0f}s, idle TTL "
        f"{reply.idle_ttl_seconds:.0f}s, spend ${reply.usd_per_hour:,.2f}/h (ceiling {ceiling})"
    )
    return head + "\n" + _table(rows)


def plans_text(plans: Sequence[pb.CapacityPlan]) -> str:
    """HELD and $/H: what the pools' ready nodes hold for the plan now; GPU-H and COST: what its
    held nodes delivered so far (in all, once it ended). A partial plan's shortfall follows the table."""
    rows = [
        (
            "ID",
            "KIND",
            "STATE",
            "CLUSTER",
            "GPUS",
            "FROM",
            "TO",
            "HELD",
            "$/H",
            "GPU-H",
            "COST",
            "BY",
            "REASON",
        )
    ]
    notes = []
    for p in plans:
        if p.kind == "fixed":
            gpus = f"{p.gpus} of {p.requested_gpus}" if p.shortfall_gpus else str(p.gpus)
        else:
            gpus = f"{len(p.job_ids)} job(s)"
        if p.shortfall_gpus:
            notes.append(
                f"{p.plan_id}: partial, {p.shortfall_gpus} GPU(s) short: held back by {p.held_back_by}"
            )
        rows.append(
            (
                p.plan_id,
                p.kind,
                p.state,
                p.cluster + (f"/{p.pool}" if p.pool else ""),
                f"{gpus} {p.gpu_type}" + (f" ({p.tenant})" if p.tenant else ""),
                _when(p.start),
                _when(p.end),
                str(p.gpus_now),
                f"{p.usd_per_hour:,.2f}",
                f"{p.gpu_hours:,.1f}",
                f"{p.total_usd:,.2f}",
                p.created_by,
                p.reason,
            )
        )
    return "\n".join([_table(rows), *notes])


def preview_text(reply: pb.CapacityPreview) -> str:
    asked = reply.plan.requested_gpus
    of = f" of {asked}" if reply.shortfall_gpus and asked else ""
    lines = [
        f"plan: {reply.gpus}{of} x {reply.plan.gpu_type} in {reply.plan.cluster}, provisioned from "
        f"{_when(reply.provision_at)} to {_when(reply.plan.end)}",
        f"cost: ${reply.usd_per_hour:,.2f}/h, ${reply.total_usd:,.2f} in all",
    ]
    if reply.shortfall_gpus:
        lines.append(
            f"shortfall: {reply.shortfall_gpus} GPU(s), held back by {reply.plan.held_back_by}: "
            + ("create refuses it unless --allow-partial" if reply.gpus else "create refuses it")
        )
    if not reply.meetable:
        lines.append("the deadline cannot be met even with every job running at once")
    if reply.note:
        lines.append(f"note: {reply.note}")
    for c in reply.changes:
        lines.append(
            f"  {c.cluster}/{c.pool}: {c.nodes_from} -> {c.nodes_to} nodes, "
            f"${c.usd_per_hour_before:,.2f}/h -> ${c.usd_per_hour_after:,.2f}/h"
        )
    if not reply.changes:
        lines.append("  no pool changes (the pools hold it already, or it cannot be placed)")
    return "\n".join(lines)


def _plan_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        (
            click.option("--cluster", default="", help="a scalable cluster"),
            click.option("--gpu-type", default="", help="e.g. H100"),
            click.option("--gpus", type=int, default=0, help="fixed plan: GPUs to hold"),
            click.option("--from", "since", default=None, help="fixed plan: start (date or ISO time, UTC)"),
            click.option("--to", "until", default=None, help="fixed plan: end (date or ISO time, UTC)"),
            click.option("--deadline", default=None, help="deadline plan: when the jobs must be done"),
            click.option("--job", "jobs", multiple=True, help="deadline plan: a job to finish (repeat)"),
            click.option("--pool", default="", help="one pool of the cluster (default: any of the type)"),
            click.option("--reason", default="", help="why, for the record"),
        )
    ):
        fn = option(fn)
    return fn


def _request(kw: dict[str, Any], plan_id: str = "", allow_partial: bool = False) -> pb.CapacityPlanRequest:
    if plan_id:
        return plan_request(plan_id=plan_id)
    deadline = kw["deadline"] is not None or bool(kw["jobs"])
    if deadline and (kw["since"] is not None or kw["until"] is not None or kw["gpus"]):
        raise click.BadParameter("a deadline plan takes --deadline and --job, not --gpus/--from/--to")
    if deadline:
        end = None if kw["deadline"] is None else parse_when(kw["deadline"], "--deadline")
        return plan_request(
            kind="deadline",
            cluster=kw["cluster"],
            gpu_type=kw["gpu_type"],
            end_s=end,
            job_ids=kw["jobs"],
            pool=kw["pool"],
            reason=kw["reason"],
        )
    return plan_request(
        kind="fixed",
        cluster=kw["cluster"],
        gpu_type=kw["gpu_type"],
        gpus=kw["gpus"],
        start_s=None if kw["since"] is None else parse_when(kw["since"], "--from"),
        end_s=None if kw["until"] is None else parse_when(kw["until"], "--to"),
        pool=kw["pool"],
        reason=kw["reason"],
        allow_partial=allow_partial,
    )


def register(cli: click.Group, rpc: Callable[[Any], Any]) -> None:
    @cli.group()
    def capacity() -> None:
        """Scalable node pools and capacity plans (infra)."""

    @capacity.command()
    @click.pass_obj
    @rpc
    def pools(opts: Any) -> None:
        """Scalable pools: nodes, busy nodes, cost, and the change under way (or failing)."""
        with opts.client() as client:
            reply = CapacityClient(client).pools()
        opts.emit(reply, pools_text(reply))

    @capacity.group()
    def plan() -> None:
        """Capacity plans: GPUs held over a window, or enough to finish jobs by a deadline."""

    @plan.command(name="create")
    @_plan_options
    @click.option(
        "--allow-partial",
        is_flag=True,
        help="fixed plan: if the pools cannot hold it whole, hold what fits (else it is refused)",
    )
    @click.pass_obj
    @rpc
    def plan_create(opts: Any, /, allow_partial: bool, **kw: Any) -> None:
        """Create a plan (infra and admins); it is provisioned the lead time before it starts.

        It is refused when the pools' maximums, the clouds' GPU limits or the spend ceiling cannot
        hold it whole (with --allow-partial, a fixed plan holds what fits, its shortfall stated)."""
        if allow_partial and (kw["deadline"] is not None or kw["jobs"]):
            raise click.BadParameter("a deadline plan is all or nothing", param_hint="--allow-partial")
        with opts.client() as client:
            reply = CapacityClient(client).create_plan(_request(kw, allow_partial=allow_partial))
        text = f"plan {reply.plan_id} created ({reply.state})"
        if reply.shortfall_gpus:
            text += (
                f": partial, {reply.gpus} of {reply.requested_gpus} {reply.gpu_type} GPU(s), "
                f"{reply.shortfall_gpus} short, held back by {reply.held_back_by}"
            )
        opts.emit(reply, text)

    @plan.command(name="preview")
    @_plan_options
    @click.option("--id", "plan_id", default="", help="preview a stored plan instead")
    @click.pass_obj
    @rpc
    def plan_preview(opts: Any, /, **kw: Any) -> None:
        """What a plan would change and cost per hour; nothing is stored."""
        with opts.client() as client:
            reply = CapacityClient(client).preview_plan(_request(kw, kw["plan_id"]))
        opts.emit(reply, preview_text(reply))

    @plan.command(name="list")
    @click.option("--all", "include_ended", is_flag=True, help="also plans that stopped over 30 days ago")
    @click.pass_obj
    @rpc
    def plan_list(opts: Any, include_ended: bool) -> None:
        """Plans with their state, the GPUs the pools hold for them now and what those cost, and what
        each delivered so far. Ended and cancelled plans stay listed for 30 days."""
        with opts.client() as client:
            reply = CapacityClient(client).list_plans(include_ended=include_ended)
        opts.emit(reply, plans_text(reply.plans))

    @plan.command(name="cancel")
    @click.argument("plan_id")
    @click.pass_obj
    @rpc
    def plan_cancel(opts: Any, plan_id: str) -> None:
        """Cancel a plan; nodes it held go once idle for the idle TTL."""
        with opts.client() as client:
            reply = CapacityClient(client).cancel_plan(plan_id)
        opts.emit(reply, f"plan {reply.plan_id} cancelled")
