"""Kineto import, step 2: choose the iteration (window) and keep its ops, with their GPU
time, phases and memory.

Part of ``tracer.kineto`` (see its docstring for what is modelled); private.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from simulator.errors import InputError

from .memory import pair_memory, place_allocations, set_workspaces, within_window
from .read import EMPTY, GpuEvent, Span, Trace, thread_order, top_of


STEP_PATTERN = re.compile(r"ProfilerStep#(\d+)$")
_BACKWARD_NAME = re.compile(r"(^autograd::engine::evaluate_function)|(Backward\d*$)")
_EVALUATE = "autograd::engine::evaluate_function"


@dataclass(eq=False)
class TraceOp:
    span: Span
    phase: str = "other"
    time_us: float = 0.0
    gpu_events: int = 0
    allocations: list = field(default_factory=list)   # Alloc produced here
    workspace: int = 0
    launches: list = field(default_factory=list)      # (launch ts, GpuEvent), known launches
    unlaunched: int = 0         # GPU events found by External id: launch time unknown
    label: str | None = None    # a kernel piece's name (split.py)
    begin: float | None = None  # a kernel piece's start: its launch
    inner: list = field(default_factory=list)   # a piece's tensors of its own op, allocated earlier

    @property
    def name(self) -> str:
        return self.label if self.label is not None else self.span.name

    @property
    def start(self) -> float:
        return self.begin if self.begin is not None else self.span.start


@dataclass
class Iteration:
    step: int | None
    window: tuple | None          # (start, end) or None for the whole trace
    device: int | None
    ops: list                     # kept TraceOp, in execution order
    allocations: list             # Alloc made in the window, in time order
    stats: dict
    pre_frees: list = field(default_factory=list)   # MemEvent frees of pre-window buffers


def build_iteration(trace: Trace, step: int | None) -> Iteration:
    """Choose the iteration; keep its ops with their GPU time, phases and memory."""
    device = _main_device(trace)
    steps = _steps(trace)
    step, window = _choose_window(trace, steps, step, device)
    candidates = _ops_in_window(trace, window)
    gpu_stats = _attach_gpu(trace, candidates, device)
    allocations, pre_frees, mem_stats = pair_memory(trace, device, window)
    ops = _keep_ops(trace, candidates, allocations, step)
    _set_phases(trace, ops)
    place_allocations(trace, ops, allocations)
    set_workspaces(ops)
    stats = {"gpu": gpu_stats, "memory": mem_stats, "top_level_ops": len(candidates)}
    return Iteration(step, window, device, ops, allocations, stats, pre_frees)


def _main_device(trace: Trace) -> int | None:
    """The GPU that ran most kernel time (its memory events are the ones modelled)."""
    busy: dict = {}
    for g in trace.gpu:
        busy[g.device] = busy.get(g.device, 0.0) + g.dur
    return max(sorted(busy, key=lambda d: (d is None, d)), key=busy.__getitem__)


def _steps(trace: Trace) -> dict:
    steps: dict = {}
    for span in trace.spans:
        match = STEP_PATTERN.match(span.name)
        if match:
            steps.setdefault(int(match.group(1)), span)
    return steps


def _choose_window(trace: Trace, steps: dict, step: int | None, device):
    """The ProfilerStep#N span to import: asked for, or the last complete one."""
    file = trace.file
    if not steps:
        if step is not None:
            raise InputError(file, "iteration", f"no ProfilerStep#{step}: the trace has no "
                             "ProfilerStep#N spans (it is one iteration; leave iteration out)")
        return None, None
    if step is not None:
        if step not in steps:
            raise InputError(file, "iteration", f"no ProfilerStep#{step} in the trace "
                             f"(it has {_list_steps(steps)})")
        return step, (steps[step].start, steps[step].end)
    backward = any(_BACKWARD_NAME.search(s.name) for s in trace.spans if not s.annotation)
    launched = _launch_counts(trace, device)
    complete = [n for n in sorted(steps) if _is_complete(trace, steps[n], launched, backward)]
    if not complete:
        raise InputError(file, "iteration", "no ProfilerStep#N span launches GPU work "
                         f"(steps {_list_steps(steps)})")
    chosen = complete[-1]
    return chosen, (steps[chosen].start, steps[chosen].end)


def _list_steps(steps: dict) -> str:
    numbers = sorted(steps)
    shown = ", ".join(str(n) for n in numbers[:8])
    return shown + (f", ... {numbers[-1]}" if len(numbers) > 8 else "")


