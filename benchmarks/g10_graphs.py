"""Unified memory on G10's own operator graphs: swapplan's ``uvm`` and ``deepum`` on the
graphs and measured kernel times G10's simulator runs, beside G10's published Base UVM and
DeepUM+ (MICRO'23, Fig. 11).

benchmarks/g10_uvm.py traces G10's five workloads with swapplan's tracer; this script
takes G10's own instead, so that what differs is the memory model alone. G10's artifact
(github.com/platformxlab/G10, Apache 2.0) is not shipped: build its simulator (``gpg``, in
``src``) and run each Base UVM config until it has written its analysis dumps, e.g.

    cd G10/src && ./gpg configs/BERT_Base/256-sim_lru.config < ../frontend/Nets/BERT_Base.txt

(the dumps are written before the simulation starts; the run may be stopped then), then

    .venv/bin/python benchmarks/g10_graphs.py G10/results

reads ``<Model>/<batch>-lru/statistics/kernels.config`` of each workload: every kernel in
G10's order with its measured time (cycles at 1.2 GHz) and its input and output tensors
(bytes, global or not). A global tensor is a weight; any other tensor read before a kernel
writes it is an input (both persistent); a write of a tensor that exists is an in-place update.
Kernels from the first backward one on are the backward pass, apply-grad kernels the
optimizer step.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

CLOCK_MHZ = 1200.0   # G10's kernel times are cycles at 1.2 GHz
# (model directory, batch, published Base UVM, published DeepUM+): G10 Fig. 11
WORKLOADS = (("BERT_Base", 256, 2.70, 1.26), ("VIT", 1280, 6.62, 2.03), ("Inceptionv3", 1536, 4.71, 1.49),
             ("ResNet152", 1280, 4.16, 1.17), ("SENet154", 1024, 5.50, 1.45))
KERNEL = re.compile(r"Kernel ID: (\d+), Name: (\S+)")
TENSOR = re.compile(r"(tensor\d+) Is weight \(global\)\?: (\d), Size in byte: (\d+)")


def read_kernels(path: Path) -> list[dict]:
    """The kernels of a ``kernels.config`` dump, in order: id, name, cycles, inputs and
    outputs as (tensor, global, bytes)."""
    kernels, side = [], None
    for line in path.read_text().splitlines():
        if (found := KERNEL.match(line)) is not None:
            kernels.append({"id": int(found.group(1)), "name": found.group(2), "in": [], "out": []})
        elif line.startswith("Execution Time:"):
            kernels[-1]["cycles"] = int(line.split(":")[1])
        elif line.startswith(("Input Tensors", "Output Tensors")):
            side = "in" if line.startswith("Input") else "out"
        elif (found := TENSOR.match(line)) is not None:
            kernels[-1][side].append((found.group(1), found.group(2) == "1", int(found.group(3))))
    return kernels


def to_profile(kernels: list[dict], name: str):
    """A swapplan profile of G10's kernels (see the module docstring for the mapping)."""
    from simulator.profile import FORMAT, profile_from_dict
    sizes: dict[str, tuple[int, str]] = {}   # tensor -> (bytes, kind)
    seen: set[str] = set()
    ops, backward = [], False
    for k in kernels:
        backward = backward or "Backward" in k["name"] or k["name"].startswith("makeLoss")
        phase = "optimizer" if "Apply_Grad" in k["name"] else ("backward" if backward else "forward")
        inputs, outputs, updates = [], [], []
        for tid, is_global, nbytes in k["in"]:
            if tid not in seen:   # read before any write: there from the start
                seen.add(tid)
                sizes[tid] = (nbytes, "weight" if is_global else "input")
            inputs.append(tid)
        for tid, is_global, nbytes in k["out"]:
            if tid in seen or is_global:
                sizes.setdefault(tid, (nbytes, "weight"))
                seen.add(tid)
                updates.append(tid)
            else:
                sizes[tid] = (nbytes, "activation")
                seen.add(tid)
                outputs.append(tid)
        op = {"id": f"k{k['id']}", "name": k["name"], "phase": phase, "time_us": k["cycles"] / CLOCK_MHZ,
              "inputs": [t for t in dict.fromkeys(inputs) if t not in updates],
              "outputs": list(dict.fromkeys(outputs))}
        if updates:
            op["updates"] = list(dict.fromkeys(updates))
        ops.append(op)
    tensors = [{"id": tid, "bytes": nbytes, "kind": kind} for tid, (nbytes, kind) in sizes.items()]
    return profile_from_dict({"format": FORMAT, "name": name, "source": {"kind": "synthetic"},
                              "tensors": tensors, "ops": ops})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="G10's results directory (with <Model>/<batch>-lru/statistics)")
    parser.add_argument("--planners", default="uvm,deepum", help="comma-separated planners [uvm,deepum]")
    args = parser.parse_args(argv)
    from g10_uvm import HARDWARE
    from planner.core.api import make_plan
    from simulator.hardware import load_hardware
    hardware = load_hardware(str(HARDWARE))
    planners = [p for p in args.planners.split(",") if p]
    print("workload  peak GiB  ideal s  " + "  ".join(planners) + "  Base UVM  DeepUM+")
    for model, batch, base_uvm, deepum_plus in WORKLOADS:
        dump = Path(args.results) / model / f"{batch}-lru" / "statistics" / "kernels.config"
        if not dump.is_file():
            print(f"{model} b{batch}: no {dump}", file=sys.stderr)
            continue
        profile = to_profile(read_kernels(dump), f"g10-{model.lower()}-b{batch}")
        ratios = []
        for name in planners:
            result = make_plan(profile, hardware, hardware.gpu.memory_bytes, name).result
            ratios.append(f"{result.iteration_us / profile.ideal_us:.3f}" if result.ok else "-")
        print(f"{model} b{batch}  {profile.peak_bytes / 2**30:.1f}  {profile.ideal_us / 1e6:.1f}  "
              + "  ".join(ratios) + f"  {base_uvm:.2f}  {deepum_plus:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
