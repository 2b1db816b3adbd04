"""Simulator speed: scoring a plan through the compile-once API.

The target case is a ~1,300-op transformer with ~1,000 transfers, half of them to the SSD
so that host and SSD copies share PCIe (target: <= 1 ms median per scored plan through
``Simulator.score``). Then how the time grows with ops + transfers up to ~100,000 ops,
on the C path and on the Python reference, and where a scored plan's time goes: the
structural check and the plan's packing (Python) against the C compile and run.
The C and reference results are checked to be identical first.

Run: ``.venv/bin/python benchmarks/bench_engine.py [--quick]``.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.api import Simulator  # noqa: E402
from simulator.fast import explicit as fastpath  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402
from simulator.plan import Plan, check_plan  # noqa: E402
from tests.plans import swap_plan, swappable  # noqa: E402
from tracer.synthetic import synthesize  # noqa: E402


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def setup(layers: int, transfers: int):
    """A synthetic transformer, a machine as large as it needs (so every case runs to the
    end), and a plan that swaps the largest tensors, alternately to host and to SSD."""
    profile = synthesize("transformer", layers=layers, batch=8, seq=512)
    hw = load_hardware("a100-40gb-pcie4")
    room = max(hw.gpu.memory_bytes, 2 * profile.peak_bytes)
    hw = replace(hw, gpu=replace(hw.gpu, memory_bytes=room), host=replace(hw.host, memory_bytes=room),
                 ssd=replace(hw.ssd, capacity_bytes=room))
    chosen = swappable(profile)[: transfers // 2]
    host = swap_plan(profile, chosen[0::2], lead=2)
    ssd = swap_plan(profile, chosen[1::2], lead=2, tier="ssd")
    plan = Plan(profile.name, host.actions + ssd.actions, profile_sha256=host.profile_sha256)
    return profile, hw, plan


def case(layers: int, transfers: int, repeat: int):
    profile, hw, plan = setup(layers, transfers)
    sim = Simulator(profile, hw)
    fast = sim.simulate(plan)
    reference = sim.simulate(plan, reference=True)
    assert fast.ok and fast.to_dict() == reference.to_dict(), fast.reason
    n = len(profile.ops) + len(plan.actions)
    line = f"{len(profile.ops):>7,} ops {len(plan.actions):>7,} transfers:"
    label = "score (C)" if fastpath.available() else "score (no C fast path built)"
    ms = median_ms(lambda: sim.score(plan), repeat)
    line += f"  {label} median {ms:8.3f} ms ({ms * 1e3 / n:5.2f} us/op+transfer)"
    ms = median_ms(lambda: sim.simulate(plan, reference=True), max(3, repeat // 10))
    line += f"  reference median {ms:9.2f} ms ({ms * 1e3 / n:5.2f} us/op+transfer)"
    print(line, flush=True)
    return sim, plan


def split(sim: Simulator, plan: Plan, repeat: int) -> None:
    """Where a scored plan's time goes."""
    if not fastpath.available():
        return
    budget = sim.budget(plan)
    whole = median_ms(lambda: sim.score(plan), repeat)
    check = median_ms(lambda: check_plan(plan, sim.profile, sim.machine.has_ssd), repeat)
    pack = median_ms(lambda: fastpath.pack_plan(sim.compiled, plan), repeat)
    packed = fastpath.pack_plan(sim.compiled, plan)
    run = median_ms(lambda: fastpath._fastsim.run(sim.compiled.arrays, sim.machine.packed, packed, budget), repeat)
    python = whole - run
    print(f"  of one score ({whole:.3f} ms): C compile + run {run:.3f} ms ({run / whole * 100:.0f}%), Python "
          f"{python:.3f} ms ({python / whole * 100:.0f}%: packing the plan {pack:.3f} ms; check_plan, "
          f"{check:.3f} ms, runs only to word an error)", flush=True)


def main() -> None:
    quick = "--quick" in sys.argv
    print("target case (~1,300 ops, ~1,000 transfers, half of them to SSD):")
    split(*case(layers=40, transfers=1000, repeat=301), repeat=301)
    print("scaling:")
    for layers in ((12, 120, 600) if quick else (12, 120, 1200, 3000)):
        case(layers=layers, transfers=layers * 25, repeat=21 if layers < 1000 else 5)


if __name__ == "__main__":
    main()
