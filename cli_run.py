"""The commands that run a plan for real: ``replay`` (one iteration replayed in real time on
the host or a CUDA GPU, every tensor checked) and ``train`` (real training steps of a model
on the CPU, checked bit-equal)."""
from __future__ import annotations

import click

from simulator import catalog
from simulator.errors import InputError
from simulator.plan import load_plan

from cli_common import (echo_json, hardware_for, parse_params, plan_budget_option, plan_hardware_option,
                        print_note)
from cli_errors import need_torch, one_line
from cli_text import print_replay, print_train, print_train_world


def _scale(ctx, param, value):
    """auto, or a number above 0 (InputError otherwise: exit 2, one line)."""
    if value is None or value.strip().lower() == "auto":
        return None
    try:
        number = float(value)
    except ValueError:
        raise InputError("<argument>", f"--{param.name.replace('_', '-')}",
                         f"expected a number above 0 or auto, got {value!r}") from None
    return number


@click.command("replay")
@click.argument("profile")
@click.argument("plan")
@click.option("--backend", type=click.Choice(["host", "cuda"]), default="host", show_default=True,
              help="host: an emulation on the CPU in real time (threads, a memory region, a file for the "
                   "SSD); cuda: a real GPU through CuPy (needs the cuda extra and a GPU).")
@plan_hardware_option
@plan_budget_option
@click.option("--time-scale", "time_scale", default="auto", callback=_scale, show_default=True,
              help="Real seconds per simulated second [auto: host about 3 s of real time in all, cuda 1].")
@click.option("--size-scale", "size_scale", default="auto", callback=_scale, show_default=True,
              help="Real bytes per profile byte, at most 1 [auto: host a GPU region of at most 64 MiB "
                   "that can be checked in time, cuda 1].")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def replay_cmd(profile, plan, backend, hardware_name, budget, time_scale, size_scale, as_json) -> None:
    """Replay one iteration of PLAN for real and compare it with the simulation.

    Every tensor is filled with a pattern of its id and version when produced and
    checked at every use and after every copy; a mismatch, a use before arrival or a
    budget overrun stops the replay with one line naming the op and tensor. Exit
    status: 0 the replay ran and every check passed, 1 the plan failed at replay, 2 bad
    input (a missing CuPy or GPU for --backend cuda included).
    """
    from executor.api import refuse_uvm, replay
    from simulator.units import parse_budget

    if backend == "cuda":
        from executor.cuda import require_cuda
        require_cuda()               # no CuPy or no GPU: one line before reading anything
    loaded_plan = load_plan(plan)
    refuse_uvm(loaded_plan)          # before the profile is read: nothing to replay
    loaded = catalog.open_profile(profile)
    hardware = hardware_for(hardware_name, loaded_plan, loaded)
    budget_bytes = parse_budget(budget, loaded.peak_bytes) if budget is not None else None
    report = replay(loaded, loaded_plan, hardware, budget_bytes, backend=backend, time_scale=time_scale,
                    size_scale=size_scale, say=print_note)
    if as_json:
        echo_json(report)
    else:
        print_replay(report)
    if not report["ok"]:
        click.echo("replay failed: " + one_line(report["failure"]["message"]), err=True)
        raise click.exceptions.Exit(1)
    if not report["predicted"]["valid"] or not report["predicted"]["feasible"]:
        print_note(f"the simulator finds this plan {'invalid' if not report['predicted']['valid'] else 'infeasible'}: "
                   f"{report['predicted']['rule']}: {report['predicted']['reason']}")


@click.command("train")
@click.argument("model")
@click.option("--planner", "planner_name", default=None, help="Plan with this planner (see `swapplan planners`).")
@click.option("--budget", default=None, help="GPU memory budget for the planner: 8GiB, 512MB, or 60% of the "
                                             "traced no-swap peak.")
@click.option("--plan", "plan_path", default=None, help="Run this plan instead (made for the profile "
                                                        "`swapplan trace MODEL ... --runtime` writes).")
@click.option("--steps", default=1, show_default=True, type=click.IntRange(1), help="Training steps to run.")
@click.option("--batch", type=int, default=None, help="Batch size [default: the model's].")
@click.option("--seq", type=int, default=None,
              help="Sequence length (language models) or image side in pixels (vision) [default: the model's].")
@click.option("--optimizer", type=click.Choice(["adamw", "sgd"]), default="adamw", show_default=True)
@click.option("--hardware", "hardware_name", default=None,
              help="Preset or hardware file: the roofline, the budget's ceiling and the clock of the copies "
                   "[default: a100-40gb-pcie4; with --world N > 1, a100-80gb-sxm-x8 (an interconnect)].")
