"""``vdnn++``: vDNN's offloads with the fixes of vDNN++ (Shriram, Garg, Kulkarni, "Dynamic
Memory Management for GPU-Based Training of Deep Neural Networks", IPDPS'19).

What it does
------------
vDNN++ keeps vDNN's choice of what to offload (planner/swap/vdnn.py: each layer's input
feature map, with vDNN's fallback; vDNN's plan, ``plan_vdnn``, is reused as it is, the one
import of another planner here) and fixes three things the paper measured:

- **Prefetches start early enough.** vDNN starts a layer's prefetch when the backward of
  the layer after it starts, so backward often waits. Here the prefetches are scheduled
  backwards from their deadlines on the ideal timeline: taken latest deadline first,
  each must end by its ``before`` op's start and before the next one on the one
  host-to-device stream starts, and is issued after the latest op that ends in time
  (never before the tensor's last forward use, nor before its offload is issued).
- **Offloaded data is compressed where that pays** (the seed's addition), by CSWAP's
  rule over the machine's compute codecs (planner/compress/cswap.py, R41).
- **One arena, placed offline** (its allocation-order heuristics against fragmentation):
  the plan gets a ``placement`` by SmartPool's interval colouring (planner/shared/placement.py,
  R50), so fragmentation cannot cost memory; the arena is reported beside the peak.

Each fix is kept only if the simulator finds the plan still fits and is no slower.

Departures from the paper, and why
----------------------------------
1. **Early prefetch by a deadline schedule on the ideal timeline**, not the paper's
   profiled start-time adjustments: the profile has no measured stalls to react to.
2. **Compression is the seed's addition**, not in the paper; codecs are the hardware
   file's, decided per tensor by CSWAP's cost rule.
3. **Placement stands in for vDNN++'s allocation heuristics** (best-fit pools and
   placing long-lived buffers apart): an offline placement makes fragmentation zero
   by construction, which is what those heuristics aim at.
4. **Pinned host memory** (the paper cuts it by 60%) is not modelled: the simulator
   counts host bytes, not pinned pages.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace

from simulator.errors import InputError
from simulator.model.links import link_speed
from simulator.plan import Placement, Plan
from simulator.profile import profile_sha256

from ..core.api import score, simulator_for
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.compression import swap_codecs, where_it_pays, with_codecs
from ..shared.facts import op_start_us
from ..shared.placement import METHODS, lifetimes, place_blocks
from ..swap.vdnn import plan_vdnn


def early_prefetches(profile, hardware, actions) -> list:
    """The actions with each prefetch issued as late as lets it, and every prefetch due
    after it on the host-to-device stream, end by its deadline on the ideal timeline."""
    starts = op_start_us(profile)
    index = profile.op_index
    latency, rate = link_speed(hardware, "prefetch", "host")
    offload_at = {a.tensor: -1 if a.after is None else index[a.after] for a in actions if a.kind == "offload"}
    prefetches = [(i, a) for i, a in enumerate(actions) if a.kind == "prefetch" and a.before is not None
                  and a.source == "host"]
    moved = {}
    stream_free = float("inf")
    for i, action in sorted(prefetches, key=lambda item: -index[item[1].before]):
        tensor = profile.tensor_by_id[action.tensor]
        deadline = min(starts[index[action.before]], stream_free)
        copy = latency + tensor.bytes / rate
        begin = deadline - copy
        stream_free = begin
        # the latest op that ends by ``begin``: its end is the start of the next op
        latest = bisect_right(starts, begin) - 2
        uses = [u for u in set(profile.consumers[action.tensor]) | set(profile.updaters[action.tensor])
                if u < index[action.before]]
        floor = max([offload_at.get(action.tensor, -1)] + uses)
        current = index[action.after] if action.after is not None else -1
        at = max(floor, min(latest, current))
        if at != current and at >= 0:
            moved[i] = replace(action, after=profile.ops[at].id)
    return [moved.get(i, a) for i, a in enumerate(actions)]


SHRINK = (1.0, 0.97, 0.94, 0.9, 0.85, 0.8)   # lifetimes taken under budget x these, until the arena fits


def arena_within(sim, budget_bytes, actions):
    """(placement, note): the smallest arena of the three placement methods over the
    plan's lifetimes, taken under the budget and, while the arena does not fit it, under
    smaller ones (a tighter run leaves fewer allocations alive together); kept when the
    placed plan runs within the budget. (None, why) when none does."""
    profile = sim.profile
    plan = Plan(profile.name, tuple(actions), profile_sha256=profile_sha256(profile))
    why = "no placement tried"
    for shrink in SHRINK:
        try:
            result, blocks, zero, tied = lifetimes(sim, plan, int(budget_bytes * shrink))
        except InputError as exc:
            why = f"lifetimes under {shrink:.0%} of the budget: {exc}"
            continue
        if not result.ok:
            why = f"the plan does not run under {shrink:.0%} of the budget"
            continue
        method, offsets, arena_bytes = min(((m, *place_blocks(blocks, m, tied)) for m in METHODS),
                                           key=lambda found: found[2])
        if arena_bytes > budget_bytes:
            why = f"the smallest arena, {arena_bytes} bytes ({method}), passes the budget"
            continue
        offsets.update({key: 0 for key in zero})
        placement = Placement(arena_bytes, dict(sorted(offsets.items())))
        tried = score(sim, budget_bytes, list(actions), placement=placement)
        if tried.ok:
            return placement, {"arena_bytes": arena_bytes, "method": method, "lifetimes_under": shrink,
                               "arena_over_live": round(arena_bytes / result.peak_bytes, 5)}
        why = f"the placed plan does not run ({tried.reason})"
    return None, f"not placed: {why}"


@register("vdnn++", "vDNN++: vDNN's offloads with prefetches started early enough for backward, compressed "
                    "where that pays, and one arena placed offline (no fragmentation).",
          params=(Param("mode", "all", "vDNN's policy: all, conv or dyn", choices=("all", "conv", "dyn")),
                  Param("compress", True, "compress offloads with the machine's compute codecs where CSWAP's rule "
                                          "says it pays"),
                  Param("arena", True, "give the plan an offline placement (SmartPool's colouring, R50)")),
          paper="Shriram, Garg, Kulkarni, Dynamic Memory Management for GPU-Based Training of Deep Neural "
                "Networks, IPDPS 2019",
          family="placement")
def plan_vdnn_plus(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, mode="all", compress=True,
                   arena=True):
    base = plan_vdnn(profile, hardware, budget_bytes, options=options, mode=mode)
    actions, notes = list(base.actions), {"vdnn": base.notes, "vdnn_status": base.status}
    sim = simulator_for(profile, hardware, options)
    current = score(sim, budget_bytes, actions)

    def better(candidate) -> bool:
        return candidate.ok and (not current.ok or candidate.iteration_us <= current.iteration_us)

    early = early_prefetches(profile, hardware, actions)
    tried = score(sim, budget_bytes, early)
    notes["early_prefetch"] = better(tried)
    if better(tried):
        actions, current = early, tried
    if compress:
        chosen = where_it_pays(profile, hardware, actions, swap_codecs(hardware, False), False)
        packed = with_codecs(actions, chosen)
        tried = score(sim, budget_bytes, packed) if chosen else None
        notes["compressed_tensors"] = len(chosen) if tried is not None and better(tried) else 0
        if tried is not None and better(tried):
            actions, current = packed, tried
    placement = None
    if arena and current.ok:
        placement, notes["placement"] = arena_within(sim, budget_bytes, actions)
    status = base.status
    return Draft(actions=actions, status=status, notes=notes, placement=placement)
