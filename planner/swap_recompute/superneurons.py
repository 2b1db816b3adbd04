"""``superneurons``: liveness, a unified tensor pool (offload of convolution outputs) and
cost-aware recomputation, after Wang, Ye, Zhao, Wu, Song, Xu, Li, Kraska, "SuperNeurons:
Dynamic GPU Memory Management for Training Deep Neural Networks", PPoPP 2018.

The paper's rules
-----------------
1. **Liveness analysis**: a tensor is freed after its last use. The simulator already
   does this for every plan (R7, R8), so the planner has nothing to add.
2. **Unified Tensor Pool (UTP)**: only the outputs of convolution layers are offloaded to
   host memory, because only their transfers overlap enough compute; the GPU side is an
   LRU tensor cache, and in backward the tensors of the layer ahead are prefetched.
3. **Cost-aware recomputation**: the layers that are expensive to compute (CONV, FC) and
   the structural ones (JOIN, FORK, CONCAT) are *checkpoints*, whose outputs are kept
   (or moved by the UTP); the cheap layers between two checkpoints (pooling,
   activation, BN, LRN, dropout) form a *segment*, and their outputs are freed after
   forward and recomputed in backward. Per segment, *speed-centric* recomputation
   re-runs the segment once and keeps its outputs for the segment's whole backward;
   *memory-centric* re-runs, for each backward layer, what that layer needs, and frees
   it after. The paper takes speed-centric unless the segment's recomputed memory is
   larger than the peak layer memory ``l_peak`` (the largest memory one layer needs),
   then memory-centric.

Mapping to this project
-----------------------
- A *layer* is one forward op. Its kind comes from its name (after the namespace,
  ``aten::``, before an overload, ``.Tensor``, split on ``_``): CONV for a word ``conv``,
  ``convolution`` or ``conv`` with a number (``conv2d``; not ``convert``); FC for
  ``linear``, ``addmm``, ``mm``, ``matmul``, ``bmm``, ``baddbmm``, ``addbmm``, ``einsum``
  and any ``attention`` kernel (a transformer's attention is its other heavy GEMM layer);
  CONCAT for ``cat``, ``concat``, ``concatenate``, ``stack``. From the graph: JOIN when
  the op reads or updates two or more activations (a residual add, an element-wise
  product of two branches), FORK when one of its outputs is read by two or more forward
  ops. Everything else is cheap. The checkpoints split the forward pass into segments (a
  checkpoint and the cheap layers after it).
- **Recompute**: an output of a cheap forward op that the backward pass reads is dropped
  after its last forward use and ``recompute``\\d before backward needs it. The cheap
  intermediates backward does not read (a BN output that only its ReLU reads) are
  *sources*: dropped after their last forward use and recomputed only when the recompute
  of another tensor reads them, as re-running the segment from its checkpoint remakes
  them. The walk over the backward ops that places the recomputes (``_Walk``) follows
  the segment's mode: speed-centric recomputes every tensor of the segment still needed,
  the first time one of them must be recomputed, and keeps them; memory-centric
  recomputes a tensor (and the cheap tensors it is made from) before each backward op
  that reads it, and drops it again after, unless the next read is the very next op.
- **Offload**: outputs of CONV layers (and, with ``fc`` on, FC/attention layers) that the
  backward pass reads are ``offload``\\ed to host after their last forward write (R11: a
  window may not contain an update; PyTorch's in-place ``relu_`` writes a BN output)
  and ``prefetch``\\ed before their first backward read, or before the first recompute
  that reads them, whichever is first. The prefetch is issued ``ahead`` candidates
  early: when the backward reaches the ``ahead``-th offload candidate needed before it,
  or at the end of the forward pass when there are fewer (the paper's one layer ahead is
  ``ahead=1``; 0 is on demand), and later than that if the op-level memory estimate
  (planner/shared/estimate.py) has no room for it yet, never before an earlier-needed one.
- **Choice** (``recompute=auto``, ``offload=lru``, ``ahead=-1``): nothing when the profile
  fits; otherwise, for each recomputation mode (``off``, all speed-centric, the paper's
  rule per segment, all memory-centric) and each prefetch distance of 1, 2, 4, ... and
  all at the end of the forward pass, the fewest offloads that fit, in LRU eviction
  order; of those plans, the fastest the simulator runs within the budget (ties: the
  mode earlier in that list, then fewer offloads). ``off`` is spelt so because the
  parameter parser reads ``none`` as a missing value.

Departures from the paper, and why
----------------------------------
1. **The LRU cache becomes "offload only when the budget needs it, in the order an LRU
   cache would evict".** SuperNeurons decides at run time: a conv output stays in the
   GPU cache until memory runs out, then the least recently used one is evicted. In a
   plan the same decisions are made ahead: the conv outputs are ranked by their last
   forward use (the least recently used first, the order an LRU cache evicts them in
   during forward), and the planner offloads the shortest prefix of that ranking with
   which the simulator runs the plan within the budget (a binary search over its
   length). The tensors used last in forward, which backward needs first, stay on the
   GPU: the cache hits of the paper. ``offload=all`` offloads every candidate (the pool
   with a cache of size zero), ``offload=off`` none.
2. **The recomputation mode is chosen by simulation, not only by the ``l_peak`` rule.**
   The paper's rule is one of the candidates (``paper``); all-speed, all-memory and no
   recomputation are the others (``recompute`` forces one). The paper recomputes
   whatever the budget; here nothing is done when the profile fits, and a plan with no
   recomputation wins when its offloads hide behind compute.
3. **The prefetch distance is tuned** (``ahead=-1``, the default). One layer ahead
   leaves the copy engine idle whenever a layer's backward is shorter than its
   tensor's transfer, which is most of the time when a large share of the activations
   moves: ResNet-50 at 40 GiB on an A100 (PCIe 4) runs at 117.6% overhead with
   ``ahead=1`` and 78.8% with the prefetches issued as early as memory allows. The
   paper's distance is the first value tried and wins ties; ``ahead=N`` fixes it.
4. **The simulator's recompute rules (R15) decide what is cheap enough to recompute**: a
   tensor whose producer updates something in place (PyTorch's ``native_batch_norm``
   updates its running statistics), that is updated in place after it is made
   (``relu_`` on a BN output), or whose producer reads a tensor that is gone or was
   changed in place by the time of the recompute (GPT-2's dropout masks: the projection
   they are made from is not kept for backward, and is a checkpoint, never recomputed),
   is kept. The walk checks this as it places the recomputes and starts again without
   the tensor that failed, until no check fails (a fixed point, as
   ``core.checkpoint.droppable`` does). On ResNet this leaves nothing to recompute:
   SuperNeurons' own framework re-runs BN and ReLU freely.
5. **Fallback** (``fallback``, on by default; not in the paper). When even every
   candidate offloaded does not fit (ResNet-50 at 40 GiB: its BN outputs, which cannot
   be recomputed here, hold half the activations; GPT-2: its residual sums and GELU
   products are JOIN outputs), the offload candidates are widened to every forward
   output the backward reads that is not recomputed (JOIN, FORK, CONCAT and the cheap
   outputs R15 keeps), in the same LRU order, and the plan's status is ``fallback``.
6. **No layer barriers or cache bookkeeping.** Copies overlap compute as the simulator's
   streams allow (R1, R11, R12): a GPU copy is released when its offload and its last
   reader in the window end, not at a layer boundary.
7. **FC outputs are offloaded too** (``fc``, on by default): the paper's networks are
   CNNs, where FC layers are small; in transformers the FC and attention outputs are
   the heavy layers whose transfers overlap compute, the role convolutions play in a CNN.
8. Weights, optimizer state and inputs stay on the GPU (moves_persistent=False); copies go
   to host memory only (the paper has no SSD tier). Convolution workspaces are the
   profile's (the paper picks a cuDNN algorithm by free memory).
9. Every candidate plan is simulated; one the simulator finds invalid is never returned
   (the empty plan, always valid, is the last resort), so a plan is feasible or reported
   infeasible, never invalid.
"""
from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field

