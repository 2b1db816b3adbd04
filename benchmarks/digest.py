"""A digest of swapplan's behaviour: every shipped profile planned by every planner at 50%
of its no-swap peak (capped to the GPU's memory) on the profile's machine, each plan
simulated; the plans' actions and the results' figures hashed into one sha256.

A refactoring that changes no behaviour leaves the digest as it was:

    .venv/bin/python benchmarks/digest.py                  # the digest (and per-cell lines with -v)
    .venv/bin/python benchmarks/digest.py --out cells.json # every cell's own hash, to diff two runs

Searching planners run with settings that make them deterministic: the ILPs stop at their
first solution within a 100% gap (HiGHS is deterministic on one thread when no time limit
is reached), SwapAdvisor, AutoSwap and the others that search stop after a fixed amount
of work, not of time, and every planner is seeded. Time-dependent fields (planning
seconds, notes with timings) are left out of what is hashed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHARE = 0.5
TIME_LIMIT = 600.0          # far above what the deterministic settings need: never reached
DETERMINISTIC = {           # planner -> parameters that bound its work by amount, not by time
    "autotm": {"gap": 1.0}, "tmof": {"gap": 1.0}, "joint": {"gap": 1.0}, "deeptm": {"gap": 1.0},
    "checkmate": {"gap": 1.0},
    "swapadvisor": {"generations": 3, "population": 8, "jobs": 1},
    "autoswap": {"tune_trials": 2},
}


def cells(only_profiles=None, only_planners=None, progress=None):
    """(profile, planner, cell digest, summary) for every cell, in order."""
    from planner.core.api import make_plan
    from planner.core.registry import RunOptions, planners
    from simulator.catalog import choose_hardware, open_profile, shipped_profile_paths
    from simulator.errors import SwapplanError
    from simulator.hardware import load_hardware
    from simulator.plan import plan_json

    for path in shipped_profile_paths():
        profile = open_profile(path)
        if only_profiles and profile.name not in only_profiles:
            continue
        hw = load_hardware(choose_hardware(None, None, profile)[0])
        budget = min(int(profile.peak_bytes * SHARE), hw.gpu.memory_bytes)
        for spec in planners():
            if only_planners and spec.name not in only_planners:
                continue
            started = time.perf_counter()
            params = DETERMINISTIC.get(spec.name, {})
            try:
                planned = make_plan(profile, hw, budget, spec.name, params, 0,
                                    RunOptions(seed=0, time_limit=TIME_LIMIT, threads=1))
            except SwapplanError as exc:
                summary = {"error": type(exc).__name__, "message": str(exc)}
            else:
                plan = json.loads(plan_json(planned.plan))
                plan.pop("planner", None)
                plan.pop("predicted", None)
                r = planned.result
                summary = {"plan": plan, "valid": r.valid, "feasible": r.feasible, "rule": r.rule,
                           "iteration_us": r.iteration_us, "peak_bytes": r.peak_bytes,
                           "status": planned.plan.planner.status}
            text = json.dumps(summary, sort_keys=True, separators=(",", ":"))
            digest = hashlib.sha256(text.encode()).hexdigest()
            if progress:
                progress(f"{profile.name} {spec.name}: {digest[:12]} ({time.perf_counter() - started:.1f} s)")
            yield profile.name, spec.name, digest, summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", help="comma-separated profile names (default: every shipped one)")
    parser.add_argument("--planners", help="comma-separated planner names (default: every one)")
    parser.add_argument("--out", help="write every cell's digest as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per cell on stderr")
    args = parser.parse_args(argv)
    split = lambda s: set(s.split(",")) if s else None  # noqa: E731
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if args.verbose else None
    whole = hashlib.sha256()
    found = {}
    started = time.perf_counter()
    for profile, planner, digest, _ in cells(split(args.profiles), split(args.planners), say):
        whole.update(f"{profile}\0{planner}\0{digest}\n".encode())
        found[f"{profile} {planner}"] = digest
    if args.out:
        Path(args.out).write_text(json.dumps(found, indent=1, sort_keys=True))
    print(f"{whole.hexdigest()}  {len(found)} cells ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
