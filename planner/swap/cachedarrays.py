"""``cachedarrays``: future-use hints turned into offloads and prefetches, after CachedArrays
(Hildebrand, Lowe-Power, Akella, "CachedArrays: Optimizing Data Movement for Heterogeneous
Memory Systems", IPDPS 2024; read from its abstract, the authors' project page and the
project's research notes). CachedArrays manages a CPU's two memory tiers, a small fast
DRAM and a large slow NVRAM (Optane), at the granularity of whole objects (arrays): the
program gives *semantic hints about the future use* of its objects through a Policy API
(will be used soon, will not be used for a while, dead), and a Data Manager decides, from
those hints, when each object moves between the tiers, instead of leaving DRAM to act as
a hardware cache of NVRAM. The paper evaluates it on CNN training.

The mapping to a GPU
--------------------
Fast memory (DRAM) is the GPU, slow memory (NVRAM) host DRAM, and a move between them is
an explicit copy over PCIe (R11, R12). An object is a tensor. The hints a training loop
can give are known in advance from the profile: after each touch of a tensor, how far
away its next touch is (its *future-use distance*, in ops of the schedule).

What it does
------------
- **Hints.** For every non-persistent, non-empty tensor and each pair of consecutive
  touches ``a < c`` (made, read or updated), the future-use distance after ``a`` is
  ``c - a - 1`` ops.
- **"Not needed for a while" -> offload.** A distance above ``distance`` makes the Data
  Manager send the tensor to the slow tier: ``offload(t, after=a)``.
- **"Will be used soon" -> prefetch.** The hint is given ``ahead`` ops before the next
  use: ``prefetch(t, after=c - 1 - ahead, before=c)`` (never before ``a + 1``), so
  ``ahead`` ops run while the copy moves.
- **Only as much as needed** (``distance = -1``, the default): CachedArrays' Data
  Manager moves an object to slow memory when fast memory must make room, and the
  future-use hint tells it which object can best go: the one needed last. Here the
  distance threshold is lowered, from the longest distance down, by a binary search for
  the largest threshold whose plan the simulator finds within the budget; every
  threshold the search simulates that fits is a candidate and the fastest is kept.
  Nothing moves when the unmodified iteration fits.
- ``ahead = -1`` (the default) repeats that search for 1, 2, 4, 8, 16, 32, 64 and 128 ops of lead
  and keeps the fastest plan that fits (the plan that moves every interval, with a lead
  of 1, when none fits; make_plan marks it infeasible). With a given ``distance`` and
  ``ahead = -1`` only the lead is searched.

Departures from the paper, and why
----------------------------------
1. **GPU and host, not DRAM and NVRAM.** CachedArrays moves objects with CPU copies
   between two memories the CPU addresses directly; here the two tiers are joined by
   PCIe and every move is a copy on a d2h or h2d queue. The policy (which objects move,
   and when) is what carries over.
2. **Hints from the profile.** The paper's hints are written into the training code by
   the programmer (or a library); here they are derived from the profile's touches, so
   they are exact (a perfect programmer). Distances are counted in ops, not time,
   because that is what a hint written in the program knows.
3. **No Data Manager at run time.** CachedArrays decides placement while the program
   runs, evicting as allocations need room; here the decisions are made offline and the
   threshold search stands in for "evict only when room is needed, farthest next use
   first". Objects are never split, as in CachedArrays (object granularity).
4. **Weights and optimizer state stay on the GPU** (``moves_persistent=False``): the
   paper's CNN experiments tier activations and weights alike; keeping weights resident
   lets the plan meet the steady-state rule (R20) without a prefetch across the
   iteration boundary.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from simulator.plan import Plan, offload, prefetch
from simulator.profile import profile_sha256

from ..core.api import simulator_for
from ..core.lowering import OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import touches

AHEADS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Hint:
    """A tensor idle between touches ``a`` and ``c``: its future-use distance after ``a``."""
    tensor: str
    order: int
    a: int
    c: int
    nbytes: int

    @property
    def distance(self) -> int:
        return self.c - self.a - 1


def hints(profile) -> list[Hint]:
    """Every idle interval of every swappable tensor, in profile order."""
    found = []
    for order, tensor in enumerate(profile.tensors):
        if tensor.persistent or tensor.bytes == 0:
            continue
        points = touches(profile, tensor.id)
        found.extend(Hint(tensor.id, order, a, c, tensor.bytes) for a, c in zip(points, points[1:]) if c - a >= 2)
    return found


def cachedarrays_actions(profile, found: list[Hint], distance: int, ahead: int) -> tuple[list, int, int]:
    """Offload every interval with a distance above ``distance``, prefetch ``ahead`` ops
    before its next use; the actions in issue order, the count and the bytes moved."""
    ops = profile.ops
    steps, moved, count = [], 0, 0
    for h in found:
        if h.distance <= distance:
            continue
        b = max(h.c - 1 - ahead, h.a + 1)
        steps.append(Step(h.a, OFFLOAD, h.c, (h.order, h.a), offload(h.tensor, ops[h.a].id, "host")))
        steps.append(Step(b, PREFETCH, h.c, (h.order, h.a), prefetch(h.tensor, ops[b].id, ops[h.c].id, "host")))
        moved += h.nbytes
        count += 1
    return issue_order(steps), count, moved


def search(profile, hardware, budget_bytes: int, found: list[Hint], thresholds: list[int], aheads, options):
    """For each lead, the largest of ``thresholds`` (descending: each moves more than the
    one before) that fits, by binary search; the fastest fitting plan of all simulated.
    Returns (distance, ahead, tried); the last threshold and the first lead when nothing
    fits."""
    simulator = simulator_for(profile, hardware, options)
    sha = profile_sha256(profile)
    best = None           # (iteration, -distance, ahead, distance)
    tried = []
    for ahead in aheads:
        memo = {}

        def fits(i: int) -> bool:
            if i not in memo:
                actions, _, _ = cachedarrays_actions(profile, found, thresholds[i], ahead)
                score = simulator.score(Plan(profile_name=profile.name, profile_sha256=sha, actions=tuple(actions)),
                                        budget_bytes)
                memo[i] = score
                tried.append([ahead, thresholds[i], round(score.iteration_us, 3) if score.ok else None])
                options.say(f"cachedarrays: ahead {ahead}, distance > {thresholds[i]}: "
                            + (f"{score.iteration_us:.0f} us" if score.ok else "does not fit"))
            return memo[i].ok

        last = len(thresholds) - 1
        if not fits(last):
            continue
        # search for the first index (largest threshold) that fits: what counts is the plans
        # its probes simulate (memo), of which the fastest that fits is kept below
        bisect_left(range(last), True, key=fits)
        for i, score in memo.items():
            if score.ok:
                key = (score.iteration_us, -thresholds[i], ahead, thresholds[i])
                if best is None or key < best:
                    best = key
    if best is None:
        return thresholds[-1], aheads[0], tried
    return best[3], best[2], tried


@register("cachedarrays", "CachedArrays: future-use hints as moves: a tensor whose next use is more than a "
                          "distance away leaves after its use and is prefetched a few ops ahead of the next; the "
                          "distance lowered only as far as the budget needs.",
          params=(Param("distance", -1, "offload a tensor whose next use is more than this many ops away (-1: the "
                                        "largest distance that fits, by simulation)", low=0, also=(-1,)),
                  Param("ahead", -1, "ops of lead for the 'will use soon' prefetch (-1: try 1, 2, 4, ..., 128 and "
                                     "keep the fastest)", low=0, also=(-1,))),
          moves_persistent=False,
          paper="Hildebrand et al., CachedArrays: Optimizing Data Movement for Heterogeneous Memory Systems, "
                "IPDPS 2024", family="swap")
def plan_cachedarrays(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, distance=-1, ahead=-1) -> Draft:
    found = hints(profile)
    notes: dict = {"intervals": len(found)}
    if distance == -1 and profile.peak_bytes <= budget_bytes:
        return Draft(actions=[], notes={**notes, "moved": 0, "why": "the iteration fits the budget: nothing moves"})
    if distance == -1 or ahead == -1:
        if distance == -1:   # every distinct distance but the longest (which moves nothing), then 0: all
            thresholds = sorted({h.distance for h in found} - {max((h.distance for h in found), default=0)} | {0},
                                reverse=True)
        else:
            thresholds = [distance]
        aheads = AHEADS if ahead == -1 else (ahead,)
        distance, ahead, tried = search(profile, hardware, budget_bytes, found, thresholds, aheads, options)
        notes["tried"] = tried
    actions, count, moved = cachedarrays_actions(profile, found, distance, ahead)
    return Draft(actions=actions, notes={**notes, "distance": distance, "ahead": ahead, "moved": count,
                                         "moved_bytes": moved})
