"""Decoding a chromosome (an op schedule and two genes per tensor) into a plan.

Walk the schedule with an op-granularity estimate of GPU memory (what the simulator
counts while each op runs: persistent tensors, live activations, the op's outputs and
workspace). Where it is over the budget, evict resident tensors the op does not touch,
furthest next use first (Belady), the distance scaled by the tensor's priority gene
``2 ** (SPREAD * (gene - 0.5))`` (0.5: plain Belady). An eviction is a whole idle gap
of the tensor. It is a swap: offloaded (or dropped, when its host copy is still valid:
R14, R16) after its last use before the gap and prefetched before its next use; or, for
an activation whose producer's inputs are resident then, a recompute (drop, then
recompute before the next use, R15) when the producer takes less than one copy's time
scaled by the second gene. Then, in order of need, each prefetch is issued as early as
the estimate leaves room for it (never before an earlier-needed one: the h2d stream is a
FIFO), and an eviction that memory never needed is undone. A persistent tensor evicted
before its first use starts in host memory (``initial``) and goes back there after its
last use (R20).

Every action follows from the plan's own structure (R11-R16, R21), so a decoded plan is
always valid; it may be infeasible (the estimate ignores copy times), and the simulator
then ranks it by how far over the budget it goes.

The decoder runs in C when its extension is built (planner/swap_recompute/swapadvisor/_fastdecode.c,
the same steps with the same arithmetic: identical plans); ``Decoder.reference`` is
this Python decoder, the reference and the fallback.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from simulator.model.links import link_speed
from simulator.model.recompute import recompute_problem
from simulator.plan import Action, drop, offload, prefetch, recompute
from simulator.profile import Profile

from ...core.lowering import DROP, OFFLOAD, PREFETCH

try:
    from . import _fastdecode
except ImportError:  # no C compiler at install time: the Python decoder is used
    _fastdecode = None

SPREAD = 4.0          # a gene of 0 or 1 scales what it weighs by 1/4 or 4
RECOMPUTE = 3         # issue-order phase of recomputes (after the transfers at an op)
LAYOUT_CACHE = 64     # schedules whose derived facts are kept (children often share one)
ABI = 2               # the C decoder's argument and result layout; _fastdecode.ABI must match
_PHASE = (OFFLOAD, PREFETCH, DROP, RECOMPUTE)   # the C decoder's action codes -> issue phases


def available() -> bool:
    """True when the C decoder of this version was built."""
    return _fastdecode is not None and getattr(_fastdecode, "ABI", None) == ABI


@dataclass
class Decoded:
    """A decoded chromosome: the plan's parts and what the estimate says of it."""
    actions: list[Action]
    schedule: list[str] | None
    initial: dict[str, str] = field(default_factory=dict)
    swaps: int = 0
    recomputes: int = 0
    over_bytes: int = 0            # estimated bytes over budget that no eviction removed


class Columns(NamedTuple):
    """A plan from the C decoder, in positions: ``kinds`` in the simulator's action codes
    (0 offload, 1 prefetch, 2 drop, 3 recompute), ``tensors``, ``afters`` and ``befores``
    (op index, -1: none) and ``initial`` (tensors that start in host memory) as int32 bytes."""
    kinds: bytes
    tensors: bytes
    afters: bytes
    befores: bytes
    initial: bytes
    identity: bool                 # the schedule is the profile's order
    swaps: int
    recomputes: int
    over_bytes: int


