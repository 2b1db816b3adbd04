"""The ILP planners on the shipped profiles: build + solve time, status, MIP gap, the
model's dual bound, the first model's objective (what the bound bounds), the refined
model's time of the returned plan (docs/ilp.md, "Refinement") against its simulated time,
solver memory, and the best greedy planner beside them.

Each (profile, budget, planner) runs in a fresh process, so that its peak resident memory
(``ru_maxrss`` of that process: model, HiGHS and the simulator together) is its own.
Budgets: 40 GiB (capped at the profile's peak) and 30% of the no-swap peak, on the A100
40 GB preset, with ``--time-limit`` (default 60 s) and ``--threads`` (default 2) as the
issue's machine has.

Run: ``.venv/bin/python benchmarks/bench_ilp.py [--profiles gpt2-b48-s1024 ...]
[--planners autotm tmof joint] [--time-limit 60] [--threads 2] [--json OUT]``.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROFILES = ("gpt2-b48-s1024", "bert-base-b160-s512", "resnet50-b1024-s224", "vit-base-b640-s224",
            "llama-1b-b12-s2048")
ILPS = ("autotm", "tmof", "joint")
GREEDY = ("vdnn", "lms", "capuchin", "flashneuron", "g10", "chen")
GIB = 2 ** 30


def budgets(profile, hardware) -> list[tuple[str, int]]:
    cap = hardware.gpu.memory_bytes
    return [("40GiB", min(40 * GIB, profile.peak_bytes, cap)), ("30%", min(int(0.3 * profile.peak_bytes), cap))]


def run_cell(args) -> dict:
    """One planner on one profile and budget, in this (fresh) process."""
    name, label, budget, planner, time_limit, threads = args
    from planner.core.api import make_plan
    from planner.core.registry import RunOptions
    from simulator.catalog import open_profile
    from simulator.hardware import load_hardware
    profile, hardware = open_profile(name), load_hardware("a100-40gb-pcie4")
    options = RunOptions(seed=0, time_limit=time_limit, threads=threads)
    try:
        planned = make_plan(profile, hardware, budget, planner, options=options)
    except Exception as error:   # noqa: BLE001 - a benchmark records and goes on
        return dict(profile=name, budget=label, planner=planner, error=str(error)[:200])
    info, result = planned.plan.planner, planned.result
    notes = info.notes or {}
    return dict(profile=name, budget=label, planner=planner, seconds=planned.seconds, status=info.status,
                mip_gap=notes.get("mip_gap"), bound_us=notes.get("model_bound_us"),
                first_us=notes.get("first_model_objective_us", notes.get("model_objective_us")),
                predicted_us=notes.get("model_objective_us"), simulated_us=notes.get("simulated_us"),
                returned_us=result.iteration_us if result.ok else None, ideal_us=profile.ideal_us,
                fallback=notes.get("fallback"), columns=notes.get("columns"),
                max_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _overhead(us, ideal) -> str:
    return "-" if us is None else f"{(us / ideal - 1) * 100:.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="*", default=PROFILES)
    parser.add_argument("--planners", nargs="*", default=ILPS)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    from simulator.catalog import open_profile
    from simulator.hardware import load_hardware
    hardware = load_hardware("a100-40gb-pcie4")
    rows = []
    context = multiprocessing.get_context("spawn")
    print(f"{'profile':<22} {'budget':>6} {'planner':<9} {'s':>6} {'status':<10} {'gap':>8} {'bound':>8} "
          f"{'first':>8} {'model':>8} {'simul.':>8} {'returned':>8} {'MiB':>6}  note")
    for name in args.profiles:
        profile = open_profile(name)
        for label, budget in budgets(profile, hardware):
            cells = [(name, label, budget, p, args.time_limit, args.threads) for p in args.planners]
            cells += [(name, label, budget, p, args.time_limit, args.threads) for p in GREEDY]
            best = None
            for cell in cells:
                with context.Pool(1, maxtasksperchild=1) as pool:
                    row = pool.apply(run_cell, (cell,))
                rows.append(row)
                if row["planner"] in GREEDY:
                    if row.get("returned_us") and (best is None or row["returned_us"] < best["returned_us"]):
                        best = row
                    continue
                _print(row)
            if best is not None:
                print(f"{name:<22} {label:>6} {'best greedy: ' + best['planner']:<50} "
                      f"{_overhead(best['returned_us'], best['ideal_us']):>8}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def _print(row: dict) -> None:
    if "error" in row:
        print(f"{row['profile']:<22} {row['budget']:>6} {row['planner']:<9} error: {row['error']}", flush=True)
        return
    ideal = row["ideal_us"]
    gap = "-" if row["mip_gap"] is None else f"{row['mip_gap'] * 100:.2f}%"
    print(f"{row['profile']:<22} {row['budget']:>6} {row['planner']:<9} {row['seconds']:>6.1f} {row['status']:<10} "
          f"{gap:>8} {_overhead(row['bound_us'], ideal):>8} {_overhead(row['first_us'], ideal):>8} "
          f"{_overhead(row['predicted_us'], ideal):>8} "
          f"{_overhead(row['simulated_us'], ideal):>8} {_overhead(row['returned_us'], ideal):>8} "
          f"{row['max_rss_mib']:>6.0f}  {(row['fallback'] or '')[:60]}", flush=True)


if __name__ == "__main__":
    main()
