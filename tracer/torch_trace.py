"""Trace one real PyTorch training step into a Profile, on fake tensors.

``trace(model, batch=..., seq=...)`` builds a model of :mod:`tracer.models` on the
meta device, fakes its parameters, buffers, optimizer state and batch
(``FakeTensorMode``: shapes, dtypes and storages, no memory, no weights, no GPU,
nothing downloaded) and records one full training step with
``make_fx(step, tracing_mode="fake")`` at the ATen level:

    forward (``torch.func.functional_call``) -> loss -> ``torch.autograd.grad``
    -> the optimizer written with the ``_foreach_*`` ops that
       ``torch.optim.AdamW(foreach=True)`` (or ``SGD(momentum=0.9, foreach=True)``) runs.

The real ``torch.optim`` optimizers cannot be traced (they read the step count with
``.item()``; ``capturable=True`` wants CUDA), so :func:`adamw_foreach` and
:func:`sgd_foreach` restate their non-capturable multi-tensor paths op for op (the
CPU-side step counters launch no GPU kernel and are left out). Markers from
``torch.profiler.record_function("phase:...")`` survive make_fx and give each op its
phase.

GPU kernel choices (``gpu_kernels=True``, the default)
-----------------------------------------------------
On CPU, PyTorch picks other kernels than a CUDA run: dropout makes a float mask
(``bernoulli_`` + ``div_`` + ``mul``) and attention with dropout or a mask takes the
math path, which materialises B x H x S x S scores and probabilities. A profile meant
for a GPU uses the GPU's choices, so while the forward runs, a ``TorchFunctionMode``
(``GpuKernels``) substitutes what the CUDA dispatcher would call:

- ``F.dropout`` (training, 0 < p < 1) -> ``aten::native_dropout``: the output plus a
  bool mask; its backward is ``aten::native_dropout_backward``.
- ``F.scaled_dot_product_attention`` -> ``aten::_scaled_dot_product_flash_attention``
  for fp16/bf16 without a mask, else ``aten::_scaled_dot_product_efficient_attention``
  (what an A100/H100 picks for fp32 or a mask). Both save q, k, v (views of their
  projection's output), the output and a fp32 logsumexp of B x H x S (padded to a
  multiple of 32 for the efficient kernel), never a B x H x S x S matrix; their
  backward ops are the matching ``..._backward`` kernels. ``enable_gqa`` repeats k and v
  first. These ops' fake (meta) kernels run on fake CPU tensors, so the substitution
  needs no custom op.
- transformers builds an explicit S x S mask when it cannot read the batch (it
  checks the position ids for packed sequences, which fake tensors cannot answer).
  The batch is one unpadded sequence per row, for which a real run finds no packing
  and calls SDPA with ``is_causal=True`` and no mask; while tracing, the tracer gives
  transformers that answer (``masking_utils.find_packed_sequence_indices`` returns
  None). This applies in both kernel modes.

``gpu_kernels=False`` keeps the CPU's own choices (used to check the tracer against a
real CPU run of the same step, see tests/test_trace.py).

From the graph to the profile
-----------------------------
- One tensor per storage (``untyped_storage()`` identity of the fake values): views
  and in-place results are folded into their base storage. Kinds: parameters
  ``weight``; buffers (batch-norm running statistics, HF position ids) also
  ``weight`` (persistent model state, no optimizer op; named after the buffer);
  AdamW ``exp_avg`` / ``exp_avg_sq`` and SGD ``momentum_buffer`` ``optimizer_state``;
  the batch ``input``; new storages of the forward ``activation``, of the backward
  ``gradient``. Storages of 0 bytes are left out.
- Which graph nodes become profile ops: every ATen op that writes memory, i.e. that
  returns a new storage or writes one of its arguments (schema ``(a!)``). Folded
  away, with no op: view and alias ops (their outputs share an existing storage and
  they write nothing: ``view``, ``_unsafe_view``, ``t``, ``transpose``, ``expand``,
  ``slice``, ``split``, ``detach``, ``alias``, ...), ``getitem``, the profiler
  markers, and allocation-only ops (``empty``, ``empty_like``, ``empty_strided``,
  ``new_empty``, ``new_empty_strided``): their storage becomes an output of the first
  kernel that touches it (for instance the ``bernoulli_`` that fills a CPU dropout
  mask).
- In-place writes are ``updates`` (the optimizer, ``relu_``, ``add_`` of a residual,
  batch-norm running statistics, in-place gradient accumulation); a tensor written
  in place is not also listed in ``inputs``.
- Gradient accumulation follows the autograd engine of a real run: where a tensor
  feeds several ops, its gradient contributions are summed in place into the first
  one when the engine holds the last reference to it (it is no view and has no
  later use), else out of place (:func:`_accumulate_in_place`). make_fx itself always
  records the out-of-place ``add`` because the tracer holds extra references.
- The optimizer: each ``_foreach_*`` kernel is split per list element, and the
  slices of one parameter are merged into one op per parameter, in parameter order
  (``optim::adamw_foreach``: inputs its gradient, updates the weight, ``exp_avg``
  and ``exp_avg_sq``; ``optim::sgd_foreach``: the gradient, updates the weight and
  ``momentum_buffer``), so that a weight and its state need to be resident only for
  their own step, as a swapping runtime steps them. Its time is the parameter's
  share (by bytes) of each foreach kernel's roofline time (the total is the foreach
  kernels' time), its FLOPs 0. The foreach form's one temporary,
  ``sqrt(exp_avg_sq)`` for every parameter at once, is allocated only after the
  last kernel reading the gradients, which are then freed: its peak is persistent +
  max(all gradients, all temporaries) = persistent + all gradients, exactly what the
  per-parameter ops hold at the first optimizer op (every gradient is live there).
  So the temporary is folded away and adds no workspace (with ``runtime=True`` it is
  each op's workspace: a runtime stepping parameter by parameter holds one at a time).
- ``flops`` from ``torch.utils.flop_counter``'s registry (matmul, convolution,
  attention; 0 for every other op, whose time is memory-bound anyway); ``time_us``
  from :func:`tracer.roofline.kernel_time_us` with the dtype's peak, where the bytes
  moved are the distinct elements of every tensor argument read plus every tensor
  written (an embedding reads only the gathered rows).
- ``module``: the qualified name of the innermost ``nn.Module`` whose forward ran
  the op (forward hooks annotate the graph nodes); backward ops get the module of the
  forward op that created their autograd node (autograd node pre-hooks carry its
  sequence number into the graph, as AOTAutograd does); gradient accumulations the
  module of the backward op before them; optimizer ops the module owning the
  parameter. The root module is ``model``; a loss computed outside it is ``loss``.

Node identity for a runtime (``runtime=True``)
---------------------------------------------
Every op and tensor also gets ``fx`` (simulator.profile.OpNode / TensorNode;
docs/runtime.md): an op's graph node names and ATen overloads (several for a merged
optimizer op, with the foreach ``slot`` it runs), its ``rewrite`` (``inplace_accumulate``
for an accumulation made in place above, ``foreach_split``) and whether it is ``random``
(tagged ``nondeterministic_seeded``); a tensor's node and position among that node's
tensor outputs (an allocation-only node for a storage a later kernel fills), or for a
graph input its placeholder and role (parameter, buffer, optimizer_state, batch,
target). ``source`` gets ``fx: 1``. Without it nothing changes.

Mixed precision (``amp="fp16"`` / ``"bf16"``)
---------------------------------------------
Parameters, floating buffers and floating inputs are in the amp dtype; the forward runs
under autocast with CUDA's op lists (:mod:`tracer.autocast`; the CPU's with
``gpu_kernels=False``); gradients come out in their parameter's dtype. The optimizer
state is fp32 and starts with a master copy of each parameter (``<param>.master``,
``optimizer_state``), then AdamW's moments (or SGD's momentum): 16 bytes per parameter
with AdamW. :meth:`TrainStep._amp_step` steps parameter by parameter, in three parts
that become three consecutive profile ops per parameter (graph nodes annotated with
``optim_slot`` / ``optim_part``, merged in :func:`_finish`):

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

Every problem raises ``InputError("<argument>", field, problem)`` with a one-line
problem: unknown model, bad ``module:callable``, bad sizes, a dtype the hardware
lacks, or a model that fails to trace; a bad ``hf_config`` file raises InputError
naming the file and the field.
"""
from __future__ import annotations

