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

The policy (layers, their kinds, offload and prefetch points; ``vdnn_actions``, the plan
of one mode) is the first half of this module, which vdnn++ and cdma reuse.

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

from dataclasses import dataclass, field

from simulator.plan import Action, offload, prefetch
from simulator.profile import Profile

from ..core.api import fits, simulator_for
from ..core.lowering import OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import forward_backward_split

MODES = ("all", "conv", "dyn")
EVERY = "every"   # the fallback: every layer, and the tensors a layer makes for its own backward

FULLY_CONNECTED_WORDS = frozenset({"linear", "addmm", "mm", "matmul"})
SOFTMAX_WORDS = frozenset({"softmax", "softmin"})
SOFTMAX_NAMES = ("cross_entropy", "nll_loss")
ACTIVATION_WORDS = frozenset({"relu", "relu6", "gelu", "silu", "sigmoid", "tanh", "elu", "selu", "celu",
                              "softplus", "mish", "hardswish", "hardsigmoid", "hardtanh", "prelu",
                              "leaky", "glu", "threshold"})
NOT_OFFLOADED_BY_ALL = frozenset({"activation", "softmax", "fc"})


@dataclass
class Layer:
    """One module call: its forward and backward op positions and what kind of layer it is."""
    name: str
    index: int                       # position in forward order
    forward: list[int] = field(default_factory=list)
    backward: list[int] = field(default_factory=list)
    kind: str = "other"              # conv | fc | softmax | activation | other
    backward_start: int | None = None


# ----------------------------------------------------------------------------- layer types


def _words(op_name: str) -> list[str]:
    base = op_name.split("::")[-1].lower()
    return [w for w in base.split("_") if w]


def op_kind(op_name: str) -> str:
    """What kind of layer an op belongs to by its name: conv, fc, softmax, activation, other."""
    words = _words(op_name)
    if any(w.startswith("conv") for w in words):
        return "conv"
    if any(w in FULLY_CONNECTED_WORDS for w in words):
        return "fc"
    lowered = op_name.lower()
    if any(w in SOFTMAX_WORDS for w in words) or any(n in lowered for n in SOFTMAX_NAMES):
        return "softmax"
    if words and all(w in ACTIVATION_WORDS for w in words):
        return "activation"
    return "other"


def layer_kind(op_names: list[str]) -> str:
    """A layer's kind from its forward ops (see the module docstring for the precedence)."""
    kinds = [op_kind(name) for name in op_names]
    for kind in ("conv", "fc", "softmax"):
        if kind in kinds:
            return kind
    if kinds and all(k == "activation" for k in kinds):
        return "activation"
    return "other"


# ----------------------------------------------------------------------------- layers


def split_layers(profile: Profile) -> tuple[list[Layer], bool]:
    """The forward layers in forward order, and whether the profile names modules.

    Ops that share ``module`` form one layer (its backward ops are the backward-phase
    ops with the same module); a forward op with no module is a layer on its own.
    """
    by_module = any(op.module is not None for op in profile.ops)
    layers: dict[str, Layer] = {}
    for i, op in enumerate(profile.ops):
        if op.phase != "forward":
            continue
        key = op.module if op.module is not None else f"op:{op.id}"
        layer = layers.get(key)
        if layer is None:
            layer = layers[key] = Layer(key, len(layers))
        layer.forward.append(i)
    for i, op in enumerate(profile.ops):
        if op.phase == "backward" and op.module is not None and op.module in layers:
            layers[op.module].backward.append(i)
    ordered = list(layers.values())
    for layer in ordered:
        layer.kind = layer_kind([profile.ops[i].name for i in layer.forward])
        layer.backward_start = (min(layer.backward) if layer.backward
                                else _inferred_backward_start(profile, layer))
    return ordered, by_module


def _first_backward_reader(profile: Profile, tensors) -> int | None:
    found = [c for t in tensors for c in profile.consumers[t] if profile.ops[c].phase == "backward"]
    return min(found) if found else None


def _inferred_backward_start(profile: Profile, layer: Layer) -> int | None:
    """Where a layer's backward starts when no backward op names its module: the first
    backward-phase op reading one of its weights, else its non-persistent inputs, else
    its outputs."""
    tensors = profile.tensor_by_id
    reads = {t for i in layer.forward for t in profile.ops[i].inputs}
    writes = {t for i in layer.forward for t in profile.ops[i].outputs}
    weights = sorted(t for t in reads if tensors[t].kind == "weight")
    inputs = sorted(t for t in reads if not tensors[t].persistent)
    for group in (weights, inputs, sorted(writes)):
        start = _first_backward_reader(profile, group)
        if start is not None:
            return start
    return None


def offloads_layer(layer: Layer, mode: str, last_index: int) -> bool:
    """Does vDNN offload this layer's input feature map under ``mode`` (all | conv)?"""
    if layer.index == last_index:
        return False
    if mode == "conv":
        return layer.kind == "conv"
    if mode == "all":
        return layer.kind not in NOT_OFFLOADED_BY_ALL
    return mode == EVERY