from simulator.api import Simulator
from simulator.model.recompute import recompute_problem, recompute_scratch
from simulator.plan import Action, Plan, drop, offload, prefetch, recompute
from simulator.profile import Profile

from ..core.lowering import DROP, OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.estimate import MemoryEstimate
from ..shared.facts import working_set

OFF = "off"          # not "none": the parameter parser reads none as a missing value
RECOMPUTE_MODES = ("auto", OFF, "speed", "paper", "memory")
OFFLOAD_MODES = ("lru", "all", OFF)
SPEED, MEMORY = "speed", "memory"
CHECKPOINTS = frozenset({"conv", "fc", "join", "fork", "concat"})
FC_WORDS = frozenset({"linear", "addmm", "mm", "matmul", "bmm", "baddbmm", "addbmm", "einsum"})
CONCAT_WORDS = frozenset({"cat", "concat", "concatenate", "stack"})


# ----------------------------------------------------------------------------- layer kinds


def name_words(op_name: str) -> list[str]:
    """The words of an op's name without namespace or overload (``aten::add_.Tensor`` ->
    ``add``; ``aten::_scaled_dot_product_efficient_attention`` -> scaled, dot, ...)."""
    base = op_name.lower().rsplit("::", 1)[-1].split(".", 1)[0]
    return [w for w in base.split("_") if w]


