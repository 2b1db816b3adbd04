"""``chen-meng``: swap long-lived tensors, swap-in timed by estimated completion times, after
Meng, Sun, Yang, Qiu, Gu, "Training Deeper Models by GPU Memory Optimization on
TensorFlow", NIPS 2017 Workshop on ML Systems (Alibaba; read from its abstract, a public
summary and the project's research notes). The paper rewrites the TensorFlow dataflow
graph: tensors with a long *life-cycle* get a swap-out node to host memory after they are
produced and a swap-in node before their consumer, the swap-in being triggered through a
control edge from a node chosen with estimated node completion times (from a pre-run or a
static estimate) so that the copy ends in time; tensors with short life-cycles stay.
(Its other half, a memory-efficient attention layer for Seq2Seq models, is a model
change and not a planning decision.)

What it does
------------
- **Life-cycle.** For every non-persistent, non-empty tensor, each idle interval between
  two consecutive touches ``a < c`` (made, read or updated; at least one op between) is
  one life-cycle, its length the ideal time between the end of ``a`` and the start of
  ``c`` (planner.shared.facts.idle_gaps on the profile's ideal timeline).
- **Swap-out.** Every interval longer than ``threshold`` microseconds is swapped:
  ``offload(t, after=a)``.
- **Swap-in trigger from estimated completion times.** With SwapIn = latency + bytes /
  h2d bandwidth (a lone copy), the trigger is the latest op in ``a+1 .. c-1`` whose
  estimated completion time (ideal end) is at or before ``start(c) - SwapIn``:
  ``prefetch(t, after=<trigger>, before=c)``. When even ``a + 1`` ends too late (the
  interval is too short to hide the copy), the trigger is ``a + 1`` and ``c`` waits.
- **Threshold searched by simulation** (``threshold = -1``, the default): nothing moves
  if the unmodified iteration fits. Otherwise the intervals are sorted by length and the
  thresholds that swap the longest 1/16, 2/16, ..., all of them are simulated, then up
  to eight more between the neighbours of the fastest plan that fits; the fastest plan
  that fits is kept.
- **Fallback** (``fallback``, on by default; not in the paper): when no threshold fits,
  because swap-ins timed to end just in time bring tensors back while the backward pass
  still needs the room (VGG-16 at 40 GiB), the search is run again with every swap-in
  issued just before its use (synchronous: the copy is not hidden, but the tensor is
  away for the whole interval). Its plan is kept if it fits, with status ``fallback``;
  otherwise the plan that swaps every interval with the estimated triggers is returned
  and make_plan marks it infeasible.

Departures from the paper, and why
----------------------------------
1. **Life-cycle per idle interval.** The paper's life-cycle of a tensor is the time it
   stays in memory before its consumer runs; here each idle interval of a tensor is
   judged on its own, so a tensor read early in forward and again in backward is
   swapped across that gap without its near reads being affected (TensorFlow's rewrite
   lets near consumers read the original tensor, which one buffer per tensor cannot
   express otherwise). The swap-out follows the touch that starts the interval (its
   producer for the first one, as in the paper).
2. **Completion times from the ideal timeline**, with each copy alone on the link: the
   estimate ignores the queueing of swap-ins behind each other and the stalls earlier
   swaps cause (the paper's pre-run measures a run without swapping too). The
   simulator's score, used by the threshold search, does include them.
3. **Threshold search.** The paper sets the threshold by hand (or by a static rule it
   does not detail); here it is searched by simulation as above. ``threshold >= 0``
   uses the given value.
4. **Weights and optimizer state stay on the GPU** (``moves_persistent=False``):
   TensorFlow swaps op outputs only.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace

from simulator.model.links import link_speed
from simulator.plan import Plan, offload, prefetch
from simulator.profile import profile_sha256

from ..core.api import simulator_for
from ..core.lowering import OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import idle_gaps, op_start_us

GRID = 16        # first pass: the longest 1/16, 2/16, ... of the intervals
REFINE = 8       # second pass: points between the neighbours of the best


@dataclass(frozen=True)
class Interval:
    """One life-cycle: offload after ``a``, swap-in issued after ``b``, needed by ``c``."""
    tensor: str
    order: int
    a: int
    b: int
    c: int
    length_us: float
    nbytes: int


def intervals(profile, hardware) -> list[Interval]:
    """Every idle interval of every swappable tensor, longest first (ties: profile order),
    with its swap-in trigger from estimated completion times."""
    starts = op_start_us(profile)
    latency, rate = link_speed(hardware, "prefetch", "host")
    found = []
    for order, tensor in enumerate(profile.tensors):
        if tensor.persistent or tensor.bytes == 0:
            continue
        swap_in = latency + tensor.bytes / rate
        for gap in idle_gaps(profile, tensor.id, starts):
            if gap.length_us <= 0:
                continue                                         # nothing runs in between
            ends_by = starts[gap.before] - swap_in
            trigger = bisect_right(starts, ends_by) - 2          # the last op ending by then
            b = min(max(trigger, gap.after + 1), gap.before - 1)
            found.append(Interval(tensor.id, order, gap.after, b, gap.before, gap.length_us, tensor.bytes))
    found.sort(key=lambda g: (-g.length_us, g.order, g.a))
    return found


def swap_actions(profile, chosen: list[Interval]) -> list:
    """Offload and swap-in actions for the chosen intervals, in issue order."""
    ops = profile.ops
    steps = []
    for g in chosen:
        steps.append(Step(g.a, OFFLOAD, g.c, (g.order, g.a), offload(g.tensor, ops[g.a].id, "host")))
        steps.append(Step(g.b, PREFETCH, g.c, (g.order, g.a), prefetch(g.tensor, ops[g.b].id, ops[g.c].id, "host")))
    return issue_order(steps)


def above(found: list[Interval], threshold: float) -> list[Interval]:
    return [g for g in found if g.length_us > threshold]


def search(profile, hardware, budget_bytes: int, found: list[Interval], options) -> tuple[int, list, bool]:
    """How many of the longest intervals to swap (the threshold search), what was tried
    ([intervals swapped, simulated iteration in us or None when it does not fit]) and
    whether any plan fitted."""
    simulator = simulator_for(profile, hardware, options)
    sha = profile_sha256(profile)
    scores: dict[int, object] = {}

    def cut(k: int) -> int:
        """Round a count up to a whole threshold: every interval as long as the k-th."""
        while 0 < k < len(found) and found[k].length_us == found[k - 1].length_us:
            k += 1
        return k

    def score(k: int):
        if k not in scores:
            actions = swap_actions(profile, found[:k])
            scores[k] = simulator.score(Plan(profile_name=profile.name, profile_sha256=sha, actions=tuple(actions)),
                                        budget_bytes)
            s = scores[k]
            options.say(f"chen-meng: longest {k} of {len(found)} intervals: "
                        + (f"{s.iteration_us:.0f} us" if s.ok else "does not fit"))
        return scores[k]

    n = len(found)
    grid = sorted({cut(-(-n * i // GRID)) for i in range(1, GRID + 1)})
    for k in grid:
        score(k)

    def best() -> int | None:
        fitting = [k for k in sorted(scores) if scores[k].ok]
        return min(fitting, key=lambda k: (scores[k].iteration_us, k)) if fitting else None

    top = best()
    if top is not None:
        position = grid.index(top)
        low = grid[position - 1] if position > 0 else 0
        high = grid[position + 1] if position + 1 < len(grid) else n
        for i in range(1, REFINE + 1):
            score(cut(low + (high - low) * i // (REFINE + 1)))
        top = best()
    tried = [[k, round(s.iteration_us, 3) if s.ok else None] for k, s in sorted(scores.items())]
    return (n if top is None else top), tried, top is not None


@register("chen-meng", "Chen Meng et al. (TensorFlow swap-out/in): swap every idle interval longer than a "
                       "threshold; swap-in triggered from estimated completion times to end just in time; "
                       "threshold searched by simulation.",
          params=(Param("threshold", -1.0, "swap idle intervals longer than this (us, on the ideal timeline; -1: "
                                           "search by simulation)", low=0.0, also=(-1.0,)),
                  Param("fallback", True, "when the search finds no threshold that fits: search again with every "
                                          "swap-in issued just before its use (marked fallback)")),
          moves_persistent=False,
          paper="Meng et al., Training Deeper Models by GPU Memory Optimization on TensorFlow, NIPS 2017 "
                "Workshop on ML Systems", family="swap")
def plan_chen_meng(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, threshold=-1.0,
                   fallback=True) -> Draft:
    found = intervals(profile, hardware)
    if threshold >= 0:
        chosen = above(found, threshold)
        notes = {"threshold_us": threshold, "swapped": len(chosen), "intervals": len(found)}
    elif profile.peak_bytes <= budget_bytes:
        chosen, notes = [], {"threshold_us": None, "swapped": 0, "why": "the iteration fits the budget: nothing moves"}
    else:
        k, tried, fitted = search(profile, hardware, budget_bytes, found, options)
        status = "heuristic"
        if not fitted and fallback:
            synchronous = [replace(g, b=g.c - 1) for g in found]
            k_sync, tried_sync, fitted_sync = search(profile, hardware, budget_bytes, synchronous, options)
            if fitted_sync:
                found, k, status = synchronous, k_sync, "fallback"
                tried = {"estimated_triggers": tried, "synchronous_swap_ins": tried_sync}
        chosen = found[:k]
        cut_at = found[k].length_us if k < len(found) else 0.0
        notes = {"threshold_us": round(cut_at, 3), "swapped": k, "intervals": len(found), "tried": tried}
        if status == "fallback":
            notes["fallback"] = ("no threshold fits with swap-ins timed by estimated completion times: every "
                                 "swap-in issued just before its use")
        notes["swapped_bytes"] = sum(g.nbytes for g in chosen)
        return Draft(actions=swap_actions(profile, chosen), notes=notes, status=status)
    notes["swapped_bytes"] = sum(g.nbytes for g in chosen)
    return Draft(actions=swap_actions(profile, chosen), notes=notes)
