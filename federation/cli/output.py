"""`-o/--output` in both places (`gpufed -o json get J` and `gpufed get J -o json`), and errors in the
chosen format.

Every command of the tree gets the same `-o` option, added once by `accept_output_everywhere` after all
commands are registered, so a command added later has it without doing anything. Its value lands on
the context object (`OutputHolder.output`, the `_Opts` of `federation.cli.main`), where a command reads
it: `opts.output` with `@click.pass_obj`, or `ctx.find_object(OutputHolder).output`. The one given
after the subcommand wins over the one before it.

Errors: under `-o json` a failed command prints one JSON object on stderr,
`{"error": {"code": ..., "message": ..., "exit_code": ...}}` (`-o yaml`: the same as YAML), and exits
non-zero as in table mode. stdout holds only results, in every format, so a script that parses stdout
never mistakes an error for an answer. The format of an error is read from the command line itself
(the last `-o` on it), because a usage error happens before click has parsed the options.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from federation.cli.render import FORMATS, structured
from federation.errors import GpufedError

STRUCTURED = ("json", "yaml")
# A project error that reaches the top (a bad config, a component that would not start).
CONFIG_EXIT_CODE = 2


class OutputHolder:
    """The context object's part that commands read the chosen format from."""

    output: str = "table"


class RpcFailed(click.ClickException):
    """A gRPC call the server refused: its status code kept apart for structured errors."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


def _remember(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is None:
        return
    holder = ctx.find_object(OutputHolder)
    if holder is not None:
        holder.output = value


def output_option() -> click.Option:
    return click.Option(
        ["-o", "--output"],
        type=click.Choice(FORMATS),
        default=None,
        expose_value=False,
        callback=_remember,
        help="output format (the same as `gpufed -o`; given here, it wins)",
    )


def _has_output(command: click.Command) -> bool:
    return any({"-o", "--output"} & set(p.opts) for p in command.params if isinstance(p, click.Option))


def accept_output_everywhere(group: click.Group) -> None:
    """Give every command under `group` (at any depth) the shared `-o`, unless it has its own."""
    for command in group.commands.values():
        if isinstance(command, click.Group):
            accept_output_everywhere(command)
            if not command.invoke_without_command:
                continue
        if not _has_output(command):
            command.params.append(output_option())


def requested_format(args: Sequence[str]) -> str:
    """The last `-o`/`--output` on the command line that names a format of ours; else "table"."""
    chosen = "table"
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            break
        value: str | None = None
        if arg in ("-o", "--output") and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        elif arg.startswith("--output="):
            value = arg.removeprefix("--output=")
        elif arg.startswith("-o") and not arg.startswith("--") and len(arg) > 2:
            value = arg[2:]
        if value is not None:
            chosen = value if value in FORMATS else "table"
        i += 1
    return chosen


def error_payload(code: str, message: str, exit_code: int) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "exit_code": exit_code}}


def _described(error: click.ClickException) -> tuple[str, str]:
    """The error's code (the gRPC status, USAGE or ERROR) and its message without the code."""
    if isinstance(error, RpcFailed):
        return error.code, error.details
    if isinstance(error, click.UsageError):
        return "USAGE", error.format_message()
    return "ERROR", error.format_message()


def _report(fmt: str, code: str, message: str, exit_code: int, show: Callable[[], None]) -> None:
    if fmt in STRUCTURED:
        click.echo(structured(error_payload(code, message, exit_code), fmt), err=True)
    else:
        show()


class OutputGroup(click.Group):
    """The top-level group: runs a command like click's standalone mode, reporting errors in the
    format the command line asked for."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, False, **extra)
        fmt = requested_format(argv)
        try:
            result = super().main(argv, prog_name, complete_var, False, **extra)
        except click.ClickException as error:
            code, message = _described(error)
            _report(fmt, code, message, error.exit_code, error.show)
            sys.exit(error.exit_code)
        except click.Abort:
            _report(fmt, "ABORTED", "aborted", 1, lambda: click.echo("Aborted!", err=True))
            sys.exit(1)
        except GpufedError as error:
            # A bad config or a component that would not start: say which, without a traceback.
            text = str(error)
            _report(
                fmt,
                type(error).__name__,
                text,
                CONFIG_EXIT_CODE,
                lambda: click.echo(f"error: {text}", err=True),
            )
            sys.exit(CONFIG_EXIT_CODE)
        except OSError as error:
            if error.errno != errno.EPIPE:
                raise
            # stdout closed by a reader that had enough (`| head`): not an error, as in click.
            sys.exit(1)
        # Non-standalone click returns an `Exit`'s code, or the command's value (None for ours).
        sys.exit(result if isinstance(result, int) else 0)
