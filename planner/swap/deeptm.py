"""``deeptm``: tensor heat, a swap ILP over the cold tensors, and aggregated transfers,
after DeepTM (Zhou et al., "DeepTM: Efficient Tensor Management in Heterogeneous
Memory for DNN Training", IEEE TPDS 35(11), 2024). DeepTM manages a TensorFlow
training step on persistent memory (PM) and DRAM: it rates each tensor's *heat* from
four weighted features, keeps hot tensors in fast memory, decides the migration of the
others with an ILP model and deep reinforcement learning (DRL; its reward counts
migration cost and out-of-memory events), and aggregates migrations: tensors are laid
out on contiguous pages sorted by reuse distance, and adjacent tensors move in one
transaction.

What it does
------------
1. **Heat.** Every tensor with an idle interval that the swap ILP could move (the
   candidates of planner/shared/ilp/candidates.py: intervals of at least four ops spanning an
   op over the budget, host tier) is rated on four features, each turned into its
   percentile rank r in [0, 1] among those tensors:

   - *access count* (``w_access``): the ops that make, read or update it: frequently
     touched tensors are hot;
   - *reuse distance* (``w_reuse``): the largest number of ops between two
     consecutive touches: a short one is hot (1 - r);
   - *idle time* (``w_idle``): its longest idle interval on the ideal timeline over its
     round trip on PCIe (latency + bytes / rate, out and back): a move that cannot hide
     is hot (1 - r);
   - *size* (``w_size``): bytes: small tensors free little and cost a latency each,
     so they are hot (1 - r).

   heat = the weighted sum over the sum of the weights. The ``hot`` share of those
   tensors with the highest heat stay on the GPU (none of their intervals is a
   candidate).
2. **Swap ILP over the cold tensors** (host memory only). The project's interval MILP
   (planner/shared/ilp/rows.py, as ``tmof`` uses it without the token) is built over the
   cold tensors' candidate intervals and solved by HiGHS within the time limit
   (``--time-limit``, default 60 s; a model above ``fix_above`` columns is reduced by
   LP-guided fixing first). If the cold tensors cannot cover some op's excess over the
   budget (checked before solving, from the candidates' bytes at each op), ``hot`` is
   halved until they can (0: every candidate); if HiGHS proves the cold model
   infeasible (the byte check ignores the model's timing), it is solved again over
   every candidate in the time left. The solution is lowered, refined and polished as
   tmof's is (each prefetch queue order tried, the fastest simulated kept; ``polish``).
   The fastest of g10's host-only plan, lms's and autoswap's
   (planner/shared/ilp/common.py ``best_heuristic``; with
   ``start_positions`` the model first gains the positions its moves ran at, refine.py
   ``at_positions_of``) is the MILP's start where the model has its moves (planner/shared/ilp/common.py
   ``best_start``; hot tensors' moves are not, and moves are added where it needs more
   memory freed), the fallback when the solver finds nothing, and is returned instead
   only when the simulator runs it strictly faster.
3. **Aggregation** (R53). The plan's offloads issued after the same op, and its
   prefetches issued after the same op and due before the same op, to the same tier,
   are *adjacent in use order* (the same last use, or the same next use); they are
   ordered by their tensor's reuse distance, as DeepTM's pages are, and cut into runs
   of at most ``page_bytes`` bytes (-1: ten latencies' worth of PCIe bytes, so that a
   group is large enough that its one latency matters little; 0: no cap); each run of
   two or more is one group, one transfer. Also tried: the prefetches due at one op
   all issued after the earliest of them (so more of them share a group). Each way is
   simulated with the plan ungrouped, and the fastest that runs within the budget is
   kept (notes: ``aggregation``, ``ungrouped_us``).

Departures from the paper, and why
----------------------------------
1. **GPU and host DRAM instead of DRAM and PM**: fast memory is the GPU, slow memory
   host DRAM over PCIe (the simulator's copies); no SSD (DeepTM has two tiers).
2. **An exact MILP instead of DRL.** DeepTM trains a DRL agent for global migration
   decisions (its reward: migration cost and OOM). Here the swap MILP over the cold
   candidates decides them: its objective is the predicted iteration time with the
   copies' time in it (migration cost), and memory within the budget at every op is a
   constraint (no OOM), so it optimises what the reward scores, within its time limit.
   The MILP is this project's (planner/shared/ilp), not DeepTM's ILP model, whose exact form
   is not public to us.
3. **The four features are this module's choice.** The summary we have says "four
   weighted features" without naming them; the four above are the access pattern facts
   a profile gives (count, reuse distance, idle time against copy time, size), and the
   weights are parameters (default equal). Heat decides only which tensors the MILP
   may move, not a migration on its own.
4. **Aggregation after the decision.** The MILP prices each copy with its own latency
   and does not know that grouped copies share one; aggregation is applied to its
   plan afterwards and judged by the simulator. Pages are not modelled (copies are per
   tensor); "adjacent" means the same issue op, and before op for prefetches, which R53
   requires of a group.
5. **Weights and optimizer state move within the iteration** like every other tensor
   the MILP may move (moves_persistent=True), never starting the iteration off the GPU.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from simulator.model.links import link_speed
from simulator.plan import Action

from ..core.api import score, simulator_for
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import op_start_us, touches
from ..shared.ilp.candidates import candidates
from ..shared.ilp.common import (DEFAULT_GAP, DEFAULT_TIME_LIMIT, HOST_HEURISTICS, POLISH, START_POSITIONS_ON,
                                 best_heuristic, best_start, fix_by_relaxation, lower_fastest, why_no_solution)
from ..shared.ilp.refine import at_positions_of, polish_s, polished, refine, round_s
from ..shared.ilp.rows import Formulation

WINDOW = 20


def percentile(values: list[float]) -> np.ndarray:
    """Each value's rank among ``values`` in [0, 1] (ties share their mean rank)."""
    v = np.asarray(values, dtype=float)
    if len(v) <= 1:
        return np.zeros(len(v))
    order = v.argsort(kind="stable")
    ranks = np.empty(len(v))
    ranks[order] = np.arange(len(v), dtype=float)
    for value in np.unique(v):          # ties: mean rank
        same = v == value
        if same.sum() > 1:
            ranks[same] = ranks[same].mean()
    return ranks / (len(v) - 1)


