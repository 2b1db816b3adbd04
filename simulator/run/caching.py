"""PyTorch's CUDA caching allocator as the simulator's GPU memory (R55).

A real PyTorch run does not run out of memory on live bytes: it runs out when its caching
allocator (c10/cuda/CUDACachingAllocator.cpp) cannot *reserve* what it needs. Freed
blocks stay cached in their segment, a segment is given back only when a reservation
fails, and a block never spans two segments, so the memory a run reserves is its live
bytes plus rounding plus fragmentation. ``simulate --allocator caching`` (and
``caching-expandable``, PyTorch's ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``)
runs a plan against a model of it and reports ``reserved_bytes`` (the peak of reserved
bytes) beside ``peak_bytes`` (the peak of live bytes).

``CachingAllocator`` is the allocator alone: ``malloc`` and ``free`` of an owner's block,
with a journal so that an item's allocations are made together or not at all
(``begin`` / ``commit`` / ``rollback``). ``CachingMemory`` is the engine's Memory around
it, as simulator/run/arena.py's ``ArenaMemory`` is for placements and first/best fit
(R50, R51). docs/simulation.md states the rule; the constants below are PyTorch's.
"""
from __future__ import annotations

from bisect import bisect_left, insort

from ..model.allocation import WORKSPACE, AllocationKeys, Request
from .resources import Memory

CACHING = "caching"
CACHING_EXPANDABLE = "caching-expandable"
CACHING_ALLOCATORS = (CACHING, CACHING_EXPANDABLE)

MiB = 1 << 20
MIN_BLOCK = 512              # kMinBlockSize: every request is rounded up to a multiple of it
SMALL_SIZE = 1 * MiB         # kSmallSize: the largest request the small pool serves
SMALL_SEGMENT = 2 * MiB      # kSmallBuffer: a small-pool segment (an expandable small segment's page)
LARGE_SEGMENT = 20 * MiB     # kLargeBuffer: a segment for a large request under 10 MiB (an expandable page)
MIN_LARGE_ALLOC = 10 * MiB   # kMinLargeAlloc: from here a request gets a segment of its own size ...
ROUND_LARGE = 2 * MiB        # kRoundLarge: ... rounded up to 2 MiB

SMALL, LARGE = "small", "large"
FREE = None                  # a block's state: free (cached), unmapped (expandable), or its owner's id
UNMAPPED = "<unmapped>"
ADDRESS_PAGES = 1 << 40      # an expandable segment's address space, in pages: unbounded in effect


def round_size(nbytes: int) -> int:
    """A request's size as the allocator sees it: up to a multiple of 512 B, at least 512."""
    return max(MIN_BLOCK, _up(nbytes, MIN_BLOCK))


def pool_of(size: int) -> str:
    """The pool a rounded request goes to: small up to 1 MiB, large above."""
    return SMALL if size <= SMALL_SIZE else LARGE


