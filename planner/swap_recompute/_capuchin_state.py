"""Capuchin's state (planner/swap_recompute/capuchin.py, steps 1-3 and 8): the choices so
far and what they imply: each tensor's accesses (recompute reads included) and access
pairs, its evictions, the op-granularity memory estimate, the copy queues of each tier and
direction (an SSD copy's share of PCIe included), and the space each tier holds per op
(R19). The phases that fill it are in _capuchin_choose.py.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from simulator.model.links import link_speed, transfer_links

from ..shared.copy_queue import Copy, CopyQueue
from ..shared.estimate import MemoryEstimate
from ..shared.facts import op_start_us, touches

SWAP, RECOMPUTE = "swap", "recompute"
HOST, SSD = "host", "ssd"
OUT, IN = "out", "in"
_SPILL_ORDER = (SSD, HOST)   # with the SSD tier and no preselection: try the SSD first


@dataclass
class Eviction:
    """One tensor off the GPU between its accesses ``after`` (e) and ``before`` (c)."""
    tensor: str
    after: int
    before: int
    method: str                   # SWAP | RECOMPUTE
    free_from: int                # first op it is counted off the GPU
    free_to: int                  # last op (free_from > free_to: frees nothing)
    trigger: int = -1             # SWAP: the prefetch is issued after this op
    reuse_copy: bool = False      # SWAP: drop (the tier's copy is still valid) instead of offload
    tier: str = HOST              # SWAP: where the copy is (HOST | SSD)
    out_end_us: float = 0.0       # SWAP: when its source copy is written (queue model)
    out_key: tuple | None = None
    in_key: tuple | None = None


@dataclass
class SwapOption:
    free_from: int
    trigger: int
    overhead_us: float
    reuse_copy: bool
    out_end_us: float
    tier: str = HOST


@dataclass
class RecomputeOption:
    cost_us: float
    chain: dict[str, str]         # source -> "dead" | "split" | "retarget", in dependency order
    reads: list[str]              # resident non-persistent sources that gain an access at c


class State:
    """The choices so far and what they imply: accesses (including recompute reads),
    evictions, the op-granularity memory estimate and the two copy queues."""

    def __init__(self, sim, budget: int, allow_swap: bool, allow_recompute: bool, swap_weight: float = 1.0,
                 spill: bool = False, ssd_first: frozenset | None = None, host_bytes: int | None = None):
        profile, hardware = sim.profile, sim.hardware
        self.sim = sim                   # the compiled profile and machine its plans are scored on
        self.profile = profile
        self.swap_weight = swap_weight   # phase 2 compares swap overhead x this with recompute time
        self.unsure_pairs: set = set()   # phase 2 pairs whose two costs were within UNSURE x of each other
        self.hardware = hardware
        self.budget = budget
        self.allow_swap = allow_swap
        self.allow_recompute = allow_recompute
        self.starts = op_start_us(profile)
        self.n = len(profile.ops)
        self.tensors = profile.tensor_by_id
        self.estimate = MemoryEstimate(profile, budget)
        self.accesses: dict[str, list[int]] = {}
        self.op_access: dict[str, frozenset[int]] = {}
        self.intervals: dict[str, list[tuple[int, int]]] = {}
        for tensor in profile.tensors:
            if tensor.persistent:
                continue
            points = touches(profile, tensor.id)
            self.accesses[tensor.id] = points
            self.op_access[tensor.id] = frozenset(points)
            self.intervals[tensor.id] = [profile.lifetime(tensor.id)]
        self.evictions: dict[str, dict[tuple[int, int], Eviction]] = {}
        half = hardware.pcie.duplex == "half"
        self.d2h = CopyQueue()
        self.h2d = self.d2h if half else CopyQueue()
        self.out_speed = link_speed(hardware, "offload", "host")
        self.in_speed = link_speed(hardware, "prefetch", "host")
        # the tiers a swap may use, in the order phase 1 tries them (the SSD first: see _swap_option)
        self.tiers = _SPILL_ORDER if spill and hardware.ssd is not None else (HOST,)
        self.ssd_first = ssd_first  # with the SSD tier: the tensors that try it first (None: all)
        self.queue = {(HOST, OUT): self.d2h, (HOST, IN): self.h2d}
        self.speed = {(HOST, OUT): self.out_speed, (HOST, IN): self.in_speed}
        self.capacity = {HOST: hardware.host.memory_bytes if host_bytes is None else host_bytes}
        self.pcie_share: dict[tuple[str, str], float] = {}  # SSD copies' share of PCIe: bytes per us
        if SSD in self.tiers:
            self.capacity[SSD] = hardware.ssd.capacity_bytes
            for way, kind in ((OUT, "offload"), (IN, "prefetch")):
                latency, links, engine = transfer_links(hardware, kind, "ssd")
                self.speed[(SSD, way)] = (latency, min(rate for _, rate in links))
                if engine:      # half duplex through host memory: it holds the one copy engine
                    self.queue[(SSD, way)] = self.d2h
                else:           # its own stream, sharing the PCIe link with host copies (R17, R18)
                    self.queue[(SSD, way)] = CopyQueue()
                    self.pcie_share[(SSD, way)] = min(rate for name, rate in links if name.startswith("pcie"))
        # R19: bytes each tier holds per op, and from which op a tensor's copy holds space
        self.tier_use = {tier: np.zeros(self.n, dtype=np.int64) for tier in self.tiers}
        self.held: dict[str, dict[str, int]] = {tier: {} for tier in self.tiers}
        self.host_short = False     # a swap was refused for want of host memory
        self.version = 0            # bumped on every choice (lazy re-scoring)
        self.raised = False         # the estimate rose somewhere since last asked
        self.new_gaps: list[tuple[str, int, int]] = []
        self.seq = 0                # issue order of copies taken at one op (the plan keeps it)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq - 1

    # ---------------------------------------------------------------- queries

    def swap_us(self, tid: str, speed) -> float:
        latency, bytes_per_us = speed
        return latency + self.tensors[tid].bytes / bytes_per_us

    def gaps(self, tid: str) -> list[tuple[int, int]]:
        """The tensor's access pairs with an op between them that are not evicted yet."""
        if self.tensors[tid].bytes == 0:
            return []
        points = self.accesses[tid]
        evicted = self.evictions.get(tid, {})
        return [(a, b) for a, b in zip(points, points[1:]) if b - a >= 2 and (a, b) not in evicted]

    def is_gap(self, tid: str, a: int, b: int) -> bool:
        points = self.accesses[tid]
        i = bisect_left(points, a)
        return (i + 1 < len(points) and points[i] == a and points[i + 1] == b
                and (a, b) not in self.evictions.get(tid, {}))

    def residency_at(self, tid: str, c: int) -> tuple[str, tuple[int, int] | None]:
        """Whether a non-persistent tensor can be read by a recompute just before op c:
        ``resident``, ``adjacent`` (last access is c - 1), ``dead`` (freed earlier),
        ``recomputed`` / ``swapped`` (evicted across c), with the access pair."""
        points = self.accesses[tid]
        i = bisect_left(points, c)
        if i < len(points) and points[i] == c:
            return "resident", None
        if i == len(points):
            return ("adjacent" if points[-1] == c - 1 else "dead"), (points[-1], c)
        pair = (points[i - 1], points[i])
        ev = self.evictions.get(tid, {}).get(pair)
        if ev is None:
            return "resident", None
        return ("recomputed" if ev.method == RECOMPUTE else "swapped"), pair

    def tier_order(self, tid: str) -> tuple[str, ...]:
        if len(self.tiers) == 1 or self.ssd_first is None:
            return self.tiers
        return (SSD, HOST) if tid in self.ssd_first else (HOST, SSD)

    def valid_copy(self, tid: str, e: int) -> str | None:
        """The tier where a swap of ``tid`` before op e left a copy that no update has made
        stale (the latest such swap's), or None."""
        offloaded = [(ev.after, ev.tier) for ev in self.evictions.get(tid, {}).values()
                     if ev.method == SWAP and not ev.reuse_copy and ev.after < e]
        if not offloaded:
            return None
        last, tier = max(offloaded)
        return None if any(last < u <= e for u in self.profile.updaters[tid]) else tier

    def _new_space(self, tier: str, tid: str, e: int) -> tuple[int, int]:
        """The op range [lo, hi) in which an offload of ``tid`` after op e adds to the
        tier's use (R19: a copy holds space from its offload's start until the tensor is
        dead; offloading again to the same tier reuses the space)."""
        held = self.held[tier].get(tid)
        return e + 1, (held if held is not None else self.accesses[tid][-1] + 1)

    def fits(self, tier: str, tid: str, e: int) -> bool:
        """Whether the tier has room for a copy of ``tid`` offloaded after op e."""
        lo, hi = self._new_space(tier, tid, e)
        if lo >= hi:
            return True
        use = self.tier_use[tier]
        return int(use[lo:hi].max()) + self.tensors[tid].bytes <= self.capacity[tier]

    def hold(self, tier: str, tid: str, e: int) -> None:
        lo, hi = self._new_space(tier, tid, e)
        if lo < hi:
            self.tier_use[tier][lo:hi] += self.tensors[tid].bytes
            self.held[tier][tid] = lo

    def pcie_part(self, tier: str, way: str, copy: Copy, nbytes: int) -> Copy | None:
        """An SSD copy on its own stream also crosses PCIe (R17, R18): its share of that
        link, as a copy of its bytes at the PCIe rate on the host queue, from when it is
        estimated to start on its own stream, due never (it only delays host copies)."""
        share = self.pcie_share.get((tier, way))
        if share is None:
            return None
        start = self.queue[(tier, way)].end_if_added(copy.key, copy.enqueue_us, copy.duration_us) - copy.duration_us
        return Copy(copy.key, start, nbytes / share, math.inf)

    def add_copy(self, tier: str, way: str, copy: Copy, nbytes: int) -> None:
        part = self.pcie_part(tier, way, copy, nbytes)
        self.queue[(tier, way)].add(copy)
        if part is not None:
            self.queue[(HOST, way)].add(part)

    def remove_copy(self, tier: str, way: str, key: tuple) -> None:
        self.queue[(tier, way)].remove(key)
        if (tier, way) in self.pcie_share:
            self.queue[(HOST, way)].remove(key)

    # ---------------------------------------------------------------- updates

    def refresh(self, tid: str) -> None:
        """Recompute the tensor's resident op intervals and apply the change to the estimate."""
        frees = [(ev.free_from, ev.free_to) for ev in self.evictions.get(tid, {}).values()]
        new = resident_intervals(self.accesses[tid], self.op_access[tid], frees)
        old = self.intervals[tid]
        if new == old:
            return
        nbytes = self.tensors[tid].bytes
        for a, b in old:
            self.estimate.remove(nbytes, a, b + 1)
        for a, b in new:
            self.estimate.add(nbytes, a, b + 1)
            if not any(oa <= a and b <= ob for oa, ob in old):
                self.raised = True
        self.intervals[tid] = new

    def add_access(self, tid: str, c: int) -> None:
        points = self.accesses[tid]
        i = bisect_left(points, c)
        if i < len(points) and points[i] == c:
            return
        if i == len(points):    # a later death: its tier copies hold their space longer (R19)
            for tier in self.tiers:
                if tid in self.held[tier]:
                    self.tier_use[tier][points[-1] + 1:c + 1] += self.tensors[tid].bytes
        points.insert(i, c)
        if i > 0 and c - points[i - 1] >= 2:
            self.new_gaps.append((tid, points[i - 1], c))
        if i + 1 < len(points) and points[i + 1] - c >= 2:
            self.new_gaps.append((tid, c, points[i + 1]))

    def add_eviction(self, ev: Eviction) -> None:
        self.evictions.setdefault(ev.tensor, {})[(ev.after, ev.before)] = ev


def resident_intervals(points: list[int], op_points: frozenset[int],
                        frees: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Op intervals in which a tensor is on the GPU: from its first access to its last
    (up to the op before it when the last is only a recompute's read: the tensor is freed
    after that recompute), less its evictions' free ranges."""
    last = points[-1]
    end = last if last in op_points else last - 1
    found: list[tuple[int, int]] = []
    lo = points[0]
    for a, b in sorted(f for f in frees if f[0] <= f[1]):
        if a > lo:
            found.append((lo, min(a - 1, end)))
        lo = max(lo, b + 1)
    if lo <= end:
        found.append((lo, end))
    return [(a, b) for a, b in found if a <= b]
