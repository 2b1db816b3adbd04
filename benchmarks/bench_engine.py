"""Simulator speed: a plan with ~1,000 transfers on a ~1,300-op transformer profile
(target: <= 5 ms median), and how the time grows with ops + actions up to 100,000 ops.

Times are whole ``simulate`` calls (structural check, static compile and run), on the
default path (compile and run in C when built) and on the pure-Python reference; the
two results are checked to be identical first.

Run: ``.venv/bin/python benchmarks/bench_engine.py [--quick]``.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator import fastpath  # noqa: E402
from simulator.engine import simulate  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402
from simulator.plan import check_plan  # noqa: E402
from tests.plans import swap_plan, swappable  # noqa: E402
from tracer.synthetic import synthesize  # noqa: E402


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def case(layers: int, transfers: int, repeat: int) -> None:
    profile = synthesize("transformer", layers=layers, batch=8, seq=512)
    hw = load_hardware("a100-40gb-pcie4")
    # A GPU and host as large as the biggest profile needs, so every case runs to the end.
    room = max(hw.gpu.memory_bytes, 2 * profile.peak_bytes)
    hw = replace(hw, gpu=replace(hw.gpu, memory_bytes=room), host=replace(hw.host, memory_bytes=room))
    plan = swap_plan(profile, swappable(profile)[: transfers // 2], lead=2)
    fast = simulate(profile, plan, hw)
    reference = simulate(profile, plan, hw, reference=True)
    assert fast.ok and fast.to_dict() == reference.to_dict(), fast.reason
    n_actions = len(plan.actions)
    line = f"{len(profile.ops):>7,} ops {n_actions:>7,} transfers:"
    for label, kwargs, reps in (("simulate", {}, repeat), ("reference", {"reference": True}, max(3, repeat // 4))):
        if label == "simulate" and not fastpath.available():
            label = "simulate (no C fast path built)"
        ms = median_ms(lambda: simulate(profile, plan, hw, **kwargs), reps)
        line += f"  {label} median {ms:8.2f} ms ({ms * 1e3 / (len(profile.ops) + n_actions):5.2f} us/op+action)"
    print(line, flush=True)
    return profile, plan, hw


def split(profile, plan, hw, repeat: int) -> None:
    """Where a fast call's time goes: the structural check, then packing + C (+ Result)."""
    if not fastpath.available():
        return
    check = median_ms(lambda: check_plan(plan, profile), repeat)
    fast = median_ms(lambda: fastpath.simulate_fast(profile, plan, hw, hw.gpu.memory_bytes), repeat)
    print(f"  of which check_plan {check:.2f} ms, packing + C compile and run {fast:.2f} ms", flush=True)


def main() -> None:
    quick = "--quick" in sys.argv
    print("target case (~1,300 ops, ~1,000 transfers):")
    split(*case(layers=40, transfers=1000, repeat=101), repeat=101)
    print("scaling:")
    for layers in ((12, 120, 600) if quick else (12, 120, 1200, 3000)):
        case(layers=layers, transfers=layers * 25, repeat=5 if layers < 1000 else 3)


if __name__ == "__main__":
    main()