def heat(profile, hardware, tensor_ids: list[str], weights: dict[str, float]) -> dict[str, float]:
    """Each tensor's heat (0 cold .. 1 hot) from its four features (module docstring)."""
    if not tensor_ids:
        return {}
    starts = op_start_us(profile)
    lat_out, rate_out = link_speed(hardware, "offload", "host")
    lat_in, rate_in = link_speed(hardware, "prefetch", "host")
    count, reuse, idle, size = [], [], [], []
    for tid in tensor_ids:
        points = touches(profile, tid)
        nbytes = profile.tensor_by_id[tid].bytes
        gaps = list(zip(points, points[1:]))
        count.append(len(points))
        reuse.append(max((b - a for a, b in gaps), default=0))
        longest = max((starts[b] - starts[a + 1] for a, b in gaps), default=0.0)
        idle.append(longest / (lat_out + lat_in + nbytes / rate_out + nbytes / rate_in))
        size.append(nbytes)
    total = sum(weights.values()) or 1.0
    score_ = (weights["access"] * percentile(count) + weights["reuse"] * (1 - percentile(reuse))
              + weights["idle"] * (1 - percentile(idle)) + weights["size"] * (1 - percentile(size))) / total
    return dict(zip(tensor_ids, score_.tolist()))


def covers(profile, budget: int, cands) -> bool:
    """Can these candidates free every op's excess over the budget (by bytes, each
    interval counted once over the ops it may be away for)?"""
    resident = np.asarray(profile.resident_bytes, dtype=np.int64)
    excess = resident - budget
    if excess.max() <= 0:
        return True
    freed = np.zeros(len(resident) + 1, dtype=np.int64)
    seen = set()
    for c in cands:
        if (c.tensor, c.after) in seen:
            continue
        seen.add((c.tensor, c.after))
        freed[c.release[0]] += c.nbytes
        freed[c.fetch[-1] + 1] -= c.nbytes
    freed = np.cumsum(freed)[:-1]
    return bool(np.all(freed[excess > 0] >= excess[excess > 0]))


def cold_candidates(profile, hardware, budget: int, cands, weights: dict, hot: float):
    """The candidates of tensors outside the ``hot`` share by heat, with ``hot`` halved
    until they cover the budget; (candidates, hot share used, heat, hot tensors)."""
    order = {t.id: k for k, t in enumerate(profile.tensors)}
    tensor_ids = sorted({c.tensor for c in cands}, key=order.__getitem__)
    rated = heat(profile, hardware, tensor_ids, weights)
    ordered = sorted(tensor_ids, key=lambda t: (-rated[t], t))
    share = hot
    while True:
        kept = set(ordered[:int(round(share * len(ordered)))])
        cold = [c for c in cands if c.tensor not in kept]
        if share <= 0 or covers(profile, budget, cold):
            return cold, share, rated, kept
        share = share / 2 if share > 0.01 else 0.0