class Problem:
    """A profile's static facts as arrays, shared by every decode."""

    def __init__(self, profile: Profile, hardware, budget_bytes: int):
        self.profile = profile
        self.budget = int(budget_bytes)
        ops, tensors = profile.ops, profile.tensors
        self.n, self.m = len(ops), len(tensors)
        self.op_ids = [op.id for op in ops]
        self.tensor_ids = [t.id for t in tensors]
        index = {t.id: i for i, t in enumerate(tensors)}
        self.bytes = np.array([t.bytes for t in tensors], dtype=np.int64)
        self.persistent = np.array([t.persistent for t in tensors], dtype=bool)
        self.persistent_bytes = int(profile.persistent_bytes)
        self.workspace = np.array([op.workspace_bytes for op in ops], dtype=np.int64)
        self.time_us = np.array([op.time_us for op in ops], dtype=np.float64)
        touch_op, touch_t = [], []
        for v, op in enumerate(ops):
            for tid in dict.fromkeys(op.inputs + op.updates + op.outputs):
                touch_op.append(v)
                touch_t.append(index[tid])
        self.touch_op = np.array(touch_op, dtype=np.int64)
        self.touch_t = np.array(touch_t, dtype=np.int64)
        touched = np.zeros(self.m, dtype=bool)
        touched[self.touch_t] = True
        # persistent tensors no op touches: they may simply start in host memory
        self.idle_persistent = np.flatnonzero(self.persistent & ~touched & (self.bytes > 0))
        pairs = [(index[tid], u) for tid, ups in profile.updaters.items() for u in ups]
        self.update_t = np.array([t for t, _ in pairs], dtype=np.int64)
        self.update_op = np.array([u for _, u in pairs], dtype=np.int64)
        latency, up = link_speed(hardware, "offload", "host")
        _, down = link_speed(hardware, "prefetch", "host")
        self.copy_us = latency + self.bytes / max(min(up, down), 1e-9)
        # R15: what may be recomputed (the C decoder's twin: _fastdecode.c's recomputable_flags)
        self.remake_us = np.full(self.m, np.inf)
        self.remake_inputs: dict[int, list[int]] = {}
        for t, tensor in enumerate(tensors):
            if tensor.bytes == 0 or recompute_problem(profile, tensor.id) is not None:
                continue
            made_by = profile.producer[tensor.id]
            self.remake_us[t] = ops[made_by].time_us
            self.remake_inputs[t] = [index[x] for x in dict.fromkeys(ops[made_by].inputs)]
        self.producer = np.array([-1 if profile.producer[t.id] is None else profile.producer[t.id]
                                  for t in tensors], dtype=np.int64)
        self.arrays = self._arrays()

    def _arrays(self) -> tuple:
        """The facts the C decoder reads (_fastdecode.c), as int64, float64 and bool arrays."""
        n, m = self.n, self.m
        by_tensor = np.argsort(self.update_t, kind="stable")
        remake = [self.remake_inputs.get(t, []) for t in range(m)]
        return (self.bytes, self.persistent, self.producer, self.workspace, self.time_us,
                np.searchsorted(self.touch_op, np.arange(n + 1)).astype(np.int64), self.touch_t,
                self.idle_persistent.astype(np.int64),
                np.searchsorted(self.update_t[by_tensor], np.arange(m + 1)).astype(np.int64),
                self.update_op[by_tensor],
                np.r_[0, np.cumsum([len(x) for x in remake], dtype=np.int64)].astype(np.int64),
                np.array([x for xs in remake for x in xs], dtype=np.int64))