import contextlib
import operator
import sys
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import InputError
from simulator.hardware import Hardware, load_hardware
from simulator.profile import Op, OpNode, Profile, Tensor, TensorNode
from tracer.roofline import DTYPE_BYTES, kernel_time_us, peak_tflops

DEFAULT_HARDWARE = "a100-40gb-pcie4"
OPTIMIZERS = ("adamw", "sgd")
DTYPES = tuple(DTYPE_BYTES)
AMP_DTYPES = ("fp16", "bf16")
# torch.optim defaults (AdamW) and a common SGD setting; the values change no shape.
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2}
SGD = {"lr": 1e-2, "momentum": 0.9, "dampening": 0.0}
ROOT_MODULE = "model"
LOSS_MODULE = "loss"
FX_VERSION = 1  # source["fx"] of profiles traced with runtime=True (docs/runtime.md)
_STEP = 1  # the optimizer step whose bias corrections are used (a Python number)
# fp16 mixed precision: the static loss scale (torch.amp.GradScaler's initial scale); the
# backward starts from loss x LOSS_SCALE and each parameter's step unscales its gradient.
LOSS_SCALE = 2.0 ** 16


def _torch():
    try:
        import torch
    except ImportError:
        raise InputError("<argument>", "model",
                         "tracing needs torch (pip install 'swapplan[trace]')") from None
    return torch


# ----------------------------------------------------------------------------- optimizers


def adamw_foreach(params, grads, exp_avgs, exp_avg_sqs, *, lr=ADAMW["lr"], beta1=ADAMW["beta1"],
                  beta2=ADAMW["beta2"], eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
                  step=_STEP):
    """One AdamW step with the ``_foreach_*`` kernels of ``torch.optim.AdamW(foreach=True)``
    (non-capturable, no amsgrad), in its order. ``grads`` is a list that is emptied once
    the last kernel reading it has run, as torch.optim's ``del device_grads`` frees it."""
    import torch
    torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    grads.clear()
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = [-(lr / bias_correction1)] * len(params)
    exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(exp_avg_sq_sqrt, [bias_correction2 ** 0.5] * len(params))
    torch._foreach_add_(exp_avg_sq_sqrt, eps)
    torch._foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt, step_size)


def sgd_foreach(params, grads, momentum_buffers, *, lr=SGD["lr"], momentum=SGD["momentum"],
                dampening=SGD["dampening"]):
    """One SGD-with-momentum step as ``torch.optim.SGD(momentum=..., foreach=True)`` runs
    it once the momentum buffers exist (no weight decay, no Nesterov)."""
    import torch
    torch._foreach_mul_(momentum_buffers, momentum)
    torch._foreach_add_(momentum_buffers, grads, alpha=1 - dampening)
    grads.clear()
    torch._foreach_add_(params, momentum_buffers, alpha=-lr)


def adamw_master(grad, master, exp_avg, exp_avg_sq, *, lr=ADAMW["lr"], beta1=ADAMW["beta1"],
                 beta2=ADAMW["beta2"], eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
                 step=_STEP, inv_scale=1.0):
    """Part a of a mixed-precision AdamW step: one parameter's fp32 ``master`` and moments
    from its low-precision gradient, with the single-tensor kernels of
    ``torch.optim.AdamW(foreach=False)`` (in place where they can be), on the gradient
    cast to fp32 (and unscaled in place when ``inv_scale`` is not 1: fp16 loss scaling).
    Its temporaries, the fp32 gradient and then the denominator, are freed as soon as
    they are last used."""
    g = grad.float()
    if inv_scale != 1.0:
        g.mul_(inv_scale)
    master.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    del g
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    denom = exp_avg_sq.sqrt().div_(bias_correction2 ** 0.5).add_(eps)
    master.addcdiv_(exp_avg, denom, value=-(lr / bias_correction1))


def sgd_master(grad, master, momentum_buffer, *, lr=SGD["lr"], momentum=SGD["momentum"],
               dampening=SGD["dampening"], inv_scale=1.0):
    """Part a of a mixed-precision SGD-with-momentum step: one parameter's fp32 ``master``
    and momentum from its low-precision gradient (its one temporary: the fp32 gradient,
    unscaled in place when ``inv_scale`` is not 1)."""
    g = grad.float()
    if inv_scale != 1.0:
        g.mul_(inv_scale)
    momentum_buffer.mul_(momentum).add_(g, alpha=1 - dampening)
    del g
    master.add_(momentum_buffer, alpha=-lr)


def state_names(optimizer: str, amp: str | None = None) -> tuple[str, ...]:
    """The per-parameter optimizer state tensors, in the order the step takes them
    (under ``amp``, the fp32 master copy first)."""
    names = ("exp_avg", "exp_avg_sq") if optimizer == "adamw" else ("momentum_buffer",)
    return ("master",) + names if amp else names


# ----------------------------------------------------------------------------- kernel choices


