"""Loading + validating a profile of about 10,000 ops (target: under 1 s).

Run: ``.venv/bin/python benchmarks/bench_profile.py``. Prints median and min of
repeated loads of a synthetic GPT-like profile (JSON and gzipped JSON).
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.profile import load_profile, save_profile  # noqa: E402
from tracer.synthetic import synthesize  # noqa: E402


def time_it(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main(repeat: int = 7) -> None:
    profile = synthesize("transformer", layers=330, batch=8, seq=512)
    with tempfile.TemporaryDirectory() as folder:
        for suffix in (".json", ".json.gz"):
            path = Path(folder) / f"big{suffix}"
            save_profile(profile, path)
            size = path.stat().st_size
            times = time_it(lambda: load_profile(path), repeat)
            print(f"load+validate {len(profile.ops):,} ops / {len(profile.tensors):,} tensors "
                  f"({suffix}, {size / 1e6:.1f} MB): median {statistics.median(times) * 1e3:.0f} ms, "
                  f"min {min(times) * 1e3:.0f} ms over {repeat} runs")


if __name__ == "__main__":
    main()