# ----------------------------------------------------------------------------- tensors


def input_feature_maps(profile: Profile, layer: Layer, internal: bool = False) -> list[str]:
    """The tensors layer ``layer`` reads that another layer produced (and, ``internal``,
    those its own forward ops make and its backward reads), that are worth and safe to
    offload: non-persistent, non-empty, with a backward use after every forward use
    (in-place updates included)."""
    own = set(layer.forward)
    found: list[str] = []
    for i in layer.forward:
        for tid in profile.ops[i].inputs + (profile.ops[i].outputs if internal else ()):
            tensor = profile.tensor_by_id[tid]
            made_by = profile.producer[tid]
            if tensor.persistent or tensor.bytes == 0 or made_by is None or tid in found:
                continue
            if made_by in own and not internal:
                continue
            if forward_backward_split(profile, tid) is None:
                continue
            found.append(tid)
    return found


def choose_offloads(profile: Profile, layers: list[Layer], mode: str) -> dict[int, list[str]]:
    """Layer index -> the tensors it offloads (each tensor by the first layer that claims it)."""
    last_index = max((layer.index for layer in layers), default=-1)
    claimed: set[str] = set()
    chosen: dict[int, list[str]] = {}
    for layer in layers:
        if not offloads_layer(layer, mode, last_index):
            continue
        mine = [t for t in input_feature_maps(profile, layer, internal=mode == EVERY) if t not in claimed]
        if mine:
            chosen[layer.index] = mine
            claimed.update(mine)
    return chosen


def offload_point(profile: Profile, layer: Layer, tid: str) -> int:
    """The op after which the offload is issued: the one just before the layer's first
    forward op, or the producer or the last forward in-place update if that is later."""
    forward_updates = [u for u in profile.updaters[tid] if profile.ops[u].phase == "forward"]
    return max([profile.producer[tid], min(layer.forward) - 1] + forward_updates)


# ----------------------------------------------------------------------------- prefetch


def find_prefetch_layer(layers: list[Layer], current: int, offloaded: dict[int, list[str]],
                        prefetched: set[int]) -> int | None:
    """vDNN's findPrefetchLayer: from layer ``current - 1`` down, the first layer that was
    offloaded and not yet prefetched; a convolution layer that is not one ends the search."""
    for index in range(current - 1, -1, -1):
        if index in offloaded and index not in prefetched:
            return index
        if layers[index].kind == "conv":
            return None
    return None


def prefetch_triggers(layers: list[Layer], offloaded: dict[int, list[str]]) -> dict[int, int]:
    """Offloaded layer index -> the op after which its prefetch is issued (the op before
    the first backward op of the layer whose backward start found it)."""
    starting = sorted((layer for layer in layers if layer.backward_start is not None),
                      key=lambda layer: (layer.backward_start, -layer.index))
    prefetched: set[int] = set()
    issued_after: dict[int, int] = {}
    for layer in starting:
        found = find_prefetch_layer(layers, layer.index, offloaded, prefetched)
        if found is not None:
            prefetched.add(found)
            issued_after[found] = layer.backward_start - 1
    return issued_after


def prefetch_point(profile: Profile, tid: str, triggered_after: int | None) -> tuple[int, int]:
    """(after, before) op positions of a tensor's prefetch: the trigger's op, kept within
    [last forward use, first backward use - 1]; the latter when nothing triggered it."""
    last_forward, first_backward = forward_backward_split(profile, tid)
    after = first_backward - 1 if triggered_after is None else triggered_after
    after = min(max(after, last_forward), first_backward - 1)
    return after, first_backward


# ----------------------------------------------------------------------------- plans


def vdnn_actions(profile: Profile, mode: str) -> tuple[list[Action], dict]:
    """The actions of vDNN_all or vDNN_conv (``mode``), in issue order, and notes."""
    layers, by_module = split_layers(profile)
    offloaded = choose_offloads(profile, layers, mode)
    triggers = prefetch_triggers(layers, offloaded)
    ops = profile.ops
    keyed: list[Step] = []
    moved = 0
    for index, tensors in sorted(offloaded.items()):
        layer = layers[index]
        for tid in tensors:
            out_at = offload_point(profile, layer, tid)
            after, before = prefetch_point(profile, tid, triggers.get(index))
            if out_at >= before - 1:
                continue   # updated in place up to its backward use: nothing to hide
            keyed.append(Step(out_at, OFFLOAD, index, tid, offload(tid, ops[out_at].id, "host")))
            keyed.append(Step(after, PREFETCH, before, tid, prefetch(tid, ops[after].id, ops[before].id, "host")))
            moved += profile.tensor_by_id[tid].bytes
    notes = {"mode": mode, "layers": "module" if by_module else "one op per layer (profile has no module field)",
             "offloaded_layers": len(offloaded), "offloaded_tensors": sum(len(t) for t in offloaded.values()),
             "offloaded_bytes": moved}
    return issue_order(keyed), notes


# ----------------------------------------------------------------------------- the planner
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
                "Network Design, MICRO 2016", family="swap")
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
