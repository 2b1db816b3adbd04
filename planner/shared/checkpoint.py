"""Segment checkpointing, after Chen, Xu, Zhang, Guestrin, "Training Deep Nets with
Sublinear Memory Cost" (2016): the forward pass cut into segments, the tensors a
segmentation may drop and recompute under the simulator's rules (R15, to a fixed point),
and the drop / recompute actions for a chosen set, eager (the segment re-run before its
backward) or lazy (each tensor just before it is needed).

The building blocks that ``chen`` (recompute/chen.py, whose docstring describes the
method), ``torch-budget`` (its own choice of tensors, lowered the same way) and the
ZeRO planners (Chen's segments added when their layouts do not fit) share, so that none
of them imports another planner.
"""
from __future__ import annotations

import math

from simulator.model.recompute import recompute_problem, recompute_reads
from simulator.plan import drop, recompute
from simulator.profile import Profile

from ..core.lowering import DROP, Step, issue_order


def forward_ops(profile: Profile) -> list[int]:
    return [i for i, op in enumerate(profile.ops) if op.phase == "forward"]


def segment_of(profile: Profile, segments: int, balance: str = "ops") -> dict[int, int]:
    """Forward op position -> its segment, ``segments`` runs of about equal length
    (``balance`` ``ops``) or of about equal bytes made (``bytes``: Chen's segments by a
    memory budget, each closed once its outputs pass a share of the forward's)."""
    forward = forward_ops(profile)
    if balance == "bytes":
        made = [sum(profile.tensor_by_id[t].bytes for t in profile.ops[i].outputs) for i in forward]
        share = max(1, math.ceil(sum(made) / max(1, segments)))
        found, before = {}, 0
        for i, nbytes in zip(forward, made):
            found[i] = min(segments - 1, before // share)
            before += nbytes
        return found
    size = max(1, math.ceil(len(forward) / max(1, segments)))
    return {i: k // size for k, i in enumerate(forward)}


def droppable(profile: Profile, segment: dict[int, int], sources: bool = False) -> dict[str, int]:
    """Tensor -> its segment, for every tensor the plan may drop and recompute: made by a
    forward op, read again only after the forward pass of its segment (by a later
    segment's first op at the earliest it is a checkpoint and is kept), recomputable
    under R15, and whose producer's inputs are persistent, kept, or dropped in the same
    segment (to a fixed point). With ``sources``, also the tensors only the forward reads
    that such a tensor's re-run reads (Chen's re-forward of the segment makes them again)."""
    tensors = profile.tensor_by_id
    last_forward = max(segment) if segment else -1
    found: dict[str, int] = {}
    only_forward: set[str] = set()   # read in forward only: re-made only for a dropped reader (the re-forward)
    for tensor in profile.tensors:
        made_by = profile.producer[tensor.id]
        if tensor.persistent or tensor.bytes == 0 or made_by not in segment:
            continue
        seg = segment[made_by]
        uses = profile.consumers[tensor.id]
        if any(u in segment and segment[u] != seg for u in uses):
            continue      # read by another segment's forward: a checkpoint
        if recompute_problem(profile, tensor.id) is not None:
            continue      # R15
        if not any(u > last_forward for u in uses):
            if not sources:
                continue      # not kept for backward: freed after its last use anyway
            only_forward.add(tensor.id)
        found[tensor.id] = seg
    first = {}             # a segment's first backward read of what it drops: when a source is re-made
    for tid, seg in found.items():
        if tid not in only_forward:
            first[seg] = min(first.get(seg, len(profile.ops)), _first_backward_use(profile, tid, last_forward))
    changed = True
    while changed:
        changed = False
        for tid, seg in list(found.items()):
            again = (first.get(seg, len(profile.ops)) if tid in only_forward
                     else _first_backward_use(profile, tid, last_forward))
            for src in recompute_reads(profile, profile.producer[tid], again):   # R60: as gathered last
                if tensors[src].persistent or _regathered(profile, src, again):
                    continue
                if src in found:
                    if found[src] != seg:
                        break
                    continue
                # kept: it must still be resident when the segment is recomputed, with the value
                # the producer read (an in-place update before the producer ran is fine: relu_)
                if profile.last_use[src] < again or \
                        any(profile.producer[tid] < u < again for u in profile.updaters[src]):
                    break
            else:
                continue
            del found[tid]
            changed = True
    needed, stack = set(), [t for t in found if t not in only_forward]   # what a dropped tensor's re-run reads
    while stack:
        for src in profile.ops[profile.producer[stack.pop()]].inputs:
            if src in only_forward and src in found and src not in needed:
                needed.add(src)
                stack.append(src)
    return {tid: seg for tid, seg in found.items() if tid not in only_forward or tid in needed}


def _dropped_after(profile: Profile, tid: str, last_forward: int) -> int:
    """The op a dropped tensor is dropped after: its last forward read, or its producer."""
    return max([u for u in profile.consumers[tid] if u <= last_forward] + [profile.producer[tid]])


def _regathered(profile: Profile, src: str, at: int) -> bool:
    """R60: ``src`` is a unit's parameters as gathered again before ``at`` (a rank's
    backward gather): a re-run there reads it, and it lives until then (R8)."""
    chain = profile.gather_twins.get(src)
    return bool(chain) and src != chain[0][1] and profile.producer[src] < at


def _first_backward_use(profile: Profile, tid: str, last_forward: int) -> int:
    """Its first read after the forward pass; the number of ops for a tensor the forward
    alone reads (re-made only for a reader's re-run: ``_due`` moves it up to that)."""
    return min((u for u in profile.consumers[tid] if u > last_forward), default=len(profile.ops))


def chen_actions(profile: Profile, segments: int, lazy: bool = False, balance: str = "ops") -> tuple[list, dict]:
    """Drops after each dropped tensor's last forward use; per segment (``segment_of``),
    the recomputes of all its dropped tensors before the first backward op that reads one
    of them, or (``lazy``) each one before the first backward op that needs it or a
    recompute that reads it, whichever comes first."""
    segment = segment_of(profile, segments, balance)
    dropped = droppable(profile, segment, sources=True)
    actions = recompute_plan(profile, dropped, lazy)
    recomputed = [a for a in actions if a.kind == "recompute"]
    notes = {"segments": segments, "lazy": lazy, "balance": balance, "dropped_tensors": len(recomputed),
             "dropped_bytes": sum(profile.tensor_by_id[a.tensor].bytes for a in recomputed)}
    return actions, notes


def recompute_plan(profile: Profile, dropped: dict[str, int], lazy: bool,
                   allowed: dict[str, int] | None = None) -> list:
    """The actions that drop ``dropped`` (tensor -> segment, a subset of ``allowed``,
    ``droppable``'s set) after their last forward use and recompute them before backward
    needs them. A source left out that would be gone (or changed in place) by its
    reader's recompute is dropped and recomputed with it when ``allowed``, else the
    reader is kept."""
    dropped = dict(dropped)
    allowed = dropped if allowed is None else allowed
    last_forward = max((i for i, op in enumerate(profile.ops) if op.phase == "forward"), default=-1)
    while True:
        due = _due(profile, dropped, last_forward, lazy)
        missing = [(tid, src) for tid in dropped
                   for src in recompute_reads(profile, profile.producer[tid], due[tid])   # R60
                   if src not in dropped and not profile.tensor_by_id[src].persistent
                   and not _regathered(profile, src, due[tid])
                   and (profile.last_use[src] < due[tid]
                        or any(profile.producer[tid] < u < due[tid] for u in profile.updaters[src]))]
        if not missing:
            break
        for tid, src in missing:
            if src in allowed:
                dropped[src] = allowed[src]
            else:
                dropped.pop(tid, None)
    while True:    # what is needed again at once is kept; what the forward alone reads, but for a kept reader
        read = {src for tid in dropped for src in profile.ops[profile.producer[tid]].inputs}
        idle = [tid for tid in dropped if _dropped_after(profile, tid, last_forward) >= due[tid] - 1
                or (tid not in read and _first_backward_use(profile, tid, last_forward) == len(profile.ops))]
        if not idle:
            break
        for tid in idle:
            del dropped[tid]
        due = _due(profile, dropped, last_forward, lazy)
    ops = profile.ops
    steps, recomputes = [], []
    for tid in sorted(dropped, key=lambda t: (profile.producer[t], t)):
        before = due[tid]
        after = _dropped_after(profile, tid, last_forward)
        steps.append(Step(after, DROP, before, tid, drop(tid, ops[after].id)))
        recomputes.append(((before, profile.producer[tid], tid), recompute(tid, ops[before].id)))
    recomputes.sort(key=lambda r: r[0])
    return issue_order(steps) + [r for _, r in recomputes]


def _due(profile: Profile, dropped: dict[str, int], last_forward: int, lazy: bool) -> dict[str, int]:
    """The op each dropped tensor is recomputed before: its segment's first backward read
    of any dropped tensor (eager, the paper's re-forward), or (lazy) its own first
    backward read, moved up to the recompute of any dropped tensor whose producer reads
    it (later-made tensors first, so that a source is back before what reads it)."""
    if not lazy:
        first: dict[int, int] = {}
        for tid, seg in dropped.items():
            first[seg] = min(first.get(seg, len(profile.ops)), _first_backward_use(profile, tid, last_forward))
        due = {tid: first[seg] for tid, seg in dropped.items()}
        for tid in sorted(dropped, key=lambda t: -profile.producer[t]):   # a source of another segment's re-run
            for src in profile.ops[profile.producer[tid]].inputs:
                if src in due:
                    due[src] = min(due[src], due[tid])
        return due
    due = {tid: _first_backward_use(profile, tid, last_forward) for tid in dropped}
    for tid in sorted(dropped, key=lambda t: -profile.producer[t]):
        for src in profile.ops[profile.producer[tid]].inputs:
            if src in due:
                due[src] = min(due[src], due[tid])
    return due
