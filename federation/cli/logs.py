"""`gpufed logs` and `gpufed describe`: what an engineer asks of a job, without a kubeconfig.

`logs` prints the lines of every replica (or those asked for), each prefixed with its task and
replica as kubetail and stern do, from the server's `StreamLogs`; with `-f` it follows until the
job's attempt ends. What happens to the stream itself (a cluster that stops answering, a container
not started yet, a kept copy that was cut) goes to stderr, so that stdout holds only log lines.
Under `-o json` each line is one JSON object (JSON Lines: pod, container, timestamp, text, and the
task, replica, attempt and source), and so is each notice on stderr; `-o yaml` writes the same
objects as one YAML document each. A failed call is an error in the chosen format and a non-zero
exit, as for every command. `describe` shows one view
across all of a job's attempts (`DescribeJob`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import click

from federation.api.convert import phase_name
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.render import cost_line, structured, table
from federation.joblogs.stream import split_line

_SINCE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str) -> int:
    """`10m`, `90s`, `1h30m` -> whole seconds (at least 1)."""
    parts = _SINCE.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise click.BadParameter(f"{text!r} is not a duration like 30s, 10m or 1h30m", param_hint="--since")
    seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    return max(1, round(seconds))


def _when(ts: Any) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S")


def log_lines(chunks: Sequence[pb.LogChunk] | Any, *, prefix: bool, out: Any, err: Any) -> int:
    """Print chunks as they come; returns the number of lines printed."""
    count = 0
    for chunk in chunks:
        tag = f"{chunk.task}-{chunk.replica}" if chunk.task else "gpufed"
        if chunk.notice:
            err.write(f"[{tag}] {chunk.notice}\n")
            err.flush()
        if chunk.lines:
            lead = f"{tag} | " if prefix else ""
            out.write("".join(f"{lead}{line}\n" for line in chunk.lines))
            out.flush()
            count += len(chunk.lines)
    return count


def _structured_line(record: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(record, ensure_ascii=False) + "\n"
    # A YAML document each, as `watch -o yaml` streams: what was printed so far always parses.
    return "---\n" + structured(record, "yaml").rstrip("\n") + "\n"


def log_records(
    chunks: Sequence[pb.LogChunk] | Any, *, fmt: str, timestamps: bool, out: Any, err: Any
) -> int:
    """Print chunks as JSON or YAML objects, one a line; returns the number of lines printed.
    The lines were asked for with their stamps (`timestamps` says whether the user wanted them
    left on the text too)."""
    count = 0
    for chunk in chunks:
        where = {
            "task": chunk.task,
            "replica": chunk.replica,
            "attempt": chunk.attempt,
            "pod": chunk.pod,
            "container": chunk.container,
        }
        if chunk.notice:
            err.write(_structured_line({**where, "source": chunk.source, "notice": chunk.notice}, fmt))
            err.flush()
        if chunk.lines:
            for line in chunk.lines:
                stamp, text = split_line(line)
                record = {
                    **where,
                    "source": chunk.source,
                    "timestamp": stamp,
                    "text": line if timestamps else text,
                }
                out.write(_structured_line(record, fmt))
            out.flush()
            count += len(chunk.lines)
    return count


def _replicas_table(attempt: pb.AttemptDescription) -> str:
    rows = [
        [
            f"{r.task}-{r.replica}",
            r.pod,
            r.node or "-",
            r.phase,
            str(r.restarts),
            str(r.exit_code) if r.HasField("exit_code") else "-",
            r.reason or "-",
        ]
        for r in attempt.replicas
    ]
    text = table(["REPLICA", "POD", "NODE", "PHASE", "RESTARTS", "EXIT", "REASON"], rows)
    return "\n".join(f"    {line}" for line in text.splitlines())


def describe_text(d: pb.JobDescription) -> str:
    job = d.job
    phase = phase_name(job.phase) + (f" ({job.reason})" if job.reason else "")
    lines = [
        f"Job:       {job.job_id} ({job.name})",
        f"Tenant:    {job.tenant}   User: {job.user}",
        f"Phase:     {phase}   Attempt: {job.attempt}",
        f"Submitted: {_when(job.submitted_at)}",
        cost_line(job),
    ]
    if job.message:
        lines.append(f"Message:   {job.message}")
    lines.append("Spec:")
    lines.extend(f"  {s}" for s in d.spec_summary)
    for a in d.attempts:
        where = (
            f"{a.cluster}: {a.gpu_type} {a.capacity_kind} at ${a.usd_per_gpu_hour:.2f}/GPU-hour"
            if a.cluster
            else "-"
        )
        lines.append(f"Attempt {a.attempt}:  {where}")
        lines.append(f"  Started:  {_when(a.started_at)}   Finished: {_when(a.finished_at)}")
        outcome = a.outcome or "running"
        lines.append(f"  Outcome:  {outcome}" + (f"   Reason: {a.reason}" if a.reason else ""))
        if a.savings:
            lines.append(f"  Savings:  {a.savings}")
        note = a.note + ("; logs kept" if a.logs_kept else "")
        if note:
            lines.append(f"  Source:   {note}")
        if a.replicas:
            lines.append("  Replicas:")
            lines.append(_replicas_table(a))
        if a.events:
            lines.append("  Events:")
            for e in a.events:
                count = f" (x{e.count})" if e.count > 1 else ""
                what = f"{e.object_kind}/{e.object_name}"
                lines.append(f"    {_when(e.last_at)}  {e.type:<7} {what}  {e.reason}{count}: {e.message}")
    if d.wait_reasons:
        lines.append("Waiting:")
        lines.extend(f"  - {w}" for w in d.wait_reasons)
    return "\n".join(lines)


def register(cli: click.Group, rpc: Callable[[Any], Any]) -> None:
    @cli.command()
    @click.argument("job_id")
    @click.option("--task", default="", help="only this task's replicas")
    @click.option("--replica", type=int, default=None, help="only this replica index (of each task)")
    @click.option("--attempt", type=int, default=0, help="an earlier attempt (default: the current one)")
    @click.option("-f", "--follow", is_flag=True, help="stream lines as they are written, until the job ends")
    @click.option("--tail", type=int, default=None, help="the last N lines of each replica")
    @click.option("--since", default=None, help="lines newer than this: 30s, 10m, 1h")
    @click.option("--timestamps", is_flag=True, help="prefix each line with its RFC 3339 time")
    @click.option("--previous", is_flag=True, help="the container run before its last restart")
    @click.option("--no-prefix", is_flag=True, help="do not prefix lines with task-replica")
    @click.pass_obj
    @rpc
    def logs(opts: Any, job_id: str, **kw: Any) -> None:
        """Print a job's logs: every replica's lines, each prefixed with its task and replica."""
        structured = opts.output in ("json", "yaml")
        request = pb.StreamLogsRequest(
            job_id=job_id,
            task=kw["task"],
            attempt=kw["attempt"],
            follow=kw["follow"],
            # A structured line carries its stamp in a field of its own.
            timestamps=kw["timestamps"] or structured,
            previous=kw["previous"],
        )
        if kw["replica"] is not None:
            request.replica = kw["replica"]
        if kw["tail"] is not None:
            if kw["tail"] < 0:
                raise click.BadParameter("must not be negative", param_hint="--tail")
            request.tail_lines = kw["tail"]
        if kw["since"] is not None:
            request.since_seconds = parse_since(kw["since"])
        with opts.client() as client:
            stream = client.logs(request)
            try:
                if structured:
                    log_records(
                        stream, fmt=opts.output, timestamps=kw["timestamps"], out=sys.stdout, err=sys.stderr
                    )
                else:
                    log_lines(stream, prefix=not kw["no_prefix"], out=sys.stdout, err=sys.stderr)
            except KeyboardInterrupt:
                stream.cancel()

    @cli.command()
    @click.argument("job_id")
    @click.pass_obj
    @rpc
    def describe(opts: Any, job_id: str) -> None:
        """One view of a job across its attempts: placements, pods, exit codes, events, wait reasons."""
        with opts.client() as client:
            reply = client.describe(job_id)
        opts.emit(reply, describe_text(reply))
