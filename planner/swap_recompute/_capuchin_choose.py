"""Capuchin's choices (planner/swap_recompute/capuchin.py, steps 4 and 5): what a swap or a
recompute of an access pair would cost with the queues and the estimate as they stand
(options: ``_swap_option`` per tier, ``_recompute_option`` with its chain), taking one
(``_take_swap``, ``_take_recompute``), and the two phases: hidden swaps by free time
(``swap_phase``), then the best bytes per second of the cheaper method, lazily re-scored
(``hybrid_phase``).
"""
from __future__ import annotations

import heapq
import math
from bisect import bisect_left

import numpy as np

from simulator.model.recompute import recompute_problem, recompute_scratch

from ..shared.copy_queue import Copy, queue_stall
from ._capuchin_state import (HOST, IN, OUT, RECOMPUTE, SWAP, Eviction, RecomputeOption, State, SwapOption,
                              resident_intervals)

_MAX_CHAIN = 32          # recursion guard for recompute chains (sources strictly earlier)
_REBUILDS = 3            # phase 2 restarts when the estimate rose after a choice
UNSURE = 2.0            # a swap and a recompute whose estimated costs are within this factor: unsure


# ----------------------------------------------------------------------------- options


def _swap_option(state: State, tid: str, e: int, c: int, hidden_only: bool) -> SwapOption | None:
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


def _tier_option(state: State, tid: str, e: int, c: int, tier: str, reuse: bool,
                 hidden_only: bool) -> SwapOption | None:
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
    return SwapOption(free_from, trigger, stall_out + stall_in, reuse, out_end, tier)


def _recompute_option(state: State, tid: str, e: int, c: int) -> RecomputeOption | None:
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
    return RecomputeOption(cost, chain, reads)


def _recompute_delta(state: State, tid: str, e: int, c: int, chain: dict, reads: list[str]) -> np.ndarray:
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
        for a, b in resident_intervals(points, state.op_access[x], freed):
            delta[a:b + 1] += nbytes
    return delta


def _regenerable(state: State, tid: str, c: int, chain: dict, reads: list, depth: int) -> bool:
    """R15 for a recompute of ``tid`` just before op c, collecting what its sources need
    (``chain``: "dead" or "split" sources are recomputed first, "retarget" ones are
    swapped out across c and get their prefetch's back-access moved to c) and the
    resident sources it reads (``reads``)."""
    profile = state.profile
    if depth > _MAX_CHAIN or recompute_problem(profile, tid, c) is not None:
        return False
    made_by = profile.producer[tid]
    op = profile.ops[made_by]
    for src in dict.fromkeys(op.inputs):   # R15 refused a source updated in place since made_by
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


def _earlier_prefetch_stall(state: State, src: str, c: int) -> float:
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


def _recompute_fits(state: State, tid: str, c: int, chain: dict, reads: list[str]) -> bool:
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


def _take_swap(state: State, tid: str, e: int, c: int, option: SwapOption) -> None:
    ev = Eviction(tid, e, c, SWAP, option.free_from, option.trigger, option.trigger, option.reuse_copy,
                   option.tier)
    starts = state.starts
    if not option.reuse_copy:
        ev.out_key = (e, 1, state.next_seq())
        state.add_copy(ev.tier, OUT, Copy(ev.out_key, starts[e + 1], state.swap_us(tid, state.speed[(ev.tier, OUT)]),
                                           starts[option.free_from]), state.tensors[tid].bytes)
        state.hold(ev.tier, tid, e)
    ev.out_end_us = option.out_end_us
    queue_prefetch(state, ev)
    state.add_eviction(ev)
    state.refresh(tid)
    state.version += 1


def queue_prefetch(state: State, ev: Eviction) -> None:
    """Put the eviction's prefetch in its tier's queue (issued after its trigger, and not
    before its source copy is written), due at its back-access."""
    ev.in_key = (ev.trigger, 2, state.next_seq())
    issued = max(state.starts[ev.trigger + 1], ev.out_end_us)
    state.add_copy(ev.tier, IN, Copy(ev.in_key, issued, state.swap_us(ev.tensor, state.speed[(ev.tier, IN)]),
                                      state.starts[ev.before]), state.tensors[ev.tensor].bytes)


def _take_recompute(state: State, tid: str, e: int, c: int, option: RecomputeOption) -> None:
    state.add_eviction(Eviction(tid, e, c, RECOMPUTE, e + 1, c - 1))
    touched = [tid]
    for src in option.reads:
        state.add_access(src, c)
        touched.append(src)
    for src, how in option.chain.items():
        status, pair = state.residency_at(src, c)
        if how == "dead":
            a = state.accesses[src][-1]
            state.add_access(src, c)
            state.add_eviction(Eviction(src, a, c, RECOMPUTE, a + 1, c - 1))
        elif how == "split":
            a, b = pair
            del state.evictions[src][(a, b)]
            state.add_access(src, c)
            state.add_eviction(Eviction(src, a, c, RECOMPUTE, a + 1, c - 1))
            state.add_eviction(Eviction(src, c, b, RECOMPUTE, c + 1, b - 1))
        else:
            _retarget_swap(state, src, pair, c)
        touched.append(src)
    # new gaps of a chain source are evicted already: they are not candidates
    state.new_gaps = [g for g in state.new_gaps if state.is_gap(*g)]
    for src in touched:
        state.refresh(src)
    state.version += 1


def _retarget_swap(state: State, src: str, pair: tuple[int, int], c: int) -> None:
    """A swap of ``src`` across (a, b) becomes one across (a, c): its prefetch is issued
    before c (the trigger moves to c - 1 if it was later) and is waited for by op c; the
    tensor then stays resident from c to b."""
    ev = state.evictions[src].pop(pair)
    state.remove_copy(ev.tier, IN, ev.in_key)
    ev.before = c
    if ev.trigger >= c:
        ev.trigger = ev.free_to = c - 1
    queue_prefetch(state, ev)
    state.add_access(src, c)
    state.add_eviction(ev)


def free_time(state: State, tid: str, e: int, c: int) -> float:
    """FT = SwapInStart - SwapOutEnd on the ideal timeline (no queueing)."""
    out_end = state.starts[e + 1] + state.swap_us(tid, state.out_speed)
    in_start = state.starts[c] - state.swap_us(tid, state.in_speed)
    return in_start - out_end


def swap_phase(state: State) -> None:
    """Phase 1: swaps whose copies are fully hidden, in order of FreeTime."""
    pairs = [(tid, a, b) for tid in sorted(state.accesses) for a, b in state.gaps(tid)]
    pairs.sort(key=lambda g: (-free_time(state, *g), -state.tensors[g[0]].bytes, g[0], g[1]))
    for tid, e, c in pairs:
        if not state.estimate.any_over():
            return
        if free_time(state, tid, e, c) < 0:
            return  # sorted: no later pair can be hidden either
        option = _swap_option(state, tid, e, c, hidden_only=True)
        if option is not None:
            _take_swap(state, tid, e, c, option)


def _best_option(state: State, tid: str, e: int, c: int):
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


def hybrid_phase(state: State) -> None:
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
