"""The training step that is traced: forward, loss, backward, optimizer, as one function
of flat lists, with the annotations the lowering reads (module, autograd node, optimizer
part).

Markers from ``torch.profiler.record_function("phase:...")`` survive make_fx and give
each op its phase.

Mixed precision (``amp="fp16"`` / ``"bf16"``)
---------------------------------------------
Parameters, floating buffers and floating inputs are in the amp dtype; the forward runs
under autocast with CUDA's op lists (:mod:`tracer.pytorch.autocast`; the CPU's with
``gpu_kernels=False``); gradients come out in their parameter's dtype. The optimizer
state is fp32 and starts with a master copy of each parameter (``<param>.master``,
``optimizer_state``), then AdamW's moments (or SGD's momentum): 16 bytes per parameter
with AdamW. :meth:`TrainStep._amp_step` steps parameter by parameter, in three parts
that become three consecutive profile ops per parameter (graph nodes annotated with
``optim_slot`` / ``optim_part``, merged in :func:`tracer.pytorch.lowering._finish`):

- ``optim::<optimizer>_foreach``: inputs ``<param>.grad`` (low precision), updates
  the master and the moments; its kernels are the single-tensor ones
  (:func:`adamw_master`, :func:`sgd_master`) on the gradient cast to fp32, whose
  temporaries become the op's ``workspace_bytes`` (the most they hold at once);
- ``optim::cast_master``: inputs the master, outputs ``<param>.new`` (low precision,
  kind ``other``);
- ``optim::copy_param``: inputs ``<param>.new``, updates the parameter.

fp16 uses a static loss scale (:data:`LOSS_SCALE`): the forward ends with
``loss * LOSS_SCALE`` and each parameter's step unscales its fp32 gradient in place;
the overflow check and the scale update are not traced.
"""
from __future__ import annotations

import contextlib

from tracer.pytorch.kernel_choice import autocast_for, make_gpu_kernels_mode
from tracer.pytorch.optim import LOSS_SCALE, adamw_foreach, adamw_master, sgd_foreach, sgd_master

ROOT_MODULE = "model"
LOSS_MODULE = "loss"


