"""Run every benchmark script in this folder and print their figures."""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"== {script.name}", flush=True)
        runpy.run_path(str(script), run_name="__main__")
    sys.exit(0)
