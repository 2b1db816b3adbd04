"""Real values for a captured step's graph inputs: the model's own seeded initialisation,
fresh optimizer state and a seeded synthetic batch (:func:`seeded_values`).

The density measurement (:mod:`tracer.density`) and the runtime
(:func:`runtime.bindings.initial_values`) run the traced graph on these values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tracer.pytorch.dtypes import torch_dtype
from tracer.pytorch.optim import state_names


@dataclass
class Values:
    """The persistent tensors of a step, real, as the graph takes them: parameters,
    buffers, optimizer state (one list per state, aligned with the parameters) and the
    batch. A step updates them in place."""
    params: list
    buffers: list
    states: list
    batch: list

    def flat(self) -> list:
        return [*self.params, *self.buffers, *(t for s in self.states for t in s), *self.batch]

    def clone(self) -> "Values":
        return Values([t.clone() for t in self.params], [t.clone() for t in self.buffers],
                      [[t.clone() for t in s] for s in self.states], [t.clone() for t in self.batch])

    def named(self, bindings) -> dict:
        """name -> tensor for every persistent tensor (the profile's tensor names;
        ``bindings``: a :class:`runtime.bindings.Bindings` of the graph)."""
        names = {b.node.name: bindings.profile.tensor_by_id[tid].name or tid
                 for tid, b in bindings.tensors.items() if b.role is not None}
        return {names.get(node.name, node.name): value for node, value in zip(bindings.placeholders, self.flat())}


def seeded_values(capture, workload, *, optimizer: str = "adamw", amp: str | None = None, dtype: str = "fp32",
                  seed: int = 0, optimizer_step: bool = True) -> Values:
    """Real, seeded values for the inputs of a traced ``capture`` (its fake values give
    the dtypes and shapes) from ``workload``, the same model built for a real run (on the
    CPU, or on the meta device: then materialised) after ``torch.manual_seed(seed)``:
    the model's own initialisation (a meta one materialised with each module's
    ``reset_parameters``), AdamW / SGD state as a fresh optimizer has it (zeros; under
    amp, fp32 master copies first), and a synthetic batch (floating: standard normal;
    indices: uniform below the model's vocabulary or class count, 0 or 1 when the model
    does not say; bool: true).

    ``optimizer_step=False`` is for a run that stops before the optimizer: the parameters
    are the module's own tensors where their dtype is the graph's (not copies), and every
    optimizer state is a zero-stride stand-in of its shape (no memory: GPT-2's AdamW
    moments would take 1 GB)."""
    import torch

    step = capture.step
    module = workload.module
    _materialise(module)
    dtype = torch_dtype(amp or dtype)
    state_dtype = torch.float32 if amp else dtype
    named_params = dict(module.named_parameters(remove_duplicate=False))   # the graph's names, tied or not
    named_buffers = dict(module.named_buffers(remove_duplicate=False))
    fakes = capture
    params = [_real(named_params[n], f.dtype, optimizer_step) for n, f in zip(step.param_names, fakes.params)]
    buffers = [_real(named_buffers[n], f.dtype) for n, f in zip(step.buffer_names, fakes.buffers)]
    states = []
    for name in state_names(optimizer, amp):
        if not optimizer_step:
            stand_in = torch.zeros((), dtype=torch.float32 if name == "master" else state_dtype)
            states.append([stand_in.expand(p.shape) for p in params])
        elif name == "master":
            states.append([p.detach().to(torch.float32).clone() for p in params])
        else:
            states.append([torch.zeros(p.shape, dtype=state_dtype) for p in params])
    gen = torch.Generator().manual_seed((seed + 1) % 2**64)   # seed 2^64 - 1 too (torch's largest)
    batch = []
    for (name, spec), fake in zip(workload.inputs.items(), fakes.batch):
        if fake.dtype == torch.bool:
            batch.append(torch.ones(fake.shape, dtype=torch.bool))
        elif fake.is_floating_point():
            batch.append(torch.randn(fake.shape, generator=gen).to(fake.dtype))
        else:
            high = spec.high or 2
            batch.append(torch.randint(0, high, fake.shape, generator=gen, dtype=fake.dtype))
    return Values(params, buffers, states, batch)


def _real(tensor, dtype, copy: bool = True):
    """A detached, contiguous tensor of ``tensor`` in ``dtype`` (a copy unless ``copy`` is
    False and nothing changes)."""
    import torch
    with torch.no_grad():
        return tensor.detach().to(dtype=dtype, copy=copy).contiguous()


def _materialise(module) -> None:
    """Give a module built on the meta device real, seeded values: zeros, then each
    submodule's ``reset_parameters`` (and transformers' ``init_weights``), then a
    fan-in scaled normal for any matrix left all zero."""
    import torch
    if not any(t.is_meta for t in (*module.parameters(), *module.buffers())):
        return
    module.to_empty(device="cpu")
    with torch.no_grad():
        for t in (*module.parameters(), *module.buffers()):
            t.zero_()
        for sub in module.modules():
            reset = getattr(sub, "reset_parameters", None)
            if callable(reset):
                reset()
        init = getattr(module, "init_weights", None)
        if callable(init) and hasattr(module, "config"):
            init()
        for p in module.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 1.0 / math.sqrt(max(1, p[0].numel())))