@click.option("--cpu-kernels", is_flag=True, help="Trace the CPU's kernel choices instead of those a CUDA run "
                                                  "picks (which run here through CPU emulations).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="A planner parameter (repeatable).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the weights, the batch and the RNG.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1, 1024),
              help="Intra-op CPU threads of every run (the same in all, for bit-equality).")
@click.option("--world", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Data-parallel ranks: N > 1 runs one step on N processes (gloo), each following its rank's plan.")
@click.option("--strategy", type=click.Choice(["ddp", "zero1", "zero2", "zero3"]), default=None,
              help="How the ranks share the state (with --world N > 1; see `swapplan shard`).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def train_cmd(model, planner_name, budget, plan_path, steps, batch, seq, optimizer, hardware_name, cpu_kernels,
              params, seed, threads, world, strategy, as_json) -> None:
    """Run real training steps of MODEL on the CPU following a plan, and check them.

    Traces MODEL with node identity, plans it (--planner P --budget B) or takes --plan,
    and runs --steps steps on the same seeded weights and batch three ways: the traced
    graph called whole, node by node with no plan, and node by node following the plan
    (offloads to a host pool, prefetches, drops, recomputes with the RNG replayed, at
    the simulator's points). Reports whether loss, parameters, optimizer state and
    buffers are bit-equal, the peak of the "GPU" pool against the budget, the actions
    applied and the seconds per step. Exit status: 0 bit-equal, within budget and every
    action applied; 1 otherwise, or a plan the simulator refuses; 2 bad input.

    With --world N > 1 and --strategy S: one data-parallel step on N processes, each
    following the plan of its rank's profile (the profile sharded with S; a percentage
    budget is of the rank's peak); checked: each rank's peak against the budget and the
    simulation, the parameters against one process averaging the N batches' gradients,
    the collectives issued against the rank graph's. See docs/runtime.md.
    """
    need_torch()
    from runtime import train

    if (planner_name is None) == (plan_path is None):
        raise click.UsageError("give --planner with --budget, or --plan")
    if planner_name is not None and budget is None:
        raise click.UsageError("--planner needs --budget")
    notes: list[str] = []
    if world > 1:
        _train_world(model, planner_name, budget, plan_path, steps, batch, seq, optimizer, hardware_name,
                     cpu_kernels, params, seed, threads, world, strategy, as_json, notes)
        return
    hardware_name = hardware_name or "a100-40gb-pcie4"
    report = _run_and_print(lambda: train(model, planner=planner_name, budget=budget, plan=plan_path, steps=steps,
                                          batch=batch, seq=seq, hardware=hardware_name, optimizer=optimizer,
                                          gpu_kernels=not cpu_kernels, seed=seed, params=parse_params(params),
                                          threads=threads, notes=notes),
                            print_train, as_json, notes)
    ok = report["bit_equal"] and report["peak_bytes"] <= report["budget_bytes"] and \
        report["actions_applied"] == report["actions_total"]
    if not ok:
        raise click.exceptions.Exit(1)


def _run_and_print(run, printer, as_json: bool, notes: list) -> dict:
    """The report of ``run()`` (a train), printed with its notes; a refused plan or a
    broken run ends with its one line and exit status 1."""
    from runtime import PlanRefused, RuntimeFailure

    try:
        report = run()
    except (PlanRefused, RuntimeFailure) as exc:
        click.echo(one_line(str(exc)), err=True)
        raise click.exceptions.Exit(1)
    for note in notes:
        print_note(note)
    if as_json:
        echo_json(report)
    else:
        printer(report)
    return report


def _train_world(model, planner_name, budget, plan_path, steps, batch, seq, optimizer, hardware_name, cpu_kernels,
                 params, seed, threads, world, strategy, as_json, notes) -> None:
    """``train --world N``: run, print, exit 1 on a failed check (its one line)."""
    from runtime.distributed import train_distributed

    if strategy is None:
        raise click.UsageError("--world N > 1 needs --strategy (ddp, zero1, zero2 or zero3)")
    if steps != 1:
        raise click.UsageError("--world N > 1 runs one step (--steps 1)")
    report = _run_and_print(lambda: train_distributed(
        model, world=world, strategy=strategy, planner=planner_name, budget=budget, plan=plan_path, batch=batch,
        seq=seq, hardware=hardware_name, optimizer=optimizer, gpu_kernels=not cpu_kernels, seed=seed,
        params=parse_params(params), threads=threads, notes=notes), print_train_world, as_json, notes)
    if not report["ok"]:
        click.echo("train --world: " + one_line(report["failures"][0]), err=True)
        raise click.exceptions.Exit(1)
