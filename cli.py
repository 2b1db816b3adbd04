"""The swapplan command line: parses, calls one library function, prints.

Bad input of any kind, a usage error included, exits with status 2 and one line
``error: <file>: <where>: <problem>`` (long values shortened); ``--debug`` (anywhere on
the line) prints the traceback before that line and keeps the exit status.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from simulator import catalog
from simulator.errors import InputError, SwapplanError
from simulator.files import check_outputs
from simulator.hardware import load_hardware, load_presets
from simulator.plan import load_plan
from simulator.units import format_bytes, format_us

from cli_errors import TRACE_EXTRA as _TRACE_EXTRA, OneLineErrors, need_torch as _need_torch, one_line as _one_line
from cli_text import (print_comparison, print_hardware, print_planners, print_profiles, print_replay, print_result,
                      print_train, table)



def _echo_json(data) -> None:
    # allow_nan=False: a NaN or infinity is a bug to report (exit 3), never invalid JSON.
    click.echo(json.dumps(data, indent=2, sort_keys=False, allow_nan=False))


def _note(text: str) -> None:
    click.echo("note: " + _one_line(text), err=True)


def _outputs(outputs: dict, inputs=()) -> None:
    """Check every output before any work: ``outputs`` maps an option (``-o``) to its path
    (None: not given), ``inputs`` are ``(what, path)`` pairs of the files the command reads.
    InputError (one line naming both) for an output that would replace an input or another
    output (the same file, a symbolic or hard link); then for a folder, a link, a device."""
    check_outputs(outputs.items(), inputs)


def _profile_input(spec):
    """The file a PROFILE argument reads (a shipped profile's too), or the argument as
    given when it names none (opening it says why)."""
    try:
        return catalog.resolve_profile(spec)
    except SwapplanError:
        return spec


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


# ----------------------------------------------------------------------------- info


@app.command()
@click.argument("profile")
@click.option("--json", "as_json", is_flag=True, help="Print the stable JSON summary.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(0), help="How many of the largest tensors to list.")
def info(profile: str, as_json: bool, top: int) -> None:
    """Summarise a profile: ops, tensors, bytes by kind, no-swap peak, ideal time."""
    summary = catalog.profile_summary(catalog.open_profile(profile), largest=top)
    if as_json:
        _echo_json(summary)
        return
    ops_by_phase = ", ".join(f"{k} {v}" for k, v in summary["ops_by_phase"].items() if v)
    source = summary["source"]
    click.echo(f"profile      {summary['name']}  ({summary['file']})")
    if source:
        click.echo("source       " + ", ".join(f"{k}={v}" for k, v in source.items()))
    click.echo(f"ops          {summary['ops']}  ({ops_by_phase})")
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


# ----------------------------------------------------------------------------- validate


@app.command()
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
    hardware = _hardware(hardware_name, loaded_plan, loaded)
    _check_plan_budget(plan, loaded_plan, hardware)
    broken = check_static(loaded, loaded_plan, hardware)
    if broken is not None:
        click.echo(f"INVALID: plan {plan} on {hardware.name}: "
                   + (f"{broken.rule}: {broken.reason}" if broken.reason else f"{broken.rule} at op {broken.op}"))
        raise click.exceptions.Exit(1)
    click.echo(f"ok: plan {plan}: {len(loaded_plan.actions)} actions, planner {loaded_plan.planner.name}, "
               f"valid on {hardware.name}")


# ----------------------------------------------------------------------------- synth


def _synth_default(key: str) -> str:
    """``[default: mlp 8, cnn 8, transformer 12]`` for one synth option."""
    from tracer.synthetic import DEFAULTS
    parts = [f"{model} {values[key]}" for model, values in DEFAULTS.items() if values[key] is not None]
    return f"[default: {', '.join(parts)}]"


@app.command()
@click.argument("model", type=click.Choice(["mlp", "cnn", "transformer"]))
@click.option("--layers", type=int, help="Blocks (Linear+ReLU, residual blocks, transformer blocks). "
                                         + _synth_default("layers"))
@click.option("--width", type=int, help="Hidden size (mlp, transformer) or base channels (cnn). "
                                        + _synth_default("width"))
@click.option("--batch", type=int, help="Batch size. " + _synth_default("batch"))
@click.option("--seq", type=int, help="Sequence length (transformer) or image side in pixels (cnn); "
                                      "the mlp has none. " + _synth_default("seq"))
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True)
@click.option("--hardware", "hardware_name", default="a100-40gb-pcie4", show_default=True,
              help="Preset or hardware file whose roofline gives kernel times.")
@click.option("-o", "--output", required=True, help="Profile file to write (.json, .json.gz, .yaml).")
def synth(model, layers, width, batch, seq, dtype, hardware_name, output) -> None:
    """Generate a synthetic training profile (forward, backward, Adam) without torch."""
    from simulator.profile import save_profile
    from tracer.synthetic import synthesize

    _outputs({"-o": output}, [("hardware file", hardware_name)])
    profile = synthesize(model, layers=layers, width=width, batch=batch, seq=seq,
                         hardware=load_hardware(hardware_name), dtype=dtype)
    save_profile(profile, output)
    click.echo(f"wrote {output}: {profile.name}, {len(profile.ops)} ops, {len(profile.tensors)} tensors, "
               f"peak {format_bytes(profile.peak_bytes)}, ideal {format_us(profile.ideal_us)}")


# ----------------------------------------------------------------------------- simulate


# --hardware and --budget of the commands that take a plan (simulate, replay)
_plan_hardware = click.option("--hardware", "hardware_name", default=None,
                              help="Preset or hardware file [default: the plan's hardware, else the profile's "
                                   "roofline preset, else a100-40gb-pcie4].")
_plan_budget = click.option("--budget", default=None,
                            help="GPU memory budget: 8GiB, 512MB, or 60% of the no-swap peak [default: the "
                                 "plan's, else the GPU's memory].")


@app.command()
@click.argument("profile")
@click.argument("plan", required=False)
@_plan_hardware
@_plan_budget
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
    from planner.core.bound import bound_fields, lower_bound
    from simulator.api import simulate as run_simulation
    from simulator.plan import empty_plan
    from simulator.plot import plot_memory
    from simulator.timeline import write_chrome_trace
    from simulator.units import parse_budget

    _outputs({"--timeline": timeline_out, "--plot": plot_out},
             [("profile", _profile_input(profile)), ("plan", plan), ("hardware file", hardware_name)])
    loaded = catalog.open_profile(profile)
    loaded_plan = load_plan(plan) if plan is not None else empty_plan(loaded)
    hardware = _hardware(hardware_name, loaded_plan, loaded)
    budget_bytes = parse_budget(budget, loaded.peak_bytes) if budget is not None else None
    if budget_bytes is None:
        _check_plan_budget(plan, loaded_plan, hardware)
    if allocator is not None and (loaded_plan.placement is not None or loaded_plan.uvm):
        raise InputError("<argument>", "--allocator", "the plan has a placement (it follows it) or runs in managed "
                                                      "memory (the driver places blocks): no allocator to model")
    result = run_simulation(loaded, loaded_plan, hardware, budget_bytes,
                            record=bool(timeline_out or plot_out), allocator=allocator)
    # the bound of the plan's own kind (as `plan` printed it); a plan that does not say may swap,
    # recompute, move weights and choose variants: the most general bound applies
    kind = loaded_plan.planner.bound if loaded_plan.planner is not None and loaded_plan.planner.bound else ""
    general = not kind.startswith("swap")
    bound = bound_fields(lower_bound(loaded, hardware, result.budget_bytes,
                                     recompute=general or "recompute" in kind,
                                     moves_persistent=general or "persistent" in kind,
                                     cpu_ops=loaded_plan.uses_cpu, uvm=loaded_plan.uvm,
                                     codecs=loaded_plan.uses_codecs, variants=True), result)
    if timeline_out and result.timeline is not None:
        write_chrome_trace(result, timeline_out, title=f"{loaded.name} on {hardware.name}")
    if plot_out and result.timeline is not None:
        plot_memory(result, plot_out)
    if as_json:
        _echo_json({"profile": loaded.name, "hardware": hardware.name, **result.to_dict(), **bound})
    else:
        print_result(loaded.name, hardware.name, result, bound, loaded)
    if not result.ok:
        raise click.exceptions.Exit(1)


def _check_plan_budget(path, plan, hardware) -> None:
    """InputError when the plan's own budget is more than the GPU's memory (simulate and
    validate without --budget)."""
    if plan.budget_bytes is not None and plan.budget_bytes > hardware.gpu.memory_bytes:
        raise InputError(path, "budget_bytes",
                         f"the plan's budget, {format_bytes(plan.budget_bytes)} ({plan.budget_bytes} "
                         f"bytes), is more than the GPU's memory on {hardware.name} "
                         f"({format_bytes(hardware.gpu.memory_bytes)}); give --budget to simulate it with another")


def _hardware(hardware_name, plan, profile):
    """The hardware to use; a note on stderr when it was chosen from the profile's GPU."""
    spec, note = catalog.choose_hardware(hardware_name, plan, profile)
    if note:
        _note(note)
    return load_hardware(spec)


# ----------------------------------------------------------------------------- replay


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


@app.command("replay")
@click.argument("profile")
@click.argument("plan")
@click.option("--backend", type=click.Choice(["host", "cuda"]), default="host", show_default=True,
              help="host: an emulation on the CPU in real time (threads, a memory region, a file for the "
                   "SSD); cuda: a real GPU through CuPy (needs the cuda extra and a GPU).")
@_plan_hardware
@_plan_budget
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
    hardware = _hardware(hardware_name, loaded_plan, loaded)
    budget_bytes = parse_budget(budget, loaded.peak_bytes) if budget is not None else None
    report = replay(loaded, loaded_plan, hardware, budget_bytes, backend=backend, time_scale=time_scale,
                    size_scale=size_scale, say=_note)
    if as_json:
        _echo_json(report)
    else:
        print_replay(report)
    if not report["ok"]:
        click.echo("replay failed: " + _one_line(report["failure"]["message"]), err=True)
        raise click.exceptions.Exit(1)
    if not report["predicted"]["valid"] or not report["predicted"]["feasible"]:
        _note(f"the simulator finds this plan {'invalid' if not report['predicted']['valid'] else 'infeasible'}: "
              f"{report['predicted']['rule']}: {report['predicted']['reason']}")


# ----------------------------------------------------------------------------- trace


@app.command("trace")
@click.argument("model", required=False)
@click.option("--hf-config", "hf_config", default=None, metavar="CONFIG.json",
              help="Trace a transformers causal LM from a local config.json instead of MODEL (built on the "
                   "meta device, nothing downloaded), or a shipped config by name: llama2-7b, llama2-13b, "
                   "llama2-70b, mistral-7b [default batch 1, seq 1024].")
@click.option("--batch", type=int, default=None, help="Batch size [default: the model's].")
@click.option("--seq", type=int, default=None,
              help="Sequence length (language models) or image side in pixels (vision) [default: the model's].")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True,
              help="Pure training in this dtype: weights, optimizer state and activations all in it.")
