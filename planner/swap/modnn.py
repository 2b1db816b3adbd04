"""``modnn``: offload on allocation failure found by simulating the whole iteration, then
per-op algorithm (variant) choice, after moDNN (Chen, Chen, Hu, "moDNN: Memory Optimal
DNN Training on GPUs", DATE 2018). moDNN runs a static simulation of the training task
graph under the memory budget; where an allocation fails it offloads data to host
memory (trying offload sets and keeping the smallest that makes room) and prefetches it
back ahead of its next use; it chooses each convolution's algorithm among all cuDNN
offers (time against workspace), not just the fastest or the smallest, and picks a
sub-batch size.

What it does
------------
1. **Offload on failure** (at most ``rounds`` simulations). The plan so far is simulated
   (simulator.api, C path). Where it stops for lack of memory, the result names the
   compute item that waits (``op``, position ``i``) and the bytes it needs and finds
   free (``blocked``); the deficit is needed - free. The *idle resident* tensors at
   ``i`` are the non-persistent, non-empty ones touched (made, read or updated) before
   ``i`` and again after it but not by ``i`` itself, whose idle interval around ``i`` is
   not moved yet. Of those, the set with the fewest bytes that covers the deficit is
   taken (the smallest set; ties: fewer tensors), found by a knapsack-style dynamic
   program over sizes quantised to 1/512 of the deficit (rounded down, so a set it
   finds always covers), with a greedy cover as the fallback when quantisation hides a
   cover. Each is offloaded to host right after its last touch before ``i`` and
   prefetched before its next touch ``b``, issued no earlier than after op ``i``.
   Where: every moved tensor's copy back (``ahead`` x (latency + bytes / PCIe rate))
   is placed on the ideal timeline to end by its use, and with ``prefetch=queue``
   also by the start of the copy queued after it (the copies laid out back to back on
   the one h2d stream, latest use first; ``alone``: each as if the stream were its
   own); the prefetch is issued after the latest op that ends by the copy's start.
   Then the plan is simulated again; this repeats until it runs within the budget, no
   candidate is left, or the rounds run out. ``prefetch=best`` (default) searches with
   both placements and keeps the faster plan (queue wins on the transformers, where
   the copies fit behind compute; alone on ResNet-50, where the earlier copies of
   queue bring tensors back into the peak and force twice the offloads).
2. **Room from early prefetches.** When the idle resident tensors cannot cover the
   deficit, tensors already moved whose prefetch brings them back before ``i`` count
   too: their prefetch is issued after ``i`` instead (no new copy, possibly a stall),
   as part of the same smallest cover (those cost no bytes).
3. **Variants** (R52; only for ops that list ``variants``). With the plan feasible, ops
   are visited by their possible saving (default time - fastest variant's, largest
   first); each takes the fastest of its algorithms (the default included) that is
   faster than its current one and with which the simulator still runs the plan within
   the budget and no slower. A variant whose workspace never fits is never chosen.
4. **Smallest workspaces first when nothing fits.** If step 1 ends without a feasible
   plan, it is run again from scratch with every op that has a variant of smaller
   workspace than its default set to its smallest-workspace variant (the
   memory-optimal start); step 3 then upgrades ops towards faster ones while the plan
   stays feasible. The better of the two outcomes is returned (a feasible plan first).
   make_plan's floor (and the lower bound) count each op's smallest workspace and
   fastest time among its algorithms for ``modnn`` (with ``variants`` on), so budgets
   only smaller-workspace variants can meet are planned, not refused.

Shipped profiles list no variants, so on them ``modnn`` is an offload-on-failure
planner (steps 1 and 2).

Departures from the paper, and why
----------------------------------
1. **No sub-batching.** moDNN also splits a layer's batch into sub-batches to cut its
   working set; the simulator has no action that splits an op (its time and memory per
   slice are not in a profile), so sub-batch selection is out of scope. A budget below
   the largest single-op working set is therefore refused by make_plan (the floor),
   where moDNN would sub-batch.
2. **"Smallest set" is by bytes.** The paper tries offload sets and keeps the smallest;
   here the smallest is the one that moves the fewest bytes (the least PCIe traffic),
   ties broken by fewer tensors.
3. **Weights stay** (moves_persistent=False): only feature maps and other transient
   tensors are offloaded, as moDNN's offloading targets the data that layers produce.
4. **Variants after offloading**, greedily one op at a time and judged by the simulator
   (feasible and no slower), instead of moDNN's per-layer choice inside its own
   simulation at allocation time. The paper's memory pool is the simulator's byte
   counting (R2: no fragmentation).
5. **Prefetch point from the ideal timeline.** moDNN's static simulation places each
   prefetch with its own timing model; here the copies are laid out on the ideal
   timeline (step 1) and the simulator then decides; early prefetches that cause a
   later failure are delayed (step 2), and the two placements are both searched,
   neither of which the paper describes.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from simulator.api import Simulator
from simulator.model.links import link_speed
from simulator.plan import Plan, offload, prefetch
from simulator.profile import Profile, profile_sha256

from ..core.lowering import OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import op_start_us, touches

UNITS = 512   # the cover's dynamic program quantises sizes to 1/UNITS of the deficit


@dataclass
class Move:
    """One moved idle interval: offloaded after op ``after``, prefetched before op
    ``before`` (positions), issued no earlier than after op ``earliest`` (the op whose
    failure moved it, or later when its prefetch was delayed)."""
    tensor: str
    after: int
    before: int
    earliest: int


def smallest_cover(items: list[tuple[int, int]], deficit: int) -> list[int] | None:
    """Indices of ``items`` ((cost, bytes) pairs) whose bytes sum to at least ``deficit``
    at the least total cost, ties by fewer items; None when all of them together do not
    cover it. Sizes are quantised down to 1/UNITS of the deficit (a set found always
    covers); when that hides every cover, a greedy cover (largest first, then the
    redundant members dropped, smallest first)."""
    if deficit <= 0:
        return []
    total = sum(b for _, b in items)
    if total < deficit:
        return None
    n = len(items)
    scale = n + 1
    units = [min(UNITS, b * UNITS // deficit) for _, b in items]
    inf = np.iinfo(np.int64).max // 4
    best = np.full(UNITS + 1, inf, dtype=np.int64)
    best[0] = 0
    prev = np.full((n, UNITS + 1), -1, dtype=np.int32)
    index = np.arange(UNITS + 1, dtype=np.int32)
    for k, ((cost, _), u) in enumerate(zip(items, units)):
        if u == 0:
            continue
        key = cost * scale + 1
        new = best.copy()
        # targets u .. UNITS from sources 0 .. UNITS-u
        cand = best[:UNITS + 1 - u] + key
        better = cand < new[u:]
        new[u:][better] = cand[better]
        prev[k, u:][better] = index[:UNITS + 1 - u][better]
        # sources above UNITS-u land on UNITS (capped)
        tail = best[UNITS + 1 - u:]
        if len(tail):
            j = int(np.argmin(tail))
            if tail[j] + key < new[UNITS]:
                new[UNITS] = tail[j] + key
                prev[k, UNITS] = UNITS + 1 - u + j
        best = new
    if best[UNITS] < inf:
        chosen, v = [], UNITS
        for k in range(n - 1, -1, -1):
            if prev[k, v] >= 0 and v > 0:
                chosen.append(k)
                v = int(prev[k, v])
        # prev[k, v] may also be set by an earlier state later improved; check the sum
        if sum(items[k][1] for k in chosen) >= deficit:
            return sorted(chosen)
    order = sorted(range(n), key=lambda k: (-items[k][1], items[k][0], k))
    chosen, covered = [], 0
    for k in order:
        if covered >= deficit:
            break
        chosen.append(k)
        covered += items[k][1]
    for k in sorted(chosen, key=lambda k: (items[k][1], k)):
        if covered - items[k][1] >= deficit:
            chosen.remove(k)
            covered -= items[k][1]
    return sorted(chosen)


class _Offloader:
    """Step 1 and 2: offloads on allocation failure, found by simulating."""

    def __init__(self, profile: Profile, hardware, budget: int, ahead: float, queue: bool):
        self.profile, self.budget, self.ahead, self.queue = profile, budget, ahead, queue
        self.simulator = Simulator(profile, hardware)
        self.sha = profile_sha256(profile)
        self.starts = op_start_us(profile)
        lat, rate = link_speed(hardware, "prefetch", "host")
        self.in_us = lambda nbytes: lat + nbytes / rate
        tensors = profile.tensor_by_id
        self.points = {t.id: touches(profile, t.id) for t in profile.tensors
                       if not t.persistent and t.bytes > 0}
        self.points = {tid: pts for tid, pts in self.points.items() if len(pts) >= 2}
        self.bytes = {tid: tensors[tid].bytes for tid in self.points}

    def plan(self, moves: dict, variants: dict) -> Plan:
        return Plan(profile_name=self.profile.name, profile_sha256=self.sha, actions=tuple(self.actions(moves)),
                    variants=dict(variants))

    def actions(self, moves: dict) -> list:
        ops = self.profile.ops
        fetch = self.fetch_points(moves)
        steps = []
        for order, (key, m) in enumerate(sorted(moves.items(), key=lambda km: (km[1].after, km[1].tensor))):
            steps.append(Step(m.after, OFFLOAD, m.before, order, offload(m.tensor, ops[m.after].id, "host")))
            steps.append(Step(fetch[key], PREFETCH, m.before, order,
                              prefetch(m.tensor, ops[fetch[key]].id, ops[m.before].id, "host")))
        return issue_order(steps)

    def simulate(self, moves: dict, variants: dict):
        return self.simulator.simulate(self.plan(moves, variants), self.budget)

    def fetch_points(self, moves: dict) -> dict:
        """Each move's prefetch issue op: with ``queue``, the copies laid out back to back
        on the h2d stream of the ideal timeline, latest deadline first, each ending by
        its use or by the start of the copy queued after it; else each alone, ending by
        its use. A copy takes ``ahead`` x (latency + bytes / rate); it is issued after
        the latest op that ends by its start, never before ``earliest`` nor at or after
        ``before``."""
        starts = self.starts
        found, cursor = {}, float("inf")
        for key, m in sorted(moves.items(), key=lambda km: (-km[1].before, km[1].tensor, -km[1].after)):
            begin = min(starts[m.before], cursor) - self.ahead * self.in_us(self.bytes[m.tensor])
            cursor = begin if self.queue else cursor
            p = bisect.bisect_right(starts, begin) - 2     # the largest p with starts[p + 1] <= begin
            found[key] = max(m.earliest, min(p, m.before - 1))
        return found

    def idle_at(self, i: int, moves: dict) -> list[tuple[str, int, int]]:
        """(tensor, last touch before i, next touch after i) of the idle resident tensors
        at op position ``i`` whose interval is not moved."""
        found = []
        for tid, pts in self.points.items():
            k = bisect.bisect_left(pts, i)
            if k == 0 or k == len(pts) or pts[k] == i:
                continue
            a, b = pts[k - 1], pts[k]
            if (tid, a) not in moves:
                found.append((tid, a, b))
        return found

    def run(self, variants: dict, rounds: int, say) -> tuple[dict, object, dict]:
        """Offload on failure until the plan fits; (moves, last result, notes)."""
        moves: dict[tuple[str, int], Move] = {}
        index = self.profile.op_index
        result = self.simulate(moves, variants)
        used, delayed, why = 0, 0, "fits"
        while not result.ok:
            if used >= rounds:
                why = f"stopped after {rounds} rounds"
                break
            if not result.valid:
                why = f"invalid plan ({result.rule}: {result.reason})"
                break
            blocked = result.blocked or {}
            if result.op is None or result.op not in index or "needed_bytes" not in blocked:
                why = f"cannot be relieved by offloading: {result.reason}"
                break
            i = index[result.op]
            deficit = blocked["needed_bytes"] - blocked["free_bytes"]
            if deficit <= 0:    # waits on something else that needs room: make one tensor's worth
                deficit = max(1, blocked["needed_bytes"] - max(0, blocked["free_bytes"]) // 2)
            idle = self.idle_at(i, moves)
            items = sorted(((self.bytes[t], self.bytes[t], -b, t, a, b) for t, a, b in idle))
            pick = smallest_cover([(c, nb) for c, nb, *_ in items], deficit)
            early = []
            if pick is None:   # room from prefetches that bring tensors back before i
                fetch = self.fetch_points(moves)
                early = sorted((0, self.bytes[m.tensor], -m.before, m.tensor, key)
                               for key, m in moves.items() if m.after < i < m.before and fetch[key] < i)
                both = [(c, nb) for c, nb, *_ in items] + [(c, nb) for c, nb, *_ in early]
                pick = smallest_cover(both, deficit)
                if pick is None:   # take everything there is: the next round may still fit
                    pick = list(range(len(both))) if both else None
            if not pick:
                why = f"no idle tensor left to offload at op {result.op!r} ({deficit} bytes short)"
                break
            for k in pick:
                if k < len(items):
                    _, _, _, t, a, b = items[k]
                    moves[t, a] = Move(t, a, b, i)
                else:
                    key = early[k - len(items)][4]
                    moves[key].earliest = max(moves[key].earliest, i)
                    delayed += 1
            used += 1
            if used % 50 == 0:
                say(f"modnn: {used} rounds, {len(moves)} intervals moved")
            result = self.simulate(moves, variants)
        notes = {"rounds": used, "moved_intervals": len(moves), "delayed_prefetches": delayed,
                 "moved_bytes": sum(self.bytes[m.tensor] for m in moves.values()), "offload_search": why}
        return moves, result, notes


def choose_variants(offloader: _Offloader, moves: dict, variants: dict, result) -> tuple[dict, object, int]:
    """Step 3: per op, the fastest algorithm (default included) faster than its current one
    with which the plan still runs within the budget and no slower."""
    profile = offloader.profile
    ops = [op for op in profile.ops if op.variants]
    choice = dict(variants)
    tried = 0

    def time_of(op, name):
        return op.time_us if name is None else op.variant(name).time_us

    def saving(op):
        return op.time_us - min(v.time_us for v in op.variants)

    for op in sorted(ops, key=lambda op: (-saving(op), profile.op_index[op.id])):
        current = choice.get(op.id)
        options = sorted([None] + [v.name for v in op.variants], key=lambda n: (time_of(op, n), n or ""))
        for name in options:
            if time_of(op, name) >= time_of(op, current):
                break
            trial = dict(choice)
            if name is None:
                trial.pop(op.id, None)
            else:
                trial[op.id] = name
            tried += 1
            r = offloader.simulate(moves, trial)
            if r.ok and r.iteration_us <= result.iteration_us:
                choice, result = trial, r
                break
    return choice, result, tried


def smallest_workspaces(profile: Profile) -> dict:
    """Every op with a variant of smaller workspace than its default, set to its smallest
    (ties: the faster)."""
    chosen = {}
    for op in profile.ops:
        if not op.variants:
            continue
        v = min(op.variants, key=lambda v: (v.workspace_bytes, v.time_us, v.name))
        if v.workspace_bytes < op.workspace_bytes:
            chosen[op.id] = v.name
    return chosen


def _search(profile, hardware, budget: int, ahead: float, queue: bool, rounds: int, has_variants: bool, say):
    """Steps 1, 2 and 4 with one prefetch placement: (offloader, moves, variants to
    start from, result, notes)."""
    offloader = _Offloader(profile, hardware, budget, ahead, queue)
    start: dict = {}
    moves, result, notes = offloader.run(start, rounds, say)
    if not result.ok and has_variants:
        small = smallest_workspaces(profile)
        if small:
            say(f"modnn: default workspaces do not fit; again with {len(small)} smallest-workspace variants")
            moves2, result2, notes2 = offloader.run(small, rounds, say)
            if result2.ok or (result2.valid and result2.progress > result.progress):
                start, moves, result = small, moves2, result2
                notes = {**notes2, "start": "smallest-workspace variants (the default workspaces do not fit)"}
    notes["prefetch"] = "queue" if queue else "alone"
    return offloader, moves, start, result, notes


def _rank(result) -> tuple:
    return (not result.ok, result.iteration_us if result.ok else -result.progress)


@register("modnn", "moDNN: simulate the iteration, offload the smallest set of idle tensors wherever an "
                   "allocation fails (prefetched back ahead of use), then give each op with variants its "
                   "fastest algorithm whose workspace still fits.",
          params=(Param("rounds", 2000, "at most this many simulations for the offload search (per start)",
                        low=1, high=10**6),
                  Param("ahead", 1.0, "a prefetch is issued this many copy times ahead of its use, on the ideal "
                                      "timeline", low=0.0, high=1000.0),
                  Param("prefetch", "best", "queue: prefetches laid out back to back on the copy stream; alone: "
                                            "each as if alone on it; best: both searched, the faster kept",
                        choices=("best", "queue", "alone")),
                  Param("variants", True, "choose op variants (R52) after offloading")),
          moves_persistent=False, variants="variants",
          paper="Chen, Chen, Hu, moDNN: Memory Optimal DNN Training on GPUs, DATE 2018", family="swap")
def plan_modnn(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, rounds=2000, ahead=1.0,
               prefetch="best", variants=True) -> Draft:
    has_variants = variants and any(op.variants for op in profile.ops)
    placements = (True, False) if prefetch == "best" else (prefetch == "queue",)
    best, tried_placements = None, {}
    for queue in placements:
        found = _search(profile, hardware, budget_bytes, ahead, queue, rounds, has_variants, options.say)
        tried_placements[found[4]["prefetch"]] = round(found[3].iteration_us, 3) if found[3].ok else None
        if best is None or _rank(found[3]) < _rank(best[3]):
            best = found
    offloader, moves, start, result, notes = best
    if len(placements) > 1:
        notes["prefetch_tried"] = tried_placements
    chosen = dict(start)
    if has_variants and result.ok:
        chosen, result, tried = choose_variants(offloader, moves, start, result)
        notes.update(variants_tried=tried)
    if has_variants:
        notes.update(variants=len(chosen), variant_ops=sum(1 for op in profile.ops if op.variants))
    if not result.ok:
        notes.update(why=notes.get("offload_search"))
    return Draft(actions=offloader.actions(moves), variants=chosen, status="heuristic", notes=notes)
