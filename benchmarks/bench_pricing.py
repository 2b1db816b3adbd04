"""Pricing a plan at the positions it ran at (planner/shared/ilp/refine.py): the size of
the refined model, the time to build it and to solve its LP, and its price against the
simulated time, with copies one column per step (the default) and in coarse pieces of
1, 1, 2, 4, ... steps (``Candidate.coarse``, what the model had before).

Each (profile, budget, planner) cell plans once with a greedy swap planner (fast to make;
the solvers' refinement prices their own plans the same way, and ``start_positions`` a
heuristic's), builds the host-only window model (window 20, as tmof's), adds the plan's
positions (``at_positions_of``), and builds and prices it ``--repeat`` times; medians.

Run: ``.venv/bin/python benchmarks/bench_pricing.py [--profiles resnet152-b512-s224 ...]
[--planners autoswap lms] [--budgets 50% 30%] [--repeat 3] [--threads 2]``.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from greedy_cells import cell_parser, greedy_cells   # noqa: E402
from planner.shared.ilp.rows import Formulation  # noqa: E402
from planner.shared.ilp.candidates import candidates  # noqa: E402
from planner.shared.ilp.decode import predicted_us  # noqa: E402
from planner.shared.ilp.refine import at_positions_of  # noqa: E402

WINDOW = 20


def price(form: Formulation, plan, run, threads: int) -> tuple[float, float]:
    """(seconds, model us) of pricing ``plan`` in ``form``: its choices, covered, as an LP."""
    started = time.perf_counter()
    moved, redone, _ = form.choices_of_plan(plan.actions, run.timeline, plan.initial, copy_start=True)
    x = form.priced(form.values_of(form.cover(moved, redone), redone), 600.0, threads)
    return time.perf_counter() - started, (float("nan") if x is None else predicted_us(form, x))


def main() -> None:
    parser = cell_parser(__doc__.split("\n\n")[0], ["autoswap", "lms"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"{'profile':<22} {'budget':>6} {'planner':<9} {'pieces':<6} {'columns':>8} {'build s':>8} "
          f"{'price s':>8} {'model s':>8} {'sim s':>8} {'diff':>7}")
    for name, label, budget, planner, _, sim, plan in greedy_cells(args):
        run = sim.simulate(plan, budget, record=True)
        cands = candidates(sim.profile, sim.hardware, budget, WINDOW, ("host",))
        for coarse in (False, True):
            window = Formulation(sim.profile, sim.hardware, budget, [replace(c, coarse=coarse) for c in cands])
            builds, prices, model_us, columns = [], [], float("nan"), 0
            for _ in range(args.repeat):
                started = time.perf_counter()
                form, _ = at_positions_of(window, sim, budget, plan.actions, plan.initial, False, WINDOW)
                builds.append(time.perf_counter() - started)
                seconds, model_us = price(form, plan, run, args.threads)
                prices.append(seconds)
                columns = form.model.num_cols
            sim_s, model_s = run.iteration_us / 1e6, model_us / 1e6
            print(f"{name:<22} {label:>6} {planner:<9} {'coarse' if coarse else 'step':<6} {columns:8d} "
                  f"{statistics.median(builds):8.2f} {statistics.median(prices):8.2f} {model_s:8.4f} "
                  f"{sim_s:8.4f} {model_s / sim_s - 1:+7.2%}")


if __name__ == "__main__":
    main()
