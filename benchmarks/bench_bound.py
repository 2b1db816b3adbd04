"""Lower-bound speed (planner/shared/bound.py): the swap-only and the most general bound
(swap + recompute + persistent) on shipped profiles, median of a few runs each. Target:
the general bound in <= 2 s at 11k ops (Llama-2 70B on an RTX 4090 at 24 GiB).

Run: ``.venv/bin/python benchmarks/bench_bound.py [--repeat N]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.shared.bound import lower_bound  # noqa: E402
from simulator.catalog import open_profile  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

CASES = (("llama2-70b-b1-s1024-amp-bf16", "rtx4090-24gb-256gb-pcie4", 24 * 2**30),
         ("gpt2-b48-s1024", "a100-40gb-pcie4", 0.5),
         ("resnet152-b512-s224", "a100-40gb-pcie4", 0.3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'profile':32} {'ops':>6} {'swap ms':>9} {'general ms':>11}")
    for name, machine, budget in CASES:
        profile, hardware = open_profile(name), load_hardware(machine)
        budget = int(budget * profile.peak_bytes) if budget < 1 else int(budget)
        medians = []
        for recompute in (False, True):
            runs = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                lower_bound(profile, hardware, budget, recompute=recompute, moves_persistent=recompute)
                runs.append(time.perf_counter() - started)
            medians.append(statistics.median(runs) * 1e3)
        print(f"{name:32} {len(profile.ops):>6} {medians[0]:>9.1f} {medians[1]:>11.1f}")


if __name__ == "__main__":
    main()
