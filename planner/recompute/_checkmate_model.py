"""The model of the ``checkmate`` planner (planner/recompute/checkmate.py): the recomputable tensors
of the forward pass and the backward stages (``build_graph``), their grouping into
super-nodes (``group``), and the MILP over them (``Formulation``), with its starting
solutions. The planner module's docstring describes the formulation and its departures
from the paper."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from simulator.model.recompute import recompute_problem, recompute_scratch
from simulator.profile import Profile

MS = 1e-3          # the objective in milliseconds (coefficients near 1)
TINY = 1e-4        # recomputable tensors under this share of the budget that nothing recomputable reads are kept


# ----------------------------------------------------------------------------- the graph


@dataclass
class Item:
    """One recomputable tensor: its producer, size, recompute cost, last forward use, the
    ops after the forward pass that read it, the recomputable tensors its producer reads
    (``sources``), and (filled by ``build_graph``) the stages that read it (``need``), the
    last stage and op that may need it (directly or as a recompute source), and the last
    stage its recompute may run before (``valid``: its other sources are alive and
    unchanged until that stage's first op)."""
    tid: str
    producer: int
    nbytes: int
    cost_us: float
    last_forward: int
    sources: tuple[str, ...]
    reader_ops: tuple[int, ...]
    bound: int = 0                       # recomputable before op c only when c <= bound
    need: set[int] = field(default_factory=set)
    last_stage: int = 0
    last_op: int = -1
    valid: int = 0


@dataclass
class Graph:
    """The recomputable tensors (``items``) grouped into ``nodes`` (lists of tensor ids,
    consecutive in producer order), and the stages: ``starts[t]`` is the first op of stage
    t (stage 0: the forward pass)."""
    profile: Profile
    last_forward: int
    items: dict[str, Item]
    starts: list[int]
    stage_of: list[int]                  # op position -> stage
    order: list[str]                     # the items by producer
    nodes: list[list[str]] = field(default_factory=list)
    node_of: dict[str, int] = field(default_factory=dict)

    @property
    def stages(self) -> int:
        return len(self.starts)

    def node_last(self, i: int) -> int:
        return max(self.items[t].last_stage for t in self.nodes[i])

    def grouped(self, nodes: list[list[str]]) -> "Graph":
        """The same graph with another grouping."""
        node_of = {tid: i for i, group in enumerate(nodes) for tid in group}
        return Graph(self.profile, self.last_forward, self.items, self.starts, self.stage_of, self.order,
                     nodes, node_of)


def recomputable(profile: Profile, min_bytes: int = 0) -> tuple[dict[str, Item], int]:
    """The tensors the plan may drop and recompute, to a fixed point: made by a forward op
    that updates nothing in place, never updated in place (R15), needed after the forward
    pass (read by a later op, or a source of such a tensor that is itself recomputable),
    recomputable by their first use after the forward pass (each source that is not
    recomputable itself is alive then and not updated in place since the producer read
    it), and, unless a recomputable tensor reads them, of at least ``min_bytes``. Returns
    them, and the last forward op's position."""
    ops, tensors = profile.ops, profile.tensor_by_id
    forward = [i for i, op in enumerate(ops) if op.phase == "forward"]
    if not forward:
        return {}, -1
    last_forward = max(forward)
    is_forward = set(forward)
    found: dict[str, Item] = {}
    for tensor in profile.tensors:
        made_by = profile.producer[tensor.id]
        if tensor.persistent or tensor.bytes == 0 or made_by not in is_forward:
            continue
        if recompute_problem(profile, tensor.id) is not None:
            continue
        uses = profile.consumers[tensor.id]
        found[tensor.id] = Item(
            tensor.id, made_by, tensor.bytes, ops[made_by].time_us,
            max([made_by] + [u for u in uses if u <= last_forward]),
            tuple(dict.fromkeys(s for s in ops[made_by].inputs if not tensors[s].persistent)),
            tuple(u for u in uses if u > last_forward))
    end = len(ops)
    while True:
        read_by: dict[str, int] = {}
        for item in found.values():
            bound = end
            for src in item.sources:
                if src in found:
                    read_by[src] = read_by.get(src, 0) + 1
                    continue
                last = profile.last_use[src]
                later = [u for u in profile.updaters[src] if u > item.producer]
                bound = min(bound, -1 if last is None else last, min(later, default=end))
            item.bound = bound
        gone = [t for t, item in found.items()
                if (item.reader_ops and item.bound < item.reader_ops[0])
                or (not read_by.get(t) and (not item.reader_ops or item.nbytes < min_bytes))]
        if not gone:
            return found, last_forward
        for t in gone:
            del found[t]


def build_graph(profile: Profile, budget: int = 0, stages: int = 0) -> Graph:
    """The recomputable tensors and the stages (ungrouped: see ``group``): stage 0 is
    the forward pass, the backward part is cut at the ops that read a recomputable tensor
    (at most ``stages`` cuts when ``stages`` > 0, evenly chosen among them)."""
    items, last_forward = recomputable(profile, int(TINY * budget))
    n = len(profile.ops)
    cuts = sorted({u for item in items.values() for u in item.reader_ops} | {last_forward + 1}) \
        if items else []
    if stages and len(cuts) > stages:
        cuts = sorted({cuts[0]} | {cuts[(k * len(cuts)) // stages] for k in range(stages)})
    starts = [0] + cuts
    stage_of = [0] * n
    for t, start in enumerate(starts):
        for c in range(start, starts[t + 1] if t + 1 < len(starts) else n):
            stage_of[c] = t
    order = sorted(items, key=lambda t: (items[t].producer, profile.ops[items[t].producer].outputs.index(t)))
    for item in items.values():
        item.need = {stage_of[u] for u in item.reader_ops}
        item.last_stage = max(item.need, default=0)
        item.last_op = max(item.reader_ops, default=-1)
    # what may need a tensor later: its readers, and the recomputes of the tensors it is a source of
    for tid in reversed(order):
        item = items[tid]
        for src in item.sources:
            if src in items:
                source = items[src]
                source.last_stage = max(source.last_stage, item.last_stage)
                source.last_op = max(source.last_op, starts[item.last_stage])
    for item in items.values():
        item.valid = max((t for t in range(1, len(starts)) if starts[t] <= item.bound), default=0)
    return Graph(profile, last_forward, items, starts, stage_of, order)


def group(graph: Graph, nodes: int) -> Graph:
    """The graph with its recomputable tensors grouped into at most ``nodes`` runs that
    are consecutive in producer order: from one node per tensor, adjacent runs merge
    cheapest first, the price of a merge being what forcing one decision on both can
    lose. With C the recompute time and M the bytes of each run and r = C / M, that is
    M_a M_b / (M_a + M_b) |r_a - r_b|: the loss at the worst exchange rate of time for
    memory (Ward's criterion); ties merge the earlier pair."""
    items = graph.items
    runs = [[tid] for tid in graph.order]
    cost = [items[t].cost_us for t in graph.order]
    size = [float(items[t].nbytes) for t in graph.order]

    def price(k: int) -> float:
        ma, mb = size[k], size[k + 1]
        return ma * mb / (ma + mb) * abs(cost[k] / ma - cost[k + 1] / mb)

    prices = [price(k) for k in range(len(runs) - 1)]
    while len(runs) > max(1, nodes):
        k = min(range(len(prices)), key=prices.__getitem__)
        runs[k:k + 2] = [runs[k] + runs[k + 1]]
        cost[k:k + 2] = [cost[k] + cost[k + 1]]
        size[k:k + 2] = [size[k] + size[k + 1]]
        del prices[k]
        if k < len(prices):
            prices[k] = price(k)
        if k > 0:
            prices[k - 1] = price(k - 1)
    return graph.grouped(runs)


# ----------------------------------------------------------------------------- the MILP


class Formulation:
    """The MILP over a grouped Graph for a budget: ``S[(t, i)]`` and ``R[(t, i)]`` map
    (stage, node) to a column, for the backward stages t >= 1 where the node's state
    matters (see ``relevant``). ``infeasible`` names an op whose fixed memory alone
    (everything but the recomputable tensors that may be gone there) is over the budget:
    no plan of the model fits. The objective is the predicted iteration time in ms (the
    ideal time is a fixed column), so that the MIP gap is relative to the iteration."""

    def __init__(self, graph: Graph, budget: int):
        from ..shared.highs import Model

        self.graph, self.budget = graph, budget
        items, nodes, node_of = graph.items, graph.nodes, graph.node_of
        self.infeasible: str | None = None
        self.scale = float(max([item.nbytes for item in items.values()] + [1]))
        self.last = [graph.node_last(i) for i in range(len(nodes))]
        # the nodes each node's recomputes read
        self.sources = [sorted({node_of[s] for x in group for s in items[x].sources
                                if s in items and node_of[s] != i}) for i, group in enumerate(nodes)]
        # where a recompute of node i is worth having: a stage it is read at, a stage a node that reads
        # it may be recomputed at, and its last valid stage (recomputing any earlier only holds it longer
        # for the same cost); never where one of its tensors still needed is no longer recomputable
        useful: list[set[int]] = [set() for _ in nodes]
        needed_at: list[set[int]] = [set() for _ in nodes]
        for j in reversed(range(len(nodes))):
            needed_at[j] = {t for x in nodes[j] for t in items[x].need}
            valid = [t for t in range(1, self.last[j] + 1)
                     if all(items[x].valid >= t for x in nodes[j] if items[x].last_stage >= t)]
            useful[j] |= needed_at[j]
            if valid and valid[-1] < self.last[j]:
                useful[j].add(valid[-1])
            useful[j] &= set(valid)
            for i in self.sources[j]:
                useful[i] |= useful[j]
        self.read = needed_at
        redo = {(t, i) for i in range(len(nodes)) for t in useful[i]}
        rows = self._memory_rows(budget, redo)
        # a node's state matters where it is read, may be recomputed, is read by a recompute, or
        # counts in a memory row; elsewhere holding it is free, so it stays as it was
        relevant = {(1, i) for i in range(len(nodes))} | redo
        relevant |= {(t, i) for i in range(len(nodes)) for t in needed_at[i]}
        relevant |= {(t, i) for (t, j) in redo for i in self.sources[j]}
        for _, coef, _ in rows:
            relevant |= {(max(1, t), i) for t, i in coef}
        self.relevant = [sorted(t for (t, k) in relevant if k == i) for i in range(len(nodes))]
        model = self.model = Model()
        model.add_vars(1, lower=1.0, upper=1.0, cost=graph.profile.ideal_us * MS)
        self.S: dict[tuple[int, int], int] = {}
        self.R: dict[tuple[int, int], int] = {}
        for i, group in enumerate(nodes):
            for t in self.relevant[i]:
                self.S[t, i] = model.add_vars(1, upper=1.0, integer=True)
                if (t, i) in redo:
                    cost = sum(items[x].cost_us for x in group if items[x].last_stage >= t)
                    self.R[t, i] = model.add_vars(1, upper=1.0, cost=cost * MS, integer=True)
        for i in range(len(nodes)):
            stages = self.relevant[i]
            for t, nxt in zip(stages, stages[1:]):      # kept into a stage only if held before
                held = self.held(t, i)
                model.add_row([self.S[nxt, i]] + held, [1.0] + [-1.0] * len(held), upper=0.0)
            for t in stages:
                held = self.held(t, i)
                if len(held) == 2:                       # a node held is not recomputed
                    model.add_row(held, [1.0, 1.0], upper=1.0)
                if t in needed_at[i]:                    # read in stage t
                    model.add_row(held, [1.0] * len(held), lower=1.0)
        for (t, j), r in self.R.items():       # a recompute reads its recomputable sources
            for i in self.sources[j]:
                if any(items[x].last_stage >= t and any(node_of.get(s) == i for s in items[x].sources)
                       for x in nodes[j]):
                    held = self.held(t, i)
                    model.add_row([r] + held, [1.0] + [-1.0] * len(held), upper=0.0)
        for room, coef, extra in rows:
            terms: dict[int, float] = {}
            for key, nbytes in sorted(coef.items()):
                for col in self.held(*key):
                    terms[col] = terms.get(col, 0.0) + nbytes / self.scale
            upper = room / self.scale
            if extra is not None:       # big-M on the recompute: the row is void when it does not run
                slack = max(0, sum(coef.values()) - room) / self.scale
                terms[self.R[extra]] = terms.get(self.R[extra], 0.0) + slack
                upper += slack
            model.add_row(list(terms), list(terms.values()), upper=upper)
        self.memory_rows = len(rows)

    def held(self, t: int, i: int) -> list[int]:
        """The columns whose sum says node i is on the GPU in stage t (S + R); stage 0, the
        forward pass after a tensor's last forward use: S[1, i] alone (kept into backward)."""
        if t == 0:
            return [self.S[1, i]]
        return [c for c in (self.S.get((t, i)), self.R.get((t, i))) if c is not None]

    def _memory_rows(self, budget: int, redo: set) -> list[tuple[int, dict, tuple | None]]:
        """The memory rows as (room, {(stage, node): bytes}, recompute key or None), for the
        ops whose memory could pass the budget; sets ``infeasible`` when one must."""
        graph = self.graph
        profile, items, n = graph.profile, graph.items, len(graph.profile.ops)
        resident = np.asarray(profile.resident_bytes, dtype=np.int64)
        alive = np.zeros(n + 1, dtype=np.int64)      # recomputable tensors over their profile lifetime
        forward = np.zeros(n + 1, dtype=np.int64)    # ... from their producer to their last forward use
        for item in items.values():
            end = max(item.producer, profile.last_use[item.tid] or item.producer)
            alive[item.producer] += item.nbytes
            alive[end + 1] -= item.nbytes
            forward[item.producer] += item.nbytes
            forward[item.last_forward + 1] -= item.nbytes
        base = resident - np.cumsum(alive)[:n]
        fixed = base + np.cumsum(forward)[:n]
        rows: list[tuple[int, dict, tuple | None]] = []

        def row(op: int, used: int, coef: dict, extra: tuple | None = None) -> None:
            room = budget - used
            if room < 0 and extra is None:
                self.infeasible = self.infeasible or profile.ops[op].id
            elif sum(coef.values()) > room:
                rows.append((room, coef, extra))

        # the forward pass: a tensor past its last forward use is there when its node is kept (S[1, i], keyed
        # (0, i) here); the coefficients grow along the pass, so an op needs a row only if its fixed part beats
        # every later one
        best = None
        for o in range(graph.last_forward, -1, -1):
            if best is not None and fixed[o] <= best:
                continue
            best = fixed[o]
            coef: dict[tuple[int, int], int] = {}
            for item in items.values():
                if item.last_forward < o:
                    key = (0, graph.node_of[item.tid])
                    coef[key] = coef.get(key, 0) + item.nbytes
            row(o, int(fixed[o]), coef)
        # the backward stages: a node held counts its tensors that may still be needed at the op;
        # the coefficients shrink along a stage, so an op needs a row only if it beats every earlier one
        for t in range(1, graph.stages):
            first = graph.starts[t]
            end = graph.starts[t + 1] if t + 1 < graph.stages else n
            best = None
            for c in range(first, end):
                if best is not None and base[c] <= best:
                    continue
                best = base[c]
                row(c, int(base[c]), self._held_bytes(t, c))
            # the recomputes before the stage's first op, each with its scratch (its producer's
            # workspace and the other outputs the re-run makes, R15)
            op = profile.ops[first]
            before = int(base[first]) - op.workspace_bytes - sum(profile.tensor_by_id[x].bytes for x in op.outputs
                                                                 if x not in items)
            for i, group in enumerate(graph.nodes):
                space = max(recompute_scratch(profile, x) for x in group)
                if (t, i) in redo and before + space > base[first]:   # else the op's own row is tighter
                    row(first, before + space, self._held_bytes(t, first), (t, i))
        return rows

    def _held_bytes(self, t: int, c: int) -> dict[tuple[int, int], int]:
        coef: dict[tuple[int, int], int] = {}
        for item in self.graph.items.values():
            if item.last_op >= c and item.last_stage >= t:
                key = (t, self.graph.node_of[item.tid])
                coef[key] = coef.get(key, 0) + item.nbytes
        return coef

    def values_of(self, keep: dict, redo: dict) -> np.ndarray:
        """Column values for a wished pattern of holding (``keep`` or ``redo`` at a stage:
        held there): a node is kept where it was held at its stage before, else recomputed
        where the model has that recompute, else not held. The solver checks the result."""
        x = np.zeros(self.model.num_cols)
        x[0] = 1.0
        for i, stages in enumerate(self.relevant):
            before = True          # stage 1 may keep what the forward pass made
            for t in stages:
                wished = keep.get((t, i)) or redo.get((t, i))
                if wished and before:
                    x[self.S[t, i]] = 1.0
                elif wished and (t, i) in self.R:
                    x[self.R[t, i]] = 1.0
                else:
                    wished = False
                before = bool(wished)
        return x

    def _plan_of(self, dropped: set[int]) -> list:
        """Per node, for ``pattern``: "keep", (first, last) stages of a single recompute
        and its holding, or None (never held after the forward pass)."""
        items, nodes = self.graph.items, self.graph.nodes
        demand: list[set[int]] = [set() for _ in nodes]
        plan: list = [None] * len(nodes)
        for j in reversed(range(len(nodes))):     # a node's readers come after it
            read = self.read[j]
            if read and j not in dropped:
                plan[j] = "keep"
                continue
            here = read | demand[j]
            if here:
                plan[j] = (min(here), max(here))
                for i in self.sources[j]:
                    demand[i].add(plan[j][0])
        return plan

    def pattern(self, dropped: set[int]) -> tuple[dict, dict]:
        """The holding pattern that recomputes each node of ``dropped`` once: dropped after
        the forward pass, recomputed at the first stage that reads it or recomputes a node
        from it, held until the last such stage. Other nodes that are read after the
        forward pass are kept; the others (sources only) are recomputed, the same way,
        only where a recomputed node reads them."""
        keep, redo = {}, {}
        for j, how in enumerate(self._plan_of(dropped)):
            if how == "keep":
                keep.update({(t, j): True for t in range(1, self.last[j] + 1)})
            elif how is not None:
                redo[how[0], j] = True
                keep.update({(t, j): True for t in range(how[0] + 1, how[1] + 1)})
        return keep, redo

    def first_need(self) -> tuple[dict, dict]:
        """Every node dropped after the forward pass and recomputed once (``pattern``)."""
        return self.pattern(set(range(len(self.graph.nodes))))

    def greedy_start(self, seconds: float, dropped: set[int] = frozenset()) -> np.ndarray | None:
        """A starting solution, a knapsack on this model's rows: from the nodes
        ``dropped`` (``pattern``), more nodes read after the forward pass are dropped in
        order of recompute time per byte, cheapest first, each only if it lowers the
        bytes over the budget, until every row holds; then each dropped node is kept
        again, dearest first, where the rows still hold. None when no such pattern is
        found (within ``seconds``)."""
        stop = time.perf_counter() + seconds
        model = self.model
        starts = np.asarray(model._starts, dtype=np.int64)
        index = np.asarray(model._index, dtype=np.int64)
        value = np.asarray(model._value, dtype=float)
        rows = np.repeat(np.arange(model.num_rows), np.diff(starts))
        lower, upper = np.asarray(model.row_lower) - 1e-7, np.asarray(model.row_upper) + 1e-7
        stages = [np.asarray(rel) for rel in self.relevant]
        s_cols = [np.asarray([self.S[t, i] for t in rel], dtype=np.int64) for i, rel in enumerate(self.relevant)]

        def evaluate(dropped: set[int]) -> tuple[float, np.ndarray | None]:
            x = np.zeros(model.num_cols)
            x[0] = 1.0
            for i, how in enumerate(self._plan_of(dropped)):
                if how == "keep":
                    x[s_cols[i]] = 1.0
                elif how is not None:
                    if (how[0], i) not in self.R:
                        return math.inf, None
                    x[self.R[how[0], i]] = 1.0
                    x[s_cols[i][(stages[i] > how[0]) & (stages[i] <= how[1])]] = 1.0
            act = np.bincount(rows, weights=value * x[index], minlength=model.num_rows)
            over = float(np.sum(np.maximum(act - upper, 0.0)) + np.sum(np.maximum(lower - act, 0.0)))
            return over, x

        items, nodes = self.graph.items, self.graph.nodes
        ranked = sorted((sum(items[x].cost_us for x in group) / sum(items[x].nbytes for x in group), i)
                        for i, group in enumerate(nodes) if self.read[i])
        order = [i for _, i in ranked]
        dropped = set(dropped)
        over, x = evaluate(dropped)
        for i in order:
            if over == 0.0 or time.perf_counter() > stop:
                break
            if i in dropped:
                continue
            trial, y = evaluate(dropped | {i})
            if trial < over:
                dropped.add(i)
                over, x = trial, y
        if over > 0.0:
            return None
        for i in reversed(order):
            if i in dropped and time.perf_counter() < stop:
                trial, y = evaluate(dropped - {i})
                if trial == 0.0:
                    dropped.discard(i)
                    x = y
        return x

    def decode(self, values: np.ndarray) -> tuple[dict, dict]:
        """The solution at every stage: between a node's relevant stages it stays as it was."""
        keep, redo = {}, {}
        for i, stages in enumerate(self.relevant):
            held = False
            for t in range(1, self.last[i] + 1):
                if (t, i) in self.S:
                    held = False
                    if values[self.S[t, i]] > 0.5:
                        keep[t, i] = held = True
                    if (t, i) in self.R and values[self.R[t, i]] > 0.5:
                        redo[t, i] = held = True
                elif held:
                    keep[t, i] = True
        return keep, redo