class TrainStep:
    """One training step of a :class:`tracer.models.Workload` as a function of flat lists:
    ``step(params, buffers, states, batch) -> loss`` where ``states`` holds one list per
    optimizer state (``state_names(optimizer, amp)``), each aligned with ``params``.

    ``amp`` ("fp16" or "bf16", parameters in that dtype): the forward runs under
    autocast (CUDA's op policy with ``gpu_kernels``, else the CPU's) and the optimizer
    is the mixed-precision step of :meth:`_amp_step`.

    It runs eagerly on real tensors too (the tests compare a real CPU run of it with
    its trace). ``annotate=True`` adds the module and autograd-node annotations the
    tracer reads (no effect on the computation).
    """

    def __init__(self, workload, optimizer: str = "adamw", gpu_kernels: bool = True,
                 annotate: bool = False, amp: str | None = None):
        self.workload = workload
        self.optimizer = optimizer
        self.gpu_kernels = gpu_kernels
        self.annotate = annotate
        self.amp = amp
        module = workload.module
        self.param_names = [n for n, _ in module.named_parameters()]
        self.buffer_names = [n for n, _ in module.named_buffers()]
        self.input_names = list(workload.inputs)
        self.module_names = {m: (n or ROOT_MODULE) for n, m in module.named_modules()}

    def __call__(self, params, buffers, states, batch):
        import torch
        from torch.autograd.profiler import record_function
        module = self.workload.module
        values = dict(zip(self.param_names, params))
        buffer_values = dict(zip(self.buffer_names, buffers))

        def call(*args, **kwargs):
            return torch.func.functional_call(module, (values, buffer_values), args, kwargs,
                                              tie_weights=True, strict=False)

        with contextlib.ExitStack() as stack:
            stack.enter_context(record_function("phase:forward"))
            if self.gpu_kernels:
                stack.enter_context(make_gpu_kernels_mode())
            if self.annotate:
                stack.enter_context(self._module_annotations())
            if self.amp:
                stack.enter_context(autocast_for(self.amp, self.gpu_kernels))
            loss = self.workload.forward(call, dict(zip(self.input_names, batch)))
            # fp16: the backward starts from the loss times a static loss scale
            scaled = loss * LOSS_SCALE if self.amp == "fp16" else loss
        open_frames = _annotate_backward(scaled) if self.annotate else []
        try:
            with record_function("phase:backward"):
                grads = list(torch.autograd.grad(scaled, params))
        finally:  # a backward that failed midway leaves its nodes' annotations open
            while open_frames:
                open_frames.pop().__exit__(None, None, None)
        del scaled
        with record_function("phase:optimizer"), torch.no_grad():
            if self.amp:
                self._amp_step(params, grads, states)
            elif self.optimizer == "adamw":
                adamw_foreach(params, grads, states[0], states[1])
            else:
                sgd_foreach(params, grads, states[0])
        return loss.detach()

    def _amp_step(self, params, grads, states) -> None:
        """The mixed-precision optimizer step, parameter by parameter, in three parts:
        a. AdamW / SGD on the fp32 master from the low-precision gradient (which is
        freed after it; unscaled under fp16); b. ``new = master.to(dtype)``;
        c. ``param.copy_(new)``."""
        masters, moments = states[0], states[1:]
        inv_scale = 1.0 / LOSS_SCALE if self.amp == "fp16" else 1.0
        for i, param in enumerate(params):
            grad, grads[i] = grads[i], None
            with self._part(i, "step"):
                if self.optimizer == "adamw":
                    adamw_master(grad, masters[i], moments[0][i], moments[1][i],
                                 inv_scale=inv_scale)
                else:
                    sgd_master(grad, masters[i], moments[0][i], inv_scale=inv_scale)
            del grad
            with self._part(i, "cast_master"):
                new = masters[i].to(param.dtype)
            with self._part(i, "copy_param"):
                param.copy_(new)
            del new

    def _part(self, slot: int, part: str):
        """Annotate the graph nodes of one part of one parameter's mixed-precision step."""
        if not self.annotate:
            return contextlib.nullcontext()
        from torch.fx import traceback as fx_traceback
        return fx_traceback.annotate({"optim_slot": slot, "optim_part": part})

    @contextlib.contextmanager
    def _module_annotations(self):
        """Forward hooks that put the running module's name on every graph node."""
        from torch.fx import traceback as fx_traceback
        names = self.module_names
        frames: list = []

        def enter(mod, args):
            frame = fx_traceback.annotate({"module": names.get(mod, ROOT_MODULE)})
            frame.__enter__()
            frames.append(frame)

        def leave(mod, args, out):
            if frames:
                frames.pop().__exit__(None, None, None)

        handles = []
        for mod in self.workload.module.modules():
            handles.append(mod.register_forward_pre_hook(enter))
            handles.append(mod.register_forward_hook(leave, always_call=True))
        outer = fx_traceback.annotate({"module": LOSS_MODULE})
        outer.__enter__()
        try:
            yield
        finally:
            while frames:
                frames.pop().__exit__(None, None, None)
            outer.__exit__(None, None, None)
            for handle in handles:
                handle.remove()


def _annotate_backward(loss) -> list:
    """Pre/post hooks on every autograd node: the graph nodes its backward creates are
    annotated with the node's sequence number, which is its forward op's ``seq_nr``.
    Returns the list of open annotations (empty after a backward that completes)."""
    from torch.fx import traceback as fx_traceback
    frames: list = []
    root = loss.grad_fn
    if root is None:
        return frames

    def prehook_for(seq_nr):
        def prehook(grad_outputs):
            frame = fx_traceback.annotate({"grad_fn": seq_nr})
            frame.__enter__()
            frames.append(frame)
        return prehook

    def posthook(grad_inputs, grad_outputs):
        if frames:
            frames.pop().__exit__(None, None, None)

    seen = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        node.register_prehook(prehook_for(node._sequence_nr()))
        node.register_hook(posthook)
        todo.extend(fn for fn, _ in node.next_functions)
    return frames
