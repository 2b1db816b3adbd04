"""``capuchin``: swap and recompute, chosen per tensor from its access pattern.

Follows Peng et al., "Capuchin: Tensor-based GPU Memory Management for Deep Learning",
ASPLOS 2020, section 4 (the memory-management policy: "Estimating Swap and
Recomputation Benefit", "Determining Tensor Re-generation Cost", the hybrid swap /
recompute selection and the MSPS recomputation selection), as summarised from the
paper (its abstract and third-party summaries of section 4; the full text could not be
read here), so the rules below are that summary's, and where the summary leaves a detail open the choice is this module's and
is listed under departures.

1. Access sequence: from the profile on its ideal timeline
   (``planner.shared.facts.op_start_us``), each non-persistent tensor's accesses (the ops
   that produce, read or update it, and, once chosen, the recomputes that read it). An
   access pair (evicted-access ``e``, back-access ``c``) is two consecutive accesses with
   at least one op between them.
2. Costs: SwapTime = latency + bytes / bandwidth (d2h out, h2d in); SwapOutEnd = end of
   ``e`` + SwapTime; SwapInStart = start of ``c`` - SwapTime; FreeTime FT = SwapInStart -
   SwapOutEnd. Recompute time = the producer's time (plus a chain's, step 5).
3. Candidates: the pairs whose idle interval holds an op over the budget. The memory
   estimate (``planner.shared.estimate``, shared with g10 and flashneuron) starts from
   ``profile.resident_bytes`` and is updated after every choice (a
   tensor counts as off the GPU from the first op starting after its offload ends, or
   after its drop, up to its prefetch's trigger, or up to its recompute); the memory to
   save is each op's excess over the budget.
4. Swaps first: pairs by FT, descending, each taken if its copies are fully hidden: on a
   FIFO model of each PCIe direction (R1, R17; one queue on a half-duplex link) the
   offload frees the tensor before an over-budget op, the prefetch issued at the
   in-trigger ends before ``c``, and no copy already taken is made late. The in-trigger
   is the last op whose prefetch still ends by ``c`` (walking back from ``c``, with the
   queue: the copy may start later than SwapInStart), and never inside the peak: no op
   between the trigger and ``c`` may be over the budget.
5. When swaps alone are not enough: every remaining pair is scored by MSPS = bytes /
   cost, where cost is the cheaper of its swap overhead and its recompute time, the best
   is taken with its cheaper method, and the others are re-scored after each choice
   (lazily: a popped pair is re-scored and taken only if it still beats the next), since
   a choice changes the queues, the estimate and the recompute sources. A recompute is
   ``drop(t, after=e)`` + ``recompute(t, before=c)``. Its sources are its producer's
   inputs as the plan leaves them at ``c``: a resident input costs nothing (its lifetime
   grows to ``c``); one freed after its last use, or dropped for recomputation across
   ``c``, is recomputed first, recursively (a chain: its producer's time is added, and
   it is dropped again after ``c`` when needed later); one swapped out across ``c`` has
   its prefetch made due at ``c`` (its stall is the cost). R15 is respected: only a
   tensor whose producer updates nothing in place and which is not updated in place
   before ``c`` is recomputed, and the recomputes before one op are issued in producer
   order, so a chain's sources come first.
6. Feedback: the plan is simulated (``simulator.api.simulate``); every prefetch whose
   back-access op still waited for data (``stall_by_op`` ``data_us``) has its trigger
   moved earlier, by the larger of that stall and ``feedback_step`` x the ideal
   iteration (at least one op), but never into the peak (the estimate with the tensor
   back must stay within the budget at every op it moves over) nor before its offload
   frees it; then the plan is simulated again. At most ``feedback_rounds`` rounds (one
   simulation each, about 1 ms on 1,000 ops; 10 by default, since rounds stop early and
   more of them cut resnet50 at 40 GiB from 10.7% to 8.6% overhead at the same planning
   time), stopping early when no trigger moves or a plan fails; the best simulated plan
   is returned.
7. Where the estimate is unsure: when a phase-2 choice had a swap and a recompute whose
   estimated costs were within ``UNSURE`` (2x) of each other, the whole plan is made again
   with swap overheads weighed at 1/``UNSURE`` (leaning to swaps), and the simulator
   keeps the faster of the two (bert-base at 40 GiB on an A100: 4.2% -> 0.5%; on the
   shipped profiles never slower, since the first plan stays when it is not beaten).
8. SSD tier (``ssd``, on by default on a machine with an SSD; a departure, below). Host
   memory and SSD space are tracked per op as R19 counts them: a copy holds space from the
   op after its offload is issued until the tensor's last access (its death), and a second
   offload of a tensor to the same tier reuses the space; a swap whose copy does not fit
   is not an option in that tier. The plan of steps 1-7 swaps to host memory only; when it
   had to refuse a swap for want of host memory, a second plan (steps 1-7 again) may also
   swap to the SSD, and the simulator keeps the faster of the two (note ``ssd_tier``).
   Which tensors go to the SSD: a plan is made (phases 1 and 2) as if host memory were
   unbounded; while its swaps' host copies would overflow host memory at some op, the
   swapped tensor holding space there with the longest free time (step 2) is moved to the
   SSD set (long free times hide the slow copies best). In the second plan those tensors
   try the SSD first and the others host memory first, each falling back to the other
   tier when its own has no room (phase 1: no room or the copy does not hide; phase 2:
   the tier whose swap stalls less, the first tried on a tie). An SSD swap's SwapTime uses
   the SSD route's latency and rate (``transfer_links``: PCIe + SSD latency, the slower
   link's rate, R18); its copies queue FIFO on their own streams (``ssd_write``,
   ``ssd_read``, R1), or on the one copy-engine queue of a half-duplex machine through
   host memory (R17), and each also takes its share of PCIe, a copy of its bytes at the
   PCIe rate queued on the host copy queue of its direction from its estimated start, due
   never (it only delays host copies). A prefetch from the SSD starts after its offload to
   the SSD ends. The stall estimate (phase 2's swap overhead, weighed against recompute
   time by MSPS) counts both queues. A tensor whose copy is still valid reuses it in its
   tier (a drop, then a prefetch from that tier).
   What it gives on G10's machine: docs/planners.md ("SSD spills"), benchmarks/ssd_spills.py.

Departures from the paper, and why:

- Capuchin decides at run time from a measured iteration and adjusts in-triggers from
  run-time feedback; here everything is decided offline on the profile's ideal
  timeline, and the feedback comes from simulated iterations (step 6).
- Memory target: the paper saves ``peak - capacity`` bytes; with several over-budget
  windows that is not enough, so choices go on until the op-granularity estimate is
  within the budget at every op (or no pair helps). Memory saved in MSPS is the tensor's
  bytes, as in the paper.
- Unit of choice: a tensor may be evicted across each of its idle intervals, not once; a
  later swap of a tensor whose host copy is still valid (not updated in place since its
  offload) drops it instead of copying it out again.
- Phase 2 scores every pair by bytes / (cheaper of swap overhead and recompute time):
  the paper's MSPS when recomputing is the cheaper; a pair that cannot be recomputed is
  ranked by bytes / swap overhead. ``recompute=false`` leaves only swaps, ``swap=false``
  only phase 2's recomputes.
- Swap overhead is a stall estimate on the queue model: a late prefetch stalls its
  back-access, a late offload stalls the op that needs its memory, and within a busy
  period of a queue the compute stream, once delayed, gives later copies that much
  more time, so a period costs its largest lateness (periods add up). In phase 2 a
  swap whose offload cannot end before any over-budget op of its interval is still
  allowed, freeing from the first over-budget op (which then waits for the release,
  counted as overhead); the paper has no such case (its swaps are decided on measured
  time and memory is reclaimed when the copy ends).
- "Never inside the peak": the trigger is put after the last over-budget op of the
  interval (as the estimate stands when the pair is chosen); a pair whose hidden
  trigger falls inside is not a free swap and goes to phase 2 with that stall as its
  overhead. Feedback may later move such a trigger earlier once other choices made room.
- Chains: a source swapped out across ``c`` gets its prefetch due at ``c`` (the paper
  would swap it in on demand at the recompute); a tensor is not recomputed from an
  input that is updated in place between its producer and ``c`` (the value would
  differ; the simulator does not check this).
- The recompute items' own memory (the regenerated tensor and chain sources plus the
  largest producer workspace, just before ``c``) is checked against the estimate of
  what is resident entering ``c``; it is an approximation, as is the estimate itself
  (whole ops, ideal times).
- The SSD tier (step 8): Capuchin swaps to host memory only, assumed large enough; here
  swaps spill to the SSD when host memory (counted per op, R19) runs out (``ssd=false``:
  host memory only). Weights and optimizer state never move (``moves_persistent=False``).
- The feedback step: the paper moves the in-trigger earlier when a tensor is still being
  swapped in at its back-access; the amount here is ``max(stall, feedback_step x
  iteration)``, bounded as in step 6.
"""
from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from simulator.model.links import link_speed, transfer_links
from simulator.model.recompute import recompute_problem, recompute_scratch
from simulator.plan import Action, drop, offload, prefetch, recompute