@click.option("--amp", type=click.Choice(["bf16", "fp16"]), default=None,
              help="Mixed precision: autocast forward, weights and gradients in this dtype, fp32 master "
                   "weights and optimizer state (AdamW: 16 bytes per parameter); per parameter the optimizer "
                   "ops optim::adamw_foreach, optim::cast_master, optim::copy_param. fp16 adds a static "
                   "loss scale. Not with --dtype bf16/fp16.")
@click.option("--optimizer", type=click.Choice(["adamw", "sgd"]), default="adamw", show_default=True)
@click.option("--hardware", "hardware_name", default="a100-40gb-pcie4", show_default=True,
              help="Preset or hardware file whose roofline times the kernels.")
@click.option("--cpu-kernels", is_flag=True, help="Keep the CPU's kernel choices (math attention, float "
                                                  "dropout masks, CPU autocast lists) instead of those a CUDA "
                                                  "run picks.")
@click.option("--name", default=None, help="Profile name [default: <model>-b<batch>-s<seq>...].")
@click.option("--runtime", is_flag=True, help="Add what a runtime needs to follow a plan (node identity, "
                                              "rewrites, random ops; see docs/runtime.md): the profile "
                                              "`swapplan train --plan` runs plans of.")
@click.option("--density", is_flag=True, help="Measure each tensor's density (fraction of non-zero "
                                              "elements) on one real CPU step (forward, backward, optimizer) "
                                              "of the traced graph, with the model's seeded initial weights "
                                              "and a seeded synthetic batch of --density-batch samples (see "
                                              "docs/tracing.md).")
