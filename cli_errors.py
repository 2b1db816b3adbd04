"""How the command line ends: swapplan's errors, click's usage errors and memory
exhaustion as one line and an exit status (0 success, 1 a plan that does not fit, 2 bad
input, 3 an internal error, 130 interrupted); ``--debug`` adds the traceback first."""
from __future__ import annotations

import os
import sys
import traceback

import click

from simulator.errors import InputError, SwapplanError, shorten

from cli_text import out_of_memory_line

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


def one_line(text: str) -> str:
    """A message as one printable line: whitespace collapsed, long values shortened,
    characters that cannot be encoded (a lone surrogate) escaped."""
    text = shorten(" ".join(str(text).split()))
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class OneLineErrors(click.Group):
    """Turns swapplan's errors, and click's usage errors, into one line and an exit status."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:  # a usage error: one line, not click's three
            if type(exc).__name__ == "NoArgsIsHelpError":  # `swapplan` alone: the help, as before
                exc.show()
                sys.exit(exc.exit_code)
            ctx = getattr(exc, "ctx", None)
            command = ctx.command_path if ctx is not None else (prog_name or "swapplan")
            hint = f" (see '{command} --help')" if isinstance(exc, click.UsageError) else ""
            click.echo(f"error: {command}: {one_line(exc.format_message()).rstrip('.')}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context):
        def debug() -> bool:  # read late: the group's own --debug is parsed inside super().invoke
            return bool(ctx.obj and ctx.obj.get("debug"))

        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except SwapplanError as exc:
            if debug():
                traceback.print_exc()
            message = exc.line() if isinstance(exc, InputError) else str(exc)
            click.echo("error: " + one_line(message), err=True)
            ctx.exit(EXIT_BAD_INPUT)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except BrokenPipeError:  # `swapplan ... | head`: the reader has gone, say nothing
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(0)
        except MemoryError as exc:  # input too large for this machine: bad input, not a bug
            traceback.clear_frames(exc.__traceback__)   # let go of what filled memory first
            if debug():
                traceback.print_exc()
            click.echo("error: " + one_line(_out_of_memory(ctx, exc)), err=True)
            ctx.exit(EXIT_BAD_INPUT)
        except Exception as exc:  # a bug in swapplan: say so in one line
            if debug():
                traceback.print_exc()
            click.echo(one_line(f"internal error: {type(exc).__name__}: {exc}")
                       + " (run again with --debug for the traceback, and please report it)", err=True)
            ctx.exit(EXIT_INTERNAL)


def _out_of_memory(ctx: click.Context, exc: MemoryError) -> str:
    """The one line for a MemoryError (cli_text.out_of_memory_line)."""
    return out_of_memory_line(" ".join(p for p in (ctx.command_path, ctx.invoked_subcommand) if p), exc)


TRACE_EXTRA = ("needs the 'trace' extra (torch, transformers): pip install 'swapplan[trace]' "
                "(from a checkout: pip install -e '.[trace]')")


def need_torch(command: str | None = None) -> None:
    """InputError (exit 2), one line ``<command> needs the 'trace' extra ...``, when torch
    is missing (or its import is blocked); ``command`` defaults to the one running."""
    import importlib.util

    if command is None:
        ctx = click.get_current_context(silent=True)
        command = ctx.info_name if ctx is not None and ctx.info_name else "swapplan"

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # ValueError: blocked (sys.modules["torch"] is None)
        found = False
    if not found:
        raise InputError("", "", f"{command} {TRACE_EXTRA}")
