"""``gist``: stashed feature maps kept encoded on the GPU between their forward and backward
uses, after Gist (Jain, Phanishayee, Mars, Tang, Pekhimenko, "Gist: Efficient Data
Encoding for Deep Neural Network Training", ISCA'18).

What it does
------------
A stashed feature map is an activation whose forward uses all come before its backward
uses (planner/shared/facts.py ``forward_backward_split``). Between its last forward use and its
first backward use Gist keeps it encoded, in the first of these that applies:

- **Binarize** (lossless): a ReLU output whose every later use is ReLU's backward
  (``threshold_backward``, which only asks whether each value was positive) keeps one
  bit per element (R40 ``binarize``);
- **Sparse storage, dense compute** (lossless): a sparse map is kept in a sparse format
  (here zero-value compression, the codec of format ``zvc``) when that saves at least
  ``min_saving`` of its bytes at the profile's measured density;
- **Delayed precision reduction** (lossy, only with ``allow_lossy``): any other fp32 map
  is kept in half precision (the codec of format ``fp16``) for its stashed interval; its
  forward use saw full precision.

Each is an ``encode`` after the last forward use and a ``decode`` before the first
backward use (R42: the encode allocates the encoded copy and frees the map, the decode
the reverse; both are kernels on the compute stream at the codec's throughputs). Gist
does not aim at a budget: it reduces the footprint wherever it can, and the simulator
says whether the result fits. The notes give the footprint reduction (the peak without
a plan over the plan's peak, both unbounded), beside the paper's 1.8x average.

Departures from the paper, and why
----------------------------------
1. **Binarize's condition is R40's**: every later use must be a ReLU backward. In
   Gist (CNTK) a ReLU output feeding max-pool is binarized, the pool's backward
   rewritten to use the bit mask; PyTorch's pool backward reads the pool's input
   itself, which a bit mask cannot serve, so such maps are not binarized here.
2. **Sparse storage is zero-value compression**, not Gist's CSR-like format with narrow
   indices; its size follows R40's formula at the measured density (``swapplan trace
   --density``). Without a measured density (1), no map is sparse.
3. **Delayed precision reduction keeps fp16** (Gist picks 8 to 16 bits per layer by
   measured accuracy); it is lossy and needs ``allow_lossy`` (the plan says so, R40).
4. **Inplace optimisations are not modelled** (Gist's further cuDNN and allocator
   changes, up to 4.1x in the paper): only the encodings.
5. **A budget** (not in the paper, which only shrinks the footprint): when the
   encodings alone do not fit, ``fallback`` (a swap planner, ``capuchin`` by default)
   plans the budget, and Gist's encodings are added for the stashed maps that plan
   neither moves nor recomputes (nor reads while recomputing another); the status is
   then ``fallback``. ``fallback=off`` keeps Gist pure.
"""
from __future__ import annotations

from dataclasses import replace

from simulator.api import Simulator
from simulator.model.codecs import compressed_bytes
from simulator.plan import Plan, decode, encode
from simulator.profile import profile_sha256

from ..core.api import score, simulator_for
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, get_planner, register
from ..shared.compression import may_encode, pick_codec
from ..shared.facts import forward_backward_split


def stashed_maps(profile) -> list[tuple[str, int, int]]:
    """(tensor, last forward use, first backward use) of each stashed feature map with at
    least one op between the two uses, in the order of their last forward use."""
    found = []
    for tensor in profile.tensors:
        if tensor.persistent or tensor.bytes == 0 or profile.producer[tensor.id] is None:
            continue
        split = forward_backward_split(profile, tensor.id)
        if split is not None and split[1] - split[0] > 1:
            found.append((tensor.id, *split))
    found.sort(key=lambda item: (item[1], item[0]))
    return found


def choose_encodings(profile, hardware, binarize: bool, sparse: bool, min_saving: float, allow_lossy: bool):
    """Per stashed map, the codec Gist keeps it in (binarize, then sparse, then reduced
    precision), as (tensor, last forward use, first backward use, codec, which)."""
    codecs = {
        "binarize": pick_codec(hardware, "auto", "gist", where="compute", formats=("binarize",)) if binarize else None,
        "sparse": pick_codec(hardware, "auto", "gist", where="compute", formats=("zvc",)) if sparse else None,
        "precision": pick_codec(hardware, "auto", "gist", where="compute", formats=("fp16",)) if allow_lossy else None,
    }
    chosen = []
    for tid, last_forward, first_backward in stashed_maps(profile):
        tensor = profile.tensor_by_id[tid]
        for which, codec in codecs.items():
            if codec is None or not may_encode(profile, tid, codec, last_forward, allow_lossy):
                continue
            if which == "sparse" and compressed_bytes(tensor, codec) > (1 - min_saving) * tensor.bytes:
                continue
            if which == "precision" and (tensor.dtype or "fp32") != "fp32":
                continue
            chosen.append((tid, last_forward, first_backward, codec, which))
            break
    return chosen, codecs


