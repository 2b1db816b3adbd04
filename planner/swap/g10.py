"""``g10``: G10's smart tensor migration across GPU, host memory and SSD.

Follows Zhang et al., "G10: Enabling An Efficient Unified GPU Memory and Storage
Architecture with Smart Tensor Migrations", MICRO 2023 (its tensor vitality analysis and
smart tensor migration scheduling), as summarised from the paper (its full text was
not available here to check that summary against), so every rule below is the
summary's:

1. Input: every tensor's idle intervals between uses, at kernel granularity
   (``planner.shared.facts.idle_gaps``; times from the ideal timeline).
2. Greedy: repeatedly take the interval of largest benefit = bytes x (time, inside the
   interval's window, during which the estimated GPU memory is over the budget). The
   window runs from the kernel by which half the tensor could be written out to the
   kernel from which the last half would be read back, given the bandwidth left at each
   kernel. Ties: bytes x interval length. It stops when no interval has a benefit left.
3. Destination, the "2.5x rule" (factor ``rule_factor``): the SSD if the interval is
   longer than factor x (SSD latency + system latency + bytes / SSD bandwidth) and the
   SSD has the bandwidth left for the move; else host memory if the interval is longer
   than factor x (system latency + bytes / PCIe bandwidth) and host memory has room;
   else the tensor stays on the GPU for that interval. (Here the two tiers are tried in
   the other order: see the first departure.)
4. Bandwidth: each kernel offers its time on each link to the moves that overlap it.
5. Eviction right after the last use before the interval. Prefetch: the latest start
   whose remaining per-kernel bandwidth covers the transfer, counting back from the use;
   then (one pass after the greedy, in order of use) moved earlier while the estimated
   memory stays below ``eager_limit`` x budget and the eviction has ended.

How the paper's terms map onto this simulator:

- "System latency" (G10's GPU fault / DMA set-up cost, 45 us in its artifact) is the
  hardware's PCIe ``latency_us``, the per-transfer cost the simulator charges (R17).
  "SSD bandwidth" in the rule is the slower of the SSD's read and write bandwidth; "PCIe
  bandwidth" the slower PCIe direction.
- Bandwidth is accounted as link time: kernel k offers ``time_us[k]`` on each of
  ``pcie_up``, ``pcie_down``, ``ssd_write``, ``ssd_read`` (and of the one copy engine on
  a half-duplex machine). A move runs for its lone duration (latency + bytes / the
  slowest link's bandwidth, ``simulator.model.links.link_speed``) and uses each link it
  crosses in proportion to its share of that link's bandwidth, as the simulator shares
  links (R17): an SSD move takes bytes / PCIe bandwidth of PCIe time, which leaves the
  rest of PCIe to host moves. For a host move this is "bandwidth x kernel time".
- "SSD write bandwidth is free" is read as: with the link time left, the eviction ends
  and the prefetch starts inside the interval with the tensor away for at least one
  kernel. Host moves pass the same test; SSD capacity is checked like host capacity (R19:
  space held from the eviction until the tensor dies or the iteration ends, and reused
  when the tensor goes to the same tier again).
- Persistent tensors (weights, optimizer state, inputs) may move (R20 steady state):
  besides their in-iteration intervals, the interval across the iteration boundary (last
  touch to first touch of the next iteration) is a candidate, as in G10's steady-state
  view of training. Taking it starts the tensor in the tier (``initial``), prefetches it
  before its first touch (issued no earlier than the iteration start) and, after its last
  touch, writes it back (an offload) or, if no op updates it, drops it (its copy there is
  still valid, R14); so it ends where it started. An in-iteration interval always
  prefetches the tensor back before its next touch, so a tensor that started on the GPU
  is resident at the end. A persistent tensor no op touches is simply placed in the tier.

Departures (and why):

- Host memory first, and the SSD only for what host memory cannot hold (the 2.5x rule
  still decides which tiers an interval may use). Sending every long interval to the
  SSD first put the forward pass's activations on a link a fifth of PCIe's speed while
  host memory had room: on G10's machine (the preset a100-40gb-128gb-g10, with
  G10's measured kernel times) ResNet-152 b1280 wrote 153 GiB to the SSD with host
  memory at 99.7 of 128 GiB, and its evictions to the SSD that could not end in time
  (42 GiB) made the forward pass wait for memory: 1.105x the ideal; host first, 1.000x.
  Then, when the SSD was used, the spill choice (``spill_choice``): with the chosen moves
  all in host memory, the bytes over its capacity at the worst kernel are a share of
  the tensors that could go to the SSD (by the rule) and are held across a kernel over
  capacity; that share of them, spread in eviction order from the first eviction on
  (then the longest intervals, while any kernel is still over), try the SSD first, and
  the greedy runs again. With the SSD's writes the bottleneck of the forward pass (SENet-
  154 b1024 must put 179 GiB on the SSD before its backward), host memory first left the
  SSD idle until host memory was full (1.274x); spread, the SSD writes from the start
  and reads back through the whole backward pass (1.244x; the bound is 1.234x). The
  longest intervals alone on the SSD are worse (1.401x: their reads all fall at the end
  of the backward pass). The plan the simulator runs faster of the two is kept. This
  replaces the host-only retry (host memory first leaves nothing for it to win back).
- Whole tensors, not pages: memory is freed when an eviction has ended and taken when a
  prefetch starts (R11, R12). The benefit keeps the paper's half-written / half-read
  window, but an interval whose move would not keep the tensor away during any
  over-budget kernel is skipped: here it would free nothing.
- The greedy is evaluated lazily (benefits only fall as memory and link time are used;
  a switch from SSD to host, or link time an advance gives back, can raise one, which is
  then taken at its new value), and a re-evaluated head within 5% of the best benefit
  left is taken at once (``LAZY_TOLERANCE``): an approximate greedy that cuts the
  re-evaluations, and with them planning time on large profiles, at no loss of plan
  quality on the shipped profiles. Placing a transfer is two binary searches in a running
  sum of the link time left (rebuilt only when a move is taken), and the round that lets
  write-backs run past the last kernel re-evaluates only those write-backs: nothing else
  can use that tail. Together: 52 s -> 4.3 s on a 6,157-op transformer (two drafts).
- Fallback (``fallback``, default on; off gives the rules above alone). The paper's
  runtime overlaps the write-back of updated persistent tensors with the next iteration,
  faults in what a prefetch did not bring in time, and stalls a kernel until migrations
  free its memory; its plan is a schedule the runtime may run late. Here the plan must
  fit the budget in the estimate itself: the rules place every move inside the link time
  of the ideal timeline, and where tensors are made faster than the link can write them
  out (the traced profiles' forward passes: on gpt2-b48-s1024 at 50% of the peak, ~39 GiB
  must leave before the logits' backward, while PCIe moves 27 GiB in the ideal time up
  to there) they leave memory over budget; the simulator then finds an op waiting for
  memory that nothing in flight will free (R10). So when the rules leave estimated memory
  over budget, up to three more greedy rounds follow, each only if memory is still over:
  (1) write-backs across the iteration boundary may run after the last kernel (they
  lengthen the iteration: its tail); (2) a prefetch that cannot be hidden may start in the
  kernel before its use, which waits for the rest (a planned stall, like a fault); (3) an
  eviction that cannot be hidden counts as done from the kernel after the last use (also
  a write-back across the boundary): it takes the link time left in that kernel, and a
  kernel that needs the memory waits for the rest of the copy (a planned memory stall;
  the link time it then takes is not booked). In rounds 2 and 3 a move already chosen
  whose transfers the link time placed so that the tensor is still on the GPU in a kernel
  over budget (a late eviction, or a prefetch that lands ahead of the op that needs the
  memory) is a candidate again, to be advanced (eviction at once and/or prefetch at the
  use, same tier), with benefit = bytes x the over-budget time it newly covers.
  The estimate counts a tensor on the GPU from the first kernel after its prefetch is
  issued, and off it no earlier than the first kernel after its eviction is issued; an op
  waiting for memory lets every copy issued before it end, so a plan whose estimate fits
  the budget only ever stalls, it does not deadlock (no counter-example on the shipped
  profiles; before round 3 and the advances, every g10 plan the simulator found
  infeasible on them had its own estimate over budget).
- Timing is the ideal timeline; the plan is not re-planned from simulated times.
- Recomputation (``recompute``, off by default: G10 only migrates). Where a tier cannot
  take what the moves put on it before the ops that need the room (the SSD's writes when
  anything spills there, else PCIe's), each byte over is a stall, while a tensor whose
  producer re-runs in less time per byte than that tier writes one is cheaper recomputed.
  With ``recompute``, the kernel where the tier falls furthest behind the chosen moves is
  found (``tier_shortfall``: the bytes the moves hold in the tier there, less what it can
  write from the iteration start to it on the ideal timeline); the cheapest recomputable
  tensors idle there (planner/shared/regen.py: R15, their producer's inputs still needed
  after the recompute) are dropped after their last use and recomputed before their
  next, as many bytes as that shortfall, and G10's greedy plans the rest around them;
  then more (or fewer) bytes by ``RECOMPUTE_STEP`` while the simulated iteration
  shortens. The fastest simulated draft is kept, so the option never makes a plan
  slower. On G10's machine with G10's kernel times SENet-154 b1024 goes from 1.244x to
  1.042x the ideal (74 tensors, 95 GiB recomputed; G10 reports 1.07x; the swap-only
  bound is 1.234x), with roofline kernel times from 6.75x to 1.60x, and ResNet-152
  b1280 with roofline times from 4.02x to 1.51x; on a100-40gb-pcie4 (host memory only)
  ResNet-152 b512 at 30% of its peak from 5.49 s to 3.47 s (bound 3.39 s). `joint`
  may return this plan (planner/shared/ilp/common.py ``RECOMPUTE_ALSO``). The search is in
  planner/swap/_g10_recompute.py.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from simulator.model.links import LINKS, link_speed, transfer_links
from simulator.plan import drop, offload, prefetch, recompute

from ..core.api import score, simulator_for
from ..core.lowering import DROP, PREFETCH, Step, issue_order, phase_of
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.estimate import MemoryEstimate
from ..shared.facts import held_per_op, op_start_us, touches
from ..shared.regen import Regen
from ._g10_recompute import recompute_spills


@dataclass(frozen=True)
class Interval:
    """A candidate move: tensor ``tensor`` is not touched after op ``after`` until op
    ``before``. ``wraps``: the interval runs across the iteration boundary (persistent
    tensors), from the last touch ``after`` to the first touch ``before``; ``after`` and
    ``before`` are None for a persistent tensor no op touches."""
    tensor: str
    nbytes: int
    after: int | None
    before: int | None
    length_us: float
    wraps: bool
    persistent: bool
    updated: bool       # some op updates it in place (its lower-tier copies go stale, R16)
    order: int


@dataclass
class Move:
    """A chosen interval: where it goes and when its transfers run on the ideal timeline.

    The eviction ends during kernel ``evict_end`` (``interval.after`` for an eviction at
    once: the tensor counts as gone from the next kernel, which waits for the copy if it
    needs the memory); the prefetch starts at kernel ``fetch_start`` (issued when op
    ``fetch_start - 1`` ends, or at the iteration start).
    The tensor is away from the GPU during the kernels in ``away`` (two ranges for an
    interval across the iteration boundary).
    """
    interval: Interval
    tier: str
    evict_end: int | None
    fetch_start: int | None
    evict_use: "Reservation | None"
    fetch_use: "Reservation | None"
    benefit: float
    half_out: int | None = None      # kernel by which half the eviction is done
    half_in: int | None = None       # kernel from which the last half of the prefetch runs
    replaces: "Move | None" = None   # fallback: the chosen move of the same interval it advances

    def away(self, n: int) -> list[tuple[int, int]]:
        """Kernel ranges [lo, hi) during which the tensor is off the GPU."""
        iv = self.interval
        if iv.after is None:
            return [(0, n)]
        if iv.wraps:
            return [(0, self.fetch_start), (self.evict_end + 1, n)]
        return [(self.evict_end + 1, self.fetch_start)]

    def evicts_by_drop(self) -> bool:
        return self.interval.wraps and not self.interval.updated


class Reservation:
    """Link time one transfer takes from kernels ``lo``.. on ``links``: ``used`` is the
    transfer's own running time in each kernel; a link with scale s gives 1/s of that
    (the transfer uses that share of its bandwidth).

    Built from a read-only view of the link time left when it was placed, with the one
    kernel it uses only in part (``edge``: 0 or -1) set to ``edge_us``; the copy is made
    only when the reservation is taken, as most placements are only priced."""
    __slots__ = ("links", "lo", "_base", "_edge", "_edge_us", "_used")

    def __init__(self, links, lo: int, base: np.ndarray, edge: int | None = None, edge_us: float = 0.0):
        self.links = links
        self.lo = lo
        self._base, self._edge, self._edge_us = base, edge, edge_us
        self._used = base if edge is None else None

    @property
    def used(self) -> np.ndarray:
        if self._used is None:
            used = self._base.copy()
            used[self._edge] = self._edge_us
            self._used = used
        return self._used


class LinkTime:
    """Link time left at each kernel, per link of the simulator's route model (R17, R18:
    ``simulator.model.links.transfer_links``): ``pcie_up``, ``pcie_down``,
    ``ssd_write_link``, ``ssd_read_link``, and on a half-duplex machine the one copy ``engine``.

    A transfer runs at the rate of the slowest link it crosses and uses each link's
    bandwidth in proportion: an SSD copy takes bytes / PCIe bandwidth of PCIe time, not
    its whole (slower) duration, as links are shared by bandwidth (R17 of the rules'
    version 2). The copy engine is held whole while a copy that needs it runs.
    """

    def __init__(self, times: np.ndarray, hardware):
        self.hardware = hardware
        self.half = hardware.pcie.duplex == "half"
        names = LINKS + (("engine",) if self.half else ())
        # one entry per kernel, then the tail after the last kernel (closed until opened)
        self.left = {name: np.append(times.astype(float), 0.0) for name in names}
        self._links: dict = {}
        self._sums: dict = {}   # links -> (_arrays), dropped whenever link time changes

    def open_tail(self) -> None:
        """Let transfers run on after the last kernel (they then lengthen the iteration)."""
        for left in self.left.values():
            left[-1] = np.inf
        self._sums.clear()

    def links(self, direction: str, tier: str) -> tuple[tuple[str, float], ...]:
        """The links a transfer crosses, each with its scale: the link's bandwidth over the
        transfer's rate (1 for the slowest link, and for the copy engine)."""
        key = (direction, tier)
        if key not in self._links:
            self._links[key] = self._route(direction, tier)
        return self._links[key]

    def _route(self, direction: str, tier: str) -> tuple[tuple[str, float], ...]:
        _, links, uses_engine = transfer_links(self.hardware, direction, tier)
        rate = min(bandwidth for _, bandwidth in links)
        return tuple((name, bandwidth / rate) for name, bandwidth in links) + ((("engine", 1.0),) if uses_engine else ())

    def _arrays(self, links) -> tuple[np.ndarray, np.ndarray]:
        """The transfer's own running time the links leave it in each kernel, and its
        running sum from kernel 0 (rebuilt only after link time was taken or given back),
        so that placing a transfer is two binary searches, not a scan."""
        found = self._sums.get(links)
        if found is None:
            (name, scale), *rest = links
            avail = self.left[name] * scale
            for name, scale in rest:
                avail = np.minimum(avail, self.left[name] * scale)
            avail = np.maximum(avail, 0.0)
            avail.setflags(write=False)   # reservations keep views of it
            found = self._sums[links] = (avail, np.concatenate(([0.0], np.cumsum(avail))))
        return found

    def _available(self, links, lo: int, hi: int) -> np.ndarray:
        """The transfer's own running time the links leave it in kernels [lo, hi) (a view)."""
        return self._arrays(links)[0][lo:hi]

    def forward(self, links, lo: int, hi: int, duration: float):
        """Run a transfer from the start of kernel ``lo``, in kernels before ``hi``: over
        the fewest kernels whose link time left covers ``duration``.

        Returns (kernel it ends in, kernel by which half is done, Reservation), or None
        when the link time left in [lo, hi) does not cover ``duration``.
        """
        if hi <= lo:
            return None
        avail, sums = self._arrays(links)
        need = duration * (1 - 1e-12)
        if sums[hi] - sums[lo] < need:
            return None
        end = max(lo, int(sums.searchsorted(sums[lo] + need)) - 1)
        half = max(lo, int(sums.searchsorted(sums[lo] + duration / 2)) - 1)
        return end, half, Reservation(links, lo, avail[lo:end + 1], -1, duration - (sums[end] - sums[lo]))

    def backward(self, links, lo: int, hi: int, duration: float):
        """Place a transfer as late as possible so that it ends by the end of kernel
        ``hi - 1``, using kernels from ``lo`` on.

        Returns (kernel it starts in, kernel from which the last half runs,
        Reservation), or None when [lo, hi) does not have the link time.
        """
        if hi <= lo:
            return None
        avail, sums = self._arrays(links)
        need = duration * (1 - 1e-12)
        if sums[hi] - sums[lo] < need:
            return None
        start = min(hi - 1, int(sums.searchsorted(sums[hi] - need, "right")) - 1)
        half = min(hi - 1, int(sums.searchsorted(sums[hi] - duration / 2, "right")) - 1)
        return start, half, Reservation(links, start, avail[start:hi], 0, duration - (sums[hi] - sums[start + 1]))

    def at_the_use(self, links, lo: int, hi: int, duration: float):
        """A prefetch that cannot be hidden: it starts at kernel ``hi - 1`` (if that is not
        before ``lo``), takes the link time left there, and its use waits for the rest."""
        start = hi - 1
        if start < lo:
            return None
        used = np.minimum(self._available(links, start, hi), duration)
        return start, start, Reservation(links, start, used)

    def right_after(self, links, lo: int, hi: int, duration: float):
        """An eviction that cannot be hidden: it starts at kernel ``lo`` (if that is before
        ``hi``) and takes the link time left there; the tensor counts as gone from ``lo``
        on, and a kernel that needs its memory waits for the rest of the copy.

        Returns (``lo - 1``: the eviction counts as ended before ``lo``, ``lo``, Reservation)."""
        if hi <= lo:
            return None
        used = np.minimum(self._available(links, lo, lo + 1), duration)
        return lo - 1, lo, Reservation(links, lo, used)

    def all_left(self, links, lo: int, hi: int) -> Reservation:
        """Every bit of link time left in [lo, hi) (for a transfer longer than that)."""
        return Reservation(links, lo, self._available(links, lo, hi).copy())

    def take(self, reservation: Reservation | None) -> None:
        if reservation is not None:
            for name, scale in reservation.links:
                seg = self.left[name][reservation.lo:reservation.lo + len(reservation.used)]
                seg -= reservation.used / scale
            self._sums.clear()

    def give_back(self, reservation: Reservation | None) -> None:
        if reservation is not None:
            for name, scale in reservation.links:
                seg = self.left[name][reservation.lo:reservation.lo + len(reservation.used)]
                seg += reservation.used / scale
            self._sums.clear()


