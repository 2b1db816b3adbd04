"""Offline placement (R50): an offset for every GPU allocation of a plan's iteration, so that
a runtime can lay out one arena and never ask an allocator (``swapplan place``).

Lifetimes come from the simulated iteration of the plan under its budget
(``Simulator.allocation_log``, the engine's ``allocation_lifetimes``): each allocation
holds its bytes from the instant it is made to the instant it is freed (to the end of the
iteration for what is still held then: persistent tensors, which are placed first). A persistent tensor on the
GPU at the start must end the iteration where it started (R50: the next iteration finds it
there), so its first and last allocations are placed as one block (:func:`tied_keys`); its
allocations in between (a weight fetched again after an eviction) may go anywhere. Blocks
are then placed one by one, each at the lowest offset where it overlaps no placed block
that is alive at the same time (first fit in address), in an order that is the method:

- ``smartpool``: SmartPool's offline interval colouring (Zhang et al., arXiv 1903.06631):
  cross-iteration blocks (held at the iteration's end) first, then by size, largest
  first;
- ``greedy-size``: the arena planners of practice (TFLite's greedy by size): by size,
  largest first, then the longer lifetime first;
- ``first-fit``: in allocation order, as an online first-fit allocator that knew no more
  than the past would place them.

Departures from SmartPool: lifetimes are simulated, not measured on a first iteration;
sizes are not rounded (the placement is exact, byte for byte).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from simulator.api import PlanInvalid, Simulator
from simulator.errors import InputError
from simulator.hardware import Hardware
from simulator.plan import Placement, Plan, check_plan
from simulator.profile import Profile

METHODS = ("smartpool", "greedy-size", "first-fit")


def lowest_offset(size: int, busy: list[tuple[int, int]]) -> int:
    """The lowest offset where [offset, offset + size) overlaps no range in ``busy``."""
    ranges = np.array(sorted(busy), dtype=np.int64).reshape(-1, 2)
    return _lowest(size, ranges[:, 0], ranges[:, 1])


def _lowest(size: int, starts, ends) -> int:
    """``lowest_offset`` over ranges given as arrays sorted by start: the first range
    that starts at least ``size`` above the highest end below it leaves the gap (the
    order of ranges with the same start does not matter)."""
    if not len(starts):
        return 0
    below = np.maximum.accumulate(ends)          # the highest end up to each range
    below = np.concatenate(([0], below[:-1]))
    fits = np.flatnonzero(starts >= below + size)
    return int(below[fits[0]]) if fits.size else int(max(0, below[-1], ends[-1]))


def place_blocks(blocks: list[tuple[str, int, int, int, bool]], method: str,
                 tied: dict[str, str] | None = None) -> tuple[dict[str, int], int]:
    """Offsets for (key, size, start, end, cross-iteration) blocks alive in [start, end),
    and the arena they need. Keys that ``tied`` maps to the same name get one offset,
    free over all of their intervals (:func:`tied_keys`)."""
    tied = tied or {}
    units: dict[str, list] = {}      # one unit per tied group, one per other block
    for block in blocks:
        units.setdefault(tied.get(block[0], block[0]), []).append(block)

    def size(unit):
        return max(b[1] for b in unit)

    def first(unit):
        return min(b[2] for b in unit)

    def held(unit):
        return any(b[4] for b in unit)

    def span(unit):
        return sum(b[3] - b[2] for b in unit)

    if method == "smartpool":
        order = sorted(units.values(), key=lambda u: (not held(u), -size(u), first(u), u[0][0]))
    elif method == "greedy-size":
        order = sorted(units.values(), key=lambda u: (-size(u), -span(u), first(u), u[0][0]))
    elif method == "first-fit":
        order = sorted(units.values(), key=lambda u: (first(u), u[0][0]))
    else:
        raise InputError("<argument>", "--method", f"{method!r} is not one of {', '.join(METHODS)}")
    placed = _Placed(len(blocks))
    offsets: dict[str, int] = {}
    arena = 0
    for unit in order:
        offset = placed.lowest_free(size(unit), [(b[2], b[3]) for b in unit])
        for key, nbytes, start, end, _ in unit:
            offsets[key] = offset
            placed.add(start, end, offset, offset + nbytes)
            arena = max(arena, offset + nbytes)
    return offsets, arena


class _Placed:
    """Placed blocks as arrays of (start, end, offset, offset end), so that finding those
    alive during an interval is one vectorised comparison (llama2-70b's g10 plan: 14,291
    blocks placed in 1 s, where a scan in Python took 13 s)."""

    def __init__(self, capacity: int):
        self.rows = np.zeros((4, max(capacity, 1)), dtype=np.int64)
        self.count = 0

    def add(self, start: int, end: int, lo: int, hi: int) -> None:
        self.rows[:, self.count] = (start, end, lo, hi)
        self.count += 1

    def lowest_free(self, size: int, intervals) -> int:
        """The lowest offset free of every placed block alive at some instant of one of
        the [start, end) ``intervals`` (``lowest_offset``)."""
        start, end, lo, hi = self.rows[:, :self.count]
        mask = np.zeros(self.count, dtype=bool)
        for s, e in intervals:
            mask |= (start < e) & (s < end)
        lo, hi = lo[mask], hi[mask]
        order = np.argsort(lo, kind="stable")
        return _lowest(size, lo[order], hi[order])


def tied_keys(keys) -> dict[str, str]:
    """For R50's allocation keys (``simulator.model.allocation.allocation_keys``): each persistent
    tensor on the GPU at the start, its first and last allocations, mapped to the tensor
    (the next iteration must find it where this one started it); its allocations in
    between are free to go anywhere. Tying every allocation of a persistent tensor to
    one offset packs worse (g10's plans at 50% on a100-40gb-pcie4, smartpool, arena over
    the live peak: llama2-13b 1.064x against 1.041x, llama2-70b 1.632x against 1.346x)."""
    last: dict[str, str] = {}
    numbers: dict[str, int] = {}
    starts = {request.owner: request.key for request in keys.start}
    for request in keys.all():
        if request.owner in starts:
            number = int(request.key.rsplit("#", 1)[1])
            if number > numbers.get(request.owner, 0):
                numbers[request.owner], last[request.owner] = number, request.key
    return {key: owner for owner, first in starts.items() for key in {first, last[owner]}}


def lifetimes(sim: Simulator, plan: Plan, budget_bytes: int | None):
    """(Result, blocks, zero-byte keys, tied keys) of the plan's iteration on ``sim``'s
    profile and machine: each GPU allocation as (key, bytes, start ps, end ps, still held
    at the end); a zero-length one holds one ps. Zero-byte allocations take no room but
    need a key too; tied keys (:func:`tied_keys`) must share an offset."""
    if plan.splits:   # R54: the allocations are the chunks' and slices'
        sim, plan = sim.split(plan)
    profile = sim.profile
    bare = replace(plan, placement=None)
    check_plan(bare, profile, sim.machine.has_ssd, sim.machine.cpu is not None)
    budget = sim.budget(bare, budget_bytes)
    try:
        logged = sim.allocation_log(bare, budget)
    except PlanInvalid as exc:
        raise InputError(plan.origin, "plan", f"the plan is invalid ({exc.rule}: {exc.reason}); only a plan that "
                                              "runs has lifetimes to place") from None
    if logged is None:
        raise InputError(plan.origin, "memory", "a UVM plan has no placement: the driver places blocks (R33)")
    result, log, keys = logged
    end_of_iteration = max((entry[3] for entry in log), default=0) + 1
    blocks = []
    for key, _, size, start, end in log:
        held = end is None
        stop = end_of_iteration if held else max(end, start + 1)
        blocks.append((key, size, start, stop, held))
    zero = [request.key for request in keys.all() if request.size == 0]
    return result, blocks, zero, tied_keys(keys)


def place(profile: Profile, plan: Plan, hardware: Hardware, budget_bytes: int | None = None,
          method: str = "smartpool") -> tuple[Plan, dict]:
    """The plan with a ``placement`` by ``method``, and figures: arena bytes, the peak of
    live bytes, their ratio. InputError when the plan does not run (invalid or
    infeasible: there are no lifetimes to place)."""
    if method not in METHODS:
        raise InputError("<argument>", "--method", f"{method!r} is not one of {', '.join(METHODS)}")
    result, blocks, zero, tied = lifetimes(Simulator(profile, hardware), plan, budget_bytes)
    if not result.ok:
        raise InputError(plan.origin, "plan", f"the plan does not run ({result.reason}); only a plan that runs "
                                              "has lifetimes to place")
    offsets, arena = place_blocks(blocks, method, tied)
    for key in zero:
        offsets[key] = 0
    placed = replace(plan, placement=Placement(arena, dict(sorted(offsets.items()))))
    live = result.peak_bytes
    return placed, {"method": method, "arena_bytes": arena, "peak_live_bytes": live,
                    "arena_over_live": arena / live if live else 1.0, "allocations": len(offsets)}
