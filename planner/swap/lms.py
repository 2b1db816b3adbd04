"""``lms``: swap by topological-level distance, after IBM's TensorFlow Large Model Support
(TFLMS; Le, Imai, Negishi, Kawachiya, "TFLMS: Large Model Support in TensorFlow by Graph
Rewriting", arXiv:1807.02037: swap-out/swap-in nodes inserted by graph rewriting, with
control dependencies to time the swap-ins), in its v2 form as the IBM
tensorflow-large-model-support package implements it: ``swapout_threshold``,
``swapin_ahead``, ``swapin_groupby`` and the auto-tuner (``LMS._groupby``,
``LMS._search_by_level``, ``LMS._search_params`` and ``Simulator.play`` in
tensorflow_large_model_support/lms.py and simulator.py, read for the rules below).

What it does
------------
- **Levels.** The ops are sorted into topological levels of the dataflow graph
  (simulator.profile.dataflow_graph): level 0 holds the ops with no predecessor, level
  k the ops whose predecessors all lie in levels < k (the longest path from a source,
  TFLMS's "categorized topological sort").
- **Swap-out.** A non-persistent tensor produced at level ``P`` is swapped out when some
  consumer at level ``C`` has ``C - P > swapout_threshold`` (a *far* consumer); the
  offload is issued right after its producer (the swap-out op depends only on the
  producer). Near consumers read it inside the offload's window (R11), as they read the
  original tensor in TFLMS.
- **Grouping.** Far consumers whose levels chain within ``swapin_groupby`` of each other
  (sorted by level, each within ``swapin_groupby`` of the previous) share one swap-in;
  ``swapin_groupby = 0`` gives each consumer its own.
- **Swap-in.** Each group's swap-in is a prefetch before the group's first consumer (in
  the profile's order) ``D``, issued after a *control op*: the latest op, in the
  profile's order, at the highest level ``L`` with
  ``max(level(D) - swapin_ahead - 10, P + 1) <= L < level(D) - swapin_ahead`` from which
  ``D`` is reachable (TFLMS's ``_search_by_level``: at most 10 levels back; note the
  strict ``<``: the swap-in itself, one level after its control op, is then at least
  ``swapin_ahead`` levels before ``D``). With no such op the swap-in is synchronous:
  issued after the op just before ``D``.
- **Auto-tune** (the default: every parameter left at -1 is tuned, as in TFLMS v2):
  first check that swapping is needed at all (threshold = number of levels swaps
  nothing); then binary search the largest ``swapout_threshold`` in [1, levels] that
  fits, then the largest ``swapin_ahead`` in [1, levels], then ``swapin_groupby``: the
  number of levels if that fits, else a binary search in [0, levels] that stops at the
  first value that fits. When even threshold 1 does not fit, the plan for threshold 1
  (ahead 1, groupby 0) is returned and make_plan marks it infeasible.

Departures from the paper and the package, and why
--------------------------------------------------
1. **Fits = the real simulator.** TFLMS's auto-tuner runs a memory-only, level-by-level
   simulation and accepts a candidate whose peak stays within 0.9 x (GPU memory -
   trainable variables). Here a candidate fits when simulator.api.simulate finds the
   plan valid and within the budget (all of it: R2 counts bytes exactly, with no
   fragmentation, which is what the 0.9 margin was for; the weights are counted in the
   simulation, not subtracted). The search is the package's binary search otherwise.
2. **One buffer per tensor.** TFLMS gives every group its own swap-in tensor while near
   consumers keep reading the original. The simulator has one GPU copy per tensor, so:
   the first swap-in closes the offload's window; a later group's swap-in is preceded by
   a ``drop`` after the tensor's previous use (it has a valid host copy); and a group
   whose control op would fire at or before the tensor's previous use gets no swap-in:
   the tensor simply stays resident (TFLMS would hold both copies then). A tensor whose
   groups all stay resident is not swapped at all (no wasted copy).
3. **Which control op.** Among the ops of the chosen level TFLMS takes an arbitrary
   one; here the latest in the profile's order (the swap-in fires no earlier than the
   level's last op), for determinism.
4. **Sync modes are not modelled.** When threshold 1 does not fit, TFLMS escalates
   ``sync_mode`` (making transfers synchronous to cut memory). The simulator already
   makes compute wait for memory, so there is nothing to escalate; the threshold-1 plan
   is returned instead.
5. **In-place updates.** TensorFlow graphs have no in-place updates; PyTorch's have
   (``relu_``, ``add_``). A tensor updated in place is offloaded after its last update
   before its first far consumer, not after its producer (R11 forbids an update inside
   an offload window), and a later consumer group is swapped in again only while no
   update has made the host copy stale (R16). Empty tensors are never swapped.
   Persistent tensors (weights, optimizer state, inputs) stay on the GPU, as TFLMS swaps
   only op outputs (moves_persistent=False).
6. **``autotune=False``** (not a TFLMS knob): parameters left at -1 take fixed values
   instead of being tuned: threshold 1, ahead 1, groupby 0. ``swapin_groupby`` defaults
   to 0 here (the package's default is -1, auto); pass -1 to tune it.
7. **Zero values.** TFLMS rejects ``swapin_ahead = 0`` and ``swapout_threshold = 0``;
   here they are accepted (threshold 0 swaps every tensor with a consumer at a higher
   level; ahead 0 lets the control op sit at the level just below the consumer). The
   auto-tuner still searches [1, levels], as TFLMS does.
8. **"Is swapping needed at all?"** TFLMS checks this (threshold = number of levels)
   only when all three parameters are auto; here whenever the threshold is auto, since
   ``swapin_groupby`` defaults to 0 (the search would reach the same answer, slower).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import networkx as nx

from simulator.plan import Action, drop, offload, prefetch
from simulator.profile import Profile, dataflow_graph

from ..core.api import score, simulator_for
from ..core.lowering import DROP, OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register

SEARCH_LEVELS = 10   # TFLMS searches at most this many levels back for a control op


@dataclass(frozen=True)
class Knobs:
    """The three TFLMS v2 parameters, resolved to values >= 0."""
    threshold: int
    ahead: int
    groupby: int


@dataclass
class Levels:
    """Topological levels of the ops (by profile position) and what the search needs."""
    level: list[int]                 # position -> level
    by_level: list[list[int]]        # level -> positions, ascending
    ancestors: list[int]             # position -> bitmask of positions that reach it

    @property
    def count(self) -> int:
        return len(self.by_level)

    def reaches(self, source: int, target: int) -> bool:
        return bool(self.ancestors[target] >> source & 1)


def topological_levels(profile: Profile) -> Levels:
    """Each op's level in the dataflow graph (longest path from a source), the ops of
    each level and, for each op, the set of ops from which it is reachable."""
    graph = dataflow_graph(profile)
    index = profile.op_index
    level = [0] * len(profile.ops)
    by_level: list[list[int]] = []
    for depth, generation in enumerate(nx.topological_generations(graph)):
        positions = sorted(index[op_id] for op_id in generation)
        by_level.append(positions)
        for position in positions:
            level[position] = depth
    ancestors = [0] * len(profile.ops)
    for op in profile.ops:  # profile order is topological
        v = index[op.id]
        mask = 0
        for u_id in graph.predecessors(op.id):
            u = index[u_id]
            mask |= ancestors[u] | (1 << u)
        ancestors[v] = mask
    return Levels(level, by_level, ancestors)


def swappable_tensors(profile: Profile) -> list[str]:
    """Non-persistent, non-empty tensors with a consumer."""
    return [t.id for t in profile.tensors if not t.persistent and t.bytes > 0 and profile.consumers[t.id]]


def far_consumers(profile: Profile, levels: Levels, tid: str, threshold: int) -> list[int]:
    """Consumers whose level is more than ``threshold`` above the producer's."""
    start = levels.level[profile.producer[tid]]
    return sorted(c for c in set(profile.consumers[tid]) if levels.level[c] - start > threshold)