class TierSpace:
    """Host and SSD bytes in use at each kernel (R19), with per-tensor space reuse."""

    def __init__(self, n: int, hardware):
        self.capacity = {"host": hardware.host.memory_bytes,
                         "ssd": hardware.ssd.capacity_bytes if hardware.ssd else 0}
        self.used = {tier: np.zeros(n, dtype=np.int64) for tier in self.capacity}
        self.held_from: dict[tuple[str, str], int] = {}
        self.peak = {tier: 0 for tier in self.capacity}   # the most bytes in use at any kernel

    def extra(self, tid: str, tier: str, lo: int, hi: int) -> tuple[int, int]:
        """The kernel range [lo', hi) this tensor would newly hold in the tier."""
        held = self.held_from.get((tid, tier))
        return (lo, hi) if held is None else (lo, min(hi, held))

    def has_room(self, tid: str, tier: str, nbytes: int, lo: int, hi: int) -> bool:
        lo, hi = self.extra(tid, tier, lo, hi)
        if hi <= lo or self.peak[tier] + nbytes <= self.capacity[tier]:
            return True
        return int(self.used[tier][lo:hi].max()) + nbytes <= self.capacity[tier]

    def hold(self, tid: str, tier: str, nbytes: int, lo: int, hi: int) -> None:
        new_lo, new_hi = self.extra(tid, tier, lo, hi)
        if new_hi > new_lo:
            self.used[tier][new_lo:new_hi] += nbytes
            self.peak[tier] = max(self.peak[tier], int(self.used[tier][new_lo:new_hi].max()))
        held = self.held_from.get((tid, tier))
        self.held_from[(tid, tier)] = lo if held is None else min(lo, held)


