"""Import a PyTorch profiler (Kineto) trace, optionally with an Execution Trace, as a Profile.

``import_kineto(trace_path, et_path=None, iteration=None, name=None)`` turns one training
iteration measured on a GPU into a ``swapplan-profile/1`` with **measured** kernel times.
Only the standard library is used; torch is not needed.

What is modelled
----------------
- **Iteration.** The ``ProfilerStep#N`` span named by ``iteration``; without one, the last
  step that launched GPU work (and, when the trace has a backward pass, contains some of
  it: a trailing step closed by the profiler's stop is usually empty or cut short). A
  trace with no ``ProfilerStep#`` spans is one iteration as a whole (``iteration`` must
  then be left out).
- **Ops.** The top-level CPU operators (``cat`` ``cpu_op``, old ``Operator``) that start
  in the iteration, every thread merged in time order (the backward pass runs on the
  autograd thread). Nesting is time containment on the same (pid, tid): an operator that
  starts inside another's span is its child. Annotations (``user_annotation``,
  ``ProfilerStep#``, ``Optimizer.*``, ``## ... ##``) are not operators: they only set
  the window and the phases.
- **Op time** is the summed duration of the GPU kernels, memcpys and memsets launched on
  the op's behalf. A GPU event is mapped by ``correlation`` -> the ``cuda_runtime`` launch
  with that correlation -> the top-level operator enclosing the launch on its thread; only
  when the trace has no launch event for it, by ``External id`` (old: ``external id``) ->
  the operator with that id. (The launch is the reliable link: the VGG13 trace of
  PyTorch 2.1 carries the correlation in its kernels' ``External id``.) GPU events that
  map to no operator are left out and counted in ``source``.
- **Ops dropped.** A top-level operator that launched no GPU work and allocated no device
  memory (views, CPU scalar work such as Adam's step counters, ``AccumulateGrad`` that
  steals its gradient) is dropped: it takes no GPU time and holds nothing. An operator
  with allocations but no kernels is kept with time 0.
- **Phases.** ``backward``: ops on the autograd thread (a thread whose first op is an
  ``autograd::engine::evaluate_function: ...``) or named like a backward node
  (``autograd::engine::evaluate_function: ...``, ``...Backward0``); ``optimizer``: ops
  inside an ``Optimizer.step#...`` span on their thread; ``other``: ops inside
  ``Optimizer.zero_grad#...`` and main-thread ops after the backward pass began;
  ``forward``: the remaining main-thread ops (before the backward).
- **Tensors and lifetimes** come from the ``[memory]`` events of the GPU that ran the
  kernels. An allocation is paired with the next free of the same ``Addr`` on that
  device, in time order, over the whole trace (addresses are reused). Traces without
  ``Addr`` pair a free with the most recent open allocation of the same size: which
  buffer is freed is then a guess, but the bytes resident at every moment are exact.
  An allocation is produced by the top-level op on the same thread whose span contains
  it (the innermost operator names the tensor); one made outside every operator is given
  to the next kept op. A tensor's last use is the last kept op that starts at or before
  its free; frees are never attributed by span. Tensor bytes are the allocator's block
  sizes, as the trace reports them (rounded up, sometimes by up to 1 MiB when a cached
  block is not split): what the GPU really holds.
- **Workspace.** An allocation whose free falls before the next op starts (producer = last
  use) is a temporary, not a tensor: the op's ``workspace_bytes`` is the peak of the
  running sum of its temporaries.
- **Cut lifetimes.** A free with no allocation in the window (a buffer from before it,
  e.g. the last iteration's gradients freed by ``zero_grad``) is left out; an allocation
  never freed in the window (the new gradients, kept for the next iteration) lives to the
  last op. In steady state these are the same buffers of two successive iterations, so
  each is counted once.
- **Kinds** of window tensors follow the producing op's phase: forward -> activation,
  backward -> gradient, otherwise other.

With an Execution Trace (``et_path``)
-------------------------------------
- ET nodes are joined to Kineto operators by ``rf_id`` = ``Record function id`` when
  both files carry it, else by name and order per thread (a longest-matching-blocks
  alignment), checked by ``seq_id`` = ``Sequence number``. Schemas 1.0.1 (``parent``,
  flat inputs) and 1.0.2+/1.1.x (``ctrl_deps``, ``{values, shapes, types}``, ``attrs``)
  are read. The ET must be of the same process and iteration: fewer than 90 % of the kept
  ops matched, or more than 5 % of the joined pairs with different sequence numbers, is
  an error.
- Each kept op reads the CUDA storages its ET subtree takes as arguments, and updates
  those passed to a mutable schema argument (``Tensor(a!)``). A storage the subtree
  first meets as an output binds to the op's next unclaimed allocation of a fitting size
  (storage ids of schema 1.0.1 are keyed by address, so a later reference resolves to the
  allocation live at that address).
- Storages read but never created in the window are the **persistent** tensors (bytes:
  the extent rounded up to 512 B): updated by the optimizer and read in the forward pass
  -> ``weight``; touched by the optimizer only -> ``optimizer_state``; otherwise
  (the batch, labels, frozen parameters) -> ``input``.
- Lifetimes stay the measured ones: when a tensor is freed after its last ET read, the op
  that frees it lists it as an input too (the profile format expresses a lifetime only
  through uses); ``source.execution_trace.retention_uses`` counts these.

What is approximated, and why
-----------------------------
- Op time is summed kernel time: launch gaps, CPU stalls and overlap between streams are
  not in it (the planner models the GPU's busy time).
- Memory is op-granular: within op i the profile holds everything live at any moment of
  it plus its workspace peak, so the no-swap peak can exceed the trace's by what an op
  frees before it allocates.
- Without an ET there is no dataflow except those lifetime uses, and no persistent
  tensors: weights, optimizer state and the batch were allocated before the window and
  are invisible to the ``[memory]`` events (``source.memory.trace_baseline_bytes`` says
  how much was allocated before the window).
- FLOPs and modules are not imported.

Checking against the trace
--------------------------
``source.memory`` keeps what the allocator reported in the window: ``trace_baseline_bytes``
(``Total Allocated`` before its first event: everything allocated earlier, i.e. weights,
optimizer state, the batch, the last iteration's gradients) and ``trace_peak_bytes``
(the largest ``Total Allocated``). Their difference is what the iteration added at its
worst moment, net of the pre-window buffers it had freed by then. The no-swap peak of a
profile without an ET (``peak_bytes - persistent_bytes`` with one) holds exactly the
window's allocations, op by op. The two agree up to those pre-window frees (which the
trace nets out and the profile never had) and op granularity; on the VGG13 trace the
profile is 1.5 % above (the 0.53 GB of gradients ``zero_grad`` frees; op granularity
adds 2 KB).

The result is deterministic (same files, same profile, byte for byte) and validated by
``profile_from_dict``. Every malformed or mismatched input raises ``InputError(file,
where, problem)``. ``source.origin`` names the public origin and licence of traces it
recognises by their sha256 (the VGG13 files of sarchlab/triosim, MIT).
"""
from __future__ import annotations

