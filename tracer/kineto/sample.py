"""A sample Kineto trace, written event by event: one training step shaped like a
``torch.compile``'d model (the shape `swapplan import kineto` splits at kernel boundaries,
docs/tracing.md). For tests, the fidelity report and trying the import without a GPU:

    python -m tracer.kineto.sample compiled.json && swapplan import kineto compiled.json -o p.json

``compiled_step_trace()``: a forward ``CompiledFunction`` (24 kernels, each allocating a
saved activation, some with a temporary), a backward ``CompiledFunctionBackward`` (48
kernels, each allocating a gradient buffer, freeing the previous one and saved
activations after its launch, as Inductor's generated code does) and one optimizer op.
Taken whole, everything the backward allocates and every activation it frees would count
as alive at once.
"""
from __future__ import annotations

import itertools
import json
import sys

MAIN, AUTOGRAD = 10, 11
MiB = 1 << 20


class KinetoWriter:
    """Writes a PyTorch 2.x Kineto trace event by event (``cpu_op`` spans, ``cuda_runtime``
    launches linked to ``kernel`` events by correlation, ``[memory]`` events with ``Addr``);
    ``document()`` adds each memory event's ``Total Allocated``."""

    def __init__(self, before: int = 64 * MiB):
        self.events: list = []
        self.ids = itertools.count(1)
        self.before = before                     # allocated before the trace
        self.addrs = itertools.count(0x10000, 0x1000)

    def span(self, name, ts, dur, tid=MAIN, annotation=False):
        self.events.append({"ph": "X", "cat": "user_annotation" if annotation else "cpu_op",
                            "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                            "args": {"External id": next(self.ids)}})

    def kernel(self, name, ts, dur, tid=MAIN):
        """A kernel launched at ``ts`` (the CPU side) that ran ``dur`` us on the GPU."""
        correlation = next(self.ids)
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                            "pid": 1, "tid": tid, "ts": ts, "dur": 1,
                            "args": {"correlation": correlation}})
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7,
                            "ts": ts + 3, "dur": dur,
                            "args": {"device": 0, "stream": 7, "correlation": correlation}})

    def alloc(self, ts, size, tid=MAIN) -> int:
        addr = next(self.addrs)
        self.memory(ts, addr, size, tid)
        return addr

    def memory(self, ts, addr, size, tid=MAIN):
        self.events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": tid,
                            "ts": ts, "args": {"Device Type": 1, "Device Id": 0, "Addr": addr,
                                               "Bytes": size, "Total Reserved": 1 << 34}})

    def document(self) -> dict:
        total = self.before
        for event in sorted((e for e in self.events if e["name"] == "[memory]"),
                            key=lambda e: e["ts"]):
            total += event["args"]["Bytes"]
            event["args"]["Total Allocated"] = total
        return {"schemaVersion": 1, "traceEvents": self.events,
                "deviceProperties": [{"id": 0, "name": "Test GPU"}]}


def compiled_step_trace() -> dict:
    """One step of a compiled model (see the module docstring), as a trace document."""
    trace = KinetoWriter()
    trace.span("ProfilerStep#1", 0, 100_000, annotation=True)
    sizes = [(8 + (i * 5) % 11) * MiB for i in range(24)]
    saved = []
    trace.span("CompiledFunction", 100, 24 * 100)
    for i, size in enumerate(sizes):
        ts = 110 + 100 * i
        saved.append((trace.alloc(ts, size), size))
        trace.kernel(f"triton_poi_fused_convolution_relu_{i}", ts + 10, 40 + i)
        if i % 3 == 2:                       # a temporary, freed after its kernel
            tmp = trace.alloc(ts + 20, 4 * MiB)
            trace.kernel(f"triton_red_fused_native_batch_norm_{i}", ts + 30, 25)
            trace.memory(ts + 40, tmp, -4 * MiB)
    trace.span("CompiledFunctionBackward", 5000, 48 * 100, tid=AUTOGRAD)
    grad = None
    for j in range(48):
        ts = 5010 + 100 * j
        size = (6 + (j * 7) % 13) * MiB
        if j == 20:                          # a temporary between two launches
            extra = trace.alloc(ts - 5, 3 * MiB, AUTOGRAD)
            trace.memory(ts - 2, extra, -3 * MiB, AUTOGRAD)
        new = trace.alloc(ts, size, AUTOGRAD)
        trace.kernel(f"triton_poi_fused_threshold_backward_{j}", ts + 10, 30 + j, AUTOGRAD)
        if j == 30:                          # allocated for the next kernel before a free
            early = trace.alloc(ts + 15, 5 * MiB, AUTOGRAD)
        if j == 31:
            trace.memory(ts + 15, early, -5 * MiB, AUTOGRAD)
        if grad is not None:                 # del buf: after the last kernel reading it
            trace.memory(ts + 20, grad[0], -grad[1], AUTOGRAD)
        grad = (new, size)
        if j % 2 == 1:
            addr, old = saved.pop()
            trace.memory(ts + 25, addr, -old, AUTOGRAD)
        if j % 3 == 2:                       # a weight gradient, kept for the optimizer
            trace.alloc(ts + 30, 10 * MiB, AUTOGRAD)
            trace.kernel(f"triton_red_fused_sum_{j}", ts + 40, 20, AUTOGRAD)
    trace.memory(9900, grad[0], -grad[1], AUTOGRAD)
    trace.span("Optimizer.step#SGD.step", 20_000, 500, annotation=True)
    trace.span("aten::_foreach_add_", 20_010, 100)
    trace.kernel("multi_tensor_apply_kernel", 20_020, 80)
    return trace.document()


def trace_peak_bytes(document: dict) -> int:
    """A trace's own peak: its largest ``Total Allocated``."""
    return max(e["args"]["Total Allocated"] for e in document["traceEvents"] if e["name"] == "[memory]")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tracer.kineto.sample OUT.json")
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(compiled_step_trace(), out)