def _launch_counts(trace: Trace, device) -> dict:
    """GPU events launched by each top-level operator, ``id(span) -> count``."""
    counts: dict = {}
    for g in trace.gpu:
        if device is None or g.device is None or g.device == device:
            span, _ = _launcher(trace, g)
            if span is not None:
                top = id(top_of(span))
                counts[top] = counts.get(top, 0) + 1
    return counts


def _is_complete(trace: Trace, step: Span, launched: dict, backward: bool) -> bool:
    """A step launched GPU work, and ran a backward pass if the trace has one anywhere."""
    ops = _ops_in_window(trace, (step.start, step.end))
    if backward and not any(_BACKWARD_NAME.search(op.span.name) for op in ops):
        return False
    return any(launched.get(id(op.span)) for op in ops)


def _ops_in_window(trace: Trace, window) -> list:
    """The top-level operators that start in the window, in merged time order."""
    spans = [s for top in trace.top.values() for s in top.spans if within_window(s.start, window)]
    spans.sort(key=lambda s: (s.start, thread_order(s.thread), s.pos))
    return [TraceOp(s) for s in spans]


def _attach_gpu(trace: Trace, ops: list, device) -> dict:
    """Sum each op's GPU time (kernels, memcpys, memsets launched on its behalf)."""
    index = {id(op.span): op for op in ops}
    counts = {"kernels": 0, "memcpys": 0, "memsets": 0, "time_us": 0.0,
              "unattributed_in_trace": 0, "by": {"correlation": 0, "external_id": 0}}
    for g in sorted(trace.gpu, key=lambda g: g.pos):
        if device is not None and g.device is not None and g.device != device:
            continue
        span, how = _launcher(trace, g)
        if span is None:
            counts["unattributed_in_trace"] += 1
            continue
        op = index.get(id(top_of(span)))
        if op is None:
            continue                      # another iteration
        counts[g.kind + "s"] += 1
        counts["time_us"] += g.dur
        counts["by"][how] += 1
        op.time_us += g.dur
        op.gpu_events += 1
        if how == "correlation":
            op.launches.append((trace.runtimes[g.correlation][1], g))
        else:
            op.unlaunched += 1
    counts["time_us"] = round(counts["time_us"], 3)
    return counts


def _launcher(trace: Trace, g: GpuEvent):
    """The operator that launched a GPU event, and how it was found."""
    launch = trace.runtimes.get(g.correlation) if g.correlation is not None else None
    if launch is not None:
        thread, ts = launch
        span = trace.top.get(thread, EMPTY).at(ts)
        return (span, "correlation") if span is not None else (None, None)
    if g.external is not None:
        span = trace.by_external.get(g.external)
        if span is not None:
            return span, "external_id"
    return None, None


def _keep_ops(trace: Trace, candidates: list, allocations: list, step) -> list:
    """Keep the ops with GPU work or device allocations in their span."""
    index = {id(op.span): op for op in candidates}
    holders = set()
    for alloc in allocations:
        span = trace.top.get(alloc.event.thread, EMPTY).at(alloc.event.ts)
        if span is not None and id(span) in index:
            holders.add(id(span))
    ops = [op for op in candidates if op.gpu_events or id(op.span) in holders]
    if not any(op.gpu_events for op in ops):
        where = f"ProfilerStep#{step}" if step is not None else "traceEvents"
        raise InputError(trace.file, where, "no GPU kernels launched by the operators "
                                            "of this iteration")
    return ops


def _set_phases(trace: Trace, ops: list) -> None:
    """forward / backward / optimizer / other, from threads, names and annotations.

    The autograd thread is one whose first op runs a backward node; when the backward
    pass runs on the main thread, only its ops' names mark it.
    """
    first: dict = {}
    for op in ops:
        first.setdefault(op.span.thread, op)
    autograd = {t for t, op in first.items() if op.span.name.startswith(_EVALUATE)}
    spans = [s for s in trace.spans if s.annotation and s.name.startswith("Optimizer.")]
    backward_start = None
    for op in ops:
        if op.span.thread in autograd or _BACKWARD_NAME.search(op.span.name):
            op.phase = "backward"
            if backward_start is None:
                backward_start = op.span.start
    for op in ops:
        if op.phase == "backward":
            continue
        around = [s for s in spans if s.thread == op.span.thread
                  and s.start <= op.span.start < s.end]
        if any(s.name.startswith("Optimizer.step") for s in around):
            op.phase = "optimizer"
        elif around or (backward_start is not None and op.span.start >= backward_start):
            op.phase = "other"
        else:
            op.phase = "forward"
