"""``swapplan fit``: the largest batch (or context) each family of planners trains within
the GPU's memory, by which planner, and how fast. Parses, calls ``fit.api``, prints."""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import click

from simulator.units import format_bytes, format_us


@click.command("fit")
@click.argument("model", required=False)
@click.option("--hf-config", "hf_config", default=None, metavar="CONFIG.json",
              help="A transformers causal LM from a local config.json (or llama2-7b, llama2-13b, llama2-70b, "
                   "mistral-7b), as for trace, instead of MODEL.")
@click.option("--axis", type=click.Choice(["batch", "seq"]), default="batch", show_default=True,
              help="What grows: the batch (samples), or the context (tokens, in --step steps).")
@click.option("--batch", type=click.IntRange(1), default=None,
              help="On the batch axis the first batch tried [default 1]; on the seq axis the batch held fixed "
                   "[default 1].")
@click.option("--seq", type=click.IntRange(1), default=None,
              help="On the seq axis the first context tried [default --step]; on the batch axis the sequence "
                   "length (image side) held fixed [default: the model's].")
@click.option("--step", type=click.IntRange(1), default=None,
              help="The seq axis's step in tokens [default 128]; the batch axis steps by 1.")
@click.option("--max", "max_size", type=click.IntRange(1), default=None,
              help="The largest size tried [default: batch 65536; context: the model's longest, else 1048576].")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True)
@click.option("--amp", type=click.Choice(["bf16", "fp16"]), default=None, help="Mixed precision, as for trace.")
@click.option("--optimizer", type=click.Choice(["adamw", "sgd"]), default="adamw", show_default=True)
@click.option("--cpu-kernels", is_flag=True, help="Trace the CPU's kernel choices (as for trace).")
@click.option("--hardware", "hardware_name", default="a100-40gb-pcie4", show_default=True,
              help="Preset or hardware file: the GPU, its links and the roofline that times the kernels.")
@click.option("--world", type=click.IntRange(1, 65536), default=1, show_default=True,
              help="Data-parallel GPUs: each size is one rank's batch (or context), throughputs every rank's "
                   "(needs --strategy and a machine with an interconnect, e.g. a100-80gb-sxm-x8).")
@click.option("--strategy", type=click.Choice(["ddp", "zero1", "zero2", "zero3", "all"]), default=None,
              help="How the ranks share the model (as for shard); all: fit each and say which trains the most.")
@click.option("--memory", default=None, metavar="SIZE",
              help="The GPU memory plans may use (22GiB) [default: the GPU's memory less --reserve].")
@click.option("--reserve", default=None, metavar="SIZE",
              help="What the CUDA context and libraries hold, off the GPU's memory [default 1GiB; docs/fit.md].")
@click.option("--allocator", type=click.Choice(["caching", "caching-expandable"]), default=None,
              help="Hold what PyTorch's caching allocator reserves to the memory, not just live bytes (R55; "
                   "caching-expandable: with expandable_segments) [default: live bytes, as simulate counts them].")
@click.option("--planners", "planner_list", default="quick", show_default=True,
              help="Planners and families, as for compare (quick: one or two of each family; all; swap, "
                   "recompute, swap+recompute, ...); each family's largest size is found separately.")
@click.option("--global-batch", type=click.IntRange(1), default=None, metavar="N",
              help="Also find the fastest way to train N samples a step: micro-batch x accumulation steps.")
@click.option("--time-limit", type=click.FloatRange(min=0.1, max=86400.0), default=None,
              help="Seconds per plan for the planners that search [default: their own, 60 s].")
