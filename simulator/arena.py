"""GPU memory as address ranges (R50, R51): a plan's placement, or an online allocator.

By default the simulator counts bytes (R4). A plan with ``placement`` gives every GPU
allocation of the iteration a fixed offset in an arena of ``arena_bytes``; an allocation
waits until its range is free. Without one, ``--allocator first-fit|best-fit`` models an
online allocator over an arena of the budget's size (sizes rounded up to 512 bytes, freed
ranges merged with their free neighbours), where an allocation that finds no free range
though enough bytes are free waits, fragmented.

An allocation is named by a key: ``tensor#k`` (the k-th GPU allocation of that tensor in
the iteration, k from 1: production, prefetch, recompute, decode; a persistent tensor on
the GPU at the start counts that as its first), ``ws:op`` (an op's workspace) and
``codec:tensor#k`` (an encoded buffer, R41 R42). ``allocation_keys`` derives them from a
compiled program, statically; ``ArenaMemory`` is the engine's Memory with ranges.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

from .resources import Memory

ALIGN = 512                 # R51: online allocators round sizes up to this
ALLOCATORS = ("first-fit", "best-fit")
WORKSPACE = "<workspace>"   # the owner of the running item's workspace (one item runs at a time)


@dataclass(frozen=True)
class Placement:
    """A plan's ``placement`` (R50): the arena's size and an offset per allocation key."""
    arena_bytes: int
    offsets: dict

    def to_dict(self) -> dict:
        return {"arena_bytes": self.arena_bytes, "offsets": dict(sorted(self.offsets.items()))}


@dataclass(frozen=True)
class Request:
    """One allocation: the owner whose free releases it (a tensor id, an encoded buffer's
    id, or WORKSPACE), its key (R50) and its size in bytes."""
    owner: str
    key: str
    size: int


@dataclass
class AllocationKeys:
    """Every GPU allocation of one program's iteration, by where it happens: at the
    start (persistent tensors), at compute item k, at the start of prefetch j."""
    start: list[Request]
    items: dict[int, list[Request]]
    transfers: dict[int, Request]

    def all(self) -> list[Request]:
        out = list(self.start)
        for k in sorted(self.items):
            out.extend(self.items[k])
        out.extend(self.transfers.values())
        return out


def _buffer_key(owner: str) -> str:
    """``codec:<codec>:<tensor>`` (the engine's buffer id) -> ``codec:<tensor>``."""
    return "codec:" + owner.split(":", 2)[2]


def allocation_keys(program, compiled) -> AllocationKeys:
    """R50's keys for a compiled (explicit-mode) program. A tensor's allocations are
    counted in the order the plan makes them (its production, recomputes and decodes at
    their items, a prefetch at the item that issues it): a tensor is re-allocated only
    after it left the GPU, so this is the order they happen in, whatever the timing."""
    seq, nbytes = program.seq, compiled.tensor_bytes
    buffers = program.buffer_bytes or {}
    count: dict[str, int] = {}

    def key(owner: str) -> str:
        name = _buffer_key(owner) if owner in buffers else owner
        count[name] = count.get(name, 0) + 1
        return f"{name}#{count[name]}"

    def size(owner: str) -> int:
        return buffers[owner] if owner in buffers else nbytes[owner]

    start = [Request(tid, key(tid), nbytes[tid]) for tid in compiled.persistent_ids
             if tid not in program.initial_copies]
    transfers_of = program.transfers

    def prefetches(actions) -> list:
        """The prefetches among ``actions``, a group's members after its lead (R53)."""
        out = []
        for action in actions:
            if getattr(action, "kind", None) == "prefetch":
                out.append(action)
                out.extend(transfers_of[m] for m in action.members)
        return out

    issued: dict[int, list] = {k: prefetches(actions) for k, actions in program.actions.items()}
    issued[-1] = prefetches(program.start_actions)
    items: dict[int, list[Request]] = {}
    transfers: dict[int, Request] = {}
    for transfer in issued[-1]:
        owner = transfer.buffer or transfer.tensor
        transfers[transfer.index] = Request(owner, key(owner), size(owner))
    op_ids = compiled.op_ids
    for k in range(len(seq)):
        if k in program.on_cpu:
            continue
        requests = [Request(owner, key(owner), size(owner)) for owner in seq.allocs[k]]
        if seq.workspace[k]:
            requests.append(Request(WORKSPACE, f"ws:{op_ids[seq.op_index[k]]}", seq.workspace[k]))
        if requests:
            items[k] = requests
        for transfer in issued.get(k, ()):
            owner = transfer.buffer or transfer.tensor
            transfers[transfer.index] = Request(owner, key(owner), size(owner))
    return AllocationKeys(start, items, transfers)


def placement_problem(keys: AllocationKeys, placement: Placement, persistent: frozenset) -> tuple[str, str] | None:
    """(key, reason) when a placement does not cover the iteration (R50): a key with no
    offset, a range past the arena, an offset for no allocation, or a persistent tensor
    that does not end where it started (steady state, R20). None when it does."""
    offsets = placement.offsets
    seen: set[str] = set()
    last: dict[str, int] = {}
    for request in keys.all():
        seen.add(request.key)
        if request.key not in offsets:
            return request.key, f"no offset for allocation {request.key!r} ({request.size} bytes)"
        offset = offsets[request.key]
        if offset + request.size > placement.arena_bytes:
            return request.key, (f"allocation {request.key!r} at [{offset}, {offset + request.size}) passes the "
                                 f"arena's {placement.arena_bytes} bytes")
        if request.owner in persistent:
            last[request.owner] = offset
    for key in offsets:
        if key not in seen:
            return key, f"offset for {key!r}, which names no GPU allocation of this plan's iteration"
    for request in keys.start:
        if last.get(request.owner, offsets[request.key]) != offsets[request.key]:
            return request.key, (f"persistent tensor {request.owner!r} starts at offset {offsets[request.key]} but "
                                 f"its last allocation is at {last[request.owner]}: the next iteration would not "
                                 "find it where it starts")
    return None


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
        self.pending: list[tuple[str, str, int, int]] = []
        self.blocked: dict | None = None
        self.log: list[list] = []               # [key, owner, size, start ps, end ps or None], in order
        self.open: dict[str, list] = {}         # owner -> its entry in the log while it holds a range

    def _place(self, requests: list[Request], extra_bytes: int) -> bool:
        self.pending = []
        if not self.fits(extra_bytes):
            self.blocked = None
            return False
        chosen: list[tuple[str, str, int, int]] = []
        for request in requests:
            if not request.size:
                continue
            if self.placement is not None:
                start = self.placement.offsets[request.key]
                end = start + request.size
                holder = self.ranges.holder(start, end) or next(
                    (owner for owner, _, s, e in chosen if s < end and start < e), None)
                if holder is not None:
                    self.blocked = {"allocation": request.key, "range": [start, end], "held_by": holder}
                    return False
            else:
                size = -(-request.size // ALIGN) * ALIGN
                for owner, _, s, e in chosen:     # ranges this item takes already: in the arena for the search
                    self.ranges.take(owner, s, e)
                start = self.ranges.find(size, self.allocator)
                for owner, *_ in chosen:
                    self.ranges.release(owner)
                if start is None:
                    self.blocked = {"allocation": request.key, "fragmented": True}
                    return False
                end = start + size
            chosen.append((request.owner, request.key, start, end))
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
        for owner, key, start, end in self.pending:
            self.ranges.take(owner, start, end)
            entry = [key, owner, end - start, now, None]
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
