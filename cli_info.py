"""The commands that read and describe: ``info`` (a profile), ``validate`` (a profile and a
plan against the static rules), and the lists ``planners``, ``hardware``, ``profiles``."""
from __future__ import annotations

import click

from simulator import catalog
from simulator.hardware import load_hardware, load_presets
from simulator.plan import load_plan
from simulator.units import format_bytes, format_us

from cli_common import check_plan_budget, echo_json, hardware_for
from cli_text import print_hardware, print_planners, print_profiles, table


@click.command()
@click.argument("profile")
@click.option("--json", "as_json", is_flag=True, help="Print the stable JSON summary.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(0), help="How many of the largest tensors to list.")
def info(profile: str, as_json: bool, top: int) -> None:
    """Summarise a profile: ops, tensors, bytes by kind, no-swap peak, ideal time."""
    summary = catalog.profile_summary(catalog.open_profile(profile), largest=top)
    if as_json:
        echo_json(summary)
        return
    ops_by_phase = ", ".join(f"{k} {v}" for k, v in summary["ops_by_phase"].items() if v)
    source = summary["source"]
    click.echo(f"profile      {summary['name']}  ({summary['file']})")
    if source:
        click.echo("source       " + ", ".join(f"{k}={v}" for k, v in source.items() if k != "shard"))
    click.echo(f"ops          {summary['ops']}  ({ops_by_phase})")
    if summary["shard"] or summary["collective_ops"]:
        click.echo(_collectives_line(summary))
    click.echo(f"tensors      {summary['tensors']}")
    click.echo(f"no-swap peak {format_bytes(summary['peak_bytes'])}  ({summary['peak_bytes']} B) "
               f"at op {summary['peak_op']} ({summary['peak_op_name']}, {summary['peak_op_phase']})")
    click.echo(f"ideal time   {format_us(summary['ideal_us'])}")
    click.echo("")
    rows = [[kind, summary["tensors_by_kind"][kind], format_bytes(summary["bytes_by_kind"][kind])]
            for kind in summary["bytes_by_kind"] if summary["tensors_by_kind"][kind]]
    table("bytes by kind", ["kind", "tensors", "bytes"], rows, right={1, 2})
    if summary["largest_tensors"]:
        click.echo("")
        rows = [[t["id"], t["kind"], format_bytes(t["bytes"]), t["name"] or ""] for t in summary["largest_tensors"]]
        table("largest tensors", ["id", "kind", "bytes", "name"], rows, right={2})


def _collectives_line(summary: dict) -> str:
    """``shard        zero3 over 8 ranks; 39 collective ops (all_gather 26, ...)``."""
    kinds = ", ".join(f"{kind} {row['ops']}" for kind, row in summary["collectives_by_kind"].items() if row["ops"])
    ops = f"{summary['collective_ops']} collective ops" + (f" ({kinds})" if kinds else "")
    shard = summary["shard"]
    if shard:
        return f"shard        {shard.get('strategy')} over {shard.get('world')} ranks; {ops}"
    return f"collectives  {ops}"


# ----------------------------------------------------------------------------- validate


@click.command()
@click.argument("profile")
@click.argument("plan", required=False)
@click.option("--hardware", "hardware_name", default=None,
              help="Preset or hardware file the plan is checked on [default: as for simulate: the plan's "
                   "hardware, else the profile's roofline preset, else a100-40gb-pcie4].")
def validate(profile: str, plan: str | None, hardware_name: str | None) -> None:
    """Check a profile, and optionally a plan against it: its structure and every rule
    simulate decides before it runs the plan (the same check), not its timing or memory.

    Exit status: 0 valid, 1 a plan that breaks a rule (simulate calls it INVALID; the rule
    and reason are printed), 2 bad input.
    """
    from simulator.api import check_static

    loaded = catalog.open_profile(profile)
    click.echo(f"ok: profile {loaded.name}: {len(loaded.ops)} ops, {len(loaded.tensors)} tensors")
    if plan is None:
        if hardware_name is not None:
            load_hardware(hardware_name)
        return
    loaded_plan = load_plan(plan)
    hardware = hardware_for(hardware_name, loaded_plan, loaded)
    check_plan_budget(plan, loaded_plan, hardware)
    broken = check_static(loaded, loaded_plan, hardware)
    if broken is not None:
        click.echo(f"INVALID: plan {plan} on {hardware.name}: "
                   + (f"{broken.rule}: {broken.reason}" if broken.reason else f"{broken.rule} at op {broken.op}"))
        raise click.exceptions.Exit(1)
    click.echo(f"ok: plan {plan}: {len(loaded_plan.actions)} actions, planner {loaded_plan.planner.name}, "
               f"valid on {hardware.name}")


@click.command("planners")
@click.option("--json", "as_json", is_flag=True, help="Print the planners and their parameters as JSON.")
def planners_cmd(as_json: bool) -> None:
    """List the planners by family (after where to start) and their parameters."""
    from planner.core.registry import FAMILIES, START_HERE, planners

    specs = planners()
    if as_json:
        echo_json([{"name": s.name, "summary": s.summary, "paper": s.paper,
                      "moves_persistent": s.moves_persistent,
                      "params": [{"name": p.name, "default": p.default, "help": p.help, "type": p.type.__name__,
                                  "values": p.describe(),
                                  "choices": list(p.choices) if p.choices else None} for p in s.params]}
                     for s in specs])
        return
    print_planners(specs, FAMILIES, START_HERE)


@click.command("hardware")
@click.option("--json", "as_json", is_flag=True, help="Print the presets as JSON.")
def hardware_cmd(as_json: bool) -> None:
    """List the hardware presets."""
    presets = load_presets()
    if as_json:
        echo_json([hw.to_dict() for hw in presets])
        return
    print_hardware(presets)


@click.command("profiles")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def profiles_cmd(as_json: bool) -> None:
    """List the shipped profiles with their no-swap peak and ideal time."""
    rows = catalog.shipped_profiles_summary()
    if as_json:
        echo_json(rows)
        return
    print_profiles(rows)
