"""What bench_polish.py and bench_pricing.py share: their command-line cells (profiles,
greedy planners, budgets, hardware, repeats) and the greedy plan of each cell, on the
profile it runs on (split where the plan splits ops, R54)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.core.api import make_plan, simulator_for   # noqa: E402
from simulator.catalog import open_profile   # noqa: E402
from simulator.hardware import load_hardware   # noqa: E402
from simulator.units import parse_budget   # noqa: E402

PROFILES = ("resnet50-b1024-s224", "gpt2-b48-s1024", "resnet152-b512-s224")


def cell_parser(description: str, planners: list[str]) -> argparse.ArgumentParser:
    """The arguments that choose the cells (a script adds its own, then parses)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES))
    parser.add_argument("--planners", nargs="+", default=planners)
    parser.add_argument("--budgets", nargs="+", default=["50%", "30%"])
    parser.add_argument("--hardware", default="a100-40gb-pcie4")
    parser.add_argument("--repeat", type=int, default=3)
    return parser


def greedy_cells(args: argparse.Namespace):
    """Per cell that fits: (profile name, budget label, budget bytes, planner, the plan as
    made, the simulator its plan runs on, that plan); a cell that does not fit is printed."""
    hardware = load_hardware(args.hardware)
    for name in args.profiles:
        profile = open_profile(name)
        for label in args.budgets:
            budget = min(parse_budget(label, profile.peak_bytes), hardware.gpu.memory_bytes)
            for planner in args.planners:
                made = make_plan(profile, hardware, budget, planner)
                if not made.result.ok:
                    print(f"{name:<22} {label:>6} {planner:<9} does not fit")
                    continue
                sim = simulator_for(profile, hardware)
                runs_on, plan = sim.split(made.plan) if made.plan.splits else (sim, made.plan)
                yield name, label, budget, planner, made, runs_on, plan
