"""``train``: trace a model for the runtime, plan it (or take a plan), and run N steps
with the plan and without it on the same seeded values; report whether they agree bit
for bit and what the planned run held on the "GPU"."""
from __future__ import annotations

import contextlib
import re
import sys
import time

from simulator.errors import InputError
from simulator.hardware import Hardware, load_hardware
from simulator.plan import Plan, check_plan, load_plan
from simulator.units import parse_budget, planning_budget

from .bindings import Values, bind, initial_values
from .interpreter import PlanRefused, PlannedInterpreter, reference_step


def check_plan_choice(plan, planner: str | None, budget) -> None:
    """A run follows a planner's plan within a budget, or a given plan: InputError otherwise."""
    if (plan is None) == (planner is None):
        raise InputError("<argument>", "plan", "give a planner (with a budget) or a plan, not both")
    if planner is not None and budget is None:
        raise InputError("<argument>", "budget", f"planner {planner!r} needs a budget (8GiB, 60%)")


def traced(model: str, hw: Hardware, *, batch, seq, dtype: str, optimizer: str, gpu_kernels: bool):
    """The model's profile on ``hw``, traced as the runtime runs it, and its bindings."""
    from tracer.pytorch.trace import trace
    profile = trace(model, batch=batch, seq=seq, dtype=dtype, optimizer=optimizer, hardware=hw,
                    gpu_kernels=gpu_kernels, runtime=True)
    return profile, bind(model, profile)


def train(model: str, *, planner: str | None = None, budget: str | int | None = None,
          plan: str | Plan | None = None, steps: int = 1, batch: int | None = None, seq: int | None = None,
          hardware: str | Hardware | None = None, dtype: str = "fp32", optimizer: str = "adamw",
          gpu_kernels: bool = True, seed: int = 0, params: dict | None = None, threads: int = 1,
          notes: list | None = None) -> dict:
    """Trace ``model`` with node identity, plan it with ``planner`` within ``budget`` (a
    size, bytes, or a percentage of the traced no-swap peak) or load ``plan`` (a path or
    a Plan made for that profile), then run ``steps`` steps three ways on the same seeded
    values: the graph called whole (the reference), the interpreter with no plan, and the
    interpreter with the plan. Returns the report (docs/runtime.md).

    The three runs use ``threads`` intra-op threads (default 1): a CPU kernel's result
    depends on how many threads split its work, so bit-equality needs the same count in
    every run, and one thread also keeps a loaded machine from stalling the kernels.

    Raises InputError for bad arguments, a plan for another profile, or a model the
    runtime cannot run; PlanRefused for a plan the simulator finds invalid or infeasible;
    RuntimeFailure if the planned run breaks.
    """
    import torch

    from tracer.pytorch.trace import DEFAULT_HARDWARE

    check_plan_choice(plan, planner, budget)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError("<argument>", "steps", f"must be a whole number >= 1, got {steps!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InputError("<argument>", "threads", f"must be a whole number >= 1, got {threads!r}")
    notes = notes if notes is not None else []
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware or DEFAULT_HARDWARE)
    started = time.perf_counter()
    profile, bindings = traced(model, hw, batch=batch, seq=seq, dtype=dtype, optimizer=optimizer,
                               gpu_kernels=gpu_kernels)
    trace_s = time.perf_counter() - started

    started = time.perf_counter()
    the_plan, budget_bytes = plan_or_load(profile, hw, budget, planner, params, seed, plan, notes, "the no-swap peak",
                                          f"{model} traced for the runtime", f"plan the profile that `swapplan trace "
                                          f"{model} --runtime` writes with the same options")
    plan_s = time.perf_counter() - started

    planned_run = PlannedInterpreter(bindings, the_plan, hw, budget_bytes)   # refuses a bad plan now
    try:
        values = initial_values(bindings, seed)
        with _threads(threads):
            return _run_all(model, profile, bindings, the_plan, planned_run, values, hw, steps, seed, plan, planner,
                            gpu_kernels, notes, trace_s, plan_s, threads)
    except (MemoryError, RuntimeError) as exc:
        if not out_of_memory(exc):
            raise
        detail = re.sub(r"^\[enforce fail[^\]]*\]\s*(err == 0\.\s*)?", "", str(exc).strip())   # c10's prefix
        detail = detail.splitlines()[0] if detail else type(exc).__name__
    # out of the handler, the traceback and the tensors its frames held are gone; these too
    values = planned_run = None  # noqa: F841
    raise InputError("<argument>", "--batch", out_of_memory_problem(model, profile.source.get("batch"),
                                                                    profile.source.get("seq"), detail))


def plan_or_load(profile, hw: Hardware, budget, planner, params, seed: int, plan, notes: list, peak: str,
                 whose: str, remedy: str):
    """(the plan to run on ``profile``, its budget in bytes): made by ``planner`` within
    ``budget`` (a size, or a percentage of ``peak``: the profile's no-swap peak, in words),
    or ``plan`` (a path or a Plan) loaded and checked against ``profile``, ``whose`` and
    ``remedy`` wording the error for a plan made for another profile."""
    from planner.core.api import make_plan

    if plan is None:
        budget_bytes, asked = planning_budget(budget, profile.peak_bytes, hw.gpu.memory_bytes)
        if asked is not None:
            notes.append(f"budget: {budget} of {peak} is more than the GPU's memory on {hw.name}: "
                         "planning for the GPU's")
        return make_plan(profile, hw, budget_bytes, planner, params or {}, seed).plan, budget_bytes
    the_plan = plan if isinstance(plan, Plan) else load_plan(plan)
    if the_plan.profile_sha256 and the_plan.profile_sha256 != profile.sha256:
        raise InputError(the_plan.origin, "profile.sha256",
                         f"the plan was made for another profile than {whose} ({profile.name}, sha256 "
                         f"{profile.sha256[:12]}...): {remedy}")
    check_plan(the_plan, profile, hw.ssd is not None, hw.cpu is not None)
    return the_plan, parse_budget(budget, profile.peak_bytes) if budget is not None else None


