"""Refinement of an interval MILP's solution against the simulator's timeline.

The model knows a move's release and its prefetch only at the positions of its window
(positions.py ``windows``): an offload must be done within ``window`` ops of the last
use, a prefetch issued within ``window`` ops of the next. The simulator lets an offload
queued on a busy link end later and frees the memory then (R11), and starts a prefetch
when its stream is free (R12), so a plan it runs in T seconds can cost the model far
more (ResNet-152 b512 at 50%: 4.73 s in the model, 4.32 s simulated). Refinement reads,
for each move of the plan, the op its offload had ended by and the op its prefetch's
copy started in, adds those as positions of that move's candidate, prices the plan in
the larger model (now close to the simulated time: it is the plan's own timeline) and
solves again from it. Each round's plan is kept when the simulator runs it faster.
Last, the plan is polished (planner/shared/polish.py): small changes to its moves, each
kept when the simulator runs the plan strictly faster.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from simulator.plan import Plan

from ..polish import polish_in_stages
from .candidates import Candidate, candidates, moved_interval, moves_by_tensor
from .common import Lowered, lower_fastest
from .decode import copy_times, fetched_after, predicted_us, same_choices
from .rows import Formulation

ROUNDS = 2          # refinement rounds at most (the second adds positions only where the first moved them)
SHARE = 0.25        # of the time left after the start, the most kept for refinement
POLISH_SHARE = 0.05  # of the time left before the solve, kept for polish ...
POLISH_MAX_S = 5.0   # ... up to this many seconds


def round_s(build_s: float, left_s: float) -> float:
    """Seconds one refinement round takes, about: it builds the model again, prices a plan
    in it (an LP about as long as the build) and lowers it (simulations, a fraction of
    that), three builds (``build_s``); at most ``SHARE`` of ``left_s``. The solve keeps
    that much back, and the rounds may run that much past the time limit (the second
    round, or the last pricing); a round's solver gets what the first solve left."""
    return min(SHARE * left_s, 3.0 * build_s)


Observed = tuple[int | None, int | None, int, bool]   # a move's release and fetch positions (None: not on the
                                                      # timeline), the op its offload was issued after, and
                                                      # whether the op at the release waited for it to end


def observed_positions(profile, cands: list[Candidate], actions, timeline) -> dict[int, Observed]:
    """Per candidate a plan moves (its offload issued before the interval's end, its
    prefetch due there or, retargeted, at a recompute inside it, in the tier's
    candidate): the op from which the tensor was off
    the GPU on ``timeline`` (the first op that started once the offload had ended) and
    the fetch position of its prefetch (``fetched_after``: the op before the one its copy
    started in, or that op when the copy started after it had ended; the memory is taken
    then, R12), each clipped into the interval (a+2 .. b-2), or None
    where the timeline has no such copy; the op the offload was issued after (its
    copy may run from the next step, ``Candidate.issued``), at most the last use; and
    whether the op at the release started only after the copy had ended, once the op
    before it had (it waited for the memory: ``Candidate.waits``)."""
    index = profile.op_index
    op_starts, op_ends, ended, began = copy_times(profile, timeline)
    by_tensor = moves_by_tensor(cands)
    offloads: dict[str, int] = {}
    prefetches: dict[str, int] = {}
    pending: dict[str, tuple[int, int, str]] = {}
    found: dict[int, tuple[int | None, int | None]] = {}
    for act in actions:
        if act.kind == "offload":
            n = offloads.get(act.tensor, 0)
            offloads[act.tensor] = n + 1
            pending[act.tensor] = (index[act.after], n, act.to)
        elif act.kind == "prefetch":
            m = prefetches.get(act.tensor, 0)
            prefetches[act.tensor] = m + 1
            if act.tensor not in pending:
                continue
            at, n, tier = pending.pop(act.tensor)
            due = index[act.before]
            k = moved_interval(cands, by_tensor, act.tensor, tier, at, due)
            if k is None:
                continue
            c = cands[k]
            last = min(c.before, due) - 2   # due early, at a recompute: done before op ``due``
            clip = lambda i: min(max(i, c.after + 2), last)   # noqa: E731
            done, copied = ended.get((act.tensor, n)), began.get((act.tensor, m))
            ran = None if done is None else int(np.searchsorted(op_starts, done, side="left"))
            release = None if ran is None else clip(ran)
            fetch = None if copied is None else clip(fetched_after(op_starts, op_ends, copied))
            waited = bool(release is not None and release == ran and op_ends[ran - 1] < done)
            found[k] = (release, fetch, min(at, c.after), waited)
    return found


