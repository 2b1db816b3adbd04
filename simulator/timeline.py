"""Export a simulated timeline as a Chrome trace (Perfetto, chrome://tracing).

One track per stream (compute, cpu, h2d, d2h, ssd_read, ssd_write), ops and transfers
named by op / tensor, a GPU-memory counter, a budget counter, and one counter per link
(pcie_down, pcie_up, ssd_read_link, ssd_write_link) in GB/s that steps each time the
flows on it change, so that a user sees links being shared (R17).
"""
from __future__ import annotations

import json
from pathlib import Path

from .files import write_atomic
from .result import Result

TRACKS = ("compute", "cpu", "h2d", "d2h", "ssd_read", "ssd_write")


def chrome_trace(result: Result, title: str = "swapplan") -> dict:
    """The trace as a dict (``traceEvents`` with ts/dur in microseconds).

    Raises ValueError if the result was simulated without ``record=True``.
    """
    timeline = result.timeline
    if timeline is None:
        raise ValueError("simulate(..., record=True) is needed for a timeline")
    pid = 1
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": title}}]
    for tid, track in enumerate(TRACKS, start=1):
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": track}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    tid_of = {track: k for k, track in enumerate(TRACKS, start=1)}
    for span in timeline.spans:
        events.append({"name": span.name, "cat": span.track, "ph": "X", "pid": pid, "tid": tid_of[span.track],
                       "ts": span.start_us, "dur": span.end_us - span.start_us, "args": span.args})
    for time_us, nbytes in timeline.memory:
        events.append({"name": "GPU memory (bytes)", "ph": "C", "pid": pid, "ts": time_us,
                       "args": {"allocated": nbytes}})
    for time_us in (0.0, result.iteration_us):
        events.append({"name": "budget (bytes)", "ph": "C", "pid": pid, "ts": time_us,
                       "args": {"budget": timeline.budget_bytes}})
    used = {link for _, rates in timeline.link_rates for link, rate in rates.items() if rate}
    for time_us, rates in timeline.link_rates:
        for link, rate in rates.items():
            if link in used:
                events.append({"name": f"{link} (GB/s)", "ph": "C", "pid": pid, "ts": time_us,
                               "args": {"rate": rate / 1e9, "capacity": timeline.link_capacity[link] / 1e9}})
    summary = {k: v for k, v in result.to_dict().items() if k not in ("stall_by_op",)}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"swapplan": summary}}


def write_chrome_trace(result: Result, path: str | Path, title: str = "swapplan") -> None:
    """Write the Chrome trace JSON atomically."""
    write_atomic(path, json.dumps(chrome_trace(result, title)).encode("utf-8"))
