"""Polish (planner/shared/polish.py) on greedy plans of the shipped profiles: how long a run
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

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from greedy_cells import cell_parser, greedy_cells   # noqa: E402
from planner.shared.polish import polish  # noqa: E402


def main() -> None:
    args = cell_parser(__doc__.split("\n\n")[0], ["lms", "autoswap"]).parse_args()
    print(f"{'profile':<22} {'budget':>6} {'planner':<9} {'before s':>9} {'after s':>9} {'gain':>7} "
          f"{'changes':>7} {'sims':>5} {'median s':>8} {'ms/sim':>6}")
    for name, label, budget, planner, made, runs_on, plan in greedy_cells(args):
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