# ----------------------------------------------------------------------------- aggregation


def reuse_distance(profile) -> dict[str, int]:
    """Tensor id -> the largest number of ops between two consecutive touches."""
    found = {}
    for t in profile.tensors:
        points = touches(profile, t.id)
        found[t.id] = max((b - a for a, b in zip(points, points[1:])), default=0)
    return found


def aggregate(actions: list[Action], profile, hardware, page_bytes: int, align: bool = False) -> tuple[list, int, int]:
    """DeepTM's aggregation as R53 groups: offloads after one op, prefetches after one op
    and before one op, to one tier (not grouped already, no compute codec), sorted by
    their tensor's reuse distance and cut into runs of at most ``page_bytes`` (0: no
    cap); each run of two or more is a group, its members placed together where the
    first of them was. ``align``: first issue every prefetch due at one op (same tier)
    after the earliest of them. Returns (actions, groups, members)."""
    if hardware.pcie.latency_us <= 0:
        return list(actions), 0, 0
    codecs = {codec.name: codec for codec in hardware.codecs}
    distance = reuse_distance(profile)
    nbytes = {t.id: t.bytes for t in profile.tensors}
    actions = list(actions)
    if align:
        actions = align_prefetches(actions, profile)

    def key(a: Action):
        if a.kind not in ("offload", "prefetch") or a.group is not None:
            return None
        if a.codec is not None and codecs.get(a.codec) is not None and codecs[a.codec].where == "compute":
            return None
        tier = a.to if a.kind == "offload" else a.source
        if tier != "host":
            return None
        return a.kind, a.after, a.before, tier

    members: dict = {}
    for k, a in enumerate(actions):
        g = key(a)
        if g is not None:
            members.setdefault(g, []).append(k)
    group_of: dict[int, str] = {}
    runs = 0
    for g, ks in members.items():
        if len(ks) < 2:
            continue
        ks = sorted(ks, key=lambda k: (distance[actions[k].tensor], actions[k].tensor))
        run, size = [], 0
        chunks = []
        for k in ks:
            b = nbytes[actions[k].tensor]
            if run and page_bytes > 0 and size + b > page_bytes:
                chunks.append(run)
                run, size = [], 0
            run.append(k)
            size += b
        chunks.append(run)
        for chunk in chunks:
            if len(chunk) < 2:
                continue
            runs += 1
            for k in chunk:
                group_of[k] = f"g{runs}"
    if not group_of:
        return actions, 0, 0
    # members together, in reuse-distance order, where the first of them was
    placed: set = set()
    out = []
    by_group: dict[str, list[int]] = {}
    for k in sorted(group_of, key=lambda k: (distance[actions[k].tensor], actions[k].tensor)):
        by_group.setdefault(group_of[k], []).append(k)
    for k, a in enumerate(actions):
        g = group_of.get(k)
        if g is None:
            out.append(a)
        elif g not in placed:
            placed.add(g)
            out.extend(replace(actions[j], group=g) for j in by_group[g])
    return out, runs, len(group_of)


def align_prefetches(actions: list[Action], profile) -> list[Action]:
    """Every prefetch due at one op from one tier issued after the earliest of them, or
    as soon after it as the tensor allows (its last touch before the due op, and the
    offload that wrote its copy)."""
    index = profile.op_index
    pos = lambda op: -1 if op is None else index[op]   # noqa: E731

    def movable(a: Action) -> bool:
        return a.kind == "prefetch" and a.group is None and a.codec is None and a.before is not None

    earliest: dict = {}
    for a in actions:
        if movable(a):
            k = (a.before, a.source)
            earliest[k] = min(earliest.get(k, pos(a.after)), pos(a.after))
    out, offloaded = [], {}
    for a in actions:
        if a.kind == "offload":
            offloaded[a.tensor] = max(offloaded.get(a.tensor, -1), pos(a.after))
        if movable(a):
            due = index[a.before]
            last = max([p for p in touches(profile, a.tensor) if p < due], default=-1)
            lower = max(earliest[a.before, a.source], last, offloaded.get(a.tensor, -1))
            if lower < pos(a.after):
                a = replace(a, after=profile.ops[lower].id if lower >= 0 else None)
        out.append(a)
    return out


