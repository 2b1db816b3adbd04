"""Capture one training step as an FX graph: make_fx over :class:`tracer.pytorch.step.TrainStep`
on fake tensors (shapes, dtypes and storages; no memory, no weights, no GPU)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.errors import InputError
from tracer.pytorch.dtypes import torch_dtype
from tracer.pytorch.kernel_choice import unpacked_batches
from tracer.pytorch.optim import state_names
from tracer.pytorch.step import TrainStep


def require_torch():
    """torch, or an InputError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise InputError("<argument>", "model",
                         "tracing needs torch (pip install 'swapplan[trace]')") from None
    return torch


@dataclass
class Capture:
    """A traced step: the FX graph and what its placeholders are."""
    graph_module: Any
    step: TrainStep
    params: list
    buffers: list
    states: list
    batch: list


def capture(workload, *, dtype: str = "fp32", optimizer: str = "adamw",
            gpu_kernels: bool = True, amp: str | None = None) -> Capture:
    """make_fx over the functional step on fake tensors (no memory is allocated).

    Under ``amp`` the parameters, buffers and floating inputs are in the amp dtype and
    the optimizer state (master copies first) in fp32; else everything is in ``dtype``.
    """
    torch = require_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    value_dtype = torch_dtype(amp or dtype)
    state_dtype = torch.float32 if amp else value_dtype
    module = workload.module
    if value_dtype != torch.float32:
        module.to(value_dtype)  # on meta: fake tensors cannot change dtype (.to fails)
    step = TrainStep(workload, optimizer, gpu_kernels, annotate=True, amp=amp)
    named_params = dict(module.named_parameters())
    named_buffers = dict(module.named_buffers())
    with FakeTensorMode():
        params = [torch.empty(named_params[n].shape, dtype=named_params[n].dtype,
                              requires_grad=True) for n in step.param_names]
        buffers = [torch.empty(named_buffers[n].shape, dtype=named_buffers[n].dtype)
                   for n in step.buffer_names]
        states = [[torch.empty(p.shape, dtype=state_dtype) for p in params]
                  for _ in state_names(optimizer, amp)]
        batch = [torch.empty(spec.shape, dtype=spec.dtype or value_dtype)
                 for spec in workload.inputs.values()]
    with fx_traceback.preserve_node_meta(), unpacked_batches():
        gm = make_fx(step, tracing_mode="fake")(params, buffers, states, batch)
    return Capture(gm, step, params, buffers, states, batch)
