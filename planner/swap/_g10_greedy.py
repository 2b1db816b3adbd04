"""G10's migration scheduling (planner/swap/g10.py, steps 2 and 5 and the fallback rounds):
the greedy's state (``G10State``: the memory estimate, the link time and tier space left,
the moves taken), placing one interval's eviction and prefetch (``schedule``), its benefit
(``evaluate``), an advance of a move already taken (``advance``), the eager prefetch
(``prefetch_earlier``), and the lazily evaluated benefit-ordered greedy (``choose_moves``).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from simulator.model.links import link_speed

from ..shared.estimate import MemoryEstimate
from ..shared.facts import op_start_us
from ..shared.regen import Regen
from ._g10_intervals import Interval, move_speeds, rule_tiers
from ._g10_links import LinkTime, Reservation, TierSpace


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
