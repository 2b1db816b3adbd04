"""Polish: a local search on a plan's swaps and recomputes, judged by the simulator.

A solver chooses its moves in a model of time that the simulator does not share exactly
(the interval MILP spreads copies over steps where the simulator queues them FIFO,
docs/ilp.md), and a search's decoder makes only the kinds of plans it knows, so the best
plan either finds need not be the simulator's best near it: autotm's plan for ResNet-50
b1024 at 50% simulates at 4.023 s, and with one more 1.5 GiB tensor in host memory and a
prefetch a few ops later at 4.005 s. Polish tries changes to a plan, each a neighbour of
it, kind by kind in stages (``STAGES``, ``polish_in_stages``):

- ``start``: the first offload of a weight, optimizer state or input issued at the
  iteration's start, its copy running while the ops before its old place read it (R11:
  ops in an offload's window may read the tensor; it is released after the last of them):
  the up link is idle while the first op runs, before any activation exists (ResNet-50
  b1024 at 30%: the 0.62 GB input copied out during the first convolution);
- ``host``: every weight, optimizer state or input whose first action copies out the value
  it started with started in host memory instead (one change): prefetched ``HOST_LEAD``
  ops before its first use, dropped where it was copied out (R16), back in host memory
  after its last use (R20); its copy leaves the up link;
- ``remake``: one recompute taken back with the drop before it (the tensor stays on the GPU
  from that drop to that use): a MILP's recompute chains may drop a tensor they recomputed
  as a source and recompute it again a few ops later (joint on GPT-2 b48 at 30%: 25 of
  them, 3.6597 s, and 3.6375 s with all taken back);
- ``chain``: a tensor the plan keeps on the GPU through an idle gap only because a
  recompute in that gap reads it (or any kept tensor cheaper per byte than the plan's
  dearest recompute) dropped after its last touch and recomputed just before, its
  producer's swapped inputs brought back by then, alone or with a dearer recompute inside
  that span taken back (swapadvisor keeps ResNet-50's max-pool output, 0.82 GB, from o8 to
  the backward's end to recompute two convolutions from it);
- ``swap``: one recompute (of the ``SWAP_TRIES`` dearest per byte) made a swap: copied out
  where it was dropped, prefetched ``SWAP_LEADS`` ops before the use it was recomputed for,
  where the up link has room (after the starts, ResNet-152 b512 at 30%: 3.428 -> 3.419 s);
- ``issue``: a prefetch issued ``PREFETCH_SHIFTS`` ops earlier or later (never before its
  offload), an offload ``OFFLOAD_DELAYS`` ops later, behind the copies queued after it;
- ``add``: one more idle interval moved to host memory (a gap of a tensor the plan leaves
  alone that spans an op over the budget), its prefetch ``ADD_LEADS`` ops before the use;
- ``keep``: one move taken back (the tensor stays on the GPU).

A start or host start is kept when the plan runs no slower (it frees the up link for a
later change: the search keeps one change at a time); every other change when it runs
strictly faster. Polish changes host and SSD swaps of tensors that have no other kind of
action, drops and recomputes of tensors that have no other kind (no swap, no codec), and
adds chains only for tensors with no action. A stage stops when a whole round of its
neighbours brings nothing; the whole after ``max_runs`` simulations or at the deadline.
The neighbours are tried in a fixed order and the count of simulations, not the clock,
ends a run that has time: the same plan polishes to the same plan.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from simulator.model.recompute import recompute_problem
from simulator.plan import drop, offload, prefetch, recompute

from ..core.api import score
from .facts import idle_gaps, op_start_us, touches

PREFETCH_SHIFTS = (-16, -4, -1, 1, 4, 16)
OFFLOAD_DELAYS = (1, 3)
ADD_LEADS = (4, 16)
MAX_RUNS = 4000          # simulations at most
NEIGHBOURS = ("start", "host", "issue", "add", "keep", "remake", "chain", "swap")   # every kind, in the order tried
# the stages of a polish: the few changes that pay most first (starts and host starts free the up
# link and chains memory for the swaps after them), then the many small shifts
STAGES = (("start", "host", "remake", "chain"), ("swap", "remake"), ("issue", "add", "keep", "remake"))
FREEING = ("start", "host")   # kinds kept when the plan runs no slower: they free the up link for what follows
HOST_LEAD = 4            # a weight started in host memory is prefetched this many ops before its first use
CHAIN_TAKE_BACKS = 4     # a chain is tried alone and with each of this many dearer recomputes taken back
SWAP_LEADS = (8, 32, 128)   # a recompute made a swap: its prefetch this many ops before the use
SWAP_TRIES = 48          # the dearest recomputes per byte that may become swaps
SMALLEST = 1e-3          # tensors under this share of the largest excess over the budget are not added or started


@dataclass(frozen=True)
class Polished:
    """What polish made of a plan: its actions, the result the simulator gave them, how
    many changes it kept, how many simulations it ran, and where tensors start (``initial``:
    host starts add to it)."""
    actions: list
    result: object
    changes: int
    runs: int
    initial: dict


def polish_in_stages(sim, budget: int, actions, initial: dict, deadline: float, max_runs: int = MAX_RUNS,
                     stages: tuple = STAGES) -> Polished:
    """``polish`` with the kinds of each stage in turn, each from where the last left the
    plan, within one ``deadline`` and ``max_runs`` simulations in all: what the stages
    made, the changes and simulations counted over all of them."""
    done = Polished(list(actions), None, 0, 0, dict(initial))
    for kinds in stages:
        step = polish(sim, budget, done.actions, done.initial, deadline, max_runs - done.runs, kinds)
        done = replace(step, changes=done.changes + step.changes, runs=done.runs + step.runs)
        if not done.result.ok or done.runs >= max_runs:
            break
    return done


def polish(sim, budget: int, actions, initial: dict, deadline: float, max_runs: int = MAX_RUNS,
           kinds: tuple[str, ...] = NEIGHBOURS) -> Polished:
    """The plan after a first-improvement local search over its neighbours (module
    docstring) of ``kinds`` (of ``NEIGHBOURS``), starting from ``actions`` on ``sim``'s
    profile, in its order (a plan that runs or not: a change is kept only when the plan
    then runs and strictly faster than the one before)."""
    profile = sim.profile
    actions, initial = list(actions), dict(initial)
    result = score(sim, budget, actions, initial)
    if not result.ok:
        return Polished(actions, result, 0, 1, initial)
    gaps = _addable_gaps(profile, budget) if "add" in kinds or "chain" in kinds else []
    smallest = SMALLEST * max(max(profile.resident_bytes, default=0) - budget, 0)
    ids = [op.id for op in profile.ops]
    runs, changes, at, quiet = 1, 0, 0, 0
    tried = _neighbours(profile, actions, initial, gaps, kinds, smallest)
    while tried and quiet < len(tried) and runs < max_runs and time.perf_counter() < deadline:
        at %= len(tried)
        change = tried[at]
        candidate = _applied(ids, profile.op_index, actions, change, profile)
        starting = {**initial, **dict.fromkeys(change[1], "host")} if change[0] == "host" else initial
        runs += 1
        found = score(sim, budget, candidate, starting)
        # a start or a host start frees the up link without a gain of its own: kept when no slower
        if found.ok and (found.iteration_us < result.iteration_us
                         or change[0] in FREEING and found.iteration_us <= result.iteration_us):
            actions, initial, result, changes, quiet = candidate, starting, found, changes + 1, 0
            tried = _neighbours(profile, actions, initial, gaps, kinds, smallest)   # ``at`` goes on from there
        else:
            at, quiet = at + 1, quiet + 1
    return Polished(actions, result, changes, runs, initial)


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


def _neighbours(profile, actions: list, initial: dict, gaps, kinds: tuple[str, ...] = NEIGHBOURS,
                smallest: float = 0) -> list[tuple]:
    """Every change of ``kinds`` to ``actions`` polish may try, in a fixed order (module
    docstring): ("issue", j, op position) issues action j after another op, ("add",
    tensor, a, f, b) moves the tensor out after op a and back after op f for op b,
    ("keep", tensor) takes the tensor's move back, ("start", j) issues offload j at the
    iteration's start, ("host", tensors) starts these tensors in host memory, ("remake", j,
    k) takes back drop j and recompute k after it,
    ("chain", tensor, a, f, k, taken) drops the tensor after op a, recomputes it just
    before op f (ahead of recompute k) and takes back the remake ``taken``, ("swap", j, k,
    lead) swaps the tensor of drop j and recompute k instead, its prefetch ``lead`` ops
    before the use."""
    index = profile.op_index
    at = lambda op: -1 if op is None else index[op]   # noqa: E731
    by_tensor: dict[str, list[int]] = {}
    for j, act in enumerate(actions):
        by_tensor.setdefault(act.tensor, []).append(j)
    issues, keeps, remakes, starts, hosted = [], [], [], [], []
    for tid, where in by_tensor.items():
        first, tensor = actions[where[0]], profile.tensor_by_id[tid]
        if first.kind == "offload" and first.after is not None and tensor.persistent:   # copied out after a use
            if tensor.bytes >= smallest:
                starts.append(("start", where[0]))
            if tid not in initial and min(profile.updaters.get(tid, ()), default=len(profile.ops)) > at(first.after):
                hosted.append(tid)   # still the value it started with
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
    # the dearest recompute per byte first: taking it back saves the most for the bytes it holds
    remakes.sort(key=lambda r: (-_per_byte(profile, actions[r[1]].tensor), r[1]))
    chains = _chains(profile, actions, by_tensor, remakes, gaps, at) if "chain" in kinds else []
    swaps = [("swap", j, k, lead) for _, j, k in remakes[:SWAP_TRIES] for lead in SWAP_LEADS]
    found = {"start": starts, "host": [("host", tuple(hosted))] if hosted else [], "issue": issues, "add": adds,
             "keep": keeps, "remake": remakes, "chain": chains, "swap": swaps}
    return [change for kind in NEIGHBOURS if kind in kinds for change in found[kind]]


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


def _chains(profile, actions: list, by_tensor: dict, remakes: list, gaps, at) -> list[tuple]:
    """("chain", x, a, f, k, taken): tensor x, which has no action, dropped after op a and
    recomputed just before op f, for

    - each idle gap of x from op a in which recompute k (before op f) reads x (an input of
      its tensor's producer), the first such recompute of the gap;
    - each gap of ``gaps`` (a to f, k None) of such an x whose producer costs less per
      byte than the dearest recompute of the plan;

    where R15 lets x be recomputed there: alone (``taken`` empty) and with each of the
    ``CHAIN_TAKE_BACKS`` dearest recomputes per byte whose drop and recompute lie inside
    that span taken back (``taken``: that remake's (j, k)). The bytes a new recompute
    frees pay mostly when a dearer recompute gives way to them, and the search keeps one
    change at a time: ResNet-152 b512 at 30% runs 2.3 ms slower with its max-pool output
    chained alone."""
    found: dict[tuple[str, int], tuple] = {}
    for f, k in sorted((at(act.before), k) for k, act in enumerate(actions) if act.kind == "recompute"):
        for x in dict.fromkeys(profile.ops[profile.producer[actions[k].tensor]].inputs):
            if x in by_tensor or profile.tensor_by_id[x].persistent or profile.producer[x] is None:
                continue
            a = _last_touch_before(profile, x, f)
            if a is not None and (x, a) not in found and recompute_problem(profile, x, f) is None:
                found[(x, a)] = (f, k)
    dearest = max((_per_byte(profile, actions[r[1]].tensor) for r in remakes), default=0.0)
    for x, a, f in gaps:
        if (x not in by_tensor and (x, a) not in found and _per_byte(profile, x) < dearest
                and recompute_problem(profile, x, f) is None):
            found[(x, a)] = (f, None)
    chains = []
    for (x, a), (f, k) in found.items():
        inside = [r for r in remakes if r[2] != k and at(actions[r[1]].after) > a and at(actions[r[2]].before) <= f]
        chains += [("chain", x, a, f, k, ())] + [("chain", x, a, f, k, r[1:]) for r in inside[:CHAIN_TAKE_BACKS]]
    return chains


def _per_byte(profile, tid: str) -> float:
    """The time a recompute of ``tid`` takes per byte it regenerates."""
    return profile.ops[profile.producer[tid]].time_us / max(profile.tensor_by_id[tid].bytes, 1)


def _last_touch_before(profile, tid: str, f: int) -> int | None:
    """The last op before position ``f`` that touches ``tid``, when the tensor is idle
    from there to ``f`` (None when it is made at ``f`` or later, or touched just before)."""
    points = touches(profile, tid)
    before = [p for p in points if p < f]
    return before[-1] if before and before[-1] < f - 1 else None


def _chained(ids: list[str], index: dict[str, int], actions: list, tid: str, a: int, f: int, k: int | None,
             taken: tuple, profile) -> list:
    """``actions`` with ``tid`` dropped after op a and recomputed just before op f (ahead
    of recompute k, or last), the prefetches of its producer's inputs that would land
    after that due by then, and the actions at ``taken`` left out."""
    if taken:
        k = None if k is None else k - sum(n < k for n in taken)
        actions = [act for n, act in enumerate(actions) if n not in taken]
    k = len(actions) if k is None else k
    reads = set(profile.ops[profile.producer[tid]].inputs)
    due = {n for n, act in enumerate(actions)
           if act.kind == "prefetch" and act.tensor in reads and act.before is not None and index[act.before] > f
           and (act.after is None or index[act.after] < f)}
    changed = [replace(act, before=ids[f]) if n in due else act for n, act in enumerate(actions)]
    changed = changed[:k] + [recompute(tid, ids[f])] + changed[k:]
    return _inserted(changed, drop(tid, ids[a]), index)


def _hosted(ids: list[str], index: dict[str, int], actions: list, tids: tuple, profile) -> list:
    """``actions`` with each of ``tids`` (persistent tensors whose first action copies out
    the value they started with) started in host memory instead: that copy out becomes a
    drop after the last read in its window (the host copy is valid, R16), with a prefetch
    ``HOST_LEAD`` ops before the first use (none when the copy out came before it), and a
    tensor the plan leaves on the GPU goes back to host memory after its last use (R20: by
    a drop when nothing updated it, else a copy out)."""
    changed = list(actions)
    for tid in tids:
        where = [n for n, act in enumerate(changed) if act.tensor == tid]
        out, used = changed[where[0]], touches(profile, tid)
        a = index[out.after]
        later = changed[where[1]] if len(where) > 1 else None
        until = index[later.before] if later is not None and later.before is not None else len(ids)
        updated = bool(profile.updaters.get(tid))
        ends_on_gpu = changed[where[-1]].kind == "prefetch"
        changed.pop(where[0])
        if used and used[0] <= a:
            read = max([a] + [i for i in used if i < until])
            changed = _inserted(changed, drop(tid, ids[read]), index)
            use = used[0]
            changed = _inserted(changed, prefetch(tid, ids[use - HOST_LEAD] if use >= HOST_LEAD else None, ids[use]),
                                index)
        if ends_on_gpu and used:
            back = offload(tid, ids[used[-1]]) if updated else drop(tid, ids[used[-1]])
            changed = _inserted(changed, back, index)
    return changed


def _applied(ids: list[str], index: dict[str, int], actions: list, change: tuple, profile=None) -> list:
    """``actions`` with one change of ``_neighbours`` made (``ids``: the op ids in order,
    ``index``: their positions)."""
    if change[0] == "issue":
        _, j, k = change
        return _inserted(actions[:j] + actions[j + 1:], replace(actions[j], after=ids[k]), index)
    if change[0] == "add":
        _, tid, a, f, b = change
        return _inserted(_inserted(actions, offload(tid, ids[a]), index), prefetch(tid, ids[f], ids[b]), index)
    if change[0] == "host":
        return _hosted(ids, index, actions, change[1], profile)
    if change[0] == "start":
        return [replace(actions[change[1]], after=None)] + actions[:change[1]] + actions[change[1] + 1:]
    if change[0] == "chain":
        _, tid, a, f, k, taken = change
        return _chained(ids, index, actions, tid, a, f, k, taken, profile)
    if change[0] == "remake":
        return [act for n, act in enumerate(actions) if n not in change[1:]]
    if change[0] == "swap":
        _, j, k, lead = change
        gone, use = actions[j], index[actions[k].before]
        rest = [act for n, act in enumerate(actions) if n not in (j, k)]
        issued = ids[max(use - lead, index[gone.after] + 1)]
        return _inserted(_inserted(rest, offload(gone.tensor, gone.after), index),
                         prefetch(gone.tensor, issued, actions[k].before), index)
    return [act for act in actions if act.tensor != change[1]]


def _inserted(actions: list, act, index) -> list:
    """``actions`` with ``act`` placed last among those issued after the same op (R7:
    actions after one op are enqueued in plan order)."""
    at = -1 if act.after is None else index[act.after]
    k = next((n for n, other in enumerate(actions)
              if other.after is not None and index[other.after] > at), len(actions))
    return actions[:k] + [act] + actions[k:]
