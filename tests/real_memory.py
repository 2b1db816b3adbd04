"""Memory of a training step run for real on the CPU, as the torch profiler sees it:
what the traced-peak tests compare profiles against (needs torch)."""
from __future__ import annotations

import bisect


def measure_step(step, params, bufs, states, batch) -> tuple[int, dict[str, int]]:
    """Run ``step`` once to warm up (one-time allocations stay out), then once under the
    profiler. The persistent tensors are allocated before, so what the profiler sees is
    the step's non-persistent memory. Returns the raw peak of the running sum of every
    allocation and free, and per phase the peak of that sum sampled at the end of each
    outermost ATen op (kernel boundaries)."""
    from torch.profiler import ProfilerActivity, profile

    step(params, bufs, states, batch)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(params, bufs, states, batch)
    events = list(prof.profiler.kineto_results.events())
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    times, running, total = [], [], 0
    for e in memory:
        total += e.nbytes()
        times.append(e.start_ns())
        running.append(total)
    spans = {e.name().split(":", 1)[1]: (e.start_ns(), e.end_ns())
             for e in events if e.name().startswith("phase:")}
    aten = sorted((e for e in events if e.name().startswith("aten::")),
                  key=lambda e: (e.start_ns(), -e.end_ns()))
    boundary = dict.fromkeys(spans, 0)
    end = -1
    for e in aten:
        if e.start_ns() < end:
            continue  # nested in the previous outermost op
        end = e.end_ns()
        i = bisect.bisect_right(times, end) - 1
        for phase, (first, last) in spans.items():
            if first <= e.start_ns() <= last:
                boundary[phase] = max(boundary[phase], running[i] if i >= 0 else 0)
    return max(running), boundary
