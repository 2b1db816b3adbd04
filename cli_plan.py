"""The commands that plan: ``plan`` (one planner, one budget, the plan scored) and
``compare`` (every planner x budget x profile x machine, into a results folder)."""
from __future__ import annotations

import os

import click

from simulator import catalog
from simulator.errors import InputError
from simulator.units import format_bytes

from cli_common import echo_json, guard_outputs, hardware_for, parse_params, print_note, profile_input
from cli_text import print_comparison, print_result


@click.command("plan")
@click.argument("profile")
@click.option("--planner", "planner_name", default="none", show_default=True,
              help="Which planner (see `swapplan planners`).")
@click.option("--budget", default=None,
              help="GPU memory budget: 8GiB, 512MB, or 60% of the no-swap peak (a percentage above the GPU's "
                   "memory is capped at it, with a note) [default: the GPU's memory].")
@click.option("--hardware", "hardware_name", default=None,
              help="Preset or hardware file [default: the profile's roofline preset, else a100-40gb-pcie4].")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="A planner parameter (repeatable).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed for planners that use randomness.")
@click.option("--time-limit", type=click.FloatRange(min=0.1, max=86400.0), default=None,
              help="Seconds a searching planner (ILP, genetic) may take; it then returns its best plan "
                   "[default: the planner's own, 60 s for the ILPs].")
@click.option("--threads", type=click.IntRange(0, 1024), default=1, show_default=True,
              help="Threads for solvers (0: every core). One by default, as compare runs them: HiGHS's "
                   "parallel search proved less in the same time on two cores (docs/ilp.md).")
@click.option("--gap", type=click.FloatRange(0.0, 1.0), default=None,
              help="For the ILP planners: stop once the plan is proven within this relative gap "
                   "(same as --param gap=G).")
@click.option("--codec", default=None, metavar="NAME",
              help="Compress the planner's swaps with this codec of the hardware file where CSWAP's rule says "
                   "it pays (R41): runs planner cswap with base=PLANNER, codec=NAME.")
@click.option("--allow-lossy", is_flag=True, help="Let planners that can (gist, cswap) use lossy codecs "
                                                  "(fp16, bf16, int8; R40).")
@click.option("--group", is_flag=True, help="Group the plan's transfers issued together into one transfer each "
                                            "(R53: one latency), kept if the simulator finds it no slower.")
@click.option("-o", "--output", default=None, help="Write the plan JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan summary as JSON.")
def plan_cmd(profile, planner_name, budget, hardware_name, params, seed, time_limit, threads, gap, codec,
             allow_lossy, group, output, as_json) -> None:
    """Plan what leaves GPU memory for PROFILE within a budget, and score the plan.

    The plan is simulated and its prediction stored in it. Exit status: 0 when the plan
    fits the budget, 1 when the planner could not meet it (its best plan is still
    written, marked infeasible), 2 bad input.
    """
    from planner.core.api import make_plan
    from planner.core.registry import RunOptions
    from simulator.plan import save_plan
    from simulator.units import planning_budget

    guard_outputs({"-o": output}, [("profile", profile_input(profile)), ("hardware file", hardware_name)])
    loaded = catalog.open_profile(profile)
    hardware = hardware_for(hardware_name, None, loaded)
    budget_bytes, asked = (hardware.gpu.memory_bytes, None) if budget is None else \
        planning_budget(budget, loaded.peak_bytes, hardware.gpu.memory_bytes)
    if asked is not None:
        print_note(f"budget: {budget} of the no-swap peak is {format_bytes(asked)}, more than the GPU's "
                   f"{format_bytes(hardware.gpu.memory_bytes)} on {hardware.name}: planning for the GPU's memory")
    given = parse_params(params)
    if gap is not None:
        given["gap"] = str(gap)
    if codec is not None:
        if given:
            raise InputError("<argument>", "--codec", "--param goes to the base planner's own run; with --codec "
                                                      "give the base planner's defaults (or use --planner cswap)")
        planner_name, given = "cswap", {"base": planner_name, "codec": codec}
        print_note(f"--codec {codec}: planner cswap with base={given['base']}")
    if allow_lossy:
        from planner.core.registry import get_planner
        if "allow_lossy" not in {p.name for p in get_planner(planner_name).params}:
            raise InputError("<argument>", "--allow-lossy", f"planner {planner_name!r} uses no lossy codecs "
                                                            "(gist and cswap do)")
        given["allow_lossy"] = "true"
    options = RunOptions(seed=seed, time_limit=time_limit, threads=threads or os.cpu_count() or 1,
                         progress=None if as_json else print_note)
    planned = make_plan(loaded, hardware, budget_bytes, planner_name, given, seed, options, group=group)
    if output:
        save_plan(planned.plan, output)
    result = planned.result
    summary = {"profile": loaded.name, "hardware": hardware.name, "planner": planner_name,
               "params": planned.plan.planner.params, "seed": seed, "status": planned.plan.planner.status,
               "budget_bytes": budget_bytes, "planning_seconds": planned.seconds,
               "actions": len(planned.plan.actions), "output": output, "notes": planned.plan.planner.notes,
               "estimate_us": planned.plan.planner.estimate_us, "bound": planned.plan.planner.bound,
               "lower_bound_us": planned.plan.predicted["lower_bound_us"],
               "gap_to_bound": planned.plan.predicted["gap_to_bound"], **result.to_dict()}
    if as_json:
        echo_json(summary)
    else:
        click.echo(f"planner {planner_name} ({planned.plan.planner.status}): {len(planned.plan.actions)} actions "
                   f"in {planned.seconds:.3f} s" + (f", written to {output}" if output else ""))
        print_result(loaded.name, hardware.name, result, profile=loaded, bound={key: summary[key] for key in
                                                          ("lower_bound_us", "gap_to_bound", "bound")})
    if not result.ok:
        raise click.exceptions.Exit(1)


