"""The frontier table of issue 53: on twelve cells (six shipped profiles at 50% and 30% of
their no-swap peak, a100-40gb-pcie4), the cell's lower bound, the best plan of any planner,
its gap to the bound, joint against the best, each swap-only solver's time (its own plan or
a fallback to a heuristic's, and which) against autoswap, and the slowest planning time
against the limit x 1.1 + 2 s.

    .venv/bin/python benchmarks/frontier.py                  # the 12 cells, --time-limit 20, 2 jobs
    .venv/bin/python benchmarks/frontier.py --out DIR        # keep (and resume) compare's folder
    .venv/bin/python benchmarks/frontier.py --profiles gpt2-b48-s1024 --budgets 30%

It runs ``swapplan compare`` (the command the acceptance runs) once over every cell, into
``--out`` (a temporary folder by default; an existing one resumes, as compare does), then
reads its results.json. About 10 minutes on two cores; the planners' searches are bounded
by wall time, so the figures depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ("gpt2-b48-s1024", "bert-large-b80-s512", "vit-base-b640-s224", "resnet50-b1024-s224",
            "resnet152-b512-s224", "vgg16-b1024-s224")
PLANNERS = ("capuchin", "g10", "lms", "autoswap", "swapadvisor", "joint", "autotm", "tmof", "deeptm")
SOLVERS = ("autotm", "tmof", "deeptm")


def run_compare(out: Path, profiles, budgets, limit: float, jobs: int) -> list[dict]:
    """compare over the cells into ``out``; its rows."""
    swapplan = Path(sys.executable).parent / "swapplan"
    command = [str(swapplan), "compare", *profiles, "--planners", ",".join(PLANNERS), "--budgets", ",".join(budgets),
               "--time-limit", str(limit), "--jobs", str(jobs), "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"frontier: compare failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return json.loads((out / "results.json").read_text())["rows"]


def cells(rows: list[dict], limit: float) -> list[dict]:
    """One summary per (profile, budget)."""
    out = []
    for key in sorted({(r["profile"], r["budget"]) for r in rows}):
        mine = [r for r in rows if (r["profile"], r["budget"]) == key]
        ok = {r["planner"]: r for r in mine if r.get("feasible")}
        bound = max((r.get("cell_bound_us") or 0.0) for r in mine) or None
        best = min(ok.values(), key=lambda r: r["iteration_us"]) if ok else None
        auto = ok.get("autoswap")
        cell = {"profile": key[0], "budget": key[1], "bound_us": bound,
                "best": best and best["planner"], "best_us": best and best["iteration_us"],
                "gap": best and bound and best["iteration_us"] / bound - 1,
                "joint_over_best": best and "joint" in ok and ok["joint"]["iteration_us"] / best["iteration_us"] - 1,
                "slowest": max(mine, key=lambda r: r.get("planning_seconds") or 0.0)["planner"],
                "slowest_s": max((r.get("planning_seconds") or 0.0) for r in mine)}
        cell["limit_kept"] = cell["slowest_s"] <= limit * 1.1 + 2
        for name in SOLVERS:
            r = ok.get(name)
            cell[name] = None if r is None else {
                "us": r["iteration_us"], "fallback": r.get("planner_status") == "heuristic",
                "over_autoswap": auto and r["iteration_us"] / auto["iteration_us"] - 1}
        out.append(cell)
    return out


def table(summary: list[dict], limit: float) -> str:
    def pct(x):
        return "-" if x is None or x is False else f"{x:+.2%}"

    lines = [f"{'cell':<26} {'bound s':>8} {'best s':>8} {'best':<12} {'gap':>7} {'joint':>7} "
             + " ".join(f"{n + ' vs autoswap':>20}" for n in SOLVERS) + f" {'slowest s':>14}"]
    for c in summary:
        solvers = []
        for name in SOLVERS:
            s = c[name]
            solvers.append("-" if s is None else f"{pct(s['over_autoswap'])}{' (fallback)' if s['fallback'] else ''}")
        lines.append(f"{c['profile'].split('-s')[0] + ' ' + c['budget']:<26} "
                     f"{(c['bound_us'] or 0) / 1e6:>8.4f} {(c['best_us'] or 0) / 1e6:>8.4f} {c['best'] or '-':<12} "
                     f"{pct(c['gap']):>7} {pct(c['joint_over_best']):>7} " + " ".join(f"{s:>20}" for s in solvers)
                     + f" {c['slowest_s']:>6.1f} {'ok' if c['limit_kept'] else 'OVER'} {c['slowest']}")
    within = sum(1 for c in summary if c["gap"] is not None and c["gap"] <= 0.01)
    lines.append(f"best within 1% of the bound in {within} of {len(summary)} cells; limit {limit:g} s "
                 f"(x 1.1 + 2 = {limit * 1.1 + 2:g} s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES))
    parser.add_argument("--budgets", nargs="+", default=["50%", "30%"])
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="compare's folder (kept; resumed when it exists)")
    parser.add_argument("--json", action="store_true", help="print the cells as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "compare"
        summary = cells(run_compare(out, args.profiles, args.budgets, args.time_limit, args.jobs), args.time_limit)
    print(json.dumps(summary, indent=1) if args.json else table(summary, args.time_limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