def group_by_level(consumers: list[int], levels: Levels, limit: int) -> list[list[int]]:
    """TFLMS's groupby: sort by level and chain consumers whose level is within ``limit``
    of the previous one; ``limit <= 0`` gives each consumer its own group (each group
    sorted by position)."""
    if limit <= 0:
        return [[c] for c in consumers]
    ordered = sorted(consumers, key=lambda c: (levels.level[c], c))
    groups = [[ordered[0]]]
    for c in ordered[1:]:
        if levels.level[c] - levels.level[groups[-1][-1]] <= limit:
            groups[-1].append(c)
        else:
            groups.append([c])
    return [sorted(g) for g in groups]


def control_op(levels: Levels, source_level: int, dest: int, ahead: int) -> int | None:
    """The op after which the swap-in for consumer ``dest`` is issued: at the highest level
    in [max(level(dest) - ahead - 10, source_level + 1), level(dest) - ahead) holding an
    op that reaches ``dest``, the latest such op; None when there is none."""
    upper = levels.level[dest] - ahead
    lower = max(upper - SEARCH_LEVELS, source_level + 1)
    for depth in range(upper - 1, lower - 1, -1):
        found = [v for v in levels.by_level[depth] if levels.reaches(v, dest)]
        if found:
            return max(found)
    return None


