"""Planner sweep: every planner x shipped profile x hardware x budget, as JSON rows.

For every registered planner, every shipped profile, each hardware preset given and each
budget of 90/70/50/30% of the profile's no-swap peak (capped at the GPU's memory), it calls
``planner.core.api.make_plan`` and records one row:

    profile, hardware, planner, fraction, budget_bytes, status, overhead, iteration_us, seconds,
    ideal_us, lower_bound_us and bound (the planner's kind of lower bound, when the engine has one)

``status`` is "ok", "infeasible" or "invalid" (the simulator's verdict on the plan),
"below-floor" (budget under ``budget_floor``; not planned), "timeout" (over --timeout
seconds) or "error: <message>" (the exception is recorded and the sweep goes on).
``planner_status`` keeps the planner's own verdict. Only public functions are used
(make_plan, planners, budget_floor, open_profile, shipped_profile_paths, load_hardware),
so the script runs unchanged against old and new engines, to compare them.

Run:
    .venv/bin/python benchmarks/sweep_planners.py --out sweep.json
        [--hardware a100-40gb-pcie4 h100-80gb-pcie5] [--planners g10 lms] [--profiles gpt2-b48-s1024]
        [--timeout SECONDS]
    .venv/bin/python benchmarks/sweep_planners.py --compare BEFORE.json AFTER.json
    .venv/bin/python benchmarks/sweep_planners.py --markdown RESULTS.json ... --hardware a100-40gb-pcie4
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.shared.facts import budget_floor  # noqa: E402
from planner.core.api import make_plan  # noqa: E402
from planner.core.registry import planners  # noqa: E402
from simulator.catalog import open_profile, shipped_profile_paths  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

FRACTIONS = (0.9, 0.7, 0.5, 0.3)
HARDWARE = ("a100-40gb-pcie4", "h100-80gb-pcie5")


class CellTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CellTimeout


def run_cell(profile, hw, spec, fraction: float, floor: int, timeout: float) -> dict:
    budget = min(int(profile.peak_bytes * fraction), hw.gpu.memory_bytes)
    row = {"profile": profile.name, "hardware": hw.name, "planner": spec.name, "fraction": fraction,
           "budget_bytes": budget, "status": "below-floor", "planner_status": None, "overhead": None,
           "iteration_us": None, "seconds": None}
    if budget < floor:
        return row
    started = time.perf_counter()
    if timeout:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        planned = make_plan(profile, hw, budget, spec.name)
        result = planned.result
        row.update(status="ok" if result.ok else ("invalid" if not result.valid else "infeasible"),
                   planner_status=planned.plan.planner.status, seconds=planned.seconds,
                   overhead=result.overhead if result.ok else None,
                   iteration_us=result.iteration_us if result.ok else None,
                   ideal_us=result.ideal_us, lower_bound_us=(planned.plan.predicted or {}).get("lower_bound_us"),
                   bound=planned.plan.planner.bound)
    except CellTimeout:
        row.update(status="timeout", seconds=time.perf_counter() - started)
    except Exception as exc:  # noqa: BLE001 - one crash must not stop the sweep
        row.update(status=f"error: {type(exc).__name__}: {exc}", seconds=time.perf_counter() - started)
    finally:
        if timeout:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return row


def sweep(args) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    specs = [s for s in planners() if not args.planners or s.name in args.planners]
    paths = shipped_profile_paths()
    rows, t0 = [], time.perf_counter()
    for path in paths:
        profile = open_profile(path)
        if args.profiles and profile.name not in args.profiles and path.name.split(".")[0] not in args.profiles:
            continue
        for hw_name in args.hardware:
            hw = load_hardware(hw_name)
            for spec in specs:
                floor, _ = budget_floor(profile, spec.moves_persistent, spec.cpu_phases)
                for fraction in FRACTIONS:
                    row = run_cell(profile, hw, spec, fraction, floor, args.timeout)
                    rows.append(row)
                    over = "-" if row["overhead"] is None else f"{row['overhead'] * 100:.1f}%"
                    secs = "-" if row["seconds"] is None else f"{row['seconds']:.2f}s"
                    print(f"[{time.perf_counter() - t0:7.1f}s] {profile.name} {hw.name} {spec.name} "
                          f"{int(fraction * 100)}%: {row['status']} {over} ({secs})", file=sys.stderr, flush=True)
                Path(args.out).write_text(json.dumps(rows, indent=1))  # partial results survive a kill
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"{len(rows)} rows in {time.perf_counter() - t0:.1f}s -> {args.out}", file=sys.stderr)


def _cell(row: dict | None) -> str:
    if row is None:
        return "?"
    if row["status"] == "below-floor":
        return "-"
    return f"{row['overhead'] * 100:.1f}" if row["status"] == "ok" else "inf"


def compare(before_path: str, after_path: str) -> None:
    def load(path):
        return {(r["planner"], r["profile"], r["hardware"], r["fraction"]): r
                for r in json.loads(Path(path).read_text())}
    before, after = load(before_path), load(after_path)
    keys = sorted({k[:3] for k in before} | {k[:3] for k in after})
    width = max(len(f"{p} {pr} {hw}") for p, pr, hw in keys)
    print(f"{'planner profile hardware':<{width}}  " + "  ".join(f"{int(f * 100)}%".center(17) for f in FRACTIONS))
    for planner, profile, hw in keys:
        cells = [f"{_cell(before.get((planner, profile, hw, f)))} -> {_cell(after.get((planner, profile, hw, f)))}"
                 for f in FRACTIONS]
        print(f"{f'{planner} {profile} {hw}':<{width}}  " + "  ".join(f"{c:>17}" for c in cells))
    print()
    for planner in sorted({k[0] for k in keys}):
        ok_b = [k for k, r in before.items() if k[0] == planner and r["status"] == "ok"]
        ok_a = [k for k, r in after.items() if k[0] == planner and r["status"] == "ok"]
        both = set(ok_b) & set(ok_a)
        deltas = [(after[k]["overhead"] - before[k]["overhead"]) * 100 for k in both]
        med = f"{statistics.median(deltas):+.2f} points over {len(deltas)} cells" if deltas else "n/a"
        n_b = sum(1 for k in before if k[0] == planner)
        n_a = sum(1 for k in after if k[0] == planner)
        print(f"{planner:<12} feasible before {len(ok_b)}/{n_b}, after {len(ok_a)}/{n_a}; "
              f"median overhead change {med}")


def markdown(paths: list[str], hardware: str) -> None:
    """A markdown table for docs/planners.md: per profile and distinct budget on one
    machine, each planner's overhead (%), and the swap and swap+recompute lower bounds
    as overheads over the ideal (from the lms and capuchin rows, whose kinds they are)."""
    rows = [r for path in paths for r in json.loads(Path(path).read_text()) if r["hardware"] == hardware]
    names = [n for n in ("capuchin", "g10", "lms", "vdnn", "flashneuron") if any(r["planner"] == n for r in rows)]
    print("| profile | budget | " + " | ".join(names) + " | swap bound | swap+recompute bound |")
    print("|---|---|" + "---|" * (len(names) + 2))
    cells = {(r["profile"], r["budget_bytes"], r["planner"]): r for r in rows}
    for profile in sorted({r["profile"] for r in rows}):
        seen = []
        for fraction in FRACTIONS:
            budget = next(r["budget_bytes"] for r in rows if r["profile"] == profile and r["fraction"] == fraction)
            if budget in seen:
                continue
            seen.append(budget)
            line = [_cell(cells.get((profile, budget, n))) for n in names]
            for kind in ("lms", "capuchin"):
                row = cells.get((profile, budget, kind))
                bound = row and row.get("lower_bound_us")
                line.append(f"{(bound / row['ideal_us'] - 1) * 100:.1f}" if bound else "-")
            label = f"{int(fraction * 100)}%" if budget < 40 * 2**30 or "a100" not in hardware else "40 GiB"
            print(f"| {profile} | {label} | " + " | ".join(line) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where to write the JSON rows")
    parser.add_argument("--hardware", nargs="+", default=list(HARDWARE))
    parser.add_argument("--planners", nargs="+", help="only these planners")
    parser.add_argument("--profiles", nargs="+", help="only these shipped profiles")
    parser.add_argument("--timeout", type=float, default=0, help="per-cell limit in seconds (0: none)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--markdown", nargs="+", metavar="RESULTS", help="print a markdown table of these results "
                                                                          "for the first --hardware")
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
    elif args.markdown:
        markdown(args.markdown, args.hardware[0])
    elif args.out:
        sweep(args)
    else:
        parser.error("give --out FILE to sweep, or --compare BEFORE AFTER")


if __name__ == "__main__":
    main()
