"""``layrub``: layer-centric offload at forward reference count zero, prefetch one layer
ahead in backward, after Layrub (Jin, Liu, Jiang, Ma, Shi, He, Zhao, "Layer-Centric
Memory Reuse and Data Migration for Extreme-Scale Deep Learning on Many-Core
Architectures", ACM TACO 15(3), 2018, doi 10.1145/3243904; an earlier version at PPoPP
2018; built on Caffe; read from its abstract and the project's research notes). Layrub
has two parts: *intra-layer* memory reuse (a layer's gradient and activation computation
reordered so that they share buffers) and *inter-layer* data migration (feature maps leave
the GPU between their forward and backward uses). This planner is the inter-layer part.

What it does
------------
- A *layer* is a run of consecutive ops with one ``module`` and phase
  (planner.shared.facts.layer_segments; an op without a module is a layer of its own): Caffe's
  layers, forward and backward.
- **Offload at forward reference count zero.** Layrub counts, for each feature map, the
  forward layers still to read it; when the count reaches zero the map is copied to host
  memory. Here that is every non-empty tensor made in the forward pass whose forward
  touches all precede its first later (backward or optimizer) touch
  (planner.shared.facts.forward_backward_split; gradients and other tensors made in backward are not
  feature maps and stay):
  ``offload(t, after=<its last forward touch>)`` (its producer when no forward op reads
  it). In-place updates in the forward pass count as touches, so the offload follows
  the last one (R11).
- **Prefetch one layer ahead.** In backward, the tensor is brought back while the layer
  before the one that needs it runs: ``prefetch(t, after=<op before the first op of the
  layer ahead>, before=<its first backward use>)``, where the layer ahead is the
  ``ahead``-th layer before the one holding that use (1 by default, the paper's "one
  layer ahead"). A tensor whose prefetch would have to be issued at or before its
  offload (it is used again within the next ``ahead`` layers, e.g. the loss layer's
  input) is not moved.
- When the unmodified iteration already fits the budget, nothing moves.

Departures from the paper, and why
----------------------------------
1. **No intra-layer reuse.** Sharing one buffer between a layer's gradient and its
   activation needs aliasing (two tensors in one allocation), which neither the profile
   nor the simulator models; the plan is the inter-layer migration only, so its peak is
   higher than Layrub's by what intra-layer reuse saves.
2. **Reference counts from the profile.** Caffe counts a blob's forward readers at run
   time; here the last forward touch is read from the profile, which gives the same
   point for a static graph.
3. **No synchronisation at layer boundaries.** Layrub waits at each layer for its
   transfers; the simulator releases an offloaded copy as soon as it is written (R11)
   and makes an op wait only for its own prefetches (R12) or memory (R6), so the plan is
   never slower than a synchronised Layrub.
4. **Nothing moves when everything fits** (Layrub migrates whenever it is enabled); and
   it is not budget-driven otherwise: when its fixed policy cannot fit the budget the
   plan is returned as it is and make_plan marks it infeasible.
5. **Weights and optimizer state stay on the GPU** (``moves_persistent=False``), as in
   Layrub, which moves feature maps only.
"""
from __future__ import annotations

from bisect import bisect_right

from ..core.lowering import host_swaps
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import forward_maps, layer_segments


def layrub_swaps(profile, ahead: int) -> tuple[list[tuple[str, int, int, int]], int]:
    """(tensor, offload after, prefetch after, prefetch before) for every feature map, and
    how many were left resident because the layer ahead starts before their offload."""
    segments = layer_segments(profile)
    firsts = [first for first, _ in segments]
    swaps, kept = [], 0
    for tid, last_forward, first_later in forward_maps(profile):
        layer = bisect_right(firsts, first_later) - 1          # the layer holding the use
        after = firsts[max(layer - ahead, 0)] - 1              # when the layer ahead starts
        after = min(after, first_later - 1)
        if after <= last_forward:
            kept += 1
            continue
        swaps.append((tid, last_forward, after, first_later))
    return swaps, kept


@register("layrub", "Layrub (inter-layer): offload each feature map when its forward reference count reaches "
                    "zero, prefetch it one layer ahead of its backward use.",
          params=(Param("ahead", 1, "layers of lead for the backward prefetch (1: the layer before the one that "
                                    "needs it)", low=1, high=100000),),
          moves_persistent=False,
          paper="Jin et al., Layer-Centric Memory Reuse and Data Migration for Extreme-Scale Deep Learning on "
                "Many-Core Architectures (Layrub), ACM TACO 2018", family="swap")
def plan_layrub(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, ahead=1) -> Draft:
    if profile.peak_bytes <= budget_bytes:
        return Draft(actions=[], notes={"offloaded": 0, "why": "the iteration fits the budget: nothing moves"})
    swaps, kept = layrub_swaps(profile, ahead)
    notes = {"layers": len(layer_segments(profile)), "offloaded": len(swaps),
             "offloaded_bytes": sum(profile.tensor_by_id[t].bytes for t, *_ in swaps),
             "kept_resident": kept, "intra_layer_reuse": "not modelled"}
    return Draft(actions=host_swaps(profile, swaps), notes=notes)