CONV_WORD = re.compile(r"conv(olution)?(\d+d?)?")    # conv, conv2d, convolution; not convert


def name_kind(op_name: str) -> str | None:
    """conv, fc or concat when the op's name says so; None otherwise."""
    words = name_words(op_name)
    if any(CONV_WORD.fullmatch(w) for w in words):
        return "conv"
    if any(w in FC_WORDS for w in words) or any("attention" in w for w in words):
        return "fc"
    if any(w in CONCAT_WORDS for w in words):
        return "concat"
    return None


@dataclass
class Layers:
    """The forward pass as SuperNeurons sees it: each forward op's kind and segment."""
    last_forward: int                                     # position of the last forward op (-1: none)
    kind: dict[int, str] = field(default_factory=dict)    # conv | fc | concat | join | fork | cheap
    segment: dict[int, int] = field(default_factory=dict)  # checkpoints before (or at) the op


def forward_layers(profile: Profile) -> Layers:
    """Kinds and segments of the forward ops (see the module docstring)."""
    forward = [i for i, op in enumerate(profile.ops) if op.phase == "forward"]
    layers = Layers(max(forward, default=-1))
    tensors = profile.tensor_by_id
    seg = 0
    for i in forward:
        op = profile.ops[i]
        kind = name_kind(op.name)
        if kind is None:
            activations = {t for t in op.inputs + op.updates if not tensors[t].persistent}
            readers = [{c for c in profile.consumers[t] if c <= layers.last_forward and c != i} for t in op.outputs]
            kind = "join" if len(activations) >= 2 else "fork" if any(len(r) >= 2 for r in readers) else "cheap"
        if kind in CHECKPOINTS:
            seg += 1
        layers.kind[i], layers.segment[i] = kind, seg
    return layers


# ----------------------------------------------------------------------------- tensors


def backward_touches(profile: Profile, tid: str, last_forward: int) -> list[int]:
    """Op positions after the forward pass that read or update the tensor, in order."""
    return sorted({u for u in profile.consumers[tid] + profile.updaters[tid] if u > last_forward})


def forward_touch(profile: Profile, tid: str, last_forward: int) -> int:
    """The last forward op that makes, reads or updates the tensor."""
    uses = [u for u in profile.consumers[tid] + profile.updaters[tid] if u <= last_forward]
    return max(uses + [profile.producer[tid]])


def saved_for_backward(profile: Profile, layers: Layers) -> list[str]:
    """Non-empty activations a forward op makes and the backward pass touches, by producer."""
    found = [t.id for t in profile.tensors
             if not t.persistent and t.bytes > 0 and profile.producer[t.id] in layers.kind
             and backward_touches(profile, t.id, layers.last_forward)]
    return sorted(found, key=lambda t: (profile.producer[t], t))


