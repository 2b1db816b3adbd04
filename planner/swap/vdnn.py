"""``vdnn``: layer-wise offload of input feature maps, after vDNN (Rhu, Gimelshein, Clemons,
Zulfiqar, Keckler, "vDNN: Virtualized Deep Neural Networks for Scalable, Memory-Efficient
Neural Network Design", MICRO'16), Section III (III-B memory offloading, III-C memory
prefetching with its ``findPrefetchLayer`` search, III-D the vDNN_all / vDNN_conv /
vDNN_dyn policies).

What it does
------------
A *layer* is the ops of one module call: the ops that share the profile field ``module``
("layer3.fc1"); backward ops of a module carry the same string. Layers are ordered by
their first forward op.

- **Offload** (III-B). Each chosen layer offloads its *input feature map*: the
  non-persistent tensors its forward ops read that an op of another layer produced.
  vDNN_all (``mode=all``) chooses every layer except activation, softmax and
  fully-connected layers and the last layer; vDNN_conv (``mode=conv``) only convolution
  layers. The offload goes to host memory and is issued when the layer's forward starts:
  after the op just before the layer's first forward op, or after the tensor's producer
  if that comes later (a layer whose ops are not contiguous); either way the copy
  overlaps the layer's own forward and the layer reads the tensor inside the offload's
  window (R11). A tensor read by several chosen layers is offloaded once, by the first.
- **Prefetch** (III-C). When the backward of layer ``l`` starts, vDNN prefetches the
  nearest earlier layer (in forward order, searching ``l-1, l-2, ...``) that was
  offloaded and not yet prefetched, and never searches past a convolution layer: a
  convolution layer is itself still a candidate, but if it is not one the search stops
  there (the paper's findPrefetchLayer). Here that is
  ``prefetch(t, after=<op before layer l's first backward op>, before=<first backward use of t>)``
  for each tensor the found layer offloaded. Backward triggers are taken in the order
  the layers' backward passes start.
- **vDNN_dyn** (``mode=dyn``, III-D) tries, in order, no offload, vDNN_conv, vDNN_all,
  each scored by the simulator (simulator.api.simulate) at the budget, and keeps the
  first that runs within it; when none does it returns vDNN_all (the most memory-saving
  one), which make_plan then marks infeasible.
- Weights, optimizer state and inputs stay on the GPU (moves_persistent=False).

Recognising layer types from op names (forward ops only; the name after ``::`` is split
on ``_`` into words):

- convolution: a word starting with ``conv`` (``cudnn_convolution``, ``conv2d``,
  ``convolution``, ``conv_transpose2d``);
- fully connected: a word ``linear``, ``addmm``, ``mm`` or ``matmul`` (``bmm`` and
  ``baddbmm``, the batched products inside attention, are not fully connected);
- softmax: a word ``softmax`` / ``softmin``, or ``cross_entropy`` / ``nll_loss`` in the
  name (Caffe's SoftmaxWithLoss, the layer vDNN's networks end with);
- activation: every forward op of the layer is one of relu, relu6, gelu, silu, sigmoid,
  tanh, elu, selu, celu, softplus, mish, hardswish, hardsigmoid, hardtanh, prelu,
  leaky_relu, glu, threshold.

A layer is a convolution layer if any of its forward ops is one; otherwise fully
connected if any is; otherwise softmax if any is; otherwise an activation layer if all
are; otherwise "other" (offloaded by vDNN_all).

The policy (layers, their kinds, offload and prefetch points) is planner/core/layers.py,
which vdnn++ and cdma reuse.

Departures from the paper, and why
----------------------------------
1. **No sync at layer boundaries.** vDNN synchronises the offload stream at the end of
   each layer's forward (and waits for the prefetch at the start of each backward layer)
   so that a buffer is released exactly then. The simulator has no such barrier: a GPU
   copy is released as soon as its copy and its last reader in the window have ended
   (R11), and compute waits only for memory (R6) or for prefetches (R12). Plans are
   therefore at least as fast as vDNN's, never slower for lack of a barrier.
2. **On-demand fetches.** When no search reached a layer before its first backward use
   (the search was stopped by a convolution layer, or the layer's backward begins before
   the trigger), vDNN would fetch it when the layer needs it; here the prefetch is
   issued after the op just before the tensor's first backward use (synchronous). A
   triggered prefetch is also moved no later than that op and no earlier than the
   tensor's last forward use, so the plan never reads a tensor while it is away (R13).
3. **The last layer is skipped in both modes** (the paper states it for vDNN_all; an
   offload of the last layer's input could not overlap anything in vDNN_conv either).
4. **Only tensors with a backward use are offloaded**, and only when every forward use
   comes before every backward use. In vDNN an input not needed by backward is simply
   freed. A tensor updated in place during the forward pass (PyTorch's ``relu_``,
   ``add_``) is offloaded after its last forward update rather than before its layer
   (R11 forbids an update inside the window), and not at all when no op would run
   between that point and its first backward use.
5. **vDNN_dyn has no memory-optimal / performance-optimal split.** The paper first checks
   vDNN_all with memory-optimal convolution algorithms (the least workspace), then tries
   none, conv and all with performance-optimal algorithms, then downgrades layers
   greedily. A profile fixes one kernel (time and workspace) per op, so there is no
   algorithm to choose: the memory-optimal check and the greedy per-layer downgrade have
   nothing to act on, and the "fits" test is the simulator's own feasibility (which
   includes timing), not a memory-only estimate.
7. **Fallback** (``fallback``, on by default; not in the paper). When vDNN_all (or
   vDNN_dyn's choice) does not fit, the same offload and prefetch rules are applied to
   every layer but the last (activation, softmax and fully-connected layers included),
   and each layer also offloads the tensors its own forward ops make that its backward
   reads (GPT-2's MLP keeps its GELU input and output for backward: vDNN_all never moves
   them, and cannot fit GPT-2 at 50% of its peak). The plan is kept only if it fits, and
   its status is ``fallback``.
6. **No module field.** When ops carry no ``module``, each forward op is its own layer
   (the plan's notes say ``layers: one op per layer``). Its backward is then taken to
   start at the first backward-phase op that reads one of its weights, else one of its
   non-persistent inputs, else one of its outputs; backward ops without a module belong
   to no layer. Layers of a module with no backward ops use the same rule.
"""
from __future__ import annotations