def out_of_memory_problem(model: str, batch, seq, detail: str) -> str:
    """What to say when the real steps ran out of memory: what to make smaller, only
    where something smaller exists (no smaller --batch than 1)."""
    batch_seq = f"batch {batch}" + (f", seq {seq}" if seq else "")
    said = f"{model} at {batch_seq} ran out of memory in its real CPU steps ({detail})"
    smaller_batch = not isinstance(batch, int) or batch > 1
    smaller_seq = isinstance(seq, int) and seq > 1
    if smaller_batch:
        return said + ": try a smaller --batch (or --seq)"
    if smaller_seq:
        return said + ": try a smaller --seq"
    return said + ": even its smallest step does not fit; run it on a machine with more memory"


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says memory ran out: a MemoryError, torch's OutOfMemoryError, or
    the RuntimeError its CPU allocator raises (``DefaultCPUAllocator: can't allocate
    memory``, ``not enough memory``)."""
    if isinstance(exc, MemoryError):
        return True
    oom = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(words in text for words in _OUT_OF_MEMORY)


_OUT_OF_MEMORY = ("not enough memory", "out of memory", "can't allocate memory", "cannot allocate memory")


def _run_all(model, profile, bindings, the_plan, planned_run, values, hw, steps, seed, plan, planner,
             gpu_kernels, notes, trace_s, plan_s, threads) -> dict:
    import torch

    reference = values.clone()
    torch.manual_seed(seed)
    ref_losses, ref_seconds = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        ref_losses.append(reference_step(bindings, reference))
        ref_seconds.append(time.perf_counter() - t0)

    unplanned_peak, unplanned_s, unplanned_equal = None, None, None
    try:
        plain = PlannedInterpreter(bindings, None, hw)
    except PlanRefused:
        notes.append("the no-swap peak does not fit the GPU: the interpreter was not run without a plan")
    else:
        mine = values.clone()
        torch.manual_seed(seed)
        reports = plain.run(mine, steps)
        unplanned_peak = max(r.peak_bytes for r in reports)
        unplanned_s = _per_step([r.seconds for r in reports])
        unplanned_equal = not _differences(bindings, reference, mine, ref_losses, [r.loss for r in reports])
        del mine, plain

    planned = values
    del values   # the last run works on the initial values themselves

    torch.manual_seed(seed)
    reports = planned_run.run(planned, steps)
    differences = _differences(bindings, reference, planned, ref_losses, [r.loss for r in reports])
    kinds: dict[str, int] = {}
    for action in the_plan.actions:
        kinds[action.kind] = kinds.get(action.kind, 0) + 1
    result = planned_run.result
    peak = max(r.peak_bytes for r in reports)
    at = next(r.peak_at for r in reports if r.peak_bytes == peak)
    return {
        "model": model, "profile": profile.name, "profile_sha256": profile.sha256, "hardware": hw.name,
        "planner": the_plan.planner.name if the_plan.planner else planner,
        "plan": plan if isinstance(plan, str) else None, "steps": steps, "batch": profile.source.get("batch"),
        "seq": profile.source.get("seq"), "kernels": "gpu" if gpu_kernels else "cpu", "seed": seed,
        "threads": threads,
        "bit_equal": not differences, "differences": differences[:10],
        "unplanned_bit_equal": unplanned_equal,
        "loss": [float(x) if x is not None else None for x in (r.loss for r in reports)],
        "budget_bytes": result.budget_bytes, "peak_bytes": peak, "peak_at": at,
        "simulated_peak_bytes": result.peak_bytes, "profile_peak_bytes": profile.peak_bytes,
        "unplanned_peak_bytes": unplanned_peak,
        "host_peak_bytes": max(r.host_peak_bytes for r in reports),
        "ssd_peak_bytes": max(r.ssd_peak_bytes for r in reports),
        "temporaries_bytes": max(r.temporaries_bytes for r in reports),
        "recompute_extra_bytes": max(r.recompute_extra_bytes for r in reports),
        "size_mismatches": sorted({t for r in reports for t in r.size_mismatches}),
        "actions_total": len(the_plan.actions) * steps,
        "actions_applied": sum(r.actions_applied for r in reports), "actions": kinds,
        "seconds_per_step": {"planned": _per_step([r.seconds for r in reports]), "unplanned": unplanned_s,
                             "reference": _per_step(ref_seconds)},
        "predicted_overhead": result.overhead, "trace_seconds": trace_s, "plan_seconds": plan_s,
        "notes": notes,
    }


@contextlib.contextmanager
def _threads(n: int):
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _per_step(seconds: list[float]) -> float:
    return sum(seconds) / len(seconds)


def same_bits(a, b) -> bool:
    """Two tensors hold the same bytes (NaN equal to the same NaN, -0.0 not equal to 0.0)."""
    import torch
    if a is None or b is None:
        return a is b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _differences(bindings, want: Values, got: Values, want_losses: list, got_losses: list) -> list[str]:
    """What differs, bit for bit: the loss of each step, then every parameter, buffer,
    optimizer state and batch tensor (by name)."""
    out = [f"loss of step {i + 1}" for i, (a, b) in enumerate(zip(want_losses, got_losses)) if not same_bits(a, b)]
    mine = got.named(bindings)
    for name, tensor in want.named(bindings).items():
        if not same_bits(tensor, mine[name]):
            out.append(name)
    return out