def with_positions(cands: list[Candidate], found: dict[int, Observed]) -> tuple[list[Candidate], int]:
    """``cands`` with the ``found`` positions added to their release and fetch positions
    (a release the op there waited for, as a wait: ``Candidate.waits``) and their offloads
    issued where the plan issued them, and how many candidates changed."""
    out, grown = list(cands), 0
    for k, (release, fetch, issued, waited) in found.items():
        c = cands[k]
        releases = set(c.release) | ({release} if release is not None else set())
        fetches = set(c.fetch) | ({fetch} if fetch is not None else set())
        waits = tuple(sorted(set(c.waits) | ({release} if waited else set())))
        if len(releases) > len(c.release) or len(fetches) > len(c.fetch) or issued != c.issued or waits != c.waits:
            out[k] = replace(c, release=tuple(sorted(releases)), fetch=tuple(sorted(fetches)), issued=issued,
                             waits=waits)
            grown += 1
    return out, grown


def _simulated(form: Formulation, sim, budget: int, actions, initial):
    """A plan's simulated run, with its timeline."""
    plan = Plan(profile_name=form.profile.name, profile_sha256=sim.compiled.sha256, actions=tuple(actions),
                initial=dict(initial or {}))
    return sim.simulate(plan, budget, record=True)


def _rebuilt(form: Formulation, cands: list[Candidate], token: bool) -> Formulation:
    """``form``'s model built again over ``cands`` (the same recomputes, ``reach`` and token)."""
    return Formulation(form.profile, form.hardware, form.budget, cands, one_offload_at_a_time=token, redo=form.redo,
                       reach=form.reach)


def unheld_moves(form: Formulation, actions) -> set[tuple[str, int, str]]:
    """The (tensor, next use, tier) of a plan's offload and prefetch pairs that no
    candidate of ``form`` holds (small tensors, chiefly)."""
    index = form.profile.op_index
    held = {(c.tensor, c.before, c.tier) for c in form.cands if not c.wraps}
    tier_of: dict[str, str] = {}
    out = set()
    for act in actions:
        if act.kind == "offload":
            tier_of[act.tensor] = act.to
        elif act.kind == "prefetch" and act.tensor in tier_of:
            key = (act.tensor, index[act.before], tier_of.pop(act.tensor))
            if key not in held:
                out.add(key)
    return out


def at_positions_of(form: Formulation, sim, budget: int, actions, initial, token: bool,
                    window: int | None = None) -> tuple[Formulation, int]:
    """``form`` with the positions a plan ran at (its simulated timeline) added to the
    candidates it moves, and, given the ``window``, a candidate for each of its moves the
    model had none for (``unheld_moves``); rebuilt when any candidate changed, and how
    many did. A heuristic plan, the solver's MIP start, is then priced at its own
    timeline, not at the window's nearest positions with larger moves covering for its
    small ones (autoswap's plan on GPT-2 at 30%: 5.16 s in the window's model, 4.447 s
    here, as simulated)."""
    if not actions:
        return form, 0
    run = _simulated(form, sim, budget, actions, initial)
    if not run.ok:
        return form, 0
    cands = list(form.cands)
    if window is not None:   # candidates for the moves the model has none for (tensors under SMALL)
        missing = unheld_moves(form, actions)
        tiers = tuple(sorted({c.tier for c in form.cands})) or ("host",)
        cands += [c for c in candidates(form.profile, form.hardware, budget, window, tiers,
                                        only={t for t, _, _ in missing})
                  if (c.tensor, c.before, c.tier) in missing]
    cands, _ = with_positions(cands, observed_positions(form.profile, cands, actions, run.timeline))
    grown = len(cands) - len(form.cands) + sum(1 for old, new in zip(form.cands, cands) if old != new)
    if not grown:
        return form, 0
    return _rebuilt(form, cands, token), grown


