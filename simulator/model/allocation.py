"""Allocation keys and placements (R50), decided from a compiled program alone.

Every GPU allocation of the iteration is named by a key: ``tensor#k`` (the k-th GPU
allocation of that tensor in the iteration, k from 1: production, prefetch, recompute,
decode; a persistent tensor on the GPU at the start counts that as its first), ``ws:op``
(an op's workspace) and ``codec:tensor#k`` (an encoded buffer, R41 R42).
``allocation_keys`` derives them statically; ``placement_problem`` checks a plan's
``placement`` against them before anything runs. The arena in time (ranges taken and
freed, online allocators) is simulator/run/arena.py.
"""
from __future__ import annotations

from dataclasses import dataclass

WORKSPACE = "<workspace>"   # the owner of the running item's workspace (one item runs at a time)


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
    """R50's keys for a compiled (explicit-mode) program (simulator/compile/program.py's
    ``Program`` on its ``CompiledProfile``: read, never imported, so the floor stays below
    the engine). A tensor's allocations are counted in the order the plan makes them (its
    production, recomputes and decodes at their items, a prefetch at the item that issues
    it): a tensor is re-allocated only after it left the GPU, so this is the order they
    happen in, whatever the timing."""
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
        if k not in program.on_cpu:         # an op on the CPU allocates nothing on the GPU (R24) ...
            requests = [Request(owner, key(owner), size(owner)) for owner in seq.allocs[k]]
            if seq.workspace[k]:
                requests.append(Request(WORKSPACE, f"ws:{op_ids[seq.op_index[k]]}", seq.workspace[k]))
            if requests:
                items[k] = requests
        for transfer in issued.get(k, ()):  # ... but the prefetches issued when it ends do (R12, R27)
            owner = transfer.buffer or transfer.tensor
            transfers[transfer.index] = Request(owner, key(owner), size(owner))
    return AllocationKeys(start, items, transfers)


def placement_problem(keys: AllocationKeys, placement, persistent: frozenset) -> tuple[str, str] | None:
    """(key, reason) when a placement (``simulator.plan.Placement``) does not cover the
    iteration (R50): a key with no offset, a range past the arena, an offset for no
    allocation, or a persistent tensor that does not end where it started (steady
    state, R20). None when it does."""
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