@click.option("--density-batch", type=click.IntRange(1), default=None, metavar="N",
              help="Batch of the real step --density runs [default: min(batch, 2) for a language model, "
                   "min(batch, 4) otherwise]; the graph at that batch must have the same tensors and ops as "
                   "the traced one.")
@click.option("--density-seq", type=click.IntRange(1), default=None, metavar="N",
              help="Sequence length (image side) of the real step --density runs [default: min(seq, 128) for "
                   "a language model, then --seq if the graph differs at 128; --seq otherwise]; a shorter one "
                   "is cheaper (the graph must still have the same tensors and ops).")
@click.option("--density-seed", type=click.IntRange(0, 2**64 - 1), default=0, show_default=True, metavar="N",
              help="Seed of the weights, the batch and the RNG of --density's step (0 to 2^64 - 1, the seeds "
                   "torch takes).")
@click.option("--density-threads", type=click.IntRange(1, 1024), default=None, metavar="N",
              help="Intra-op CPU threads of --density's step [default: 2, whatever the machine: another count "
                   "may move a density by one in its last digit].")
@click.option("--density-file", "density_file", default=None, metavar="FILE",
              help="Set tensor densities from FILE, a JSON object mapping tensor ids (or unique tensor names) "
                   "to fractions of non-zero elements from 0 to 1 (over --density's for the tensors it names).")