class Layout:
    """What a schedule fixes: op positions, the no-swap memory estimate per position,
    the ideal start times and every tensor's idle gaps (a, b), untouched strictly
    between. Gap g: tensor ``gap_t[g]``, last touch before ``gap_a[g]`` (-1: the
    iteration start, persistent tensors only), next touch ``gap_b[g]`` (n: none, a
    persistent tensor no op touches); a gap from the start also frees ``[gap_tail[g], n)``.
    """

    def __init__(self, problem: Problem, order: np.ndarray):
        n, size = problem.n, problem.bytes
        self.problem, self.order = problem, order
        self.pos = pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n)
        tp, tt = pos[problem.touch_op], problem.touch_t
        sort = np.lexsort((tp, tt))
        T, P = tt[sort], tp[sort]
        heads = np.flatnonzero(np.r_[True, T[1:] != T[:-1]]) if len(T) else np.zeros(0, dtype=np.int64)
        tails = np.r_[heads[1:] - 1, len(T) - 1].astype(np.int64) if len(T) else heads
        tens, first, last = T[heads], P[heads], P[tails]
        transient = ~problem.persistent[tens]
        diff = np.zeros(n + 1, dtype=np.int64)
        np.add.at(diff, first[transient], size[tens[transient]])
        np.add.at(diff, last[transient] + 1, -size[tens[transient]])
        self.base = problem.persistent_bytes + np.cumsum(diff[:n]) + problem.workspace[order]
        self.start = np.r_[0.0, np.cumsum(problem.time_us[order])]
        inner = np.flatnonzero((T[1:] == T[:-1]) & (P[1:] - P[:-1] >= 2) & (size[T[1:]] > 0))
        front = np.flatnonzero(~transient & (first >= 1) & (size[tens] > 0))
        idle = problem.idle_persistent
        self.gap_t = np.r_[T[inner], tens[front], idle].astype(np.int64)
        self.gap_a = np.r_[P[inner], np.full(len(front) + len(idle), -1)].astype(np.int64)
        self.gap_b = np.r_[P[inner + 1], first[front], np.full(len(idle), n)].astype(np.int64)
        self.gap_tail = np.r_[np.full(len(inner), n), last[front] + 1, np.full(len(idle), n)].astype(np.int64)
        self.last = np.full(problem.m, -1, dtype=np.int64)
        self.last[tens] = last
        self.first = np.full(problem.m, -1, dtype=np.int64)
        self.first[tens] = first
        self.identity = bool(np.array_equal(order, np.arange(n)))
        # the gaps as lists (fast scalar access), and the gaps of each tensor
        self.lists = (self.gap_t.tolist(), self.gap_a.tolist(), self.gap_b.tolist(), self.gap_tail.tolist(),
                      size[self.gap_t].tolist())
        self._by_tensor = np.argsort(self.gap_t, kind="stable")
        self._bounds = np.searchsorted(self.gap_t[self._by_tensor], np.arange(problem.m + 1)).tolist()
        up = pos[problem.update_op]                 # in-place updates: positions, sorted by tensor
        sort = np.lexsort((up, problem.update_t))
        self._updates = up[sort].tolist()
        self._update_bounds = np.searchsorted(problem.update_t[sort], np.arange(problem.m + 1)).tolist()

    def gaps_of(self, t: int) -> list[int]:
        return self._by_tensor[self._bounds[t]:self._bounds[t + 1]].tolist()

    def updated(self, t: int) -> list[int]:
        """Sorted positions of the in-place updates of tensor t."""
        return self._updates[self._update_bounds[t]:self._update_bounds[t + 1]]


def _issue_key(item: tuple) -> tuple:
    return item[:4]


class _State:
    """One decode's working state: the memory estimate, the evicted gaps with the
    position each must be back by, the recomputed ones and the prefetch issue points."""

    def __init__(self, lay: Layout):
        self.mem = lay.base.copy()
        self.delta = np.zeros(len(lay.base) + 1, dtype=np.int64)   # pending range updates of mem
        self.free = np.ones(len(lay.gap_t), dtype=bool)   # neither evicted nor pinned
        self.end: dict[int, int] = {}                     # evicted gap -> back by this position
        self.remade: set[int] = set()
        self.issue: dict[int, int] = {}                   # swapped gap -> its prefetch's after position
        self.over_bytes = 0


def host_start(problem: "Problem", genes: np.ndarray) -> np.ndarray:
    """Per tensor: a persistent tensor first evicted after a use, still holding the value
    it started with, starts in host memory instead of being copied out, where its second
    gene (unused for recompute: weights are not recomputed) is over 0.5. The forward's up
    link is what limits the tight budgets (docs/planners.md, the tight cells); such a
    weight crosses the down link instead, idle then. Neutral genes keep the copy out (on
    ResNet-152 b512 at 30% starting every such weight in host memory searched to a 0.6%
    slower plan); the search finds where it pays (GPT-2 b48 at 30%: 3.699 s, was 3.743 s)."""
    return problem.persistent & (np.asarray(genes)[1] > 0.5)