from ..core.api import score, simulator_for
from ..core.lowering import DROP, OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.copy_queue import Copy, CopyQueue, queue_stall
from ..shared.estimate import MemoryEstimate
from ..shared.facts import op_start_us, touches

SWAP, RECOMPUTE = "swap", "recompute"
HOST, SSD = "host", "ssd"
OUT, IN = "out", "in"
_SPILL_ORDER = (SSD, HOST)   # with the SSD tier and no preselection: try the SSD first
_MAX_CHAIN = 32          # recursion guard for recompute chains (sources strictly earlier)
_REBUILDS = 3            # phase 2 restarts when the estimate rose after a choice
UNSURE = 2.0            # a swap and a recompute whose estimated costs are within this factor: unsure


# ----------------------------------------------------------------------------- state


@dataclass
class _Eviction:
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
class _SwapOption:
    free_from: int
    trigger: int
    overhead_us: float
    reuse_copy: bool
    out_end_us: float
    tier: str = HOST


@dataclass
class _RecomputeOption:
    cost_us: float
    chain: dict[str, str]         # source -> "dead" | "split" | "retarget", in dependency order
    reads: list[str]              # resident non-persistent sources that gain an access at c


class _State:
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
        self.evictions: dict[str, dict[tuple[int, int], _Eviction]] = {}
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
        new = _resident_intervals(self.accesses[tid], self.op_access[tid], frees)
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

    def add_eviction(self, ev: _Eviction) -> None:
        self.evictions.setdefault(ev.tensor, {})[(ev.after, ev.before)] = ev


