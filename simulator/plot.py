"""A PNG of GPU memory over one simulated iteration: the budget, transfers, phases."""
from __future__ import annotations

import io
from pathlib import Path

from .files import write_atomic
from .result import Result

PHASE_COLOURS = {"forward": "#dbe9f6", "backward": "#fde0c5", "optimizer": "#d9f0d3", "other": "#eeeeee"}
LANE_COLOURS = {"cpu": "#2ca02c", "h2d": "#1f77b4", "d2h": "#d62728", "ssd_read": "#9467bd", "ssd_write": "#8c564b"}


def plot_memory(result: Result, path: str | Path, title: str = "") -> None:
    """Draw memory (GiB) against time (ms) with the budget line, shaded phases, and a
    lane per link below showing when each transfer ran. Written atomically.

    Raises ValueError if the result was simulated without ``record=True``.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = result.timeline
    if timeline is None:
        raise ValueError("simulate(..., record=True) is needed for a plot")
    gib = float(2**30)
    end_ms = max(result.iteration_us, 1e-9) / 1e3
    fig, (ax, lanes) = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True,
                                    gridspec_kw={"height_ratios": [4, 1.3]})
    seen = set()
    for phase, start, stop in timeline.phases:
        ax.axvspan(start / 1e3, stop / 1e3, color=PHASE_COLOURS.get(phase, "#eeeeee"), lw=0,
                   label=phase if phase not in seen else None)
        seen.add(phase)
    times = [t / 1e3 for t, _ in timeline.memory] + [end_ms]
    values = [b / gib for _, b in timeline.memory]
    values.append(values[-1] if values else 0.0)
    ax.step(times, values, where="post", color="black", lw=1.2, label="allocated")
    ax.axhline(timeline.budget_bytes / gib, color="#d62728", ls="--", lw=1.2, label="budget")
    ax.set_ylabel("GPU memory (GiB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", fontsize=8, ncols=3)
    status = "ok" if result.ok else ("invalid" if not result.valid else "infeasible")
    ax.set_title(title or f"iteration {result.iteration_us / 1e3:.2f} ms, overhead "
                 f"{result.overhead * 100:.1f}%, peak {result.peak_bytes / gib:.2f} GiB ({status})", fontsize=10)
    names = list(LANE_COLOURS)
    for row, lane in enumerate(names):
        bars = [(s.start_us / 1e3, (s.end_us - s.start_us) / 1e3) for s in timeline.spans if s.track == lane]
        if bars:
            lanes.broken_barh(bars, (row - 0.4, 0.8), color=LANE_COLOURS[lane])
    lanes.set_yticks(range(len(names)), names, fontsize=8)
    lanes.set_ylim(-0.6, len(names) - 0.4)
    lanes.invert_yaxis()
    lanes.set_xlabel("time (ms)")
    lanes.set_xlim(0, end_ms)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
