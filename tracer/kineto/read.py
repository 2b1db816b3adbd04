"""Kineto import, step 1: read the trace: operators, GPU events, CUDA [memory] events,
nested by thread. Also the small field checkers the other steps share.

Part of ``tracer.kineto`` (see its docstring for what is modelled); private.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from simulator.errors import InputError


_OP_CATS = frozenset({"cpu_op", "operator"})
_ANNOTATION_CATS = frozenset({"user_annotation"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver"})
_GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
             "gpu_memset": "memset", "memset": "memset"}
_ANNOTATION_PREFIXES = ("ProfilerStep#", "Optimizer.", "##")
_CUDA_DEVICE_TYPE = 1


@dataclass(eq=False)
class Span:
    """A CPU operator or annotation (a complete event on a CPU thread)."""
    pos: int
    name: str
    thread: tuple
    start: float
    end: float
    args: dict
    annotation: bool
    parent: "Span | None" = None
    children: list = field(default_factory=list)


@dataclass(eq=False)
class GpuEvent:
    pos: int
    kind: str            # kernel, memcpy, memset
    dur: float
    device: int | None
    correlation: int | None
    external: int | None
    name: str = ""       # the kernel's name (a piece's name when its op is split)


@dataclass(eq=False)
class MemEvent:
    pos: int
    thread: tuple
    ts: float
    device: int | None
    addr: int | None
    bytes: int
    total: int | None    # Total Allocated after the event


@dataclass
class Trace:
    file: str
    spans: list
    runtimes: dict       # correlation -> (thread, ts)
    gpu: list
    memory: list         # CUDA [memory] events, any device
    devices: dict        # device id -> name
    meta: dict
    top: dict = field(default_factory=dict)      # thread -> _Timeline of top-level ops
    by_external: dict = field(default_factory=dict)


class _Timeline:
    """Non-overlapping spans of one thread, sorted by start, searchable by time."""

    def __init__(self, spans: list):
        self.spans = spans
        self.starts = [s.start for s in spans]

    def at(self, ts: float) -> "Span | None":
        """The span that contains ``ts`` (ends inclusive; the later one on a tie)."""
        k = bisect.bisect_right(self.starts, ts) - 1
        if k >= 0 and self.spans[k].start <= ts <= self.spans[k].end:
            return self.spans[k]
        return None


EMPTY = _Timeline([])


def read_trace(document, file: str) -> Trace:
    """Parse the events a profile needs; check their fields; nest the operators."""
    if isinstance(document, list):
        document = {"traceEvents": document}
    if not isinstance(document, dict):
        raise InputError(file, "", "expected a JSON object with traceEvents "
                                   "(a PyTorch profiler trace)")
    events = document.get("traceEvents")
    if events is None:
        raise InputError(file, "traceEvents", "missing: not a PyTorch profiler (Kineto) trace")
    if not isinstance(events, list):
        raise InputError(file, "traceEvents", "expected a list of events")
    trace = Trace(file=file, spans=[], runtimes={}, gpu=[], memory=[],
                   devices=_device_names(document.get("deviceProperties")),
                   meta={k: document[k] for k in ("traceName", "schemaVersion")
                         if isinstance(document.get(k), (str, int))})
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise InputError(file, f"traceEvents[{i}]", "expected an object")
        _read_event(trace, event, i)
    if not any(not s.annotation for s in trace.spans):
        raise InputError(file, "traceEvents", "no CPU operators (cat cpu_op or Operator)")
    if not any(g.kind == "kernel" for g in trace.gpu):
        raise InputError(file, "traceEvents", "no GPU kernels (cat kernel): a trace "
                                              "without GPU activity has no times to import")
    _nest(trace)
    return trace


def _device_names(properties) -> dict:
    names = {}
    if isinstance(properties, list):
        for entry in properties:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str) \
                    and is_int(entry.get("id")):
                names.setdefault(entry["id"], entry["name"])
    return names


def _read_event(trace: Trace, event: dict, i: int) -> None:
    """Keep one event if it is an operator, launch, GPU activity or memory event."""
    cat = event.get("cat")
    cat = cat.lower() if isinstance(cat, str) else ""
    name = event.get("name")
    phase = event.get("ph")
    if name == "[memory]" and phase == "i":
        _read_memory(trace, event, i)
        return
    if phase != "X" or not (cat in _OP_CATS or cat in _ANNOTATION_CATS
                            or cat in _RUNTIME_CATS or cat in _GPU_CATS):
        return
    file = trace.file
    where = f"traceEvents[{i}]"
    if not isinstance(name, str):
        raise InputError(file, f"{where}.name", "expected a string")
    args = event.get("args", {})
    if not isinstance(args, dict):
        raise InputError(file, f"{where}.args", "expected an object")
    start = _number(event, "ts", file, where)
    dur = _number(event, "dur", file, where)
    if dur < 0:
        raise InputError(file, f"{where}.dur", f"negative duration {dur!r}")
    thread = (event_key(event.get("pid")), event_key(event.get("tid")))
    if cat in _GPU_CATS:
        trace.gpu.append(GpuEvent(i, _GPU_CATS[cat], dur, _int_or_none(args.get("device")),
                              _correlation(args, file, where), _external(args), name))
    elif cat in _RUNTIME_CATS:
        correlation = _correlation(args, file, where)
        if correlation is not None:
            trace.runtimes.setdefault(correlation, (thread, start))
    else:
        annotation = cat in _ANNOTATION_CATS or name.startswith(_ANNOTATION_PREFIXES)
        trace.spans.append(Span(i, name, thread, start, start + dur, args, annotation))


def _read_memory(trace: Trace, event: dict, i: int) -> None:
    """Keep a CUDA ``[memory]`` event; check the fields it must have."""
    file, where = trace.file, f"traceEvents[{i}]"
    args = event.get("args")
    if not isinstance(args, dict):
        raise InputError(file, f"{where}.args", "expected an object")
    if args.get("Device Type") != _CUDA_DEVICE_TYPE:
        return
    size = args.get("Bytes")
    if not is_int(size):
        raise InputError(file, f"{where}.args.Bytes", f"expected an integer, got {show(size)}")
    addr = args.get("Addr")
    if addr is not None and not is_int(addr):
        raise InputError(file, f"{where}.args.Addr", f"expected an integer, got {show(addr)}")
    total = args.get("Total Allocated")
    trace.memory.append(MemEvent(i, (event_key(event.get("pid")), event_key(event.get("tid"))),
                             _number(event, "ts", file, where),
                             _int_or_none(args.get("Device Id")), addr or None, size,
                             total if is_int(total) else None))


def _nest(trace: Trace) -> None:
    """Nest the operators of each thread by time containment; index the top level."""
    by_thread: dict = {}
    for span in trace.spans:
        if not span.annotation:
            by_thread.setdefault(span.thread, []).append(span)
        external = _external(span.args)
        if external is not None and not span.annotation:
            trace.by_external.setdefault(external, span)
    for thread, spans in by_thread.items():
        spans.sort(key=span_order)
        stack: list = []
        top = []
        for span in spans:
            while stack and not (stack[-1].start <= span.start < stack[-1].end):
                stack.pop()
            if stack:
                span.parent = stack[-1]
                stack[-1].children.append(span)
            else:
                top.append(span)
            stack.append(span)
        trace.top[thread] = _Timeline(top)


def span_order(span: Span):
    return (span.start, -(span.end - span.start), span.pos)


def top_of(span: Span) -> Span:
    while span.parent is not None:
        span = span.parent
    return span


def innermost(span: Span, ts: float) -> Span:
    while True:
        child = _Timeline(span.children).at(ts)
        if child is None:
            return span
        span = child


def _number(event: dict, key: str, file: str, where: str) -> float:
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(file, f"{where}.{key}", f"expected a number, got {show(value)}")
    return value


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_or_none(value):
    return value if is_int(value) else None


def _correlation(args: dict, file: str, where: str):
    """A launch's or GPU event's correlation id: a whole number, or one written as a
    string of digits or a float (some exporters do); any other value is an error rather
    than an event silently left out of its op's time."""
    value = args.get("correlation")
    if value is None or is_int(value):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    raise InputError(file, f"{where}.args.correlation",
                     f"expected a whole number (the id linking a GPU event to its launch), got {show(value)}")


def int_or(value, default: int) -> int:
    return value if is_int(value) else default


def _external(args: dict):
    value = args.get("External id", args.get("external id"))
    return value if is_int(value) else None


def event_key(value):
    """A pid or tid as a hashable, orderable key (traces use numbers or strings)."""
    if is_int(value):
        return value
    return str(value)


def thread_order(thread: tuple) -> tuple:
    return tuple(str(part) for part in thread)


def show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
