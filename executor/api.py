"""``replay``: run one iteration of a plan for real and set it beside the simulation.

The plan is read as a runtime reads it (executor/program.py), run by the one scheduler
(executor/scheduler.py) on a backend (executor/host.py, executor/cuda.py), and the
figures it measured are reported beside the simulator's prediction for the same
profile, plan, machine and budget, each with its relative error.
"""
from __future__ import annotations

import math
from dataclasses import replace

from simulator.api import simulate
from simulator.compile.compiled import compile_machine
from simulator.errors import InputError
from simulator.hardware import Hardware
from simulator.model.budget import resolve_budget
from simulator.model.links import LINKS
from simulator.model.splits import split_profile
from simulator.plan import Plan, check_plan
from simulator.profile import Profile, profile_sha256

from .arena import PlacedArena, align
from .pattern import Patterns
from .program import lower
from .scheduler import Scheduler
from .work import ReplayFailure, scaled_bytes

BACKENDS = ("host", "cuda")
TARGET_WALL_S = 3.0            # the host backend's auto time scale aims at this much real time
REGION_CAP_BYTES = 64 * 2**20  # ... and its auto size scale keeps the GPU region under this
CHECK_RATE = 0.5e9             # bytes/s of the checks' budget per unit of time scale (see auto_scales)
MAX_WALL_S = 3600.0            # a --time-scale that stretches the iteration past an hour is refused
MIN_WALL_S = 0.01              # ... and one that squeezes it under 10 ms (threads cannot keep such times)
LONG_WALL_S = 60.0             # a replay longer than this says how long before it starts


def auto_scales(backend: str, hardware: Hardware, budget: int, base_us: float,
                time_scale: float | None, size_scale: float | None) -> tuple[float, float]:
    """The scales a replay runs at, when not given.

    cuda: 1 and 1 (the real machine, real sizes). host: the time scale stretches the
    predicted iteration to about 3 s of real time (so sleep and wake-up jitter, tens of
    microseconds, stay far below 1%); the size scale is the largest that keeps the GPU
    region under 64 MiB and the checks cheap: a memory-bound kernel touches its bytes at
    the GPU's HBM rate, and its scaled bytes must be checked and written on one CPU core
    in its scaled time, so size_scale <= time_scale * 0.5 GB/s / HBM rate keeps the
    checks at about 1/16 of the kernel's time on a core that checks 8 GB/s.
    """
    if backend == "cuda":
        return time_scale or 1.0, size_scale or 1.0
    if time_scale is None:
        time_scale = _round(TARGET_WALL_S * 1e6 / base_us) if base_us > 0 else 1.0
    if size_scale is None:
        size_scale = min(1.0, time_scale * CHECK_RATE / (hardware.gpu.hbm_gbps * 1e9))
        if budget > 0:
            size_scale = min(size_scale, REGION_CAP_BYTES / budget)
        size_scale = _round(size_scale)
    return time_scale, size_scale


def _round(x: float) -> float:
    """Three significant digits, rounded down (never above the cap it came from)."""
    digits = 2 - math.floor(math.log10(x))
    return math.floor(x * 10**digits) / 10**digits