def unbounded_peak(profile, hardware, actions, allow_lossy: bool) -> int:
    """The peak of a plan with memory to spare (the footprint it needs)."""
    room = 2**52
    big = replace(hardware, gpu=replace(hardware.gpu, memory_bytes=room))
    plan = Plan(profile.name, tuple(actions), profile_sha256=profile_sha256(profile), allow_lossy=allow_lossy)
    return Simulator(profile, big).simulate(plan, room).peak_bytes


def encoding_actions(profile, chosen) -> list:
    """Encodes after the last forward uses, then decodes before the first backward uses."""
    ops = profile.ops
    encodes = [encode(tid, ops[last].id, codec.name) for tid, last, _, codec, _ in chosen]
    decodes = sorted(((first, tid, codec) for tid, _, first, codec, _ in chosen), key=lambda d: (d[0], d[1]))
    return encodes + [decode(tid, ops[first].id, codec.name) for first, tid, codec in decodes]


def untouched(profile, chosen, actions) -> list:
    """The encodings whose tensor a swap plan's ``actions`` neither move nor recompute,
    nor read by recomputing another tensor."""
    busy = {a.tensor for a in actions}
    for action in actions:
        if action.kind == "recompute":
            made_by = profile.producer[action.tensor]
            busy.update(profile.ops[made_by].inputs)
    return [item for item in chosen if item[0] not in busy]


@register("gist", "Gist: stashed feature maps kept encoded on the GPU between forward and backward "
                  "(binarized ReLU outputs, sparse maps, reduced precision with allow_lossy).",
          params=(Param("binarize", True, "binarize ReLU outputs used later only by ReLU backward"),
                  Param("sparse", True, "keep sparse maps in zero-value compression"),
                  Param("min_saving", 0.1, "a sparse map is encoded when that saves at least this share of its "
                                           "bytes", low=0.0, high=1.0),
                  Param("allow_lossy", False, "delayed precision reduction: other fp32 maps kept in fp16 "
                                              "(lossy)"),
                  Param("fallback", "capuchin", "when the encodings alone do not fit the budget: this swap "
                                                "planner's plan, with the encodings it leaves room for (off: "
                                                "Gist alone)")),
          recomputes=True,    # its fallback (capuchin by default) may recompute: the bound must allow it
          paper="Jain et al., Gist: Efficient Data Encoding for Deep Neural Network Training, ISCA 2018",
          family="compression")
def plan_gist(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, binarize=True, sparse=True,
              min_saving=0.1, allow_lossy=False, fallback="capuchin"):
    chosen, codecs = choose_encodings(profile, hardware, binarize, sparse, min_saving, allow_lossy)
    actions = encoding_actions(profile, chosen)
    status, base = "heuristic", None
    lossy_of = lambda items: allow_lossy and any(item[4] == "precision" for item in items)  # noqa: E731
    sim = simulator_for(profile, hardware, options)
    if fallback != "off" and not score(sim, budget_bytes, actions, allow_lossy=lossy_of(chosen)).ok:
        spec = get_planner(fallback)
        base = spec.func(profile, hardware, budget_bytes, options=options, **spec.resolve({}))
        kept = untouched(profile, chosen, base.actions)
        combined = list(base.actions) + encoding_actions(profile, kept)
        if score(sim, budget_bytes, combined, allow_lossy=lossy_of(kept)).ok:
            chosen, actions, status = kept, combined, "fallback"
        elif score(sim, budget_bytes, list(base.actions)).ok:
            chosen, actions, status = [], list(base.actions), "fallback"
    counts = {which: sum(1 for item in chosen if item[4] == which) for which in codecs}
    saved = sum(profile.tensor_by_id[tid].bytes - compressed_bytes(profile.tensor_by_id[tid], codec)
                for tid, _, _, codec, _ in chosen)
    notes = {"encoded": counts, "bytes_saved_while_stashed": saved,
             "codecs": {which: (codec.name if codec else None) for which, codec in codecs.items()}}
    lossy = allow_lossy and counts.get("precision", 0) > 0
    if chosen:
        encodings = encoding_actions(profile, chosen)
        before, after = profile.peak_bytes, unbounded_peak(profile, hardware, encodings, lossy)
        notes["footprint_reduction"] = round(before / after, 3) if after else None
        notes["paper_footprint_reduction"] = 1.8
    if status == "fallback":
        notes["fallback"] = (f"the encodings alone do not fit the budget: {fallback}'s plan with the "
                             f"{len(chosen)} encodings it leaves room for")
    return Draft(actions=actions, notes=notes, allow_lossy=lossy, status=status,
                 schedule=base.schedule if status == "fallback" else None,
                 initial=base.initial if status == "fallback" else {})
