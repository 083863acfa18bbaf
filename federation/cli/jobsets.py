"""`gpufed` for job sets and arrays (docs/jobsets.md): what `submit` sends for a JobSet file or
`--array`, `gpufed set list|watch|cancel|resubmit`, `gpufed describe set NAME`, and the tables.

A JobSet file is read here, on the user's machine, only to split it into its jobs: each job goes to
the server as its own TrainingJob manifest, which the server checks as it checks one submission.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import click
import yaml

from federation.api.convert import phase_name
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.render import as_dict, cost_text, structured, table

JOBSET_KIND = "JobSet"
SWEEP_KIND = "Sweep"
TRAINING_JOB_KIND = "TrainingJob"
API_VERSION = "gpufed.io/v1"
_TOP_KEYS = ("apiVersion", "kind", "metadata", "spec")
_SPEC_KEYS = ("maxParallel", "jobs", "array", "template")


@dataclass(frozen=True, slots=True)
class SetRequest:
    """What SubmitJobSet gets: the set's name, its jobs' manifests, the array range and the limit."""

    name: str
    manifests: tuple[str, ...]
    array: str = ""
    max_parallel: int = 0
    # A Sweep's spec without its template, as JSON (federation.cli.sweeps); "" for other sets.
    sweep: str = ""


def _job_text(job: Any, where: str) -> str:
    if not isinstance(job, dict):
        raise click.BadParameter(f"{where}: expected a TrainingJob (a mapping), got {type(job).__name__}")
    # A member may leave out apiVersion and kind: inside a JobSet, a job is a TrainingJob.
    filled = {"apiVersion": API_VERSION, "kind": TRAINING_JOB_KIND, **job}
    return json.dumps(filled, default=str)


def load_document(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise click.BadParameter(f"not YAML: {error}") from error


def is_job_set(document: Any) -> TypeGuard[dict[str, Any]]:
    """A JobSet, or a Sweep (a job set whose members are trials)."""
    return isinstance(document, dict) and document.get("kind") in (JOBSET_KIND, SWEEP_KIND)


def document_parts(
    document: dict[str, Any], kind: str, spec_keys: tuple[str, ...], spec_needs: str
) -> tuple[Any, dict[str, Any]]:
    """A JobSet's or Sweep's metadata and spec, after the checks both share: known top-level and spec
    keys, the API version, a spec that is a mapping. Errors name the kind and the key."""
    unknown = sorted(set(document) - set(_TOP_KEYS))
    if unknown:
        raise click.BadParameter(f"{kind}: unknown key {unknown[0]!r} (known: {', '.join(_TOP_KEYS)})")
    if document.get("apiVersion") != API_VERSION:
        raise click.BadParameter(f"{kind} apiVersion: must be {API_VERSION!r}")
    spec = document.get("spec")
    if not isinstance(spec, dict):
        raise click.BadParameter(f"{kind} spec: required, with {spec_needs}")
    unknown = sorted(set(spec) - set(spec_keys))
    if unknown:
        raise click.BadParameter(f"{kind} spec: unknown key {unknown[0]!r} (known: {', '.join(spec_keys)})")
    return document.get("metadata") or {}, spec


def set_request(
    document: dict[str, Any], *, name: str = "", array: str = "", max_parallel: int = 0
) -> SetRequest:
    """A JobSet document's jobs, array and limit; options given on the command line win."""
    if document.get("kind") == SWEEP_KIND:
        from federation.cli.sweeps import sweep_request

        return sweep_request(document, name=name, array=array, max_parallel=max_parallel)
    metadata, spec = document_parts(document, JOBSET_KIND, _SPEC_KEYS, "jobs (a list) or array and template")
    set_name = name or str(metadata.get("name") or "")
    if not set_name:
        raise click.BadParameter("JobSet metadata.name: required (or give --set NAME)")
    limit = max_parallel or spec.get("maxParallel") or 0
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise click.BadParameter("JobSet spec.maxParallel: must be a whole number")
    range_text = array or str(spec.get("array") or "")
    if range_text:
        if "jobs" in spec:
            raise click.BadParameter("JobSet spec: an array has one template, not jobs")
        return SetRequest(set_name, (_job_text(spec.get("template"), "spec.template"),), range_text, limit)
    if "template" in spec:
        raise click.BadParameter("JobSet spec.template: only with spec.array (or --array)")
    jobs = spec.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise click.BadParameter("JobSet spec.jobs: a list of one or more TrainingJobs")
    return SetRequest(set_name, tuple(_job_text(j, f"spec.jobs[{i}]") for i, j in enumerate(jobs)), "", limit)


def array_request(text: str, document: Any, *, name: str, array: str, max_parallel: int) -> SetRequest:
    """`gpufed submit job.yaml --array 0-199%20`: the one manifest, run once per index."""
    if not name:
        metadata = document.get("metadata") if isinstance(document, dict) else None
        name = str(metadata.get("name") or "") if isinstance(metadata, dict) else ""
    if not name:
        raise click.BadParameter("the manifest has no metadata.name: give the array's name with --set NAME")
    return SetRequest(name, (text,), array, max_parallel)


def set_table(sets: Sequence[pb.JobSet]) -> str:
    rows = [
        [
            s.name,
            s.tenant,
            str(s.job_count),
            counts_text(s),
            str(s.max_parallel or "-"),
            f"{s.gpu_hours:.2f}",
            f"${s.cost_usd}" if s.cost_usd else "-",
            "done" if s.done else ("cancelling" if s.cancel_requested else "active"),
        ]
        for s in sets
    ]
    return table(["SET", "TENANT", "JOBS", "PHASES", "AT-ONCE", "GPU-H", "COST", "STATE"], rows)


