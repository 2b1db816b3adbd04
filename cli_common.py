"""What the command modules (cli_*.py) share: JSON and notes on the terminal, the check of
output paths before any work, the hardware a command runs on, a plan's own budget against
the GPU, --param pairs, and the --hardware / --budget options of the commands that take a
plan. It imports nothing of cli."""
from __future__ import annotations

import json

import click

from simulator import catalog
from simulator.errors import InputError, SwapplanError
from simulator.files import check_outputs
from simulator.hardware import load_hardware
from simulator.units import format_bytes

from cli_errors import one_line


def echo_json(data) -> None:
    # allow_nan=False: a NaN or infinity is a bug to report (exit 3), never invalid JSON.
    click.echo(json.dumps(data, indent=2, sort_keys=False, allow_nan=False))


def print_note(text: str) -> None:
    click.echo("note: " + one_line(text), err=True)


def guard_outputs(outputs: dict, inputs=()) -> None:
    """Check every output before any work: ``outputs`` maps an option (``-o``) to its path
    (None: not given), ``inputs`` are ``(what, path)`` pairs of the files the command reads.
    InputError (one line naming both) for an output that would replace an input or another
    output (the same file, a symbolic or hard link); then for a folder, a link, a device."""
    check_outputs(outputs.items(), inputs)


def profile_input(spec):
    """The file a PROFILE argument reads (a shipped profile's too), or the argument as
    given when it names none (opening it says why)."""
    try:
        return catalog.resolve_profile(spec)
    except SwapplanError:
        return spec


# --hardware and --budget of the commands that take a plan (simulate, replay)
plan_hardware_option = click.option("--hardware", "hardware_name", default=None,
                              help="Preset or hardware file [default: the plan's hardware, else the profile's "
                                   "roofline preset, else a100-40gb-pcie4].")
plan_budget_option = click.option("--budget", default=None,
                            help="GPU memory budget: 8GiB, 512MB, or 60% of the no-swap peak [default: the "
                                 "plan's, else the GPU's memory].")


def check_plan_budget(path, plan, hardware) -> None:
    """InputError when the plan's own budget is more than the GPU's memory (simulate and
    validate without --budget)."""
    if plan.budget_bytes is not None and plan.budget_bytes > hardware.gpu.memory_bytes:
        raise InputError(path, "budget_bytes",
                         f"the plan's budget, {format_bytes(plan.budget_bytes)} ({plan.budget_bytes} "
                         f"bytes), is more than the GPU's memory on {hardware.name} "
                         f"({format_bytes(hardware.gpu.memory_bytes)}); give --budget to simulate it with another")


def hardware_for(hardware_name, plan, profile):
    """The hardware to use; a note on stderr when it was chosen from the profile's GPU."""
    spec, note = catalog.choose_hardware(hardware_name, plan, profile)
    if note:
        print_note(note)
    return load_hardware(spec)


def parse_params(pairs: tuple[str, ...]) -> dict:
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError("<argument>", "--param", f"expected key=value, got {pair!r}")
        params[key.strip()] = value.strip()
    return params