def segment_bytes(size: int) -> int:
    """The segment a rounded request reserves when no cached block fits it."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return _up(size, ROUND_LARGE)


def page_bytes(pool: str) -> int:
    """The unit an expandable segment of ``pool`` maps and unmaps."""
    return SMALL_SEGMENT if pool == SMALL else LARGE_SEGMENT


def _up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


class Segment:
    """One reserved segment (a cudaMalloc), or the expandable segment of a pool: blocks
    that tile [0, size), each free, held by an owner, or (expandable) unmapped. ``order``
    stands for its address (segments are ordered by when they were made)."""
    __slots__ = ("pool", "order", "size", "blocks", "ends")

    def __init__(self, pool: str, order: int, size: int):
        self.pool = pool
        self.order = order
        self.size = size
        self.blocks: dict[int, tuple[int, str | None]] = {}   # start -> (size, state)
        self.ends: dict[int, int] = {}                         # end -> start: a block's left neighbour


class CachingAllocator:
    """PyTorch's caching allocator on one stream, under a budget of reserved bytes (R55).

    ``malloc(owner, nbytes)`` gives the owner a block or says no (``short`` then says
    why: the rounded size, its pool, and the bytes a new segment or new pages would have
    reserved); ``free(owner)`` returns its block to the cache. ``reserved`` is what is
    reserved now, ``peak`` the most it has been. Every change between ``begin`` and
    ``commit`` is journaled, and ``rollback`` undoes it: an item whose second allocation
    does not fit leaves the allocator as it found it.
    """

    def __init__(self, budget: int, expandable: bool = False):
        self.budget = budget
        self.expandable = expandable
        self.segments: dict[int, Segment] = {}            # order -> segment
        self.free_blocks = {SMALL: [], LARGE: []}          # per pool, sorted (size, order, start) of free blocks
        self.held: dict[str, tuple[Segment, int]] = {}     # owner -> (segment, start) of its block
        self.reserved = 0
        self.peak = 0
        self.made = 0                                      # segments made: the next one's order
        self.journal: list | None = None
        self.short: dict = {}
        self.pool_segment: dict[str, Segment] = {}
        if expandable:        # one segment per pool, all of it unmapped until used
            for pool in (SMALL, LARGE):
                segment = self._new_segment(pool, page_bytes(pool) * ADDRESS_PAGES)
                self._put(segment, 0, segment.size, UNMAPPED)
                self.pool_segment[pool] = segment

    # ------------------------------------------------------------------ malloc and free

    def malloc(self, owner: str, nbytes: int) -> bool:
        """R55: best fit among the pool's free blocks; else a new segment (new pages when
        expandable) if the budget holds it; else every fully free segment (every free
        page) is released and that is tried once more. False when that fails too."""
        size = round_size(nbytes)
        pool = pool_of(size)
        spot = self._best_fit(pool, size)
        if spot is None:
            spot = self._grow(pool, size)
        if spot is None:
            self._release_cache()
            spot = self._grow(pool, size)
        if spot is None:
            return False
        self._take(spot, size, owner)
        return True

    def free(self, owner: str) -> None:
        """R55: the owner's block goes back to the cache, merged with the free blocks beside
        it in its segment (never with another segment's)."""
        spot = self.held.get(owner)
        if spot is None:
            return
        segment, start = spot
        size, _ = self._pop(segment, start)
        end = start + size
        before = segment.ends.get(start)
        if before is not None and segment.blocks[before][1] is FREE:
            size += self._pop(segment, before)[0]
            start = before
        after = segment.blocks.get(end)
        if after is not None and after[1] is FREE:
            size += self._pop(segment, end)[0]
        self._put(segment, start, size, FREE)

    def cached_bytes(self) -> int:
        """Bytes reserved and free (in cached blocks)."""
        return sum(size for index in self.free_blocks.values() for size, _, _ in index)

    def _best_fit(self, pool: str, size: int) -> tuple[Segment, int] | None:
        """The smallest free block of the pool that holds ``size``, the lowest on ties."""
        index = self.free_blocks[pool]
        i = bisect_left(index, (size,))
        if i == len(index):
            return None
        _, order, start = index[i]
        return self.segments[order], start

    def _take(self, spot: tuple[Segment, int], size: int, owner: str) -> None:
        """Hand the free block at ``spot`` to ``owner``, split when the rest is worth a
        block of its own: 512 B in the small pool (in both pools when expandable), more
        than 1 MiB in the large pool; otherwise the owner holds the whole block."""
        segment, start = spot
        have, _ = self._pop(segment, start)
        rest = have - size
        split = rest >= MIN_BLOCK if segment.pool == SMALL or self.expandable else rest > SMALL_SIZE
        if split:
            self._put(segment, start, size, owner)
            self._put(segment, start + size, rest, FREE)
        else:
            self._put(segment, start, have, owner)

    def _grow(self, pool: str, size: int) -> tuple[Segment, int] | None:
        """Reserve room for ``size``: a new segment, or pages of the expandable one."""
        if self.expandable:
            return self._map(pool, size)
        grow = segment_bytes(size)
        if self.reserved + grow > self.budget:
            self.short = {"size": size, "pool": pool, "grow_bytes": grow}
            return None
        segment = self._new_segment(pool, grow)
        self._reserve(grow)
        self._put(segment, 0, grow, FREE)
        return segment, 0

    def _map(self, pool: str, size: int) -> tuple[Segment, int] | None:
        """R55, expandable: the lowest unmapped range that, with the free block just before it
        and whatever free or unmapped blocks follow, holds ``size``; its pages are mapped
        as far as ``size`` needs (whole pages) and merged with the free blocks beside
        them into one free block, returned. None when the pages would pass the budget."""
        segment, page = self.pool_segment[pool], page_bytes(pool)
        blocks = segment.blocks
        for unmapped in sorted(s for s, (_, state) in blocks.items() if state is UNMAPPED):
            start = segment.ends.get(unmapped)
            if start is None or blocks[start][1] is not FREE:
                start = unmapped
            run, got, new, at = [], 0, 0, start
            while got < size and at in blocks:
                bsize, state = blocks[at]
                if state is not FREE and state is not UNMAPPED:
                    break
                take = bsize if state is FREE else min(bsize, _up(size - got, page))
                new += take if state is UNMAPPED else 0
                run.append((at, bsize, state, take))
                got += take
                at += bsize
            if got < size:
                continue
            if self.reserved + new > self.budget:
                self.short = {"size": size, "pool": pool, "grow_bytes": new}
                return None
            last, last_size, last_state, last_take = run[-1]
            tail = last_size - last_take          # what stays unmapped of the last range
            following = blocks.get(last + last_size)
            if last_state is UNMAPPED and not tail and following is not None and following[1] is FREE:
                run.append((last + last_size, following[0], FREE, following[0]))   # mapped pages merge with it
                got += following[0]
            for at, *_ in run:
                self._pop(segment, at)
            self._put(segment, start, got, FREE)
            if tail:
                self._put(segment, start + got, tail, UNMAPPED)
            self._reserve(new)
            return segment, start
        raise AssertionError("an expandable segment's address space is unbounded")

    def _release_cache(self) -> None:
        """R55: what PyTorch does before it gives up: every segment that is one free block is
        released (cudaFree); expandable, every whole page inside a free block is unmapped."""
        if not self.expandable:
            for segment in list(self.segments.values()):
                block = segment.blocks.get(0)
                if block is not None and block[0] == segment.size and block[1] is FREE:
                    self._pop(segment, 0)
                    self._drop_segment(segment)
                    self._reserve(-segment.size)
            return
        for segment in self.pool_segment.values():
            page = page_bytes(segment.pool)
            for start in sorted(s for s, (_, state) in segment.blocks.items() if state is FREE):
                size = segment.blocks[start][0]
                end = start + size
                lo, hi = _up(start, page), end // page * page
                if lo >= hi:
                    continue
                self._pop(segment, start)
                first, last = lo, hi            # the unmapped range, with unmapped neighbours
                if lo > start:
                    self._put(segment, start, lo - start, FREE)
                else:
                    before = segment.ends.get(start)
                    if before is not None and segment.blocks[before][1] is UNMAPPED:
                        self._pop(segment, before)
                        first = before
                if hi < end:
                    self._put(segment, hi, end - hi, FREE)
                else:
                    after = segment.blocks.get(end)
                    if after is not None and after[1] is UNMAPPED:
                        last = end + self._pop(segment, end)[0]
                self._put(segment, first, last - first, UNMAPPED)
                self._reserve(lo - hi)

    # ------------------------------------------------------------------ journaled changes

    def begin(self) -> None:
        """Start journaling: what follows can be undone by ``rollback``."""
        self.journal = []

    def commit(self) -> None:
        self.journal = None

    def rollback(self) -> None:
        """Undo every change since ``begin``."""
        journal, self.journal = self.journal or [], None
        for entry in reversed(journal):
            kind = entry[0]
            if kind == "put":
                self._pop(entry[1], entry[2])
            elif kind == "pop":
                self._put(*entry[1:])
            elif kind == "segment+":
                del self.segments[entry[1].order]
            elif kind == "segment-":
                self.segments[entry[1].order] = entry[1]
            elif kind == "reserve":
                self.reserved -= entry[1]
            else:
                self.peak = entry[1]

    def _log(self, *entry) -> None:
        if self.journal is not None:
            self.journal.append(entry)

    def _put(self, segment: Segment, start: int, size: int, state: str | None) -> None:
        segment.blocks[start] = (size, state)
        segment.ends[start + size] = start
        if state is FREE:
            insort(self.free_blocks[segment.pool], (size, segment.order, start))
        elif state is not UNMAPPED:
            self.held[state] = (segment, start)
        self._log("put", segment, start)

    def _pop(self, segment: Segment, start: int) -> tuple[int, str | None]:
        size, state = segment.blocks.pop(start)
        del segment.ends[start + size]
        if state is FREE:
            index = self.free_blocks[segment.pool]
            del index[bisect_left(index, (size, segment.order, start))]
        elif state is not UNMAPPED:
            del self.held[state]
        self._log("pop", segment, start, size, state)
        return size, state

    def _new_segment(self, pool: str, size: int) -> Segment:
        segment = Segment(pool, self.made, size)
        self.made += 1            # never taken back: orders only need to grow
        self.segments[segment.order] = segment
        self._log("segment+", segment)
        return segment

    def _drop_segment(self, segment: Segment) -> None:
        del self.segments[segment.order]
        self._log("segment-", segment)

    def _reserve(self, delta: int) -> None:
        self.reserved += delta
        self._log("reserve", delta)
        if self.reserved > self.peak:
            self._log("peak", self.peak)
            self.peak = self.reserved


class CachingMemory(Memory):
    """GPU memory held by PyTorch's caching allocator (R55). Live bytes are counted as
    by ``Memory`` (``used``, ``peak``: R4); what limits the run is what the allocator
    reserves, which must stay within the budget. The engine asks ``fits_item`` /
    ``fits_prefetch`` / ``fits_start`` before each allocation: a yes keeps the blocks
    taken (journaled) until the ``allocate`` that follows commits them; a no undoes them
    and ``blocked`` says why (R10's reason words it with ``describe_short``)."""

    def __init__(self, budget: int, nbytes: dict, keys: AllocationKeys, expandable: bool = False):
        super().__init__(budget, nbytes)
        self.keys = keys
        self.start_of = {request.owner: [request] for request in keys.start}
        self.allocator = CachingAllocator(budget, expandable)
        self.trying = False          # a try that fits, not yet committed by allocate
        self.blocked: dict | None = None

    def _try(self, requests: list[Request]) -> bool:
        """R55: make the item's allocations in order (its outputs, then its workspace), all
        or none: a 0-byte request takes nothing (PyTorch does not call the allocator)."""
        self._settle()
        allocator = self.allocator
        allocator.begin()
        for request in requests:
            if request.size and not allocator.malloc(request.owner, request.size):
                allocator.rollback()
                self.blocked = {"allocation": request.key, "reserved_bytes": allocator.reserved,
                                "live_bytes": self.used, "cached_bytes": allocator.cached_bytes(),
                                "rounded_bytes": allocator.short["size"], "pool": allocator.short["pool"],
                                "grow_bytes": allocator.short["grow_bytes"],
                                "expandable": allocator.expandable}
                return False
        self.trying = True
        self.blocked = None
        return True

    def _settle(self) -> None:
        """Undo a try that no ``allocate`` took (the engine always follows a yes with one)."""
        if self.trying:
            self.allocator.rollback()
            self.trying = False

    def fits_item(self, k: int, extra: int) -> bool:
        return self._try(self.keys.items.get(k, []))

    def fits_prefetch(self, transfers: list[int], extra: int) -> bool:
        return self._try([self.keys.transfers[j] for j in transfers])

    def fits_start(self, tid: str, extra: int) -> bool:
        return self._try(self.start_of.get(tid, []))

    def allocate(self, tensors, extra: int, now: int) -> None:
        self.allocator.commit()
        self.trying = False
        super().allocate(tensors, extra, now)

    def release(self, extra: int, now: int) -> None:
        self._settle()
        if extra:
            self.allocator.free(WORKSPACE)
        super().release(extra, now)

    def free(self, tid: str, now: int) -> None:
        self._settle()
        self.allocator.free(tid)
        super().free(tid, now)

    @property
    def reserved_peak(self) -> int:
        return self.allocator.peak


def describe_short(extra: dict, fragmented: bool) -> str:
    """R10's words for an allocation the caching allocator cannot serve (R55). Each
    number is followed by what cli_text's named_reason turns into MiB and GiB."""
    grow = "mapping more of its expandable segment" if extra["expandable"] else "a new segment"
    words = (f"; the caching allocator (R55): reserved {extra['reserved_bytes']} bytes, live "
             f"{extra['live_bytes']} bytes, cached free {extra['cached_bytes']} bytes; allocation "
             f"{extra['allocation']!r} ({extra['rounded_bytes']} bytes, {extra['pool']} pool) finds no free block "
             f"that holds it, and {grow} ({extra['grow_bytes']} bytes) would pass the budget, even with the cache "
             "released")
    if fragmented:
        words += "; fragmentation: the live bytes and the request fit the budget"
    return words
