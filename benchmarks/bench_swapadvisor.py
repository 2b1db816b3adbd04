"""The swapadvisor planner: how fast it scores chromosomes, and what a search buys.

1. Evaluations per second (decode + simulate one chromosome) on gpt2-b48-s1024 at 50%
   of its peak, in this process and in a pool of 2 processes: one batch of 64
   chromosomes (the search's first population and its children), median of 3 batches
   (wall clock; for one process also per second of its CPU time, which a busy machine
   does not dilute).
2. For gpt2, resnet50 and vit at 40 GiB and at 30% of the peak, on a100-40gb-pcie4:
   the overhead (iteration / ideal - 1) of swapadvisor after a 60 s time limit against
   the best greedy planner (capuchin, g10, lms; `-` below its floor), the lower bound
   for plans that may recompute and move weights (planner/shared/bound.py; it assumes the
   profile's op order), how long the search took, and whether the best plan reorders ops.

Run: ``.venv/bin/python benchmarks/bench_swapadvisor.py [--quick]`` (``--quick``: 10 s
limit, one budget).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from planner.shared.facts import budget_floor  # noqa: E402
from planner.core.api import make_plan  # noqa: E402
from planner.core.registry import RunOptions, get_planner  # noqa: E402
from planner.swap_recompute.swapadvisor.evaluate import Evaluator  # noqa: E402
from planner.swap_recompute.swapadvisor.search import Search  # noqa: E402
from simulator.catalog import open_profile  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

HW = load_hardware("a100-40gb-pcie4")
GREEDY = ("capuchin", "g10", "lms")
PROFILES = ("gpt2-b48-s1024", "resnet50-b1024-s224", "vit-base-b640-s224")


def chromosomes(profile, budget: int, count: int) -> list:
    """The search's first population and children of it: realistic chromosomes."""
    evaluate = Evaluator(profile, HW, budget)
    search = Search(profile, evaluate, np.random.default_rng(0), population=32, mutation_rate=0.1)
    people = search.first([])
    batch = [(p.order, p.genes) for p in people]
    while len(batch) < count:
        people = search.next(people)
        batch += [(p.order, p.genes) for p in people[2:]]
    return batch[:count]


def evaluation_rate() -> None:
    profile = open_profile("gpt2-b48-s1024")
    budget = int(profile.peak_bytes * 0.5)
    batch = chromosomes(profile, budget, 64)
    print(f"== evaluations per second: {profile.name} ({len(profile.ops)} ops) at 50%, batches of {len(batch)}")
    for jobs in (1, 2):
        evaluate = Evaluator(profile, HW, budget, jobs=jobs)
        try:
            evaluate(batch[:jobs * 2])              # start the workers
            rates, cpu = [], []
            for _ in range(3):
                started, used = time.perf_counter(), time.process_time()
                evaluate(batch)
                rates.append(len(batch) / (time.perf_counter() - started))
                cpu.append(len(batch) / (time.process_time() - used))
        finally:
            evaluate.close()
        mine = f" ({statistics.median(cpu):.0f} per second of this process's CPU time)" if jobs == 1 else ""
        print(f"  {jobs} process{'es' if jobs > 1 else ''}: {statistics.median(rates):6.0f} evaluations/s, "
              f"median of 3{mine}")


def quality(limit: float, fractions: tuple) -> None:
    print(f"\n== overhead (%) after a {limit:.0f} s time limit, on {HW.name}")
    print(f"{'profile':<22} {'budget':>7} {'greedy best':>16} {'swapadvisor':>12} {'bound':>6} {'search s':>9}"
          f" {'evals':>6}  stop / reordered")
    for name in PROFILES:
        profile = open_profile(name)
        for fraction in fractions:
            budget = HW.gpu.memory_bytes if fraction is None else int(profile.peak_bytes * fraction)
            label = "40 GiB" if fraction is None else f"{fraction:.0%}"
            greedy = {}
            for planner in GREEDY:
                floor, _ = budget_floor(profile, get_planner(planner).moves_persistent)
                if budget >= floor:
                    result = make_plan(profile, HW, budget, planner).result
                    greedy[planner] = result.overhead if result.ok else float("inf")
            floor, _ = budget_floor(profile, True)
            if budget < floor:
                print(f"{name:<22} {label:>7} {'-':>16} {'-':>12}   (below every planner's floor)")
                continue
            planned = make_plan(profile, HW, budget, "swapadvisor", options=RunOptions(seed=0, time_limit=limit))
            notes, result = planned.plan.planner.notes, planned.result
            best = min(greedy, key=greedy.get) if greedy else None
            greedy_text = f"{greedy[best] * 100:.1f} {best}" if best else "-"
            ga = f"{result.overhead * 100:.1f}" if result.ok else "inf"
            bound = planned.plan.predicted.get("lower_bound_us")
            bound_text = f"{(bound / profile.ideal_us - 1) * 100:.1f}" if bound else "-"
            order = "reordered" if notes["reordered"] else "profile order"
            origin = "" if notes["improved_over_seeds"] else f" (seed {notes['best_seed']}'s plan)"
            print(f"{name:<22} {label:>7} {greedy_text:>16} {ga:>12} {bound_text:>6} {planned.seconds:>9.1f}"
                  f" {notes['evaluations']:>6}  {notes['stop']} / {order}{origin}", flush=True)


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    evaluation_rate()
    quality(10.0 if quick else 60.0, (None,) if quick else (None, 0.3))


if __name__ == "__main__":
    main(sys.argv[1:])
