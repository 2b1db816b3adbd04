"""Grouped transfers (R53) and op variants (R52) across planners.

(a) Grouping. On transformers with many small tensors, for each planner: iteration /
    ideal of its plan as made (``ungrouped``; for ``deeptm``, whose own aggregation
    groups its plan, the same plan with the group ids removed), of that plan with
    planner/shared/grouping.py's ``group_actions`` applied (``grouped``, even when slower), and
    what ``make_plan(..., group=True)`` returns (``group=True``: the grouped plan when no
    slower, else the plan as made; computed from the same plan, planners being
    deterministic), with the groups formed and the median planning time. The summary
    gives, per planner, the median over the cells of ungrouped / group=True.
(b) Variants. No measured variants exist in the shipped profiles: every convolution op
    (forward and backward) of a CNN profile is given HAND-MADE variants derived from its
    own time and workspace: ``fast`` (0.75 x the time, its workspace plus the bytes of
    its largest input: an FFT-like algorithm) and, where its workspace is not zero,
    ``small`` (1.25 x the time, no workspace: an implicit-GEMM-like one). modnn (with
    and without variant choice) against capuchin (which keeps the default algorithms).
    ideal_us stays the sum of the default times (R52), so a faster variant can take the
    ratio below 1.

On a100-40gb-pcie4; budgets as a share of the no-swap peak, capped at the GPU's 40 GiB;
``-``: below the planner's floor; ``inf``: the plan does not fit. The MILP planners
(autotm, deeptm) run with a 30 s time limit here.

Run: ``.venv/bin/python benchmarks/bench_variants_groups.py [--quick]`` (``--quick``: one
profile per part, for a smoke run).
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.shared.facts import budget_floor  # noqa: E402
from planner.core.api import make_plan, score  # noqa: E402
from planner.shared.grouping import group_actions  # noqa: E402
from planner.core.registry import RunOptions, get_planner  # noqa: E402
from simulator.catalog import open_profile  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402
from simulator.profile import profile_from_dict  # noqa: E402
from tracer.synthetic import synthesize  # noqa: E402

HW = load_hardware("a100-40gb-pcie4")
GROUP_PLANNERS = ("vdnn", "lms", "capuchin", "g10", "autotm", "deeptm", "modnn")
SEARCHING = {"autotm", "deeptm"}
LIMIT = RunOptions(time_limit=30.0)


def budget_of(profile, fraction: float) -> int:
    return min(int(profile.peak_bytes * fraction), HW.gpu.memory_bytes)


def ratio(result, profile) -> str:
    return f"{result.iteration_us / profile.ideal_us:.4f}" if result.ok else "inf"


def grouping_cell(profile, budget: int, planner: str):
    """(ungrouped, grouped, group=True) results, groups, members and the median planning s."""
    runs, planned = [], None
    for _ in range(1 if planner in SEARCHING else 3):
        planned = make_plan(profile, HW, budget, planner, options=LIMIT if planner in SEARCHING else None)
        runs.append(planned.seconds)
    actions = list(planned.plan.actions)
    variants = planned.plan.variants
    if any(a.group is not None for a in actions):            # deeptm's own aggregation
        grouped_actions = actions
        actions = [replace(a, group=None) for a in actions]
        groups = len({a.group for a in grouped_actions if a.group is not None})
        members = sum(a.group is not None for a in grouped_actions)
    else:
        grouped_actions, groups, members = group_actions(actions, HW)
    initial = planned.plan.initial
    plain = score(profile, HW, budget, actions, initial, variants=variants)
    grouped = score(profile, HW, budget, grouped_actions, initial, variants=variants)
    chosen = grouped if grouped.ok and (not plain.ok or grouped.iteration_us <= plain.iteration_us) else plain
    return plain, grouped, chosen, groups, members, statistics.median(runs)


def part_a(quick: bool) -> None:
    cells = [("synth-transformer-l12-b1-s128", lambda: synthesize("transformer", layers=12, batch=1, seq=128), 0.5),
             ("synth-transformer-l12-b1-s128", lambda: synthesize("transformer", layers=12, batch=1, seq=128), 0.9),
             ("synth-transformer-l12-b16-s1024", lambda: open_profile("synth-transformer-l12-b16-s1024"), 0.5)]
    if quick:
        cells = cells[:1]
    print("(a) grouped transfers (R53): iteration / ideal on a100-40gb-pcie4")
    print(f"{'profile':<32} {'budget':>6} {'planner':<9} {'ungrouped':>9} {'grouped':>9} {'group=True':>10} "
          f"{'groups':>6} {'members':>7} {'plan s':>7}")
    gains: dict[str, list[float]] = {}
    profiles = {}
    for name, make, fraction in cells:
        profile = profiles.get(name) or profiles.setdefault(name, make())
        budget = budget_of(profile, fraction)
        for planner in GROUP_PLANNERS:
            spec = get_planner(planner)
            floor, _ = budget_floor(profile, spec.moves_persistent, spec.cpu_phases)
            head = f"{name:<32} {int(fraction * 100):>5}% {planner:<9}"
            if budget < floor:
                print(f"{head} {'-':>9} {'-':>9} {'-':>10}")
                continue
            plain, grouped, chosen, groups, members, seconds = grouping_cell(profile, budget, planner)
            print(f"{head} {ratio(plain, profile):>9} {ratio(grouped, profile):>9} {ratio(chosen, profile):>10} "
                  f"{groups:>6} {members:>7} {seconds:>7.2f}", flush=True)
            if plain.ok and chosen.ok:
                gains.setdefault(planner, []).append(plain.iteration_us / chosen.iteration_us)
    print("\nmedian over the cells of ungrouped / group=True (speedup from grouping):")
    for planner in GROUP_PLANNERS:
        if planner in gains:
            print(f"  {planner:<9} {statistics.median(gains[planner]):.4f}  ({len(gains[planner])} cells)")


def with_variants(profile):
    """The profile with HAND-MADE variants on every convolution op (see the module docstring)."""
    data = profile.to_dict()
    sizes = {t["id"]: t["bytes"] for t in data["tensors"]}
    count = 0
    for op in data["ops"]:
        if "conv" not in op["name"].split("::")[-1]:
            continue
        largest = max((sizes[t] for t in op["inputs"]), default=0)
        workspace = op.get("workspace_bytes", 0)
        variants = [{"name": "fast", "time_us": 0.75 * op["time_us"], "workspace_bytes": workspace + largest}]
        if workspace:
            variants.append({"name": "small", "time_us": 1.25 * op["time_us"], "workspace_bytes": 0})
        op["variants"] = variants
        count += 1
    data["name"] = profile.name + "-handmade-variants"
    return profile_from_dict(data), count


def part_b(quick: bool) -> None:
    names = ["synth-cnn-l16-w128-b64-s224", "resnet50-b1024-s224"]
    if quick:
        names = names[:1]
    print("\n(b) op variants (R52), HAND-MADE (no measured variants exist): iteration / ideal on a100-40gb-pcie4")
    print(f"{'profile':<30} {'budget':>6} {'capuchin':>9} {'modnn, no variants':>19} {'modnn':>9} "
          f"{'variants chosen':>15} {'modnn s':>8}")
    for name in names:
        profile, count = with_variants(open_profile(name))
        floor, _ = budget_floor(profile, False)
        for fraction in (0.5, 0.4, 0.3):
            budget = budget_of(profile, fraction)
            head = f"{name:<30} {int(fraction * 100):>5}%"
            if budget < floor:
                print(f"{head} {'-':>9}")
                continue
            capuchin = make_plan(profile, HW, budget, "capuchin").result
            plain = make_plan(profile, HW, budget, "modnn", {"variants": False}).result
            started = time.perf_counter()
            modnn = make_plan(profile, HW, budget, "modnn")
            seconds = time.perf_counter() - started
            chosen = modnn.plan.variants
            print(f"{head} {ratio(capuchin, profile):>9} {ratio(plain, profile):>19} {ratio(modnn.result, profile):>9} "
                  f"{len(chosen):>7} of {count:<4} {seconds:>8.2f}", flush=True)


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    part_a(quick)
    part_b(quick)
