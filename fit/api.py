"""``swapplan fit`` as a library: the request from what the user gave (checked before
any work), the run, and the summary results.json and ``--json`` hold.
"""
from __future__ import annotations

import math

from simulator.errors import InputError

from .run import FitRequest, FitState, run_fit
from .store import fit_folder
from .summary import accumulation, family_row, unit_of
from .traces import AXES, TraceSpec

DEFAULT_RESERVE = "1GiB"       # the CUDA context and the libraries' workspaces (docs/fit.md)
SEQ_STEP = 128
BATCH_LIMIT = 1 << 16          # the largest batch the search tries
SEQ_LIMIT = 1 << 20            # the longest context it tries (tokens), where the model sets none


def families_of(planners: list[str]) -> dict[str, tuple[str, ...]]:
    """The planners grouped by family, families in the order ``swapplan planners`` lists
    them, planners in the order given."""
    from planner.core.registry import FAMILIES, get_planner

    grouped: dict[str, list[str]] = {}
    for name in planners:
        grouped.setdefault(get_planner(name).family, []).append(name)
    return {family: tuple(grouped[family]) for family in FAMILIES if family in grouped}


def fit_memory(hardware, memory: str | None, reserve: str | None) -> int:
    """The GPU memory plans may use: ``memory`` as given, else the GPU's memory less
    ``reserve`` (default ``DEFAULT_RESERVE``). InputError when it is not positive or more
    than the GPU has."""
    from simulator.units import format_bytes, parse_size

    gpu = hardware.gpu.memory_bytes
    if memory is not None:
        if reserve is not None:
            raise InputError("<argument>", "--reserve", "goes without --memory (which is the memory plans may use)")
        value = parse_size(memory, "--memory")
        if value > gpu:
            raise InputError("<argument>", "--memory", f"{memory} is more than the GPU's {format_bytes(gpu)} on "
                                                       f"{hardware.name}")
    else:
        held = parse_size(reserve or DEFAULT_RESERVE, "--reserve")
        value = gpu - held
    if value <= 0:
        raise InputError("<argument>", "--memory" if memory is not None else "--reserve",
                         f"leaves no memory for the plans (the GPU has {format_bytes(gpu)})")
    return value


def axis_bounds(spec: TraceSpec, start_size: int | None, limit_size: int | None) -> tuple[int, int]:
    """(first step, last step) of the search, in steps of ``spec.step``: from the size
    given (rounded up to a step) or one step, to ``limit_size`` or the model's own limit
    (a registered model's longest context) or ``BATCH_LIMIT`` / ``SEQ_LIMIT``."""
    if spec.axis == "batch":
        cap = BATCH_LIMIT
    else:
        cap = SEQ_LIMIT
        if spec.hf_config is None and spec.model and ":" not in spec.model:
            from tracer.models import REGISTRY
            entry = REGISTRY.get(spec.model)
            if entry is not None and entry.max_seq is not None:
                cap = entry.max_seq
    limit = limit_size if limit_size is not None else cap
    last = limit // spec.step
    if last < 1:
        raise InputError("<argument>", "--max", f"{limit} is less than one step of {spec.step}")
    first = 1 if start_size is None else min(last, max(1, math.ceil(start_size / spec.step)))
    return first, last


STRATEGIES = ("ddp", "zero1", "zero2", "zero3")   # data parallelism (docs/sharding.md)


def data_parallel(hardware, world: int, strategy: str | None) -> tuple[str, ...]:
    """The strategies a fit over ``world`` GPUs tries (``all``: every one; none for one
    GPU). InputError for a world without a strategy, a strategy without a world, or a
    machine without enough GPUs (R57)."""
    if world == 1:
        if strategy is not None:
            raise InputError("<argument>", "--strategy", "goes with --world N (N > 1)")
        return ()
    if strategy is None:
        raise InputError("<argument>", "--strategy", f"--world {world} needs a strategy: {', '.join(STRATEGIES)}, "
                                                     "or all to search them")
    link = hardware.interconnect
    if link is None or link.world < world:
        have = "no interconnect section" if link is None else f"{link.world} GPUs"
        raise InputError("<argument>", "--world", f"{world} ranks, but {hardware.name} has {have} (multi-GPU "
                                                  "presets: a100-80gb-sxm-x8, h100-80gb-sxm-x8, "
                                                  "h100-80gb-sxm-x8-2node, rtx4090-24gb-pcie4-x4)")
    return STRATEGIES if strategy == "all" else (strategy,)


