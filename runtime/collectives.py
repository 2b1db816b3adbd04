"""The collectives of one rank, as real ``torch.distributed`` calls (gloo on the CPU), each
logged with its kind and payload bytes in the order issued.

- ``all_gather(send)``: every rank's ``send`` (bytes, the rank's shards laid end to end),
  concatenated in rank order: ``all_gather_into_tensor``. Payload: the output's bytes.
- ``reduce_scatter(full)``: ``full`` (world equal chunks, chunk r for rank r) summed over
  the ranks, the rank's chunk returned: ``reduce_scatter_tensor`` where the backend has
  it (gloo has it in recent PyTorch), else emulated exactly by an ``all_reduce`` of the
  whole buffer and the rank's slice of the sum (``emulate_reduce_scatter`` forces it).
  Payload: the input's bytes.
- ``all_reduce(buffer)``: summed over the ranks in place. Payload: the buffer's bytes.

Averaging (the SUM divided by the world, as DDP and FSDP do) is the caller's.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field


@dataclass
class Communicator:
    rank: int
    world: int
    emulate_reduce_scatter: bool = False
    log: list = field(default_factory=list)      # (op id, kind, payload bytes), in order
    emulated: bool = False                       # a reduce-scatter was emulated

    def all_gather(self, op_id: str, send):
        import torch
        import torch.distributed as dist
        out = torch.empty(send.numel() * self.world, dtype=send.dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_gather_into_tensor(out, send)
        self.log.append((op_id, "all_gather", out.nbytes))
        return out

    def reduce_scatter(self, op_id: str, full):
        import torch
        import torch.distributed as dist
        chunk = full.numel() // self.world
        out = None
        if not self.emulate_reduce_scatter:
            out = torch.empty(chunk, dtype=full.dtype)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    dist.reduce_scatter_tensor(out, full)
            except (RuntimeError, NotImplementedError, AttributeError):
                out = None
        if out is None:     # the exact emulation: the whole sum, then this rank's chunk
            self.emulated = True
            summed = full.clone()
            dist.all_reduce(summed)
            out = summed[self.rank * chunk:(self.rank + 1) * chunk].clone()
        self.log.append((op_id, "reduce_scatter", full.nbytes))
        return out

    def all_reduce(self, op_id: str, buffer):
        import torch.distributed as dist
        dist.all_reduce(buffer)
        self.log.append((op_id, "all_reduce", buffer.nbytes))
        return buffer


def expected_log(profile) -> list:
    """The collectives a rank's graph issues: (op id, kind, payload bytes), in graph
    order (the comm stream runs them in sequence order, R56)."""
    return [(op.id, op.collective.kind, op.collective.bytes) for op in profile.ops if op.collective is not None]
