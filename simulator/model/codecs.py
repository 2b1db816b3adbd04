"""Codecs (R40-R42): the compressed size of a tensor, and the time a codec takes.

A codec is named in the hardware file (``codecs``: simulator/hardware.py ``Codec``). Its
``format`` fixes the compressed size from the tensor's element count and, for zero-value
compression, its ``density`` (the profile's measured fraction of non-zero elements);
``where`` fixes who pays: the copy engine (``dma``: nothing but the smaller transfer) or
GPU kernels on the compute stream (``compute``: the uncompressed bytes at the codec's
encode or decode throughput). Pure functions: simulator/compile/program.py applies the rules.
"""
from __future__ import annotations

import math

from ..hardware import Codec
from ..profile import Profile, Tensor
from ..units import gbps_to_bytes_per_s

ELEMENT_BYTES = {"fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2, "int64": 8, "int32": 4, "int16": 2,
                 "int8": 1, "uint8": 1, "bool": 1}
RELU_BACKWARD = "threshold_backward"    # the only op binarize's one bit per element serves (R40)


def element_bytes(tensor: Tensor) -> int:
    """Bytes per element of the tensor's dtype (fp32 when the profile gives none)."""
    return ELEMENT_BYTES.get(tensor.dtype or "fp32", 4)


def compressed_bytes(tensor: Tensor, codec: Codec) -> int:
    """R40: the size of ``tensor`` encoded by ``codec``. n = bytes / element size;
    zvc: a 1-bit mask plus the non-zero values, ceil(n/8) + floor(density x n + 0.5) x size;
    fp16/bf16: 2n; int8: n; binarize: ceil(n/8)."""
    size = element_bytes(tensor)
    n = tensor.bytes // size
    fmt = codec.format
    if fmt == "zvc":
        density = 1.0 if tensor.density is None else tensor.density
        return -(-n // 8) + math.floor(density * n + 0.5) * size   # halves up, as R3 rounds
    if fmt in ("fp16", "bf16"):
        return 2 * n
    if fmt == "int8":
        return n
    return -(-n // 8)   # binarize


def codec_ps(nbytes: int, gbps: float) -> int:
    """R41, R42: a compute codec's kernel time over ``nbytes`` uncompressed bytes, in ps,
    rounded up (R3)."""
    return -(-nbytes * 10**12 // gbps_to_bytes_per_s(gbps))


def codec_problem(profile: Profile, tensor: Tensor, codec: Codec, later_ops, allow_lossy: bool) -> tuple[str, str] | None:
    """(rule, reason) when ``codec`` may not encode ``tensor``, else None (R40):
    lossy formats need ``allow_lossy``; binarize needs every later use (``later_ops``:
    the profile ops that use it afterwards) to be a ReLU backward; and the encoding
    must be smaller than the tensor."""
    if codec.lossy and not allow_lossy:
        return "R40", (f"codec {codec.name!r} ({codec.format}) is lossy: the plan must say "
                       '"allow_lossy": true to use it')
    if codec.format == "binarize":
        for op in later_ops:
            if not op.name.endswith(RELU_BACKWARD):
                return "R40", (f"codec {codec.name!r} binarizes {tensor.id!r}, but op {op.id!r} ({op.name}) "
                               "uses it later, and only a ReLU backward (threshold_backward) can use one bit "
                               "an element")
    size = compressed_bytes(tensor, codec)
    if size >= tensor.bytes:
        return "R40", (f"codec {codec.name!r} does not shrink {tensor.id!r}: {size} bytes encoded, "
                       f"{tensor.bytes} plain" + (f" (density {tensor.density})" if codec.format == "zvc" else ""))
    return None


def zvc_ratio(density: float, element_size: int = 4) -> float:
    """Zero-value compression's ratio at a density, for planners' estimates: plain size
    over encoded size (for fp32, 1 / (density + 1/32))."""
    return element_size / (density * element_size + 1 / 8) if density * element_size + 1 / 8 > 0 else math.inf
