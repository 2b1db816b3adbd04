"""Polish (planner/core/polish.py) on greedy plans of the shipped profiles: how long a run
takes, how many simulations, how many changes it keeps and what they gain.

Each (profile, budget, planner) cell plans once, then polishes the plan ``--repeat``
times with no deadline (the count of simulations, ``MAX_RUNS``, ends it) and prints the
median time, the time per simulation and the iteration before and after. The plans are
greedy ones (fast to make), so the gains here say how far such plans are from a local
optimum of polish's neighbourhood, not what the solvers gain (docs/ilp.md "Polish").

Run: ``.venv/bin/python benchmarks/bench_polish.py [--profiles resnet50-b1024-s224 ...]
[--planners lms autoswap] [--budgets 50% 30%] [--repeat 3]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.core.api import make_plan, simulator_for   # noqa: E402
from planner.core.polish import polish   # noqa: E402
from simulator.catalog import open_profile   # noqa: E402
from simulator.hardware import load_hardware   # noqa: E402
from simulator.units import parse_budget   # noqa: E402

PROFILES = ("resnet50-b1024-s224", "gpt2-b48-s1024", "resnet152-b512-s224")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES))
    parser.add_argument("--planners", nargs="+", default=["lms", "autoswap"])
    parser.add_argument("--budgets", nargs="+", default=["50%", "30%"])
    parser.add_argument("--hardware", default="a100-40gb-pcie4")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    hardware = load_hardware(args.hardware)
    print(f"{'profile':<22} {'budget':>6} {'planner':<9} {'before s':>9} {'after s':>9} {'gain':>7} "
          f"{'changes':>7} {'sims':>5} {'median s':>8} {'ms/sim':>6}")
    for name in args.profiles:
        profile = open_profile(name)
        sim = simulator_for(profile, hardware)
        for label in args.budgets:
            budget = min(parse_budget(label, profile.peak_bytes), hardware.gpu.memory_bytes)
            for planner in args.planners:
                made = make_plan(profile, hardware, budget, planner)
                if not made.result.ok:
                    print(f"{name:<22} {label:>6} {planner:<9} does not fit")
                    continue
                runs_on, plan = sim.split(made.plan) if made.plan.splits else (sim, made.plan)   # R54: split ops
                times, done = [], None
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    done = polish(runs_on, budget, plan.actions, dict(plan.initial), float("inf"))
                    times.append(time.perf_counter() - started)
                before, after = made.result.iteration_us / 1e6, done.result.iteration_us / 1e6
                median = statistics.median(times)
                print(f"{name:<22} {label:>6} {planner:<9} {before:9.4f} {after:9.4f} {after / before - 1:+7.2%} "
                      f"{done.changes:7d} {done.runs:5d} {median:8.2f} {1e3 * median / done.runs:6.2f}")


if __name__ == "__main__":
    main()