@click.option("--density-out", "density_out", default=None, metavar="FILE",
              help="Also write the profile's densities to FILE (JSON, the format --density-file reads).")
@click.option("--list", "list_models", is_flag=True, help="List the registered models and exit.")
@click.option("-o", "--output", default=None, help="Profile file to write (.json, .json.gz, .yaml).")
def trace_cmd(model, hf_config, batch, seq, dtype, amp, optimizer, hardware_name, cpu_kernels, name, runtime,
              density, density_batch, density_seq, density_seed, density_threads, density_file, density_out,
              list_models, output) -> None:
    """Trace one training step of MODEL (forward, backward, optimizer) on fake tensors:
    no weights, no GPU, no download; kernel times from a roofline of the hardware.

    MODEL is a registered name (gpt2, gpt2-medium, bert-base, bert-large, llama-1b,
    vit-base, resnet50, resnet152, vgg16; see --list) or module:callable, a function of
    yours returning (nn.Module, example inputs[, loss_fn[, targets]]); or, instead of
    MODEL, --hf-config config.json (any transformers causal LM: Llama, Mistral, ...).
    Needs the `trace` extra (torch, transformers). See docs/tracing.md.
    """
    from simulator.profile import save_profile

    _need_torch("trace")

    if list_models:
        from tracer.models import REGISTRY
        table(None, ["model", "batch", "seq", "description"],
               [[e.name, e.batch, e.seq, e.description] for e in REGISTRY.values()], right={1, 2})
        return
    if (model is None and hf_config is None) or output is None:
        raise click.UsageError("MODEL (or --hf-config) and -o/--output are required (or --list)")
    if not density and (density_batch is not None or density_seq is not None or density_seed != 0
                        or density_threads is not None):
        raise click.UsageError("--density-batch, --density-seq, --density-seed and --density-threads go with "
                               "--density")
    _outputs({"-o": output, "--density-out": density_out},
             [("--hf-config file", hf_config), ("hardware file", hardware_name), ("--density-file", density_file)])
    if hf_config is not None:   # a bad or oversized config fails at once, before torch is imported
        from tracer.hf_config import precheck
        precheck(hf_config, batch=batch, seq=seq)
    raw_densities = _read_density_file(density_file)   # a bad file fails before the trace
    what = model if hf_config is None else hf_config
    try:
        from tracer.torch_trace import trace
    except ModuleNotFoundError as exc:   # torch found but broken: a part of it is missing
        raise InputError("", "", f"trace {_TRACE_EXTRA} ({exc.name} cannot be imported)") from None
    try:
        profile = trace(model, batch=batch, seq=seq, dtype=dtype, optimizer=optimizer, hardware=hardware_name,
                        name=name, gpu_kernels=not cpu_kernels, amp=amp, hf_config=hf_config, runtime=runtime,
                        density=density, density_batch=density_batch, density_seq=density_seq,
                        density_seed=density_seed, density_threads=density_threads,
                        say=lambda line: click.echo(f"  {line}", err=True),
                        started=lambda: click.echo(f"tracing {what}{' and measuring densities' if density else ''}"
                                                   " ...", err=True))
    except ModuleNotFoundError as exc:  # transformers, for the Hugging Face models
        if (exc.name or "").split(".")[0] not in ("torch", "transformers"):
            raise
        raise InputError("", "", f"trace of {what} {_TRACE_EXTRA} ({exc.name} is not installed)") from None
    profile = _apply_density_file(profile, density_file, raw_densities)
    save_profile(profile, output)
    click.echo(f"wrote {output}: {profile.name}, {len(profile.ops)} ops, {len(profile.tensors)} tensors, "
               f"peak {format_bytes(profile.peak_bytes)}, ideal {format_us(profile.ideal_us)}")
    _density_outputs(profile, density or density_file, density_out)