class Decoder:
    """Decodes chromosomes of one problem: in C when built (``fast``), else in Python,
    which keeps the layouts of recent schedules."""

    def __init__(self, problem: Problem, fast: bool = True):
        self.problem = problem
        self.fast = fast and available()
        self._layouts: OrderedDict[bytes, Layout] = OrderedDict()
        self._actions_made: dict[tuple, Action] = {}

    def layout(self, order: np.ndarray) -> Layout:
        key = order.tobytes()
        found = self._layouts.get(key)
        if found is None:
            found = self._layouts[key] = Layout(self.problem, order)
            if len(self._layouts) > LAYOUT_CACHE:
                self._layouts.popitem(last=False)
        else:
            self._layouts.move_to_end(key)
        return found

    def decode(self, order: np.ndarray, genes: np.ndarray) -> Decoded:
        """``order``: op positions in schedule order; ``genes``: shape (2, tensors),
        row 0 the eviction priority, row 1 the leaning to recompute; both in [0, 1].
        The C decoder when built, else the reference: the same Decoded either way."""
        if self.fast:
            return self.decoded(self.columns(order, genes), order)
        return self.reference(order, genes)

    def columns(self, order: np.ndarray, genes: np.ndarray) -> Columns:
        """The C decoder's plan in positions (needs ``fast``). The genes' transforms are
        numpy's, exactly as the reference computes them, so the keys agree to the bit."""
        problem, genes = self.problem, np.asarray(genes)
        weight = np.exp2(SPREAD * (genes[0] - 0.5)).astype(np.float64, copy=False)
        remakable = problem.remake_us < problem.copy_us * np.exp2(SPREAD * (genes[1] - 0.5))
        remakable = np.where(problem.persistent, host_start(problem, genes), remakable)   # C reads it so
        return Columns(*_fastdecode.decode(problem.arrays, problem.persistent_bytes, problem.budget,
                                           np.ascontiguousarray(order, dtype=np.int64),
                                           np.ascontiguousarray(weight), np.ascontiguousarray(remakable)))

    def decoded(self, columns: Columns, order: np.ndarray) -> Decoded:
        """The Decoded of the C decoder's columns, with real Actions (each made once)."""
        problem, made_before, make = self.problem, self._actions_made, self._action
        actions = []
        for kind, t, after, before in zip(columns.kinds, memoryview(columns.tensors).cast("i"),
                                          memoryview(columns.afters).cast("i"), memoryview(columns.befores).cast("i")):
            key = (_PHASE[kind], t, after if after >= 0 else None, before if before >= 0 else None)
            actions.append(made_before.get(key) or make(*key))
        ids = problem.tensor_ids
        return Decoded(actions=actions,
                       schedule=None if columns.identity else [problem.op_ids[v] for v in np.asarray(order).tolist()],
                       initial={ids[t]: "host" for t in memoryview(columns.initial).cast("i")},
                       swaps=columns.swaps, recomputes=columns.recomputes, over_bytes=columns.over_bytes)

    def reference(self, order: np.ndarray, genes: np.ndarray) -> Decoded:
        """The Python decoder (``decode``'s reference and fallback)."""
        lay = self.layout(order)
        state = _State(lay)
        self._evict(lay, state, genes)
        self._hoist(lay, state)
        return self._actions(lay, state, host_start(self.problem, genes))

    def _evict(self, lay: Layout, state: "_State", genes: np.ndarray) -> None:
        """Belady, op by op: where the estimate is over the budget, evict the gaps that
        cover the op, furthest next use (scaled by the gene) first, until it fits."""
        problem = self.problem
        budget, n, mem = problem.budget, problem.n, state.mem
        gap_t, gap_a, gap_b = lay.gap_t, lay.gap_a, lay.gap_b
        _, ga, gb, gtail, gsize = lay.lists
        weight = np.exp2(SPREAD * (genes[0][gap_t] - 0.5))
        remakable = ((gap_a >= 0) & (problem.remake_us[gap_t] < problem.copy_us[gap_t] *
                                     np.exp2(SPREAD * (genes[1][gap_t] - 0.5)))).tolist()
        next_use, start, free, end = lay.start[gap_b], lay.start, state.free, state.end
        delta = state.delta
        k = 0
        while k < n:
            over = (mem[k:] > budget).nonzero()[0]
            if not over.size:
                break
            k += int(over[0])
            cand = ((gap_a < k) & (gap_b > k) & free).nonzero()[0]
            need = int(mem[k]) - budget
            if cand.size:
                keys = (next_use[cand] - start[k]) * weight[cand]
                for g in cand[np.argsort(-keys, kind="stable")].tolist():
                    if not free[g]:
                        continue                        # pinned by a recompute taken just now
                    free[g] = False
                    size, b, tail = gsize[g], gb[g], gtail[g]
                    end[g] = b
                    delta[ga[g] + 1] -= size            # away over (a, b); all of it covers k
                    delta[b] += size
                    delta[tail] -= size
                    if remakable[g] and self._keep_inputs(lay, state, g):
                        state.remade.add(g)
                    need -= size
                    if need <= 0:
                        break
                mem += np.cumsum(delta[:n])
                delta[:] = 0
            state.over_bytes = max(state.over_bytes, int(mem[k]) - budget)
            k += 1

    def _keep_inputs(self, lay: Layout, state: "_State", g: int) -> bool:
        """Can gap g end in a recompute? Its producer's inputs must be resident at the
        gap's end (R15): live then, not updated in place since the producer ran, not
        recomputed around it, and not sent back to host memory for good. Those swapped out
        around it come back by then (their prefetch moves up); the gaps around it not
        evicted are pinned."""
        problem, end, remade = self.problem, state.end, state.remade
        gt, ga, gb, gtail, gsize = lay.lists
        b = gb[g]
        made = lay.pos[problem.producer[gt[g]]]
        pins, pulls = [], []
        for x in problem.remake_inputs[gt[g]]:
            if lay.last[x] < b and not problem.persistent[x]:
                return False
            if any(made < u < b for u in lay.updated(x)):
                return False
            for h in lay.gaps_of(x):
                tail_covers = gtail[h] <= b
                if tail_covers and h in end:
                    return False
                if ga[h] < b < gb[h] or tail_covers:
                    if h in remade:
                        return False
                    (pulls if h in end else pins).append(h)
        if pins:
            state.free[pins] = False
        for h in pulls:
            if end[h] > b:                              # back by b: resident over [b, end)
                state.delta[b] += gsize[h]
                state.delta[end[h]] -= gsize[h]
                end[h] = b
        return True

    def _hoist(self, lay: Layout, state: "_State") -> None:
        """In order of need, undo the evictions memory never needed, and issue each
        prefetch as early as the estimate leaves room (never before an earlier-needed one)."""
        budget, n, mem, end, remade = self.problem.budget, self.problem.n, state.mem, state.end, state.remade
        _, ga, _, gtail, gsize = lay.lists
        latest = -1
        for e, g in sorted((e, g) for g, e in end.items()):
            if e >= n:
                continue                                # never touched: stays in host memory
            a, tail, size = ga[g], gtail[g], gsize[g]
            room = budget - size
            blocked = (mem[a + 1:e] > room).nonzero()[0]
            if not blocked.size and (tail >= n or mem[tail:].max() <= room):
                del end[g]                              # memory never needed it gone
                remade.discard(g)
                mem[a + 1:e] += size
                if tail < n:
                    mem[tail:] += size
                continue
            if g in remade:
                continue
            at = a + 1 + int(blocked[-1]) if blocked.size else a
            if at < latest:
                at = latest                             # the FIFO: not before an earlier-needed one
            mem[at + 1:e] += size
            state.issue[g] = latest = at

    def _actions(self, lay: Layout, state: _State, starts_in_host: np.ndarray) -> Decoded:
        """The plan's actions, tensor by tensor in gap order: an offload, or a drop when
        the host copy is still valid (no in-place update since it was made, R14, R16),
        then the prefetch; or a drop and a recompute; a persistent tensor that starts in
        host memory goes back there after its last touch (R20). Issue order as
        planner/core/lowering.issue_order sorts it (by op, drops, offloads, prefetches by need)."""
        problem, n, end, remade, issue = self.problem, self.problem.n, state.end, state.remade, state.issue
        order = lay.order.tolist()
        pos, producer, last, ids = lay.pos, problem.producer, lay.last, problem.tensor_ids
        made_before, make = self._actions_made, self._action
        keyed: list[tuple] = []
        initial: dict[str, str] = {}
        copy_at: dict[int, int] = {}                    # tensor -> position its host copy reflects
        gaps = np.fromiter(end, dtype=np.int64, count=len(end))
        gaps = gaps[np.lexsort((lay.gap_a[gaps], lay.gap_t[gaps]))]
        ts, as_ = lay.gap_t[gaps].tolist(), lay.gap_a[gaps].tolist()
        ts.append(-1)
        read_until: dict[int, int] = {}                 # input -> the latest recompute that reads it
        for g in remade:
            for x in problem.remake_inputs[lay.gap_t[g]]:
                read_until[x] = max(read_until.get(x, -1), end[g])
        for i, g in enumerate(gaps.tolist()):
            t, a, e = ts[i], as_[i], end[g]
            if g in remade:
                key = (DROP, t, order[a], None)
                keyed.append((a, DROP, a, t, made_before.get(key) or make(*key)))
                key = (RECOMPUTE, t, None, order[e])
                keyed.append((e - 1, RECOMPUTE, e, (int(pos[producer[t]]), t), made_before.get(key) or make(*key)))
                continue
            if e < n:
                at = issue[g]
                key = (PREFETCH, t, order[at] if at >= 0 else None, order[e])
                keyed.append((at, PREFETCH, e, t, made_before.get(key) or make(*key)))
            if a < 0:
                initial[ids[t]] = "host"
                copy_at[t] = -1
                leaving = ()
            else:
                if ((i == 0 or ts[i - 1] != t) and starts_in_host[t] and bisect_right(lay.updated(t), a) == 0
                        and read_until.get(t, -1) <= last[t]):   # back in host memory after its last touch (R20)
                    # its first eviction comes after a use, with the value it started with: it starts
                    # in host memory instead (a prefetch before its first use, a drop then, no copy out)
                    initial[ids[t]] = "host"
                    copy_at[t] = -1
                    first = int(lay.first[t])
                    key = (PREFETCH, t, None, order[first])
                    keyed.append((-1, PREFETCH, first, t, made_before.get(key) or make(*key)))
                leaving = (a,)
            if ts[i + 1] != t and ids[t] in initial and last[t] >= 0:
                leaving += (int(last[t]),)              # back to host memory after the last touch (R20)
            for at in leaving:
                made = copy_at.get(t)
                if made is not None:
                    ups = lay.updated(t)
                    kind = DROP if not ups or bisect_right(ups, at) == bisect_right(ups, made) else OFFLOAD
                else:
                    kind = OFFLOAD
                if kind == OFFLOAD:
                    copy_at[t] = at
                key = (kind, t, order[at], None)
                keyed.append((at, kind, at, t, made_before.get(key) or make(*key)))
        keyed.sort(key=_issue_key)
        return Decoded(actions=[item[4] for item in keyed],
                       schedule=None if lay.identity else [problem.op_ids[v] for v in order], initial=initial,
                       swaps=len(end) - len(remade), recomputes=len(remade), over_bytes=max(state.over_bytes, 0))

    def _action(self, kind: int, t: int, after: int | None, before: int | None) -> Action:
        """The action (Actions are immutable: each is made once per decoder)."""
        key = (kind, t, after, before)
        found = self._actions_made.get(key)
        if found is None:
            tid, ops = self.problem.tensor_ids[t], self.problem.op_ids
            a = None if after is None else ops[after]
            b = None if before is None else ops[before]
            if kind == OFFLOAD:
                found = offload(tid, a)
            elif kind == DROP:
                found = drop(tid, a)
            elif kind == PREFETCH:
                found = prefetch(tid, a, b)
            else:
                found = recompute(tid, b)
            self._actions_made[key] = found
        return found