def _resident_intervals(points: list[int], op_points: frozenset[int],
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


# ----------------------------------------------------------------------------- options


def _swap_option(state: _State, tid: str, e: int, c: int, hidden_only: bool) -> _SwapOption | None:
    """How a swap of ``tid`` across (e, c) would go with the queues as they are, or None
    when it cannot help (nothing over budget freed, no room in any tier; with
    ``hidden_only``, a copy that cannot hide or delays another into a stall).

    A tensor whose copy is still valid reuses it, in its tier. Otherwise, with the SSD
    tier on: with ``hidden_only`` (phase 1, pairs by free time, longest first) the SSD
    when its slower copies still hide there, else host memory; in phase 2 the tier whose
    swap stalls less (the SSD on a tie, keeping host room for the pairs that need it)."""
    if not state.allow_swap:
        return None
    reused = state.valid_copy(tid, e)
    if reused is not None:
        return _tier_option(state, tid, e, c, reused, True, hidden_only)
    best = None
    for tier in state.tier_order(tid):
        if not state.fits(tier, tid, e):
            if tier == HOST:
                state.host_short = True
            continue
        option = _tier_option(state, tid, e, c, tier, False, hidden_only)
        if option is None:
            continue
        if hidden_only:
            return option
        if best is None or option.overhead_us < best.overhead_us:
            best = option
    return best


def _tier_option(state: _State, tid: str, e: int, c: int, tier: str, reuse: bool,
                 hidden_only: bool) -> _SwapOption | None:
    """``_swap_option`` for one tier (``reuse``: its copy is valid already, so a drop)."""
    starts = state.starts
    nbytes = state.tensors[tid].bytes
    out_link, in_link = state.queue[(tier, OUT)], state.queue[(tier, IN)]
    out_us, in_us = state.swap_us(tid, state.speed[(tier, OUT)]), state.swap_us(tid, state.speed[(tier, IN)])
    out_key = (e, 1, state.seq)
    if reuse:
        out_end = starts[e + 1]
    else:
        out_end = out_link.end_if_added(out_key, starts[e + 1], out_us)
    free_from = max(e + 1, bisect_left(starts, out_end - 1e-9, 0, state.n))
    over = state.estimate.over_in(free_from, c)
    if len(over) == 0:
        if hidden_only:
            return None
        # The copy cannot end in time on the ideal timeline: the first over-budget op
        # waits for its release (a memory stall, counted below).
        over = state.estimate.over_in(e + 1, c)
        if len(over) == 0:
            return None
        free_from = int(over[0])
    stall_out = 0.0
    out_copy = Copy(out_key, starts[e + 1], out_us, starts[free_from])
    out_part = None
    if not reuse:
        stall_out = out_link.extra_stall(out_copy)
        out_part = state.pcie_part(tier, OUT, out_copy, nbytes)
        if out_part is not None:
            stall_out += state.d2h.extra_stall(out_part)
        if hidden_only and stall_out > 1e-9:
            return None
    last_over = int(over[-1])
    deadline = starts[c]

    def issued(p: int) -> float:  # the prefetch cannot start before its source copy is written
        return max(starts[p + 1], out_end)

    hidden = None
    lo, hi = free_from, c - 1
    while lo <= hi:  # the latest trigger whose prefetch still ends by c (ends grow with p)
        mid = (lo + hi) // 2
        if in_link.end_if_added((mid, 2, state.seq), issued(mid), in_us) <= deadline + 1e-9:
            hidden, lo = mid, mid + 1
        else:
            hi = mid - 1
    if hidden_only and (hidden is None or hidden < last_over):
        return None
    trigger = max(hidden if hidden is not None else free_from, last_over)
    prefetch_copy = Copy((trigger, 2, state.seq), issued(trigger), in_us, deadline)
    if in_link is out_link and not reuse:   # half duplex: one queue holds both copies
        stall_in = out_link.with_copy(out_copy).extra_stall(prefetch_copy)
    else:
        stall_in = in_link.extra_stall(prefetch_copy)
    in_part = state.pcie_part(tier, IN, prefetch_copy, nbytes)
    if in_part is not None:
        host_in = state.h2d
        if host_in is state.d2h and out_part is not None:
            host_in = host_in.with_copy(out_part)
        stall_in += host_in.extra_stall(in_part)
    if hidden_only and stall_in > 1e-9:
        return None
    return _SwapOption(free_from, trigger, stall_out + stall_in, reuse, out_end, tier)


def _recompute_option(state: _State, tid: str, e: int, c: int) -> _RecomputeOption | None:
    """The cost of dropping ``tid`` after e and recomputing it before c, with its chain."""
    if not state.allow_recompute:
        return None
    chain: dict[str, str] = {}
    reads: list[str] = []
    if not _regenerable(state, tid, c, chain, reads, 0):
        return None
    ops = state.profile.ops
    producer = state.profile.producer
    cost = ops[producer[tid]].time_us
    for src, how in chain.items():
        cost += _earlier_prefetch_stall(state, src, c) if how == "retarget" else ops[producer[src]].time_us
    if not _recompute_fits(state, tid, c, chain, reads):
        return None
    delta = _recompute_delta(state, tid, e, c, chain, reads)
    raised = delta > 0
    if raised.any() and bool((state.estimate.bytes[raised] + delta[raised] > state.budget).any()):
        return None  # a side effect (a source kept longer) would put an op over the budget
    return _RecomputeOption(cost, chain, reads)


def _recompute_delta(state: _State, tid: str, e: int, c: int, chain: dict, reads: list[str]) -> np.ndarray:
    """How the estimate would change per op if the recompute were taken (the same
    bookkeeping as ``_take_recompute``, without doing it)."""
    delta = np.zeros(state.n, dtype=np.int64)

    def with_c(x: str) -> list[int]:
        points = state.accesses[x]
        return points if c in points else sorted([*points, c])

    def frees(x: str, gone: tuple = (), added: tuple = ()) -> list[tuple[int, int]]:
        kept = [(ev.free_from, ev.free_to) for pair, ev in state.evictions.get(x, {}).items()
                if pair not in gone]
        return kept + list(added)

    changes = {tid: (state.accesses[tid], frees(tid, added=((e + 1, c - 1),)))}
    for x in reads:
        changes[x] = (with_c(x), frees(x))
    for x, how in chain.items():
        _, pair = state.residency_at(x, c)
        if how == "dead":
            a = state.accesses[x][-1]
            changes[x] = (with_c(x), frees(x, added=((a + 1, c - 1),)))
        elif how == "split":
            a, b = pair
            changes[x] = (with_c(x), frees(x, (pair,), ((a + 1, c - 1), (c + 1, b - 1))))
        else:
            ev = state.evictions[x][pair]
            changes[x] = (with_c(x), frees(x, (pair,), ((ev.free_from, min(ev.trigger, c - 1)),)))
    for x, (points, freed) in changes.items():
        nbytes = state.tensors[x].bytes
        for a, b in state.intervals[x]:
            delta[a:b + 1] -= nbytes
        for a, b in _resident_intervals(points, state.op_access[x], freed):
            delta[a:b + 1] += nbytes
    return delta


def _regenerable(state: _State, tid: str, c: int, chain: dict, reads: list, depth: int) -> bool:
    """R15 for a recompute of ``tid`` just before op c, collecting what its sources need
    (``chain``: "dead" or "split" sources are recomputed first, "retarget" ones are
    swapped out across c and get their prefetch's back-access moved to c) and the
    resident sources it reads (``reads``)."""
    profile = state.profile
    if depth > _MAX_CHAIN or recompute_problem(profile, tid, c) is not None:
        return False
    made_by = profile.producer[tid]
    op = profile.ops[made_by]
    for src in dict.fromkeys(op.inputs):
        if any(made_by < u < c for u in profile.updaters[src]):
            return False  # its value at c is not the one the producer read
        if state.tensors[src].persistent or src in chain:
            continue
        status, pair = state.residency_at(src, c)
        if status in ("resident", "adjacent"):
            if src not in reads:
                reads.append(src)
        elif status in ("dead", "recomputed"):
            if not _regenerable(state, src, c, chain, reads, depth + 1):
                return False
            chain[src] = "dead" if status == "dead" else "split"
        elif state.evictions[src][pair].free_from <= c - 1:
            chain[src] = "retarget"   # swapped out: bring it back by c instead
        else:
            return False
    return True


def _earlier_prefetch_stall(state: _State, src: str, c: int) -> float:
    """Extra stall from moving the back-access of ``src``'s swap across c to c (its
    prefetch then due at c, its trigger moved to c - 1 if it was later)."""
    _, pair = state.residency_at(src, c)
    ev = state.evictions[src][pair]
    link = state.queue[(ev.tier, IN)]
    i = bisect_left(link.keys, ev.in_key)
    old = link.copies[i]
    trigger = min(ev.trigger, c - 1)
    key = old.key if trigger == ev.trigger else (trigger, 2, state.seq)
    moved = Copy(key, max(state.starts[trigger + 1], ev.out_end_us), old.duration_us, state.starts[c])
    rest = link.copies[:i] + link.copies[i + 1:]
    j = bisect_left([copy.key for copy in rest], key)
    return queue_stall(rest[:j] + [moved] + rest[j:], None) - link.stall


def _recompute_fits(state: _State, tid: str, c: int, chain: dict, reads: list[str]) -> bool:
    """Approximate memory of the recompute items before op c: what is resident entering c
    (the estimate less c's outputs and workspace), plus the sources not counted there
    (recomputed chain sources, and read ones whose last use becomes this recompute),
    plus the largest scratch of one recompute (its producer's workspace and the other
    outputs its re-run makes, R15)."""
    profile = state.profile
    op = profile.ops[c]
    entering = int(state.estimate.bytes[c]) - op.workspace_bytes - sum(state.tensors[t].bytes for t in set(op.outputs))
    redone = [x for x, how in chain.items() if how != "retarget"]
    transient = sum(state.tensors[x].bytes for x in redone)
    transient += sum(state.tensors[x].bytes for x in reads
                     if not any(a <= c <= b for a, b in state.intervals[x]))
    workspace = max(recompute_scratch(profile, x) for x in [tid, *redone])
    return entering + transient + workspace <= state.budget


# ----------------------------------------------------------------------------- choices


def _take_swap(state: _State, tid: str, e: int, c: int, option: _SwapOption) -> None:
    ev = _Eviction(tid, e, c, SWAP, option.free_from, option.trigger, option.trigger, option.reuse_copy,
                   option.tier)
    starts = state.starts
    if not option.reuse_copy:
        ev.out_key = (e, 1, state.next_seq())
        state.add_copy(ev.tier, OUT, Copy(ev.out_key, starts[e + 1], state.swap_us(tid, state.speed[(ev.tier, OUT)]),
                                           starts[option.free_from]), state.tensors[tid].bytes)
        state.hold(ev.tier, tid, e)
    ev.out_end_us = option.out_end_us
    _queue_prefetch(state, ev)
    state.add_eviction(ev)
    state.refresh(tid)
    state.version += 1


def _queue_prefetch(state: _State, ev: _Eviction) -> None:
    """Put the eviction's prefetch in its tier's queue (issued after its trigger, and not
    before its source copy is written), due at its back-access."""
    ev.in_key = (ev.trigger, 2, state.next_seq())
    issued = max(state.starts[ev.trigger + 1], ev.out_end_us)
    state.add_copy(ev.tier, IN, Copy(ev.in_key, issued, state.swap_us(ev.tensor, state.speed[(ev.tier, IN)]),
                                      state.starts[ev.before]), state.tensors[ev.tensor].bytes)


def _take_recompute(state: _State, tid: str, e: int, c: int, option: _RecomputeOption) -> None:
    state.add_eviction(_Eviction(tid, e, c, RECOMPUTE, e + 1, c - 1))
    touched = [tid]
    for src in option.reads:
        state.add_access(src, c)
        touched.append(src)
    for src, how in option.chain.items():
        status, pair = state.residency_at(src, c)
        if how == "dead":
            a = state.accesses[src][-1]
            state.add_access(src, c)
            state.add_eviction(_Eviction(src, a, c, RECOMPUTE, a + 1, c - 1))
        elif how == "split":
            a, b = pair
            del state.evictions[src][(a, b)]
            state.add_access(src, c)
            state.add_eviction(_Eviction(src, a, c, RECOMPUTE, a + 1, c - 1))
            state.add_eviction(_Eviction(src, c, b, RECOMPUTE, c + 1, b - 1))
        else:
            _retarget_swap(state, src, pair, c)
        touched.append(src)
    # new gaps of a chain source are evicted already: they are not candidates
    state.new_gaps = [g for g in state.new_gaps if state.is_gap(*g)]
    for src in touched:
        state.refresh(src)
    state.version += 1


def _retarget_swap(state: _State, src: str, pair: tuple[int, int], c: int) -> None:
    """A swap of ``src`` across (a, b) becomes one across (a, c): its prefetch is issued
    before c (the trigger moves to c - 1 if it was later) and is waited for by op c; the
    tensor then stays resident from c to b."""
    ev = state.evictions[src].pop(pair)
    state.remove_copy(ev.tier, IN, ev.in_key)
    ev.before = c
    if ev.trigger >= c:
        ev.trigger = ev.free_to = c - 1
    _queue_prefetch(state, ev)
    state.add_access(src, c)
    state.add_eviction(ev)


def _free_time(state: _State, tid: str, e: int, c: int) -> float:
    """FT = SwapInStart - SwapOutEnd on the ideal timeline (no queueing)."""
    out_end = state.starts[e + 1] + state.swap_us(tid, state.out_speed)
    in_start = state.starts[c] - state.swap_us(tid, state.in_speed)
    return in_start - out_end


def _swap_phase(state: _State) -> None:
    """Phase 1: swaps whose copies are fully hidden, in order of FreeTime."""
    pairs = [(tid, a, b) for tid in sorted(state.accesses) for a, b in state.gaps(tid)]
    pairs.sort(key=lambda g: (-_free_time(state, *g), -state.tensors[g[0]].bytes, g[0], g[1]))
    for tid, e, c in pairs:
        if not state.estimate.any_over():
            return
        if _free_time(state, tid, e, c) < 0:
            return  # sorted: no later pair can be hidden either
        option = _swap_option(state, tid, e, c, hidden_only=True)
        if option is not None:
            _take_swap(state, tid, e, c, option)


def _best_option(state: _State, tid: str, e: int, c: int):
    """(score, method, option) of the cheaper of swapping and recomputing, or None."""
    if len(state.estimate.over_in(e + 1, c)) == 0:
        return None
    swap = _swap_option(state, tid, e, c, hidden_only=False)
    redo = _recompute_option(state, tid, e, c)
    choices = []
    if swap is not None:
        choices.append((swap.overhead_us, 0, SWAP, swap))
    if redo is not None:
        choices.append((redo.cost_us, 1, RECOMPUTE, redo))
    if not choices:
        return None
    if len(choices) == 2:
        choices[0] = (swap.overhead_us * state.swap_weight,) + choices[0][1:]
        low, high = sorted((choices[0][0], choices[1][0]))
        if high > 0 and low >= high / UNSURE:
            state.unsure_pairs.add((tid, e, c))
    cost, _, method, option = min(choices, key=lambda x: (x[0], x[1]))
    nbytes = state.tensors[tid].bytes
    score = math.inf if cost <= 0 else nbytes / cost
    return score, method, option


def _hybrid_phase(state: _State) -> None:
    """Phase 2: the pair with the best bytes per second of its cheaper method, lazily
    re-scored after each choice, until the estimate fits or nothing helps."""
    for _ in range(_REBUILDS):
        if not state.estimate.any_over():
            return
        state.raised = False
        heap: list = []
        order = 0

        def push(tid: str, a: int, b: int) -> None:
            nonlocal order
            best = _best_option(state, tid, a, b)
            if best is not None:
                score, method, option = best
                heapq.heappush(heap, (-score, -state.tensors[tid].bytes, order, tid, a, b, state.version,
                                      method, option))
                order += 1

        for tid in sorted(state.accesses):
            for a, b in state.gaps(tid):
                push(tid, a, b)
        taken = 0
        while heap and state.estimate.any_over():
            _, _, _, tid, a, b, version, method, option = heapq.heappop(heap)
            if not state.is_gap(tid, a, b):
                continue
            if version != state.version:
                best = _best_option(state, tid, a, b)
                if best is None:
                    continue
                score, method, option = best
                if heap and (-score, -state.tensors[tid].bytes) > heap[0][:2]:
                    heapq.heappush(heap, (-score, -state.tensors[tid].bytes, order, tid, a, b, state.version,
                                          method, option))
                    order += 1
                    continue
            if method == SWAP:
                _take_swap(state, tid, a, b, option)
            else:
                _take_recompute(state, tid, a, b, option)
            taken += 1
            gaps, state.new_gaps = state.new_gaps, []
            for g in gaps:
                push(*g)
        if taken == 0 or not state.raised:
            return


# ----------------------------------------------------------------------------- the plan


def _actions(state: _State) -> list[Action]:
    """The plan's actions: per issuing op, drops, then offloads, then prefetches, copies
    in the order they were taken (the FIFO order the queue model assumed); then the
    recomputes, per op in producer order (a chain's sources first)."""
    ops = state.profile.ops
    producer = state.profile.producer
    steps: list[Step] = []
    redo: list[tuple] = []
    for tid in sorted(state.evictions):
        for ev in state.evictions[tid].values():
            e_id, c_id = ops[ev.after].id, ops[ev.before].id
            if ev.method == RECOMPUTE or ev.reuse_copy:
                steps.append(Step(ev.after, DROP, ev.before, (ev.before, tid), drop(tid, e_id)))
            else:
                steps.append(Step(ev.after, OFFLOAD, ev.before, ev.out_key[2], offload(tid, e_id, ev.tier)))
            if ev.method == RECOMPUTE:
                redo.append(((ev.before, producer[tid], tid), recompute(tid, c_id)))
            else:
                steps.append(Step(ev.trigger, PREFETCH, ev.before, ev.in_key[2],
                                  prefetch(tid, ops[ev.trigger].id, c_id, ev.tier)))
    redo.sort(key=lambda x: x[0])
    return issue_order(steps, fifo=True) + [a for _, a in redo]


def _simulate(state: _State):
    actions = tuple(_actions(state))
    return actions, score(state.sim, state.budget, actions)


def _move_triggers(state: _State, result, step: float) -> int:
    """Move earlier the trigger of every prefetch whose back-access still waited for
    data; returns how many moved."""
    ops = state.profile.ops
    stalls = {op_id: s["data_us"] for op_id, s in result.stall_by_op.items() if s["data_us"] > 1e-9}
    if not stalls:
        return 0
    moved = 0
    shift_floor = step * state.profile.ideal_us
    for tid in sorted(state.evictions):
        for ev in sorted(state.evictions[tid].values(), key=lambda v: v.after):
            if ev.method != SWAP or ops[ev.before].id not in stalls:
                continue
            target = state.starts[ev.trigger + 1] - max(stalls[ops[ev.before].id], shift_floor)
            nbytes = state.tensors[tid].bytes
            too_full = state.estimate.last_over(nbytes, ev.free_from + 1, ev.trigger + 1)
            lowest = ev.free_from if too_full is None else too_full
            p = ev.trigger
            while p > lowest:
                p -= 1
                if state.starts[p + 1] <= target:
                    break
            if p == ev.trigger:
                continue
            state.remove_copy(ev.tier, IN, ev.in_key)
            ev.trigger = ev.free_to = p
            _queue_prefetch(state, ev)
            state.refresh(tid)
            moved += 1
    return moved


def _better(result, than) -> bool:
    if result.ok != than.ok:
        return result.ok
    if result.valid != than.valid:
        return result.valid
    return result.iteration_us < than.iteration_us - 1e-6


def _feedback(state: _State, rounds: int, step: float) -> tuple[list[Action], object, dict]:
    """Step 6: simulate, move stalled prefetch triggers earlier, simulate again; at most
    ``rounds`` times. Returns the best simulated plan's actions, its result and what
    happened."""
    actions, result = _simulate(state)
    best_actions, best = actions, result
    first_stall = result.stall_data_us
    done = 0
    for _ in range(max(0, rounds)):
        if not result.ok or _move_triggers(state, result, step) == 0:
            break
        done += 1
        actions, result = _simulate(state)
        if _better(result, best):
            best_actions, best = actions, result
    notes = {"feedback_rounds_run": done, "first_stall_data_us": first_stall,
             "stall_data_us": best.stall_data_us}
    return list(best_actions), best, notes


def _ssd_tensors(sim, budget_bytes, swap: bool, recompute: bool, swap_weight: float) -> frozenset:
    """The tensors whose swaps should go to the SSD: plan as if host memory were
    unbounded, then, while its swaps' copies would overflow host memory at some op, move
    the swapped tensor with the longest free time among those holding host space there
    to the SSD."""
    state = _State(sim, budget_bytes, swap, recompute, swap_weight, False, None,
                   host_bytes=sum(t.bytes for t in sim.profile.tensors))
    if state.estimate.any_over():
        _swap_phase(state)
        _hybrid_phase(state)
    capacity = sim.hardware.host.memory_bytes
    use = state.tier_use[HOST].copy()
    spans: dict[str, tuple[float, int, int]] = {}
    for tid, evs in state.evictions.items():
        for (e, c), ev in evs.items():
            if ev.method == SWAP and not ev.reuse_copy:
                ft = _free_time(state, tid, e, c)
                if tid not in spans or ft > spans[tid][0]:
                    spans[tid] = (ft, state.held[HOST][tid], state.accesses[tid][-1] + 1)
    order = sorted(spans, key=lambda t: (-spans[t][0], -state.tensors[t].bytes, t))
    chosen = []
    while len(use) and int(use.max()) > capacity:
        worst = int(np.argmax(use))
        pick = next((t for t in order if t not in chosen and spans[t][1] <= worst < spans[t][2]), None)
        if pick is None:
            break
        chosen.append(pick)
        use[spans[pick][1]:spans[pick][2]] -= state.tensors[pick].bytes
    return frozenset(chosen)


def _plan(sim, budget_bytes, swap: bool, recompute: bool, swap_weight: float,
          feedback_rounds: int, feedback_step: float, spill: bool = False) -> tuple[Draft, object, int]:
    """One Capuchin plan: phases 1 and 2, then feedback. Returns the draft, its simulated
    result (None without actions) and how many of its phase-2 choices were unsure."""
    return _plan_tiers(sim, budget_bytes, swap, recompute, swap_weight, feedback_rounds, feedback_step, spill)[:3]


def _plan_tiers(sim, budget_bytes, swap: bool, recompute: bool, swap_weight: float,
                feedback_rounds: int, feedback_step: float, spill: bool) -> tuple[Draft, object, int, bool]:
    """``_plan``, and whether a swap was refused for want of host memory (``spill``: with
    the SSD tier)."""
    ssd_first = _ssd_tensors(sim, budget_bytes, swap, recompute, swap_weight) if spill else None
    state = _State(sim, budget_bytes, swap, recompute, swap_weight, spill, ssd_first)
    if state.estimate.any_over():
        _swap_phase(state)
        _hybrid_phase(state)
    methods = [ev.method for evs in state.evictions.values() for ev in evs.values()]
    unsure = sum(1 for tid, e, c in state.unsure_pairs if (e, c) in state.evictions.get(tid, {}))
    notes = {"swaps": methods.count(SWAP), "recomputes": methods.count(RECOMPUTE), "unsure_choices": unsure,
             "estimate_over_budget_ops": int(state.estimate.over().sum())}
    if SSD in state.tiers:
        notes["ssd_swaps"] = sum(1 for evs in state.evictions.values() for ev in evs.values()
                                 if ev.method == SWAP and ev.tier == SSD)
    if not state.evictions:
        return Draft(notes=notes), None, unsure, state.host_short
    actions, result, feedback = _feedback(state, feedback_rounds, feedback_step)
    notes.update(feedback)
    return Draft(actions=actions, notes=notes), result, unsure, state.host_short


def _judged_plan(sim, budget_bytes, swap: bool, recompute: bool, feedback_rounds: int, feedback_step: float,
                 spill: bool) -> tuple[Draft, object, bool]:
    """Step 7: a plan, and where its estimate was unsure a swap-leaning one, the faster of
    the two by simulation. Returns the draft, its result and whether host memory was short."""
    draft, result, unsure, short = _plan_tiers(sim, budget_bytes, swap, recompute, 1.0,
                                               feedback_rounds, feedback_step, spill)
    if unsure and swap and recompute:
        # the stall estimate was unsure between a swap and a recompute: plan again leaning
        # to swaps, and let the simulator judge
        other, other_result, _ = _plan(sim, budget_bytes, swap, recompute, 1.0 / UNSURE,
                                       feedback_rounds, feedback_step, spill)
        chosen = other is not None and other_result is not None and (result is None or _better(other_result, result))
        if chosen:
            draft, result = other, other_result
        draft.notes["judged_by_simulation"] = "swap-leaning replan" if chosen else "first plan"
    return draft, result, short


@register(
    "capuchin",
    "Capuchin: per tensor, swap where the copy hides in its idle time, else the cheaper of "
    "a swap stall and a recompute (ranked by memory saved per second); prefetch triggers "
    "moved earlier by simulated feedback; swaps spill to the SSD when host memory is full.",
    params=(
        Param("feedback_rounds", 10,
              "simulate-and-adjust rounds moving stalled prefetch triggers earlier (0: none)", low=0, high=1000),
        Param("feedback_step", 0.05,
              "least a stalled trigger moves earlier per round, as a fraction of the iteration", low=0.0, high=1.0),
        Param("recompute", True, "allow recomputation (drop + recompute) as well as swapping"),
        Param("ssd", True, "when host memory runs out, let swaps go to the SSD as well (machines with one; "
                           "a departure from the paper)"),
        Param("swap", True, "allow swapping to host memory"),
    ),
    moves_persistent=False,
    recomputes=True,
    paper="Peng et al., Capuchin: Tensor-based GPU Memory Management for Deep Learning, ASPLOS 2020",
    family="swap + recompute",
)
def plan_capuchin(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, feedback_rounds=10, feedback_step=0.05,
                  recompute=True, ssd=True, swap=True):
    sim = simulator_for(profile, hardware, options)
    draft, result, short = _judged_plan(sim, budget_bytes, swap, recompute, feedback_rounds, feedback_step, False)
    if short and ssd and swap and hardware.ssd is not None:
        # host memory was short: plan again with the SSD tier, and let the simulator judge
        spilled, spilled_result, _ = _judged_plan(sim, budget_bytes, swap, recompute, feedback_rounds,
                                                   feedback_step, True)
        if spilled_result is not None and (result is None or _better(spilled_result, result)):
            spilled.notes["ssd_tier"] = "host memory short: the plan with SSD spills is faster"
            draft = spilled
        else:
            draft.notes["ssd_tier"] = "host memory short: the host-only plan is kept (the SSD plan is not faster)"
    return draft
