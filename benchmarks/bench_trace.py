"""Tracing GPT-2 small (batch 8, sequence 512) in a fresh process (targets: <= 15 s, <= 500 MB).

Run: ``.venv/bin/python benchmarks/bench_trace.py [MODEL] [BATCH] [SEQ] [RUNS]``.
Each run is a new Python process doing what ``swapplan trace`` does: import torch
and transformers, build the model, trace one training step on fake tensors and
build the validated Profile. Prints the median and min wall time over the runs,
the largest max RSS of them (from ``wait4``), and the profile's size and peak.
Needs the ``trace`` extra (torch); without it, says so and exits 0.
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import sys
from tracer.torch_trace import trace
p = trace(sys.argv[1], batch=int(sys.argv[2]), seq=int(sys.argv[3]))
print(f"{len(p.ops)} ops, {len(p.tensors)} tensors, peak {p.peak_bytes / 2**30:.2f} GiB, "
      f"ideal {p.ideal_us / 1e3:.1f} ms")
"""


def run_once(model: str, batch: int, seq: int) -> tuple[float, float, str]:
    """Wall seconds, max RSS in MB and the child's summary line of one fresh-process trace."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", CHILD, model, str(batch), str(seq)],
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


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "gpt2", *(int(a) for a in args[1:4]))