def counts_text(s: pb.JobSet) -> str:
    return " ".join(f"{c.phase.lower()}={c.jobs}" for c in s.counts) or "-"


def set_detail(s: pb.JobSet) -> str:
    job = pb.Job(cost_usd=s.cost_usd, phase=pb.JOB_PHASE_SUCCEEDED if s.done else pb.JOB_PHASE_RUNNING)
    lines = [
        f"Set:       {s.name}",
        f"Tenant:    {s.tenant}",
        f"User:      {s.user}",
        f"Array:     {s.array}" if s.array else "Array:     - (named jobs)",
        f"At once:   {s.max_parallel or 'no limit'}",
        f"Jobs:      {s.job_count} ({counts_text(s)})",
        f"GPU-hours: {s.gpu_hours:.3f}",
        f"Cost:      {cost_text(job)}",
        f"State:     {'done' if s.done else 'active'}"
        + (f"; cancel requested: {s.cancel_reason}" if s.cancel_requested else ""),
        "",
    ]
    rows = [
        [
            m.key,
            m.job_id,
            "HELD" if m.held else (phase_name(m.phase) if m.phase else "-"),
            m.cluster or "-",
            str(len(m.earlier_job_ids)),
            m.reason or "-",
        ]
        for m in s.members
    ]
    return "\n".join(lines) + table(["MEMBER", "JOB", "PHASE", "CLUSTER", "RERUNS", "REASON"], rows)


def submitted_text(reply: pb.SubmitJobSetResponse) -> str:
    s = reply.job_set
    if not reply.created:
        return f"job set {s.name} already submitted (nothing new created): {counts_text(s)}"
    return f"job set {s.name} submitted: {s.job_count} jobs, {counts_text(s)}"


def register(cli: click.Group, rpc: Callable[[Any], Any]) -> None:
    @cli.group(name="set")
    def job_set() -> None:
        """Job sets and arrays: many jobs under one name (docs/jobsets.md)."""

    @job_set.command(name="list")
    @click.option("--tenant", default="", help="admins and infra: one tenant (default all)")
    @click.pass_obj
    @rpc
    def list_sets(opts: Any, tenant: str) -> None:
        """Your tenant's job sets with their counts by phase, GPU-hours and cost so far."""
        with opts.client() as client:
            reply = client.list_sets(tenant=tenant)
        opts.emit(reply, set_table(reply.job_sets))

    @job_set.command(name="describe")
    @click.argument("name")
    @click.option("--tenant", default="", help="admins and infra: the set's tenant")
    @click.pass_obj
    @rpc
    def describe_set(opts: Any, name: str, tenant: str) -> None:
        """One set: its status and every member (also `gpufed describe set NAME`)."""
        with opts.client() as client:
            reply = client.get_set(name, tenant=tenant)
        opts.emit(reply, set_detail(reply))

    @job_set.command(name="watch")
    @click.argument("name")
    @click.option("--tenant", default="")
    @click.pass_obj
    @rpc
    def watch_set(opts: Any, name: str, tenant: str) -> None:
        """The set's counts as its jobs move, until every member has ended."""
        with opts.client() as client:
            for s in client.watch_set(name, tenant=tenant):
                if opts.output == "table":
                    cost = f"${s.cost_usd}" if s.cost_usd else "$0"
                    click.echo(f"{s.name}  {counts_text(s)}  {s.gpu_hours:.2f} GPU-h  {cost}")
                elif opts.output == "json":
                    click.echo(json.dumps(as_dict(s)))
                else:
                    click.echo("---\n" + structured(as_dict(s), "yaml"))

    @job_set.command(name="cancel")
    @click.argument("name")
    @click.option("--tenant", default="")
    @click.option("--reason", default="")
    @click.pass_obj
    @rpc
    def cancel_set(opts: Any, name: str, tenant: str, reason: str) -> None:
        """Cancel a set: held jobs never start, running ones are stopped on their clusters."""
        with opts.client() as client:
            reply = client.cancel_set(name, tenant=tenant, reason=reason)
        opts.emit(reply, f"job set {reply.name} cancellation requested: {counts_text(reply)}")

    @job_set.command(name="resubmit")
    @click.argument("name")
    @click.option("--tenant", default="")
    @click.pass_obj
    @rpc
    def resubmit_set(opts: Any, name: str, tenant: str) -> None:
        """Run the set's failed jobs again (as new jobs, within the set's limit)."""
        with opts.client() as client:
            reply = client.resubmit_set(name, tenant=tenant)
        opts.emit(reply, f"job set {reply.name} resubmitted its failed jobs: {counts_text(reply)}")

    # `gpufed describe set NAME` beside `gpufed describe JOB_ID`: a job id always ends in hex
    # digits after a dash, so the word `set` is never one.
    job_describe = cli.commands.get("describe")
    if job_describe is None:
        return

    @cli.command(name="describe")
    @click.argument("what")
    @click.argument("name", required=False, default="")
    @click.option("--tenant", default="", help="with `set`: admins and infra name the set's tenant")
    @click.pass_context
    def describe(ctx: click.Context, what: str, name: str, tenant: str) -> None:
        """One view of a job across its attempts (`describe JOB_ID`), or of a set (`describe set NAME`)."""
        if what == "set":
            if not name:
                raise click.UsageError("describe set: give the set's NAME")
            ctx.invoke(describe_set, name=name, tenant=tenant)
            return
        if name:
            raise click.UsageError(f"describe takes one job id, or `set NAME`; got {what!r} and {name!r}")
        ctx.invoke(job_describe, job_id=what)
