"""Trace one real PyTorch training step into a Profile, on fake tensors: :func:`trace`.

``trace(model, batch=..., seq=...)`` builds a model of :mod:`tracer.models` on the
meta device, fakes its parameters, buffers, optimizer state and batch
(``FakeTensorMode``: shapes, dtypes and storages, no memory, no weights, no GPU,
nothing downloaded) and records one full training step with
``make_fx(step, tracing_mode="fake")`` at the ATen level:

    forward (``torch.func.functional_call``) -> loss -> ``torch.autograd.grad``
    -> the optimizer written with the ``_foreach_*`` ops that
       ``torch.optim.AdamW(foreach=True)`` (or ``SGD(momentum=0.9, foreach=True)``) runs.

The real ``torch.optim`` optimizers cannot be traced (they read the step count with
``.item()``; ``capturable=True`` wants CUDA), so :func:`tracer.pytorch.optim.adamw_foreach` and
:func:`sgd_foreach` restate their non-capturable multi-tensor paths op for op (the
CPU-side step counters launch no GPU kernel and are left out). Markers from
``torch.profiler.record_function("phase:...")`` survive make_fx and give each op its
phase.

The work is done by one module per stage: :mod:`tracer.pytorch.step` (the step as a function,
mixed precision), :mod:`tracer.pytorch.optim` (the optimizers), :mod:`tracer.pytorch.kernel_choice` (the
kernels a CUDA run picks), :mod:`tracer.pytorch.capture` (make_fx on fake tensors),
:mod:`tracer.pytorch.lowering` (graph to tensors and ops, kernel times), :mod:`tracer.pytorch.node_identity`
(the ``fx`` a runtime reads) and :mod:`tracer.density` (densities from a real CPU step).
This module is the entry point and re-exports their public names.

Every problem raises ``InputError("<argument>", field, problem)`` with a one-line
problem: unknown model, bad ``module:callable``, bad sizes, a dtype the hardware
lacks, or a model that fails to trace; a bad ``hf_config`` file raises InputError
naming the file and the field.
"""
from __future__ import annotations

from simulator.errors import InputError
from simulator.hardware import Hardware, load_hardware
from simulator.profile import Profile
from tracer.pytorch.capture import capture, require_torch
from tracer.pytorch.lowering import input_roles, lower
from tracer.pytorch.node_identity import FX_VERSION
from tracer.pytorch.optim import (LOSS_SCALE, OPTIMIZERS, adamw_foreach, adamw_master, sgd_foreach, sgd_master,
                          state_names)
from tracer.roofline import DTYPE_BYTES, peak_tflops
from tracer.pytorch.step import TrainStep

DEFAULT_HARDWARE = "a100-40gb-pcie4"
DTYPES = tuple(DTYPE_BYTES)
AMP_DTYPES = ("fp16", "bf16")