def make_spec(model, hf_config, hardware: str, axis: str, step: int | None, batch, seq, dtype, amp, optimizer,
              cpu_kernels: bool, strategy: str | None = None, world: int = 1) -> TraceSpec:
    """The trace spec of a fit: ``step`` defaults to one sample on the batch axis and
    ``SEQ_STEP`` tokens on the seq axis, where the batch defaults to 1; with a
    ``strategy``, each size is one rank of ``world`` (the size is a rank's)."""
    if axis not in AXES:
        raise InputError("<argument>", "--axis", f"expected batch or seq, got {axis!r}")
    if (model is None) == (hf_config is None):
        raise InputError("<argument>", "model", "give MODEL or --hf-config (one of them)")
    step = step if step is not None else (1 if axis == "batch" else SEQ_STEP)
    if step < 1:
        raise InputError("<argument>", "--step", f"must be >= 1, got {step}")
    if axis == "batch":
        return TraceSpec(model, hf_config, hardware, axis, step, None, seq, dtype, amp, optimizer, cpu_kernels,
                         strategy, world)
    return TraceSpec(model, hf_config, hardware, axis, step, batch or 1, None, dtype, amp, optimizer, cpu_kernels,
                     strategy, world)


def summarize(request: FitRequest, state: FitState, hardware_name: str) -> dict:
    """results.json's summary (``docs/fit.md``): the request, per family its row, and the
    fastest way to the global batch when one was asked for."""
    spec = request.spec
    batch = spec.batch or 1
    families = [family_row(family, planners, state.searches[family], spec, state.rows, state.traces, batch)
                for family, planners in request.families.items()]
    summary = {"model": spec.label, "hardware": hardware_name, "axis": spec.axis, "step": spec.step,
               "unit": unit_of(spec), "memory_bytes": request.memory_bytes,
               "fixed": {"seq": spec.seq} if spec.axis == "batch" else {"batch": spec.batch},
               "dtype": spec.dtype, "amp": spec.amp, "optimizer": spec.optimizer, "seed": request.seed,
               "time_limit": request.time_limit, "allocator": request.allocator or "bytes", "families": families}
    if spec.strategy is not None:          # sizes are a rank's; throughputs every rank's together
        summary.update(strategy=spec.strategy, world=spec.world)
    if request.global_batch is not None:
        ways = [accumulation(family, planners, request.global_batch, spec, state.searches[family].largest,
                             state.rows, state.traces) for family, planners in request.families.items()]
        ways = [w for w in ways if w is not None]
        summary["global_batch"] = {"samples": request.global_batch,
                                   "fastest": min(ways, key=lambda w: w["step_us"]) if ways else None,
                                   "by_family": ways}
    return summary


def fit(request: FitRequest, out: str, jobs: int = 1, dask_address: str | None = None, say=None):
    """Run the search into ``out`` and write results.json: (summary, state)."""
    from simulator.hardware import load_hardware

    state = run_fit(request, out, jobs, dask_address, say)
    summary = summarize(request, state, load_hardware(request.spec.hardware).name)
    fit_folder(out).save([], header=summary)
    return summary, state


def best_strategy(summaries: dict[str, dict]) -> list[dict]:
    """Per family, the strategy that trains the largest size (ties: the faster), from
    each strategy's summary: what ``--strategy all`` answers."""
    best: dict[str, dict] = {}
    for strategy, summary in summaries.items():
        for row in summary["families"]:
            if not row["max"] or row["throughput"] is None:
                continue
            have = best.get(row["family"])
            if have is None or (row["max"], row["throughput"]) > (have["max"], have["throughput"]):
                best[row["family"]] = {"family": row["family"], "strategy": strategy, "max": row["max"],
                                       "planner": row["planner"], "iteration_us": row["iteration_us"],
                                       "throughput": row["throughput"]}
    return list(best.values())
