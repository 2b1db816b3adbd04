"""The five seed planners (autoswap, layrub, chen-meng, gtbm, cachedarrays) beside vdnn, lms
and capuchin: iteration / ideal and planning time at one budget on every shipped profile.

For each profile the budget is ``--fraction`` (default 0.5) of its no-swap peak, capped at
the GPU's memory (as ``swapplan plan --budget 50%`` does). A cell is ``time/ideal (plan
seconds)``; ``inf`` marks a plan the simulator found over the budget (valid, infeasible),
``INVALID`` a plan that breaks a rule (a bug), ``-`` a budget below the planner's floor
(weights and optimizer state alone exceed it: the llama2 profiles on a 40 GiB GPU).
Planning time is the planner alone (``Planned.seconds``), without the final simulation.

Run: ``.venv/bin/python benchmarks/bench_seed_planners.py [PROFILE ...] [--planners a,b]
[--hardware PRESET] [--fraction F] [--markdown]``.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.shared.facts import budget_floor  # noqa: E402
from planner.core.api import make_plan  # noqa: E402
from planner.core.registry import get_planner  # noqa: E402
from simulator.catalog import open_profile, shipped_profile_paths  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

SEED = ["autoswap", "layrub", "chen-meng", "gtbm", "cachedarrays"]
BASELINES = ["vdnn", "lms", "capuchin"]


def cell(profile, hardware, budget: int, planner: str) -> str:
    spec = get_planner(planner)
    floor, _ = budget_floor(profile, spec.moves_persistent, spec.cpu_phases)
    if budget < floor:
        return "-"
    planned = make_plan(profile, hardware, budget, planner)
    result = planned.result
    if not result.valid:
        return f"INVALID ({result.rule})"
    ratio = f"{result.iteration_us / result.ideal_us:.3f}" if result.feasible else "inf"
    return f"{ratio} ({planned.seconds:.2f}s)"


def main(argv: list[str]) -> None:
    names, chosen, preset, fraction, markdown = [], SEED + BASELINES, "a100-40gb-pcie4", 0.5, False
    args = iter(argv)
    for arg in args:
        if arg == "--planners":
            chosen = next(args).split(",")
        elif arg == "--hardware":
            preset = next(args)
        elif arg == "--fraction":
            fraction = float(next(args))
        elif arg == "--markdown":
            markdown = True
        else:
            names.append(arg)
    hardware = load_hardware(preset)
    names = names or [p.name.split(".json")[0] for p in shipped_profile_paths()]
    started = time.perf_counter()
    header = ["profile", "budget GiB"] + chosen
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
    else:
        print(f"{hardware.name}, budget {fraction:.0%} of the no-swap peak (capped at the GPU's memory); "
              "cells: time/ideal (planning seconds)")
        print("  ".join(f"{h:>18}" for h in header))
    for name in names:
        profile = open_profile(name)
        budget = min(int(profile.peak_bytes * fraction), hardware.gpu.memory_bytes)
        cells = [cell(profile, hardware, budget, planner) for planner in chosen]
        row = [name, f"{budget / 2**30:.2f}"] + cells
        if markdown:
            print("| " + " | ".join(row) + " |", flush=True)
        else:
            print("  ".join(f"{c:>18}" for c in row), flush=True)
    print(f"\n({time.perf_counter() - started:.0f} s in all)", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
