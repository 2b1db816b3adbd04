"""``gtbm``: offload after use, prefetch no earlier than two convolution layers ahead,
after GTBM (HPDC 2020, a GPU tensor / buffer manager for CNN training). **The paper itself
was not located**: what is implemented is the description in the project's seed notes
(/work/shared/research/next-wave.md, section 3): a graph constructor, a two-stream tensor
scheduler that offloads a tensor after its use and prefetches it no earlier than two
convolution layers ahead of its next use, a unified GPU memory pool, and tensors typed as
*used once*, *temporary* or *reused*; CNNs only. Every detail below beyond that
description is this module's choice and is listed as a departure.

What it does
------------
- **Tensor types.** *Temporary* (workspaces) and *used once* (a non-persistent tensor
  with no touch after the forward pass) are freed after their use, as the simulator does
  anyway (R7). *Reused* tensors are those made in the forward pass with a later
  (backward or optimizer) touch after all their forward touches
  (planner.shared.facts.forward_backward_split); they are the ones the scheduler moves. Tensors made in
  backward (gradients) are short-lived and stay.
- **Offload after use.** A reused tensor is offloaded to host memory after its last
  forward touch (its producer when no forward op reads it); the d2h stream is the
  scheduler's second stream.
- **Prefetch no earlier than two convolution layers ahead.** Layers are runs of
  consecutive ops with one ``module`` and phase (planner.shared.facts.layer_segments). A backward
  layer is a *convolution layer* when one of its ops is a convolution (a word of the op
  name, ``backward`` and the ``aten::`` / autograd prefixes stripped, starting with
  ``conv``: ``convolution_backward``, ``ConvolutionBackward0``, ``cudnn_convolution``).
  For a tensor first needed again by op ``c``, take the backward convolution layers that
  start before ``c``; the prefetch is issued when the ``conv_ahead``-th last of them
  starts (``prefetch(t, after=<op before its first op>, before=c)``), so the copy
  overlaps at most ``conv_ahead`` (2) convolution layers and the prefetched bytes are
  held no longer than that. With fewer such layers, it is issued when the backward
  pass starts. A tensor whose prefetch point would not come after its offload stays on
  the GPU.
- When the unmodified iteration already fits the budget, nothing moves.

Departures from the paper (as far as it is known), and why
-----------------------------------------------------------
1. **Paper not read.** Only the seed description above was available; the exact
   prefetch rule ("no earlier than two conv layers ahead" is taken as "exactly two
   convolution layers ahead", the earliest the rule allows, which hides the most), the
   tensor typing and the stream assignment are reconstructions.
2. **Unified pool not modelled.** GTBM manages one GPU memory pool for all tensors; the
   simulator counts bytes with no fragmentation (R2), which is what a pool with perfect
   reuse would give, so the pool appears only through the simulator's byte count.
3. **Not only CNNs.** When the backward pass has no convolution layer (a transformer or
   an MLP), the compute-heavy fully connected layers (``linear``, ``addmm``, ``mm``,
   ``matmul``) take their place, and when it has neither, every backward layer counts;
   the notes say which. GTBM targets CNNs only.
4. **Nothing moves when everything fits**, and the policy is not budget-driven
   otherwise: when it cannot fit the budget the plan is returned as it is and
   make_plan marks it infeasible.
5. **Weights and optimizer state stay on the GPU** (``moves_persistent=False``).
"""
from __future__ import annotations

import re
from bisect import bisect_left

from ..core.lowering import host_swaps
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import forward_maps, layer_segments

FULLY_CONNECTED = frozenset({"linear", "addmm", "mm", "matmul"})


def name_words(op_name: str) -> list[str]:
    """The words of an op name with its namespace, ``backward`` and version digits
    stripped: ``autograd::engine::evaluate_function: ConvolutionBackward0`` ->
    ``[convolution]``, ``aten::convolution_backward`` -> ``[convolution]``."""
    base = op_name.split("::")[-1].split(":")[-1].lower()
    base = re.sub(r"backward\d*", " ", base)
    return [w for w in re.split(r"[^a-z0-9]+", base) if w]


def is_conv(op_name: str) -> bool:
    return any(w.startswith("conv") for w in name_words(op_name))


def is_fully_connected(op_name: str) -> bool:
    return any(w in FULLY_CONNECTED for w in name_words(op_name))


def heavy_layers(profile) -> tuple[list[int], str]:
    """First op positions of the backward layers that pace the prefetches, and which
    kind they are: convolution layers, else fully connected ones, else every layer."""
    backward = [(first, last) for first, last in layer_segments(profile) if profile.ops[first].phase == "backward"]
    for kind, test in (("convolution", is_conv), ("fully connected (no convolution in backward)", is_fully_connected)):
        found = [first for first, last in backward if any(test(profile.ops[i].name) for i in range(first, last + 1))]
        if found:
            return found, kind
    return [first for first, _ in backward], "every backward layer (no convolution or fully connected op)"


def gtbm_swaps(profile, conv_ahead: int) -> tuple[list[tuple[str, int, int, int]], int, str]:
    """(tensor, offload after, prefetch after, prefetch before) for every reused tensor,
    how many stay resident, and which layers pace the prefetches."""
    heavy, kind = heavy_layers(profile)
    backward_start = next((i for i, op in enumerate(profile.ops) if op.phase == "backward"), len(profile.ops))
    swaps, kept = [], 0
    for tid, last_forward, c in forward_maps(profile):
        before_c = bisect_left(heavy, c)                  # heavy layers starting before c
        start = heavy[before_c - conv_ahead] if before_c >= conv_ahead else backward_start
        after = min(start - 1, c - 1)
        if after <= last_forward:
            kept += 1
            continue
        swaps.append((tid, last_forward, after, c))
    return swaps, kept, kind


@register("gtbm", "GTBM (from its seed description; paper not located): offload reused tensors after their "
                  "forward use, prefetch no earlier than two convolution layers ahead of the backward use.",
          params=(Param("conv_ahead", 2, "convolution layers of lead for a prefetch (the copy overlaps at most "
                                         "this many)", low=1, high=100000),),
          moves_persistent=False,
          paper="GTBM, HPDC 2020 (paper not located; implemented from the seed description)", family="swap")
def plan_gtbm(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, conv_ahead=2) -> Draft:
    if profile.peak_bytes <= budget_bytes:
        return Draft(actions=[], notes={"offloaded": 0, "why": "the iteration fits the budget: nothing moves"})
    swaps, kept, kind = gtbm_swaps(profile, conv_ahead)
    notes = {"paced_by": kind, "offloaded": len(swaps),
             "offloaded_bytes": sum(profile.tensor_by_id[t].bytes for t, *_ in swaps), "kept_resident": kept,
             "unified_pool": "not modelled (the simulator counts bytes)"}
    return Draft(actions=host_swaps(profile, swaps), notes=notes)
