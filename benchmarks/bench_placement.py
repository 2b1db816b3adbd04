"""Placement (R50, R51) on every shipped profile: the arena each method needs over the peak
of live bytes, under the best plan at 50% of the peak (the fastest feasible of a few
planners; the budget capped at the GPU's memory), with the time placing took; and the
online allocators' fragmentation on the same plan (``simulate --allocator``).

Run: ``.venv/bin/python benchmarks/bench_placement.py [--hardware NAME] [PROFILE ...]``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.core.api import make_plan  # noqa: E402
from planner.shared.placement import METHODS, place  # noqa: E402
from simulator import catalog  # noqa: E402
from simulator.api import Simulator  # noqa: E402
from simulator.errors import InfeasibleError  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

PLANNERS = ("capuchin", "g10", "lms", "vdnn")


def best_plan(profile, hardware, budget):
    best = None
    for name in PLANNERS:
        try:
            planned = make_plan(profile, hardware, budget, name)
        except InfeasibleError:
            continue
        if planned.result.ok and (best is None or planned.result.iteration_us < best[1].result.iteration_us):
            best = (name, planned)
    return best


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="*", help="profiles [default: the shipped ones]")
    parser.add_argument("--hardware", default="a100-40gb-pcie4")
    args = parser.parse_args(argv)
    hardware = load_hardware(args.hardware)
    names = args.profiles or [str(path) for path in catalog.shipped_profile_paths()]
    print(f"{'profile':<36} {'plan':<9} " + " ".join(f"{m:>12}" for m in METHODS)
          + f" {'online ff':>10} {'online bf':>10}  (arena / live peak; seconds to place)")
    for name in names:
        profile = catalog.open_profile(name)
        budget = min(profile.peak_bytes // 2, hardware.gpu.memory_bytes)
        found = best_plan(profile, hardware, budget)
        if found is None:
            print(f"{profile.name:<36} no planner fits 50%")
            continue
        planner, planned = found
        cells = []
        for method in METHODS:
            started = time.perf_counter()
            _, figures = place(profile, planned.plan, hardware, budget, method)
            cells.append(f"{figures['arena_over_live']:.4f} {time.perf_counter() - started:4.1f}s")
        sim = Simulator(profile, hardware)
        online = []
        for allocator in ("first-fit", "best-fit"):
            r = sim.simulate(planned.plan, budget, allocator=allocator)
            online.append(f"{r.fragmentation:.4f}" + ("" if r.ok else "*"))
        print(f"{profile.name:<36} {planner:<9} " + " ".join(f"{c:>12}" for c in cells)
              + " " + " ".join(f"{o:>10}" for o in online), flush=True)
    print("* the online allocator's run does not fit the budget (it waits, fragmented, for good)")


if __name__ == "__main__":
    main(sys.argv[1:])