def _recomputable(profile: Profile, layers: Layers, tid: str) -> bool:
    """Made by a cheap forward op, and R15 lets it be recomputed (``recompute_problem``:
    its producer updates nothing, and it is never updated in place)."""
    return layers.kind.get(profile.producer[tid]) == "cheap" and recompute_problem(profile, tid) is None


def recompute_candidates(profile: Profile, layers: Layers) -> dict[str, int]:
    """Tensor -> segment, for the outputs of cheap layers that the backward pass reads and
    R15 lets be recomputed."""
    return {tid: layers.segment[profile.producer[tid]] for tid in saved_for_backward(profile, layers)
            if _recomputable(profile, layers, tid)}


def recompute_sources(profile: Profile, layers: Layers) -> dict[str, int]:
    """Tensor -> segment, for the other outputs of cheap layers R15 lets be recomputed:
    the intermediates of a segment that backward does not read (a BN output that only
    its ReLU reads). They are recomputed only when the recompute of a candidate reads
    them, the way re-running the segment from its checkpoint remakes them."""
    found = {}
    for tensor in profile.tensors:
        tid = tensor.id
        if not tensor.persistent and profile.producer[tid] in layers.kind \
                and not backward_touches(profile, tid, layers.last_forward) and _recomputable(profile, layers, tid):
            found[tid] = layers.segment[profile.producer[tid]]
    return found


def segment_modes(profile: Profile, candidates: dict[str, int], segments: set[int], choice: str) -> dict[int, str]:
    """Segment -> speed or memory for each of ``segments``: all one way, or (``paper``)
    speed-centric unless the bytes of the segment's recomputed ``candidates`` exceed
    l_peak, the largest single-op working set of activations."""
    if choice != "paper":
        return {s: choice for s in sorted(segments)}
    l_peak = max((working_set(profile, i, include_persistent=False) for i in range(len(profile.ops))), default=0)
    held: dict[int, int] = {}
    for tid, seg in candidates.items():
        held[seg] = held.get(seg, 0) + profile.tensor_by_id[tid].bytes
    return {s: SPEED if held.get(s, 0) <= l_peak else MEMORY for s in sorted(segments)}


# ----------------------------------------------------------------------------- recompute walk


class NotRecomputable(Exception):
    """A recompute that would read a tensor gone or changed by then (R15, or a wrong value)."""

    def __init__(self, tensor: str):
        super().__init__(tensor)
        self.tensor = tensor


@dataclass
class Walked:
    """Where the recomputes go: drops (after, tensor, the op it is recomputed before),
    recomputes (before, producer, tensor), the first op before which a recompute reads
    each kept or offloaded source, and for each dropped tensor the op ranges [lo, hi) it
    is on the GPU (for the memory estimate)."""
    drops: list[tuple[int, str, int]] = field(default_factory=list)
    recomputes: list[tuple[int, int, str]] = field(default_factory=list)
    needed_at: dict[str, int] = field(default_factory=dict)
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


