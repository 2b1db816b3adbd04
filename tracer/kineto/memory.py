"""Kineto import, memory: pair allocations with frees, give each a producer and a last
use, and find each op's workspace.

Part of ``tracer.kineto`` (see its docstring for what is modelled); private.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from .read import EMPTY, MemEvent, Trace, innermost

OUTSIDE = "(outside operators)"     # the namer of an allocation made outside every op


@dataclass(eq=False)
class Alloc:
    event: MemEvent
    free_ts: float | None = None      # None: not freed in the window
    producer: int | None = None       # index into ops
    last: int | None = None
    namer: str = ""
    temporary: bool = False
    tensor_id: str | None = None
    free_pos: int | None = None
    shape: list | None = None
    dtype: str | None = None
    inner: bool = False               # allocated and freed by the kernels of one split op


def within_window(ts: float, window) -> bool:
    return window is None or window[0] <= ts < window[1]


def pair_memory(trace: Trace, device, window):
    """Pair allocations with frees (same Addr, next in time) on the kernels' device.

    Pairs over the whole trace; returns the allocations made in the window (a free
    after the window counts as none), the window's frees of buffers allocated before
    it, and counts of what the window cuts.
    """
    events = [m for m in trace.memory
              if m.bytes != 0 and (m.device is None or device is None or m.device == device)]
    events.sort(key=lambda m: (m.ts, m.pos))
    with_addr = all(m.addr is not None for m in events)
    waiting: dict = {}
    pairs: list = []
    cut_frees = []
    for m in events:
        key = m.addr if with_addr else abs(m.bytes)
        if m.bytes > 0:
            alloc = Alloc(m)
            pairs.append(alloc)
            waiting.setdefault(key, []).append(alloc)
            continue
        opened = waiting.get(key)
        alloc = opened.pop() if opened else None
        if alloc is not None:
            alloc.free_ts, alloc.free_pos = m.ts, m.pos
        if within_window(m.ts, window) and (alloc is None or not within_window(alloc.event.ts, window)):
            cut_frees.append(m)
    chosen = [a for a in pairs if within_window(a.event.ts, window)]
    for alloc in chosen:
        if alloc.free_ts is not None and not within_window(alloc.free_ts, window):
            alloc.free_ts = alloc.free_pos = None
    in_window = [m for m in events if within_window(m.ts, window)]
    stats = {"paired_by": "Addr" if with_addr else "size (the trace has no Addr)",
             "events": len(in_window), "frees_before_window": len(cut_frees),
             "outlive_window": sum(1 for a in chosen if a.free_ts is None)}
    stats.update(_trace_totals(in_window))
    return chosen, cut_frees, stats


def _trace_totals(events: list) -> dict:
    """What the allocator reported: allocated before the window, and the peak."""
    totals = [m for m in events if m.total is not None]
    if not totals:
        return {}
    baseline = totals[0].total - totals[0].bytes
    peak = max(m.total for m in totals)
    return {"trace_baseline_bytes": baseline, "trace_peak_bytes": peak,
            "trace_peak_minus_baseline_bytes": peak - baseline}


def place_allocations(trace: Trace, ops: list, allocations: list) -> None:
    """Give each allocation its producer (containing op) and last use (op before free)."""
    index = {id(op.span): k for k, op in enumerate(ops)}
    starts = [op.span.start for op in ops]
    for alloc in allocations:
        m = alloc.event
        span = trace.top.get(m.thread, EMPTY).at(m.ts)
        k = index.get(id(span)) if span is not None else None
        if k is None:                               # outside every kept op: the next one
            k = min(bisect.bisect_left(starts, m.ts), len(ops) - 1)
            alloc.namer = OUTSIDE
        else:
            alloc.namer = innermost(span, m.ts).name
        alloc.producer = k
        if alloc.free_ts is None:
            alloc.last = len(ops) - 1
        else:
            alloc.last = max(k, bisect.bisect_right(starts, alloc.free_ts) - 1)
            alloc.temporary = alloc.last == k
        ops[k].allocations.append(alloc)


def set_workspaces(ops: list) -> None:
    """An op's workspace: the peak of the running sum of its temporaries."""
    for op in ops:
        steps = []
        for alloc in op.allocations:
            if alloc.temporary:
                steps.append((alloc.event.ts, alloc.event.pos, alloc.event.bytes))
                steps.append((alloc.free_ts, alloc.free_pos, -alloc.event.bytes))
        live = peak = 0
        for _, _, delta in sorted(steps):
            live += delta
            peak = max(peak, live)
        op.workspace = peak
