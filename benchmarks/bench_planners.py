"""Planner quality and speed on the shipped profiles.

Prints, for every planner: its planning time per profile (the planner alone, without the
final scoring simulation; median over the budgets, the first run three times), and a table of
simulated overhead (iteration / ideal - 1) per planner x budget (90/70/50/30% of the
no-swap peak) for each profile; `inf` marks a plan the planner could not fit, `-` a
budget below the planner's floor.

Run: ``.venv/bin/python benchmarks/bench_planners.py [PROFILE ...] [--planners a,b]
[--hardware PRESET]`` (default: every shipped profile and planner, on a100-40gb-pcie4).
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.shared.facts import budget_floor, uvm_floor  # noqa: E402
from planner.core.api import make_plan  # noqa: E402
from planner.core.registry import planners  # noqa: E402
from simulator.catalog import open_profile, shipped_profile_paths  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

FRACTIONS = (0.9, 0.7, 0.5, 0.3)


def main(argv: list[str]) -> None:
    names, chosen, preset = [], None, "a100-40gb-pcie4"
    args = iter(argv)
    for arg in args:
        if arg == "--planners":
            chosen = set(next(args).split(","))
        elif arg == "--hardware":
            preset = next(args)
        else:
            names.append(arg)
    hw = load_hardware(preset)
    names = names or [p.name.split(".json")[0] for p in shipped_profile_paths()]
    for name in names:
        profile = open_profile(name)
        print(f"\n== {name}: {len(profile.ops)} ops, peak {profile.peak_bytes / 2**30:.2f} GiB, "
              f"ideal {profile.ideal_us / 1e3:.1f} ms, on {hw.name}")
        print(f"{'planner':<12} {'plan s (median)':>16}  " + "  ".join(f"{int(f * 100):>5}%" for f in FRACTIONS))
        for spec in planners():
            if chosen is not None and spec.name not in chosen:
                continue
            floor, _ = (uvm_floor(profile, hw.uvm.block_bytes, hw.uvm.fault_batch_blocks) if spec.memory == "uvm"
                        else budget_floor(profile, spec.moves_persistent, spec.cpu_phases))
            cells, times = [], []
            for fraction in FRACTIONS:
                budget = min(int(profile.peak_bytes * fraction), hw.gpu.memory_bytes)
                if budget < floor:
                    cells.append("-")
                    continue
                runs = []
                for _ in range(3 if fraction == FRACTIONS[0] else 1):
                    planned = make_plan(profile, hw, budget, spec.name)
                    runs.append(planned.seconds)
                times.append(statistics.median(runs))
                result = planned.result
                cells.append(f"{result.overhead * 100:.1f}" if result.ok else "inf")
            plan_s = f"{statistics.median(times):.3f}" if times else "-"
            print(f"{spec.name:<12} {plan_s:>16}  " + "  ".join(f"{c:>6}" for c in cells), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