class _Walk:
    """One pass over the backward ops placing drops and recomputes for ``dropped``
    (candidates and sources, tensor -> segment)."""

    def __init__(self, profile: Profile, last_forward: int, dropped: dict[str, int], modes: dict[int, str]):
        self.profile, self.dropped, self.modes = profile, dropped, modes
        self.state = {t: "forward" for t in dropped}      # forward | gpu | away
        self.held = {t: forward_touch(profile, t, last_forward) for t in dropped}
        self.direct = {t: True for t in dropped}           # is op ``held`` itself a reader?
        self.members: dict[int, list[str]] = {}
        for tid in sorted(dropped, key=lambda t: (profile.producer[t], t)):
            self.members.setdefault(dropped[tid], []).append(tid)
        self.out = Walked()

    def run(self, last_forward: int) -> Walked:
        """Every backward op in order: make the dropped tensors it reads resident."""
        for u in range(last_forward + 1, len(self.profile.ops)):
            for tid in dict.fromkeys(self.profile.ops[u].inputs):
                if tid in self.dropped:
                    self.ensure(tid, u, True)
        self._spans()
        return self.out

    def _spans(self) -> None:
        """Each dropped tensor's GPU ranges: producer to its first drop, each recompute to
        the next drop, the last recompute to its last read (up to the op whose recompute
        reads it last, not including that op: it is freed after that recompute)."""
        gaps: dict[str, list[tuple[int, int]]] = {}
        for after, tid, before in self.out.drops:
            gaps.setdefault(tid, []).append((after, before))
        for tid, between in gaps.items():
            spans, start = [], self.profile.producer[tid]
            for after, before in sorted(between):
                spans.append((start, after + 1))
                start = before
            spans.append((start, self.held[tid] + (1 if self.direct[tid] else 0)))
            self.out.spans[tid] = spans

    def ensure(self, tid: str, u: int, direct: bool) -> None:
        """Make ``tid`` resident before op ``u`` (which reads it, ``direct``, or a recompute
        before it does): keep it, or drop it after its last touch and recompute it (with
        its segment, when speed-centric)."""
        speed = self.modes[self.dropped[tid]] == SPEED
        state, held = self.state[tid], self.held[tid]
        if (state == "gpu" and speed) or (state != "away" and held >= u - 1):
            self.direct[tid] = direct or (held == u and self.direct[tid])
            self.state[tid], self.held[tid] = "gpu", u
            return
        group = [tid]
        if state != "away":
            self.leave(tid, u)
        if speed:
            for other in self.members[self.dropped[tid]]:
                if other != tid and self.state[other] == "forward" and \
                        any(c >= u for c in self.profile.consumers[other]):
                    if self.held[other] >= u - 1:
                        self.state[other] = "gpu"
                    else:
                        self.leave(other, u)
                        group.append(other)
        for member in sorted(group, key=lambda t: (self.profile.producer[t], t)):
            self.rebuild(member, u)
        self.direct[tid] = direct or self.direct[tid]

    def leave(self, tid: str, u: int) -> None:
        """Drop ``tid`` after its last touch (it is recomputed before op ``u``)."""
        self.out.drops.append((self.held[tid], tid, u))
        self.state[tid] = "away"

    def rebuild(self, tid: str, u: int) -> None:
        """Recompute ``tid`` before op ``u``, its dropped sources first."""
        if self.state[tid] == "gpu" and self.held[tid] == u:
            return
        profile = self.profile
        made_by = profile.producer[tid]
        for src in dict.fromkeys(profile.ops[made_by].inputs):
            if profile.tensor_by_id[src].persistent:
                continue
            if src in self.dropped:
                self.ensure(src, u, False)
                continue
            last = profile.last_use[src]
            if last is None or last < u or any(made_by < w < u for w in profile.updaters[src]):
                raise NotRecomputable(tid)
            self.out.needed_at.setdefault(src, u)
        self.out.recomputes.append((u, made_by, tid))
        self.state[tid], self.held[tid], self.direct[tid] = "gpu", u, False


def settle(profile: Profile, last_forward: int, dropped: dict[str, int],
           modes: dict[int, str]) -> tuple[dict[str, int], Walked]:
    """The walk for the largest subset of ``dropped`` whose recomputes all read what they
    need: a tensor that fails is kept and the walk starts again (a fixed point)."""
    dropped = dict(dropped)
    while True:
        try:
            return dropped, _Walk(profile, last_forward, dropped, modes).run(last_forward)
        except NotRecomputable as failed:
            del dropped[failed.tensor]


# ----------------------------------------------------------------------------- offload


def first_need(profile: Profile, tid: str, last_forward: int, walked: Walked) -> int:
    """The first backward op that touches the tensor, or before which a recompute reads it."""
    return min(backward_touches(profile, tid, last_forward) + [walked.needed_at.get(tid, len(profile.ops))])


