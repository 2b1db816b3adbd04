"""The commands that make profiles: ``synth`` (a synthetic model, no torch), ``trace`` (one
training step of a PyTorch model on fake tensors), ``import kineto`` (a trace measured on a
GPU), ``variants`` (measured op variants merged in), and the density files trace and import
read and write."""
from __future__ import annotations

import click

from simulator import catalog
from simulator.errors import InputError
from simulator.hardware import load_hardware
from simulator.units import format_bytes, format_us

from cli_common import guard_outputs, print_note, profile_input
from cli_errors import TRACE_EXTRA, need_torch
from cli_text import table


def _synth_default(key: str) -> str:
    """``[default: mlp 8, cnn 8, transformer 12]`` for one synth option."""
    from tracer.synthetic import DEFAULTS
    parts = [f"{model} {values[key]}" for model, values in DEFAULTS.items() if values[key] is not None]
    return f"[default: {', '.join(parts)}]"


@click.command()
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

    guard_outputs({"-o": output}, [("hardware file", hardware_name)])
    profile = synthesize(model, layers=layers, width=width, batch=batch, seq=seq,
                         hardware=load_hardware(hardware_name), dtype=dtype)
    save_profile(profile, output)
    click.echo(f"wrote {output}: {profile.name}, {len(profile.ops)} ops, {len(profile.tensors)} tensors, "
               f"peak {format_bytes(profile.peak_bytes)}, ideal {format_us(profile.ideal_us)}")


@click.command("trace")
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
@click.option("--shard", "shard_strategy", type=click.Choice(["ddp", "zero1", "zero2", "zero3"]), default=None,
              help="Write one rank of --world data-parallel ranks instead, sharded with this strategy (as `swapplan "
                   "shard` does with its defaults; see docs/sharding.md).")
@click.option("--world", type=click.IntRange(1, 65536), default=None, help="With --shard: the ranks.")
@click.option("--list", "list_models", is_flag=True, help="List the registered models and exit.")
@click.option("-o", "--output", default=None, help="Profile file to write (.json, .json.gz, .yaml).")
def trace_cmd(model, hf_config, batch, seq, dtype, amp, optimizer, hardware_name, cpu_kernels, name, runtime,
              density, density_batch, density_seq, density_seed, density_threads, density_file, density_out,
              shard_strategy, world, list_models, output) -> None:
    """Trace one training step of MODEL (forward, backward, optimizer) on fake tensors:
    no weights, no GPU, no download; kernel times from a roofline of the hardware.

    MODEL is a registered name (gpt2, gpt2-medium, bert-base, bert-large, llama-1b,
    vit-base, resnet50, resnet152, vgg16; see --list) or module:callable, a function of
    yours returning (nn.Module, example inputs[, loss_fn[, targets]]); or, instead of
    MODEL, --hf-config config.json (any transformers causal LM: Llama, Mistral, ...).
    Needs the `trace` extra (torch, transformers). See docs/tracing.md.
    """
    from simulator.profile import save_profile

    need_torch("trace")

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
    if (shard_strategy is None) != (world is None):
        raise click.UsageError("--shard and --world go together")
    guard_outputs({"-o": output, "--density-out": density_out},
                  [("--hf-config file", hf_config), ("hardware file", hardware_name), ("--density-file", density_file)])
    if hf_config is not None:   # a bad or oversized config fails at once, before torch is imported
        from tracer.hf_config import precheck
        precheck(hf_config, batch=batch, seq=seq)
    raw_densities = _read_density_file(density_file)   # a bad file fails before the trace
    what = model if hf_config is None else hf_config
    try:
        from tracer.pytorch.trace import trace
    except ModuleNotFoundError as exc:   # torch found but broken: a part of it is missing
        raise InputError("", "", f"trace {TRACE_EXTRA} ({exc.name} cannot be imported)") from None
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
        raise InputError("", "", f"trace of {what} {TRACE_EXTRA} ({exc.name} is not installed)") from None
    profile = _apply_density_file(profile, density_file, raw_densities)
    if shard_strategy is not None:
        from cli_shard import echo_rank
        from shard import shard_profile
        rank = shard_profile(profile, shard_strategy, world)
        save_profile(rank, output)
        echo_rank(output, profile, rank)
    else:
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


@click.group("import")
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
    guard_outputs({"-o": output}, [("trace", trace), ("--et trace", et_path), ("--density-file", density_file)])
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
        print_note(f"{gpu['unattributed_in_trace']} GPU events (kernels, copies, memsets) match no operator's launch "
                   "(no correlation or External id to follow) and are left out of the op times")
    if et_path is None:
        pre = (profile.source.get("memory") or {}).get("pre_window_tensor")
        if pre:
            print_note("without --et, what was allocated before the trace window (weights, optimizer state, batch) is "
                       "one persistent tensor, 'pre_window', that no op reads (see `swapplan info`)")
        else:
            print_note("without --et the profile has no weights, optimizer state or inputs (they were allocated "
                       "before the trace, and it has no Total Allocated figures); percentages of the peak exclude them")


@click.command("variants")
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
    from simulator.model.variants import merge_variants, read_variants

    guard_outputs({"-o": output}, [("profile", profile_input(profile)), ("--from CSV", source)])
    loaded = catalog.open_profile(profile)
    rows = read_variants(source)
    merged = merge_variants(loaded, rows, source, replace_existing)
    save_profile(merged, output)
    count = sum(len(op.variants) for op in merged.ops) - sum(len(op.variants) for op in loaded.ops)
    replaced = len(rows) - count
    click.echo(f"wrote {output}: {count} variants added" + (f", {replaced} replaced" if replaced else "")
               + f"; {sum(1 for op in merged.ops if op.variants)} ops have variants")
