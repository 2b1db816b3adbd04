"""Polish: a local search on a plan's swaps, judged by the simulator.

A solver chooses its moves in a model of time that the simulator does not share exactly
(the interval MILP spreads copies over steps where the simulator queues them FIFO,
docs/ilp.md), so the best plan in its model need not be the simulator's best near it:
autotm's plan for ResNet-50 b1024 at 50% simulates at 4.023 s, and with one more 1.5 GiB
tensor in host memory and a prefetch a few ops later at 4.005 s. Polish tries small
changes to a plan, each a neighbour of it, and keeps each one the simulator runs
strictly faster:

- a prefetch issued ``PREFETCH_SHIFTS`` ops earlier or later (never before its offload);
- an offload issued ``OFFLOAD_DELAYS`` ops later, behind the copies queued after it;
- one more idle interval moved to host memory (a gap of a tensor the plan leaves alone
  that spans an op over the budget), its prefetch ``ADD_LEADS`` ops before the use;
- one move taken back (the tensor stays on the GPU);
- one recompute taken back with the drop before it (the tensor stays on the GPU from that
  drop to that use): a MILP's recompute chains may drop a tensor they recomputed as a
  source and recompute it again a few ops later (joint on GPT-2 b48 at 30%: 25 of them,
  3.6597 s, and 3.6375 s with all taken back).

It changes host and SSD swaps of tensors that have no other kind of action, and drops and
recomputes of tensors that have no other kind (no swap, no codec), and stops when a whole
round of neighbours brings nothing,
after ``max_runs`` simulations, or at the deadline. The neighbours are tried in a fixed
order and the count of simulations, not the clock, ends a run that has time: the same
plan polishes to the same plan.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from simulator.plan import offload, prefetch

from ..core.api import score
from .facts import idle_gaps, op_start_us

PREFETCH_SHIFTS = (-16, -4, -1, 1, 4, 16)
OFFLOAD_DELAYS = (1, 3)
ADD_LEADS = (4, 16)
MAX_RUNS = 4000          # simulations at most
SMALLEST = 1e-3          # tensors under this share of the largest excess over the budget are not added


@dataclass(frozen=True)
class Polished:
    """What polish made of a plan: its actions, the result the simulator gave them, how
    many changes it kept and how many simulations it ran."""
    actions: list
    result: object
    changes: int
    runs: int


def polish(sim, budget: int, actions, initial: dict, deadline: float, max_runs: int = MAX_RUNS) -> Polished:
    """The plan after a first-improvement local search over its neighbours (module
    docstring), starting from ``actions`` on ``sim``'s profile (a plan that runs or not: a
    change is kept only when the plan then runs and strictly faster than the one before)."""
    profile = sim.profile
    actions = list(actions)
    result = score(sim, budget, actions, initial)
    if not result.ok:
        return Polished(actions, result, 0, 1)
    gaps = _addable_gaps(profile, budget)
    ids = [op.id for op in profile.ops]
    runs, changes, at, quiet = 1, 0, 0, 0
    tried = _neighbours(profile, actions, gaps)
    while tried and quiet < len(tried) and runs < max_runs and time.perf_counter() < deadline:
        at %= len(tried)
        candidate = _applied(ids, profile.op_index, actions, tried[at])
        runs += 1
        found = score(sim, budget, candidate, initial)
        if found.ok and found.iteration_us < result.iteration_us:
            actions, result, changes, quiet = candidate, found, changes + 1, 0
            tried = _neighbours(profile, actions, gaps)   # ``at`` goes on from the same place
        else:
            at, quiet = at + 1, quiet + 1
    return Polished(actions, result, changes, runs)


def _addable_gaps(profile, budget: int) -> list[tuple[str, int, int]]:
    """Idle gaps (tensor, last touch, next touch) of non-persistent tensors that span an
    op over the budget, at least four ops long, tensors of at least ``SMALLEST`` of the
    largest excess: what one more move may take off the GPU."""
    resident = np.asarray(profile.resident_bytes, dtype=np.int64)
    if resident.max(initial=0) <= budget:
        return []
    smallest = SMALLEST * (resident.max() - budget)
    over = np.concatenate(([0], np.cumsum(resident > budget)))   # ops over the budget before each position
    starts = op_start_us(profile)
    return [(gap.tensor, gap.after, gap.before)
            for tensor in profile.tensors
            if not tensor.persistent and tensor.bytes >= smallest and profile.producer[tensor.id] is not None
            for gap in idle_gaps(profile, tensor.id, starts)
            if gap.before - gap.after >= 4 and over[gap.before] - over[gap.after + 1] > 0]


def _neighbours(profile, actions: list, gaps) -> list[tuple]:
    """Every change to ``actions`` polish may try, in a fixed order (module docstring):
    ("issue", j, op position) issues action j after another op, ("add", tensor, a, f, b)
    moves the tensor out after op a and back after op f for op b, ("keep", tensor) takes
    the tensor's move back, ("remake", j, k) takes back drop j and recompute k after it."""
    index = profile.op_index
    at = lambda op: -1 if op is None else index[op]   # noqa: E731
    by_tensor: dict[str, list[int]] = {}
    for j, act in enumerate(actions):
        by_tensor.setdefault(act.tensor, []).append(j)
    issues, keeps, remakes = [], [], []
    for tid, where in by_tensor.items():
        if all(actions[j].kind in ("drop", "recompute") for j in where):
            remakes += _remakes(actions, where, at)
            continue
        if any(actions[j].kind not in ("offload", "prefetch") for j in where):
            continue
        for n, j in enumerate(where):
            act = actions[j]
            if act.kind == "offload":
                nxt = at(actions[where[n + 1]].after) if n + 1 < len(where) else len(profile.ops)
                issues += [("issue", j, at(act.after) + d) for d in OFFLOAD_DELAYS if at(act.after) + d < nxt]
            elif n > 0 and actions[where[n - 1]].kind == "offload":
                out = at(actions[where[n - 1]].after)
                issues += [("issue", j, at(act.after) + d) for d in PREFETCH_SHIFTS
                          if out < at(act.after) + d < at(act.before)]
        if len(where) == 2 and [actions[j].kind for j in where] == ["offload", "prefetch"]:
            keeps.append(("keep", tid))
    adds = [("add", tid, a, f, b) for tid, a, b in gaps if tid not in by_tensor
            for f in dict.fromkeys(max(a + 1, b - lead) for lead in ADD_LEADS)]
    return issues + adds + keeps + remakes


