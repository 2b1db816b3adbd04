"""Simulator speed: a plan with ~1,000 transfers on a ~1,300-op transformer profile
(target: <= 5 ms median), and how the time grows with ops + actions up to 100,000 ops.

Run: ``.venv/bin/python benchmarks/bench_engine.py [--quick]``.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.engine import simulate  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402
from tests.plans import swap_plan, swappable  # noqa: E402
from tracer.synthetic import synthesize  # noqa: E402


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def case(layers: int, transfers: int, repeat: int) -> None:
    profile = synthesize("transformer", layers=layers, batch=8, seq=512)
    hw = load_hardware("a100-40gb-pcie4")
    plan = swap_plan(profile, swappable(profile)[: transfers // 2], lead=2)
    result = simulate(profile, plan, hw)
    assert result.valid, result.reason
    ms = median_ms(lambda: simulate(profile, plan, hw), repeat)
    n_actions = len(plan.actions)
    print(f"{len(profile.ops):>7,} ops {n_actions:>7,} transfers: median {ms:8.2f} ms "
          f"({ms * 1e3 / (len(profile.ops) + n_actions):.2f} us per op+action)", flush=True)


def main() -> None:
    quick = "--quick" in sys.argv
    print("target case (~1,300 ops, ~1,000 transfers):")
    case(layers=40, transfers=1000, repeat=31)
    print("scaling:")
    for layers in ((12, 120, 600) if quick else (12, 120, 1200, 3000)):
        case(layers=layers, transfers=layers * 25, repeat=5 if layers < 1000 else 3)


if __name__ == "__main__":
    main()
