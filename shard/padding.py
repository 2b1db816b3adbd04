"""How big a tensor's shard is on one of ``world`` ranks: its elements are padded up to a
multiple of the world, each tensor on its own (DeepSpeed ZeRO-3 partitions each parameter
this way), and every rank holds an equal slice. Sizes in bytes, element sizes from the
tensor's dtype (fp32 when the profile gives none; bytes when they do not divide)."""
from __future__ import annotations

from simulator.model.codecs import element_bytes
from simulator.profile import Tensor


def _element(tensor: Tensor) -> int:
    size = element_bytes(tensor)
    return size if tensor.bytes % size == 0 else 1


def padded_bytes(tensor: Tensor, world: int) -> int:
    """The full size once padded: the elements rounded up to a multiple of ``world``."""
    size = _element(tensor)
    elements = tensor.bytes // size
    return -(-elements // world) * world * size


def shard_bytes(tensor: Tensor, world: int) -> int:
    """One rank's slice of the padded tensor: padded_bytes / world."""
    return padded_bytes(tensor, world) // world


def shard_elements(tensor: Tensor, world: int) -> int:
    """One rank's slice in elements (the shard's 1-D shape)."""
    return shard_bytes(tensor, world) // _element(tensor)