# ----------------------------------------------------------------------------- candidates


def candidate_intervals(profile, starts: list[float], regens: tuple[Regen, ...] = ()) -> list[Interval]:
    """Every tensor's idle intervals, and each persistent tensor's interval across the
    iteration boundary (or the whole iteration when no op touches it). ``regens``: the
    gaps recomputed instead (not candidates), whose recomputes read their sources (a
    touch that splits a source's interval)."""
    found: list[Interval] = []
    n = len(profile.ops)
    ideal = starts[-1]
    skipped = {(r.tensor, r.after) for r in regens}
    read_at: dict[str, set[int]] = {}
    for r in regens:
        for source in r.sources:
            read_at.setdefault(source, set()).add(r.before)
    for tensor in profile.tensors:
        if tensor.bytes <= 0:
            continue
        updated = bool(profile.updaters[tensor.id])
        for after, before in _gaps(profile, tensor.id, read_at.get(tensor.id)):
            if (tensor.id, after) not in skipped:
                found.append(Interval(tensor.id, tensor.bytes, after, before, starts[before] - starts[after + 1],
                                      False, tensor.persistent, updated, len(found)))
        if not tensor.persistent:
            continue
        points = sorted(set(touches(profile, tensor.id)) | read_at.get(tensor.id, set()))
        if not points:
            found.append(Interval(tensor.id, tensor.bytes, None, None, ideal, True, True, False, len(found)))
            continue
        first, last = points[0], points[-1]
        if n - 1 - last + first >= 1:
            length = ideal - starts[last + 1] + starts[first]
            found.append(Interval(tensor.id, tensor.bytes, last, first, length, True, True, updated,
                                  len(found)))
    return found


