"""What the planners on the interval MILP share (autotm, tmof and joint through solve.py,
deeptm in planner/swap/deeptm.py): their default limits, LP-guided fixing for models too
large to solve whole, and the lowering of a solution to plan actions with the prefetches
of each copy stream queued in one of several orders (``QUEUES``). Not a planner.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, replace

import numpy as np

from simulator.plan import Plan, drop, offload, prefetch, recompute

from ...core.api import can_meet, score, simulator_for
from ...core.lowering import DROP, OFFLOAD, PREFETCH, Step, issue_order
from ...core.registry import DEFAULT_OPTIONS, Param, RunOptions, get_planner
from ..facts import held_per_op, touches
from .candidates import MS, Recompute
from .decode import Chosen, decode, decode_chains, decode_recomputes, initial_of, predicted_us, retarget, step_times
from .rows import Formulation


DEFAULT_TIME_LIMIT = 60.0
DEFAULT_GAP = 1e-3
LP_KEEP = 1e-3          # LP-guided fixing keeps the candidates the relaxation moves at least this much


def to_actions(profile, chosen: list[Chosen], redone: list[Recompute] = (),
               chains: list[tuple[int, str]] = (), queue: str = "deadline", step_us=None,
               early_offloads: bool = False) -> list:
    """Offloads after the last use (``early_offloads``: after the last write before it,
    ``offload_points``); prefetches queued on each stream in the ``queue``
    order (``QUEUES``; each held back, if need be, to the issue point of the one queued
    before it); drops after the last use of what is recomputed; the recomputes before
    each op in producer order (a chain's sources first), each chain source dropped again
    after the op that needed it. ``step_us``: the model's step times (default: the ops')."""
    ops = profile.ops
    steps = [Step(r.after, DROP, r.before, r.tensor, drop(r.tensor, ops[r.after].id)) for r in redone]
    steps += [Step(at, DROP, at + 1, tid, drop(tid, ops[at].id)) for at, tid in chains]
    issue = offload_points(profile, chosen, redone, chains) if early_offloads else \
        [ch.candidate.after for ch in chosen]
    for k, (ch, at) in enumerate(zip(chosen, issue)):
        c = ch.candidate
        steps.append(Step(at, OFFLOAD, c.before, k, offload(c.tensor, ops[at].id, c.tier)))
    starts = np.concatenate(([0.0], np.cumsum([op.time_us for op in ops] if step_us is None else step_us)))
    rank = 0
    for tier in sorted({ch.candidate.tier for ch in chosen}):
        latest = -1
        for ch in QUEUES[queue]([ch for ch in chosen if ch.candidate.tier == tier], starts):
            c = ch.candidate
            latest = max(latest, ch.fetch)
            steps.append(Step(latest, PREFETCH, ch.before, rank,
                              prefetch(c.tensor, ops[latest].id, ops[ch.before].id, c.tier)))
            rank += 1
    again = sorted([(r.before, r.tensor) for r in redone] + list(chains),
                   key=lambda bt: (bt[0], profile.producer[bt[1]], bt[1]))
    return issue_order(steps, fifo=True) + [recompute(tid, ops[before].id) for before, tid in again]


def offload_points(profile, chosen: list[Chosen], redone: list[Recompute] = (),
                   chains: list[tuple[int, str]] = ()) -> list[int]:
    """Per moved interval, the earliest op its offload may be issued after: the last op
    before the interval that writes the tensor (its producer or an in-place update), or
    the op a move of it before this one brought it back for, whichever is later. The ops
    between read it while the copy runs (R11's window allows reads, not updates) and the
    copy starts that much sooner on its FIFO stream, as LMS issues its offloads right
    after the producer. A tensor that is also recomputed keeps its offload at the last use."""
    again = {r.tensor for r in redone} | {tid for _, tid in chains}
    back: dict[str, list[int]] = {}   # tensor -> ops a move of it brings it back for
    for ch in chosen:
        back.setdefault(ch.candidate.tensor, []).append(ch.candidate.before)
    touched = {tid: touches(profile, tid) for tid in back}
    points = []
    for ch in chosen:
        c = ch.candidate
        if c.wraps or c.tensor in again:
            points.append(c.after)
            continue
        earlier = [p for p in touched[c.tensor] if p <= c.after]   # the interval's last use is the last of them
        points.append(next((p for p in reversed(earlier) if _written_or_arrives(profile, c.tensor, p, back[c.tensor])),
                           earlier[0]))   # none: resident since the iteration began, from its first touch
    return points


def _written_or_arrives(profile, tid: str, at: int, arrivals: list[int]) -> bool:
    op = profile.ops[at]
    return tid in op.outputs or tid in op.updates or at in arrivals


def _by_release_and_deadline(chosen: list[Chosen], starts) -> list[Chosen]:
    """Earliest deadline first among the prefetches issued by the time the stream is free
    (Jackson's rule with release times), on the model's timeline."""
    waiting = sorted(chosen, key=lambda ch: (starts[ch.fetch + 1], starts[ch.before], ch.done, _tie(ch)))
    ready: list[tuple] = []
    order, now, k = [], 0.0, 0
    while k < len(waiting) or ready:
        if not ready:
            now = max(now, starts[waiting[k].fetch + 1])
        while k < len(waiting) and starts[waiting[k].fetch + 1] <= now:
            ch = waiting[k]
            heapq.heappush(ready, (starts[ch.before], ch.done, k))
            k += 1
        _, _, j = heapq.heappop(ready)
        order.append(waiting[j])
        now += waiting[j].candidate.in_us
    return order


def _tie(ch: Chosen) -> tuple:
    return ch.candidate.tensor, ch.candidate.after


# How one FIFO stream may run the prefetches the model shares its time between, step by
# step. No order is best everywhere (on GPT-2 at 40 GiB the deadline order simulates
# 1.3% overhead, the model's finishing order 2.2%; on ResNet-50, 8.3% and 6.1%): the
# planner lowers the solution in each and keeps the one the simulator runs fastest.
QUEUES = {
    "deadline": lambda chosen, starts: sorted(chosen, key=lambda ch: (ch.before, ch.fetch, _tie(ch))),
    "finish": lambda chosen, starts: sorted(chosen, key=lambda ch: (ch.done, ch.before, ch.fetch, _tie(ch))),
    "release-edf": _by_release_and_deadline,
}


# How much earlier than the model's fetch position each prefetch may be issued in the
# lowering (ops): the model takes memory back at the issue, the simulator when the copy
# starts (R12), so a prefetch issued early waits for memory on its stream instead of
# starting late; on GPT-2 at 50% 16 ops earlier simulates 1.4% faster than the model's
# positions. The planner keeps whichever the simulator runs fastest.
EARLIER = (0, 4, 16, 64)


def earlier(chosen: list[Chosen], ops: int) -> list[Chosen]:
    """The moves with each prefetch issued up to ``ops`` ops before the model's fetch
    position, never before its release (nor, for a tensor that starts in host memory,
    before the first op)."""
    if not ops:
        return chosen
    return [replace(ch, fetch=max(0 if ch.candidate.wraps else ch.release, ch.fetch - ops)) for ch in chosen]


@dataclass
class Lowered:
    """A MILP solution as the plan the simulator ran fastest of its lowerings
    (``lower_fastest``): the result, the actions and initial placements, which queue order
    and advances made it (``queue``), the moves and recomputes decoded, and the model's
    time of the solution (``estimate_us``)."""
    result: object
    actions: list
    initial: dict
    queue: str
    chosen: list
    redone: list
    estimate_us: float

    def beats(self, other: "Lowered | None") -> bool:
        """Whether this plan runs where ``other`` does not, or strictly faster."""
        if other is None:
            return True
        mine, theirs = self.result, other.result
        return (mine.ok, -mine.iteration_us if mine.ok else 0) > (theirs.ok, -theirs.iteration_us if theirs.ok else 0)


def lower_fastest(profile, sim, budget: int, form: Formulation, values: np.ndarray,
                  advances: tuple[int, ...] = EARLIER) -> Lowered:
    """Decode ``values`` (moves, recomputes, their chains) and lower them with the
    prefetches in each queue order of ``QUEUES``, issued at the model's fetch positions or
    each of ``advances`` ops earlier, the offloads at the last use or after the last write
    (``offload_points``); the one the simulator runs fastest (one that runs before one
    that does not; the first of equals)."""
    chosen = decode(form, values)
    redone = decode_recomputes(form, values)
    chains = decode_chains(redone)
    chosen = retarget(profile, chosen, redone, chains)
    steps_us = step_times(form, values)
    initial = initial_of(chosen)
    estimate_us = predicted_us(form, values)
    best = None
    for name, early, soon in [(n, e, s) for s in (False, True) for e in advances for n in QUEUES]:
        actions = to_actions(profile, earlier(chosen, early), redone, chains, name, steps_us, early_offloads=soon)
        queue = ", ".join([name] + [f"{early} ops earlier"] * bool(early) + ["offloads after the last write"] * soon)
        tried = Lowered(score(sim, budget, actions, initial), actions, initial, queue, chosen, redone, estimate_us)
        if tried.beats(best):
            best = tried
    return best


# The heuristics the solvers start from and fall back to ((planner, parameters)): the
# fastest simulated of them is the MIP start. Each is the fastest somewhere: lms on GPT-2 at
# 50% (4.103 s against g10's 4.111 s), autoswap on ResNet-50 at 50% (4.020 s), ResNet-152 and
# GPT-2 at 30%, and only autoswap fits VGG-16 b1024 at 30% (9.994 s).
SWAP_HEURISTICS = (("g10", {}), ("lms", {}), ("autoswap", {}))
HOST_HEURISTICS = (("g10", {"ssd": False}), ("lms", {}), ("autoswap", {}))
# joint (swap + recompute) starts from capuchin's, g10's or lms's plan; it may return g10's with
# what the link cannot move out in time recomputed instead (g10's ``recompute``: SENet-154 b1024
# on G10's machine 1.042x against 1.244x, ResNet-152 b512 at 30% 3.47 s against 5.49 s) but does
# not start from it: started there, HiGHS ended slower on ResNet-50 at 30% (2.688 s against
# 2.643 s) and GPT-2 at 30%.
RECOMPUTE_HEURISTICS = (("capuchin", {}), ("g10", {}), ("lms", {}))
RECOMPUTE_ALSO = (("g10", {"recompute": True}),)
# joint's fallback may also be swapadvisor's plan (its ``search``), searched as it searches alone
# (the run's time limit and seed: the same plan): the genetic search beat the MILP by 10.7% on
# VGG-16 b1024 at 30% and 1-1.5% on the ResNets (issue 53)
JOINT_SEARCH = (("swapadvisor", {}),)
# Run only when none of the pool runs within the budget (joint: autoswap fits VGG-16 b1024 at
# 30% where capuchin's, g10's and lms's plans do not); a pool that has it plans it once.
LAST_RESORT = (("autoswap", {}),)
# A pool stops planning more heuristics once it holds a plan that runs and has used this share
# of the solver's time limit (``best_heuristic``), so that the limit covers the pool
POOL_SHARE = 0.4


# The solvers' ``polish`` parameter (autotm, tmof, joint, deeptm): refine.py ``polished``.
POLISH = Param("polish", True, "last, try small changes to the plan's swaps (a prefetch or offload issued a few ops "
                               "earlier or later, one move more or less) and keep each the simulator runs faster "
                               "(docs/ilp.md \"Polish\"; false: the MILP's plan as lowered and refined)")

# The solvers' ``start_positions`` parameter (autotm, tmof, deeptm): refine.py ``at_positions_of``.
# On by default for deeptm, off for autotm and tmof (docs/ilp.md "The MIP start": measured on the
# six profiles at 50% and 30%, on made deeptm faster in 6 cells and slower in 1; autotm's solve on
# GPT-2 at 50% then never leaves lms's moves, and tmof's larger model does not prove its 0.1% gap
# on GPT-2 at 40 GiB in 30 s, which it does without).
START_POSITIONS = Param("start_positions", False, "add the positions the heuristic's moves ran at to the model "
                                                  "before the solve, so that the MIP start is priced at its own "
                                                  "timeline (docs/ilp.md \"The MIP start\")")
START_POSITIONS_ON = replace(START_POSITIONS, default=True)


def best_heuristic(profile, hardware, budget: int, heuristics: tuple[tuple[str, dict], ...], options: RunOptions,
                   last_resort: tuple[tuple[str, dict], ...] = LAST_RESORT, also: tuple[tuple[str, dict], ...] = ()):
    """A function giving the plan of these heuristics that the simulator runs fastest
    within the budget (one that runs before one that does not; the first of equals), its
    notes naming it (``heuristic``: the planner, with its parameters when it has any): the
    solvers' fallback, and with ``start=True`` their MIP start. When none of them runs, the
    ``last_resort`` heuristics are tried as well.
    ``also``: heuristics the fallback may be (tried after the others) but the start not.
    Each heuristic plans once."""
    ran: dict[int, tuple] = {}
    sim = None   # the run's simulator, found at the first heuristic planned
    started = time.perf_counter()

    def run_member(name: str, params: dict) -> tuple:
        nonlocal sim
        sim = sim or simulator_for(profile, hardware, options)
        spec = get_planner(name)
        run = replace(DEFAULT_OPTIONS, simulator=sim)
        if spec.searches:   # a search runs as it would alone with the run's limit and seed: the same plan
            run = replace(run, time_limit=options.time_limit, seed=options.seed)
        candidate = spec.func(profile, hardware, budget, options=run, **spec.resolve(params))
        result = score(sim, budget, candidate.actions, candidate.initial, candidate.schedule)
        label = name + (f" ({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")
        return (not result.ok, result.iteration_us if result.ok else 0.0), label, candidate

    def planned(n: int, name: str, params: dict) -> tuple | None:
        """The heuristic's (rank, label, draft); None when it is skipped: it cannot meet the
        budget, or a plan that runs is in hand and the pool has used ``POOL_SHARE`` of the
        time limit (issue 53: the limit covers the pool)."""
        if n not in ran:
            in_hand = any(not found[0][0] for found in ran.values())
            if not can_meet(name, params, profile, hardware, budget) or (in_hand and options.past(started, POOL_SHARE)):
                return None
            ran[n] = run_member(name, params)
        return ran[n]

    def draft(start: bool = False):
        best = None
        pool = heuristics + tuple(h for h in last_resort if h not in heuristics)
        for n, (name, params) in enumerate(pool + (() if start else also)):
            if len(heuristics) <= n < len(pool) and best is not None and not best[0][0]:
                continue   # one of the pool runs: the last resort is not needed
            found = planned(n, name, params)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        if best is None:    # none can meet the budget: the first plans all the same (the solver says why)
            best = ran[0] = run_member(*heuristics[0])
        _, name, chosen = best
        return replace(chosen, notes={**chosen.notes, "heuristic": name})
    return draft


def short_op(form: Formulation) -> tuple[str, int] | None:
    """The first op over the budget that even every candidate move and recompute off the
    GPU together cannot bring under it (each idle interval counted once), and by how many
    bytes: why a model is infeasible, where one op says it (a tensor is back on the GPU
    from the op before its next use and leaves after the op after its last, ``windows``);
    None when every op could be relieved on its own."""
    spans: dict[tuple[str, int, int], tuple[int, int, int]] = {}   # an idle interval: ops it may be off, bytes
    intervals = [(c.span.start, c.span.stop, (c.tensor, c.after, c.before), c.nbytes) for c in form.cands]
    intervals += [(r.after + 1, r.before, (r.tensor, r.after, r.before), r.nbytes) for r in form.redo]
    for lo, hi, key, nbytes in intervals:
        old = spans.get(key, (lo, hi, nbytes))
        spans[key] = (min(old[0], lo), max(old[1], hi), nbytes)
    free = held_per_op(form.n, spans.values())
    resident = np.asarray(form.profile.resident_bytes, dtype=np.int64)
    for i in form.over_ops:
        if resident[i] - free[i] > form.budget:
            return form.profile.ops[i].id, int(resident[i] - free[i] - form.budget)
    return None


def why_no_solution(form: Formulation, model_status: str) -> str:
    """Why a solve gave no solution, for the fallback note: out of time, or an infeasible
    model, with the op ``short_op`` finds where one does."""
    if model_status != "Infeasible":
        return "the solver found no solution in time"
    short = short_op(form)
    if short is None:
        return "no plan within the model's rules fits the budget"
    return (f"no plan within the model's rules fits the budget (at op {short[0]!r}, {short[1]} bytes more than "
            f"every move and recompute the model has can free: the model keeps a tensor on the GPU at the ops next "
            f"to its uses)")


def fix_by_relaxation(form: Formulation, limit: float, options: RunOptions, token: bool, notes: dict):
    """LP-guided fixing, for models too large to solve whole: solve the LP relaxation by
    IPM and keep only the candidates it moves or recomputes at all (``LP_KEEP``); the
    others are fixed to "stay". Returns the reduced formulation (or ``form`` itself when
    the reduction would leave an op uncovered or the LP did not finish) and the LP's
    objective, a lower bound for the full model."""
    options.say(f"MILP too large to solve whole ({form.model.num_cols} columns): LP relaxation by IPM first")
    relaxed = form.model.relaxation(limit, options.threads)
    if relaxed.status != "optimal":
        notes.update(lp_fixing="the LP relaxation did not finish in time: the full model is solved")
        return form, None
    x = relaxed.values
    cands = [c for k, c in enumerate(form.cands) if x[form.Y(k, c.release[-1])] > LP_KEEP]
    redo = [r for k, r in enumerate(form.redo) if x[form.Q + k] > LP_KEEP]
    reduced = Formulation(form.profile, form.hardware, form.budget, cands, one_offload_at_a_time=token, redo=redo,
                          reach=form.reach)
    if reduced.uncovered:
        notes.update(lp_fixing="the reduction left an op over the budget uncovered: the full model is solved")
        return form, relaxed.objective
    notes.update(lp_fixing=f"kept {len(cands)} of {len(form.cands)} moves and {len(redo)} of {len(form.redo)} "
                           f"recomputes the LP relaxation uses", columns=reduced.model.num_cols,
                 rows=reduced.model.num_rows, lp_bound_us=relaxed.objective / MS)
    return reduced, relaxed.objective


def _around_relaxation(form: Formulation, limit: float, threads: int) -> np.ndarray | None:
    """A start next to the optimum where the model is easy: the LP relaxation (by IPM),
    then the MIP with the choices it makes whole fixed (``Model.around``, within
    ``RENS_GAP``), kept when its objective is within ``RENS_CLOSE`` of the LP's, so that
    HiGHS's root cuts can prove it. tmof on GPT-2 b48 at 40 GiB: LP 4175.5, that MIP
    4183.5 (994 of 5,662 binaries fractional, half a second), and the 0.1% gap proven 1.9 s
    into the solve, where from the heuristic's plan (3% off) it took 10 s of branching for a
    plan as good. Where the LP is looser (the tight budgets) the model's best is far from
    the simulator's, and a start at it left autotm and tmof a plan slower than their
    heuristic's in four more of the 12 frontier cells. None when it is not kept or either
    solve does not finish."""
    relaxed = form.model.relaxation(limit, threads)
    if relaxed.status != "optimal" or relaxed.values is None:
        return None
    rounded = form.model.around(relaxed.values, limit, threads, 0, RENS_GAP)
    if rounded.status != "optimal" or rounded.objective - relaxed.objective > RENS_CLOSE * abs(rounded.objective):
        return None
    return rounded.values


def _recomputes_that_fit(form: Formulation, moved: dict, redone: set[int]) -> set[int]:
    """The heuristic's recomputes the model can hold beside its moves: all of them when
    more moves then cover every op over the budget (``Formulation.cover``), else as many
    as do, taken in the order of the ops they run before. A plan the model holds only in
    part (capuchin's on GPT-2 at 30%: 21 of its 173 recomputes are candidates here, and
    moving what the others freed would move the sources those 21 read) still starts the
    solver from its moves."""
    short: list[int] = []
    form.cover(moved, redone, short)
    if not short:
        return redone
    kept: set[int] = set()
    for k in sorted(redone, key=lambda k: (form.redo[k].before, k)):
        short = []
        form.cover(moved, kept | {k}, short)
        if not short:
            kept.add(k)
    return kept


RENS_GAP = 1e-4   # the small MIP around the LP relaxation is solved this close (``_around_relaxation``) ...
RENS_CLOSE = 2e-3  # ... and starts the solver when this close to the LP's objective


def best_start(form: Formulation, sim, budget: int, heuristic, limit: float, threads: int, notes: dict,
               given: np.ndarray | None = None, copy_start: bool = False):
    """The start HiGHS gets (a MIP start): the heuristic plan's moves and recomputes as
    this model's choices (``Formulation.choices_of_plan``, releases read off the plan's
    simulated timeline), with moves added or widened where the model needs more memory
    freed (``Formulation.cover``: a heuristic plan may free memory the model cannot
    express, such as g10's weights that start in host memory), each copy placed and
    each step timed by an LP (``Formulation.priced``); or ``given`` (a smaller model's
    solution), or the greedy start (``Formulation.start``), priced too, whichever the
    model times fastest (the first of equals), or, in a model without recomputes, the MIP
    around the LP relaxation's choices (``_around_relaxation``; joint's plan on GPT-2 b48
    at 30% simulated 1.3% slower from it). ``copy_start``: fetch positions read off
    the prefetches' copies (where the model has the heuristic's own positions: refine.py
    ``at_positions_of``). Notes: ``start`` (which), ``start_model_us``
    and, for the heuristic's, how many of its moves the model has (``start_moves``)."""
    tried = []
    if heuristic is not None and heuristic.actions:
        plan = Plan(profile_name=sim.profile.name, profile_sha256=sim.compiled.sha256,
                    actions=tuple(heuristic.actions), initial=dict(heuristic.initial or {}))
        run = sim.simulate(plan, budget, record=True)
        moved, redone, missing = form.choices_of_plan(heuristic.actions, run.timeline if run.ok else None,
                                                      heuristic.initial, copy_start=copy_start)
        redone = _recomputes_that_fit(form, moved, redone)
        x = form.priced(form.values_of(form.cover(moved, redone), redone), limit, threads)
        if x is not None:
            tried.append(("heuristic", x))
            notes.update(start_moves=f"{len(moved)} of the heuristic's moves and {len(redone)} of its recomputes "
                                     f"are the model's; {missing} moves are not")
    if given is not None:
        tried.append(("smaller model", form.priced(given, limit, threads)))
    greedy = form.start()
    if greedy is not None:
        tried.append(("greedy", form.priced(greedy, limit, threads)))
    if not form.redo:   # swap-only models (autotm, tmof): joint's recompute chains round far from its LP
        tried.append(("relaxation", _around_relaxation(form, limit, threads)))
    tried = [(name, x) for name, x in tried if x is not None]
    if not tried:
        notes.update(start="none")
        return None
    name, x = min(tried, key=lambda nx: predicted_us(form, nx[1]))
    notes.update(start=name, start_model_us=predicted_us(form, x))
    return x
