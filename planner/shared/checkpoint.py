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

from simulator.model.recompute import recompute_problem
from simulator.plan import drop, recompute
from simulator.profile import Profile

from ..core.lowering import DROP, Step, issue_order


def forward_ops(profile: Profile) -> list[int]:
    return [i for i, op in enumerate(profile.ops) if op.phase == "forward"]


def segment_of(profile: Profile, segments: int) -> dict[int, int]:
    """Forward op position -> its segment, ``segments`` runs of about equal length."""
    forward = forward_ops(profile)
    size = max(1, math.ceil(len(forward) / max(1, segments)))
    return {i: k // size for k, i in enumerate(forward)}


def droppable(profile: Profile, segment: dict[int, int]) -> dict[str, int]:
    """Tensor -> its segment, for every tensor the plan may drop and recompute: made by a
    forward op, read again only after the forward pass of its segment (by a later
    segment's first op at the earliest it is a checkpoint and is kept), recomputable
    under R15, and whose producer's inputs are persistent, kept, or dropped in the same
    segment (to a fixed point)."""
    tensors = profile.tensor_by_id
    last_forward = max(segment) if segment else -1
    found: dict[str, int] = {}
    for tensor in profile.tensors:
        made_by = profile.producer[tensor.id]
        if tensor.persistent or tensor.bytes == 0 or made_by not in segment:
            continue
        seg = segment[made_by]
        uses = profile.consumers[tensor.id]
        later = [u for u in uses if u > last_forward]
        if not later:
            continue      # not kept for backward: freed after its last use anyway
        if any(u in segment and segment[u] != seg for u in uses):
            continue      # read by another segment's forward: a checkpoint
        if recompute_problem(profile, tensor.id) is not None:
            continue      # R15
        found[tensor.id] = seg
    changed = True
    while changed:
        changed = False
        for tid, seg in list(found.items()):
            op = profile.ops[profile.producer[tid]]
            for src in op.inputs:
                if tensors[src].persistent:
                    continue
                if src in found:
                    if found[src] != seg:
                        break
                    continue
                # kept: it must still be resident when the segment is recomputed, with the value
                # the producer read (an in-place update before the producer ran is fine: relu_)
                again = _first_backward_use(profile, tid, last_forward)
                if profile.last_use[src] < again or \
                        any(profile.producer[tid] < u < again for u in profile.updaters[src]):
                    break
            else:
                continue
            del found[tid]
            changed = True
    return found


def _first_backward_use(profile: Profile, tid: str, last_forward: int) -> int:
    return min(u for u in profile.consumers[tid] if u > last_forward)


def chen_actions(profile: Profile, segments: int, lazy: bool = False) -> tuple[list, dict]:
    """Drops after each dropped tensor's last forward use; per segment, the recomputes of
    all its dropped tensors before the first backward op that reads one of them, or
    (``lazy``) each one before the first backward op that needs it or a recompute that
    reads it, whichever comes first."""
    segment = segment_of(profile, segments)
    dropped = droppable(profile, segment)
    actions = recompute_plan(profile, dropped, lazy)
    recomputed = [a for a in actions if a.kind == "recompute"]
    notes = {"segments": segments, "lazy": lazy, "dropped_tensors": len(recomputed),
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
        missing = [(tid, src) for tid in dropped for src in profile.ops[profile.producer[tid]].inputs
                   if src not in dropped and not profile.tensor_by_id[src].persistent
                   and (profile.last_use[src] < due[tid]
                        or any(profile.producer[tid] < u < due[tid] for u in profile.updaters[src]))]
        if not missing:
            break
        for tid, src in missing:
            if src in allowed:
                dropped[src] = allowed[src]
            else:
                dropped.pop(tid, None)
    ops = profile.ops
    steps, recomputes = [], []
    for tid in sorted(dropped, key=lambda t: (profile.producer[t], t)):
        before = due[tid]
        forward_uses = [u for u in profile.consumers[tid] if u <= last_forward]
        after = max(forward_uses + [profile.producer[tid]])
        if after >= before - 1:
            continue
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
        return {tid: first[seg] for tid, seg in dropped.items()}
    due = {tid: _first_backward_use(profile, tid, last_forward) for tid in dropped}
    for tid in sorted(dropped, key=lambda t: -profile.producer[t]):
        for src in profile.ops[profile.producer[tid]].inputs:
            if src in due:
                due[src] = min(due[src], due[tid])
    return due