def best_aggregation(sim, budget: int, actions: list[Action], initial: dict, page_bytes: int):
    """The ungrouped plan and every aggregation way (page cap or none; prefetches aligned
    or not), simulated on ``sim``; the fastest that runs within the budget, and notes."""
    profile, hardware = sim.profile, sim.hardware
    plain = score(sim, budget, actions, initial)
    lat, rate = link_speed(hardware, "prefetch", "host")
    auto = int(10 * lat * rate)
    caps = [auto, 0] if page_bytes < 0 else [page_bytes]
    best = (plain, actions, "none")
    notes = {"ungrouped_us": plain.iteration_us if plain.ok else None}
    for cap in dict.fromkeys(caps):
        for align in (False, True):
            grouped, groups, members = aggregate(actions, profile, hardware, cap, align)
            if not groups:
                continue
            tried = score(sim, budget, grouped, initial)
            name = f"page_bytes={cap}{', prefetches aligned' if align else ''}: {groups} groups of {members}"
            if tried.ok and (not best[0].ok or tried.iteration_us < best[0].iteration_us):
                best = (tried, grouped, name)
    notes["aggregation"] = best[2]
    if best[2] != "none":
        notes["grouped_us"] = best[0].iteration_us
        notes["groups"] = len({a.group for a in best[1] if a.group is not None})
    return best[1], best[0], notes


# ----------------------------------------------------------------------------- the MILP


def solve_cold(profile, hardware, budget: int, cands, options, gap: float, fix_above: int, fallback, notes: dict,
               start_positions: bool = False, window: int | None = None, polish: bool = True):
    """tmof's solve (planner/shared/ilp/solve.py ``solve_swap_milp``) over the given
    candidates: (actions, initial, status, gap, estimate)."""
    started = time.perf_counter()
    deadline = options.deadline(started, DEFAULT_TIME_LIMIT)
    sim = simulator_for(profile, hardware, options)
    form = Formulation(profile, hardware, budget, cands)
    built = time.perf_counter() - started
    notes.update(columns=form.model.num_cols, rows=form.model.num_rows, over_budget_ops=len(form.over_ops))
    if not form.over_ops:
        return [], {}, "optimal", 0.0, profile.ideal_us
    if form.uncovered:
        backup = fallback()
        notes.update(fallback=f"{len(form.uncovered)} ops over the budget that no cold interval can relieve: "
                              "the heuristic plan")
        return backup.actions, backup.initial, "heuristic", None, None
    if form.model.num_cols > fix_above:
        form, _ = fix_by_relaxation(form, max(1.0, 0.3 * (deadline - time.perf_counter())), options, False, notes)
    backup = fallback()
    backup_result = score(sim, budget, backup.actions, backup.initial)
    notes.update(heuristic=backup.notes.get("heuristic"))
    if start_positions:
        form, grown = at_positions_of(form, sim, budget, backup.actions, backup.initial, False, window)
        notes.update(start_positions=grown)
    left = deadline - time.perf_counter()
    limit = max(1.0, left - min(0.05 * left, 10.0))
    options.say(f"deeptm MILP: {form.model.num_cols} columns, {form.model.num_rows} rows; "
                f"solving (limit {limit:.0f} s)")
    start = best_start(form, sim, budget, backup, max(1.0, 0.1 * limit), options.threads, notes,
                       copy_start=start_positions)
    left = deadline - time.perf_counter()
    rounds_s, polish_for = round_s(built, left), polish_s(left) if polish else 0.0
    limit = max(1.0, left - min(0.05 * left, 10.0) - rounds_s - polish_for)
    solution = form.model.solve(limit, options.threads, options.seed, gap, start=start)
    if solution.status == "feasible":
        solution = form.model.polish(solution, max(1.0, deadline - time.perf_counter()), options.threads, gap)
    notes.update(solver=solution.model_status, mip_gap=solution.gap)
    if solution.values is None:
        why = why_no_solution(form, solution.model_status)
        notes.update(fallback=f"over the cold tensors, {why}: the heuristic plan")
        return backup.actions, backup.initial, "heuristic", None, None
    lowering = time.perf_counter()
    best = lower_fastest(profile, sim, budget, form, solution.values, advances=(0,))   # offloads as solve.py
    first_us = best.estimate_us
    best, rounds = refine(form, sim, budget, best, deadline + rounds_s - (time.perf_counter() - lowering), options,
                          gap, token=False, advances=(0,), overrun_s=rounds_s)
    if rounds or best.estimate_us != first_us:   # refined (a last pass may time the plan without a round)
        notes.update(refinement=rounds, first_model_objective_us=first_us)
    if polish:
        best = polished(sim, budget, best, polish_for, notes)
    result, actions, estimate = best.result, best.actions, best.estimate_us
    notes.update(moved=len(best.chosen), model_objective_us=estimate)
    notes.update(heuristic_us=backup_result.iteration_us if backup_result.ok else None,
                 simulated_us=result.iteration_us if result.ok else None)
    if backup_result.ok and (not result.ok or backup_result.iteration_us < result.iteration_us):   # strictly faster
        notes.update(fallback="the heuristic plan simulated faster than the solver's")
        return backup.actions, backup.initial, "heuristic", solution.gap, estimate
    return actions, {}, solution.status, solution.gap, estimate


