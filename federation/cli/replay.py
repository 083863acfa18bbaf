"""`gpufed replay`: replay a job trace through the real placer on a simulated federation.

For users with their own traces (the Philly columns: job_id, submit_time_s, duration_s, num_gpus,
tenant) and their own clusters and prices, described in a config like `bench/replay.yaml`. Runs
locally: no server, etcd or cluster is needed.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from federation.cli.output import OutputHolder
from federation.cli.render import structured
from federation.logs import configure_logging
from federation.replay.errors import ReplayError

if TYPE_CHECKING:
    from federation.replay.sweep import Executor

# The replay's modules (the simulator, the report's plots) are imported when `gpufed replay` runs,
# not by every `gpufed` command: `gpufed serve` would pay for them on every restart.


def executor_for(workers: int, use_ray: bool) -> Executor:
    from federation.replay.sweep import process_pool, ray_executor, serial

    if use_ray:
        return ray_executor(max(1, workers))
    return process_pool(workers) if workers > 1 else serial


@click.command("replay")
@click.option(
    "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True
)
@click.option(
    "--trace",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Overrides the config's trace.",
)
@click.option(
    "--prices",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Overrides the config's price file.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for table, CSV and plots.",
)
@click.option("--workers", type=int, default=1, show_default=True, help="Local processes (1: serial).")
@click.option("--ray", "use_ray", is_flag=True, help="Run the sweep in parallel with Ray (local, loopback).")
def replay(
    config_path: Path, trace: Path | None, prices: Path | None, out: Path, workers: int, use_ray: bool
) -> None:
    """Replay a trace under every policy of the config, at every private size, and report."""
    from federation.replay.config import load_config
    from federation.replay.report import write_all
    from federation.replay.sweep import sweep

    # Progress events to stderr, as every command's: stdout is the table, or the JSON under -o json.
    configure_logging()
    try:
        config = load_config(config_path)
        if trace is not None:
            config = dataclasses.replace(config, trace_path=trace.resolve())
        if prices is not None:
            config = dataclasses.replace(config, prices_path=prices.resolve())
        rows = sweep(config, executor_for(workers, use_ray))
    except ReplayError as error:
        raise click.ClickException(str(error)) from error
    command = "gpufed " + " ".join(sys.argv[1:])
    lines = write_all(rows, out, command)
    holder = click.get_current_context().find_object(OutputHolder)
    fmt = holder.output if holder is not None else "table"
    if fmt != "table":
        # The figures themselves are in the CSV under `out`; this says where, with the headlines.
        click.echo(structured({"results": str(out), "headlines": lines}, fmt))
        return
    for line in lines:
        click.echo(line)
    click.echo(f"results in {out}")


def register(cli: click.Group) -> None:
    cli.add_command(replay)