def _gaps(profile, tid: str, extra: set[int] | None) -> list[tuple[int, int]]:
    """(after, before) of the tensor's idle gaps (as ``idle_gaps``), with ``extra`` op
    positions counted as touches."""
    points = sorted(set(touches(profile, tid)) | extra) if extra else touches(profile, tid)
    return [(a, b) for a, b in zip(points, points[1:]) if b - a >= 2]


def move_speeds(hardware, use_ssd: bool) -> dict[str, tuple[float, float]]:
    """Per tier the 2.5x rule may choose, SSD first: (latency in us, bytes per us) of the
    slower of a move's two lone transfers, on the simulator's routes (``link_speed``)."""
    found = {}
    for tier in (("ssd", "host") if use_ssd and hardware.ssd is not None else ("host",)):
        speeds = [link_speed(hardware, kind, tier) for kind in ("offload", "prefetch")]
        found[tier] = (max(latency for latency, _ in speeds), min(rate for _, rate in speeds))
    return found


def rule_tiers(interval: Interval, speeds: dict[str, tuple[float, float]], factor: float) -> list[str]:
    """The tiers the 2.5x rule allows for this interval, SSD first: the interval must be
    ``factor`` times the move's transfer time (``move_speeds``)."""
    return [tier for tier, (latency, rate) in speeds.items()
            if interval.length_us > factor * (latency + interval.nbytes / rate)]


