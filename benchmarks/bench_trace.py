"""Tracing GPT-2 small (batch 8, sequence 512) in a fresh process (targets: <= 15 s, <= 500 MB).

Run: ``.venv/bin/python benchmarks/bench_trace.py [MODEL] [BATCH] [SEQ] [RUNS]``.
Each run is a new Python process doing what ``swapplan trace`` does: import torch
and transformers, build the model, trace one training step on fake tensors and
build the validated Profile. Prints the median and min wall time over the runs,
the largest max RSS of them (from ``wait4``), and the profile's size and peak.
Needs the ``trace`` extra (torch); without it, says so and exits 0.

``bench_trace.py --density [RUNS]``: what ``--density`` (tensor densities measured on a
real CPU step, tracer.density) costs (target: at most 2x the trace without it), at the
shipped profiles' sizes with the default density step: ResNet-50 (batch 1024, measured
at batch 4) and GPT-2 (batch 48, sequence 1024, measured at batch 2, sequence 128), each
traced with and without it in alternating fresh processes; prints the medians and their
ratio, and one run of GPT-2 measured at its full sequence (the shipped profile's setting).
"""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys
from tracer.pytorch.trace import trace
p = trace(sys.argv[1], batch=int(sys.argv[2]), seq=int(sys.argv[3]), **json.loads(sys.argv[4]))
print(f"{len(p.ops)} ops, {len(p.tensors)} tensors, peak {p.peak_bytes / 2**30:.2f} GiB, "
      f"ideal {p.ideal_us / 1e3:.1f} ms")
"""

# (model, batch, seq, trace options with --density) for ``--density``: the shipped sizes
DENSITY_CASES = (
    ("resnet50", 1024, 224, {"density": True}),
    ("gpt2", 48, 1024, {"density": True}),
)
DENSITY_FULL = ("gpt2", 48, 1024, {"density": True, "density_batch": 2, "density_seq": 1024})   # make_profiles


def run_once(model: str, batch: int, seq: int, options: dict | None = None) -> tuple[float, float, str]:
    """Wall seconds, max RSS in MB and the child's summary line of one fresh-process trace
    (``options``: more keyword arguments of ``trace``)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", CHILD, model, str(batch), str(seq),
                                  json.dumps(options or {})],
                                 cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, errors = out.read().strip(), err.read().strip()
    if child.returncode != 0:
        raise SystemExit(f"trace failed: {errors.splitlines()[-1] if errors else child.returncode}")
    return wall, usage.ru_maxrss / 1024, text


def main(model: str = "gpt2", batch: int = 8, seq: int = 512, runs: int = 3) -> None:
    if importlib.util.find_spec("torch") is None:
        print("bench_trace: torch is not installed (pip install 'swapplan[trace]'); skipped")
        return
    walls, rss, summary = [], [], ""
    for _ in range(runs):
        wall, mb, summary = run_once(model, batch, seq)
        walls.append(wall)
        rss.append(mb)
    print(f"trace {model} batch {batch} seq {seq}: {summary}")
    print(f"whole process: median {statistics.median(walls):.1f} s, min {min(walls):.1f} s "
          f"over {runs} runs (target <= 15 s); max RSS {max(rss):.0f} MB (target <= 500 MB)")


def density_overhead(runs: int = 3) -> None:
    """Trace time with and without ``density=True`` (alternating fresh processes): medians and ratio."""
    if importlib.util.find_spec("torch") is None:
        print("bench_trace: torch is not installed (pip install 'swapplan[trace]'); skipped")
        return
    for model, batch, seq, options in DENSITY_CASES:
        plain, dense = [], []
        for _ in range(runs):
            plain.append(run_once(model, batch, seq)[0])
            dense.append(run_once(model, batch, seq, options)[0])
        ratio = statistics.median(dense) / statistics.median(plain)
        print(f"trace {model} batch {batch} seq {seq}: median {statistics.median(plain):.1f} s; with --density "
              f"{statistics.median(dense):.1f} s: {ratio:.2f}x over {runs} runs each (target <= 2x)")
    model, batch, seq, options = DENSITY_FULL
    wall = run_once(model, batch, seq, options)[0]
    print(f"trace {model} batch {batch} seq {seq} with --density measured at batch {options['density_batch']}, "
          f"seq {options['density_seq']} (the shipped profile's setting): {wall:.1f} s (one run)")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--density":
        density_overhead(*(int(a) for a in args[1:2]))
    else:
        main(args[0] if args else "gpt2", *(int(a) for a in args[1:4]))