@register("deeptm", "DeepTM: tensor heat from four weighted features; hot tensors stay, the swap MILP moves the "
                    "cold ones (host only, in place of DeepTM's DRL); transfers adjacent in use order aggregated "
                    "into groups (R53).",
          params=(Param("hot", 0.3, "share of the movable tensors, by heat, that stay on the GPU (halved until "
                                    "the rest can meet the budget)", low=0.0, high=1.0),
                  Param("w_access", 1.0, "heat weight of the access count", low=0.0),
                  Param("w_reuse", 1.0, "heat weight of a short reuse distance", low=0.0),
                  Param("w_idle", 1.0, "heat weight of a short idle time against the PCIe round trip", low=0.0),
                  Param("w_size", 1.0, "heat weight of a small size", low=0.0),
                  Param("window", WINDOW, "ops before / after a use within which a move may run", low=1, high=4096),
                  Param("page_bytes", -1, "aggregate transfers in runs of at most this many bytes (-1: try ten "
                                          "PCIe latencies' worth and no cap; 0: no cap)", low=0, also=(-1,)),
                  Param("gap", 1e-3, "stop when the MILP's solution is proven within this relative gap",
                        low=0.0, high=1.0),
                  Param("fix_above", 100_000, "MILPs with more columns are first reduced by LP-guided fixing",
                        low=1, high=10**9),
                  START_POSITIONS_ON, POLISH),
          moves_persistent=True,
          paper="Zhou et al., DeepTM: Efficient Tensor Management in Heterogeneous Memory for DNN Training, "
                "IEEE TPDS 35(11), 2024",
          searches=True, family="swap")
def plan_deeptm(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, hot=0.3, w_access=1.0, w_reuse=1.0,
                w_idle=1.0, w_size=1.0, window=WINDOW, page_bytes=-1, gap=1e-3, fix_above=100_000,
                start_positions=True, polish=True) -> Draft:
    weights = {"access": w_access, "reuse": w_reuse, "idle": w_idle, "size": w_size}
    cands = candidates(profile, hardware, budget_bytes, window, ("host",))
    notes: dict = {"candidates": len(cands), "window": window}
    if max(profile.resident_bytes, default=0) <= budget_bytes:
        return Draft(status="optimal", gap=0.0, estimate_us=profile.ideal_us, notes={**notes, "why": "everything fits"})
    cold, share, rated, kept = cold_candidates(profile, hardware, budget_bytes, cands, weights, hot)
    notes.update(hot_share=share, hot_tensors=len(kept), cold_tensors=len({c.tensor for c in cold}),
                 cold_candidates=len(cold))
    options.say(f"deeptm: {len(kept)} hot tensors stay; {len(cold)} of {len(cands)} candidate intervals are cold")
    sim = simulator_for(profile, hardware, options)
    fallback = best_heuristic(profile, hardware, budget_bytes, HOST_HEURISTICS, replace(options, simulator=sim))
    gap = DEFAULT_GAP if gap is None else gap
    started = time.perf_counter()
    actions, initial, status, solved_gap, estimate = solve_cold(
        profile, hardware, budget_bytes, cold, options, gap, fix_above, fallback, notes, start_positions, window,
        polish)
    if notes.get("solver") == "Infeasible" and len(cold) < len(cands):
        # the hot tensors were needed after all (the byte check is not the model's timing): every candidate
        left = (options.time_limit or DEFAULT_TIME_LIMIT) - (time.perf_counter() - started)
        if left > 1.0:
            options.say("deeptm: no plan over the cold tensors; again with every candidate")
            notes.update(hot_share=0.0, hot_tensors=0, cold_tensors=len({c.tensor for c in cands}),
                         cold_candidates=len(cands), retried="no plan over the cold tensors: every candidate")
            notes.pop("fallback", None)
            actions, initial, status, solved_gap, estimate = solve_cold(
                profile, hardware, budget_bytes, cands, replace(options, time_limit=left), gap, fix_above,
                fallback, notes, start_positions, window, polish)
    actions, result, agg = best_aggregation(sim, budget_bytes, list(actions), initial, page_bytes)
    notes.update(agg)
    return Draft(actions=actions, initial=initial, status=status, gap=solved_gap, estimate_us=estimate, notes=notes)
