"""Kineto import, step 3b: split a top-level op that ran several GPU kernels with memory
events between their launches into one op per kernel (a compiled region is one such op).

The CPU side orders everything: each GPU event's launch (the ``cuda_runtime`` event of
its correlation) and the ``[memory]`` events are on the same CPU clock. A piece per GPU
event, in launch order; an allocation made before launch j (after launch j-1) is made for
kernel j, a free made after launch j (before launch j+1) follows kernel j. So piece j
holds exactly what is allocated at the moment of launch j, and its workspace is what the
trace holds beyond that between launches j-1 and j. Part of ``tracer.kineto`` (see its
docstring for what is modelled); private.
"""
from __future__ import annotations

import bisect

from .iteration import Iteration, TraceOp
from .memory import OUTSIDE, set_workspaces


def op_starts(ops: list) -> list:
    """Each op's start for the last-use rule, made non-decreasing (ops of two threads,
    or a piece launched after the next op started on another thread, may overlap)."""
    starts, latest = [], float("-inf")
    for op in ops:
        latest = max(latest, op.start)
        starts.append(latest)
    return starts


def split_at_kernels(iteration: Iteration, flow) -> None:
    """Replace each op that holds several kernels and memory events between their
    launches by its kernel pieces; place the allocations, workspaces and dataflow anew."""
    old = iteration.ops
    frees = sorted([a.free_ts for a in iteration.allocations if a.free_ts is not None]
                   + [m.ts for m in iteration.pre_frees])
    times = [_launch_times(op) if _interleaved(op, frees) else None for op in old]
    if not any(t is not None for t in times):
        return
    ops, first = [], []
    for op, launch in zip(old, times):
        first.append(len(ops))
        ops.extend(_pieces(op) if launch is not None else [op])
    for op in ops:
        op.allocations = []
    starts = op_starts(ops)
    for alloc in iteration.allocations:
        k = alloc.producer
        _replace(alloc, first[k], times[k], starts, len(ops))
        ops[alloc.producer].allocations.append(alloc)
    for k, op in enumerate(old):
        if times[k] is None:
            set_workspaces([op])
        else:
            _inner_uses(ops, first[k], len(times[k]))
    _gap_workspaces(ops, old, first, times, iteration.allocations)
    if flow is not None:
        _remap_flow(flow, first, times)
    split = [k for k, t in enumerate(times) if t is not None]
    iteration.stats["split"] = {"ops": len(split), "pieces": sum(len(times[k]) for k in split),
                                "kept": len(old),
                                "with_gpu_work": sum(1 for op in old if op.gpu_events)}
    iteration.ops = ops


def _launch_times(op: TraceOp) -> list:
    """The op's GPU events' launch times, in launch order (events sorted in place)."""
    op.launches.sort(key=lambda item: (item[0], item[1].pos))
    return [ts for ts, _ in op.launches]


def _interleaved(op: TraceOp, frees: list) -> bool:
    """Several GPU events, all with a known launch, and a memory event between the
    first launch and the last (an allocation of the op, or any free, by time)."""
    if op.unlaunched or len(op.launches) < 2:
        return False
    launched = [ts for ts, _ in op.launches]
    low, high = min(launched), max(launched)
    if any(low < a.event.ts <= high for a in op.allocations if a.namer != OUTSIDE):
        return True
    k = bisect.bisect_left(frees, low)
    return k < len(frees) and frees[k] < high


def _pieces(op: TraceOp) -> list:
    """One op per GPU event, named ``<top-level op>/<kernel>``, timed by the event."""
    return [TraceOp(op.span, phase=op.phase, time_us=g.dur, gpu_events=1,
                label=f"{op.span.name}/{g.name or g.kind}", begin=ts)
            for ts, g in op.launches]


def _piece_of(ts: float, launches: list, free: bool) -> int:
    """The piece a memory event inside a split op belongs to: an allocation to the next
    kernel launched (at or after it), a free to the last one launched at or before it."""
    k = bisect.bisect_right(launches, ts) if free else bisect.bisect_left(launches, ts)
    return max(0, min(k, len(launches) - 1))