def refine(form: Formulation, sim, budget: int, best: Lowered, deadline: float, options, gap: float,
           token: bool, advances=None, overrun_s: float = 0.0) -> tuple[Lowered, list[dict]]:
    """Up to ``ROUNDS`` rounds: the positions ``best`` ran at added to its candidates,
    ``best`` priced in that model (its ``estimate_us`` then), lowered again from there
    (``lower_fastest``) and, with a second or more left before ``deadline``, solved from
    there (by ``deadline`` less ``overrun_s``: pricing and lowering may run into that,
    solving not); a plan the simulator runs faster is kept, and timed by the model in
    the next round, or in a last pass (one LP, run even past ``deadline``, so that the
    time reported is the model's for the plan returned). Returns the best plan and one
    note per round."""
    rounds: list[dict] = []
    extra = {} if advances is None else {"advances": advances}
    timed = None   # the plan whose estimate_us is the current model's time for it
    for round_ in range(ROUNDS + 1):   # the last pass only times the plan the rounds kept
        left = deadline - time.perf_counter()
        last = round_ == ROUNDS or left <= 0   # past the deadline: only time the plan kept (one LP)
        if not best.result.ok or not best.actions or (left <= 0 and best is timed):
            break
        run = _simulated(form, sim, budget, best.actions, best.initial)
        cands, grown = with_positions(form.cands, observed_positions(form.profile, form.cands, best.actions,
                                                                       run.timeline))
        if grown:
            form = _rebuilt(form, cands, token)
        elif best is timed:
            break
        moved, redone, _ = form.choices_of_plan(best.actions, run.timeline, best.initial, copy_start=True)
        x = form.priced(form.values_of(form.cover(moved, redone), redone), max(1.0, left), options.threads)
        if x is None:
            break
        # timed by the model at its own positions (no longer the lower of that and the solution's time: with
        # retargeted prefetches and chain recomputes read as the plan has them, the model holds every move)
        priced_us = predicted_us(form, x)
        best = timed = replace(best, estimate_us=priced_us)
        if last:
            break
        note = {"grown": grown, "columns": form.model.num_cols, "incumbent_model_us": priced_us}
        tried = [lower_fastest(form.profile, sim, budget, form, x, **extra)]   # at the positions it ran at
        limit = (deadline - overrun_s - time.perf_counter()) * (0.5 if round_ + 1 < ROUNDS else 1.0)
        if limit >= 1.0:
            options.say(f"MILP refinement {round_ + 1}: {grown} moves gained the positions they ran at; "
                        f"solving (limit {limit:.0f} s)")
            solution = form.model.solve(limit, options.threads, options.seed, gap, start=x)
            note.update(solver=solution.model_status)
            if solution.values is not None and not same_choices(form, x, solution.values):
                tried.append(lower_fastest(form.profile, sim, budget, form, solution.values, **extra))
        for lowered in tried:
            if lowered.beats(best):
                best = lowered
                note.update(kept=True, model_us=best.estimate_us, simulated_us=best.result.iteration_us)
        rounds.append(note)
    return best, rounds



def polish_s(left_s: float) -> float:
    """Seconds kept for polish out of ``left_s`` (the solve gives them up)."""
    return min(POLISH_SHARE * left_s, POLISH_MAX_S)


def polished(sim, budget: int, best: Lowered, seconds: float, notes: dict) -> Lowered:
    """``best`` after polish (planner/shared/polish.py), for ``seconds`` at most; when it
    kept a change, ``polish`` in the notes says how many, in how many simulations, and
    the time before (``estimate_us`` stays the model's time of the solver's plan)."""
    if not best.result.ok or not best.actions:
        return best
    done = polish_in_stages(sim, budget, best.actions, best.initial, time.perf_counter() + seconds)
    if not done.changes:
        return best
    notes.update(polish={"changes": done.changes, "simulations": done.runs,
                         "before_us": best.result.iteration_us})
    return replace(best, actions=done.actions, initial=done.initial, result=done.result)