import bisect
import difflib
import gzip
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from simulator.errors import InputError
from simulator.files import read_document
from simulator.profile import FORMAT, Profile, profile_from_dict

__all__ = ["import_kineto"]

_OP_CATS = frozenset({"cpu_op", "operator"})
_ANNOTATION_CATS = frozenset({"user_annotation"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver"})
_GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
             "gpu_memset": "memset", "memset": "memset"}
_ANNOTATION_PREFIXES = ("ProfilerStep#", "Optimizer.", "##")
_STEP = re.compile(r"ProfilerStep#(\d+)$")
_BACKWARD_NAME = re.compile(r"(^autograd::engine::evaluate_function)|(Backward\d*$)")
_EVALUATE = "autograd::engine::evaluate_function"
_CUDA_DEVICE_TYPE = 1
_BLOCK = 512                  # the caching allocator's rounding
_SLACK = 1 << 20              # an unsplit cached block may exceed the request by < 1 MiB
_MIN_MATCHED = 0.9            # share of kept ops an ET must join
_MAX_SEQ_MISMATCH = 0.05      # share of joined pairs whose sequence numbers may differ

# Public traces recognised by the sha256 of their (decompressed) text, so that the
# profile carries their origin and licence.
_TRIOSIM = {"repository": "https://github.com/sarchlab/triosim",
            "commit": "3ec660801966385d3f319f7d74d58a8d283a8fb3", "license": "MIT",
            "copyright": "Copyright (c) 2023 Yifan Sun",
            "model": "torchvision VGG13, batch 512, 3x224x224, fp32, Adam; PyTorch 2.1"}
_KNOWN_FILES = {
    "b8b30e0b9d2f62f052e5d6acca39f9a0638fdb304064646d8d5e81bcfb88c339":
        dict(_TRIOSIM, path="tracer/data/profiler/profiler_vgg13-iter41.json"),
    "d7f6662bb0f4cb07d16b4450e173325cbd225c690c79727577c11f000684e664":
        dict(_TRIOSIM, path="tracer/data/graph/graph_vgg13-iter41.json"),
}


# ============================================================================ API


def import_kineto(trace_path, et_path=None, iteration=None, name=None) -> Profile:
    """Build a validated Profile from a Kineto trace (``.json`` / ``.json.gz``).

    ``et_path``: an Execution Trace of the same run (dataflow, persistent tensors).
    ``iteration``: the ``N`` of ``ProfilerStep#N`` (default: the last complete one).
    ``name``: the profile's name (default: the trace file's name without extensions).
    Raises InputError(file, where, problem) for every malformed or mismatched input.
    """
    for label, path in (("trace_path", trace_path), ("et_path", et_path)):
        if not (isinstance(path, (str, os.PathLike)) or (path is None and label == "et_path")):
            raise InputError("<argument>", label, f"expected a file path, got {_show(path)}")
    file = str(trace_path)
    step = _check_iteration(iteration)
    if name is not None and (not isinstance(name, str) or not name):
        raise InputError("<argument>", "name", "expected a non-empty string")
    trace_data = read_document(trace_path, formats=("json",))
    et_data = read_document(et_path, formats=("json",)) if et_path is not None else None
    try:
        trace = _read_trace(trace_data, file)
        et = _read_et(et_data, str(et_path)) if et_path is not None else None
        chosen = _build_iteration(trace, step)
        flow = _dataflow(chosen, et, trace) if et is not None else None
        data = _assemble(chosen, flow, trace, trace_path, et_path, name)
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError,
            OverflowError, RecursionError) as exc:  # a safety net for shapes not foreseen
        problem = " ".join(f"cannot import ({type(exc).__name__}: {exc})".split())
        raise InputError(file, "", problem[:300]) from None
    return profile_from_dict(data, file)


def _check_iteration(iteration) -> int | None:
    if iteration is None:
        return None
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise InputError("<argument>", "iteration",
                         f"expected a whole number >= 0, got {iteration!r}")
    return iteration


# ============================================================================ trace


@dataclass(eq=False)
class _Span:
    """A CPU operator or annotation (a complete event on a CPU thread)."""
    pos: int
    name: str
    thread: tuple
    start: float
    end: float
    args: dict
    annotation: bool
    parent: "_Span | None" = None
    children: list = field(default_factory=list)


@dataclass(eq=False)
class _Gpu:
    pos: int
    kind: str            # kernel, memcpy, memset
    dur: float
    device: int | None
    correlation: int | None
    external: int | None


