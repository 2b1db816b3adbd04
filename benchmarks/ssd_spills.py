"""SSD spills on G10's machine: the explicit planners that spill past host memory, beside
G10's published figures and the lower bound.

G10 (MICRO'23, Fig. 11) reports its own system at 1.02x the ideal on ResNet-152 b1280 and
1.07x on SENet-154 b1024, on an A100 40 GB with 15.754 GB/s PCIe, 128 GiB of host memory
and a 3.2 GB/s SSD (the preset a100-40gb-128gb-g10). Both models
are far larger than GPU and host memory together (213 and 346 GiB no-swap peaks), so a
plan must send some of what leaves the GPU on to the SSD. This script plans both traced
workloads (benchmarks/g10_uvm.py traces and caches them) with the planners that can use
the SSD, at the GPU's 40 GiB, twice: with the tracer's roofline kernel times, and with
every op's time scaled so that the ideal is G10's (its measured kernels, 14.6x and 7.3x
slower), and prints each plan's iteration over the ideal beside the bound
(planner/shared/bound.py: swap only, and with recomputation) and G10's figure.

    .venv/bin/python benchmarks/ssd_spills.py                       # the table (a few minutes)
    .venv/bin/python benchmarks/ssd_spills.py --planners g10 --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from g10_uvm import CACHE, HARDWARE, WORKLOADS, profile_for, say, scaled  # noqa: E402

SPILLING = ("ResNet-152", "SENet-154")
# "planner:flag" runs the planner with that boolean parameter on (g10:recompute: g10's ``recompute``)
PLANNERS = ("g10", "g10:recompute", "capuchin", "swapadvisor", "joint", "flashneuron", "autotm", "zero-infinity")


def rows(planners=PLANNERS, time_limit: float = 20.0, cache: Path | None = CACHE) -> list[dict]:
    """One row per workload and kernel-time model: each planner's iteration over the ideal
    (None when its plan does not run), the two bounds, and G10's figure."""
    from planner.core.api import make_plan
    from planner.shared.bound import lower_bound
    from planner.core.registry import RunOptions
    from simulator.errors import InfeasibleError
    from simulator.hardware import load_hardware
    hardware = load_hardware(str(HARDWARE))
    budget = hardware.gpu.memory_bytes
    out = []
    for w in (w for w in WORKLOADS if w.name in SPILLING):
        traced, _, _ = profile_for(w, cache)
        for times, profile in (("roofline", traced),
                               ("G10's", scaled(traced, w.published_ideal_ms * 1e3 / traced.ideal_us))):
            row = {"workload": w.name, "kernel_times": times, "ideal_s": profile.ideal_us / 1e6,
                   "published_g10_x": w.published_g10, "peak_gib": profile.peak_bytes / 2**30}
            for kind, recompute in (("bound_swap_x", False), ("bound_x", True)):
                bound = lower_bound(profile, hardware, budget, recompute=recompute, moves_persistent=True)
                row[kind] = bound.iteration_us / profile.ideal_us if bound.value_us else None
            for name in planners:
                started = time.perf_counter()
                try:
                    planner, _, flag = name.partition(":")
                    planned = make_plan(profile, hardware, budget, planner, params={flag: True} if flag else None,
                                        options=RunOptions(time_limit=time_limit))
                    result = planned.result
                    row[name] = result.iteration_us / profile.ideal_us if result.ok else None
                    row[f"{name}_detail"] = {"ssd_write_gib": result.bytes_ssd_write / 2**30,
                                             "host_peak_gib": result.host_peak_bytes / 2**30,
                                             "stall_s": result.stall_us / 1e6,
                                             "status": planned.plan.planner.status,
                                             "reason": None if result.ok else result.reason}
                except InfeasibleError as exc:
                    row[name], row[f"{name}_detail"] = None, {"status": "infeasible", "reason": str(exc)}
                say(f"[{w.name}, {times} kernel times] {name}: "
                    f"{'-' if row[name] is None else format(row[name], '.3f') + 'x'} "
                    f"in {time.perf_counter() - started:.1f} s")
            out.append(row)
    return out


def table(found: list[dict], planners=PLANNERS) -> str:
    head = ["workload", "kernel times", "ideal s", *planners, "bound (swap)", "bound", "G10 (published)"]
    lines = []
    for r in found:
        cell = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append([r["workload"], r["kernel_times"], f"{r['ideal_s']:.1f}", *(cell(r.get(p)) for p in planners),
                      cell(r["bound_swap_x"]), cell(r["bound_x"]), f"{r['published_g10_x']:.2f}"])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i < 2 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(head), *(fmt(line) for line in lines)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--planners", default=",".join(PLANNERS), help="comma-separated planners")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds for a searching planner [20]")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    planners = tuple(p for p in args.planners.split(",") if p)
    found = rows(planners, args.time_limit)
    print(table(found, planners))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": found}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
