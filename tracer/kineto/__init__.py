"""Import a PyTorch profiler (Kineto) trace, with the Execution Trace of the same run when
given, as a Profile: ``swapplan import kineto`` (docs/tracing.md).

The public interface is the names below (api.py). The steps, one module each: read.py
(the trace's events, nested by thread), iteration.py (the window and its ops), memory.py
(allocations paired with frees, lifetimes, workspaces), et.py (the Execution Trace and
its join), split.py (ops split at kernel launches), assemble.py (the profile's data).
sample.py writes a sample trace for tests, the fidelity report and trying the import
without a GPU (``python -m tracer.kineto.sample OUT.json``; import it as
``tracer.kineto.sample``).
"""
from .api import PeakFidelity, import_kineto, peak_fidelity

__all__ = ["import_kineto", "peak_fidelity", "PeakFidelity"]
