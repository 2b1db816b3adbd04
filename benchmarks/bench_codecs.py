"""Codecs (R40-R42) on the shipped profiles that carry measured densities, at 50% of the
peak (or the GPU's memory, when that is less): bytes moved and time/ideal for vdnn against cdma and capuchin against cswap, and
gist's footprint reduction beside the paper's 1.8x; with the planning time of each.

Run: ``.venv/bin/python benchmarks/bench_codecs.py [--hardware NAME] [PROFILE ...]``
(default: every shipped profile with densities, on a100-40gb-pcie4).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.core.api import make_plan  # noqa: E402
from simulator.errors import InfeasibleError  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402
from simulator.profile import load_profile  # noqa: E402

PAIRS = (("vdnn", "cdma"), ("capuchin", "cswap"))


def shipped_with_density() -> list[Path]:
    root = Path(__file__).resolve().parents[1] / "profiles"
    found = []
    for path in sorted(root.glob("*.json*")):
        profile = load_profile(path)
        if any(t.density is not None for t in profile.tensors):
            found.append(path)
    return found


def row(profile, hardware, budget, name, params=None, label=None):
    started = time.perf_counter()
    try:
        planned = make_plan(profile, hardware, budget, name, params)
    except InfeasibleError as exc:
        return f"{name:>9}: below its floor ({exc})"
    seconds = time.perf_counter() - started
    r = planned.result
    moved = (r.bytes_h2d + r.bytes_d2h) / 2**30
    state = "ok" if r.ok else ("invalid" if not r.valid else "infeasible")
    notes = planned.plan.planner.notes
    extra = ""
    if "compressed_tensors" in notes:
        extra = f"  compressed {notes['compressed_tensors']} tensors"
    if "footprint_reduction" in notes:
        extra = f"  footprint reduction {notes['footprint_reduction']}x (paper 1.8x), encoded {notes['encoded']}"
    return (f"{label or name:>9}: {state:<10} time/ideal {r.iteration_us / r.ideal_us:6.3f}  moved {moved:7.2f} GiB  "
            f"codec {r.codec_us / 1e3:8.1f} ms  plan {seconds:6.1f} s{extra}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="*", help="profiles [default: the shipped ones with densities]")
    parser.add_argument("--hardware", default="a100-40gb-pcie4")
    args = parser.parse_args(argv)
    hardware = load_hardware(args.hardware)
    paths = [Path(a) for a in args.profiles] or shipped_with_density()
    for path in paths:
        profile = load_profile(path)
        dens = [t.density for t in profile.tensors if t.density is not None and t.kind == "activation"]
        budget = min(profile.peak_bytes // 2, hardware.gpu.memory_bytes)   # as `plan --budget 50%` does
        print(f"{profile.name} on {hardware.name} at 50% of its peak (capped at the GPU's memory: "
              f"{budget / 2**30:.2f} GiB); activation "
              f"density median {statistics.median(dens) if dens else 1:.3f} over {len(dens)} tensors", flush=True)
        for plain, compressed in PAIRS:
            print("  " + row(profile, hardware, budget, plain), flush=True)
            print("  " + row(profile, hardware, budget, compressed), flush=True)
        print("  " + row(profile, hardware, budget, "gist"), flush=True)
        print("  " + row(profile, hardware, budget, "gist", {"fallback": "off"}, "gist pure"), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