# ----------------------------------------------------------------------------- the planner state


class G10State:
    """The greedy's state: estimated memory per kernel (the ``MemoryEstimate`` shared with
    capuchin and flashneuron), link time and tier space left."""

    def __init__(self, profile, hardware, budget_bytes: int, rule_factor: float, use_ssd: bool,
                 spill: frozenset = frozenset(), regens: tuple[Regen, ...] = ()):
        self.profile = profile
        self.spill = spill          # tensors the spill choice sends to the SSD first
        self.hardware = hardware
        self.rule_factor = rule_factor
        self.use_ssd = use_ssd
        self.n = len(profile.ops)
        self.starts = op_start_us(profile)
        self.times = np.array([op.time_us for op in profile.ops], dtype=float)
        self.estimate = MemoryEstimate(profile, budget_bytes)
        for r in regens:   # away from the op after the drop; the recompute makes it again before its use
            self.estimate.remove(r.nbytes, r.after + 1, r.before)
        self.links = LinkTime(self.times, hardware)
        self.space = TierSpace(self.n, hardware)
        self.demand_fetch = False  # fallback: prefetches that cannot be hidden start at the use
        self.demand_evict = False  # fallback: evictions that cannot be hidden count at once
        self.over_after_rules = False
        self.taken: dict[int, Move] = {}  # interval order -> its chosen move
        tiers = ("host", "ssd") if hardware.ssd is not None else ("host",)
        self._rule_tiers: dict[int, list[str]] = {}
        self._move_speeds = move_speeds(hardware, use_ssd)
        self._speeds = {(direction, tier): link_speed(hardware, direction, tier)
                        for direction in ("offload", "prefetch") for tier in tiers}

    def rule_tiers(self, interval: Interval) -> list[str]:
        """The tiers the 2.5x rule allows for this interval, in the order they are tried
        (fixed per interval): host memory first and the SSD when host memory has no room,
        except for the tensors of ``spill``, which try the SSD first (departures, see the
        module docstring)."""
        found = self._rule_tiers.get(interval.order)
        if found is None:
            first = "ssd" if interval.tensor in self.spill else "host"
            found = sorted(rule_tiers(interval, self._move_speeds, self.rule_factor), key=lambda tier: tier != first)
            self._rule_tiers[interval.order] = found
        return found

    def transfer_us(self, direction: str, tier: str, nbytes: int) -> float:
        """A lone transfer's time: latency + bytes at the slowest link it crosses."""
        latency, rate = self._speeds[direction, tier]
        return latency + nbytes / rate

    def allow_demand_fetch(self) -> None:
        self.demand_fetch = True

    def allow_demand_evict(self) -> None:
        self.demand_evict = True

    # -- tier space held by a move (R19)

    def held_range(self, interval: Interval, evict_start: int) -> tuple[int, int]:
        if interval.wraps:
            return 0, self.n
        if interval.persistent:
            return evict_start, self.n
        return evict_start, self.profile.last_use[interval.tensor] + 1

    # -- scheduling one interval on one tier

    def schedule(self, interval: Interval, tier: str, at_use: bool = False,
                 at_once: bool = False) -> Move | None:
        """Place the eviction and the latest prefetch with the link time left, or None.
        ``at_use`` (fallback): start the prefetch in the kernel before the use instead, so
        that the use waits for what the link time there does not cover. ``at_once``
        (fallback): the tensor is gone from the kernel after its last use, and a kernel
        that needs the memory waits for what the link time there does not cover."""
        n = self.n
        nbytes = interval.nbytes
        if interval.after is None:
            return Move(interval, tier, None, None, None, None, 0.0)
        out_links = self.links.links("offload", tier)
        in_links = self.links.links("prefetch", tier)
        out_us = self.transfer_us("offload", tier, nbytes)
        in_us = self.transfer_us("prefetch", tier, nbytes)
        if interval.wraps:
            if interval.updated:  # write the updated tensor back, inside the iteration or in its tail
                place = self.links.right_after if at_once else self.links.forward
                evicted = place(out_links, interval.after + 1, n + 1, out_us)
                if evicted is None:
                    return None
            else:  # its copy in the tier is still valid: drop it after its last touch (R14)
                evicted = (interval.after, interval.after + 1, None)
            fetch_from = 0
        else:
            place = self.links.right_after if at_once else self.links.forward
            evicted = place(out_links, interval.after + 1, interval.before, out_us)
            if evicted is None:
                return None
            # away for at least the kernel after the eviction ends
            fetch_from = max(evicted[0], interval.after) + 2
        if at_use:
            fetched = self.links.at_the_use(in_links, fetch_from, interval.before, in_us)
        else:
            fetched = self._with(evicted[2], lambda: self.links.backward(
                in_links, fetch_from, interval.before, in_us))
        if fetched is None:
            return None
        return Move(interval, tier, evicted[0], fetched[0], evicted[2], fetched[2], 0.0,
                    half_out=evicted[1], half_in=fetched[1])

    def _with(self, reservation: Reservation | None, compute):
        """Evaluate ``compute`` with ``reservation`` taken (matters when the eviction and
        the prefetch share a link: half duplex)."""
        if not self.links.half or reservation is None:
            return compute()
        self.links.take(reservation)
        try:
            return compute()
        finally:
            self.links.give_back(reservation)

    def over_in_span(self, interval: Interval) -> bool:
        """Is any kernel the interval could leave the GPU during over budget?"""
        if interval.after is None:
            return self.estimate.over_us(0, self.n) > 0
        if interval.wraps:
            return self.estimate.over_us(interval.after + 1, self.n) + self.estimate.over_us(0, interval.before) > 0
        return self.estimate.over_us(interval.after + 1, interval.before) > 0

    def evaluate(self, interval: Interval) -> Move | None:
        """The move the rules choose for this interval now, with its benefit; None if
        no tier is allowed or the move would free nothing while memory is over budget.
        For an interval already taken: its advance (fallback), if any."""
        taken = self.taken.get(interval.order)
        if taken is not None:
            return self.advance(taken)
        if not self.over_in_span(interval):
            return None
        evict_start = 0 if interval.after is None else interval.after + 1
        held_lo, held_hi = self.held_range(interval, evict_start)
        placements = self.placements(interval)
        for tier in self.rule_tiers(interval):
            if not self.space.has_room(interval.tensor, tier, interval.nbytes, held_lo, held_hi):
                continue
            for at_once, at_use in placements:
                move = self.schedule(interval, tier, at_use, at_once)
                if move is None:
                    continue
                away = move.away(self.n)
                if sum(self.estimate.over_us(lo, hi) for lo, hi in away) <= 0.0:
                    continue
                move.benefit = interval.nbytes * self.benefit_window_us(move)
                return move
        return None

    def placements(self, interval: Interval) -> list[tuple[bool, bool]]:
        """(eviction at once, prefetch at the use) pairs to try, hidden moves first."""
        fetches = (False, True) if self.demand_fetch else (False,)
        by_drop = interval.wraps and not interval.updated  # a drop frees at once anyway
        evictions = (False, True) if self.demand_evict and not by_drop else (False,)
        return [(at_once, at_use) for at_once in evictions for at_use in fetches]

    def benefit_window_us(self, move: Move) -> float:
        """Over-budget time between the half-written and the half-read kernels."""
        iv = move.interval
        if iv.after is None:
            return self.estimate.over_us(0, self.n)
        if iv.wraps:
            return self.estimate.over_us(move.half_out, self.n) + self.estimate.over_us(0, move.half_in + 1)
        return self.estimate.over_us(move.half_out, move.half_in + 1)

    def advance(self, move: Move) -> Move | None:
        """Fallback: a chosen move whose transfers the link time placed so that the tensor
        is on the GPU in kernels now over budget: the same move with its eviction made at
        once and/or its prefetch started at the use, whichever covers the most over-budget
        time it did not; None if neither covers any (or the fallback is not on)."""
        iv = move.interval
        if iv.after is None:
            return None
        evict_at_once = self.demand_evict and move.evict_end > iv.after
        fetch_at_use = self.demand_fetch and move.fetch_start < iv.before - 1
        options = [(at_once, at_use) for at_once in (False, True) for at_use in (False, True)
                   if (at_once or at_use) and (evict_at_once or not at_once) and (fetch_at_use or not at_use)]
        if not options:
            return None
        was_away = self.away_mask(move)
        best = None
        self.links.give_back(move.evict_use)
        self.links.give_back(move.fetch_use)
        try:
            for at_once, at_use in options:
                new = self.reschedule(move, at_once, at_use)
                if new is None:
                    continue
                new.benefit = iv.nbytes * self.estimate.over_us_at(self.away_mask(new) & ~was_away)
                if new.benefit > 0 and (best is None or new.benefit > best.benefit):
                    best = new
        finally:
            self.links.take(move.evict_use)
            self.links.take(move.fetch_use)
        return best

    def reschedule(self, move: Move, at_once: bool, at_use: bool) -> Move | None:
        """``move`` with its eviction at once and/or its prefetch at the use, the other
        transfer kept (its link time given back by the caller)."""
        iv = move.interval
        if at_once:
            evicted = self.links.right_after(self.links.links("offload", move.tier), iv.after + 1,
                                             self.n + 1 if iv.wraps else iv.before,
                                             self.transfer_us("offload", move.tier, iv.nbytes))
            if evicted is None:
                return None
        else:
            evicted = (move.evict_end, move.half_out, move.evict_use)
        if at_use:
            fetch_from = 0 if iv.wraps else max(evicted[0], iv.after) + 2
            in_links = self.links.links("prefetch", move.tier)
            in_us = self.transfer_us("prefetch", move.tier, iv.nbytes)
            fetched = self._with(evicted[2], lambda: self.links.at_the_use(in_links, fetch_from, iv.before, in_us))
            if fetched is None:
                return None
        else:
            fetched = (move.fetch_start, move.half_in, move.fetch_use)
        return Move(iv, move.tier, evicted[0], fetched[0], evicted[2], fetched[2], 0.0,
                    half_out=evicted[1], half_in=fetched[1], replaces=move)

    def away_mask(self, move: Move) -> np.ndarray:
        mask = np.zeros(self.n, dtype=bool)
        for lo, hi in move.away(self.n):
            mask[lo:hi] = True
        return mask

    def commit(self, move: Move) -> None:
        iv = move.interval
        old = move.replaces
        if old is None:
            evict_start = 0 if iv.after is None else iv.after + 1
            self.space.hold(iv.tensor, move.tier, iv.nbytes, *self.held_range(iv, evict_start))
        else:  # an advance: undo the move it replaces (same tier, same space held)
            self.links.give_back(old.evict_use)
            self.links.give_back(old.fetch_use)
            for lo, hi in old.away(self.n):
                self.estimate.add(iv.nbytes, lo, hi)
            move.replaces = None
        self.taken[iv.order] = move
        self.links.take(move.evict_use)
        self.links.take(move.fetch_use)
        for lo, hi in move.away(self.n):
            self.estimate.remove(iv.nbytes, lo, hi)

    # -- eager prefetch

    def prefetch_earlier(self, move: Move, limit_bytes: float) -> None:
        """Start the prefetch earlier while the tensor fits under ``limit_bytes`` and its
        eviction has ended; its transfer then runs forward from the new start."""
        iv = move.interval
        if iv.after is None:
            return
        earliest = 0 if iv.wraps else max(move.evict_end + 1, iv.after + 2)
        if earliest >= move.fetch_start:
            return
        too_full = self.estimate.last_over(iv.nbytes, earliest, move.fetch_start, limit_bytes)
        start = earliest if too_full is None else too_full + 1
        if start == move.fetch_start:
            return
        links = move.fetch_use.links
        self.links.give_back(move.fetch_use)
        ran = self.links.forward(links, start, iv.before,
                                 self.transfer_us("prefetch", move.tier, iv.nbytes))
        self.estimate.add(iv.nbytes, start, move.fetch_start)
        move.fetch_start = start
        move.fetch_use = ran[2] if ran is not None else self.links.all_left(links, start, iv.before)
        self.links.take(move.fetch_use)


