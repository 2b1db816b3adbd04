"""GPU memory as one fixed-size region and a first-fit allocator over it, with offsets.

Both backends place every tensor and workspace at an offset in one region: a numpy
buffer on the host backend, one device allocation of the budget's size on CUDA. The
simulator counts memory in bytes (R2: no fragmentation); a real region has holes, and
this allocator measures them: ``fragmentation`` is the peak extent (the highest end
offset ever in use) over the peak of live bytes, 1.0 when holes never mattered.

When a block fits the budget but no hole, the scheduler makes room, with real copies
inside the region on either backend, as a runtime that owns every placement can do:
``make_room`` empties the cheapest window of the size needed into the holes elsewhere;
when no window can be emptied, ``slide`` moves every block that no running kernel or
copy is using down, so the free space gathers at the top (and below blocks in use).
"""
from __future__ import annotations

from bisect import bisect_left, insort

ALIGN = 8   # every block starts and ends on a 64-bit word (the integrity patterns are words)


def align(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class Arena:
    """First fit over a sorted list of holes; freeing coalesces with both neighbours."""

    def __init__(self, size: int):
        self.size = size - size % ALIGN
        self.holes: list[tuple[int, int]] = [(0, self.size)] if self.size else []   # (offset, size), sorted
        self.blocks: dict[int, int] = {}     # offset -> size, of live blocks
        self.live = 0
        self.peak_live = 0
        self.peak_extent = 0

    def allocate(self, nbytes: int) -> int | None:
        """The offset of a new block of ``nbytes`` (rounded up to a word), or None when no
        hole is large enough."""
        size = align(nbytes)
        if size == 0:
            size = ALIGN
        for i, (offset, hole) in enumerate(self.holes):
            if hole >= size:
                if hole == size:
                    del self.holes[i]
                else:
                    self.holes[i] = (offset + size, hole - size)
                self.blocks[offset] = size
                self.live += size
                self.peak_live = max(self.peak_live, self.live)
                self.peak_extent = max(self.peak_extent, offset + size)
                return offset
        return None

    def free(self, offset: int) -> None:
        size = self.blocks.pop(offset)
        self.live -= size
        i = bisect_left(self.holes, (offset, 0))
        start, end = offset, offset + size
        if i < len(self.holes) and self.holes[i][0] == end:          # the hole after
            end += self.holes[i][1]
            del self.holes[i]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == start:   # the hole before
            start = self.holes[i - 1][0]
            del self.holes[i - 1]
        insort(self.holes, (start, end - start))

    def make_room(self, need: int, pinned: set[int]) -> list[tuple[int, int, int]] | None:
        """Open a hole of ``need`` bytes by moving as few bytes as it can: the window of
        ``need`` bytes (starting at 0 or at a block's end) that holds no pinned block
        (offsets of blocks a kernel or a copy is using) and the fewest bytes of other
        blocks is emptied into the holes outside it (largest block first, first fit).
        Returns the moves (old offset, new offset, size), none of which overlaps another,
        or None when no window can be emptied that way."""
        need = align(need)
        order = sorted(self.blocks)
        if need > self.size:
            return None
        sizes = [self.blocks[o] for o in order]
        movable_sum, pinned_count = [0], [0]
        for offset, size in zip(order, sizes):
            movable_sum.append(movable_sum[-1] + (0 if offset in pinned else size))
            pinned_count.append(pinned_count[-1] + (offset in pinned))
        candidates, lo, hi = [], 0, 0
        for start in sorted({0, self.size - need, *(o + s for o, s in zip(order, sizes))}):
            if start + need > self.size:
                continue
            while lo < len(order) and order[lo] + sizes[lo] <= start:
                lo += 1
            hi = max(hi, lo)
            while hi < len(order) and order[hi] < start + need:
                hi += 1
            if pinned_count[hi] - pinned_count[lo]:
                continue
            candidates.append((movable_sum[hi] - movable_sum[lo], start, lo, hi))
        for moved, start, lo, hi in sorted(candidates)[:16]:
            moves = self._evacuate(start, start + need, [(order[i], sizes[i]) for i in range(lo, hi)])
            if moves is not None:
                return moves
        return None

    def _evacuate(self, lo: int, hi: int, inside: list[tuple[int, int]]) -> list[tuple[int, int, int]] | None:
        """Move the blocks ``inside`` [lo, hi) into holes outside it; None if they do not fit."""
        holes = []
        for offset, size in self.holes:       # the holes' parts outside the window
            end = offset + size
            if offset < lo:
                holes.append([offset, min(end, lo)])
            if end > hi:
                holes.append([max(offset, hi), end])
        moves = []
        for old, size in sorted(inside, key=lambda b: -b[1]):
            for hole in holes:
                if hole[1] - hole[0] >= size:
                    moves.append((old, hole[0], size))
                    hole[0] += size
                    break
            else:
                return None
        self._apply(moves)
        return moves

    def slide(self, need: int, pinned: set[int]) -> list[tuple[int, int, int]] | None:
        """Move blocks down, never up, so that the free space gathers, moving as few as
        it takes: only the blocks above some address ``x`` move (``x`` from the highest
        hole down, the first that gives a hole of ``need`` bytes); in address order, each
        goes into the first gap left below a block that stays that it fits, else down to
        the lowest free address. Blocks in ``pinned`` stay. None (nothing moved) when no
        ``x`` gives the hole. Every move goes to a lower address and they are listed in
        the order of the blocks' old addresses, so doing them in that order never writes
        over a block still to move (a block may overlap its own old place: a memmove)."""
        need = align(need)
        order = sorted(self.blocks)
        for x in sorted({offset for offset, _ in self.holes}, reverse=True):
            moves, largest = self._slide_above(x, order, pinned)
            if largest >= need:
                self._apply(moves)
                return moves
        return None

    def _slide_above(self, x: int, order: list[int], pinned: set[int]) -> tuple[list[tuple[int, int, int]], int]:
        """The moves of ``slide`` from address ``x``, and the largest hole they leave."""
        moves, gaps, cursor = [], [], 0
        for offset in order:
            size = self.blocks[offset]
            if offset < x or offset in pinned:
                if offset > cursor:
                    gaps.append([cursor, offset])
                cursor = max(cursor, offset + size)
                continue
            gap = next((gap for gap in gaps if gap[1] - gap[0] >= size), None)
            if gap is not None:
                new = gap[0]
                gap[0] += size
            else:                   # cursor <= offset, and nothing that stays lies between them
                new = max(cursor, x)
                cursor = new + size
            if new != offset:
                moves.append((offset, new, size))
        largest = max([b - a for a, b in gaps] + [self.size - cursor])
        return moves, largest

    def _apply(self, moves: list[tuple[int, int, int]]) -> None:
        """Move blocks in the books and rebuild the holes."""
        blocks = dict(self.blocks)
        for old, _, _ in moves:
            del blocks[old]
        for _, new, size in moves:
            blocks[new] = size
        self.blocks = blocks
        self.holes, cursor = [], 0
        for offset in sorted(blocks):
            if offset > cursor:
                self.holes.append((cursor, offset - cursor))
            cursor = offset + blocks[offset]
        if cursor < self.size:
            self.holes.append((cursor, self.size - cursor))
        self.peak_extent = max(self.peak_extent, max((o + s for o, s in blocks.items()), default=0))

    def largest_hole(self) -> int:
        return max((size for _, size in self.holes), default=0)

    @property
    def free_bytes(self) -> int:
        return self.size - self.live

    @property
    def fragmentation(self) -> float:
        return self.peak_extent / self.peak_live if self.peak_live else 1.0
