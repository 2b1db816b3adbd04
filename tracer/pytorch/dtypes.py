"""The tracer's dtype names ("fp32", "fp16", "bf16", ...) and torch's dtypes, both ways."""
from __future__ import annotations


def torch_dtype(name: str):
    """The torch dtype of "fp32", "fp16" or "bf16"."""
    import torch
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def dtype_name(dtype) -> str:
    """The tracer's name of a torch dtype (torch's own name, without ``torch.``, for others)."""
    import torch
    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
             torch.float64: "fp64", torch.int64: "int64", torch.int32: "int32",
             torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}
    return names.get(dtype, str(dtype).replace("torch.", ""))