# ----------------------------------------------------------------------------- greedy


LAZY_TOLERANCE = 0.05   # a re-evaluated head within 5% of the best remaining benefit is taken


def choose_moves(state: G10State, intervals: list[Interval]) -> None:
    """The benefit-ordered greedy, evaluated lazily: benefits almost only fall as moves
    are taken, so a re-evaluated head that still beats the next entry is taken (one that
    rose, see the module docstring, is taken at its new value). The chosen
    moves are in ``state.taken``; an interval taken stays a candidate for its advance."""
    heap = []
    for interval in intervals:
        if not state.over_in_span(interval):
            continue   # no kernel it could free is over budget, and memory only falls in a round
        move = state.evaluate(interval)
        if move is not None and move.benefit > 0:
            heap.append(_key(move) + (interval,))
    heapq.heapify(heap)
    while heap:
        *_, interval = heapq.heappop(heap)
        move = state.evaluate(interval)
        if move is None or move.benefit <= 0:
            continue
        key = _key(move)
        if heap and key > heap[0][:3] and (LAZY_TOLERANCE == 0 or move.benefit < (1.0 - LAZY_TOLERANCE) * -heap[0][0]):
            heapq.heappush(heap, key + (interval,))
            continue
        state.commit(move)
        again = state.evaluate(interval)  # its advance, in the fallback rounds
        if again is not None and again.benefit > 0:
            heapq.heappush(heap, _key(again) + (interval,))


