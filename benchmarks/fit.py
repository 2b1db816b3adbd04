"""How long `swapplan fit` takes: a fresh run into a new folder, then a rerun from its cache.

    .venv/bin/python benchmarks/fit.py [--model gpt2] [--hardware rtx4090-24gb-pcie4] [--planners quick]
                                       [--jobs 2] [--repeat 1]

Prints each run's wall time (median over --repeat fresh folders), the sizes traced and plans
made, and each family's largest batch. The issue's goal: the quick planners on GPT-2 and an
RTX 4090 in <= 5 min on 2 cores, a rerun in <= 30 s.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWAPPLAN = str(Path(sys.executable).with_name("swapplan"))


def run(args: list[str]) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([SWAPPLAN, "fit", *args, "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"fit failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return seconds, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--hardware", default="rtx4090-24gb-pcie4")
    parser.add_argument("--planners", default="quick")
    parser.add_argument("--jobs", default="2")
    parser.add_argument("--time-limit", default="20")
    parser.add_argument("--repeat", type=int, default=1)
    options = parser.parse_args()
    fresh, again = [], []
    summary = None
    for _ in range(options.repeat):
        with tempfile.TemporaryDirectory() as folder:
            args = [options.model, "--hardware", options.hardware, "--axis", "batch", "--planners", options.planners,
                    "--time-limit", options.time_limit, "--jobs", options.jobs, "--out", folder]
            seconds, summary = run(args)
            fresh.append(seconds)
            seconds, _ = run(args)
            again.append(seconds)
            traces = len(list(Path(folder, "traces").glob("*.json.gz")))
            probes = len(json.loads(Path(folder, "results.json").read_text())["rows"])
    print(f"fit {options.model} on {options.hardware}, --planners {options.planners}, --jobs {options.jobs}")
    print(f"  fresh run   median {statistics.median(fresh):7.1f} s  (runs: {', '.join(f'{s:.1f}' for s in fresh)})")
    print(f"  from cache  median {statistics.median(again):7.1f} s  (runs: {', '.join(f'{s:.1f}' for s in again)})")
    print(f"  {traces} sizes traced, {probes} plans")
    for row in summary["families"]:
        print(f"  {row['family']:<18} max {row['max']:>6}  {row['planner'] or '-':<12} "
              f"{(row['throughput'] or 0):10.1f} {row['unit']}  wall {row['wall']}")


if __name__ == "__main__":
    main()