def _replace(alloc, first: int, launches, starts: list, count: int) -> None:
    """The allocation's producer and last use in the new op indices."""
    if launches is None or alloc.namer == OUTSIDE:
        alloc.producer = first
    else:
        alloc.producer = first + _piece_of(alloc.event.ts, launches, free=False)
    if alloc.free_ts is None:
        alloc.last = count - 1
    else:
        alloc.last = max(alloc.producer, bisect.bisect_right(starts, alloc.free_ts) - 1)
        alloc.temporary = alloc.last == alloc.producer


def _inner_uses(ops: list, first: int, count: int) -> None:
    """Which kernel of an op reads a buffer it allocated is unknown (and no runtime can
    move a buffer between the kernels of one op): each later piece uses it while it is
    allocated. One the op also frees is internal (a workspace, a compiled intermediate)."""
    end = first + count
    for producer in range(first, end):
        for alloc in ops[producer].allocations:
            if alloc.temporary:
                continue
            alloc.inner = alloc.free_ts is not None and alloc.last < end
            for piece in range(producer + 1, min(alloc.last, end - 1) + 1):
                ops[piece].inner.append(alloc)


def _live_steps(allocations: list):
    """The window's memory events in time order: (ts, is_free, bytes live after it)."""
    steps = []
    for alloc in allocations:
        steps.append((alloc.event.ts, alloc.event.pos, False, alloc.event.bytes))
        if alloc.free_ts is not None:
            steps.append((alloc.free_ts, alloc.free_pos, True, -alloc.event.bytes))
    steps.sort(key=lambda step: (step[0], step[1]))
    live, out = 0, []
    for ts, _, free, delta in steps:
        live += delta
        out.append((ts, free, live))
    return out


def _held(ops: list, allocations: list) -> list:
    """Bytes of the tensors (not temporaries) each op holds, as the profile counts them."""
    delta = [0] * (len(ops) + 1)
    for alloc in allocations:
        if not alloc.temporary:
            delta[alloc.producer] += alloc.event.bytes
            delta[alloc.last + 1] -= alloc.event.bytes
    held, running = [], 0
    for step in delta[:-1]:
        running += step
        held.append(running)
    return held


def _gap_workspaces(ops: list, old: list, first: list, times: list, allocations: list) -> None:
    """A piece's workspace: the most the trace holds between the previous launch and
    its own (for the last, to the op's end) beyond the tensors the piece holds."""
    steps = _live_steps(allocations)
    stamps = [ts for ts, _, _ in steps]
    held = _held(ops, allocations)
    for k, launches in enumerate(times):
        if launches is None:
            continue
        span = old[k].span
        most = [None] * len(launches)
        for ts, free, live in steps[bisect.bisect_left(stamps, span.start):
                                    bisect.bisect_right(stamps, span.end)]:
            j = _piece_of(ts, launches, free)
            most[j] = live if most[j] is None else max(most[j], live)
        for j, peak in enumerate(most):
            piece = ops[first[k] + j]
            piece.workspace = max(0, peak - held[first[k] + j]) if peak is not None else 0


def _remap_flow(flow, first: list, times: list) -> None:
    """The ET's reads and updates in the new indices. An op's kernels are not told
    apart by the ET, so each piece of a split op reads (updates) what the op reads
    while it is allocated: lifetimes stay the measured ones."""
    for bucket in (flow.reads, flow.updates):
        remapped = {}
        for k, targets in sorted(bucket.items()):
            count = len(times[k]) if times[k] is not None else 1
            for piece in range(first[k], first[k] + count):
                kept = {key: t for key, t in targets.items() if _usable(t, piece)}
                if kept:
                    remapped[piece] = kept
        bucket.clear()
        bucket.update(remapped)


def _usable(target, piece: int) -> bool:
    """A persistent tensor always; a window tensor when allocated during the piece."""
    if isinstance(target, dict):
        return True
    return not target.temporary and target.producer < piece <= target.last