def tensor_actions(profile: Profile, levels: Levels, tid: str, knobs: Knobs) -> list[tuple[int, int, int, Action]]:
    """One tensor's swap actions as (issue position, rank, needed-by position, action)."""
    far = far_consumers(profile, levels, tid, knobs.threshold)
    if not far:
        return []
    ops = profile.ops
    made_by = profile.producer[tid]
    source_level = levels.level[made_by]
    updates = profile.updaters[tid]
    touches = sorted({made_by, *profile.consumers[tid], *updates})
    groups = sorted(group_by_level(far, levels, knobs.groupby), key=lambda g: g[0])
    # offload after the last in-place update before the first far consumer (R11)
    out_at = max([made_by] + [u for u in updates if u < groups[0][0]])
    found: list[tuple[int, int, int, Action]] = []
    for group in groups:
        first = group[0]
        if any(out_at < u < first for u in updates):
            break   # the host copy is stale by then (R16)
        previous = max(t for t in touches if t < first)
        trigger = control_op(levels, source_level, first, knobs.ahead)
        if trigger is None:
            trigger = first - 1  # synchronous swap-in
        if trigger <= previous:
            continue  # the swap-in would fire before the previous use: it stays resident
        if found:
            found.append((previous, DROP, first, drop(tid, ops[previous].id)))
        found.append((trigger, PREFETCH, first, prefetch(tid, ops[trigger].id, ops[first].id, "host")))
    if found:
        found.append((out_at, OFFLOAD, out_at, offload(tid, ops[out_at].id, "host")))
    return found


def lms_actions(profile: Profile, levels: Levels, knobs: Knobs) -> list[Action]:
    """Every swap for these knobs, in issue order (by the op they follow; at one op: drops,
    then offloads, then prefetches by the op that needs them)."""
    order = {t.id: k for k, t in enumerate(profile.tensors)}
    keyed = []
    for tid in swappable_tensors(profile):
        for position, rank, needed, action in tensor_actions(profile, levels, tid, knobs):
            keyed.append(Step(position, rank, needed, order[tid], action))
    return issue_order(keyed)


# ----------------------------------------------------------------------------- auto-tune


class Tuner:
    """Scores knob settings with the simulator (memoised) for the auto-tuner."""

    def __init__(self, sim, budget_bytes: int, levels: Levels):
        self.sim, self.profile, self.budget, self.levels = sim, sim.profile, budget_bytes, levels
        self.memo: dict[Knobs, bool] = {}

    def fits(self, knobs: Knobs) -> bool:
        if knobs not in self.memo:
            actions = lms_actions(self.profile, self.levels, knobs)
            self.memo[knobs] = score(self.sim, self.budget, actions).ok
        return self.memo[knobs]

    def largest_fitting(self, knobs: Knobs, name: str, low: int, high: int, early_stop: bool = False) -> int:
        """TFLMS's binary search over one knob: the largest value in [low, high] that fits,
        starting from ``knobs`` (whose value for ``name`` is known to fit); with
        ``early_stop`` the first fitting midpoint."""
        best = getattr(knobs, name)
        while low <= high:
            middle = (low + high) // 2
            if self.fits(_with(knobs, name, middle)):
                best = middle
                if early_stop:
                    break
                low = middle + 1
            else:
                high = middle - 1
        return best


