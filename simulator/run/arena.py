"""GPU memory as address ranges (R50, R51): a plan's placement, or an online allocator.

By default the simulator counts bytes (R4). A plan with ``placement`` gives every GPU
allocation of the iteration a fixed offset in an arena of ``arena_bytes``; an allocation
waits until its range is free. Without one, ``--allocator first-fit|best-fit`` models an
online allocator over an arena of the budget's size (sizes rounded up to 512 bytes, freed
ranges merged with their free neighbours), where an allocation that finds no free range
though enough bytes are free waits, fragmented.

An allocation is named by a key (simulator/model/allocation.py's ``allocation_keys``
derives them from a compiled program, statically); ``ArenaMemory`` is the engine's Memory
with ranges, ``Ranges`` the busy ranges of the arena it searches.
"""
from __future__ import annotations

from bisect import bisect_left, insort

from ..model.allocation import WORKSPACE, AllocationKeys, Request
from ..plan import Placement
from .resources import Memory

ALIGN = 512                 # R51: online allocators round sizes up to this
ALLOCATORS = ("first-fit", "best-fit")


class Ranges:
    """Disjoint busy ranges [start, end) of an arena, each with its owner."""

    def __init__(self, size: int):
        self.size = size
        self.starts: list[int] = []        # sorted
        self.spans: dict[int, tuple[int, str]] = {}   # start -> (end, owner)
        self.of: dict[str, int] = {}       # owner -> start
        self.extent = 0                    # the highest end ever taken

    def holder(self, start: int, end: int) -> str | None:
        """The owner of a busy range overlapping [start, end), or None."""
        i = bisect_left(self.starts, end)
        if i and self.spans[self.starts[i - 1]][0] > start:
            return self.spans[self.starts[i - 1]][1]
        return None

    def take(self, owner: str, start: int, end: int) -> None:
        insort(self.starts, start)
        self.spans[start] = (end, owner)
        self.of[owner] = start
        self.extent = max(self.extent, end)

    def release(self, owner: str) -> None:
        start = self.of.pop(owner, None)
        if start is not None:
            del self.spans[start]
            del self.starts[bisect_left(self.starts, start)]

    def gaps(self):
        """The free ranges (start, end), in address order."""
        at = 0
        for start in self.starts:
            if start > at:
                yield at, start
            at = self.spans[start][0]
        if at < self.size:
            yield at, self.size

    def find(self, size: int, policy: str) -> int | None:
        """R51: the offset an online allocator gives ``size`` bytes: the lowest free range
        that holds it (first-fit) or the smallest, lowest on ties (best-fit)."""
        best = None
        for start, end in self.gaps():
            room = end - start
            if room >= size:
                if policy == "first-fit":
                    return start
                if best is None or room < best[0]:
                    best = (room, start)
        return None if best is None else best[1]


class ArenaMemory(Memory):
    """GPU memory with address ranges: ``placement`` (offsets by key, R50) or an online
    ``allocator`` (R51) over ``arena_bytes``. The engine asks ``fits_item`` /
    ``fits_prefetch`` / ``fits_start`` before each allocation; a yes keeps the ranges
    chosen, and the ``allocate`` that follows takes them. ``blocked`` says why the last
    no was a no (the allocation, and who holds its range or that the arena is
    fragmented)."""

    def __init__(self, budget: int, nbytes: dict, keys: AllocationKeys, arena_bytes: int,
                 placement: Placement | None = None, allocator: str | None = None):
        super().__init__(budget, nbytes)
        self.keys = keys
        self.start_of = {request.owner: [request] for request in keys.start}
        self.placement = placement
        self.allocator = allocator
        self.ranges = Ranges(arena_bytes)
        self.pending: list[tuple[str, str, int, int, int]] = []   # owner, key, range, bytes asked
        self.blocked: dict | None = None
        self.log: list[list] = []               # [key, owner, size, start ps, end ps or None], in order
        self.open: dict[str, list] = {}         # owner -> its entry in the log while it holds a range

    def _place(self, requests: list[Request], extra_bytes: int) -> bool:
        self.pending = []
        if not self.fits(extra_bytes):
            self.blocked = None
            return False
        chosen: list[tuple[str, str, int, int, int]] = []
        for request in requests:
            if not request.size:
                continue
            if self.placement is not None:
                start = self.placement.offsets[request.key]
                end = start + request.size
                holder = self.ranges.holder(start, end) or next(
                    (owner for owner, _, s, e, _ in chosen if s < end and start < e), None)
                if holder is not None:
                    self.blocked = {"allocation": request.key, "range": [start, end], "held_by": holder}
                    return False
            else:
                size = -(-request.size // ALIGN) * ALIGN
                for owner, _, s, e, _ in chosen:  # ranges this item takes already: in the arena for the search
                    self.ranges.take(owner, s, e)
                start = self.ranges.find(size, self.allocator)
                for owner, *_ in chosen:
                    self.ranges.release(owner)
                if start is None:
                    self.blocked = {"allocation": request.key, "fragmented": True}
                    return False
                end = start + size
            chosen.append((request.owner, request.key, start, end, request.size))
        self.pending = chosen
        self.blocked = None
        return True

    def fits_item(self, k: int, nbytes: int) -> bool:
        return self._place(self.keys.items.get(k, []), nbytes)

    def fits_prefetch(self, transfers: list[int], nbytes: int) -> bool:
        return self._place([self.keys.transfers[j] for j in transfers], nbytes)

    def fits_start(self, tid: str, nbytes: int) -> bool:
        return self._place(self.start_of.get(tid, []), nbytes)

    def allocate(self, tensors, extra: int, now: int) -> None:
        for owner, key, start, end, size in self.pending:
            self.ranges.take(owner, start, end)
            entry = [key, owner, size, now, None]     # the bytes asked: R51's rounding is the allocator's
            self.log.append(entry)
            self.open[owner] = entry
        self.pending = []
        super().allocate(tensors, extra, now)

    def release(self, extra: int, now: int) -> None:
        if extra:
            self._release(WORKSPACE, now)
        super().release(extra, now)

    def free(self, tid: str, now: int) -> None:
        self._release(tid, now)
        super().free(tid, now)

    def _release(self, owner: str, now: int) -> None:
        self.ranges.release(owner)
        entry = self.open.pop(owner, None)
        if entry is not None:
            entry[4] = now

    @property
    def arena_bytes(self) -> int:
        """The arena a runtime needs: the placement's, or the highest end the allocator used."""
        return self.placement.arena_bytes if self.placement is not None else self.ranges.extent
