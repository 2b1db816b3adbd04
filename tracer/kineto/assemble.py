"""Kineto import, step 4: assemble the profile's JSON data (tensors, ops, source).

Part of ``tracer.kineto`` (see its docstring for what is modelled); private.
"""
from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass
from pathlib import Path

from simulator.errors import InputError
from simulator.files import read_bytes
from simulator.profile import FORMAT

from .et import Flow
from .iteration import Iteration
from .memory import OUTSIDE
from .read import Trace
from .split import op_starts


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


def assemble(iteration: Iteration, flow: "Flow | None", trace: Trace,
              trace_path, et_path, name) -> dict:
    """The profile as JSON data (validated by the caller)."""
    tensors = [_persistent_tensor(p) for p in (flow.persistent if flow else [])]
    before = _pre_window(iteration) if flow is None else None
    if before is not None:
        tensors.extend(before.tensors())
    counter = 0
    for alloc in iteration.allocations:
        if alloc.temporary:
            continue
        alloc.tensor_id = f"t{counter}"
        counter += 1
        phase = "other" if alloc.inner else iteration.ops[alloc.producer].phase
        tensor = {"id": alloc.tensor_id, "bytes": alloc.event.bytes,
                  "kind": {"forward": "activation", "backward": "gradient"}.get(phase, "other"),
                  "name": alloc.namer}
        if alloc.shape is not None:
            tensor["shape"] = alloc.shape
        if alloc.dtype is not None:
            tensor["dtype"] = alloc.dtype
        tensors.append(tensor)
    ops, retention = _op_entries(iteration, flow)
    if before is not None and before.freed:
        ops[0]["outputs"].insert(0, _PRE_WINDOW_FREED)
        if before.last > 0:
            ops[before.last]["inputs"].append(_PRE_WINDOW_FREED)
    source = _source(iteration, flow, trace, trace_path, et_path, retention)
    if before is not None:
        source["memory"]["pre_window_tensor"] = before.note()
    return {"format": FORMAT, "name": name or _default_name(trace_path), "source": source,
            "tensors": tensors, "ops": ops}


_PRE_WINDOW = "pre_window"
_PRE_WINDOW_FREED = "pre_window_freed"


@dataclass
class _PreWindow:
    """What was allocated before the window (``Total Allocated`` before its first event).

    ``kept``: not freed in the window (weights, optimizer state, the batch): one
    persistent tensor. ``freed``: pre-window buffers freed in the window while the ops
    run (the last iteration's gradients, freed by ``zero_grad``): one tensor from op 0
    to the op ``last`` of the last such free. ``early``: freed before the first op
    starts, so held during no op and left out.
    """
    kept: int
    freed: int
    early: int
    last: int

    def tensors(self) -> list:
        tensors = []
        if self.kept:
            tensors.append({"id": _PRE_WINDOW, "bytes": self.kept, "kind": "input",
                            "name": "allocated before the trace window "
                                    "(weights, optimizer state, batch)"})
        if self.freed:
            tensors.append({"id": _PRE_WINDOW_FREED, "bytes": self.freed, "kind": "other",
                            "name": "allocated before the trace window, freed in it "
                                    "(e.g. the last iteration's gradients)"})
        return tensors

    def note(self) -> str:
        parts = [f"{_PRE_WINDOW}: {self.kept} B allocated before the trace window and not "
                 "freed in it (weights, optimizer state, the batch, ...; no ET to tell "
                 "them apart), one persistent tensor of kind input, used by no op"]
        if self.freed:
            parts.append(f"{_PRE_WINDOW_FREED}: {self.freed} B allocated before the window "
                         f"and freed in it, held from o0 to o{self.last}")
        if self.early:
            parts.append(f"{self.early} B allocated before the window and freed before "
                         "its first op: left out")
        return "; ".join(parts)


def _pre_window(iteration: Iteration) -> "_PreWindow | None":
    """Split ``trace_baseline_bytes`` by when (if ever) the window frees those bytes."""
    baseline = iteration.stats["memory"].get("trace_baseline_bytes")
    if not baseline or baseline <= 0 or not iteration.ops:
        return None
    starts = op_starts(iteration.ops)
    freed = early = last = 0
    for m in iteration.pre_frees:
        k = bisect.bisect_right(starts, m.ts) - 1
        if k < 0:
            early -= m.bytes
        else:
            freed -= m.bytes
            last = max(last, k)
    freed = min(freed, baseline)              # a trace whose totals disagree: never < 0
    early = min(early, baseline - freed)
    return _PreWindow(baseline - freed - early, freed, early, last)