def offload_candidates(profile: Profile, layers: Layers, dropped: dict[str, int], walked: Walked,
                       kinds: frozenset[str], wide: bool) -> list[str]:
    """Tensors the pool may offload, in LRU eviction order (least recently used in forward
    first): outputs of ``kinds`` layers (every layer, ``wide``) that are not recomputed,
    with at least one op between their last forward touch and their first backward need."""
    found = []
    for tid in saved_for_backward(profile, layers):
        if tid in dropped or not (wide or layers.kind[profile.producer[tid]] in kinds):
            continue
        last = forward_touch(profile, tid, layers.last_forward)
        if last < first_need(profile, tid, layers.last_forward, walked) - 1:
            found.append(tid)
    return sorted(found, key=lambda t: (forward_touch(profile, t, layers.last_forward), profile.producer[t], t))


def memory_estimate(profile: Profile, layers: Layers, walked: Walked, chosen: list[str],
                    budget_bytes: int) -> MemoryEstimate:
    """GPU bytes per op with each dropped tensor on the GPU only in its spans (instead of
    its no-swap lifetime), the largest scratch of the recomputes before an op (its
    producer's workspace and the other outputs the re-run makes, R15) at that op, and
    the chosen tensors away from their last forward touch to their first need."""
    estimate = MemoryEstimate(profile, budget_bytes)
    tensors = profile.tensor_by_id
    for tid, spans in walked.spans.items():
        start, end = profile.lifetime(tid)
        estimate.remove(tensors[tid].bytes, start, end + 1)
        for lo, hi in spans:
            estimate.add(tensors[tid].bytes, lo, hi)
    scratch: dict[int, int] = {}
    for before, _, tid in walked.recomputes:
        scratch[before] = max(scratch.get(before, 0), recompute_scratch(profile, tid))
    for before, need in scratch.items():
        estimate.add(max(0, need - profile.ops[before].workspace_bytes), before, before + 1)
    for tid in chosen:
        estimate.remove(tensors[tid].bytes, forward_touch(profile, tid, layers.last_forward) + 1,
                        first_need(profile, tid, layers.last_forward, walked))
    return estimate


def transfer_steps(profile: Profile, layers: Layers, walked: Walked, chosen: list[str], every: list[str],
                   ahead: int, budget_bytes: int) -> list[Step]:
    """Offload each chosen tensor after its last forward write; prefetch it when the
    backward reaches the ``ahead``-th earlier need among all candidates ``every`` (at the
    end of the forward pass when there are fewer), or later if the estimate has no room
    for it by then (never before an earlier-needed one)."""
    lf, ops, tensors = layers.last_forward, profile.ops, profile.tensor_by_id
    needs = sorted({first_need(profile, t, lf, walked) for t in every})
    estimate = memory_estimate(profile, layers, walked, chosen, budget_bytes)
    steps, previous = [], -1
    for tid in sorted(chosen, key=lambda t: (first_need(profile, t, lf, walked), forward_touch(profile, t, lf), t)):
        out_at = max([profile.producer[tid]] + [w for w in profile.updaters[tid] if w <= lf])
        need = first_need(profile, tid, lf, walked)
        rank = bisect_left(needs, need) - ahead
        trigger = need - 1 if ahead == 0 else (needs[rank] - 1 if rank >= 0 else lf)
        after = max(trigger, forward_touch(profile, tid, lf), previous)
        crowded = estimate.last_over(tensors[tid].bytes, after + 1, need)
        after = min(after if crowded is None else crowded, need - 1)
        estimate.add(tensors[tid].bytes, after + 1, need)
        previous = after
        steps.append(Step(out_at, OFFLOAD, need, tid, offload(tid, ops[out_at].id, "host")))
        steps.append(Step(after, PREFETCH, need, tid, prefetch(tid, ops[after].id, ops[need].id, "host")))
    return steps


def lower(profile: Profile, layers: Layers, walked: Walked, chosen: list[str], every: list[str],
          ahead: int, budget_bytes: int) -> list[Action]:
    """All actions in issue order: drops, offloads and prefetches, then the recomputes (by
    the op they precede, then producer order, so that a source comes back first)."""
    ops = profile.ops
    steps = [Step(at, DROP, before, tid, drop(tid, ops[at].id)) for at, tid, before in walked.drops]
    steps += transfer_steps(profile, layers, walked, chosen, every, ahead, budget_bytes) if chosen else []
    recomputes = [recompute(tid, ops[u].id) for u, _, tid in sorted(walked.recomputes)]
    return issue_order(steps) + recomputes


