"""Tracing one real PyTorch training step on fake tensors (``swapplan trace``; needs the
``trace`` extra): trace.py is the entry point (:func:`tracer.pytorch.trace.trace`).

One module per stage: step.py (the step as one function: forward, loss, backward,
optimizer, mixed precision), optim.py (the optimizers restated op for op),
kernel_choice.py and autocast.py (the kernels and autocast lists a CUDA run picks),
capture.py (make_fx on fake tensors), lowering.py (graph to a profile's tensors and ops,
timed by tracer/roofline.py), splittable.py (which ops may run in chunks, R54),
node_identity.py (the ``fx`` a runtime reads), values.py (real seeded values for the
graph's inputs), cpu_kernels.py (CPU kernels for CUDA-only ops), dtypes.py (dtype names).
runtime/ reuses capture, lowering, node_identity, values and cpu_kernels.
"""