def _read_density_file(path):
    """A --density-file's entries, checked (keys are resolved against the profile later)."""
    if path is None:
        return None
    from tracer.density import load_density_file
    return load_density_file(path)


def _apply_density_file(profile, path, raw):
    """The profile with the densities of a --density-file (read by _read_density_file)."""
    if path is None:
        return profile
    from tracer.density import resolve_densities, with_densities
    found = resolve_densities(raw, profile, str(path))
    note = dict(profile.source.get("density") or {})
    note["file"] = str(path)
    return with_densities(profile, found, note)


def _density_outputs(profile, densities_given, density_out) -> None:
    """The summary line of the densities, and --density-out."""
    from tracer.density import summary, write_density_file
    if densities_given:
        click.echo(f"  {summary(profile)}")
    if density_out:
        write_density_file(profile, density_out)
        click.echo(f"wrote {density_out}: densities of "
                   f"{sum(t.density is not None for t in profile.tensors)} tensors")


# ----------------------------------------------------------------------------- train


@app.command("train")
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
@click.option("--hardware", "hardware_name", default="a100-40gb-pcie4", show_default=True,
              help="Preset or hardware file: the roofline, the budget's ceiling and the clock of the copies.")
@click.option("--cpu-kernels", is_flag=True, help="Trace the CPU's kernel choices instead of those a CUDA run "
                                                  "picks (which run here through CPU emulations).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="A planner parameter (repeatable).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the weights, the batch and the RNG.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1, 1024),
              help="Intra-op CPU threads of every run (the same in all, for bit-equality).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def train_cmd(model, planner_name, budget, plan_path, steps, batch, seq, optimizer, hardware_name, cpu_kernels,
              params, seed, threads, as_json) -> None:
    """Run real training steps of MODEL on the CPU following a plan, and check them.

    Traces MODEL with node identity, plans it (--planner P --budget B) or takes --plan,
    and runs --steps steps on the same seeded weights and batch three ways: the traced
    graph called whole, node by node with no plan, and node by node following the plan
    (offloads to a host pool, prefetches, drops, recomputes with the RNG replayed, at
    the simulator's points). Reports whether loss, parameters, optimizer state and
    buffers are bit-equal, the peak of the "GPU" pool against the budget, the actions
    applied and the seconds per step. Exit status: 0 bit-equal, within budget and every
    action applied; 1 otherwise, or a plan the simulator refuses; 2 bad input. See
    docs/runtime.md.
    """
    _need_torch()
    from runtime import PlanRefused, RuntimeFailure, train

    if (planner_name is None) == (plan_path is None):
        raise click.UsageError("give --planner with --budget, or --plan")
    if planner_name is not None and budget is None:
        raise click.UsageError("--planner needs --budget")
    notes: list[str] = []
    try:
        report = train(model, planner=planner_name, budget=budget, plan=plan_path, steps=steps, batch=batch, seq=seq,
                       hardware=hardware_name, optimizer=optimizer, gpu_kernels=not cpu_kernels, seed=seed,
                       params=_parse_params(params), threads=threads, notes=notes)
    except (PlanRefused, RuntimeFailure) as exc:
        click.echo(_one_line(str(exc)), err=True)
        raise click.exceptions.Exit(1)
    for note in notes:
        _note(note)
    if as_json:
        _echo_json(report)
    else:
        print_train(report)
    ok = report["bit_equal"] and report["peak_bytes"] <= report["budget_bytes"] and \
        report["actions_applied"] == report["actions_total"]
    if not ok:
        raise click.exceptions.Exit(1)


