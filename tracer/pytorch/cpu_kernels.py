"""CPU kernels for the CUDA-only ATen ops of a GPU-kernel profile, so its graph runs here.

A profile traced with the kernels a CUDA run picks (the tracer's default) calls
``aten::_scaled_dot_product_efficient_attention`` (and its backward), which has no CPU
kernel. :func:`install` registers one for the CPU dispatch key, written in plain torch:

- forward: the scores ``q k^T x scale`` (+ ``attn_bias``, causal mask), their
  ``logsumexp`` over the keys, the probabilities, dropout, ``p v``, computed in fp32 and
  written into an output with the CUDA kernel's layout (B x S x H x D, seen as
  B x H x S x D) so that the graph's views of it work; the logsumexp padded to a multiple
  of 32 as the CUDA kernel pads it; a 0-dim int64 ``philox_seed`` and ``philox_offset``.
  With dropout, the seed is drawn from the default CPU generator (the op is random, as on
  CUDA) and the keep mask is a function of the seed alone;
- backward: the same probabilities again (the mask from the seed), and the gradients of
  q, k, v (and of the bias when asked) by the softmax-attention formulas, in the CUDA
  kernel's layouts.

The numbers are not the CUDA kernel's (another summation order), but the op is a
deterministic function of its inputs and the RNG state, which is what a planned run has
to reproduce bit for bit. Its scratch (the S x S scores) lives only inside the kernel, as
a GPU kernel's shared memory does, and is not counted (docs/runtime.md).
"""
from __future__ import annotations

import math

import torch

_LIBRARY = None
EMULATED = ("aten::_scaled_dot_product_efficient_attention",
            "aten::_scaled_dot_product_efficient_attention_backward")


def install() -> None:
    """Register the CPU kernels above (once per process; ops that have a CPU kernel
    already are left alone)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    for name, fn in ((EMULATED[0], _efficient_attention), (EMULATED[1], _efficient_attention_backward)):
        if not torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, "CPU"):
            library.impl(name.split("::", 1)[1], fn, "CPU")
    _LIBRARY = library


def missing(gm) -> list[str]:
    """The ATen overloads (``aten::packet.overload``, sorted, once each) of a graph's
    nodes that have no CPU kernel even with the ones above installed: a graph with any
    cannot run on this machine (the runtime and the density measurement refuse it)."""
    from tracer.pytorch.node_identity import qualified
    install()
    return sorted({qualified(n.target) for n in gm.graph.nodes
                   if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                   and n.target.namespace == "aten"
                   and not torch._C._dispatch_has_computed_kernel_for_dispatch_key(n.target.name(), "CPU")})


def _keep(seed: int, shape, p: float) -> torch.Tensor:
    """The dropout keep mask of one attention call: a function of its seed alone."""
    gen = torch.Generator().manual_seed(int(seed))
    return torch.rand(shape, generator=gen) >= p


def _probabilities(q, k, bias, dropout_p, is_causal, scale, seed):
    """Attention probabilities (fp32), the same with dropout applied and rescaled (or
    the keep mask's scale), and the logsumexp of the scores."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias
    if is_causal:
        m, n = scores.shape[-2], scores.shape[-1]
        allowed = torch.ones(m, n, dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    scale_kept = None
    if dropout_p > 0:
        scale_kept = _keep(seed, probs.shape, dropout_p).to(probs.dtype) / (1.0 - dropout_p)
    return probs, scale_kept, lse


def _efficient_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                         is_causal=False, *, scale=None):
    b, h, m, d = query.shape
    dv = value.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    seed = torch.zeros((), dtype=torch.int64)
    if dropout_p > 0:
        seed = torch.randint(0, 2 ** 62, (), dtype=torch.int64)
    bias = None if attn_bias is None else attn_bias.float()
    probs, kept, lse = _probabilities(query.float(), key.float(), bias, dropout_p, is_causal, scale, int(seed))
    out = torch.matmul(probs if kept is None else probs * kept, value.float())
    res = torch.empty(b, m, h, dv, dtype=query.dtype).transpose(1, 2)
    res.copy_(out)
    width = math.ceil(m / 32) * 32 if compute_log_sumexp else 0
    logsumexp = torch.zeros((b, h, width), dtype=torch.float32)
    if compute_log_sumexp:
        logsumexp[..., :m] = lse
    return res, logsumexp, seed, torch.zeros((), dtype=torch.int64)


def _efficient_attention_backward(grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed,
                                  philox_offset, dropout_p, grad_input_mask, is_causal=False, *, scale=None):
    b, h, m, d = query.shape
    n, dv = key.shape[-2], value.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    want_bias = attn_bias is not None and len(grad_input_mask) > 3 and grad_input_mask[3]
    q, k, v, d_out = query.float(), key.float(), value.float(), grad_out.float()
    bias = None if attn_bias is None else attn_bias.float()
    probs, kept, _ = _probabilities(q, k, bias, dropout_p, is_causal, scale, int(philox_seed))
    dropped = probs if kept is None else probs * kept
    d_v = torch.matmul(dropped.transpose(-2, -1), d_out)
    d_probs = torch.matmul(d_out, v.transpose(-2, -1))
    if kept is not None:
        d_probs = d_probs * kept
    d_scores = probs * (d_probs - (d_probs * probs).sum(dim=-1, keepdim=True))
    grads = [torch.matmul(d_scores, k) * scale, torch.matmul(d_scores.transpose(-2, -1), q) * scale, d_v]
    if want_bias:
        grads.append(d_scores.sum_to_size(attn_bias.shape))
    results = []
    for grad, ref, shape in ((grads[0], query, (b, h, m, d)), (grads[1], key, (b, h, n, d)),
                             (grads[2], value, (b, h, n, dv))):
        buf = torch.empty_permuted(shape, (0, 2, 1, 3), dtype=ref.dtype)
        buf.copy_(grad)
        results.append(buf)
    grad_bias = torch.empty(0, dtype=query.dtype)
    if want_bias:
        last = attn_bias.size(-1)
        aligned = last if last % 16 == 0 else last + 16 - last % 16
        full = torch.empty(list(attn_bias.size())[:-1] + [aligned], dtype=attn_bias.dtype)
        grad_bias = full[..., :last]
        grad_bias.copy_(grads[3])
    return results[0], results[1], results[2], grad_bias
