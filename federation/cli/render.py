"""How the CLI shows API replies: a table for people, JSON or YAML for scripts."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import yaml
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from federation.api.convert import phase_name
from federation.api.v1 import gpufed_pb2 as pb
from federation.store.money import format_usd, micro_usd_of

# A job in these phases runs no more: its cost is final.
_ENDED = frozenset({pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED})

FORMATS = ("table", "json", "yaml")


def as_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def structured(payload: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(payload, indent=2, sort_keys=False)
    return yaml.safe_dump(payload, sort_keys=False).rstrip()


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def _age(job: pb.Job) -> str:
    seconds = max(0, int(datetime.now(UTC).timestamp() - job.submitted_at.seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


# A failure's message in the REASON column, cut to stay a column; `get` shows it whole.
REASON_WIDTH = 60


def list_reason(job: pb.Job) -> str:
    """Why it failed or waits (OOMKilled, Error (exit 3), ImagePullBackOff), not only "failed".

    A pod's reason when there is one; else, for a FAILED job, the failure's message (a staging that
    failed, a gang lost with no retries left), which `get` shows too.
    """
    if job.reason:
        return job.reason
    if job.phase == pb.JOB_PHASE_FAILED and job.message:
        first = job.message.splitlines()[0]
        return first if len(first) <= REASON_WIDTH else first[: REASON_WIDTH - 1] + "…"
    return "-"


def jobs_table(jobs: Sequence[pb.Job]) -> str:
    rows = [
        [
            j.job_id,
            j.tenant,
            phase_name(j.phase),
            list_reason(j),
            f"{j.gpu_count}x{j.gpu_type or '/'.join(j.gpu_types)}",
            j.cluster or "-",
            f"${j.usd_per_gpu_hour:.2f}" if j.cluster else "-",
            str(j.attempt),
            _age(j),
        ]
        for j in jobs
    ]
    return table(["JOB", "TENANT", "PHASE", "REASON", "GPUS", "CLUSTER", "$/GPU-H", "ATTEMPT", "AGE"], rows)


def cost_line(job: pb.Job) -> str:
    """What the job has cost, to the cent (half to even, from the API's exact micro-dollars, as
    `gpufed report ledger` rounds each row), or that it never ran."""
    return f"Cost:      {cost_text(job)}"


def cost_text(job: pb.Job) -> str:
    if not job.cost_usd:
        return "none: no attempt has run"
    cents = format_usd(micro_usd_of(job.cost_usd), places=2)
    so_far = "" if job.phase in _ENDED else " so far"
    return f"${cents}{so_far} (USD {job.cost_usd})"


def _gpu_request(job: pb.Job) -> str:
    """The GPU types the job accepts; a job that asks only for memory names none (its manifest says how
    much, as `spec.minGpuMemoryGiB`)."""
    if job.gpu_types:
        return ", ".join(job.gpu_types)
    memory = re.search(r"^\s*minGpuMemoryGiB:\s*(\S+)", job.manifest, re.M)
    return f"any type with {memory.group(1)} GiB or more" if memory else "any type"


def job_detail(job: pb.Job) -> str:
    lines = [
        f"Job:       {job.job_id} ({job.name})",
        f"Tenant:    {job.tenant}   User: {job.user}",
        f"Phase:     {phase_name(job.phase)}   Attempt: {job.attempt}",
        f"Priority:  {job.priority_class} ({job.priority})",
        f"Gang:      {job.replica_count} replicas, {job.gpu_count} GPUs of {_gpu_request(job)}",
    ]
    if job.cluster:
        lines.append(
            f"Placed:    {job.cluster}: {job.gpu_type} {job.capacity_kind}"
            f" at ${job.usd_per_gpu_hour:.2f}/GPU-hour"
        )
    lines.append(cost_line(job))
    if job.reason:
        lines.append(f"Reason:    {job.reason}")
    if job.message:
        lines.append(f"Message:   {job.message}")
    lines.append("Events:")
    for e in job.events:
        at = datetime.fromtimestamp(e.at.seconds + e.at.nanos / 1e9, UTC).strftime("%H:%M:%S.%f")[:-3]
        lines.append(f"  {at}  {phase_name(e.phase):<10} attempt {e.attempt}  {e.reason}".rstrip())
    return "\n".join(lines)


def explain_text(reply: pb.ExplainJobResponse) -> str:
    lines = [f"{reply.job_id}: {reply.summary}"]
    for r in reply.reasons:
        where = "/".join(x for x in (r.cluster, r.gpu_type) if x)
        lines.append(f"  - [{r.code}]{' ' + where if where else ''}: {r.message}")
    return "\n".join(lines)


def _up(c: pb.Cluster) -> str:
    if not c.reachable:
        return "NO"
    return "REFUSING" if c.state == "refusing" else "yes"


def _clock(ts: Any) -> str:
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, UTC).strftime("%H:%M:%S")


def clusters_table(reply: pb.ListClustersResponse) -> str:
    """Pools by cluster; then a line for each cluster that keeps refusing dispatches."""
    rows = [
        [
            c.name,
            c.provider,
            c.region,
            _up(c),
            p.name,
            p.gpu_type,
            p.capacity_kind,
            f"${p.usd_per_gpu_hour:.2f}",
            f"{p.free_gpus}/{p.gpus_per_node * p.node_count}",
        ]
        for c in reply.clusters
        for p in c.pools
    ]
    text = table(["CLUSTER", "PROVIDER", "REGION", "UP", "POOL", "GPU", "KIND", "$/GPU-H", "FREE"], rows)
    notes = [
        f"{c.name}: refusing dispatches since {_clock(c.refusing_since)} UTC ({c.refused_jobs} job(s)); "
        f"backing off, next try {_clock(c.next_try)} UTC; last error: {c.last_error}"
        for c in reply.clusters
        if c.state == "refusing"
    ]
    return "\n".join([text, *notes]) if notes else text


def summary_table(reply: pb.JobSummary) -> str:
    """GPUs by tenant, GPU type and group (running, admitted: placed not yet running, queued)."""
    rows = [
        [r.tenant, r.gpu_type, pb.JobGroup.Name(r.group).removeprefix("JOB_GROUP_"), str(r.gpus), str(r.jobs)]
        for r in reply.rows
    ]
    return table(["TENANT", "GPU", "GROUP", "GPUS", "JOBS"], rows)
