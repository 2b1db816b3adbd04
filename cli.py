"""The swapplan command line: parses, calls one library function, prints.

Bad input of any kind, a usage error included, exits with status 2 and one line
``error: <file>: <where>: <problem>`` (long values shortened); ``--debug`` (anywhere on
the line) prints the traceback before that line and keeps the exit status.

This module is the group, its options and the entry point; each command lives in a module
of its own (cli_info, cli_profile, cli_simulate, cli_plan, cli_run, cli_fit, cli_shard), which imports
nothing of cli; cli_common holds what they share, cli_text what they print, cli_errors how
they end.
"""
from __future__ import annotations

import sys

import click

from cli_errors import OneLineErrors
from cli_fit import fit_cmd
from cli_info import hardware_cmd, info, planners_cmd, profiles_cmd, validate
from cli_plan import compare_cmd, plan_cmd
from cli_profile import import_group, synth, trace_cmd, variants_cmd
from cli_run import replay_cmd, train_cmd
from cli_shard import shard_cmd
from cli_simulate import place_cmd, simulate


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="swapplan")
@click.option("--debug", is_flag=True, help="On an error, print the Python traceback before the one-line "
                                              "message (the exit status stays the same). Allowed anywhere "
                                              "on the line.")
@click.pass_context
def app(ctx: click.Context, debug: bool) -> None:
    """swapplan: plan and simulate GPU memory swapping for DNN training.

    A PROFILE is a profile file (.json, .json.gz, .yaml) or the name of a shipped
    profile (see `swapplan profiles`). A hardware H is a preset name (see
    `swapplan hardware`) or a hardware .yaml file.

    Exit status: 0 success; 1 a plan that is invalid or does not fit; 2 bad input
    (one line on stderr); 3 an internal error (please report it).
    """
    ctx.ensure_object(dict)
    if debug:
        ctx.obj["debug"] = True


# the commands, in their modules; `swapplan --help` lists them by name
for _command in (info, validate, synth, simulate, replay_cmd, trace_cmd, train_cmd, import_group, plan_cmd,
                 compare_cmd, place_cmd, variants_cmd, planners_cmd, hardware_cmd, profiles_cmd, fit_cmd, shard_cmd):
    app.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: ``--debug`` may appear anywhere on the line."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    app.main(args=args, prog_name="swapplan", obj={"debug": debug})


if __name__ == "__main__":
    main()
