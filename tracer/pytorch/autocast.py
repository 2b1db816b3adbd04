"""CUDA autocast's op policy, applied to the CPU (fake) tensors the tracer runs on.

The tracer runs on CPU fake tensors, and ``torch.autocast("cpu")`` follows the CPU's op
lists, which differ from CUDA's: on CUDA, ``layer_norm``, ``softmax``, ``log_softmax``,
``exp``, ``pow``, ``rsqrt``, ``sum`` and friends run in fp32 and ``addcmul`` & co. promote,
while the CPU leaves them in the low precision; the CPU casts ``cat`` / ``stack`` and
a few CPU-only ops that CUDA leaves alone. :func:`cuda_autocast` enables CPU autocast
and, while it is active, registers Python kernels on the ``AutocastCPU`` dispatch key
that apply CUDA's policy instead (a ``torch.library.Library`` that is destroyed on
exit, which restores the CPU's own kernels):

- ``lower``: floating arguments (not fp64) are cast to the autocast dtype (matmuls,
  convolutions, attention);
- ``fp32``: floating arguments are cast to fp32 (norms, losses, transcendental ops);
- ``fp32_set_opt_dtype``: the op's optional ``dtype`` argument is set to fp32 when the
  caller gave none and the first argument is floating (softmax, sum, cumsum, ...);
- ``fp32_append_dtype``: the op is called through its ``dtype`` overload with fp32
  (``norm``);
- ``promote``: floating arguments are cast to the widest floating dtype among them;
- ops autocast leaves alone on CUDA but casts on the CPU fall through.

The lists are those of PyTorch's ``autocast_mode.cpp`` for CUDA (the ops it registers
on ``AutocastCUDA``). As on CUDA, no cast is cached: the autocast cache only holds
low-precision copies of fp32 leaf tensors, and under mixed-precision tracing the
parameters are already in the low precision.
"""
from __future__ import annotations

import contextlib
import warnings

LOWER = (
    "_convolution", "_convolution.deprecated", "_scaled_dot_product_flash_attention",
    "_thnn_fused_gru_cell", "_thnn_fused_lstm_cell", "addbmm", "addmm", "addmv", "addr",
    "baddbmm", "bmm", "chain_matmul", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "cudnn_convolution", "cudnn_convolution_transpose", "einsum", "gru_cell",
    "linalg_multi_dot", "linalg_vecdot", "linear", "lstm_cell", "matmul", "mm", "mv", "prelu",
    "rnn_relu_cell", "rnn_tanh_cell", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "binary_cross_entropy_with_logits", "cdist", "cosh",
    "cosine_embedding_loss", "cosine_similarity", "dist", "erfinv", "exp", "expm1",
    "frobenius_norm.dim", "group_norm", "hinge_embedding_loss", "huber_loss", "kl_div",
    "l1_loss", "layer_norm", "log", "log10", "log1p", "log2", "logsumexp", "margin_ranking_loss",
    "mse_loss", "multi_margin_loss", "multilabel_margin_loss", "native_layer_norm", "nll_loss",
    "nll_loss2d", "nuclear_norm", "nuclear_norm.dim", "pdist", "poisson_nll_loss", "pow.Scalar",
    "pow.Tensor_Scalar", "pow.Tensor_Tensor", "reciprocal", "renorm", "rms_norm", "rsqrt",
    "sinh", "smooth_l1_loss", "soft_margin_loss", "softplus", "tan", "triplet_margin_loss",
    "upsample_bicubic2d", "upsample_bilinear2d", "upsample_linear1d", "upsample_nearest1d",
    "upsample_nearest2d", "upsample_nearest3d", "upsample_trilinear3d", "_upsample_bicubic2d_aa",
    "_upsample_bilinear2d_aa", "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
    "_upsample_nearest_exact3d",
)
FP32_SET_OPT_DTYPE = (
    "cumprod", "cumsum", "linalg_matrix_norm", "linalg_matrix_norm.str_ord",
    "linalg_vector_norm", "log_softmax.int", "prod", "prod.dim_int", "softmax.int", "sum",
    "sum.dim_IntList",
)
FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype",
                     "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler",
           "index_put", "scatter_add", "tensordot", "vdot")


def _op(name: str):
    """The ATen OpOverload of ``packet[.overload]``."""
    import torch
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _eligible(value) -> bool:
    """A tensor autocast may cast: floating point and not fp64."""
    import torch
    return isinstance(value, torch.Tensor) and value.is_floating_point() \
        and value.dtype != torch.float64