def ahead_ladder(needs: int) -> list[int]:
    """``ahead`` values tuned over: the paper's 1, then doubling, then ``needs`` (every
    prefetch issued at the end of the forward pass, or as soon as the estimate has room)."""
    found, value = [1], 2
    while value < needs:
        found.append(value)
        value *= 2
    return found + ([needs] if needs > 1 else [])


# ----------------------------------------------------------------------------- the search


@dataclass
class Candidate:
    """One plan tried: its recomputation mode, offload count, prefetch distance, actions
    and score."""
    mode: str
    offloads: int
    ahead: int | None      # None: nothing offloaded, so nothing prefetched
    actions: list[Action]
    score: object
    order: int

    def key(self) -> tuple:
        return (self.score.rank(), self.order, self.offloads, -1 if self.ahead is None else self.ahead)


class _Search:
    """Builds and scores the plans of each recomputation mode with a simulator compiled once."""

    def __init__(self, profile: Profile, hardware, budget_bytes: int, ahead: int, kinds: frozenset[str]):
        self.profile, self.budget, self.ahead, self.kinds = profile, budget_bytes, ahead, kinds
        self.simulator = Simulator(profile, hardware)
        self.layers = forward_layers(profile)
        self.candidates = recompute_candidates(profile, self.layers)
        self.sources = recompute_sources(profile, self.layers)
        self.walks: dict[str, tuple[dict[str, int], Walked]] = {}
        self.tried: list[Candidate] = []

    def score(self, mode: str, actions: list[Action], offloads: int, order: int,
              ahead: int | None = None) -> Candidate:
        """Simulate the actions within the budget and remember the result."""
        plan = Plan(profile_name=self.profile.name, profile_sha256=self.simulator.compiled.sha256,
                    actions=tuple(actions))
        found = Candidate(mode, offloads, ahead, actions, self.simulator.score(plan, self.budget), order)
        self.tried.append(found)
        return found

    def recomputation(self, mode: str) -> tuple[dict[str, int], Walked]:
        """The recomputed tensors and their walk for a mode (off, speed, paper, memory)."""
        if mode not in self.walks:
            if mode == OFF:
                self.walks[mode] = {}, Walked()
            else:
                everything = {**self.candidates, **self.sources}
                modes = segment_modes(self.profile, self.candidates, set(everything.values()), mode)
                self.walks[mode] = settle(self.profile, self.layers.last_forward, everything, modes)
        return self.walks[mode]

    def best_for(self, mode: str, order: int, offload: str, wide: bool) -> Candidate:
        """The plan of one recomputation mode with the fewest offloads (LRU order) that
        fits, every candidate offloaded (``all``), or none (``off``); for each prefetch distance
        tried, the fastest."""
        dropped, walked = self.recomputation(mode)
        every = offload_candidates(self.profile, self.layers, dropped, walked, self.kinds, wide)

        def build(count: int, ahead: int) -> Candidate:
            actions = lower(self.profile, self.layers, walked, every[:count], every, ahead, self.budget)
            return self.score(mode, actions, count, order, ahead if count else None)

        fewest = build(0, 1)
        if offload == OFF or not every or (offload == "lru" and fewest.score.ok):
            return fewest
        needs = len({first_need(self.profile, t, self.layers.last_forward, walked) for t in every})
        aheads = ahead_ladder(needs) if self.ahead < 0 else [self.ahead]
        found = []
        for ahead in aheads:
            most = build(len(every), ahead)
            if offload == "all" or not most.score.ok:
                found.append(most)
                continue
            low, high = 0, len(every)          # build(low) does not fit, build(high) does
            best = most
            while high - low > 1:
                middle = (low + high) // 2
                tried = build(middle, ahead)
                if tried.score.ok:
                    high, best = middle, tried
                else:
                    low = middle
            found.append(best)
        return min(found, key=Candidate.key)


