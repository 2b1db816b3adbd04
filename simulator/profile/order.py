"""Orders of a profile's ops: whether an order is a permutation of them and keeps their
dependencies and in-place updates (R21), and the dataflow graph."""
from __future__ import annotations

from typing import Iterable

import networkx as nx

from .facts import Profile


def order_violation(profile: Profile, order: Iterable[str]) -> tuple[str, str | None, str] | None:
    """Check an op order (a permutation of op ids) against the profile's dependencies.

    The order must contain every op once, run each op after the producers of what it
    reads or updates, and keep every in-place update of a tensor in the profile's order
    relative to the other ops touching that tensor (rule R21).

    Returns None when the order is valid, else ``(op_id, tensor_id or None, problem)``.
    """
    order = list(order)
    problem = schedule_problem(profile, order)
    if problem is not None:
        return None, None, problem
    position = {op_id: k for k, op_id in enumerate(order)}
    ops = profile.ops
    for op_id in order:
        op = ops[profile.op_index[op_id]]
        for tid in op.inputs + op.updates:
            made_by = profile.producer[tid]
            if made_by is not None and position[ops[made_by].id] > position[op_id]:
                return op_id, tid, (f"op {op_id!r} runs before op {ops[made_by].id!r}, "
                                    f"which produces tensor {tid!r}")
    for before, after, tid in update_order_pairs(profile):
        a, b = ops[before].id, ops[after].id
        if position[a] > position[b]:
            updater = b if after in profile.updaters[tid] else a
            return updater, tid, (f"in-place update of {tid!r} by op {updater!r} is reordered "
                                  f"against op {(a if updater == b else b)!r}, which touches it (R21)")
    return None


def in_order(profile: Profile, order) -> Profile:
    """The profile with its ops in ``order`` (a plan's schedule, R21, already checked): what
    the plan runs, so that what is argued from op positions (the lower bound) argues about
    its order. The profile itself when ``order`` is None or its own."""
    if order is None or list(order) == [op.id for op in profile.ops]:
        return profile
    return Profile(profile.name, profile.tensors, tuple(profile.ops[profile.op_index[o]] for o in order),
                   profile.source, profile.origin)


def schedule_problem(profile: Profile, order) -> str | None:
    """Why ``order`` is not a permutation of the profile's op ids (an unknown, repeated or
    missing op), or None."""
    seen: set[str] = set()
    for op_id in order:
        if op_id not in profile.op_index:
            return f"unknown op {op_id!r}"
        if op_id in seen:
            return f"op {op_id!r} appears twice"
        seen.add(op_id)
    if len(seen) != len(profile.ops):
        missing = next(op.id for op in profile.ops if op.id not in seen)
        return f"op {missing!r} is missing from the schedule"
    return None


def dataflow_graph(profile: Profile) -> nx.DiGraph:
    """The ops as a networkx DiGraph: an edge producer -> user per tensor, and edges
    that keep in-place updates ordered against the other ops touching the tensor.

    Nodes carry ``name``, ``phase``, ``time_us``; edges carry ``tensors`` (a list).
    """
    graph = nx.DiGraph()
    for op in profile.ops:
        graph.add_node(op.id, name=op.name, phase=op.phase, time_us=op.time_us)

    def link(a: int, b: int, tid: str) -> None:
        u, v = profile.ops[a].id, profile.ops[b].id
        if graph.has_edge(u, v):
            graph[u][v]["tensors"].append(tid)
        else:
            graph.add_edge(u, v, tensors=[tid])

    for tid, made_by in profile.producer.items():
        if made_by is None:
            continue
        for user in sorted(set(profile.consumers[tid]) | set(profile.updaters[tid])):
            link(made_by, user, tid)
    for before, after, tid in update_order_pairs(profile):
        link(before, after, tid)
    return graph


def update_order_pairs(profile: Profile):
    """Yield ``(before, after, tensor)`` op positions that in-place updates pin (R21).

    For each updater u of t: every op touching t since the previous updater runs before
    u, and every op touching t up to the next updater runs after u; transitivity then
    orders every toucher against every update.
    """
    for tid, updates in profile.updaters.items():
        if not updates:
            continue
        update_set = set(updates)
        touching = sorted(set(profile.consumers[tid]) | update_set)
        for k, u in enumerate(touching):
            if u not in update_set:
                continue
            j = k - 1
            while j >= 0:
                yield touching[j], u, tid
                if touching[j] in update_set:
                    break
                j -= 1
            j = k + 1
            while j < len(touching) and touching[j] not in update_set:
                yield u, touching[j], tid
                j += 1
