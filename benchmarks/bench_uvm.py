"""UVM mode's speed: scoring a unified-memory plan through ``Simulator.score``.

The target case is GPT-2 (gpt2-b48-s1024, 771 ops) at 50% of its peak on a100-40gb-pcie4:
the plain ``uvm`` plan (no hints) and ``deepum``'s (about 1,500 hints); target <= 20 ms
median per scored plan, ideally ~5 ms. For each: the median with the C run
(simulator/fast/_fastuvm.c) and with the Python reference alone, then where a C-scored
plan's time goes: compile_uvm (Python), packing the program for C, the C run of both
iterations (R36), and making the Result. The C and reference results are checked to be
identical first.

Run: ``.venv/bin/python benchmarks/bench_uvm.py [--quick]``.
"""
from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.core.api import make_plan  # noqa: E402
from simulator.api import Simulator  # noqa: E402
from simulator.catalog import open_profile  # noqa: E402
from simulator.compile.lower import compile_program  # noqa: E402
from simulator.fast import uvm as fastuvm  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402
from simulator.plan import check_plan  # noqa: E402


def median_ms(fn, repeat: int) -> float:
    """The median of ``repeat`` calls, with the cyclic collector paused as Simulator.score pauses it."""
    times = []
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return statistics.median(times) * 1e3


def reference_only(fn):
    """``fn`` run with the C UVM run switched off: what scoring cost before it."""
    def run():
        saved, fastuvm._fastuvm = fastuvm._fastuvm, None
        try:
            return fn()
        finally:
            fastuvm._fastuvm = saved
    return run


def case(sim: Simulator, planner: str, repeat: int) -> None:
    profile, machine, compiled = sim.profile, sim.machine, sim.compiled
    budget = profile.peak_bytes // 2
    plan = make_plan(profile, sim.hardware, budget, planner).plan
    fast, reference = sim.simulate(plan, budget), sim.simulate(plan, budget, reference=True)
    assert fast.ok and fast.to_dict() == reference.to_dict(), fast.reason
    label = f"{planner:>6} ({len(plan.actions):,} hints):"
    if not fastuvm.available():
        print(f"{label} the C UVM run is not built", flush=True)
        return
    program = compile_program(profile, compiled, plan, machine)
    assert fastuvm.applies(program, machine, budget), "the C run does not apply"
    whole = median_ms(lambda: sim.score(plan, budget), repeat)
    slow = median_ms(reference_only(lambda: sim.score(plan, budget)), max(5, repeat // 10))
    print(f"{label} score median {whole:7.3f} ms with C, {slow:7.2f} ms reference ({slow / whole:.1f}x)", flush=True)
    check = median_ms(lambda: check_plan(plan, profile, machine.has_ssd, machine.cpu is not None), repeat)
    compile_ms = median_ms(lambda: compile_program(profile, compiled, plan, machine), repeat)
    pack = median_ms(lambda: fastuvm.pack(compiled, program, machine), repeat)
    packed = fastuvm.pack(compiled, program, machine)
    run = median_ms(lambda: fastuvm._fastuvm.run(*packed, budget), repeat)
    out = fastuvm._fastuvm.run(*packed, budget)
    result = median_ms(lambda: fastuvm._result(compiled, machine, program, budget, out), repeat)
    rest = whole - check - compile_ms - pack - run - result
    print(f"         of one score: compile_uvm {compile_ms:.3f} ms, packing {pack:.3f} ms, C run (both iterations) "
          f"{run:.3f} ms, Result {result:.3f} ms, check_plan {check:.3f} ms, the rest {rest:.3f} ms", flush=True)


def main() -> None:
    repeat = 21 if "--quick" in sys.argv else 101
    sim = Simulator(open_profile("gpt2-b48-s1024"), load_hardware("a100-40gb-pcie4"))
    print("gpt2-b48-s1024 at 50% of its peak on a100-40gb-pcie4, median ms per Simulator.score:")
    for planner in ("uvm", "deepum"):
        case(sim, planner, repeat)


if __name__ == "__main__":
    main()
