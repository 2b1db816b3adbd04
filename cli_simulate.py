"""The commands that score a plan in the simulator: ``simulate`` (one iteration: time, memory
and the bound) and ``place`` (an arena offset for every allocation, R50)."""
from __future__ import annotations

import click

from simulator import catalog
from simulator.errors import InputError
from simulator.plan import load_plan
from simulator.units import format_bytes

from cli_common import (check_plan_budget, echo_json, guard_outputs, hardware_for, plan_budget_option,
                        plan_hardware_option, print_note, profile_input)
from cli_text import print_result


@click.command()
@click.argument("profile")
@click.argument("plan", required=False)
@plan_hardware_option
@plan_budget_option
@click.option("--timeline", "timeline_out", default=None, help="Write a Chrome trace (Perfetto) JSON here.")
@click.option("--plot", "plot_out", default=None, help="Write a PNG of GPU memory over time here.")
@click.option("--allocator", type=click.Choice(["first-fit", "best-fit", "caching", "caching-expandable"]),
              default=None,
              help="Model an allocator: first-fit or best-fit, an online allocator's address ranges over an arena "
                   "of the budget (R51: sizes rounded to 512 B, free neighbours merged), reporting arena_bytes "
                   "and fragmentation; caching, PyTorch's CUDA caching allocator (R55: 512 B rounding, small and "
                   "large pools, 2 and 20 MiB segments, no merging across segments), with expandable_segments "
                   "for caching-expandable, holding what it reserves to the budget and reporting reserved_bytes "
                   "beside the live peak [default: count bytes; a plan with a placement always follows it].")
@click.option("--json", "as_json", is_flag=True, help="Print the Result as JSON.")
def simulate(profile, plan, hardware_name, budget, timeline_out, plot_out, allocator, as_json) -> None:
    """Simulate one iteration of PLAN (no PLAN: no swapping) and report time and memory.

    Exit status: 0 valid and feasible, 1 invalid or infeasible (the report is still
    printed), 2 bad input.
    """
    from planner.shared.bound import bound_fields, lower_bound, run_by
    from simulator.api import simulate as run_simulation
    from simulator.plan import empty_plan
    from simulator.plot import plot_memory
    from simulator.timeline import write_chrome_trace
    from simulator.units import parse_budget

    guard_outputs({"--timeline": timeline_out, "--plot": plot_out},
                  [("profile", profile_input(profile)), ("plan", plan), ("hardware file", hardware_name)])
    loaded = catalog.open_profile(profile)
    loaded_plan = load_plan(plan) if plan is not None else empty_plan(loaded)
    hardware = hardware_for(hardware_name, loaded_plan, loaded)
    budget_bytes = parse_budget(budget, loaded.peak_bytes) if budget is not None else None
    if budget_bytes is None:
        check_plan_budget(plan, loaded_plan, hardware)
    if allocator is not None and (loaded_plan.placement is not None or loaded_plan.uvm):
        raise InputError("<argument>", "--allocator", "the plan has a placement (it follows it) or runs in managed "
                                                      "memory (the driver places blocks): no allocator to model")
    result = run_simulation(loaded, loaded_plan, hardware, budget_bytes,
                            record=bool(timeline_out or plot_out), allocator=allocator)
    # the bound of the plan's own kind (as `plan` printed it); a plan that does not say may swap,
    # recompute, move weights and choose variants: the most general bound applies
    kind = loaded_plan.planner.bound if loaded_plan.planner is not None and loaded_plan.planner.bound else ""
    general = not kind.startswith("swap")
    bound = bound_fields(lower_bound(run_by(loaded, loaded_plan), hardware, result.budget_bytes,
                                     recompute=general or "recompute" in kind,
                                     moves_persistent=general or "persistent" in kind,
                                     cpu_ops=loaded_plan.uses_cpu, uvm=loaded_plan.uvm,
                                     codecs=loaded_plan.uses_codecs, variants=True), result)
    if timeline_out and result.timeline is not None:
        write_chrome_trace(result, timeline_out, title=f"{loaded.name} on {hardware.name}")
    if plot_out and result.timeline is not None:
        plot_memory(result, plot_out)
    if as_json:
        echo_json({"profile": loaded.name, "hardware": hardware.name, **result.to_dict(), **bound})
    else:
        print_result(loaded.name, hardware.name, result, bound, loaded)
    if not result.ok:
        raise click.exceptions.Exit(1)


@click.command("place")
@click.argument("profile")
@click.argument("plan")
@click.option("--method", type=click.Choice(["smartpool", "greedy-size", "first-fit"]), default="smartpool",
              show_default=True, help="smartpool: SmartPool's offline interval colouring (cross-iteration blocks "
                                      "first, then largest first); greedy-size: largest first, then longest "
                                      "lifetime; first-fit: in allocation order.")
@plan_hardware_option
@plan_budget_option
@click.option("-o", "--output", required=True, help="Write the placed plan JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def place_cmd(profile, plan, method, hardware_name, budget, output, as_json) -> None:
    """Give every GPU allocation of PLAN's iteration an offset in one arena (R50), from the
    lifetimes of its simulated iteration, so that a runtime can lay out its memory once.

    The placed plan is simulated; exit status 1 when its arena does not fit the budget.
    """
    from planner.shared.placement import place
    from simulator.api import simulate as run_simulation
    from simulator.plan import save_plan
    from simulator.units import parse_budget

    guard_outputs({"-o": output},
                  [("profile", profile_input(profile)), ("plan", plan), ("hardware file", hardware_name)])
    loaded_plan = load_plan(plan)
    if loaded_plan.uvm:              # before the profile is read: nothing to place
        raise InputError(loaded_plan.origin, "memory", "a UVM plan (\"memory\": \"uvm\") has no placement: the "
                                                       "driver places its blocks (R33); `swapplan simulate` scores "
                                                       "it, or place a plan of an explicit planner")
    loaded = catalog.open_profile(profile)
    try:
        hardware = hardware_for(hardware_name, loaded_plan, loaded)
    except InputError:
        if hardware_name or not loaded_plan.hardware:
            raise
        hardware = hardware_for(None, None, loaded)     # a plan naming a machine this host does not know
        print_note(f"the plan's hardware {loaded_plan.hardware!r} is neither a preset nor a file here: lifetimes "
                   f"from {hardware.name}; --hardware chooses another")
    budget_bytes = parse_budget(budget, loaded.peak_bytes) if budget is not None else None
    placed, figures = place(loaded, loaded_plan, hardware, budget_bytes, method)
    result = run_simulation(loaded, placed, hardware, budget_bytes)
    save_plan(placed, output)
    figures.update(profile=loaded.name, hardware=hardware.name, output=output, feasible=result.ok,
                   iteration_us=result.iteration_us)
    if as_json:
        echo_json(figures)
    else:
        click.echo(f"placed {figures['allocations']} allocations by {method}: arena {format_bytes(figures['arena_bytes'])}"
                   f" for a live peak of {format_bytes(figures['peak_live_bytes'])} "
                   f"({figures['arena_over_live']:.4f}x); written to {output}")
        if not result.ok:
            click.echo(f"  the placed plan does not run: {result.reason}")
    if not result.ok:
        raise click.exceptions.Exit(1)