def _with(knobs: Knobs, name: str, value: int) -> Knobs:
    return replace(knobs, **{name: value})


def tune_knobs(tuner: Tuner, threshold: int, ahead: int, groupby: int) -> tuple[Knobs, str]:
    """TFLMS v2's parameter search; negative values are the ones to tune. Returns the
    knobs and how the search ended."""
    size = tuner.levels.count
    knobs = Knobs(threshold if threshold >= 0 else 1, ahead if ahead >= 0 else 1, groupby if groupby >= 0 else 0)
    if threshold < 0:
        if tuner.fits(_with(knobs, "threshold", size)):
            return _with(knobs, "threshold", size), "no swapping needed"
        if not tuner.fits(knobs):
            if tuner.fits(_with(knobs, "threshold", 0)):   # swap every tensor with a later consumer
                knobs = _with(knobs, "threshold", 0)
            else:
                return _with(knobs, "threshold", 0), "thresholds 1 and 0 do not fit"
        else:
            knobs = _with(knobs, "threshold", tuner.largest_fitting(knobs, "threshold", 1, size))
    elif not tuner.fits(knobs):
        return knobs, "the given threshold does not fit"
    if ahead < 0:
        knobs = _with(knobs, "ahead", tuner.largest_fitting(knobs, "ahead", 1, size))
    if groupby < 0:
        if tuner.fits(_with(knobs, "groupby", size)):
            knobs = _with(knobs, "groupby", size)
        else:
            knobs = _with(knobs, "groupby", tuner.largest_fitting(knobs, "groupby", 0, size, early_stop=True))
    return knobs, "tuned"


@register("lms", "TFLMS v2: swap tensors whose consumers are more than a threshold of topological levels "
                 "away; swap-ins triggered swapin_ahead levels early; auto-tuned by binary search.",
          params=(Param("swapout_threshold", -1, "swap a tensor out when a consumer is more than this many levels "
                                                 "after its producer (-1: auto-tune)", low=0, also=(-1,)),
                  Param("swapin_ahead", -1, "issue a swap-in from an op at least this many levels before the "
                                            "consumer (-1: auto-tune)", low=0, also=(-1,)),
                  Param("swapin_groupby", 0, "consumers within this many levels share one swap-in (-1: auto-tune)",
                        low=0, also=(-1,)),
                  Param("autotune", True, "tune the parameters left at -1 with the simulator (else -1 means "
                                          "threshold 1, ahead 1, groupby 0)")),
          moves_persistent=False,
          paper="Le et al., TFLMS: Large Model Support in TensorFlow by Graph Rewriting, arXiv:1807.02037 "
                "(2018); IBM tensorflow-large-model-support v2", family="swap")
def plan_lms(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, swapout_threshold=-1, swapin_ahead=-1,
             swapin_groupby=0, autotune=True):
    levels = topological_levels(profile)
    if autotune and min(swapout_threshold, swapin_ahead, swapin_groupby) < 0:
        knobs, how = tune_knobs(Tuner(simulator_for(profile, hardware, options), budget_bytes, levels),
                                swapout_threshold, swapin_ahead, swapin_groupby)
    else:
        knobs = Knobs(swapout_threshold if swapout_threshold >= 0 else 1,
                      swapin_ahead if swapin_ahead >= 0 else 1, max(swapin_groupby, 0))
        how = "as given"
    actions = lms_actions(profile, levels, knobs)
    notes = {"swapout_threshold": knobs.threshold, "swapin_ahead": knobs.ahead, "swapin_groupby": knobs.groupby,
             "levels": levels.count, "search": how, "swapped_tensors": sum(a.kind == "offload" for a in actions)}
    return Draft(actions=actions, notes=notes)