def _remakes(actions: list, where: list[int], at) -> list[tuple]:
    """("remake", j, k) for each drop j of one tensor and the first recompute k after it."""
    drops = sorted((at(actions[j].after), j) for j in where if actions[j].kind == "drop")
    recomputes = sorted((at(actions[j].before), j) for j in where if actions[j].kind == "recompute")
    found = []
    for after, j in drops:
        later = [k for before, k in recomputes if before > after]
        if later:
            found.append(("remake", j, later[0]))
    return found


def _applied(ids: list[str], index: dict[str, int], actions: list, change: tuple) -> list:
    """``actions`` with one change of ``_neighbours`` made (``ids``: the op ids in order,
    ``index``: their positions)."""
    if change[0] == "issue":
        _, j, k = change
        return _inserted(actions[:j] + actions[j + 1:], replace(actions[j], after=ids[k]), index)
    if change[0] == "add":
        _, tid, a, f, b = change
        return _inserted(_inserted(actions, offload(tid, ids[a]), index), prefetch(tid, ids[f], ids[b]), index)
    if change[0] == "remake":
        return [act for n, act in enumerate(actions) if n not in change[1:]]
    return [act for act in actions if act.tensor != change[1]]


def _inserted(actions: list, act, index) -> list:
    """``actions`` with ``act`` placed last among those issued after the same op (R7:
    actions after one op are enqueued in plan order)."""
    at = -1 if act.after is None else index[act.after]
    k = next((n for n, other in enumerate(actions)
              if other.after is not None and index[other.after] > at), len(actions))
    return actions[:k] + [act] + actions[k:]