def _make_gpu_kernels_mode():
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    aten = torch.ops.aten

    class GpuKernels(TorchFunctionMode):
        """Route dropout and SDPA to the kernels a CUDA run picks (see the module doc)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.dropout or func is torch.dropout or func is torch.nn.functional.dropout:
                return self._dropout(func, args, kwargs)
            if func is F.scaled_dot_product_attention:
                return self._attention(*args, **kwargs)
            return func(*args, **kwargs)

        @staticmethod
        def _dropout(func, args, kwargs):
            names = ("input", "p", "training", "inplace") if func is F.dropout else \
                ("input", "p", "train")
            bound = dict(zip(names, args))
            bound.update(kwargs)
            x = bound["input"]
            p = bound.get("p", 0.5)
            training = bound.get("training", bound.get("train", True))
            if not training or p == 0 or x.numel() == 0:
                return x
            if p == 1:
                return func(*args, **kwargs)
            out = aten.native_dropout.default(x, float(p), True)[0]
            if bound.get("inplace", False):
                return x.copy_(out)
            return out

        @staticmethod
        def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                       scale=None, enable_gqa=False):
            if torch.is_autocast_enabled("cpu"):  # CUDA autocast casts SDPA's arguments
                low = torch.get_autocast_dtype("cpu")
                query, key, value, attn_mask = (
                    t.to(low) if t is not None and t.is_floating_point() and t.dtype != low else t
                    for t in (query, key, value, attn_mask))
            if enable_gqa and key.shape[-3] != query.shape[-3]:
                groups = query.shape[-3] // key.shape[-3]
                key = key.repeat_interleave(groups, dim=-3)
                value = value.repeat_interleave(groups, dim=-3)
            if attn_mask is None and query.dtype in (torch.float16, torch.bfloat16) \
                    and query.shape[-1] <= 256:
                return aten._scaled_dot_product_flash_attention.default(
                    query, key, value, float(dropout_p), bool(is_causal), False, scale=scale)[0]
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(
                    attn_mask.logical_not(), float("-inf"))
            return aten._scaled_dot_product_efficient_attention.default(
                query, key, value, attn_mask, True, float(dropout_p), bool(is_causal),
                scale=scale)[0]

    return GpuKernels()


def _torch_dtype(name: str):
    """The torch dtype of "fp32", "fp16" or "bf16"."""
    import torch
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _autocast(amp: str, gpu_kernels: bool):
    """Autocast to ``amp``'s dtype with the op policy of CUDA (GPU kernels) or the CPU."""
    from tracer.autocast import cpu_autocast, cuda_autocast
    dtype = _torch_dtype(amp)
    return cuda_autocast(dtype) if gpu_kernels else cpu_autocast(dtype)