def _modes(recompute: str) -> list[str]:
    """The recomputation modes to try, in order of preference on a tie."""
    return [OFF, SPEED, "paper", MEMORY] if recompute == "auto" else [recompute]


def _notes(search: _Search, best: Candidate, wide: bool) -> dict:
    """What the plan does and what was tried, for the plan's planner block."""
    kinds = [a.kind for a in best.actions]
    tensors = search.profile.tensor_by_id
    return {"recompute": best.mode, "ahead": best.ahead, "offloaded_tensors": kinds.count("offload"),
            "offloaded_bytes": sum(tensors[a.tensor].bytes for a in best.actions if a.kind == "offload"),
            "recomputes": kinds.count("recompute"),
            "recomputed_tensors": len({a.tensor for a in best.actions if a.kind == "recompute"}),
            "recompute_candidates": len(search.candidates),
            "checkpoints": sum(1 for k in search.layers.kind.values() if k in CHECKPOINTS),
            "offload_candidates": "every saved tensor (fallback)" if wide else "outputs of " +
                                  "/".join(sorted(search.kinds)) + " layers",
            "plans_simulated": len(search.tried)}


@register(
    "superneurons",
    "SuperNeurons: cheap layers between checkpoints (conv, fc, join, fork, concat) recomputed "
    "speed- or memory-centric, conv outputs offloaded in LRU order only when the budget needs it.",
    params=(Param("recompute", "auto", "auto: fastest of off, speed, paper, memory that fits; speed / memory: "
                                       "every segment so; paper: speed-centric unless a segment's bytes "
                                       "exceed the peak layer memory; off: no recomputation", choices=RECOMPUTE_MODES),
            Param("offload", "lru", "lru: the fewest candidates that fit, least recently used first; all: "
                                    "every candidate; off: none", choices=OFFLOAD_MODES),
            Param("ahead", -1, "prefetch when the backward reaches this many offload candidates before "
                               "the tensor's need (1: the paper's layer ahead; 0: just before it; -1: the "
                               "fastest of 1, 2, 4, ... and all at the end of forward)",
                  low=0, high=1_000_000, also=(-1,)),
            Param("fc", True, "offload fully-connected and attention outputs as well as convolution outputs"),
            Param("fallback", True, "when no plan fits: offload every saved tensor that is not recomputed, "
                                    "in the same LRU order (marked fallback)")),
    moves_persistent=False,
    recomputes=True,
    paper="Wang et al., SuperNeurons: Dynamic GPU Memory Management for Training Deep Neural Networks, "
          "PPoPP 2018", family="swap + recompute",
)
def plan_superneurons(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, recompute="auto",
                      offload="lru", ahead=-1, fc=True, fallback=True):
    kinds = frozenset({"conv", "fc"} if fc else {"conv"})
    search = _Search(profile, hardware, budget_bytes, ahead, kinds)
    nothing = search.score(OFF, [], 0, -1)
    if nothing.score.ok:
        return Draft(notes={"choice": "nothing: the profile fits the budget", "plans_simulated": 1})
    rounds = [False, True] if fallback and offload != OFF else [False]
    found: list[tuple[Candidate, bool]] = []
    for wide in rounds:
        this = [search.best_for(mode, order, offload, wide) for order, mode in enumerate(_modes(recompute))]
        options.say(f"superneurons: {'fallback ' if wide else ''}modes "
                    + ", ".join(f"{c.mode}={'fits' if c.score.ok else 'no'}" for c in this))
        found += [(c, wide) for c in this]
        if any(c.score.ok for c in this):
            break
    best, wide = min(found, key=lambda pair: (pair[0].key(), pair[1]))
    if not best.score.valid:       # never hand out a plan the simulator rejects
        best, wide = nothing, False
    notes = _notes(search, best, wide)
    status = "fallback" if wide and best.score.ok else "heuristic"
    return Draft(actions=best.actions, status=status, notes=notes)