def _key(move: Move) -> tuple:
    iv = move.interval
    return (-move.benefit, -iv.nbytes * iv.length_us, iv.order)


def to_actions(profile, moves: list[Move], regens: tuple[Regen, ...] = ()) -> tuple[list, dict[str, str]]:
    """Plan actions in issue order (by the op they follow; drops and offloads first, then
    prefetches by the op that needs them), the recomputes of ``regens`` after them (by
    the op they serve, then their producer), and the initial placements."""
    ops = profile.ops
    keyed = [Step(r.after, DROP, r.before, -1, drop(r.tensor, ops[r.after].id))
             for r in regens]
    initial: dict[str, str] = {}
    for move in moves:
        iv = move.interval
        if iv.wraps:
            initial[iv.tensor] = move.tier
        if iv.after is None:
            continue
        fetch_after = move.fetch_start - 1
        evict = drop(iv.tensor, ops[iv.after].id) if move.evicts_by_drop() else \
            offload(iv.tensor, ops[iv.after].id, move.tier)
        keyed.append(Step(iv.after, phase_of(evict), iv.before, iv.order, evict))
        keyed.append(Step(fetch_after, PREFETCH, iv.before, iv.order,
                      prefetch(iv.tensor, ops[fetch_after].id if fetch_after >= 0 else None,
                               ops[iv.before].id, move.tier)))
    redo = [recompute(r.tensor, ops[r.before].id) for r in sorted(regens, key=lambda r: (r.before, r.producer))]
    return issue_order(keyed) + redo, initial


def spill_choice(state: G10State, moves: list[Move]) -> frozenset:
    """The tensors to send to the SSD first: where the moves, all in host memory, would
    hold more than it has (R19: from the eviction until the tensor dies), the tensors of
    the longest idle intervals the SSD rule allows, until what is left fits host memory at
    every kernel. Empty when the SSD is not in play or host memory holds every move."""
    if not state.use_ssd or not moves:
        return frozenset()
    n = state.n
    span: dict[str, list] = {}   # tensor -> [lo, hi, bytes, longest SSD interval, first order]
    for move in moves:
        iv = move.interval
        lo, hi = state.held_range(iv, 0 if iv.after is None else iv.after + 1)
        ssd_us = iv.length_us if "ssd" in state.rule_tiers(iv) else -1.0
        found = span.get(iv.tensor)
        if found is None:
            span[iv.tensor] = [lo, hi, iv.nbytes, ssd_us, iv.order]
        else:
            found[0], found[1] = min(found[0], lo), max(found[1], hi)
            found[3], found[4] = max(found[3], ssd_us), min(found[4], iv.order)
    over = held_per_op(n, [(lo, hi, nbytes) for lo, hi, nbytes, _, _ in span.values()]) - state.space.capacity["host"]
    if over.max() <= 0:
        return frozenset()
    eligible = [(tensor, found) for tensor, found in span.items()
                if found[3] >= 0 and found[1] > found[0] and over[found[0]:found[1]].max() > 0]
    total = sum(found[2] for _, found in eligible)
    share = min(1.0, float(over.max()) / total) if total else 0.0
    chosen = set()
    seen = taken = 0
    for tensor, (lo, hi, nbytes, _, _) in sorted(eligible, key=lambda kv: (kv[1][0], kv[1][4])):
        seen += nbytes
        if taken < share * seen:
            chosen.add(tensor)
            taken += nbytes
            over[lo:hi] -= nbytes
    for tensor, (lo, hi, nbytes, _, _) in sorted(eligible, key=lambda kv: (-kv[1][3], kv[1][4])):
        if over.max() <= 0:
            break
        if tensor not in chosen and over[lo:hi].max() > 0:
            chosen.add(tensor)
            over[lo:hi] -= nbytes
    return frozenset(chosen)


