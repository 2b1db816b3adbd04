"""Buckets: tensors grouped in the order they become ready, a bucket closing once it
holds at least the cap (PyTorch DDP's and DeepSpeed's gradient buckets fill this way;
the last one holds what is left)."""
from __future__ import annotations


def fill(items: list[tuple[str, int]], cap: int) -> list[list[str]]:
    """``items`` (id, bytes) in ready order -> the ids of each bucket, in order."""
    buckets, current, held = [], [], 0
    for tid, size in items:
        current.append(tid)
        held += size
        if held >= cap:
            buckets.append(current)
            current, held = [], 0
    if current:
        buckets.append(current)
    return buckets