@dataclass(eq=False)
class _Mem:
    pos: int
    thread: tuple
    ts: float
    device: int | None
    addr: int | None
    bytes: int
    total: int | None    # Total Allocated after the event


@dataclass
class _Trace:
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

    def at(self, ts: float) -> "_Span | None":
        """The span that contains ``ts`` (ends inclusive; the later one on a tie)."""
        k = bisect.bisect_right(self.starts, ts) - 1
        if k >= 0 and self.spans[k].start <= ts <= self.spans[k].end:
            return self.spans[k]
        return None


_EMPTY = _Timeline([])


def _read_trace(document, file: str) -> _Trace:
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
    trace = _Trace(file=file, spans=[], runtimes={}, gpu=[], memory=[],
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
                    and _is_int(entry.get("id")):
                names.setdefault(entry["id"], entry["name"])
    return names


def _read_event(trace: _Trace, event: dict, i: int) -> None:
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
    thread = (_key(event.get("pid")), _key(event.get("tid")))
    if cat in _GPU_CATS:
        trace.gpu.append(_Gpu(i, _GPU_CATS[cat], dur, _int_or_none(args.get("device")),
                              _correlation(args, file, where), _external(args)))
    elif cat in _RUNTIME_CATS:
        correlation = _correlation(args, file, where)
        if correlation is not None:
            trace.runtimes.setdefault(correlation, (thread, start))
    else:
        annotation = cat in _ANNOTATION_CATS or name.startswith(_ANNOTATION_PREFIXES)
        trace.spans.append(_Span(i, name, thread, start, start + dur, args, annotation))


def _read_memory(trace: _Trace, event: dict, i: int) -> None:
    """Keep a CUDA ``[memory]`` event; check the fields it must have."""
    file, where = trace.file, f"traceEvents[{i}]"
    args = event.get("args")
    if not isinstance(args, dict):
        raise InputError(file, f"{where}.args", "expected an object")
    if args.get("Device Type") != _CUDA_DEVICE_TYPE:
        return
    size = args.get("Bytes")
    if not _is_int(size):
        raise InputError(file, f"{where}.args.Bytes", f"expected an integer, got {_show(size)}")
    addr = args.get("Addr")
    if addr is not None and not _is_int(addr):
        raise InputError(file, f"{where}.args.Addr", f"expected an integer, got {_show(addr)}")
    total = args.get("Total Allocated")
    trace.memory.append(_Mem(i, (_key(event.get("pid")), _key(event.get("tid"))),
                             _number(event, "ts", file, where),
                             _int_or_none(args.get("Device Id")), addr or None, size,
                             total if _is_int(total) else None))


def _nest(trace: _Trace) -> None:
    """Nest the operators of each thread by time containment; index the top level."""
    by_thread: dict = {}
    for span in trace.spans:
        if not span.annotation:
            by_thread.setdefault(span.thread, []).append(span)
        external = _external(span.args)
        if external is not None and not span.annotation:
            trace.by_external.setdefault(external, span)
    for thread, spans in by_thread.items():
        spans.sort(key=_span_order)
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


def _span_order(span: _Span):
    return (span.start, -(span.end - span.start), span.pos)


def _top_of(span: _Span) -> _Span:
    while span.parent is not None:
        span = span.parent
    return span


def _innermost(span: _Span, ts: float) -> _Span:
    while True:
        child = _Timeline(span.children).at(ts)
        if child is None:
            return span
        span = child


# ============================================================================ iteration


@dataclass(eq=False)
class _Op:
    span: _Span
    phase: str = "other"
    time_us: float = 0.0
    gpu_events: int = 0
    allocations: list = field(default_factory=list)   # _Alloc produced here
    workspace: int = 0


@dataclass(eq=False)
class _Alloc:
    event: _Mem
    free_ts: float | None = None      # None: not freed in the window
    producer: int | None = None       # index into ops
    last: int | None = None
    namer: str = ""
    temporary: bool = False
    tensor_id: str | None = None
    free_pos: int | None = None
    shape: list | None = None
    dtype: str | None = None


@dataclass
class _Iteration:
    step: int | None
    window: tuple | None          # (start, end) or None for the whole trace
    device: int | None
    ops: list                     # kept _Op, in execution order
    allocations: list             # _Alloc made in the window, in time order
    stats: dict


def _build_iteration(trace: _Trace, step: int | None) -> _Iteration:
    """Choose the iteration; keep its ops with their GPU time, phases and memory."""
    device = _main_device(trace)
    steps = _steps(trace)
    step, window = _choose_window(trace, steps, step, device)
    candidates = _ops_in_window(trace, window)
    gpu_stats = _attach_gpu(trace, candidates, device)
    allocations, mem_stats = _pair_memory(trace, device, window)
    ops = _keep_ops(trace, candidates, allocations, step)
    _set_phases(trace, ops)
    _place_allocations(trace, ops, allocations)
    _workspaces(ops)
    stats = {"gpu": gpu_stats, "memory": mem_stats, "top_level_ops": len(candidates)}
    return _Iteration(step, window, device, ops, allocations, stats)


def _main_device(trace: _Trace) -> int | None:
    """The GPU that ran most kernel time (its memory events are the ones modelled)."""
    busy: dict = {}
    for g in trace.gpu:
        busy[g.device] = busy.get(g.device, 0.0) + g.dur
    return max(sorted(busy, key=lambda d: (d is None, d)), key=busy.__getitem__)


def _steps(trace: _Trace) -> dict:
    steps: dict = {}
    for span in trace.spans:
        match = _STEP.match(span.name)
        if match:
            steps.setdefault(int(match.group(1)), span)
    return steps


def _choose_window(trace: _Trace, steps: dict, step: int | None, device):
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


def _launch_counts(trace: _Trace, device) -> dict:
    """GPU events launched by each top-level operator, ``id(span) -> count``."""
    counts: dict = {}
    for g in trace.gpu:
        if device is None or g.device is None or g.device == device:
            span, _ = _launcher(trace, g)
            if span is not None:
                top = id(_top_of(span))
                counts[top] = counts.get(top, 0) + 1
    return counts


def _is_complete(trace: _Trace, step: _Span, launched: dict, backward: bool) -> bool:
    """A step launched GPU work, and ran a backward pass if the trace has one anywhere."""
    ops = _ops_in_window(trace, (step.start, step.end))
    if backward and not any(_BACKWARD_NAME.search(op.span.name) for op in ops):
        return False
    return any(launched.get(id(op.span)) for op in ops)


def _in_window(ts: float, window) -> bool:
    return window is None or window[0] <= ts < window[1]


def _ops_in_window(trace: _Trace, window) -> list:
    """The top-level operators that start in the window, in merged time order."""
    spans = [s for top in trace.top.values() for s in top.spans if _in_window(s.start, window)]
    spans.sort(key=lambda s: (s.start, _thread_order(s.thread), s.pos))
    return [_Op(s) for s in spans]


def _attach_gpu(trace: _Trace, ops: list, device) -> dict:
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
        op = index.get(id(_top_of(span)))
        if op is None:
            continue                      # another iteration
        counts[g.kind + "s"] += 1
        counts["time_us"] += g.dur
        counts["by"][how] += 1
        op.time_us += g.dur
        op.gpu_events += 1
    counts["time_us"] = round(counts["time_us"], 3)
    return counts


def _launcher(trace: _Trace, g: _Gpu):
    """The operator that launched a GPU event, and how it was found."""
    launch = trace.runtimes.get(g.correlation) if g.correlation is not None else None
    if launch is not None:
        thread, ts = launch
        span = trace.top.get(thread, _EMPTY).at(ts)
        return (span, "correlation") if span is not None else (None, None)
    if g.external is not None:
        span = trace.by_external.get(g.external)
        if span is not None:
            return span, "external_id"
    return None, None


def _keep_ops(trace: _Trace, candidates: list, allocations: list, step) -> list:
    """Keep the ops with GPU work or device allocations in their span."""
    index = {id(op.span): op for op in candidates}
    holders = set()
    for alloc in allocations:
        span = trace.top.get(alloc.event.thread, _EMPTY).at(alloc.event.ts)
        if span is not None and id(span) in index:
            holders.add(id(span))
    ops = [op for op in candidates if op.gpu_events or id(op.span) in holders]
    if not any(op.gpu_events for op in ops):
        where = f"ProfilerStep#{step}" if step is not None else "traceEvents"
        raise InputError(trace.file, where, "no GPU kernels launched by the operators "
                                            "of this iteration")
    return ops


def _set_phases(trace: _Trace, ops: list) -> None:
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


# ============================================================================ memory


def _pair_memory(trace: _Trace, device, window):
    """Pair allocations with frees (same Addr, next in time) on the kernels' device.

    Pairs over the whole trace; returns the allocations made in the window (a free
    after the window counts as none) and counts of what the window cuts.
    """
    events = [m for m in trace.memory
              if m.bytes != 0 and (m.device is None or device is None or m.device == device)]
    events.sort(key=lambda m: (m.ts, m.pos))
    with_addr = all(m.addr is not None for m in events)
    waiting: dict = {}
    pairs: list = []
    cut_frees = 0
    for m in events:
        key = m.addr if with_addr else abs(m.bytes)
        if m.bytes > 0:
            alloc = _Alloc(m)
            pairs.append(alloc)
            waiting.setdefault(key, []).append(alloc)
            continue
        opened = waiting.get(key)
        alloc = opened.pop() if opened else None
        if alloc is not None:
            alloc.free_ts, alloc.free_pos = m.ts, m.pos
        if _in_window(m.ts, window) and (alloc is None or not _in_window(alloc.event.ts, window)):
            cut_frees += 1
    chosen = [a for a in pairs if _in_window(a.event.ts, window)]
    for alloc in chosen:
        if alloc.free_ts is not None and not _in_window(alloc.free_ts, window):
            alloc.free_ts = alloc.free_pos = None
    in_window = [m for m in events if _in_window(m.ts, window)]
    stats = {"paired_by": "Addr" if with_addr else "size (the trace has no Addr)",
             "events": len(in_window), "frees_before_window": cut_frees,
             "outlive_window": sum(1 for a in chosen if a.free_ts is None)}
    stats.update(_trace_totals(in_window))
    return chosen, stats


def _trace_totals(events: list) -> dict:
    """What the allocator reported: allocated before the window, and the peak."""
    totals = [m for m in events if m.total is not None]
    if not totals:
        return {}
    baseline = totals[0].total - totals[0].bytes
    peak = max(m.total for m in totals)
    return {"trace_baseline_bytes": baseline, "trace_peak_bytes": peak,
            "trace_peak_minus_baseline_bytes": peak - baseline}


def _place_allocations(trace: _Trace, ops: list, allocations: list) -> None:
    """Give each allocation its producer (containing op) and last use (op before free)."""
    index = {id(op.span): k for k, op in enumerate(ops)}
    starts = [op.span.start for op in ops]
    for alloc in allocations:
        m = alloc.event
        span = trace.top.get(m.thread, _EMPTY).at(m.ts)
        k = index.get(id(span)) if span is not None else None
        if k is None:                               # outside every kept op: the next one
            k = min(bisect.bisect_left(starts, m.ts), len(ops) - 1)
            alloc.namer = "(outside operators)"
        else:
            alloc.namer = _innermost(span, m.ts).name
        alloc.producer = k
        if alloc.free_ts is None:
            alloc.last = len(ops) - 1
        else:
            alloc.last = max(k, bisect.bisect_right(starts, alloc.free_ts) - 1)
            alloc.temporary = alloc.last == k
        ops[k].allocations.append(alloc)


def _workspaces(ops: list) -> None:
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


# ============================================================================ execution trace


@dataclass(eq=False)
class _Node:
    id: int
    name: str
    parent: int | None
    tid: object
    seq: int
    rf: int
    refs: list               # _Ref, inputs then outputs, in argument order
    children: list = field(default_factory=list)


@dataclass
class _Ref:
    storage: int
    nbytes: int
    device: str
    output: bool
    mutable: bool
    shape: list | None
    dtype: str | None


@dataclass
class _Et:
    file: str
    schema: str
    pid: object
    nodes: dict              # id -> _Node (roots excluded)


_ET_ROOT = re.compile(r"^\[pytorch\|profiler\|execution_(trace|graph)\|(thread|process)\]$")
_DTYPES = {"float": "fp32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16",
           "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
           "unsigned char": "uint8", "bool": "bool"}


def _read_et(document, file: str) -> _Et:
    """Parse an Execution Trace (schema 1.0.1, or 1.0.2+ with ctrl_deps and attrs)."""
    if not isinstance(document, dict):
        raise InputError(file, "", "expected a JSON object (a PyTorch Execution Trace)")
    nodes = document.get("nodes")
    if not isinstance(nodes, list):
        raise InputError(file, "nodes", "missing or not a list: not a PyTorch Execution Trace")
    schema = document.get("schema")
    et = _Et(file, schema if isinstance(schema, str) else "unknown", document.get("pid"), {})
    for i, raw in enumerate(nodes):
        node = _read_node(raw, file, i)
        if node is not None:
            et.nodes[node.id] = node
    if not et.nodes:
        raise InputError(file, "nodes", "no operator nodes")
    for node in et.nodes.values():
        parent = et.nodes.get(node.parent)
        if parent is not None:
            parent.children.append(node)
    for node in et.nodes.values():
        node.children.sort(key=lambda n: n.id)
    return et


def _read_node(raw, file: str, i: int) -> _Node | None:
    where = f"nodes[{i}]"
    if not isinstance(raw, dict):
        raise InputError(file, where, "expected an object")
    attrs = _node_attrs(raw, file, where)
    node_id, name = raw.get("id"), raw.get("name")
    if not _is_int(node_id):
        raise InputError(file, f"{where}.id", f"expected an integer, got {_show(node_id)}")
    if not isinstance(name, str):
        raise InputError(file, f"{where}.name", "expected a string")
    if _ET_ROOT.match(name):
        return None
    parent = raw.get("parent", raw.get("ctrl_deps"))
    schema = attrs.get("op_schema")
    mutable = _mutable_arguments(schema if isinstance(schema, str) else "")
    refs = []
    for output, key in ((False, "inputs"), (True, "outputs")):
        values, shapes, types = _arguments(raw, key, file, where)
        for position, value in enumerate(values):
            shape = shapes[position] if position < len(shapes) else None
            kind = types[position] if position < len(types) else None
            refs.extend(_tensor_refs(value, shape, kind, output,
                                     not output and position in mutable))
    return _Node(node_id, name, parent if _is_int(parent) else None, attrs.get("tid"),
                 _int_or(attrs.get("seq_id"), -1), _int_or(attrs.get("rf_id"), 0), refs)


def _node_attrs(raw: dict, file: str, where: str) -> dict:
    """Scalar fields: top-level (1.0.1) or in an ``attrs`` list of {name, value} (1.0.2+)."""
    attrs = {k: raw.get(k) for k in ("tid", "seq_id", "rf_id", "op_schema") if k in raw}
    listed = raw.get("attrs")
    if listed is None:
        return attrs
    if not isinstance(listed, list):
        raise InputError(file, f"{where}.attrs", "expected a list")
    for entry in listed:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            attrs.setdefault(entry["name"], entry.get("value"))
    return attrs


def _arguments(raw: dict, key: str, file: str, where: str):
    """(values, shapes, types) of a node's inputs or outputs, either layout."""
    block = raw.get(key, [])
    if isinstance(block, dict):                     # 1.0.2+: {values, shapes, types}
        values, shapes, types = (block.get("values", []), block.get("shapes", []),
                                 block.get("types", []))
    else:                                           # 1.0.1: parallel lists
        prefix = key[:-1]                           # input / output
        values, shapes, types = (block, raw.get(f"{prefix}_shapes", []),
                                 raw.get(f"{prefix}_types", []))
    for part, value in (("", values), ("shapes", shapes), ("types", types)):
        if not isinstance(value, list):
            label = f"{where}.{key}" + (f".{part}" if part else "")
            raise InputError(file, label, "expected a list")
    return values, shapes, types


def _is_tensor(value) -> bool:
    """A tensor argument: (tensor id, storage id, offset, elements, element size, device)."""
    return (isinstance(value, list) and len(value) == 6 and isinstance(value[5], str)
            and all(_is_int(v) for v in value[:5]))


def _tensor_refs(value, shape, kind, output: bool, mutable: bool, depth: int = 0):
    """The tensors in one argument (a tensor, or nested lists of them)."""
    if depth > 8 or not isinstance(value, list):
        return []
    if _is_tensor(value):
        _, storage, offset, count, size, device = value
        dtypes = re.findall(r"Tensor\(([^)]*)\)", kind) if isinstance(kind, str) else []
        dims = shape if isinstance(shape, list) and all(_is_int(d) and d >= 0
                                                        for d in shape) else None
        return [_Ref(storage, max(0, (offset + count) * size), device, output, mutable,
                     dims, _DTYPES.get(dtypes[0]) if dtypes else None)]
    refs = []
    for k, item in enumerate(value):
        sub_shape = shape[k] if isinstance(shape, list) and k < len(shape) else None
        refs.extend(_tensor_refs(item, sub_shape, kind, output, mutable, depth + 1))
    return refs


def _mutable_arguments(schema: str) -> set:
    """Positions of the arguments a schema marks as written, ``Tensor(a!)``."""
    open_ = schema.find("(")
    close = schema.rfind(") ->") if ") ->" in schema else schema.rfind(")")
    if open_ < 0 or close <= open_:
        return set()
    parts, depth, current = [], 0, []
    for ch in schema[open_ + 1:close]:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    arguments = [p for p in parts if p and p != "*"]
    return {k for k, arg in enumerate(arguments) if "!" in arg.rsplit(" ", 1)[0]}


# ---------------------------------------------------------------------------- join


def _join(iteration: _Iteration, et: _Et, trace: _Trace):
    """Map spans to ET nodes, ``id(span) -> (span, node)``, and say how; check that the
    files are of the same run and iteration."""
    if _is_int(et.pid):
        pids = {s.thread[0] for s in trace.spans if not s.annotation}
        if _key(et.pid) not in pids and all(isinstance(p, int) for p in pids):
            raise InputError(et.file, "pid", f"the ET is of process {et.pid}, the trace of "
                             f"{', '.join(str(p) for p in sorted(pids))}: not the same run")
    spans = [s for s in trace.spans if _in_window(s.start, iteration.window)
             and not _STEP.match(s.name)]
    pairs, how = _join_by_rf_id(spans, et), "rf_id"
    if not pairs:
        pairs, how = _join_by_order(spans, et), "name and order"
    kept = [op for op in iteration.ops if id(op.span) in pairs]
    if len(kept) < _MIN_MATCHED * len(iteration.ops):
        raise InputError(et.file, "nodes", f"does not match the trace: only {len(kept)} of "
                         f"{len(iteration.ops)} GPU operators found (same run and iteration?)")
    compared = differ = 0
    for span, node in pairs.values():
        seq = _int_or(span.args.get("Sequence number"), -1)
        if seq >= 0 and node.seq >= 0:
            compared += 1
            differ += seq != node.seq
    if compared and differ > _MAX_SEQ_MISMATCH * compared:
        raise InputError(et.file, "nodes", f"does not match the trace: {differ} of {compared} "
                         "joined operators have other sequence numbers (another iteration?)")
    return pairs, how


def _join_by_rf_id(spans: list, et: _Et) -> dict:
    by_rf = {n.rf: n for n in et.nodes.values() if n.rf > 0}
    pairs = {}
    for span in spans:
        rf = _int_or(span.args.get("Record function id"), 0)
        if rf > 0 and rf in by_rf and by_rf[rf].name == span.name:
            pairs[id(span)] = (span, by_rf[rf])
    return pairs


def _join_by_order(spans: list, et: _Et) -> dict:
    """Align each Kineto thread with the ET thread whose names match it best."""
    kineto: dict = {}
    for span in sorted(spans, key=_span_order):
        kineto.setdefault(span.thread, []).append(span)
    threads: dict = {}
    for node in sorted(et.nodes.values(), key=lambda n: n.id):
        threads.setdefault(_key(node.tid), []).append(node)
    scored = []
    for kt, kspans in kineto.items():
        for et_tid, nodes in threads.items():
            blocks = _blocks([s.name for s in kspans], [n.name for n in nodes])
            scored.append((-sum(b.size for b in blocks), str(kt), str(et_tid), kt, et_tid, blocks))
    scored.sort(key=lambda row: row[:3])
    pairs, used_k, used_e = {}, set(), set()
    for score, _, _, kt, et_tid, blocks in scored:
        if score == 0 or kt in used_k or et_tid in used_e:
            continue
        used_k.add(kt)
        used_e.add(et_tid)
        for block in blocks:
            for j in range(block.size):
                span = kineto[kt][block.a + j]
                pairs[id(span)] = (span, threads[et_tid][block.b + j])
    return pairs


def _blocks(a: list, b: list):
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [block for block in matcher.get_matching_blocks() if block.size]


# ---------------------------------------------------------------------------- dataflow


@dataclass
class _Flow:
    """The ET's dataflow: per op, what it reads and updates, in first-touch order."""
    reads: dict              # op index -> {key: _Alloc or persistent record}
    updates: dict            # op index -> {key: _Alloc or persistent record}
    persistent: list         # records: id, storage, bytes, kind, shape, dtype, ...
    stats: dict


def _dataflow(iteration: _Iteration, et: _Et, trace: _Trace) -> _Flow:
    """Which tensors each op reads and updates, and the persistent tensors, from the ET."""
    pairs, how = _join(iteration, et, trace)
    ops = iteration.ops
    device = iteration.device
    by_addr = _allocations_by_address(iteration.allocations)
    binding: dict = {}                                     # storage -> _Alloc
    persistent: dict = {}                                  # storage -> info
    reads: dict = {}
    updates: dict = {}
    claimed: set = set()
    stats = {"schema": et.schema, "joined_by": how, "joined_ops": 0, "reads": 0, "updates": 0,
             "bound_storages": 0, "unbound_outputs": 0}
    for k, op in enumerate(ops):
        joined = pairs.get(id(op.span))
        if joined is None:
            continue
        stats["joined_ops"] += 1
        for storage, touch in _touched(joined[1], device).items():
            if _bind(op, storage, touch, binding, claimed):
                stats["bound_storages"] += 1
                continue
            target = _resolve(storage, binding, by_addr, k)
            if target is None:
                if storage in binding or touch["first_output"]:
                    stats["unbound_outputs"] += touch["first_output"]
                    continue
                target = _persistent(persistent, storage, touch)
                target["phases"].add(op.phase)
                if touch["mutable"]:
                    target["updated_in"].add(op.phase)
                key = ("p", storage)
            elif target.producer >= k or target.temporary:
                continue                   # its own output, or a temporary
            else:
                key = ("t", id(target))
            bucket = updates if touch["mutable"] else reads
            bucket.setdefault(k, {}).setdefault(key, target)
    infos = _classify(persistent)
    stats["persistent_tensors"] = len(infos)
    stats["persistent_bytes"] = sum(p["bytes"] for p in infos)
    stats["reads"] = sum(len(v) for v in reads.values())
    stats["updates"] = sum(len(v) for v in updates.values())
    return _Flow(reads, updates, infos, stats)


def _touched(node: _Node, device) -> dict:
    """The CUDA storages a node's subtree touches, in first-touch order, with how."""
    touched: dict = {}
    stack, order, seen = [node], [], set()
    while stack:                                       # pre-order, children by id
        current = stack.pop()
        if id(current) in seen:                        # a malformed ET may loop
            continue
        seen.add(id(current))
        order.append(current)
        stack.extend(reversed(current.children))
    for current in order:
        for ref in current.refs:
            if ref.nbytes <= 0 or not _on_device(ref.device, device):
                continue
            entry = touched.get(ref.storage)
            if entry is None:
                entry = touched[ref.storage] = {"first_output": ref.output, "mutable": False,
                                                "nbytes": 0, "shape": ref.shape,
                                                "dtype": ref.dtype}
            entry["mutable"] |= ref.mutable
            if ref.nbytes > entry["nbytes"]:
                entry.update(nbytes=ref.nbytes, shape=ref.shape, dtype=ref.dtype)
    return touched


def _on_device(device: str, index) -> bool:
    if not device.startswith("cuda"):
        return False
    _, _, number = device.partition(":")
    return index is None or not number.isdigit() or int(number) == index


def _bind(op: _Op, storage, touch: dict, binding: dict, claimed: set) -> bool:
    """A storage first met as an output claims the op's next allocation that fits it."""
    if not touch["first_output"]:
        return False
    for alloc in op.allocations:
        if id(alloc) not in claimed and _fits(alloc.event.bytes, touch["nbytes"]):
            claimed.add(id(alloc))
            binding[storage] = alloc
            if alloc.shape is None:
                alloc.shape, alloc.dtype = touch["shape"], touch["dtype"]
            return True
    return False


def _fits(block: int, request: int) -> bool:
    rounded = -(-request // _BLOCK) * _BLOCK
    return request <= block <= rounded + _SLACK


def _allocations_by_address(allocations: list) -> dict:
    by_addr: dict = {}
    for alloc in allocations:
        if alloc.event.addr is not None:
            by_addr.setdefault(alloc.event.addr, []).append(alloc)
    return by_addr


def _resolve(storage, binding: dict, by_addr: dict, k: int):
    """The allocation a bound storage refers to during op k: the bound one if it is
    live then, else the one live at its address (ids of schema 1.0.1 follow addresses)."""
    alloc = binding.get(storage)
    if alloc is None:
        return None
    if _live_at(alloc, k):
        return alloc
    if alloc.event.addr is not None:
        for other in by_addr.get(alloc.event.addr, []):
            if _live_at(other, k):
                return other
    return None


def _live_at(alloc: _Alloc, k: int) -> bool:
    return alloc.producer is not None and alloc.producer <= k <= alloc.last


def _persistent(persistent: dict, storage, touch: dict) -> dict:
    """The record of a storage used but never created in the window."""
    info = persistent.get(storage)
    if info is None:
        info = persistent[storage] = {"storage": storage, "bytes": 0, "phases": set(),
                                      "updated_in": set(), "shape": touch["shape"],
                                      "dtype": touch["dtype"], "order": len(persistent)}
    rounded = -(-touch["nbytes"] // _BLOCK) * _BLOCK
    if rounded > info["bytes"]:
        info.update(bytes=rounded, shape=touch["shape"], dtype=touch["dtype"])
    return info


def _classify(persistent: dict) -> list:
    """weight / optimizer_state / input, from where a persistent storage is used."""
    infos = []
    for info in sorted(persistent.values(), key=lambda p: p["order"]):
        if "optimizer" in info["updated_in"] and "forward" in info["phases"]:
            kind = "weight"
        elif info["phases"] == {"optimizer"}:
            kind = "optimizer_state"
        else:
            kind = "input"
        info["kind"] = kind
        info["id"] = f"p{len(infos)}"
        infos.append(info)
    return infos


# ============================================================================ assemble


def _assemble(iteration: _Iteration, flow: "_Flow | None", trace: _Trace,
              trace_path, et_path, name) -> dict:
    """The profile as JSON data (validated by the caller)."""
    tensors = [_persistent_tensor(p) for p in (flow.persistent if flow else [])]
    counter = 0
    for alloc in iteration.allocations:
        if alloc.temporary:
            continue
        alloc.tensor_id = f"t{counter}"
        counter += 1
        phase = iteration.ops[alloc.producer].phase
        tensor = {"id": alloc.tensor_id, "bytes": alloc.event.bytes,
                  "kind": {"forward": "activation", "backward": "gradient"}.get(phase, "other"),
                  "name": alloc.namer}
        if alloc.shape is not None:
            tensor["shape"] = alloc.shape
        if alloc.dtype is not None:
            tensor["dtype"] = alloc.dtype
        tensors.append(tensor)
    ops, retention = _op_entries(iteration, flow)
    source = _source(iteration, flow, trace, trace_path, et_path, retention)
    return {"format": FORMAT, "name": name or _default_name(trace_path), "source": source,
            "tensors": tensors, "ops": ops}


def _persistent_tensor(info: dict) -> dict:
    tensor = {"id": info["id"], "bytes": info["bytes"], "kind": info["kind"],
              "name": f"ET storage {info['storage']}"}
    if info["shape"] is not None:
        tensor["shape"] = info["shape"]
    if info["dtype"] is not None:
        tensor["dtype"] = info["dtype"]
    return tensor


def _op_entries(iteration: _Iteration, flow: _Flow | None):
    """One entry per kept op, and how many uses were added only to keep a lifetime.

    Inputs and updates are the ET's reads and in-place writes; a tensor freed after the
    last of them (or, without an ET, any tensor) is also an input of the op at which its
    lifetime ends, the last op starting before its free.
    """
    ops = iteration.ops
    inputs = [[] for _ in ops]
    updates = [[] for _ in ops]
    touched = [set() for _ in ops]
    if flow is not None:
        for k in range(len(ops)):
            for bucket, out in ((flow.reads, inputs), (flow.updates, updates)):
                for target in bucket.get(k, {}).values():
                    tid = target["id"] if isinstance(target, dict) else target.tensor_id
                    out[k].append(tid)
                    touched[k].add(tid)
    retention = 0
    for alloc in iteration.allocations:
        if alloc.temporary or alloc.last <= alloc.producer:
            continue
        if alloc.tensor_id not in touched[alloc.last]:
            inputs[alloc.last].append(alloc.tensor_id)
            touched[alloc.last].add(alloc.tensor_id)
            retention += 1
    entries = []
    for k, op in enumerate(ops):
        entry = {"id": f"o{k}", "name": op.span.name, "phase": op.phase,
                 "time_us": round(op.time_us, 3), "inputs": inputs[k],
                 "outputs": [a.tensor_id for a in op.allocations if not a.temporary]}
        if updates[k]:
            entry["updates"] = updates[k]
        if op.workspace:
            entry["workspace_bytes"] = op.workspace
        entries.append(entry)
    return entries, retention


def _source(iteration: _Iteration, flow, trace: _Trace, trace_path, et_path,
            retention: int) -> dict:
    names = [f"{Path(trace_path).name} (PyTorch profiler Kineto trace: GPU kernel times, "
             "[memory] events)"]
    if et_path is not None:
        names.append(f"{Path(et_path).name} (PyTorch Execution Trace: dataflow, "
                     "persistent tensors)")
    window = (f"ProfilerStep#{iteration.step}" if iteration.step is not None
              else "the whole trace (no ProfilerStep#N spans)")
    ops = iteration.ops
    source = {"kind": "measured", "from": " + ".join(names), "timing": "measured",
              "iteration": iteration.step, "window": window,
              "ops": {"top_level": iteration.stats["top_level_ops"], "kept": len(ops),
                      "dropped_without_gpu_work": iteration.stats["top_level_ops"] - len(ops),
                      "with_gpu_work": sum(1 for op in ops if op.gpu_events)},
              "gpu": iteration.stats["gpu"], "memory": _memory_source(iteration)}
    device = trace.devices.get(iteration.device)
    if device is not None:
        source["device"] = device
    if iteration.device is not None:
        source["device_id"] = iteration.device
    if trace.meta:
        source["trace"] = trace.meta
    if flow is not None:
        source["execution_trace"] = dict(flow.stats, retention_uses=retention)
    else:
        source["lifetime_uses"] = retention
    origins = _origins(trace_path, et_path)
    if origins:
        source["origin"] = origins
    return source


def _memory_source(iteration: _Iteration) -> dict:
    allocations = iteration.allocations
    memory = dict(iteration.stats["memory"])
    memory.update(allocations=len(allocations),
                  tensors=sum(1 for a in allocations if not a.temporary),
                  temporaries=sum(1 for a in allocations if a.temporary),
                  outside_operators=sum(1 for a in allocations
                                        if a.namer == "(outside operators)"))
    return memory


def _origins(trace_path, et_path) -> list:
    origins = []
    for path in (trace_path, et_path):
        if path is None:
            continue
        known = _KNOWN_FILES.get(_text_sha256(path))
        if known is not None:
            origins.append(dict(known, file=Path(path).name))
    return origins


def _text_sha256(path) -> str | None:
    """sha256 of a file's text (gunzipped if ``.gz``); None if it cannot be read."""
    try:
        if str(path).lower().endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                raw = handle.read()
        else:
            raw = Path(path).read_bytes()
    except (OSError, EOFError):
        return None
    return hashlib.sha256(raw).hexdigest()


def _default_name(trace_path) -> str:
    base = Path(trace_path).name
    for suffix in (".gz", ".json"):
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
    return base or "kineto"


# ============================================================================ helpers


def _number(event: dict, key: str, file: str, where: str) -> float:
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(file, f"{where}.{key}", f"expected a number, got {_show(value)}")
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_or_none(value):
    return value if _is_int(value) else None


def _correlation(args: dict, file: str, where: str):
    """A launch's or GPU event's correlation id: a whole number, or one written as a
    string of digits or a float (some exporters do); any other value is an error rather
    than an event silently left out of its op's time."""
    value = args.get("correlation")
    if value is None or _is_int(value):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    raise InputError(file, f"{where}.args.correlation",
                     f"expected a whole number (the id linking a GPU event to its launch), got {_show(value)}")


def _int_or(value, default: int) -> int:
    return value if _is_int(value) else default


def _external(args: dict):
    value = args.get("External id", args.get("external id"))
    return value if _is_int(value) else None


def _key(value):
    """A pid or tid as a hashable, orderable key (traces use numbers or strings)."""
    if _is_int(value):
        return value
    return str(value)


def _thread_order(thread: tuple) -> tuple:
    return tuple(str(part) for part in thread)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