def trace(model: str | None = None, *, batch: int | None = None, seq: int | None = None,
          dtype: str = "fp32", optimizer: str = "adamw",
          hardware: str | Hardware = DEFAULT_HARDWARE, name: str | None = None,
          gpu_kernels: bool = True, amp: str | None = None, hf_config=None,
          runtime: bool = False, density: bool = False, density_batch: int | None = None,
          density_seq: int | None = None, density_seed: int = 0,
          density_threads: int | None = None, say=None, started=None) -> Profile:
    """Trace one training step of ``model`` into a Profile.

    Parameters
    ----------
    model : a registered name (:data:`tracer.models.MODELS`) or ``"module:callable"``
        (contract in :mod:`tracer.models`); None with ``hf_config``.
    batch, seq : samples per batch; sequence length (language models) or image side
        (vision models). None: the model's default (1 and 1024 for ``hf_config``).
    dtype : "fp32", "bf16" or "fp16": parameters, optimizer state, activations and
        floating inputs all in it (pure low-precision training); kernel times use its
        peak.
    optimizer : "adamw" (torch defaults, foreach form) or "sgd" (momentum 0.9).
    hardware : a preset name, a hardware file, or a Hardware; times the kernels.
    name : the profile name; default ``<model>-b<batch>[-s<seq>][-<dtype>][-amp-<amp>]
        [-<optimizer>][-<hardware>][-cpu-kernels]`` (dtype when not fp32, optimizer
        when not adamw, hardware when not the default preset).
    gpu_kernels : use the kernels a CUDA run picks (fused dropout, flash/efficient
        attention, CUDA's autocast lists); False keeps the CPU's choices.
    amp : "fp16" or "bf16": mixed-precision training with fp32 master weights (16 bytes
        per parameter with AdamW): parameters, gradients and batch in that dtype, the
        forward under autocast, fp32 master copies and moments, and per parameter the
        optimizer ops ``optim::<optimizer>_foreach``, ``optim::cast_master`` and
        ``optim::copy_param``. Needs ``dtype="fp32"``; kernel times use its peak.
    hf_config : a local transformers config.json of a causal LM, instead of ``model``
        (:func:`tracer.models.from_hf_config`).
    runtime : a profile for a runtime that follows plans (:mod:`runtime`,
        docs/runtime.md): every op and tensor gets its node identity in the FX graph
        (``fx``: nodes and ATen overloads, slot of a split foreach kernel, rewrites,
        random ops; a tensor's producing node and output, or its input role), the
        per-parameter optimizer temporaries (AdamW's ``sqrt(exp_avg_sq)``) count as
        workspace, and ``source`` records ``fx`` (its version) and ``--runtime`` in the
        command. Off by default: the shipped profiles have none of it.
    density : measure every tensor's ``density`` (fraction of non-zero elements) on one
        real CPU step of the traced graph (:mod:`tracer.density`): the model's own
        seeded initial weights, fresh optimizer state and a seeded synthetic batch of
        ``density_batch`` samples of sequence length (or image side) ``density_seq``
        (defaults: :func:`tracer.density.step_sizes`; for a language model 2 sequences of
        128 tokens, at most the traced ones), seeded with ``density_seed``, on
        ``density_threads`` intra-op threads (default 2 whatever the machine: the same
        counts on every machine with the same kernels); the graph at those sizes must
        lower to the same tensors and ops as at ``batch`` and ``seq``. ``source["density"]``
        records how.
    say : called with a line at each stage of the density measurement, or None.
    started : called once the arguments, the model and its sizes are checked, before
        the trace itself (a banner printed there never precedes a set-up error), or None.

    Raises
    ------
    InputError("<argument>", field, problem) with a one-line problem for an unknown
    model, a bad ``module:callable``, bad sizes, a dtype the hardware lacks, both or
    neither of ``model`` and ``hf_config``, ``amp`` with a low-precision ``dtype``, or
    a model that fails to trace, or a traced step past the profile format's limits;
    InputError naming the config file for a bad one or one asking for more than a trace
    can build (:mod:`tracer.hf_config`); with ``density``: a ``density_seed`` torch does
    not take, a bad ``density_batch`` or ``density_seq``, fp32 weights larger than the
    memory available (checked before the trace), a graph that differs at those sizes, or
    an op with no CPU kernel. ModuleNotFoundError when torch or transformers is missing.
    """
    _check_options(model, dtype, optimizer, name, amp, hf_config)
    if density:
        from tracer.density import check_seed
        check_seed(density_seed)
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    peak_tflops(hw, dtype)  # raises InputError when the GPU lacks the dtype
    if amp:
        try:
            peak_tflops(hw, amp)
        except InputError as exc:
            raise InputError("<argument>", "amp", exc.problem) from None
    torch = require_torch()
    from tracer import models
    label = model if hf_config is None else _config_label(hf_config)
    try:
        if hf_config is None:
            workload = models.build(model, batch=batch, seq=seq)
        else:
            workload = models.from_hf_config(hf_config, batch=batch, seq=seq)
        if density:   # before the trace: sizes the workload cannot take, and the model's fp32 weights
            _check_density_sizes(model, workload, density_batch, density_seq, density_threads)
            _check_density_weights(workload, label)
        if started is not None:
            started()
        cap = capture(workload, dtype=dtype, optimizer=optimizer, gpu_kernels=gpu_kernels,
                      amp=amp)
        tensors, ops = lower(cap, hw, dtype, optimizer, runtime=runtime)
        source = _source(model, workload, dtype, optimizer, hw, gpu_kernels, torch.__version__,
                         amp, label if hf_config is not None else None, runtime)
        if density:
            if say:
                say(f"traced: {len(ops)} ops, {len(tensors)} tensors")
            tensors, note = _measure_density(model, hf_config, batch, seq, workload, cap, tensors, ops, hw,
                                             dtype, optimizer, gpu_kernels, amp, density_batch, density_seq,
                                             density_seed, density_threads, say)
            source["density"] = note
        origin = f"<trace {label}>"
        try:
            return Profile(name=name or _default_name(workload, dtype, optimizer, hw, gpu_kernels, amp),
                           tensors=tuple(tensors), ops=tuple(ops), source=source, origin=origin)
        except InputError as exc:   # a size or time past the format's limits (R23)
            if exc.file != origin:
                raise
            raise InputError("<argument>", "model" if hf_config is None else "hf-config",
                             f"the traced step of {label} does not fit a profile: {exc.where}: {exc.problem} "
                             f"(trace a smaller batch, seq or model)") from None
    except InputError:
        raise
    except ModuleNotFoundError as exc:   # transformers (or a part of torch) missing: the caller names the extra
        if (exc.name or "").split(".")[0] in ("torch", "transformers"):
            raise
        raise InputError("<argument>", "model" if hf_config is None else "hf-config",
                         f"{label} failed to trace: {models._one_line(exc)}") from None
    except Exception as exc:
        raise InputError("<argument>", "model" if hf_config is None else "hf-config",
                         f"{label} failed to trace: {models._one_line(exc)}") from None


