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
paper's sqrt(n) among them) are tried, each with segments of equal op counts and of
equal bytes made (the paper's memory-budgeted segmentation closes a segment once its
memory passes the budget), and the fastest plan the simulator runs within the budget is
kept (the paper picks the segment memory budget by search too); a positive ``segments``
uses exactly that many, of equal op counts.

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

from ..core.api import score, simulator_for
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.checkpoint import chen_actions, forward_ops


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
    family="recompute",
    paper="Chen et al., Training Deep Nets with Sublinear Memory Cost, arXiv:1604.06174, 2016",
)
def plan_chen(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, segments=0, lazy=False):
    forward = len(forward_ops(profile))
    if segments:
        actions, notes = chen_actions(profile, segments, lazy)
        return Draft(actions=actions, notes=notes)
    counts = sorted({max(1, round(math.sqrt(forward)))} | {c for c in _counts(forward)})
    sim = simulator_for(profile, hardware, options)
    best = None
    for count in counts:
        for balance in ("ops", "bytes"):
            for late in (False, True):
                actions, notes = chen_actions(profile, count, late, balance)
                result = score(sim, budget_bytes, actions)
                key = (not result.ok, result.iteration_us if result.ok else -result.progress, late, balance != "ops",
                       count)
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