@click.option("--jobs", type=click.IntRange(1, 256), default=None, help="Local processes [default: the CPU count].")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Run traces and plans on this Dask scheduler (its workers must share --out's file system).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed for planners that use randomness.")
@click.option("--out", default="swapplan-fit", show_default=True,
              help="Output folder: results.json, plans/, traces/ (the trace cache), report.html. A rerun into "
                   "the same folder reads what it has and runs only the rest.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (progress still on stderr).")
def fit_cmd(model, hf_config, axis, batch, seq, step, max_size, dtype, amp, optimizer, cpu_kernels, hardware_name,
            world, strategy, memory, reserve, allocator, planner_list, global_batch, time_limit, jobs, dask_address,
            seed, out, as_json):
    """The largest batch (or context) MODEL trains with within the GPU's memory, per family
    of planners (baseline, swap, recompute, swap + recompute, ...), by which planner, and
    its simulated step time and throughput; the size with the best throughput; and what
    stops the next size (the wall).

    Each size is traced once (cached in --out), planned by every chosen planner and
    simulated; the search doubles, then bisects, and the reported edge was tried on both
    sides: the largest size fits and the next does not. MODEL as for trace (needs the
    `trace` extra). Exit status: 0 done, 2 bad input, 130 interrupted (finished probes are
    kept; rerun to resume). See docs/fit.md.
    """
    from cli_errors import need_torch
    from fit.api import axis_bounds, best_strategy, data_parallel, families_of, fit, fit_memory, make_spec
    from fit.report import write_report
    from fit.run import FitRequest
    from fit.store import fit_folder, fit_writes
    from planner.core.registry import select_planners
    from simulator.errors import InputError
    from simulator.hardware import load_hardware

    need_torch("fit")
    if global_batch is not None and axis != "batch":
        raise InputError("<argument>", "--global-batch", "goes with --axis batch")
    if step is not None and axis == "batch":
        raise InputError("<argument>", "--step", "goes with --axis seq (the batch axis steps by one sample)")
    hardware = load_hardware(hardware_name)
    strategies = data_parallel(hardware, world, strategy)
    spec = make_spec(model, hf_config, hardware_name, axis, step, batch, seq, dtype, amp, optimizer, cpu_kernels)
    if hf_config is not None:
        from tracer.hf_config import precheck
        precheck(hf_config, batch=spec.batch, seq=spec.seq)
    elif ":" not in model:
        from tracer.models import REGISTRY
        if model not in REGISTRY:
            raise InputError("<argument>", "model", f"unknown model {model!r} (use {', '.join(REGISTRY)}, or "
                                                    "module:callable)")
    families = families_of(select_planners(planner_list))
    if not families:
        raise InputError("<argument>", "--planners", "is empty")
    memory_bytes = fit_memory(hardware, memory, reserve)
    first, last = axis_bounds(spec, batch if axis == "batch" else seq, max_size)
    fit_folder(out).check(inputs=[("hardware file", hardware_name), ("--hf-config file", hf_config)],
                          writes=fit_writes)
    workers = jobs or os.cpu_count() or 1
    held = "reserved by PyTorch's caching allocator" if allocator else "live"
    summaries = {}
    for each in strategies or (None,):     # one fit per strategy, each in its own folder under --out
        folder = out if len(strategies) <= 1 else os.path.join(out, each)
        ranked = replace(spec, strategy=each, world=world if each else 1)
        request = FitRequest(ranked, memory_bytes, families, seed, time_limit, first, last, global_batch, allocator)
        ranks = f", one rank of {world} ({each})" if each else ""
        click.echo(f"fit: {spec.label} on {hardware.name} within {format_bytes(memory_bytes)} {held}{ranks}, "
                   f"{axis} axis, {len(families)} famil{'ies' if len(families) > 1 else 'y'} "
                   f"({', '.join(families)}) on {workers} process{'es' if workers > 1 else ''}", err=True)
        summary, state = fit(request, folder, workers, dask_address, say=lambda line: click.echo(line, err=True))
        summaries[each] = summary
        page = None
        if not state.interrupted:
            with fit_folder(folder).locked():
                page = write_report(summary, Path(folder))
        if not as_json:
            print_fit(summary)
            click.echo(f"{state.traced} sizes traced, {state.ran} plans made, {state.resumed} read from {folder}"
                       + (f"; report in {page}" if page else ""))
        if state.interrupted:
            click.echo(f"interrupted: finished probes are in {os.path.join(folder, 'results.json')}; run the "
                       "same command again to resume", err=True)
            raise click.exceptions.Exit(130)
    if len(summaries) > 1:
        best = best_strategy(summaries)
        if as_json:
            click.echo(json.dumps({"world": world, "strategies": summaries, "best": best}, indent=2,
                                  allow_nan=False))
        else:
            print_best_strategy(best, world, summaries)
    elif as_json:
        click.echo(json.dumps(summaries[strategies[0] if strategies else None], indent=2, allow_nan=False))


def print_best_strategy(best: list[dict], world: int, summaries: dict) -> None:
    """``--strategy all``: per family, the strategy that trains the largest rank's size."""
    from cli_text import table

    unit = next(iter(summaries.values()))["unit"]
    table(f"the most per family on {world} GPUs", ["family", "strategy", "max a rank", "planner", "step", unit],
          [[b["family"], b["strategy"], b["max"], b["planner"], format_us(b["iteration_us"]),
            f"{b['throughput']:,.1f}"] for b in best], right={2, 4, 5})


def print_fit(summary: dict) -> None:
    """The families' table, then the best size and the global batch's answer."""
    from cli_text import table

    unit = summary["unit"]
    rows = []
    for row in summary["families"]:
        speed = f"{row['throughput']:,.1f}" if row["throughput"] else "-"
        step = format_us(row["iteration_us"]) if row["iteration_us"] else "-"
        best = f"{row['best_size']} ({row['best_throughput']:,.1f})" if row["best_size"] else "-"
        over = f" (+{format_bytes(row['next_over_bytes'])})" if row.get("next_over_bytes") else ""
        rows.append([row["family"], row["max"], row["planner"] or "-", step, speed, best,
                     f"{row['wall'] or '-'}{over}"])
    ranks = f", a rank of {summary['world']} ({summary['strategy']})" if summary.get("strategy") else ""
    table(f"largest {summary['axis']} within {format_bytes(summary['memory_bytes'])} on {summary['hardware']}{ranks}",
          ["family", "max", "planner", "step", unit, f"best {unit}", "wall at the next size"], rows,
          right={1, 3, 4, 5})
    for row in summary["families"]:
        if row["wall_text"]:
            where = f"at {row['next_size']}: " if row["next_size"] is not None else ""
            click.echo(f"  {row['family']}: {where}{row['wall_text']}")
    way = (summary.get("global_batch") or {}).get("fastest")
    if way:
        click.echo(f"global batch {summary['global_batch']['samples']}: {way['micro_batch']} x "
                   f"{way['accumulation_steps']} steps with {way['planner']} ({way['family']}), "
                   f"{format_us(way['step_us'])} a step, {way['samples_per_s']:,.1f} samples/s")
