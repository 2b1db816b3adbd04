"""Replays measured against the simulator's predictions (docs/executor.md).

Each case is planned, simulated, then replayed; the table gives the measured and
predicted iteration, the relative error, the peak against the budget, the region's
fragmentation and compactions, the items whose checks outlasted their time, and the
real seconds the replay took.

Run: ``.venv/bin/python benchmarks/bench_replay.py`` (the host backend on synthetic
profiles, about a minute), or on a GPU machine with the cuda extra::

    .venv/bin/python benchmarks/bench_replay.py --backend cuda \\
        --profiles gpt2-b48-s1024,resnet50-b1024-s224 --planners lms,capuchin,g10 --budget 70%

``--repeat N`` replays each case N times and reports every error (the spread is the
machine's noise: another process on a 2-core machine shows in it).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor.api import replay  # noqa: E402
from planner.core.api import make_plan  # noqa: E402
from simulator.catalog import open_profile  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402
from simulator.units import parse_budget  # noqa: E402
from tracer.synthetic import synthesize  # noqa: E402

# (profile, planner, budget): the acceptance case first
SYNTHETIC = [
    ("transformer-l6", "g10", "50%"),
    ("transformer-l6", "none", "100%"),
    ("cnn-l4", "lms", "60%"),
    ("cnn-l4", "vdnn", "60%"),
    ("cnn-l4", "capuchin", "60%"),
    ("cnn-l4", "flashneuron", "60%"),
    ("cnn-l4", "g10", "60%"),
    ("mlp-l4", "g10", "60%"),
]


def load(name: str):
    if name.startswith(("transformer-l", "cnn-l", "mlp-l")):
        model, layers = name.split("-l")
        return synthesize(model, layers=int(layers))
    return open_profile(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="host", choices=["host", "cuda"])
    parser.add_argument("--profiles", default=None, help="comma-separated (synthetic names as transformer-l6)")
    parser.add_argument("--planners", default=None, help="comma-separated")
    parser.add_argument("--budget", default="60%")
    parser.add_argument("--hardware", default="a100-40gb-pcie4")
    parser.add_argument("--time-scale", type=float, default=None)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    hw = load_hardware(args.hardware)
    if args.profiles or args.planners:
        profiles = (args.profiles or "transformer-l6").split(",")
        planners = (args.planners or "g10").split(",")
        cases = [(p, pl, args.budget) for p in profiles for pl in planners]
    else:
        cases = SYNTHETIC
    print(f"{args.backend} backend on {hw.name}")
    print(f"{'profile':<22} {'planner':<11} {'budget':>6} {'measured':>11} {'predicted':>11} {'error':>8} "
          f"{'peak/budget':>11} {'frag':>6} {'compact':>7} {'late':>5} {'real s':>6}")
    profiles = {}
    for name, planner, budget_text in cases:
        profile = profiles.setdefault(name, load(name))
        budget = min(parse_budget(budget_text, profile.peak_bytes), hw.gpu.memory_bytes)
        try:
            plan = make_plan(profile, hw, budget, planner).plan
        except Exception as exc:   # a budget below the planner's floor
            print(f"{name:<22} {planner:<11} {budget_text:>6} cannot plan: {exc}")
            continue
        errors = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            r = replay(profile, plan, hw, budget, backend=args.backend, time_scale=args.time_scale)
            real = time.perf_counter() - started
            if not r["ok"]:
                print(f"{name:<22} {planner:<11} {budget_text:>6} FAILED: {r['integrity']}")
                break
            errors.append(r["relative_error"])
        else:
            print(f"{name:<22} {planner:<11} {budget_text:>6} {r['iteration_us'] / 1e3:>9.2f}ms "
                  f"{r['predicted_us'] / 1e3:>9.2f}ms "
                  f"{'/'.join(f'{e * 100:+.1f}' for e in errors):>7}% "
                  f"{r['peak_bytes'] / r['budget_bytes']:>11.3f} {r['fragmentation']:>6.3f} "
                  f"{r['compactions']:>7} {r['late_items']:>5} {real:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
