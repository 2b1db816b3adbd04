"""swapplan shard: the profile of one rank of a data-parallel run whose state may be
sharded (PyTorch DDP, DeepSpeed ZeRO-1/2/3, PyTorch FSDP full shard), made from a
one-GPU profile. Collectives are ops of the rank's graph (R56), so every planner and the
simulator see one rank's memory and time. See docs/sharding.md.

Public interface: ``shard_profile`` and ``STRATEGIES``, ``rank_summary``. Modules, one
job each: options.py (the arguments, checked), roles.py (parameters, buffers, optimizer
state, weight gradients and when each is ready), units.py (wrap units), padding.py
(shard sizes), graph.py (the rank's graph being built), step.py (the optimizer step on a
shard), zero3.py (full sharding), replicated.py (DDP, ZeRO-1, ZeRO-2), buckets.py,
summary.py (what a rank holds and moves), api.py. Imports nothing of swapplan but the
simulator.
"""
from .api import shard_profile
from .options import DEFAULT_BUCKET_BYTES, STRATEGIES
from .summary import rank_summary

__all__ = ["DEFAULT_BUCKET_BYTES", "STRATEGIES", "rank_summary", "shard_profile"]