@contextlib.contextmanager
def _unpacked_batches():
    """Tell transformers the batch holds one sequence per row (see the module doc)."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None or not hasattr(masking, "find_packed_sequence_indices"):
        yield
        return
    original = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


# ----------------------------------------------------------------------------- the step


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
                stack.enter_context(_make_gpu_kernels_mode())
            if self.annotate:
                stack.enter_context(self._module_annotations())
            if self.amp:
                stack.enter_context(_autocast(self.amp, self.gpu_kernels))
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


# ----------------------------------------------------------------------------- capture


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
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    torch_dtype = _torch_dtype(amp or dtype)
    state_dtype = torch.float32 if amp else torch_dtype
    module = workload.module
    if torch_dtype != torch.float32:
        module.to(torch_dtype)  # on meta: fake tensors cannot change dtype (.to fails)
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
        batch = [torch.empty(spec.shape, dtype=spec.dtype or torch_dtype)
                 for spec in workload.inputs.values()]
    with fx_traceback.preserve_node_meta(), _unpacked_batches():
        gm = make_fx(step, tracing_mode="fake")(params, buffers, states, batch)
    return Capture(gm, step, params, buffers, states, batch)


# ----------------------------------------------------------------------------- lowering

_ALLOC_ONLY = ("empty.memory_format", "empty_like.default", "empty_strided.default",
               "new_empty.default", "new_empty_strided.default", "empty.names")
_GATHER = ("embedding.default",)


@dataclass(eq=False)
class _T:
    """A tensor (storage) while lowering."""
    index: int
    bytes: int
    kind: str
    name: str
    shape: tuple
    dtype: str
    pending: bool = False     # allocated by an allocation-only op, not yet produced
    dropped: bool = False     # folded away (optimizer temporary, in-place accumulation)
    node: str | None = None   # the graph node whose output (``output``) is the storage
    output: int | None = None
    role: str | None = None   # graph inputs: parameter, buffer, optimizer_state, batch, target


@dataclass
class _RawOp:
    """An op while lowering: tensors as _T, time not yet computed (foreach slices: shared)."""
    name: str
    phase: str
    module: str
    inputs: list
    outputs: list
    updates: list
    flops: float
    bytes_moved: float
    slot: int | None = None   # list position of a foreach slice / amp step's parameter
    kernel: int | None = None  # which foreach kernel a slice belongs to
    part: str = "step"         # which part of a parameter's optimizer step (_OPTIM_PARTS)
    time_us: float | None = None
    dense: tuple = ()          # accumulations: which inputs are whole, contiguous storages
    workspace: int = 0         # bytes of internal temporaries (merged optimizer ops)
    nodes: list = field(default_factory=list)      # graph node names it runs, in order
    overloads: list = field(default_factory=list)  # their ATen overloads
    rewrite: str | None = None  # see simulator.profile.OpNode
    random: bool = False        # draws from the RNG


@dataclass
class _Lowering:
    """The tensors (one per storage) and raw ops built so far."""
    hw: Hardware
    dtype: str
    tensors: list = field(default_factory=list)
    by_storage: dict = field(default_factory=dict)
    ops: list = field(default_factory=list)

    def new_tensor(self, storage, val, kind: str, name: str, pending: bool = False,
                   node=None, output: int | None = None, role: str | None = None) -> _T | None:
        nbytes = int(storage.nbytes())
        if nbytes == 0:
            return None
        t = _T(len(self.tensors), nbytes, kind, name, _storage_shape(val, nbytes),
               _dtype_name(val.dtype), pending, node=None if node is None else node.name,
               output=output, role=role)
        self.tensors.append(t)
        self.by_storage[storage._cdata] = t
        return t

    def lookup(self, val) -> _T | None:
        return self.by_storage.get(val.untyped_storage()._cdata)


def _dtype_name(dtype) -> str:
    import torch
    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
             torch.float64: "fp64", torch.int64: "int64", torch.int32: "int32",
             torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}
    return names.get(dtype, str(dtype).replace("torch.", ""))


def _storage_shape(val, nbytes: int) -> tuple:
    """The tensor's shape when it spans its whole storage, else the flat element count."""
    if val.numel() * val.element_size() == nbytes:
        return tuple(int(d) for d in val.shape)
    return (nbytes // max(val.element_size(), 1),)


def _distinct_bytes(val) -> int:
    """Bytes of the distinct elements a (possibly broadcast) view touches."""
    count = 1
    for size, stride in zip(val.shape, val.stride()):
        if stride != 0:
            count *= int(size)
    return min(count * val.element_size(), int(val.untyped_storage().nbytes()))


def _tensors_in(obj, out: list) -> list:
    import torch
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _tensors_in(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            _tensors_in(item, out)
    return out


def _values(node_args):
    """Replace graph nodes by their fake values."""
    from torch.fx import Node
    from torch.utils._pytree import tree_map
    return tree_map(lambda a: a.meta.get("val") if isinstance(a, Node) else a, node_args)


# Ops that write arguments their schema does not mark ``(a!)``: batch norm in training
# updates the running statistics (arguments 3 and 4; argument 5 is ``training``).
_UNMARKED_WRITES = {"native_batch_norm": (3, 4), "cudnn_batch_norm": (3, 4),
                    "miopen_batch_norm": (3, 4)}


def _written_args(target, args, kwargs) -> list:
    """The argument values the op writes in place: its schema's ``(a!)`` arguments, and
    batch norm's running statistics in training."""
    written = []
    unmarked = _UNMARKED_WRITES.get(target.overloadpacket.__name__)
    if unmarked and len(args) > 5 and args[5]:
        _tensors_in([args[i] for i in unmarked], written)
    for i, arg in enumerate(target._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if arg.kwarg_only or i >= len(args):
            value = kwargs.get(arg.name)
        else:
            value = args[i]
        _tensors_in(value, written)
    return written


def _flops(target, args, kwargs, out) -> float:
    from torch.utils.flop_counter import flop_registry
    formula = flop_registry.get(target.overloadpacket)
    if formula is None:
        return 0.0
    try:
        return float(formula(*args, **kwargs, out_val=out))
    except Exception:  # a formula that does not accept this overload's arguments
        return 0.0


def _op_name(target) -> str:
    packet = target.overloadpacket
    return f"{target.namespace}::{packet.__name__}"


def _qualified(target) -> str:
    """``namespace::packet.overload`` (e.g. ``aten::add.Tensor``): exactly which kernel."""
    return f"{target.namespace}::{_overload_name(target)}"


def _is_random(target) -> bool:
    """An op that draws from the RNG (tagged ``nondeterministic_seeded``: dropout,
    bernoulli, rand*, the attention kernels with dropout)."""
    import torch
    return torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())


@dataclass
class _Walk:
    """What the walk over the graph carries from one node to the next."""
    phase: str = "other"                                  # from the last ``phase:`` marker
    ignored: set = field(default_factory=set)             # storages of captured constants
    seq_module: dict = field(default_factory=dict)        # forward seq_nr -> its module
    last_backward_module: str = LOSS_MODULE               # module of the last op charged
    kernel_count: int = 0                                 # optimizer foreach kernels so far
    kernel_nodes: set = field(default_factory=set)        # graph nodes that became profile ops


@dataclass
class _OpValues:
    """The fake tensor values one op reads, returns and writes in place."""
    ins: list
    outs: list
    written: list


def lower(cap: Capture, hw: Hardware, dtype: str, optimizer: str,
          runtime: bool = False) -> tuple[list, list]:
    """Walk the graph in order and build the profile's tensors and ops (kernel times use
    the peak of ``dtype``, or of the amp dtype under amp). ``runtime``: add the node
    identity (``fx``) to every op and tensor, and count the per-parameter optimizer
    temporaries as workspace (see :func:`trace`)."""
    import torch
    gm = cap.graph_module
    low = _Lowering(hw, cap.step.amp or dtype)
    _add_graph_inputs(low, gm, cap.step, optimizer)
    record_enter = torch.ops.profiler._record_function_enter_new.default
    walk = _Walk()
    for node in gm.graph.nodes:
        role = _node_role(node, record_enter)
        if role == "constant":
            _ignore_constant(gm, node, walk.ignored)
        elif role == "marker":
            walk.phase = _phase_after(node.args[0], walk.phase)
        elif role == "op":
            _lower_op(low, walk, node)
    _accumulate_in_place(low)
    return _finish(low, cap.step, optimizer, runtime)


def _graph_input_roles(step: TrainStep, optimizer: str) -> list[tuple[str, str]]:
    """(kind, name) of every graph input, in the order the step takes its arguments."""
    return ([("weight", n) for n in step.param_names]
            + [("weight", n) for n in step.buffer_names]
            + [("optimizer_state", f"{p}.{s}") for s in state_names(optimizer, step.amp)
               for p in step.param_names]
            + [("input", f"batch.{n}") for n in step.input_names])


def input_roles(step: TrainStep) -> list[str]:
    """The role of every graph input (simulator.profile.INPUT_ROLES), in order: a batch
    tensor that only the loss reads (``labels``, a user model's ``target<i>``) is a
    ``target``."""
    states = len(state_names(step.optimizer, step.amp))
    return (["parameter"] * len(step.param_names) + ["buffer"] * len(step.buffer_names)
            + ["optimizer_state"] * (states * len(step.param_names))
            + ["target" if n == "labels" or n.startswith("target") else "batch" for n in step.input_names])


def _add_graph_inputs(low: _Lowering, gm, step: TrainStep, optimizer: str) -> None:
    """Register the placeholders' storages first, so that ops find them by their role."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    roles = _graph_input_roles(step, optimizer)
    if len(roles) != len(placeholders):
        raise RuntimeError(f"expected {len(roles)} graph inputs, found {len(placeholders)}")
    for (kind, name), role, node in zip(roles, input_roles(step), placeholders):
        val = node.meta["val"]
        low.new_tensor(val.untyped_storage(), val, kind, name, node=node, role=role)


def _node_role(node, record_enter) -> str | None:
    """Classify a node: "constant" (get_attr), "marker" (record_function), "op" (ATen), or None."""
    import torch
    if node.op == "get_attr":
        return "constant"
    if node.op != "call_function" or node.target is operator.getitem:
        return None
    if node.target is record_enter:
        return "marker"
    if not isinstance(node.target, torch._ops.OpOverload) or node.target.namespace == "profiler":
        return None
    return "op"


def _ignore_constant(gm, node, ignored: set) -> None:
    """Leave out a constant the trace captured (not swappable): remember its storage."""
    import torch
    val = getattr(gm, node.target, None)
    if isinstance(val, torch.Tensor):
        ignored.add(val.untyped_storage()._cdata)


def _phase_after(label, phase: str) -> str:
    """The phase after a ``record_function`` marker: its ``phase:`` label, else unchanged."""
    if isinstance(label, str) and label.startswith("phase:"):
        return label.split(":", 1)[1]
    return phase


def _module_of(walk: _Walk, meta: dict) -> str:
    """The module an op is charged to (module doc); a forward op also maps its seq_nr to it."""
    custom = meta.get("custom") or {}
    if walk.phase == "forward":
        module = custom.get("module") or LOSS_MODULE
        walk.seq_module.setdefault(meta.get("seq_nr", -1), module)
        walk.last_backward_module = module  # the backward seed belongs to the loss
        return module
    if walk.phase == "backward":
        if "grad_fn" in custom:  # inside an autograd node's backward
            return walk.seq_module.get(custom["grad_fn"], walk.last_backward_module)
        return walk.last_backward_module  # the backward seed, or a gradient accumulation
    return ROOT_MODULE


def _overload_name(target) -> str:
    """``packet.overload`` (e.g. ``add.Tensor``), the key of the op tables above."""
    return f"{target.overloadpacket.__name__}.{target._overloadname}"


def _lower_op(low: _Lowering, walk: _Walk, node) -> None:
    """Route one ATen op: allocation-only ops, optimizer foreach kernels, other kernels."""
    target = node.target
    module = _module_of(walk, node.meta)
    args = _values(node.args)
    kwargs = _values(node.kwargs)
    out = node.meta.get("val")
    if _overload_name(target) in _ALLOC_ONLY:
        _reserve_allocations(low, _tensors_in(out, []), walk.phase, node)
    elif target.overloadpacket.__name__.startswith("_foreach_") and walk.phase == "optimizer":
        walk.kernel_count += 1
        _lower_foreach(low, node, args, kwargs, out, walk.phase, walk.kernel_count)
    else:
        before = len(low.ops)
        _lower_kernel(low, walk, node, module, args, kwargs, out)
        custom = node.meta.get("custom") or {}
        if walk.phase == "optimizer" and "optim_slot" in custom:
            for raw in low.ops[before:]:  # a part of a mixed-precision step: merged in _finish
                raw.slot, raw.part = custom["optim_slot"], custom["optim_part"]


def _reserve_allocations(low: _Lowering, out_vals: list, phase: str, node) -> None:
    """Register an allocation-only op's storages as pending, for the first kernel to touch."""
    for k, val in enumerate(out_vals):
        storage = val.untyped_storage()
        if storage._cdata not in low.by_storage:
            low.new_tensor(storage, val, _kind_for(phase), "", pending=True, node=node, output=k)


def _lower_kernel(low: _Lowering, walk: _Walk, node, module: str, args, kwargs, out) -> None:
    """Append the raw op of a kernel that writes memory; a view or alias adds nothing."""
    target = node.target
    kind = _kind_for(walk.phase)
    stem = f"{module}.{target.overloadpacket.__name__}"
    vals = _OpValues(_tensors_in((args, kwargs), []), _tensors_in(out, []),
                     _written_args(target, args, kwargs))
    new_outputs = _new_outputs(low, vals.outs, walk.ignored, kind, stem, node)
    written = _tracked(low, vals.written, walk.ignored)
    if not new_outputs and not written:
        return  # a view or alias: no kernel
    reads = _tracked(low, vals.ins, walk.ignored)
    outputs = new_outputs + _claim_pending(reads + written, kind, stem)
    inputs, updates = _split_roles(reads, written, outputs)
    overload = _overload_name(target)
    raw = _RawOp(_op_name(target), walk.phase, module, inputs, outputs, updates,
                 _flops(target, args, kwargs, out),
                 _bytes_moved(low, overload, vals, outputs, new_outputs),
                 nodes=[node.name], overloads=[_qualified(target)], random=_is_random(target))
    if _is_accumulation(node, walk.phase, overload, raw, vals):
        raw.dense = tuple(_whole(v, a, walk.kernel_nodes) for v, a in zip(vals.ins, node.args))
    low.ops.append(raw)
    walk.kernel_nodes.add(node)
    if walk.phase == "backward":
        walk.last_backward_module = module


def _new_outputs(low: _Lowering, out_vals: list, ignored: set, kind: str, stem: str, node) -> list:
    """New tensors for the storages an op returns that nothing made before (``stem[.k]``)."""
    new = []
    for k, val in enumerate(out_vals):
        storage = val.untyped_storage()
        if storage._cdata in ignored or storage._cdata in low.by_storage:
            continue
        suffix = f".{k}" if len(out_vals) > 1 else ""
        t = low.new_tensor(storage, val, kind, f"{stem}{suffix}", node=node, output=k)
        if t is not None:
            new.append(t)
    return new


def _tracked(low: _Lowering, vals, ignored: set) -> list:
    """The known tensors behind some values, each once and in order, constants left out."""
    return _dedup(low.lookup(v) for v in vals if v.untyped_storage()._cdata not in ignored)


def _claim_pending(tensors: list, kind: str, stem: str) -> list:
    """Make this kernel the producer of the pending storages it is the first to touch."""
    claimed = []
    for t in tensors:
        if t.pending:
            t.pending = False
            t.kind = kind
            t.name = t.name or stem
            claimed.append(t)
    return claimed


def _split_roles(reads: list, written: list, outputs: list) -> tuple[list, list]:
    """(inputs, updates): written but not produced is an update; read, neither, an input."""
    out_ids = {t.index for t in outputs}
    updates = [t for t in written if t.index not in out_ids]
    upd_ids = {t.index for t in updates}
    inputs = [t for t in reads if t.index not in out_ids and t.index not in upd_ids]
    return inputs, updates


def _bytes_moved(low: _Lowering, overload: str, vals: _OpValues, outputs: list,
                 new_outputs: list) -> int:
    """Bytes a kernel moves for the roofline: distinct elements read plus written (gather: rows)."""
    if overload in _GATHER:
        return (sum(_distinct_bytes(v) for v in vals.ins[1:])
                + 2 * sum(_distinct_bytes(v) for v in vals.outs))
    seen_ids = set()
    moved = 0
    for v in vals.ins:
        if id(v) not in seen_ids and low.lookup(v) not in outputs:
            seen_ids.add(id(v))
            moved += _distinct_bytes(v)
    moved += sum(_distinct_bytes(v) for v in vals.written)
    moved += sum(_distinct_bytes(v) for v in vals.outs if low.lookup(v) in new_outputs)
    return moved


def _is_accumulation(node, phase: str, overload: str, raw: _RawOp, vals: _OpValues) -> bool:
    """A backward ``add`` of two gradients outside any autograd node, for _accumulate_in_place."""
    custom = node.meta.get("custom") or {}
    return (phase == "backward" and "grad_fn" not in custom and overload == "add.Tensor"
            and len(raw.inputs) == 2 and len(raw.outputs) == 1 and len(vals.ins) == 2)


def _whole(val, arg, kernel_nodes: set) -> bool:
    """The very tensor a kernel returned (not a view of it: a view keeps its base, and so
    a second reference to the storage, alive), contiguous and spanning its storage: a
    gradient autograd may reuse in place when it holds the last reference to it."""
    source = arg.args[0] if getattr(arg, "target", None) is operator.getitem else arg
    return (source in kernel_nodes and val.is_contiguous()
            and val.numel() * val.element_size() == val.untyped_storage().nbytes())


def _accumulate_in_place(low: _Lowering) -> None:
    """Gradient accumulation as the autograd engine does it on a real run.

    The engine adds a new gradient contribution to the one it holds
    (``InputBuffer::accumulate``, ``old + new``): in place into the held gradient when
    it holds the last reference to it and its storage and it is a dense, contiguous,
    non-view tensor; else out of place. Under make_fx the fake tensors have extra
    references, so the trace always shows the out-of-place ``add``; here the
    references are read from the schedule (the held gradient's last use is the add,
    and it is no view) and such an add becomes ``aten::add_`` updating the held
    gradient, its output folded into that storage. (A gradient that arrives as a view,
    such as a tied weight's transposed gradient, is added out of place, as on a real
    run.)
    """
    last_use: dict[int, int] = {}
    for k, op in enumerate(low.ops):
        for t in op.inputs + op.updates:
            last_use[t.index] = k
    alias: dict[int, _T] = {}

    def resolve(items):
        return _dedup(alias.get(t.index, t) for t in items)

    for k, op in enumerate(low.ops):
        held = op.inputs[0] if op.dense else None
        op.inputs, op.updates = resolve(op.inputs), resolve(op.updates)
        if held is None or not op.dense[0] or last_use.get(held.index) != k:
            continue
        out = op.outputs[0]
        target = alias.get(held.index, held)
        if target.bytes != out.bytes or target.kind in ("weight", "optimizer_state", "input"):
            continue
        op.name, op.updates, op.outputs = "aten::add_", [target], []
        op.inputs = [t for t in op.inputs if t.index != target.index]
        op.rewrite = "inplace_accumulate"
        alias[out.index] = target
        out.dropped = True


def _kind_for(phase: str) -> str:
    """The kind of a storage a phase creates: forward activation, backward gradient."""
    return {"forward": "activation", "backward": "gradient"}.get(phase, "other")


def _dedup(items) -> list:
    """The tensors among items, each once, in first-seen order (None dropped)."""
    seen, out = set(), []
    for t in items:
        if t is not None and t.index not in seen:
            seen.add(t.index)
            out.append(t)
    return out


def _lower_foreach(low: _Lowering, node, args, kwargs, out, phase: str,
                   kernel: int) -> None:
    """Split one ``_foreach_*`` kernel into per-element slices (merged per parameter later)."""
    import torch
    target = node.target
    lists = [a for a in list(args) + list(kwargs.values())
             if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
    n = len(lists[0])
    written_ids = {id(v) for v in _written_args(target, args, kwargs)}
    outs = out if isinstance(out, (list, tuple)) else []
    slices = []
    for i in range(n):
        reads = [lst[i] for lst in lists]
        new = []
        if i < len(outs) and isinstance(outs[i], torch.Tensor):
            val = outs[i]
            storage = val.untyped_storage()
            if storage._cdata not in low.by_storage:
                t = low.new_tensor(storage, val, "other",
                                   f"optimizer.{target.overloadpacket.__name__}.{i}", node=node, output=i)
                if t is not None:
                    new.append(t)
        written = _dedup(low.lookup(v) for v in reads if id(v) in written_ids)
        read_ts = _dedup(low.lookup(v) for v in reads)
        w_ids = {t.index for t in written}
        inputs = [t for t in read_ts if t.index not in w_ids]
        moved = sum(_distinct_bytes(v) for v in reads)
        moved += sum(_distinct_bytes(v) for v in reads if id(v) in written_ids)
        moved += sum(t.bytes for t in new)
        slices.append(_RawOp(_op_name(target), phase, "", inputs, new, written, 0.0, moved,
                             slot=i, kernel=kernel, nodes=[node.name], overloads=[_qualified(target)],
                             random=_is_random(target)))
    total = sum(s.bytes_moved for s in slices)
    time = kernel_time_us(low.hw, 0.0, total, low.dtype)
    for s in slices:
        s.time_us = time * (s.bytes_moved / total) if total else time / max(n, 1)
    low.ops.extend(slices)


_OPTIM_PARTS = ("step", "cast_master", "copy_param")


def _finish(low: _Lowering, step: TrainStep, optimizer: str, runtime: bool = False) -> tuple[list, list]:
    """Merge optimizer slices per parameter (and part), time the ops, number tensors and ops
    (with ``runtime``: their node identity, see :func:`trace`)."""
    main = [op for op in low.ops if op.slot is None]
    by_part: dict[tuple[int, str], list] = {}
    for op in low.ops:
        if op.slot is not None:
            by_part.setdefault((op.slot, op.part), []).append(op)
    merged = []
    for i, pname in enumerate(step.param_names):
        for part in _OPTIM_PARTS:
            group = by_part.get((i, part))
            if group:
                merged.append(_merge_part(low, group, part, pname, optimizer, runtime))

    ids = {}
    tensors = []
    for t in low.tensors:
        if t.dropped or t.pending:
            continue
        ids[t.index] = f"t{len(tensors)}"
        tensors.append(Tensor(id=ids[t.index], bytes=t.bytes, kind=t.kind, name=t.name or None,
                              shape=t.shape, dtype=t.dtype,
                              fx=TensorNode(t.node, t.output, t.role) if runtime else None))
    ops = []
    for raw in main + merged:
        ops.append(Op(id=f"o{len(ops)}", name=raw.name, phase=raw.phase, time_us=_time(low, raw),
                      inputs=tuple(ids[t.index] for t in raw.inputs if t.index in ids),
                      outputs=tuple(ids[t.index] for t in raw.outputs if t.index in ids),
                      updates=tuple(ids[t.index] for t in raw.updates if t.index in ids),
                      workspace_bytes=raw.workspace, flops=float(raw.flops), module=raw.module,
                      fx=_op_node(raw) if runtime else None))
    return tensors, ops


def _op_node(raw: _RawOp) -> OpNode:
    """The node identity of a profile op (simulator.profile.OpNode)."""
    return OpNode(tuple(raw.nodes), tuple(raw.overloads), raw.slot if raw.kernel is not None else None,
                  raw.rewrite, raw.random)


def _time(low: _Lowering, raw: _RawOp) -> float:
    """An op's time: set already (optimizer ops, foreach slices) or from the roofline."""
    if raw.time_us is not None:
        return raw.time_us
    return kernel_time_us(low.hw, raw.flops, raw.bytes_moved, low.dtype)


def _merge_part(low: _Lowering, group: list, part: str, pname: str, optimizer: str,
                runtime: bool = False) -> _RawOp:
    """One profile op for one part of one parameter's optimizer step.

    ``step`` (``optim::<optimizer>_foreach``): reads the gradient, updates the weight (or,
    under amp, the master) and the state; what its kernels make is internal and dropped.
    For foreach slices that adds no workspace (module doc); the per-parameter kernels
    of a mixed-precision step hold their temporaries (the fp32 gradient, AdamW's
    denominator) as workspace, at most what they hold at once. ``cast_master``
    (``optim::cast_master``) makes ``<param>.new``; ``copy_param`` (``optim::copy_param``)
    reads it and updates the weight.

    ``runtime``: the foreach slices of one parameter are run as one per-parameter step
    (``fx.rewrite`` ``foreach_split``), which holds that parameter's temporaries (AdamW's
    ``sqrt(exp_avg_sq)``) while it runs: they become its workspace too.
    """
    produced = {t.index for op in group for t in op.outputs}
    inputs, updates, outputs = [], [], []
    for op in group:
        inputs += [t for t in op.inputs if t.index not in produced]
        updates += op.updates
        outputs += op.outputs
    updates = _dedup(t for t in updates if t.index not in produced)
    upd_ids = {t.index for t in updates}
    inputs = _dedup(t for t in inputs if t.index not in upd_ids)
    for t in inputs:
        if t.kind == "gradient":
            t.name = f"{pname}.grad"
    workspace = 0
    if part == "cast_master":
        for t in outputs:
            t.name = f"{pname}.new"
    else:
        for t in outputs:
            t.dropped = True
        if runtime or all(op.kernel is None for op in group):
            workspace = _temporaries_peak(group)
        outputs = []
    name = {"step": f"optim::{optimizer}_foreach", "cast_master": "optim::cast_master",
            "copy_param": "optim::copy_param"}[part]
    owner = pname.rpartition(".")[0] or ROOT_MODULE
    foreach = group[0].kernel is not None
    op = _RawOp(name, "optimizer", owner, inputs, outputs, updates, 0.0,
                sum(o.bytes_moved for o in group), workspace=workspace,
                slot=group[0].slot if foreach else None, kernel=group[0].kernel if foreach else None,
                nodes=[n for o in group for n in o.nodes], overloads=[v for o in group for v in o.overloads],
                rewrite="foreach_split" if foreach else None, random=any(o.random for o in group))
    op.time_us = round(sum(_time(low, o) for o in group), 3)
    return op


def _temporaries_peak(group: list) -> int:
    """The most bytes the tensors made inside a group of kernels hold at once, each held
    from the kernel that makes it to the last kernel of the group that touches it."""
    made = {t.index: t for op in group for t in op.outputs}
    last = {}
    for k, op in enumerate(group):
        for t in op.inputs + op.updates + op.outputs:
            if t.index in made:
                last[t.index] = k
    live = peak = 0
    for k, op in enumerate(group):
        live += sum(t.bytes for t in op.outputs)
        peak = max(peak, live)
        live -= sum(made[i].bytes for i, end in last.items() if end == k)
    return peak


# ----------------------------------------------------------------------------- entry point


def trace(model: str | None = None, *, batch: int | None = None, seq: int | None = None,
          dtype: str = "fp32", optimizer: str = "adamw",
          hardware: str | Hardware = DEFAULT_HARDWARE, name: str | None = None,
          gpu_kernels: bool = True, amp: str | None = None, hf_config=None,
          runtime: bool = False, density: bool = False, density_batch: int | None = None,
          density_seq: int | None = None, density_seed: int = 0,
          density_threads: int | None = None, say=None) -> Profile:
    """Trace one training step of ``model`` into a Profile.

    Parameters
    ----------
    model : a registered name (:data:`tracer.models.MODELS`) or ``"module:callable"``
        (contract in :mod:`tracer.models`); None with ``hf_config``.
    batch, seq : samples per batch; sequence length (language models) or image side
        (vision models). None: the model's default (1 and 1024 for ``hf_config``).
    dtype : "fp32", "bf16" or "fp16": parameters, optimizer state, activations and
        floating inputs all in it (pure low-precision training); kernel times use its
        peak.
    optimizer : "adamw" (torch defaults, foreach form) or "sgd" (momentum 0.9).
    hardware : a preset name, a hardware file, or a Hardware; times the kernels.
    name : the profile name; default ``<model>-b<batch>[-s<seq>][-<dtype>][-amp-<amp>]
        [-<optimizer>][-<hardware>][-cpu-kernels]`` (dtype when not fp32, optimizer
        when not adamw, hardware when not the default preset).
    gpu_kernels : use the kernels a CUDA run picks (fused dropout, flash/efficient
        attention, CUDA's autocast lists); False keeps the CPU's choices.
    amp : "fp16" or "bf16": mixed-precision training with fp32 master weights (16 bytes
        per parameter with AdamW): parameters, gradients and batch in that dtype, the
        forward under autocast, fp32 master copies and moments, and per parameter the
        optimizer ops ``optim::<optimizer>_foreach``, ``optim::cast_master`` and
        ``optim::copy_param``. Needs ``dtype="fp32"``; kernel times use its peak.
    hf_config : a local transformers config.json of a causal LM, instead of ``model``
        (:func:`tracer.models.from_hf_config`).
    runtime : a profile for a runtime that follows plans (:mod:`runtime`,
        docs/runtime.md): every op and tensor gets its node identity in the FX graph
        (``fx``: nodes and ATen overloads, slot of a split foreach kernel, rewrites,
        random ops; a tensor's producing node and output, or its input role), the
        per-parameter optimizer temporaries (AdamW's ``sqrt(exp_avg_sq)``) count as
        workspace, and ``source`` records ``fx`` (its version) and ``--runtime`` in the
        command. Off by default: the shipped profiles have none of it.
    density : measure every tensor's ``density`` (fraction of non-zero elements) on one
        real CPU step of the traced graph (:mod:`tracer.density`): the model's own
        seeded initial weights, fresh optimizer state and a seeded synthetic batch of
        ``density_batch`` samples of sequence length (or image side) ``density_seq``
        (defaults: :func:`tracer.density.step_sizes`; for a language model 2 sequences of
        128 tokens, at most the traced ones), seeded with ``density_seed``, on
        ``density_threads`` intra-op threads (default 2 whatever the machine: the same
        counts on every machine with the same kernels); the graph at those sizes must
        lower to the same tensors and ops as at ``batch`` and ``seq``. ``source["density"]``
        records how.
    say : called with a line at each stage of the density measurement, or None.

    Raises
    ------
    InputError("<argument>", field, problem) with a one-line problem for an unknown
    model, a bad ``module:callable``, bad sizes, a dtype the hardware lacks, both or
    neither of ``model`` and ``hf_config``, ``amp`` with a low-precision ``dtype``, or
    a model that fails to trace; InputError naming the config file for a bad one;
    with ``density``: a bad ``density_batch`` or ``density_seq``, a graph that differs
    at those sizes, or an op with no CPU kernel.
    """
    _check_options(model, dtype, optimizer, name, amp, hf_config)
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    peak_tflops(hw, dtype)  # raises InputError when the GPU lacks the dtype
    if amp:
        try:
            peak_tflops(hw, amp)
        except InputError as exc:
            raise InputError("<argument>", "amp", exc.problem) from None
    torch = _torch()
    from tracer import models
    label = model if hf_config is None else _config_label(hf_config)
    try:
        if hf_config is None:
            workload = models.build(model, batch=batch, seq=seq)
        else:
            workload = models.from_hf_config(hf_config, batch=batch, seq=seq)
        cap = capture(workload, dtype=dtype, optimizer=optimizer, gpu_kernels=gpu_kernels,
                      amp=amp)
        tensors, ops = lower(cap, hw, dtype, optimizer, runtime=runtime)
        source = _source(model, workload, dtype, optimizer, hw, gpu_kernels, torch.__version__,
                         amp, label if hf_config is not None else None, runtime)
        if density:
            if say:
                say(f"traced: {len(ops)} ops, {len(tensors)} tensors")
            tensors, note = _measure_density(model, hf_config, batch, seq, workload, cap, tensors, ops, hw,
                                             dtype, optimizer, gpu_kernels, amp, density_batch, density_seq,
                                             density_seed, density_threads, say)
            source["density"] = note
        return Profile(name=name or _default_name(workload, dtype, optimizer, hw, gpu_kernels, amp),
                       tensors=tuple(tensors), ops=tuple(ops), source=source,
                       origin=f"<trace {label}>")
    except InputError:
        raise
    except Exception as exc:
        raise InputError("<argument>", "model" if hf_config is None else "hf-config",
                         f"{label} failed to trace: {models._one_line(exc)}") from None


def _measure_density(model, hf_config, batch, seq, workload, cap, tensors, ops, hw, dtype, optimizer,
                     gpu_kernels, amp, density_batch, density_seq, seed, threads=None,
                     say=None) -> tuple[list, dict]:
    """The tensors with their measured densities (:func:`trace`, :mod:`tracer.density`),
    and what ``source["density"]`` says of how they were measured."""
    import dataclasses

    import torch

    from tracer import density, models

    for value, key in ((density_batch, "density-batch"), (density_seq, "density-seq"), (threads, "density-threads")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InputError("<argument>", key, f"must be a whole number >= 1, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError("<argument>", "density-seed", f"must be a whole number, got {seed!r}")
    full_b, full_s = workload.batch, workload.seq
    if density_batch is not None and density_batch > full_b:
        raise InputError("<argument>", "density-batch",
                         f"{density_batch} is more than the traced batch ({full_b}): give at most {full_b}")
    if density_seq is not None and full_s is None:
        raise InputError("<argument>", "density-seq",
                         f"{model} is traced without a seq: give --seq too, or no --density-seq")
    if density_seq is not None and density_seq > full_s:
        raise InputError("<argument>", "density-seq",
                         f"{density_seq} is more than the traced seq ({full_s}): give at most {full_s}")
    kind = "causal-lm" if hf_config is not None else getattr(models.REGISTRY.get(model), "kind", None)
    small_b, seqs = density.step_sizes(kind, full_b, full_s, density_batch, density_seq)

    def build(b, s, device):
        # the model is built as for the trace, but for the sizes (a user model: None is its own)
        b_arg = batch if b == full_b else b
        s_arg = seq if s == full_s else s
        if hf_config is not None:
            return models.from_hf_config(hf_config, batch=b_arg, seq=s_arg)
        return models.build(model, batch=b_arg, seq=s_arg, device=device)

    for small_s in seqs:   # a default shorter seq whose graph differs: the next one (the traced seq)
        if (small_b, small_s) == (full_b, full_s):
            small_cap = cap
        else:
            try:
                small_workload = build(small_b, small_s, "meta")
            except InputError as exc:
                if density_seq is None and exc.where == "seq" and small_s != seqs[-1]:
                    continue   # the model does not take the default shorter seq
                if density_batch is not None or density_seq is not None or exc.where != "batch":
                    raise InputError("<argument>", "density-batch" if exc.where == "batch" else "density-seq",
                                     exc.problem) from None
                small_b, small_cap = full_b, cap   # a user model without a batch argument: its own batch
            else:
                small_cap = capture(small_workload, dtype=dtype, optimizer=optimizer, gpu_kernels=gpu_kernels,
                                    amp=amp)
        small_tensors, small_ops = lower(small_cap, hw, dtype, optimizer, runtime=True)
        problem = density.structure_problem((tensors, ops), (small_tensors, small_ops))
        if problem is None:
            break
    else:
        at = f"batch {small_b}" + (f", seq {small_s}" if small_s != full_s else "")
        traced = f"batch {full_b}" + (f", seq {full_s}" if small_s != full_s else "")
        raise InputError("<argument>", "density-batch" if small_s == full_s else "density-seq",
                         f"the graph at {at} differs from the traced one at {traced} ({problem}); "
                         "measure at sizes where it does not (--density-batch, --density-seq)")
    density.check_memory(small_tensors, small_ops, small_b, small_s)
    torch.manual_seed(seed)
    real = build(small_b, small_s, "cpu")
    threads = density.DEFAULT_THREADS if threads is None else threads
    note = {"measured": "one cpu step (forward, backward, optimizer) of the traced graph, the model's initial "
                        "weights", "batch": small_b, "seq": small_s, "seed": seed, "threads": threads,
            "digits": density.DIGITS}
    wanted = None
    if (small_b, small_s) != (full_b, full_s):
        # A tensor of the same size at both sizes is a sum over the batch (a weight's gradient, the
        # optimizer state made from it) or independent of it (weights, buffers): its zeros at a few
        # samples are not those of the full batch. Not measured (module doc of tracer.density).
        wanted = {b.id for a, b in zip(tensors, small_tensors) if a.bytes != b.bytes}
        note["unmeasured"] = "tensors whose size does not depend on the batch (and seq): weights, their " \
                             "gradients, optimizer state"
    if say:
        at = f"batch {small_b}" + (f", seq {small_s}" if small_s is not None else "")
        say(f"measuring densities: one CPU step at {at} on {threads} thread{'s' if threads > 1 else ''}")
    densities = density.measure(small_cap, small_tensors, small_ops, real, optimizer=optimizer, amp=amp,
                                dtype=dtype, seed=seed, threads=threads, wanted=wanted)
    tensors = [dataclasses.replace(t, density=densities.get(t.id)) for t in tensors]
    return tensors, note


def _check_options(model, dtype, optimizer, name, amp, hf_config) -> None:
    """InputError for an option that is invalid on its own or with another."""
    if dtype not in DTYPE_BYTES:
        raise InputError("<argument>", "dtype",
                         f"unknown dtype {dtype!r} (use {', '.join(DTYPES)})")
    if optimizer not in OPTIMIZERS:
        raise InputError("<argument>", "optimizer",
                         f"unknown optimizer {optimizer!r} (use {', '.join(OPTIMIZERS)})")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise InputError("<argument>", "name", f"expected a non-empty name, got {name!r}")
    if amp is not None and amp not in AMP_DTYPES:
        raise InputError("<argument>", "amp", f"unknown amp dtype {amp!r} "
                                              f"(use {', '.join(AMP_DTYPES)})")
    if amp is not None and dtype != "fp32":
        raise InputError("<argument>", "amp",
                         f"--amp {amp} keeps fp32 master weights and is not combined with "
                         f"--dtype {dtype} (pure {dtype} training); give one of them")
    if model is not None and hf_config is not None:
        raise InputError("<argument>", "hf-config",
                         f"give a model or --hf-config, not both (got {model!r} and {str(hf_config)!r})")
    if model is None and hf_config is None:
        raise InputError("<argument>", "model", "give a model name, module:callable or --hf-config")


def _config_label(path) -> str:
    """How a config file is named in the profile: ``tracer/configs/<file>`` for a
    shipped one (the same on every machine), else the path as given."""
    from pathlib import Path

    from tracer.models import CONFIG_DIR, config_path
    given = config_path(path)
    try:
        if given.resolve().parent == CONFIG_DIR:
            return f"tracer/configs/{given.name}"
    except OSError:
        pass
    return str(path)


def _default_name(workload, dtype, optimizer, hw, gpu_kernels, amp=None) -> str:
    parts = [workload.name, f"b{workload.batch}"]
    if workload.seq is not None:
        parts.append(f"s{workload.seq}")
    if dtype != "fp32":
        parts.append(dtype)
    if amp:
        parts.append(f"amp-{amp}")
    if optimizer != "adamw":
        parts.append(optimizer)
    if hw.name != DEFAULT_HARDWARE:
        parts.append(hw.name)
    if not gpu_kernels:
        parts.append("cpu-kernels")
    return "-".join(parts)


def _source(model, workload, dtype, optimizer, hw, gpu_kernels, torch_version, amp=None,
            config=None, runtime=False) -> dict:
    """The profile's ``source``: the command that remakes it and the options (``amp`` and
    ``hf_config`` only when used, so that other profiles keep their bytes)."""
    what = model if config is None else f"--hf-config {config}"
    command = f"swapplan trace {what} --batch {workload.batch}"
    if workload.seq is not None:
        command += f" --seq {workload.seq}"
    command += f" --amp {amp}" if amp else f" --dtype {dtype}"
    command += f" --optimizer {optimizer} --hardware {hw.name}"
    if not gpu_kernels and runtime:
        command += " --cpu-kernels"
    if runtime:
        command += " --runtime"
    source = {"kind": "traced",
              "from": f"{command} (torch {torch_version}, make_fx on fake tensors, "
                      f"{'GPU' if gpu_kernels else 'CPU'} kernel choices)",
              "timing": f"roofline:{hw.name}", "batch": workload.batch, "seq": workload.seq,
              "dtype": dtype, "optimizer": optimizer,
              "model": model if config is None else workload.extra["model_type"],
              "kernels": "gpu" if gpu_kernels else "cpu"}
    if amp:
        source["amp"] = amp
        source["master_weights"] = "fp32"
    if config is not None:
        source["hf_config"] = config
    if runtime:
        source["fx"] = FX_VERSION
    return source


__all__ = ["trace", "capture", "lower", "input_roles", "FX_VERSION", "TrainStep", "adamw_foreach", "sgd_foreach",
           "adamw_master", "sgd_master", "state_names", "OPTIMIZERS", "DTYPES", "AMP_DTYPES", "LOSS_SCALE",
           "DEFAULT_HARDWARE"]