# ----------------------------------------------------------------------------- import


@app.group("import")
def import_group() -> None:
    """Turn measured traces into profiles."""


@import_group.command("kineto")
@click.argument("trace")
@click.option("--et", "et_path", default=None, help="The PyTorch Execution Trace of the same run: real "
                                                    "dataflow, and weights / optimizer state / inputs.")
@click.option("--iteration", type=int, default=None,
              help="Which ProfilerStep#N to take [default: the last complete one].")
@click.option("--name", default=None, help="Profile name [default: the trace file's name without "
                                            "its extensions].")
@click.option("--density-file", "density_file", default=None, metavar="FILE",
              help="Set tensor densities from FILE, a JSON object mapping tensor ids (or unique tensor names) "
                   "to fractions of non-zero elements from 0 to 1 (an imported trace has none).")
@click.option("-o", "--output", required=True, help="Profile file to write (.json, .json.gz, .yaml).")
def import_kineto_cmd(trace, et_path, iteration, name, density_file, output) -> None:
    """A PyTorch profiler (Kineto) trace measured on a GPU becomes a profile with measured
    kernel times; tensors and lifetimes come from its [memory] events (record with
    profile_memory=True), and from the Execution Trace when given."""
    from simulator.profile import save_profile
    from tracer.kineto import import_kineto

    if name is not None and not name.strip():
        raise InputError("<argument>", "--name", "expected a profile name, got an empty one")
    _outputs({"-o": output}, [("trace", trace), ("--et trace", et_path), ("--density-file", density_file)])
    raw_densities = _read_density_file(density_file)
    profile = import_kineto(trace, et_path=et_path, iteration=iteration, name=name)
    profile = _apply_density_file(profile, density_file, raw_densities)
    save_profile(profile, output)
    click.echo(f"wrote {output}: {profile.name}, {len(profile.ops)} ops, {len(profile.tensors)} tensors, "
               f"peak {format_bytes(profile.peak_bytes)}, ideal {format_us(profile.ideal_us)} (measured)")
    if density_file:
        _density_outputs(profile, True, None)
    gpu = profile.source.get("gpu") or {}
    if gpu.get("unattributed_in_trace"):
        _note(f"{gpu['unattributed_in_trace']} GPU events (kernels, copies, memsets) match no operator's launch "
              "(no correlation or External id to follow) and are left out of the op times")
    if et_path is None:
        pre = (profile.source.get("memory") or {}).get("pre_window_tensor")
        if pre:
            _note("without --et, what was allocated before the trace window (weights, optimizer state, batch) is "
                  "one persistent tensor, 'pre_window', that no op reads (see `swapplan info`)")
        else:
            _note("without --et the profile has no weights, optimizer state or inputs (they were allocated "
                  "before the trace, and it has no Total Allocated figures); percentages of the peak exclude them")


# ----------------------------------------------------------------------------- plan


def _parse_params(pairs: tuple[str, ...]) -> dict:
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError("<argument>", "--param", f"expected key=value, got {pair!r}")
        params[key.strip()] = value.strip()
    return params


