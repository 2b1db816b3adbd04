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

A plan with a ``placement`` (R50) is laid out by it instead (``PlacedArena``): every
block at the offset the plan gives it, in a region mapped from the placement's arena,
and never moved.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from fractions import Fraction

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


class PlacedArena:
    """The region laid out by a plan's placement (R50): each allocation key at its planned
    offset, mapped into the scaled region by ``map``; nothing is ever moved (there is no
    compaction), and an allocation whose planned range is still held waits.

    Ranges are checked in the placement's own bytes (the profile's), as the simulator
    checks them: an allocation of ``n`` bytes at offset ``o`` holds [o, o + n) and finds it
    free or names who holds it. Zero-byte allocations hold no range (as in the
    simulator), but the executor gives every block a word to check: each zero-byte key
    gets a word of its own past the mapped arena.

    The scaled region. ``map(x) = align(ceil(x * s)) + ALIGN * rank(x)``, where ``s`` is
    the size scale (as an exact fraction) and ``rank(x)`` the number of distinct
    placement offsets strictly below ``x``. It is monotone, so ranges disjoint in the
    placement are disjoint in the region; and a block [o, o + n), n > 0, that starts at
    an offset ``o`` of the placement gets at least its scaled size: with a = o * s,
    b = n * s and A, B, C the ceilings of a, b and a + b, C >= A + B - 1 (ceil(a + b) -
    ceil(a) >= ceil(b) - 1); align(C) - align(A) >= C - (A + ALIGN - 1) >= B - ALIGN, a
    multiple of ALIGN, and rank(o + n) >= rank(o) + 1 (``o`` itself is an offset below
    o + n), so map(o + n) - map(o) >= align(C) - align(A) + ALIGN >= B, hence >=
    align(B) (a multiple of ALIGN at least B). The block's scaled size,
    ``max(ALIGN, align(ceil(n * size_scale)))`` in floating point, is at most align(B):
    B >= 1, and rounding a product to a float never crosses an integer (integers below
    2**53 are floats). So [map(o), map(o) + scaled size) lies inside [map(o), map(o + n)),
    and inside [0, map(arena_bytes)) when o + n <= arena_bytes.
    """

    def __init__(self, placement, size_scale: float, zero_keys=()):
        self.placement = placement
        self.offsets = placement.offsets
        self.arena_bytes = placement.arena_bytes
        self.scale = Fraction(size_scale)
        self.points = sorted(set(self.offsets.values()))
        mapped = self.map(self.arena_bytes)
        self.zero_slot = {key: mapped + ALIGN * i for i, key in enumerate(sorted(set(zero_keys)))}
        self.size = mapped + ALIGN * len(self.zero_slot)   # the scaled region
        self.starts: list[int] = []                  # held ranges' starts (placement bytes), sorted
        self.held: dict[int, tuple[int, str, str]] = {}   # start -> (end, key, owner)
        self.at: dict[int, tuple[str, int | None, int]] = {}   # region offset -> (key, placement offset, bytes)
        self.blocks: dict[int, int] = {}             # region offset -> scaled size, of live blocks
        self.blocked: dict[str, dict] = {}           # key -> why its last try waited (held_by), until it is taken
        self.live = 0                                # placement bytes held
        self.peak_live = 0
        self.peak_extent = 0                         # the highest end (placement bytes) ever held

    def map(self, x: int) -> int:
        """Offset ``x`` of the placement's arena -> offset in the scaled region."""
        scale = self.scale
        return align(-(-x * scale.numerator // scale.denominator)) + ALIGN * bisect_left(self.points, x)

    def holder(self, start: int, end: int) -> tuple[str, str] | None:
        """(key, owner) of a held range overlapping [start, end), or None. Held ranges are
        disjoint, so only the last one starting below ``end`` can overlap."""
        i = bisect_left(self.starts, end)
        if i:
            stop, key, owner = self.held[self.starts[i - 1]]
            if stop > start:
                return key, owner
        return None

    def take(self, key: str, owner: str, nbytes: int, size: int) -> int | None:
        """The region offset of allocation ``key`` (``nbytes`` of the profile, ``size``
        scaled bytes) of ``owner`` (a tensor, '' for a workspace), or None when its planned
        range is held (``blocked[key]`` says by whom). The key has an offset (checked
        before the replay starts)."""
        if nbytes == 0:
            offset, start = self.zero_slot[key], None
        else:
            start = self.offsets[key]
            end = start + nbytes
            holder = self.holder(start, end)
            if holder is not None:
                self.blocked[key] = {"allocation": key, "range": [start, end], "held_by": holder[0],
                                     "owner": holder[1]}
                return None
            offset = self.map(start)
            if offset + size > self.map(end):        # cannot happen (see the class docstring)
                raise AssertionError(f"{key}: {size} scaled bytes at {offset} pass map({end}) = {self.map(end)}")
            insort(self.starts, start)
            self.held[start] = (end, key, owner)
            self.live += nbytes
            self.peak_live = max(self.peak_live, self.live)
            self.peak_extent = max(self.peak_extent, end)
        self.blocked.pop(key, None)
        self.blocks[offset] = size
        self.at[offset] = (key, start, nbytes)
        return offset

    def free(self, offset: int) -> None:
        del self.blocks[offset]
        _, start, nbytes = self.at.pop(offset)
        if start is not None:
            del self.held[start]
            del self.starts[bisect_left(self.starts, start)]
            self.live -= nbytes

    def key_at(self, offset: int) -> str:
        return self.at[offset][0]