def g10_moves(profile, hardware, budget_bytes: int, rule_factor: float, eager_limit: float,
              use_ssd: bool, fallback: bool, spill: frozenset = frozenset(),
              regens: tuple[Regen, ...] = ()) -> tuple[list[Move], G10State]:
    """G10's greedy (and, with ``fallback``, its three fallback rounds), then eager prefetch.
    ``spill``: the tensors whose moves try the SSD first (``spill_choice``); ``regens``:
    the gaps recomputed instead of moved."""
    state = G10State(profile, hardware, budget_bytes, rule_factor, use_ssd, spill, regens)
    intervals = candidate_intervals(profile, state.starts, regens)
    choose_moves(state, intervals)
    state.over_after_rules = state.estimate.any_over()
    if fallback:
        # the tail only helps write-backs across the iteration boundary: every other
        # interval is where round 1 left it (its link time ends before the last kernel)
        write_backs = [iv for iv in intervals if iv.wraps and iv.updated]
        for widen, candidates in ((state.links.open_tail, write_backs), (state.allow_demand_fetch, intervals),
                                  (state.allow_demand_evict, intervals)):
            if not state.estimate.any_over():
                break
            widen()
            choose_moves(state, candidates)
    moves = list(state.taken.values())
    for move in sorted(moves, key=lambda m: (-1 if m.interval.before is None else m.interval.before,
                                             m.interval.wraps, m.interval.order)):
        state.prefetch_earlier(move, eager_limit * budget_bytes)
    return moves, state


def g10_draft(profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback,
              spill: frozenset = frozenset(), regens: tuple[Regen, ...] = ()) -> tuple[Draft, list[Move], G10State]:
    moves, state = g10_moves(profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback, spill,
                             regens)
    actions, initial = to_actions(profile, moves, regens)
    tiers = {tier: sum(1 for m in moves if m.tier == tier) for tier in ("ssd", "host")}
    notes = {"moves": len(moves), "moves_by_tier": tiers,
             "rules_alone_fit": not state.over_after_rules,
             "estimated_over_budget_us": state.estimate.over_us_at()}
    if spill:
        notes["spilled_tensors"] = len(spill)
    if regens:
        notes["recomputed"] = {"tensors": len(regens), "bytes": sum(r.nbytes for r in regens)}
    return Draft(actions=actions, initial=initial, notes=notes), moves, state


def better_by_simulation(sim, budget_bytes, drafts: list[Draft]) -> Draft:
    """The draft whose plan the simulator runs in the budget fastest (the first on ties)."""
    def rank(draft: Draft):
        result = score(sim, budget_bytes, draft.actions, draft.initial)
        return (not result.ok, result.iteration_us if result.ok else 0.0)
    return min(drafts, key=rank)


def g10_drafts(profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback,
               regens: tuple[Regen, ...] = ()) -> list[tuple[Draft, list[Move], G10State]]:
    """G10's draft (host memory first) and, when it spills to the SSD, the spread one."""
    first = g10_draft(profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback, regens=regens)
    spill = spill_choice(first[2], first[1]) if first[0].notes["moves_by_tier"]["ssd"] else frozenset()
    if not spill:
        return [first]
    return [first, g10_draft(profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback, spill,
                             regens)]


@register(
    "g10",
    "G10 (MICRO'23): benefit-ordered greedy over idle intervals, to host or SSD by the 2.5x rule "
    "(host memory first, spills to the SSD spread from the first eviction), "
    "with bandwidth-aware latest prefetch made eager under 99% memory.",
    params=(
        Param("ssd", True, "use the SSD tier (when the hardware has one)"),
        Param("rule_factor", 2.5, "an interval must be this many times a move's latency + transfer time",
              low=0.0, high=1e6),
        Param("eager_limit", 0.99, "move prefetches earlier while estimated memory stays below this x budget",
              low=0.0, high=1.0),
        Param("fallback", True, "if G10's rules leave memory over budget: tail write-backs, unhidden "
                                "prefetches and evictions"),
        Param("recompute", False, "where the link cannot move the tensors out in time (the SSD's when it "
                                  "spills there), recompute the cheapest instead (not in the paper)"),
    ),
    moves_persistent=True,
    recompute_param="recompute",
    paper="Zhang et al., G10: Enabling An Efficient Unified GPU Memory and Storage Architecture "
          "with Smart Tensor Migrations, MICRO 2023", family="swap",
)
def plan_g10(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, ssd=True, rule_factor=2.5, eager_limit=0.99,
             fallback=True, recompute=False):
    use_ssd = ssd and hardware.ssd is not None
    args = (profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback)
    drafts = g10_drafts(*args)
    if len(drafts) == 1 and not recompute:
        return drafts[0][0]
    sim = simulator_for(profile, hardware, options)
    best = better_by_simulation(sim, budget_bytes, [d[0] for d in reversed(drafts)])
    if recompute:
        _, moves, state = next(d for d in drafts if d[0] is best)
        best = recompute_spills(sim, budget_bytes, best, state, moves,
                                lambda regens: [d[0] for d in g10_drafts(*args, regens=regens)])
    return best
