"""The kernels a CUDA run picks, chosen while the step is traced on CPU tensors.

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
"""
from __future__ import annotations

import contextlib
import sys

from tracer.pytorch.dtypes import torch_dtype


def make_gpu_kernels_mode():
    """A fresh ``GpuKernels`` mode: enter it around the forward (see the module doc)."""
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


def autocast_for(amp: str, gpu_kernels: bool):
    """Autocast to ``amp``'s dtype with the op policy of CUDA (GPU kernels) or the CPU."""
    from tracer.pytorch.autocast import cpu_autocast, cuda_autocast
    dtype = torch_dtype(amp)
    return cuda_autocast(dtype) if gpu_kernels else cpu_autocast(dtype)


@contextlib.contextmanager
def unpacked_batches():
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
