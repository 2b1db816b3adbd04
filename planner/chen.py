"""``chen``: activation checkpointing in segments, after Chen, Xu, Zhang, Guestrin,
"Training Deep Nets with Sublinear Memory Cost", arXiv:1604.06174, 2016.

The forward pass (ops of phase ``forward`` in the profile's order) is cut into segments
of about the same number of ops. A segment keeps only what crosses its end (its
*checkpoint*: tensors it makes that a later segment or op reads before backward); the
other tensors it makes for the backward pass are dropped after their last forward use
and recomputed, all of them in producer order, just before the first backward op that
needs one of them (Chen's "re-forward the segment, then run its backward"). With k
segments of a network of n ops the peak holds k checkpoints and one segment's
activations: k = sqrt(n) gives the paper's O(sqrt(n)) memory for one extra forward pass.

``segments`` = 0 (default) is the budgeted variant: segment counts from 2 to n/2 (the
paper's sqrt(n) among them) are tried and the fastest plan the simulator runs within the
budget is kept (the paper picks the segment memory budget by search too); a positive
``segments`` uses exactly that many.

Departure: ``lazy`` recomputes each dropped tensor just before the first backward op that
reads it (or the recompute of a tensor made from it, if that comes first) instead of
re-running the whole segment at once: the recomputed tensors then live only as long as
the backward pass needs them. The budgeted search tries both for every count (ResNet-50
on an A100 40 GB fits at 40 GiB only lazily).

Departures (and why):
- Rules of this simulator (R15) decide what may be recomputed: a tensor whose producer
  updates something in place, that is updated in place after it is made (PyTorch's
  ``relu_``), or whose producer reads a tensor dropped in another segment, a dropped
  tensor updated before the recompute, or one that is gone by then, is kept; the
  check runs to a fixed point, so every recompute reads only resident tensors.
- Weights, optimizer state and inputs stay on the GPU; nothing is swapped.
"""
from __future__ import annotations

import math

from simulator.plan import drop, recompute
from simulator.profile import Profile

from .api import score
from .lowering import DROP, Step, issue_order
from .registry import DEFAULT_OPTIONS, Draft, Param, register


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
        if profile.ops[made_by].updates or profile.updaters[tensor.id]:
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


@register(
    "chen",
    "Chen et al. 2016: activation checkpointing in segments; each segment's saved tensors "
    "dropped after forward and recomputed before its backward (sqrt(n), or the budgeted search).",
    params=(Param("segments", 0, "forward segments (0: search the counts and both recompute timings, "
                                 "fastest plan within the budget)", low=0, high=1_000_000),
            Param("lazy", False, "with segments > 0: recompute each dropped tensor just before it is needed "
                                 "instead of re-running the segment before its backward")),
    moves_persistent=False,
    recomputes=True,
    paper="Chen et al., Training Deep Nets with Sublinear Memory Cost, arXiv:1604.06174, 2016",
)
def plan_chen(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, segments=0, lazy=False):
    forward = len(forward_ops(profile))
    if segments:
        actions, notes = chen_actions(profile, segments, lazy)
        return Draft(actions=actions, notes=notes)
    counts = sorted({max(1, round(math.sqrt(forward)))} | {c for c in _counts(forward)})
    best = None
    for count in counts:
        for late in (False, True):
            actions, notes = chen_actions(profile, count, late)
            result = score(profile, hardware, budget_bytes, actions)
            key = (not result.ok, result.iteration_us if result.ok else -result.progress, late, count)
            if best is None or key < best[0]:
                best = (key, actions, notes)
    _, actions, notes = best
    notes["searched_segment_counts"] = len(counts)
    return Draft(actions=actions, notes=notes)


def _counts(forward: int) -> list[int]:
    """Segment counts to try: a geometric ladder from 2 to half the forward ops."""
    found, count = [], 2
    while count <= max(2, forward // 2):
        found.append(count)
        count = max(count + 1, int(count * 1.5))
    return found