@click.command("compare")
@click.argument("profiles", nargs=-1, required=True, metavar="PROFILE...")
@click.option("--planners", "planner_list", default="quick", show_default=True,
              help="Comma-separated planners and families (swap, recompute, swap+recompute, placement, "
                   "compression, cpu-offload, uvm, baseline; or family:NAME); quick: one or two of each family "
                   "that plan in seconds; all: every planner (the searching ones take up to --time-limit each) "
                   "(see `swapplan planners`).")
@click.option("--budgets", default="90%,70%,50%,30%", show_default=True,
              help="Comma-separated budgets: percentages of each profile's no-swap peak and/or sizes "
                   "(8GiB); capped at the GPU's memory.")
@click.option("--hardware", "hardware_names", multiple=True,
              help="Preset or hardware file (repeatable) [default: each profile's own, as for plan].")
@click.option("--time-limit", type=click.FloatRange(min=0.1, max=86400.0), default=None,
              help="Seconds per cell: planners that search (ILP, genetic) get this; a cell still running at "
                   "1.5x + 1 s is stopped and recorded as a timeout [default: each planner's own, 60 s for "
                   "the searching ones; a cell is stopped after 15 minutes].")
@click.option("--jobs", type=click.IntRange(1, 256), default=None,
              help="Local processes [default: the CPU count, at most the cells to run].")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Run the cells on this Dask scheduler (tcp://host:port; needs the dask extra).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed for planners that use randomness.")
@click.option("--out", default="swapplan-compare", show_default=True,
              help="Output folder: results.csv, results.json, plans/, charts, report.html. Rows are merged "
                   "with those already there by cell (other planners, budgets and profiles are kept; runs at "
                   "the same time merge too) and rerunning skips the cells already done.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON (and no progress).")
def compare_cmd(profiles, planner_list, budgets, hardware_names, time_limit, jobs, dask_address, seed, out,
                as_json) -> None:
    """Compare planners on PROFILEs: every planner x budget x profile x machine.

    Each cell is planned and simulated; a cell that fails or times out is recorded and the
    sweep goes on. Exit status: 0 when every cell ran (fitting or not), 1 when a cell
    failed with an error, 2 bad input, 130 interrupted (what finished is written).
    """
    from compare.progress import ProgressLine
    from compare.sweep import compare_folder, compare_writes, expand_cells, run_sweep, write_folder_report
    from planner.core.registry import get_planner, select_planners

    names = select_planners(planner_list)
    budget_list = [b.strip() for b in budgets.split(",") if b.strip()]
    if not names or not budget_list:
        raise InputError("<argument>", "--planners" if not names else "--budgets", "is empty")
    folder = compare_folder(out)
    folder.check(inputs=[("profile", profile_input(p)) for p in profiles]
                 + [("hardware file", h) for h in hardware_names], writes=compare_writes)
    folded: list[str] = []
    cells = expand_cells(profiles, hardware_names or (None,), names, budget_list, seed, time_limit, folded)
    workers = jobs or min(os.cpu_count() or 1, len(cells))

    def started() -> None:   # set-up succeeded: the notes and the banner, then the progress
        for line in folded:
            print_note(line)
        if not as_json:
            searching = [name for name in names if get_planner(name).searches]
            click.echo(f"compare: {len(cells)} cells ({len(names)} planners x {len(cells) // max(1, len(names))} "
                       f"profile, machine and budget cells) on {workers} process{'es' if workers > 1 else ''}"
                       + (f"; {', '.join(searching)} search up to {time_limit or 60:g} s a cell" if searching
                          else ""), err=True)

    outcome = run_sweep(cells, folder, jobs=workers, dask_address=dask_address,
                        progress=None if as_json else ProgressLine(), started=started)
    page = write_folder_report(folder)
    if as_json:
        echo_json(outcome.rows)
    else:
        print_comparison(outcome.rows)
        others = len(outcome.folder_rows) - len(outcome.rows)
        click.echo(f"{outcome.ran} cells run, {outcome.resumed} already done; rows in "
                   f"{os.path.join(out, 'results.csv')}" + (f" (with {others} of other runs)" if others > 0 else "")
                   + (f", report in {page}" if page else ""))
    for row in outcome.failed:
        print_note(f"{row['profile']} {row['hardware']} {row['planner']} {row['budget']}: {row['error']}")
    if outcome.interrupted:
        click.echo(f"interrupted: {len(outcome.rows)} of {len(cells)} cells written; run the same command "
                   "again to finish", err=True)
        raise click.exceptions.Exit(130)
    if outcome.failed:
        raise click.exceptions.Exit(1)
