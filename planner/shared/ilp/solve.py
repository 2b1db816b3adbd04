"""How the swap MILPs run: ``solve_swap_milp`` builds the interval MILP (rows.py, over the
candidates of candidates.py), solves it by HiGHS (planner/shared/highs.py), decodes it
(decode.py) and judges it against a heuristic plan, the fallback, so that a plan always
comes back; ``MILP_PARAMS`` are the parameters the planners on it share. The planners:
``autotm`` and ``tmof`` (planner/swap/autotm.py, tmof.py) and ``joint``
(planner/swap_recompute/joint.py); deeptm (planner/swap/deeptm.py) solves the same MILP
its own way.

For all three: the MILP's objective is its predicted iteration time (the sum of step times), and
HiGHS's dual bound is a proven lower bound on that objective for this formulation (not on
every plan: it fixes the op order, the windows and the candidate intervals). The heuristic
fallback (the fastest simulated of g10's, lms's and autoswap's plans, g10 host only for tmof;
for joint the fastest of capuchin's, g10's and lms's, and of g10's with ``recompute``, which is
not a start: common.py ``best_heuristic``, the registered planners run by name, ``heuristic`` in
the notes; autoswap's when none of joint's runs, common.py ``LAST_RESORT``) is planned first
and is the solver's MIP start (common.py ``best_start``; with ``start_positions``, autotm and
tmof, the model first gains the positions the heuristic's moves ran at, refine.py
``at_positions_of``, so that it prices the start at its own timeline): its offload and prefetch pairs
(and, for joint, its drop and recompute pairs) whose interval and tier are candidates
become the model's choices, each release read off the heuristic's simulated timeline;
where the model needs more memory freed than those moves free (g10 starts weights and
optimizer state in host memory, which this model cannot express, and moves tensors too
small to be candidates) moves are added or widened (``Formulation.cover``); an LP places
the copies and times the steps (``Formulation.priced``). The start HiGHS gets is the
fastest in the model of that, the host-only model's solution (autotm with SSD) and the
greedy start. The decoded plan is simulated, and returned whenever it simulates at least
as fast as the heuristic; only a strictly faster heuristic plan is returned instead
(``fallback`` in the notes, with ``heuristic_us`` beside ``simulated_us``; ``solver`` and
``mip_gap`` say what HiGHS proved). The model shares each copy stream's time between
copies step by step, the simulator's FIFO streams (R17) run them one at a time: the
solution is lowered with its prefetches queued in each order of ``QUEUES`` (common.py:
deadline, the model's finishing order, earliest deadline among those issued), each at
the model's fetch positions and ``EARLIER`` ops before them, with the offloads at the
last use or after the last write before it (common.py ``offload_points``, as LMS issues
them), and the fastest simulated is kept; it is refined (refine.py) and, with ``polish``,
polished last (planner/shared/polish.py: small changes to its swaps the simulator judges).

Where the model's time departs from the simulator's (docs/ilp.md): an offload must end
within ``window`` ops of its last use (the paper's window; the simulator lets it run on,
and frees the memory when it ends), so on a transformer, where the forward's offloads
queue on the link long past their window, the model stretches forward steps that the
simulator runs at full speed and stalls later instead: on gpt2-b48-s1024 at 50% the model
is 3-4% above the simulated time of its own plan. Refinement (refine.py, in the time
``round_s`` keeps) adds the positions the plan ran at to its moves, prices it in that
model (``model_objective_us``: within 1% of the simulated time of the plan before polish in all
47 solver cells of six profiles at 50% and 30%; docs/ilp.md), lowers it
again and solves from it. ``reach`` (autotm, off by default)
puts release and fetch positions only at ops over the budget, reaching past the window
to the interval's ends (spaced out), with the copies in pieces between them, running-sum
copy rows (a far tighter LP relaxation) and the offload streams' FIFO queue as rows (a
copy issued late cannot end ahead of the queue): its timing matches the simulator's at
GPT-2's peak, but at 20 s on 2 cores HiGHS does not get past its first incumbents
(docs/ilp.md).

"""
from __future__ import annotations

import time

from ...core.api import score, simulator_for
from ...core.registry import Draft, Param, RunOptions
from .candidates import MS, candidates, recomputes, slower_tiers_dominated, wrap_candidates
from .common import (DEFAULT_GAP, DEFAULT_TIME_LIMIT, POLISH, best_start, fix_by_relaxation, lower_fastest, short_op,
                     why_no_solution)