def _cast(value, dtype):
    """``value`` with every eligible tensor (also inside lists) cast to ``dtype``."""
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    if _eligible(value) and value.dtype != dtype:
        return value.to(dtype)
    return value


def _no_autocast():
    """Run below the autocast key, as the C++ autocast kernels call their op."""
    import torch
    return torch._C._ExcludeDispatchKeyGuard(
        torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU))


def _casting_kernel(op, target):
    """A kernel that casts every floating argument to ``target(args)`` and calls ``op``."""
    def kernel(*args, **kwargs):
        dtype = target(args, kwargs)
        with _no_autocast():
            if dtype is not None:
                args, kwargs = _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
            return op(*args, **kwargs)
    return kernel


def _lower_target(args, kwargs):
    """The autocast dtype (what the ``lower`` policy casts to)."""
    import torch
    return torch.get_autocast_dtype("cpu")


def _fp32_target(args, kwargs):
    import torch
    return torch.float32


def _promote_target(args, kwargs):
    """fp32 when the floating arguments differ in dtype (any mix of fp16, bf16 and fp32
    promotes to fp32), else None: nothing to cast."""
    import torch
    found = {v.dtype for v in _flat(list(args) + list(kwargs.values())) if _eligible(v)}
    return torch.float32 if len(found) > 1 else None


def _flat(values) -> list:
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out += _flat(v)
        else:
            out.append(v)
    return out


def _set_opt_dtype_kernel(op):
    """Call ``op`` with ``dtype=float32`` when the caller set none and arg 0 is floating."""
    import torch

    def kernel(*args, **kwargs):
        with _no_autocast():
            if args and _eligible(args[0]) and _dtype_arg(op, args, kwargs) is None:
                position = _dtype_position(op)
                if position is not None and position < len(args):
                    args = args[:position] + (torch.float32,) + args[position + 1:]
                else:
                    kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)
    return kernel


def _dtype_position(op) -> int | None:
    """The position of the ``dtype`` argument when it is positional, else None."""
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "dtype":
            return None if arg.kwarg_only else i
    return None


def _dtype_arg(op, args, kwargs):
    """The ``dtype`` the caller passed (None when none)."""
    position = _dtype_position(op)
    if position is not None and position < len(args):
        return args[position]
    return kwargs.get("dtype")


def _append_dtype_kernel(op, with_dtype):
    """Call the ``dtype`` overload with fp32 when arg 0 is floating, else ``op``."""
    import torch

    def kernel(*args, **kwargs):
        with _no_autocast():
            if args and _eligible(args[0]):
                return with_dtype(*args, **kwargs, dtype=torch.float32)
            return op(*args, **kwargs)
    return kernel


def _cpu_autocast_ops() -> list[str]:
    """Every ATen op with a kernel on the AutocastCPU key (``packet[.overload]``)."""
    import torch
    found = []
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::") and \
                torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCPU"):
            found.append(name[len("aten::"):])
    return found


def _kernels() -> dict:
    """Op name -> the AutocastCPU kernel that applies CUDA's policy to it."""
    import torch
    kernels = {name: torch.library.fallthrough_kernel for name in _cpu_autocast_ops()}
    for name in LOWER:
        kernels[name] = _casting_kernel(_op(name), _lower_target)
    for name in FP32:
        kernels[name] = _casting_kernel(_op(name), _fp32_target)
    for name in PROMOTE:
        kernels[name] = _casting_kernel(_op(name), _promote_target)
    for name in FP32_SET_OPT_DTYPE:
        kernels[name] = _set_opt_dtype_kernel(_op(name))
    for name, target in FP32_APPEND_DTYPE.items():
        kernels[name] = _append_dtype_kernel(_op(name), _op(target))
    return kernels


@contextlib.contextmanager
def cuda_autocast(dtype):
    """``torch.autocast("cpu", dtype)`` with CUDA's op policy (module doc)."""
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        library = torch.library.Library("aten", "IMPL")
        try:
            for name, kernel in _kernels().items():
                library.impl(name, kernel, "AutocastCPU")
        except BaseException:
            library._destroy()
            raise
    try:
        with torch.autocast("cpu", dtype=dtype):
            yield
    finally:
        library._destroy()


def cpu_autocast(dtype):
    """Plain ``torch.autocast("cpu", dtype)``: the CPU's own op policy."""
    import torch
    return torch.autocast("cpu", dtype=dtype)


__all__ = ["cuda_autocast", "cpu_autocast", "LOWER", "FP32", "FP32_SET_OPT_DTYPE",
           "FP32_APPEND_DTYPE", "PROMOTE"]