@app.command("plan")
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
@click.option("--threads", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Threads for solvers (0: every core).")
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

    _outputs({"-o": output}, [("profile", _profile_input(profile)), ("hardware file", hardware_name)])
    loaded = catalog.open_profile(profile)
    hardware = _hardware(hardware_name, None, loaded)
    budget_bytes, asked = (hardware.gpu.memory_bytes, None) if budget is None else \
        planning_budget(budget, loaded.peak_bytes, hardware.gpu.memory_bytes)
    if asked is not None:
        _note(f"budget: {budget} of the no-swap peak is {format_bytes(asked)}, more than the GPU's "
              f"{format_bytes(hardware.gpu.memory_bytes)} on {hardware.name}: planning for the GPU's memory")
    given = _parse_params(params)
    if gap is not None:
        given["gap"] = str(gap)
    if codec is not None:
        if given:
            raise InputError("<argument>", "--codec", "--param goes to the base planner's own run; with --codec "
                                                      "give the base planner's defaults (or use --planner cswap)")
        planner_name, given = "cswap", {"base": planner_name, "codec": codec}
        _note(f"--codec {codec}: planner cswap with base={given['base']}")
    if allow_lossy:
        from planner.core.registry import get_planner
        if "allow_lossy" not in {p.name for p in get_planner(planner_name).params}:
            raise InputError("<argument>", "--allow-lossy", f"planner {planner_name!r} uses no lossy codecs "
                                                            "(gist and cswap do)")
        given["allow_lossy"] = "true"
    options = RunOptions(seed=seed, time_limit=time_limit, threads=threads or os.cpu_count() or 1,
                         progress=None if as_json else _note)
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
        _echo_json(summary)
    else:
        click.echo(f"planner {planner_name} ({planned.plan.planner.status}): {len(planned.plan.actions)} actions "
                   f"in {planned.seconds:.3f} s" + (f", written to {output}" if output else ""))
        print_result(loaded.name, hardware.name, result, profile=loaded, bound={key: summary[key] for key in
                                                          ("lower_bound_us", "gap_to_bound", "bound")})
    if not result.ok:
        raise click.exceptions.Exit(1)


@app.command("compare")
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
    folder.check(inputs=[("profile", _profile_input(p)) for p in profiles]
                 + [("hardware file", h) for h in hardware_names], writes=compare_writes)
    folded: list[str] = []
    cells = expand_cells(profiles, hardware_names or (None,), names, budget_list, seed, time_limit, folded)
    workers = jobs or min(os.cpu_count() or 1, len(cells))

    def started() -> None:   # set-up succeeded: the notes and the banner, then the progress
        for line in folded:
            _note(line)
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
        _echo_json(outcome.rows)
    else:
        print_comparison(outcome.rows)
        others = len(outcome.folder_rows) - len(outcome.rows)
        click.echo(f"{outcome.ran} cells run, {outcome.resumed} already done; rows in "
                   f"{os.path.join(out, 'results.csv')}" + (f" (with {others} of other runs)" if others > 0 else "")
                   + (f", report in {page}" if page else ""))
    for row in outcome.failed:
        _note(f"{row['profile']} {row['hardware']} {row['planner']} {row['budget']}: {row['error']}")
    if outcome.interrupted:
        click.echo(f"interrupted: {len(outcome.rows)} of {len(cells)} cells written; run the same command "
                   "again to finish", err=True)
        raise click.exceptions.Exit(130)
    if outcome.failed:
        raise click.exceptions.Exit(1)


@app.command("place")
@click.argument("profile")
@click.argument("plan")
@click.option("--method", type=click.Choice(["smartpool", "greedy-size", "first-fit"]), default="smartpool",
              show_default=True, help="smartpool: SmartPool's offline interval colouring (cross-iteration blocks "
                                      "first, then largest first); greedy-size: largest first, then longest "
                                      "lifetime; first-fit: in allocation order.")
@_plan_hardware
@_plan_budget
@click.option("-o", "--output", required=True, help="Write the placed plan JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def place_cmd(profile, plan, method, hardware_name, budget, output, as_json) -> None:
    """Give every GPU allocation of PLAN's iteration an offset in one arena (R50), from the
    lifetimes of its simulated iteration, so that a runtime can lay out its memory once.

    The placed plan is simulated; exit status 1 when its arena does not fit the budget.
    """
    from planner.core.placement import place
    from simulator.api import simulate as run_simulation
    from simulator.plan import save_plan
    from simulator.units import parse_budget

    _outputs({"-o": output},
             [("profile", _profile_input(profile)), ("plan", plan), ("hardware file", hardware_name)])
    loaded_plan = load_plan(plan)
    if loaded_plan.uvm:              # before the profile is read: nothing to place
        raise InputError(loaded_plan.origin, "memory", "a UVM plan (\"memory\": \"uvm\") has no placement: the "
                                                       "driver places its blocks (R33); `swapplan simulate` scores "
                                                       "it, or place a plan of an explicit planner")
    loaded = catalog.open_profile(profile)
    try:
        hardware = _hardware(hardware_name, loaded_plan, loaded)
    except InputError:
        if hardware_name or not loaded_plan.hardware:
            raise
        hardware = _hardware(None, None, loaded)     # a plan naming a machine this host does not know
        _note(f"the plan's hardware {loaded_plan.hardware!r} is neither a preset nor a file here: lifetimes "
              f"from {hardware.name}; --hardware chooses another")
    budget_bytes = parse_budget(budget, loaded.peak_bytes) if budget is not None else None
    placed, figures = place(loaded, loaded_plan, hardware, budget_bytes, method)
    result = run_simulation(loaded, placed, hardware, budget_bytes)
    save_plan(placed, output)
    figures.update(profile=loaded.name, hardware=hardware.name, output=output, feasible=result.ok,
                   iteration_us=result.iteration_us)
    if as_json:
        _echo_json(figures)
    else:
        click.echo(f"placed {figures['allocations']} allocations by {method}: arena {format_bytes(figures['arena_bytes'])}"
                   f" for a live peak of {format_bytes(figures['peak_live_bytes'])} "
                   f"({figures['arena_over_live']:.4f}x); written to {output}")
        if not result.ok:
            click.echo(f"  the placed plan does not run: {result.reason}")
    if not result.ok:
        raise click.exceptions.Exit(1)


@app.command("variants")
@click.argument("profile")
@click.option("--from", "source", required=True, metavar="FILE.csv",
              help="Measured alternatives: a CSV with a header op,name,time_us,workspace_bytes, one variant "
                   "per row.")
@click.option("--replace", "replace_existing", is_flag=True,
              help="Replace a variant an op has already under the same name [default: an error].")
@click.option("-o", "--output", required=True, help="Profile file to write.")
def variants_cmd(profile, source, replace_existing, output) -> None:
    """Merge measured op variants (R52: other algorithms for the same op, e.g. each cuDNN
    convolution algorithm timed on the target GPU) into PROFILE; plans may then choose
    them (``variants``). See docs/tracing.md."""
    from simulator.profile import save_profile
    from simulator.compile.variants import merge_variants, read_variants

    _outputs({"-o": output}, [("profile", _profile_input(profile)), ("--from CSV", source)])
    loaded = catalog.open_profile(profile)
    rows = read_variants(source)
    merged = merge_variants(loaded, rows, source, replace_existing)
    save_profile(merged, output)
    count = sum(len(op.variants) for op in merged.ops) - sum(len(op.variants) for op in loaded.ops)
    replaced = len(rows) - count
    click.echo(f"wrote {output}: {count} variants added" + (f", {replaced} replaced" if replaced else "")
               + f"; {sum(1 for op in merged.ops if op.variants)} ops have variants")


@app.command("planners")
@click.option("--json", "as_json", is_flag=True, help="Print the planners and their parameters as JSON.")
def planners_cmd(as_json: bool) -> None:
    """List the planners by family (after where to start) and their parameters."""
    from planner.core.registry import planners

    from planner.core.registry import FAMILIES, START_HERE

    specs = planners()
    if as_json:
        _echo_json([{"name": s.name, "summary": s.summary, "paper": s.paper,
                     "moves_persistent": s.moves_persistent,
                     "params": [{"name": p.name, "default": p.default, "help": p.help, "type": p.type.__name__,
                                 "values": p.describe(),
                                 "choices": list(p.choices) if p.choices else None} for p in s.params]}
                    for s in specs])
        return
    print_planners(specs, FAMILIES, START_HERE)


# ----------------------------------------------------------------------------- lists


@app.command("hardware")
@click.option("--json", "as_json", is_flag=True, help="Print the presets as JSON.")
def hardware_cmd(as_json: bool) -> None:
    """List the hardware presets."""
    presets = load_presets()
    if as_json:
        _echo_json([hw.to_dict() for hw in presets])
        return
    print_hardware(presets)


@app.command("profiles")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def profiles_cmd(as_json: bool) -> None:
    """List the shipped profiles with their no-swap peak and ideal time."""
    rows = catalog.shipped_profiles_summary()
    if as_json:
        _echo_json(rows)
        return
    print_profiles(rows)


from cli_fit import fit_cmd  # noqa: E402  (a command of its own module; it imports nothing of cli)

app.add_command(fit_cmd)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: ``--debug`` may appear anywhere on the line."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    app.main(args=args, prog_name="swapplan", obj={"debug": debug})


if __name__ == "__main__":
    main()