def _measure_density(model, hf_config, batch, seq, workload, cap, tensors, ops, hw, dtype, optimizer,
                     gpu_kernels, amp, density_batch, density_seq, seed, threads=None,
                     say=None) -> tuple[list, dict]:
    """The tensors with their measured densities (:func:`trace`, :mod:`tracer.density`),
    and what ``source["density"]`` says of how they were measured."""
    import dataclasses

    import torch

    from tracer import density, models

    density.check_seed(seed)
    _check_density_sizes(model, workload, density_batch, density_seq, threads)
    full_b, full_s = workload.batch, workload.seq
    kind = "causal-lm" if hf_config is not None else getattr(models.REGISTRY.get(model), "kind", None)
    small_b, seqs = density.step_sizes(kind, full_b, full_s, density_batch, density_seq)

    def build(b, s, device):
        # the model is built as for the trace, but for the sizes (a user model: None is its own)
        b_arg = batch if b == full_b else b
        s_arg = seq if s == full_s else s
        if hf_config is not None:
            return models.from_hf_config(hf_config, batch=b_arg, seq=s_arg)
        return models.build(model, batch=b_arg, seq=s_arg, device=device)

    for small_s in seqs:   # a default shorter seq whose graph differs: the next one (the traced seq)
        if (small_b, small_s) == (full_b, full_s):
            small_cap = cap
        else:
            try:
                small_workload = build(small_b, small_s, "meta")
            except InputError as exc:
                if density_seq is None and exc.where == "seq" and small_s != seqs[-1]:
                    continue   # the model does not take the default shorter seq
                if density_batch is not None or density_seq is not None or exc.where != "batch":
                    raise InputError("<argument>", "density-batch" if exc.where == "batch" else "density-seq",
                                     exc.problem) from None
                small_b, small_cap = full_b, cap   # a user model without a batch argument: its own batch
            else:
                small_cap = capture(small_workload, dtype=dtype, optimizer=optimizer, gpu_kernels=gpu_kernels,
                                    amp=amp)
        small_tensors, small_ops = lower(small_cap, hw, dtype, optimizer, runtime=True)
        problem = density.structure_problem((tensors, ops), (small_tensors, small_ops))
        if problem is None:
            break
    else:
        at = f"batch {small_b}" + (f", seq {small_s}" if small_s != full_s else "")
        traced = f"batch {full_b}" + (f", seq {full_s}" if small_s != full_s else "")
        raise InputError("<argument>", "density-batch" if small_s == full_s else "density-seq",
                         f"the graph at {at} differs from the traced one at {traced} ({problem}); "
                         "measure at sizes where it does not (--density-batch, --density-seq)")
    density.check_memory(small_tensors, small_ops, small_b, small_s)
    torch.manual_seed(seed)
    real = build(small_b, small_s, "cpu")
    threads = density.DEFAULT_THREADS if threads is None else threads
    note = {"measured": "one cpu step (forward, backward, optimizer) of the traced graph, the model's initial "
                        "weights", "batch": small_b, "seq": small_s, "seed": seed, "threads": threads,
            "digits": density.DIGITS}
    wanted = None
    if (small_b, small_s) != (full_b, full_s):
        # A tensor of the same size at both sizes is a sum over the batch (a weight's gradient, the
        # optimizer state made from it) or independent of it (weights, buffers): its zeros at a few
        # samples are not those of the full batch. Not measured (module doc of tracer.density).
        wanted = {b.id for a, b in zip(tensors, small_tensors) if a.bytes != b.bytes}
        note["unmeasured"] = "tensors whose size does not depend on the batch (and seq): weights, their " \
                             "gradients, optimizer state"
    if say:
        at = f"batch {small_b}" + (f", seq {small_s}" if small_s is not None else "")
        say(f"measuring densities: one CPU step at {at} on {threads} thread{'s' if threads > 1 else ''}")
    densities = density.measure(small_cap, small_tensors, small_ops, real, optimizer=optimizer, amp=amp,
                                dtype=dtype, seed=seed, threads=threads, wanted=wanted)
    tensors = [dataclasses.replace(t, density=densities.get(t.id)) for t in tensors]
    return tensors, note


