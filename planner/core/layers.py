"""vDNN's layer policy (Rhu et al., MICRO'16, III-B and III-C): a profile split into
layers, the kind of each layer from its op names, what each chosen layer offloads and
which backward layer prefetches it back; ``vdnn_actions`` is the plan of one mode. Shared
by the vdnn, vdnn++ and cdma planners; planner/swap/vdnn.py documents the policy and
every place it departs from the paper.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from simulator.plan import Action, offload, prefetch
from simulator.profile import Profile

from .facts import forward_backward_split
from .lowering import OFFLOAD, PREFETCH, Step, issue_order

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
