"""`gpufed` for sweeps (docs/jobsets.md, "Sweeps"): what `submit` sends for a `kind: Sweep` file, and
`gpufed sweep results NAME`.

The file is split here only into its template (a TrainingJob manifest, checked by the server as one
submission is) and the rest of its spec (parameters, search, trials, seed, metric), sent as JSON;
the server expands the trials, so the same file gives the same trials whoever submits it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from federation.api.convert import phase_name
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.jobsets import SetRequest, _job_text, counts_text, document_parts
from federation.cli.render import table

_SWEEP_KEYS = ("parameters", "search", "trials", "seed", "metric", "earlyStopping")
_SPEC_KEYS = ("template", "maxParallel", *_SWEEP_KEYS)


def sweep_request(
    document: dict[str, Any], *, name: str = "", array: str = "", max_parallel: int = 0
) -> SetRequest:
    """A Sweep document as SubmitJobSet takes it; `--set` and `--max-parallel` win over the file."""
    if array:
        raise click.BadParameter("--array: a Sweep's trials come from its parameters, not from an array")
    metadata, spec = document_parts(document, "Sweep", _SPEC_KEYS, "template, parameters and metric")
    written = str(metadata.get("name") or "") if isinstance(metadata, dict) else ""
    set_name = name or written
    if not set_name:
        raise click.BadParameter("Sweep metadata.name: required (or give --set NAME)")
    limit = max_parallel or spec.get("maxParallel") or 0
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise click.BadParameter("Sweep spec.maxParallel: must be a whole number")
    if "template" not in spec:
        raise click.BadParameter("Sweep spec.template: required (the TrainingJob each trial runs)")
    sweep = {key: spec[key] for key in _SWEEP_KEYS if key in spec}
    return SetRequest(
        set_name,
        (_job_text(spec["template"], "spec.template"),),
        "",
        limit,
        json.dumps(sweep, default=str),
    )


def metric_text(trial: pb.SweepTrial) -> str:
    return f"{trial.metric:.6g}" if trial.HasField("metric") else "-"


def phase_text(trial: pb.SweepTrial) -> str:
    return "HELD" if trial.held else (phase_name(trial.phase) if trial.phase else "-")


def results_text(reply: pb.SweepResults) -> str:
    s = reply.job_set
    head = (
        f"Sweep:   {s.name} ({reply.search}, {s.job_count} trials, {counts_text(s)})\n"
        f"Metric:  {reply.metric} ({reply.goal}); trials without one are listed last\n"
        f"Cost:    {'$' + s.cost_usd if s.cost_usd else '-'}, {s.gpu_hours:.3f} GPU-hours\n\n"
    )
    rows = [
        [
            str(t.rank) if t.rank else "-",
            t.key,
            " ".join(f"{p.name}={p.value}" for p in t.parameters),
            phase_text(t),
            metric_text(t),
            f"${t.cost_usd}" if t.cost_usd else "-",
            t.job_id,
        ]
        for t in reply.trials
    ]
    return head + table(["RANK", "TRIAL", "PARAMETERS", "PHASE", reply.metric.upper(), "COST", "JOB"], rows)


def register(cli: click.Group, rpc: Callable[[Any], Any]) -> None:
    @cli.group(name="sweep")
    def sweep() -> None:
        """Hyperparameter sweeps: a job set of trials ranked by a metric (docs/jobsets.md)."""

    @sweep.command(name="results")
    @click.argument("name")
    @click.option("--tenant", default="", help="admins and infra: the sweep's tenant")
    @click.pass_obj
    @rpc
    def results(opts: Any, name: str, tenant: str) -> None:
        """The sweep's trials ranked by its metric, best first, with parameters, phase and cost."""
        with opts.client() as client:
            reply = client.sweep_results(name, tenant=tenant)
        opts.emit(reply, results_text(reply))