def _check_density_sizes(model, workload, density_batch, density_seq, threads=None) -> None:
    """InputError for a ``density_batch`` or ``density_seq`` the traced workload cannot
    take (more than its batch or seq, or a seq it has none of), or a count below 1:
    known once the workload is built, so checked before the trace."""
    for value, key in ((density_batch, "density-batch"), (density_seq, "density-seq"), (threads, "density-threads")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InputError("<argument>", key, f"must be a whole number >= 1, got {value!r}")
    full_b, full_s = workload.batch, workload.seq
    if density_batch is not None and full_b is not None and density_batch > full_b:
        raise InputError("<argument>", "density-batch",
                         f"{density_batch} is more than the traced batch ({full_b}): give at most {full_b}")
    if density_seq is not None and full_s is None:
        raise InputError("<argument>", "density-seq",
                         f"{model} is traced without a seq: give --seq too, or no --density-seq")
    if density_seq is not None and density_seq > full_s:
        raise InputError("<argument>", "density-seq",
                         f"{density_seq} is more than the traced seq ({full_s}): give at most {full_s}")


def _check_density_weights(workload, label) -> None:
    """InputError when this machine cannot hold the model's fp32 weights (the least the
    real step of ``--density`` needs), before anything is traced."""
    from tracer import density, models
    available = density._available_memory()
    need = 4 * models.parameter_count(workload.module)
    if available is not None and need > available:
        raise InputError("<argument>", "density", f"the real step of {label} holds at least its fp32 weights, "
                                                  f"{need / 2**30:.1f} GiB, and {available / 2**30:.1f} GiB are "
                                                  "available here: give --density-file instead")


def _check_options(model, dtype, optimizer, name, amp, hf_config) -> None:
    """InputError for an option that is invalid on its own or with another."""
    if dtype not in DTYPE_BYTES:
        raise InputError("<argument>", "dtype",
                         f"unknown dtype {dtype!r} (use {', '.join(DTYPES)})")
    if optimizer not in OPTIMIZERS:
        raise InputError("<argument>", "optimizer",
                         f"unknown optimizer {optimizer!r} (use {', '.join(OPTIMIZERS)})")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise InputError("<argument>", "name", f"expected a non-empty name, got {name!r}")
    if amp is not None and amp not in AMP_DTYPES:
        raise InputError("<argument>", "amp", f"unknown amp dtype {amp!r} "
                                              f"(use {', '.join(AMP_DTYPES)})")
    if amp is not None and dtype != "fp32":
        raise InputError("<argument>", "amp",
                         f"--amp {amp} keeps fp32 master weights and is not combined with "
                         f"--dtype {dtype} (pure {dtype} training); give one of them")
    if model is not None and hf_config is not None:
        raise InputError("<argument>", "hf-config",
                         f"give a model or --hf-config, not both (got {model!r} and {str(hf_config)!r})")
    if model is None and hf_config is None:
        raise InputError("<argument>", "model", "give a model name, module:callable or --hf-config")


def _config_label(path) -> str:
    """How a config file is named in the profile: ``tracer/configs/<file>`` for a
    shipped one (the same on every machine), else the path as given."""
    from pathlib import Path

    from tracer.models import CONFIG_DIR, config_path
    given = config_path(path)
    try:
        if given.resolve().parent == CONFIG_DIR:
            return f"tracer/configs/{given.name}"
    except OSError:
        pass
    return str(path)


def _default_name(workload, dtype, optimizer, hw, gpu_kernels, amp=None) -> str:
    parts = [workload.name, f"b{workload.batch}"]
    if workload.seq is not None:
        parts.append(f"s{workload.seq}")
    if dtype != "fp32":
        parts.append(dtype)
    if amp:
        parts.append(f"amp-{amp}")
    if optimizer != "adamw":
        parts.append(optimizer)
    if hw.name != DEFAULT_HARDWARE:
        parts.append(hw.name)
    if not gpu_kernels:
        parts.append("cpu-kernels")
    return "-".join(parts)


def _source(model, workload, dtype, optimizer, hw, gpu_kernels, torch_version, amp=None,
            config=None, runtime=False) -> dict:
    """The profile's ``source``: the command that remakes it and the options (``amp`` and
    ``hf_config`` only when used, so that other profiles keep their bytes)."""
    what = model if config is None else f"--hf-config {config}"
    command = f"swapplan trace {what} --batch {workload.batch}"
    if workload.seq is not None:
        command += f" --seq {workload.seq}"
    command += f" --amp {amp}" if amp else f" --dtype {dtype}"
    command += f" --optimizer {optimizer} --hardware {hw.name}"
    if not gpu_kernels and runtime:
        command += " --cpu-kernels"
    if runtime:
        command += " --runtime"
    source = {"kind": "traced",
              "from": f"{command} (torch {torch_version}, make_fx on fake tensors, "
                      f"{'GPU' if gpu_kernels else 'CPU'} kernel choices)",
              "timing": f"roofline:{hw.name}", "batch": workload.batch, "seq": workload.seq,
              "dtype": dtype, "optimizer": optimizer,
              "model": model if config is None else workload.extra["model_type"],
              "kernels": "gpu" if gpu_kernels else "cpu"}
    if amp:
        source["amp"] = amp
        source["master_weights"] = "fp32"
    if config is not None:
        source["hf_config"] = config
    if runtime:
        source["fx"] = FX_VERSION
    return source


__all__ = ["trace", "capture", "lower", "input_roles", "FX_VERSION", "TrainStep", "adamw_foreach", "sgd_foreach",
           "adamw_master", "sgd_master", "state_names", "OPTIMIZERS", "DTYPES", "AMP_DTYPES", "LOSS_SCALE",
           "DEFAULT_HARDWARE"]