def _persistent_tensor(info: dict) -> dict:
    tensor = {"id": info["id"], "bytes": info["bytes"], "kind": info["kind"],
              "name": f"ET storage {info['storage']}"}
    if info["shape"] is not None:
        tensor["shape"] = info["shape"]
    if info["dtype"] is not None:
        tensor["dtype"] = info["dtype"]
    return tensor


def _op_entries(iteration: Iteration, flow: Flow | None):
    """One entry per kept op, and how many uses were added only to keep a lifetime.

    Inputs and updates are the ET's reads and in-place writes; a piece of a split op also
    reads its op's tensors allocated by earlier pieces; a tensor freed after the last of
    them (or, without an ET, any tensor) is also an input of the op at which its lifetime
    ends, the last op starting before its free.
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
    for k, op in enumerate(ops):
        for alloc in op.inner:
            if alloc.tensor_id not in touched[k]:
                inputs[k].append(alloc.tensor_id)
                touched[k].add(alloc.tensor_id)
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
        entry = {"id": f"o{k}", "name": op.name, "phase": op.phase,
                 "time_us": round(op.time_us, 3), "inputs": inputs[k],
                 "outputs": [a.tensor_id for a in op.allocations if not a.temporary]}
        if updates[k]:
            entry["updates"] = updates[k]
        if op.workspace:
            entry["workspace_bytes"] = op.workspace
        entries.append(entry)
    return entries, retention


def _source(iteration: Iteration, flow, trace: Trace, trace_path, et_path,
            retention: int) -> dict:
    names = [f"{Path(trace_path).name} (PyTorch profiler Kineto trace: GPU kernel times, "
             "[memory] events)"]
    if et_path is not None:
        names.append(f"{Path(et_path).name} (PyTorch Execution Trace: dataflow, "
                     "persistent tensors)")
    window = (f"ProfilerStep#{iteration.step}" if iteration.step is not None
              else "the whole trace (no ProfilerStep#N spans)")
    source = {"kind": "measured", "from": " + ".join(names), "timing": "measured",
              "iteration": iteration.step, "window": window,
              "ops": _ops_source(iteration),
              "gpu": iteration.stats["gpu"], "memory": _memory_source(iteration),
              # R15: which allocations a re-run of a measured op makes again is not in the
              # trace; the simulator counts every output (ops[].rerun_outputs absent)
              "rerun_outputs": "assumed: every output"}
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


def _ops_source(iteration: Iteration) -> dict:
    """How many top-level ops the window had, kept, and split into kernel ops."""
    split = iteration.stats.get("split")
    kept = split["kept"] if split else len(iteration.ops)
    with_gpu = split["with_gpu_work"] if split else sum(1 for op in iteration.ops if op.gpu_events)
    top = iteration.stats["top_level_ops"]
    ops = {"top_level": top, "kept": kept, "dropped_without_gpu_work": top - kept,
           "with_gpu_work": with_gpu}
    if split:
        ops["split"] = {"ops": split["ops"], "into_kernel_ops": split["pieces"],
                        "profile_ops": len(iteration.ops)}
    return ops


def _memory_source(iteration: Iteration) -> dict:
    allocations = iteration.allocations
    memory = dict(iteration.stats["memory"])
    memory.update(allocations=len(allocations),
                  tensors=sum(1 for a in allocations if not a.temporary),
                  temporaries=sum(1 for a in allocations if a.temporary),
                  outside_operators=sum(1 for a in allocations
                                        if a.namer == OUTSIDE))
    return memory


def _origins(trace_path, et_path) -> list:
    origins = []
    for path in (trace_path, et_path):
        if path is None:
            continue
        known = _KNOWN_FILES.get(text_sha256(path))
        if known is not None:
            origins.append(dict(known, file=Path(path).name))
    return origins


def text_sha256(path) -> str | None:
    """sha256 of a file's text (gunzipped if ``.gz``); None if it cannot be read."""
    try:
        raw = read_bytes(path)   # a regular file only, gunzipped if .gz, within the input size limit
    except (InputError, ValueError):
        return None
    return hashlib.sha256(raw).hexdigest()


def _default_name(trace_path) -> str:
    base = Path(trace_path).name
    for suffix in (".gz", ".json"):
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
    return base or "kineto"
