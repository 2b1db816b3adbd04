"""What the scheduler (executor/scheduler.py) and a backend (executor/host.py,
executor/cuda.py) trade: the blocks of the backend's region, the work units a backend
runs (an item, a copy), the failure that stops a replay, and what the replay measured
with its summary in the profile's units."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from simulator.model.links import LINKS, STREAMS
from .arena import align
from .program import Copy

PS = 1e-12


def scaled_bytes(nbytes: int, size_scale: float) -> int:
    """Bytes in the backend's region: the profile's bytes times the size scale, rounded
    up to a word (at least one word, so that every tensor can be checked)."""
    return max(8, align(math.ceil(nbytes * size_scale)))


class ReplayFailure(Exception):
    """The replay stopped: ``kind`` (integrity, arrival, residency, memory, capacity,
    order, placement, timeout, backend), the op or copy it happened at and the tensor."""

    def __init__(self, kind: str, op: str | None, tensor: str | None, message: str):
        super().__init__(message)
        self.kind, self.op, self.tensor, self.message = kind, op, tensor, message

    def to_dict(self) -> dict:
        return {"kind": self.kind, "op": self.op, "tensor": self.tensor, "message": self.message}


@dataclass(slots=True)
class Block:
    """Where a tensor (or a workspace) lies in the backend's region: byte offset, scaled
    bytes (a multiple of 8), and the pattern seed its words must hold."""
    tensor: str
    offset: int
    nbytes: int
    seed: int


@dataclass(slots=True)
class ItemWork:
    """One compute item for a backend: check ``reads`` (and ``updates`` before writing
    them), write ``writes``, and take ``duration_s`` of real time from its start."""
    item: int
    name: str
    op: str
    duration_s: float
    reads: list[Block]
    writes: list[Block]
    workspace: Block | None = None
    start_at: float = 0.0        # when it is due to start (the clock's seconds)
    deferred: int = 0            # bytes of a pipelined launch not yet counted (see _may_launch_early)


@dataclass(slots=True)
class CopyWork:
    """One copy for a backend: ``block`` is the GPU side (its seed: the version the data
    must be), ``latency_s`` the real latency to wait first."""
    copy: Copy
    block: Block
    latency_s: float
    time_scale: float
    start_at: float = 0.0        # when it is due to start (the clock's seconds)


@dataclass
class Measured:
    """What the replay measured, in real seconds since the start and the profile's bytes."""
    compute_busy_s: float = 0.0
    stall_s: float = 0.0
    last_compute_end: float = 0.0
    last_copy_end: float = 0.0
    stream_busy_s: dict = field(default_factory=lambda: {name: 0.0 for name in STREAMS})
    link_bytes: list = field(default_factory=lambda: [0] * len(LINKS))
    peak_bytes: int = 0
    peak_at_s: float = 0.0
    late_items: int = 0          # items whose checks and writes took longer than their scaled time
    late_s: float = 0.0          # ... and by how much in all
    hole_waits: int = 0          # times a block fitted the budget but no hole, even after compacting
    range_waits: int = 0         # placement (R50): times a block fitted the budget but its range was held
    compactions: int = 0
    compacted_bytes: int = 0     # scaled bytes moved by compactions
    compaction_s: float = 0.0
    wall_s: float = 0.0          # real time from the start until the end was seen
    host_peak_bytes: int = 0
    ssd_peak_bytes: int = 0

    def summary(self, arena, placed: bool, time_scale: float) -> dict:
        """Measured figures in the profile's units (us, bytes): ``arena`` the region's
        allocator (the placement's with ``placed``), ``time_scale`` real seconds per
        simulated second."""
        m = self
        end_s = max(m.last_compute_end, m.last_copy_end)
        to_us = 1e6 / time_scale
        return {
            "iteration_us": end_s * to_us,
            "compute_us": m.compute_busy_s * to_us,
            "stall_us": m.stall_s * to_us,
            "tail_us": max(0.0, end_s - m.last_compute_end) * to_us,
            "wall_s": m.wall_s,
            "peak_bytes": m.peak_bytes,
            "peak_at_us": m.peak_at_s * to_us,
            # with a placement (R50) the arena figures are the placement's, in the profile's
            # bytes, as the simulator reports them; region_bytes is the scaled region either way
            "placement": placed,
            "peak_arena_bytes": arena.peak_live,
            "peak_extent_bytes": arena.peak_extent,
            "arena_bytes": arena.arena_bytes if placed else arena.size,
            "region_bytes": arena.size,
            "fragmentation": ((arena.peak_extent / m.peak_bytes if m.peak_bytes else 1.0) if placed
                              else arena.fragmentation),
            "hole_waits": m.hole_waits,
            "range_waits": m.range_waits,
            "compactions": m.compactions,
            "compacted_bytes": m.compacted_bytes,
            "compaction_us": m.compaction_s * to_us,
            "late_items": m.late_items,
            "late_us": m.late_s * to_us,
            "link_bytes": dict(zip(LINKS, m.link_bytes)),
            "busy_us": {name: busy * to_us for name, busy in m.stream_busy_s.items()},
            "host_peak_bytes": m.host_peak_bytes,
            "ssd_peak_bytes": m.ssd_peak_bytes,
        }