def replay(profile: Profile, plan: Plan, hardware: Hardware, budget_bytes: int | None = None,
           backend: str = "host", time_scale: float | None = None, size_scale: float | None = None,
           timeout_s: float | None = None, tmpdir: str | None = None, say=None) -> dict:
    """Replay ``plan`` on ``backend`` and return the report (see docs/executor.md).

    InputError for bad input (a plan for another profile, unknown ids, a budget above
    the GPU's memory, scales that are not positive, no CUDA for ``cuda``), and before
    any work for scales that cannot give a meaningful replay: a ``time_scale`` that
    stretches the iteration past an hour or squeezes it under 10 ms, a ``size_scale``
    whose buffers this process cannot hold (estimated from the profile and plan,
    naming the limit that is short). A replay expected to last more than a minute says
    so through ``say`` (a callable taking a line) before it starts. A plan that fails at
    replay is a report with ``ok`` False and ``failure`` saying where.
    """
    if backend not in BACKENDS:
        raise InputError("<argument>", "--backend", f"must be one of {', '.join(BACKENDS)}, not {backend!r}")
    for name, value in (("--time-scale", time_scale), ("--size-scale", size_scale)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InputError("<argument>", name, f"must be a number above 0, got {value}")
    if size_scale is not None and size_scale > 1:
        raise InputError("<argument>", "--size-scale", f"must be at most 1, got {size_scale}")
    if backend == "cuda":
        from .cuda import require_cuda
        require_cuda()                  # before any work: no CuPy or no GPU is one line at once
    refuse_uvm(plan)
    machine = compile_machine(hardware)
    if plan.splits:   # R54: replay the profile the plan runs, its split ops as their chunks
        check_plan(plan, profile, machine.has_ssd, machine.cpu is not None)
        profile = split_profile(profile, plan.splits, plan.origin)
        plan = replace(plan, splits={}, profile_sha256=profile_sha256(profile))
    check_plan(plan, profile, machine.has_ssd, machine.cpu is not None)
    if plan.uses_cpu:
        raise InputError(plan.origin, "cpu_ops", "the executor does not replay ops on the CPU or SSD <-> host "
                                                 "copies (load, store) yet: `swapplan simulate` scores this plan")
    if plan.uses_codecs:
        raise InputError(plan.origin, "actions", "the executor does not replay codecs (compressed transfers, "
                                                 "encode, decode) yet: `swapplan simulate` scores this plan")
    if plan.variants or plan.uses_groups:
        what = "op variants (R52)" if plan.variants else "grouped transfers (R53)"
        raise InputError(plan.origin, "variants" if plan.variants else "actions",
                         f"the executor does not replay {what} yet: `swapplan simulate` scores this plan")
    budget = resolve_budget(budget_bytes, plan, hardware)
    if size_scale is not None:   # before the simulation: buffers this process cannot hold
        check_replay_memory(profile, plan, budget, size_scale)
    predicted = simulate(profile, plan, hardware, budget)
    base_us = predicted.iteration_us if predicted.ok else profile.ideal_us
    given = time_scale is not None
    time_scale, size_scale = auto_scales(backend, hardware, budget, base_us, time_scale, size_scale)
    check_replay_memory(profile, plan, budget, size_scale)
    check_duration(base_us, time_scale, given, say)
    runtime = lower(profile, plan, hardware)
    largest = max((t.bytes for t in profile.tensors), default=0)
    patterns = Patterns(align(math.ceil(largest * size_scale)) // 8 + 1)
    placed = None
    if plan.placement is not None:     # R50: the region is the placement's arena, scaled (PlacedArena.map)
        placed = PlacedArena(plan.placement, size_scale,
                             [key for key, _, nbytes, _ in runtime.allocations() if nbytes == 0])
        region = placed.size
    else:
        region = align(math.ceil(budget * size_scale)) + 8 * (len(profile.tensors) + 2)
    try:
        engine = _backend(backend, runtime, profile, plan, time_scale, size_scale, patterns, region, tmpdir)
    except MemoryError:
        what = "the placement's arena" if placed is not None else "the budget"
        raise InputError("<argument>", "--size-scale", f"a GPU region of {region} bytes ({what} x {size_scale:g}) "
                         "does not fit in this machine's memory: give a smaller --size-scale") from None
    scheduler = Scheduler(runtime, engine, budget, time_scale, size_scale, region, patterns, hardware.gpu.hbm_gbps,
                          placed)
    if timeout_s is None:
        timeout_s = 60.0 + 4 * base_us * 1e-6 * time_scale
    failure = None
    try:
        scheduler.place_start()
        scheduler.run(timeout_s)
    except ReplayFailure as exc:
        failure = exc
    finally:
        engine.close()
    return _report(profile, plan, hardware, backend, budget, time_scale, size_scale, scheduler, predicted, failure)


def check_duration(base_us: float, time_scale: float, given: bool = True, say=None) -> None:
    """InputError when ``time_scale`` stretches the ``base_us`` iteration past
    MAX_WALL_S of real time, or (a scale given, not auto) squeezes it under MIN_WALL_S,
    where the backend's threads cannot keep the times and the errors it reports mean
    nothing; a line to ``say`` when it lasts more than LONG_WALL_S."""
    wall = base_us * 1e-6 * time_scale
    if wall > MAX_WALL_S:
        raise InputError("<argument>", "--time-scale", f"{time_scale:g} stretches the {base_us:g} us iteration to "
                         f"{wall:.3g} s of real time, more than a replay may take "
                         f"({MAX_WALL_S:g} s): give a smaller --time-scale (auto aims at {TARGET_WALL_S:g} s)")
    if given and wall < MIN_WALL_S and base_us > 0:
        least = MIN_WALL_S / (base_us * 1e-6)
        raise InputError("<argument>", "--time-scale", f"{time_scale:g} squeezes the {base_us:g} us iteration into "
                         f"{wall:.3g} s of real time, less than the {MIN_WALL_S * 1e3:g} ms a replay can time: give "
                         f"at least {_round_up(least):g} (auto aims at {TARGET_WALL_S:g} s)")
    if wall > LONG_WALL_S and say is not None:
        say(f"this replay takes about {_duration(wall)} of real time (--time-scale {time_scale:g} x the "
            f"{base_us * 1e-6:.3g} s iteration); Ctrl-C stops it, a smaller --time-scale shortens it")


def check_replay_memory(profile: Profile, plan: Plan, budget: int, size_scale: float) -> None:
    """InputError, before anything is allocated, when the replay's buffers at
    ``size_scale`` are more than this process may hold (simulator.host_memory): the
    emulated GPU region (the budget, or the placement's arena, scaled), the pattern of
    the largest tensor and a host copy of every tensor the plan puts on the host."""
    from simulator.host_memory import check_memory
    arena = plan.placement.arena_bytes if plan.placement is not None else budget
    largest = max((t.bytes for t in profile.tensors), default=0)
    on_host = {a.tensor for a in plan.actions if a.kind == "offload"} | set(plan.initial)
    host = sum(scaled_bytes(profile.tensor_by_id[tid].bytes, size_scale) for tid in on_host
               if tid in profile.tensor_by_id)
    need = align(math.ceil(arena * size_scale)) + align(math.ceil(largest * size_scale)) + host
    check_memory(need, f"the replay at --size-scale {size_scale:g} (a GPU region of {arena * size_scale:.4g} bytes, "
                       "host copies and patterns)", "<argument>", "--size-scale",
                 "give a smaller --size-scale (auto keeps the region under 64 MiB)")


def _round_up(x: float) -> float:
    """``x`` rounded up to three significant digits."""
    digits = 2 - math.floor(math.log10(x))
    return math.ceil(x * 10**digits) / 10**digits


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def refuse_uvm(plan: Plan) -> None:
    """InputError for a plan in UVM mode (``"memory": "uvm"``, R30-R37): the executor
    swaps explicitly (its own copies, in a region it allocates), while a UVM plan's
    migrations are the driver's (page faults, eviction by arrival, write-back), which it
    does not emulate: replaying one as an explicit plan would report a false overrun."""
    if plan.uvm:
        raise InputError(plan.origin, "memory", "a UVM plan (\"memory\": \"uvm\") is not replayed: its migrations "
                                                "are the driver's page faults and evictions (R30-R37), which the "
                                                "executor does not emulate; `swapplan simulate` scores it, or replay "
                                                "a plan of an explicit planner (`swapplan planners`)")


def _backend(backend, runtime, profile, plan, time_scale, size_scale, patterns, region, tmpdir):
    if backend == "cuda":
        from .cuda import CudaBackend
        host_tensors = {a.tensor: scaled_bytes(profile.tensor_by_id[a.tensor].bytes, size_scale)
                        for a in plan.actions if "host" in (a.to, a.source)}
        host_tensors.update((tid, scaled_bytes(profile.tensor_by_id[tid].bytes, size_scale))
                            for tid, tier in plan.initial.items() if tier == "host")
        checks = sum(len(r) + len(u) for r, u in zip(runtime.reads, runtime.updates)) \
            + len(runtime.copies) + len(profile.tensors) + 16
        return CudaBackend(runtime.link_capacity, time_scale, patterns, region, tmpdir, host_tensors, checks,
                           len(runtime.seq))
    from .host import HostBackend
    return HostBackend(runtime.link_capacity, time_scale, patterns, region, tmpdir)


def _error(measured: float, predicted: float | None) -> float | None:
    if predicted is None:
        return None
    if predicted == 0:
        return 0.0 if measured == 0 else None
    return measured / predicted - 1.0


def _report(profile, plan, hardware, backend, budget, time_scale, size_scale, scheduler, predicted,
            failure: ReplayFailure | None) -> dict:
    measured = scheduler.summary()
    ok = failure is None
    sim = predicted if predicted.ok else None

    def pred(name):
        return getattr(sim, name) if sim is not None else None

    predicted_links = dict(predicted.link_bytes) if sim is not None else None
    report = {
        "profile": profile.name,
        "hardware": hardware.name,
        "planner": plan.planner.name,
        "backend": backend,
        "budget_bytes": budget,
        "time_scale": time_scale,
        "size_scale": size_scale,
        "ok": ok,
        "integrity": "ok" if ok else failure.message,
        "failure": None if ok else failure.to_dict(),
        "iteration_us": measured["iteration_us"],
        "predicted_us": pred("iteration_us"),
        "relative_error": _error(measured["iteration_us"], pred("iteration_us")) if ok else None,
        "compute_us": measured["compute_us"],
        "predicted_compute_us": pred("compute_us"),
        "stall_us": measured["stall_us"],
        "predicted_stall_us": pred("stall_us"),
        "tail_us": measured["tail_us"],
        "predicted_tail_us": pred("tail_us"),
        "peak_bytes": measured["peak_bytes"],
        "predicted_peak_bytes": pred("peak_bytes"),
        "peak_relative_error": _error(measured["peak_bytes"], pred("peak_bytes")) if ok else None,
        "peak_arena_bytes": measured["peak_arena_bytes"],
        "peak_extent_bytes": measured["peak_extent_bytes"],
        "arena_bytes": measured["arena_bytes"],
        "predicted_arena_bytes": pred("arena_bytes"),
        "region_bytes": measured["region_bytes"],
        "placement": measured["placement"],
        "fragmentation": measured["fragmentation"],
        "predicted_fragmentation": pred("fragmentation"),
        "link_bytes": measured["link_bytes"],
        "predicted_link_bytes": predicted_links,
        "link_relative_error": ({link: _error(measured["link_bytes"][link], predicted_links[link])
                                 for link in LINKS} if predicted_links is not None and ok else None),
        "busy_us": measured["busy_us"],
        "host_peak_bytes": measured["host_peak_bytes"],
        "ssd_peak_bytes": measured["ssd_peak_bytes"],
        "wall_s": measured["wall_s"],
        "late_items": measured["late_items"],
        "late_us": measured["late_us"],
        "hole_waits": measured["hole_waits"],
        "range_waits": measured["range_waits"],
        "compactions": measured["compactions"],
        "compacted_bytes": measured["compacted_bytes"],
        "compaction_us": measured["compaction_us"],
        "transfers": len(scheduler.rt.copies),
        "recomputes": sum(1 for tid in scheduler.seq.recomputed if tid is not None),
        "predicted": {"valid": predicted.valid, "feasible": predicted.feasible, "rule": predicted.rule,
                      "op": predicted.op, "tensor": predicted.tensor, "reason": predicted.reason},
    }
    return report