from simulator.plan import Action

from ..core.api import fits, simulator_for
from ..core.layers import EVERY, MODES, vdnn_actions
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register

def dynamic_actions(sim, budget_bytes: int) -> tuple[list[Action], dict]:
    """vDNN_dyn: the first of none, conv, all that the simulator (``sim``) finds within
    the budget (all when none is)."""
    profile = sim.profile
    tried = []
    for choice in ("none", "conv", "all"):
        actions, notes = ([], {"mode": "none"}) if choice == "none" else vdnn_actions(profile, choice)
        tried.append(choice)
        if fits(sim, budget_bytes, actions):
            return actions, {**notes, "mode": "dyn", "dyn_choice": choice, "tried": tried}
    actions, notes = vdnn_actions(profile, "all")
    return actions, {**notes, "mode": "dyn", "dyn_choice": "all (none fits)", "tried": tried}


@register("vdnn", "vDNN: offload each layer's input feature map in forward, prefetch one layer ahead "
                  "in backward (all / conv / dyn).",
          params=(Param("mode", "all", "all: every layer but activation/softmax/fc/last; conv: convolution "
                                       "layers only; dyn: first of none, conv, all that fits", choices=MODES),
                  Param("fallback", True, "when all (or dyn) does not fit: also offload activation, softmax "
                                          "and fully-connected layers' inputs and what each layer keeps for "
                                          "its own backward, by the same rules (marked fallback)")),
          moves_persistent=False,
          paper="Rhu et al., vDNN: Virtualized Deep Neural Networks for Scalable, Memory-Efficient Neural "
                "Network Design, MICRO 2016")
def plan_vdnn(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, mode="all", fallback=True):
    sim = simulator_for(profile, hardware, options)
    if mode == "dyn":
        actions, notes = dynamic_actions(sim, budget_bytes)
    else:
        actions, notes = vdnn_actions(profile, mode)
    if fallback and mode != "conv" and not fits(sim, budget_bytes, actions):
        wider, wider_notes = vdnn_actions(profile, EVERY)
        if fits(sim, budget_bytes, wider):
            return Draft(actions=wider, status="fallback",
                         notes={**wider_notes, "mode": mode, "fallback": "vDNN's rules do not fit the budget: "
                                "every layer's inputs and saved tensors offloaded"})
    return Draft(actions=actions, notes=notes)
