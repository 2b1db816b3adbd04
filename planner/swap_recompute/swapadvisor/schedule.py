"""Op schedules as chromosomes: the dependency graph, the paper's crossover and
mutation, and a memory-minded starting order.

A schedule is an array of op positions (profile indices) in run order. It is valid when
every op comes after its predecessors: the producers of what it reads or updates, and
the ops that R21 keeps before an in-place update (``update_order_pairs``).
Both operators keep a valid schedule valid, so no repair is ever needed.
"""
from __future__ import annotations

import heapq

import numpy as np

from simulator.profile import Profile, update_order_pairs


class Dag:
    """Predecessors and successors of every op (data dependencies and R21 pairs)."""

    def __init__(self, profile: Profile):
        n = len(profile.ops)
        preds: list[set[int]] = [set() for _ in range(n)]
        for tid, made_by in profile.producer.items():
            if made_by is None:
                continue
            for user in profile.consumers[tid] + profile.updaters[tid]:
                if user != made_by:
                    preds[user].add(made_by)
        for before, after, _ in update_order_pairs(profile):
            if before != after:
                preds[after].add(before)
        self.n = n
        self.preds = [np.array(sorted(p), dtype=np.int64) for p in preds]
        succs: list[list[int]] = [[] for _ in range(n)]
        for v, p in enumerate(preds):
            for u in p:
                succs[u].append(v)
        self.succs = [np.array(sorted(s), dtype=np.int64) for s in succs]

    def valid(self, order: np.ndarray) -> bool:
        """Is ``order`` a permutation that keeps every op after its predecessors?"""
        if len(order) != self.n or len(set(order.tolist())) != self.n:
            return False
        pos = np.empty(self.n, dtype=np.int64)
        pos[order] = np.arange(self.n)
        return all(not len(p) or pos[p].max() < pos[v] for v, p in enumerate(self.preds))

    def crossover(self, first: np.ndarray, second: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """SwapAdvisor's crossover: a prefix of ``first`` (a random cut), then the other
        ops in ``second``'s order. The prefix is closed under predecessors and the rest
        keeps a valid order, so the child is valid."""
        cut = int(rng.integers(1, self.n)) if self.n > 1 else self.n
        taken = np.zeros(self.n, dtype=bool)
        taken[first[:cut]] = True
        return np.concatenate([first[:cut], second[~taken[second]]])

    def mutate(self, order: np.ndarray, rng: np.random.Generator, tries: int = 8) -> np.ndarray:
        """SwapAdvisor's mutation: move one op to a random place between its latest
        predecessor and its earliest successor (an op with no room is passed over)."""
        pos = np.empty(self.n, dtype=np.int64)
        pos[order] = np.arange(self.n)
        for _ in range(tries):
            v = int(rng.integers(self.n))
            preds, succs = self.preds[v], self.succs[v]
            low = int(pos[preds].max()) + 1 if len(preds) else 0
            high = int(pos[succs].min()) - 1 if len(succs) else self.n - 1   # in the order without v
            if high <= low:
                continue
            place = int(rng.integers(low, high + 1))
            if place == pos[v]:
                continue
            rest = np.delete(order, pos[v])
            return np.insert(rest, place, v)
        return order


def eager_order(profile: Profile, dag: Dag) -> np.ndarray:
    """The profile's order, except that an op which allocates nothing (an in-place
    update, an optimizer step: it only frees what it reads last) runs as soon as its
    predecessors have: gradients and optimizer inputs then die early."""
    n = dag.n
    frees_only = [not op.outputs and not op.workspace_bytes for op in profile.ops]
    waiting = [len(p) for p in dag.preds]
    ready = [(0 if frees_only[v] else 1, v) for v in range(n) if not waiting[v]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, v = heapq.heappop(ready)
        order.append(v)
        for w in dag.succs[v].tolist():
            waiting[w] -= 1
            if not waiting[w]:
                heapq.heappush(ready, (0 if frees_only[w] else 1, w))
    return np.array(order, dtype=np.int64)