from .decode import decode_chains, same_choices
from .refine import at_positions_of, polish_s, polished, refine, round_s
from .rows import Formulation


def solve_swap_milp(profile, hardware, budget: int, options: RunOptions, *, tiers: tuple[str, ...], window: int,
                    token: bool, gap: float | None, fallback, recompute_too: bool = False,
                    fix_above: int = 100_000, reach: bool = False, far: int = 0, wrap: bool = False,
                    start_positions: bool = False, polish: bool = True) -> Draft:
    """Build, solve, decode and judge one swap MILP; ``fallback()`` gives the heuristic draft (the
    fallback), ``fallback(start=True)`` the one the solver starts from.
    ``start_positions``: the model first gains the positions the heuristic's moves ran at
    (not for recomputes, nor in the ``reach`` model, whose positions are its own).
    ``polish``: the plan is polished last (refine.py ``polished``)."""
    started = time.perf_counter()
    deadline = options.deadline(started, DEFAULT_TIME_LIMIT)
    sim = simulator_for(profile, hardware, options)
    gap = DEFAULT_GAP if gap is None else gap
    cands = candidates(profile, hardware, budget, window, tiers, reach=reach, far=far)
    if len(tiers) > 1 and slower_tiers_dominated(hardware, cands):
        tiers, cands = ("host",), [c for c in cands if c.tier == "host"]
    wraps = wrap_candidates(profile, hardware, budget, window, far) if wrap and not recompute_too and not reach else []
    cands += wraps
    redo = recomputes(profile, budget) if recompute_too else []
    form = Formulation(profile, hardware, budget, cands, one_offload_at_a_time=token, redo=redo, reach=reach)
    built = time.perf_counter() - started
    notes = {"tiers": list(tiers), "candidates": len(cands), "recompute_candidates": len(redo), "columns": form.model.num_cols, "rows": form.model.num_rows,
             "over_budget_ops": len(form.over_ops), "window": window, "reach": reach}   # no timings: plans stay byte-identical
    if not form.over_ops:
        return Draft(status="optimal", gap=0.0, estimate_us=profile.ideal_us, notes=notes)
    if not reach and (form.uncovered or short_op(form) is not None):
        # no plan in the window's model: let the uses wait for their prefetches (a fetch position at the op before)
        cands = candidates(profile, hardware, budget, window, tiers, far=far, sync=True) + wraps
        form = Formulation(profile, hardware, budget, cands, one_offload_at_a_time=token, redo=redo, reach=reach)
        notes.update(synchronous_fetches=sum(c.synchronous for c in cands), columns=form.model.num_cols,
                     rows=form.model.num_rows)
    if form.uncovered:   # an op over the budget that no candidate interval can free memory at
        backup = fallback()
        notes.update(fallback=f"{len(form.uncovered)} ops over the budget that no interval in the model can "
                              f"relieve (first {form.uncovered[0]!r}): the heuristic plan")
        return Draft(actions=backup.actions, initial=backup.initial, schedule=backup.schedule, status="heuristic",
                     notes=notes)
    full_bound = None
    if form.model.num_cols > fix_above:
        form, full_bound = fix_by_relaxation(form, max(1.0, 0.3 * (deadline - time.perf_counter())), options,
                                              token, notes)
        cands = form.cands
    backup = fallback()   # first, so that the time limit covers it
    start_from = fallback(start=True)   # the solver starts from it (the same plan unless ``also`` gave the backup)
    backup_result = score(sim, budget, backup.actions, backup.initial, backup.schedule)
    if backup.notes.get("heuristic"):
        notes.update(heuristic=backup.notes["heuristic"])
    if start_from.notes.get("heuristic") != backup.notes.get("heuristic"):
        notes.update(start_heuristic=start_from.notes.get("heuristic"))
    start_positions = start_positions and not recompute_too and not reach
    if start_positions:   # the heuristic's moves at the positions it ran at: its price is then its own timeline's
        form, grown = at_positions_of(form, sim, budget, start_from.actions, start_from.initial, token, window)
        cands = form.cands
        notes.update(start_positions=grown)
    given = None
    if len(tiers) > 1:
        # host moves alone first (a smaller model HiGHS solves fast): its plan starts the full one
        host = Formulation(profile, hardware, budget, [c for c in cands if c.tier == "host"], token, reach=reach)
        limit = max(1.0, 0.5 * (deadline - time.perf_counter()))
        host_start = best_start(host, sim, budget, start_from, limit, options.threads, {})
        options.say(f"MILP, host moves only: {host.model.num_cols} columns; solving (limit {limit:.0f} s)")
        first = host.model.solve(limit, options.threads, options.seed, gap, start=host_start)
        if first.values is not None:
            given = form.extend(host, first.values)
            notes.update(host_only_us=first.objective / MS, host_only_gap=first.gap)
    start = best_start(form, sim, budget, start_from, max(1.0, 0.1 * (deadline - time.perf_counter())),
                       options.threads, notes, given, copy_start=start_positions)
    left = deadline - time.perf_counter()
    rounds_s, polish_for = round_s(built, left), polish_s(left) if polish else 0.0
    limit = max(1.0, left - min(0.05 * left, 10.0) - rounds_s - polish_for)   # the rest: lowering, refining, polish
    options.say(f"MILP: {form.model.num_cols} columns, {form.model.num_rows} rows; solving (limit {limit:.0f} s)")
    solution = form.model.solve(limit, options.threads, options.seed, gap, start=start)
    if solution.status == "feasible":   # stopped early: place its copies as well as they go
        solution = form.model.polish(solution, max(1.0, deadline - time.perf_counter()), options.threads, gap)
    options.say(f"MILP solved in {time.perf_counter() - started - built:.1f} s: {solution.model_status}")
    if full_bound is not None:   # the MIP's bound holds for the reduced model only: report the full one's
        notes.update(reduced_model_bound_us=None if solution.bound is None else solution.bound / MS)
        solution = solution.against_bound(full_bound)
    notes.update(solver=solution.model_status,
                 mip_gap=solution.gap, model_bound_us=None if solution.bound is None else solution.bound / MS)
    if solution.values is None:
        notes.update(fallback=f"{why_no_solution(form, solution.model_status)}: the heuristic plan")
        return Draft(actions=backup.actions, initial=backup.initial, schedule=backup.schedule, status="heuristic",
                     notes=notes)
    if start is not None and same_choices(form, start, solution.values):
        notes.update(improved_start=False)   # the solver's plan is its MIP start's choices (``start`` says whose)
    lowering = time.perf_counter()
    best = lower_fastest(profile, sim, budget, form, solution.values)
    first_us = best.estimate_us
    best, rounds = refine(form, sim, budget, best, deadline + rounds_s - (time.perf_counter() - lowering), options,
                          gap, token, overrun_s=rounds_s)
    if rounds or best.estimate_us != first_us:   # refined (a last pass may time the plan without a round)
        notes.update(refinement=rounds, first_model_objective_us=first_us)
    if polish:
        best = polished(sim, budget, best, polish_for, notes)
    result, estimate = best.result, best.estimate_us
    notes.update(moved=len(best.chosen), start_in_host=len(best.initial), recomputed=len(best.redone),
                 chain_recomputes=len(decode_chains(best.redone)), prefetch_queue=best.queue,
                 model_objective_us=estimate, simulated_us=result.iteration_us if result.ok else None)
    notes.update(heuristic_us=backup_result.iteration_us if backup_result.ok else None)
    if backup_result.ok and (not result.ok or backup_result.iteration_us < result.iteration_us):   # strictly faster
        notes.update(fallback="the heuristic plan simulated faster than the solver's" if result.ok
                     else "the solver's plan does not run within the budget: the heuristic plan")
        return Draft(actions=backup.actions, initial=backup.initial, schedule=backup.schedule, status="heuristic", gap=solution.gap,
                     estimate_us=estimate, notes=notes)
    return Draft(actions=best.actions, initial=best.initial, status=solution.status, gap=solution.gap,
                 estimate_us=estimate, notes=notes)


MILP_PARAMS = (   # the parameters every planner on solve_swap_milp takes, last
    POLISH,
    Param("gap", 1e-3, "stop when the solution is proven within this relative gap of the optimum",
          low=0.0, high=1.0),
    Param("fix_above", 100_000, "models with more columns are first reduced by LP-guided fixing (the LP "
                                "relaxation by IPM; candidates it leaves unused are fixed to stay)",
          low=1, high=10**9),
)
