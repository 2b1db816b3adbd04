"""``checkmate``: optimal rematerialization by a MILP, after Jain, Nrusimha, Shah, Zhu,
Abbeel, Gonzalez, Keutzer, Stoica, "Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization", MLSys 2020 (section 4: the integer program; 4.5: frontier-advancing
stages), written here from the paper's formulation, solved by HiGHS.

The paper's program, over a graph of n nodes computed in n stages (stage t computes node
t for the first time, and may recompute any earlier node first): binaries R[t,i] (node i
is computed in stage t) and S[t,i] (node i's output is kept in memory from stage t-1 into
stage t); a node is computed only from what is kept or computed in the same stage
(R[t,j] <= R[t,i] + S[t,i] for every edge i -> j); only what was kept or computed in stage
t-1 can be kept into stage t (S[t,i] <= R[t-1,i] + S[t-1,i]); memory is counted within
every stage and held under the budget; the objective is the total compute, sum C_i R[t,i].

Here (this module's model, on a coarsened graph):

- **Nodes.** The forward pass (ops of phase ``forward``, in the profile's order) is the
  graph that may be recomputed. Its recomputable tensors (made by a forward op that
  updates nothing in place, never updated in place themselves: R15; needed after the
  forward pass, directly by a later op or as the source of another recomputable tensor)
  are grouped into at most ``nodes`` super-nodes, each a run of tensors consecutive in
  producer order (so a run of consecutive forward ops): adjacent runs merge, from one
  tensor per node, where forcing one decision on both loses least (Ward's criterion on
  recompute time per byte, see ``group``). A super-node's outputs are its recomputable
  tensors; recomputing it re-runs their producers (its cost: the sum of their times).
  Everything else (BatchNorm outputs that R15 pins, tensors updated in place, gradients,
  weights, tiny outputs nothing recomputable reads) keeps its lifetime from the profile
  and is a constant in every memory row.
- **Stages.** Stage 0 is the whole forward pass: a node either keeps its outputs into
  backward (``S[1,i]``) or drops each one after its last forward use; recomputing inside
  the forward pass is not modelled (see departures). The backward part (everything after
  the last forward op) is cut into stages 1.. at the ops that read a recomputable tensor
  (at most ``stages``, evenly chosen; by default at most 24,000 / ``nodes``, as HiGHS's
  root cut rounds ran far past the time limit on larger models: Llama-1B's 409 stages,
  117 s on a 20 s limit); node i may be recomputed just before a stage's
  first op (``R[t,i]``), and kept into the next (``S[t+1,i] <= S[t,i] + R[t,i]``).
  A stage whose op reads one of node i's tensors needs node i (``S[t,i] + R[t,i] >= 1``);
  a recompute needs its sources: ``R[t,j] <= S[t,i] + R[t,i]`` for recomputable sources,
  and for the others (pinned, or internal to a group and pinned) the stage must start
  before they die or are updated in place (checked statically: no variable otherwise).
- **Memory.** One row per op that could exceed the budget (rows dominated by another of
  the same stage are left out): the profile's resident bytes without the recomputable
  tensors, plus, per node held in that op's stage, the bytes of its tensors still needed
  at or after that op. A tensor held in a stage is counted through the whole stage (the
  paper's FREE variables, which free a value inside a stage after its last use there,
  are replaced by static coefficients: each tensor's last use is known from the profile).
  During the forward pass, a tensor past its last forward use counts only if its node is
  kept. A recompute's workspace is counted before the stage's first op.
- **Objective.** The ideal time plus the recompute times, sum C[t,i] R[t,i] (C counts
  the node's tensors still needed at stage t): with no copies the simulated iteration is
  exactly this (R5), so the model's objective is the plan's time and the MIP gap is
  relative to the iteration.
- **Size.** A recompute R[t,i] exists only at a stage that reads node i, where a node
  recomputed from it may be recomputed, or at its last valid stage (recomputing earlier
  only holds it longer for the same cost); S and R exist only at the stages where node
  i's state matters (read there, recomputable there, read by a recompute there, or in a
  memory row that can bind); in between, holding it costs nothing and it stays as it
  was. ResNet-50 (56 nodes, 58 stages) is 1.6k columns and solves in 0.1 s; GPT-2 (120
  of 262 tensors' nodes, 163 stages) is 18k columns.

The model (graph, grouping, MILP) is in planner/recompute/_checkmate_model.py. The solver starts
from the cheapest of a few knapsack-like solutions on the model's own rows
(``greedy_start``: nodes dropped and recomputed once, cheapest per byte first, while that
lowers the bytes over the budget, then kept again dearest first while every row holds),
from no node dropped and from the nodes torch-budget's knapsack mostly drops, when one
exists (its plan, from planner/recompute/torch_budget.py, reused as a starting point:
with chen's below, the only imports of another planner here).
HiGHS's objective is taken again from the values it returns (1.16 misreported it for an
incumbent it was given, and stopped on it as optimal; the model is then solved again
without the start).

The solution is lowered per tensor: a tensor of a node not kept into backward is dropped
after its last forward use; in a stage where its node is recomputed and it is needed at
or after that stage, it is recomputed before the stage's first op (sources first, in
producer order); a tensor still needed later whose node is not kept into the next stage
is dropped after its last use in this stage (a drop right before its own recompute is
skipped: it is kept instead). Every tensor needed by an op is then resident, and the plan
is scored by the simulator (planner.core.api.score).

Fallback: when the solver finds no solution within the time limit, the model has none
(the budget is below what the pinned tensors allow), the lowered plan does not fit, or
chen's plan simulates faster (a coarse grouping can make the model's best plan slower),
the plan is chen's budgeted search (planner/recompute/chen.py), with status ``fallback`` and the
reason in ``notes.fallback``; ``notes.chen_us`` is chen's time whenever it was scored.

Departures from the paper (and why):
- The graph is coarsened (the paper's nodes are layers; its O(n^2) program found nothing
  past ~150 nodes on two cores here, see ../shared/research/ilp.md) and only forward
  tensors are recomputable: gradients, optimizer steps and in-place updates cannot be
  (R15), and their memory is fixed by the profile. The backward pass therefore needs no
  R/S variables of its own, which is what makes ~100-node models of real networks
  solvable.
- A node is a group of tensors, not a layer with one output; its cost at a stage counts
  only its tensors still needed then, and costs are the simulator's op times per
  recomputed tensor (an op with two recomputed outputs runs twice, R15).
- No recomputation during the forward pass (a tensor read by a far later forward op is
  kept until then): the stage count then grows with the backward readers only.
- Memory per op rather than per (stage, node) step with FREE variables (above): a
  tensor is counted from its stage's start to its last possible use, pessimistic by at
  most a stage, so a plan the model accepts fits; the simulator checks it anyway.
- Tensors under 0.01% of the budget that nothing recomputable reads are kept: recomputing
  them frees next to nothing and costs their producer's whole time (an attention op's
  2 MB log-sum-exp would cost the attention op again).
- PuLP is not used to build the model: rows are passed to HiGHS as arrays through
  planner/shared/highs.py (PuLP reports a time-limit stop as "Optimal" even without a
  solution; the solver's own status, gap and bound are reported, as the other ILP
  planners do).
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from simulator.plan import drop, recompute

from ..core.api import score, simulator_for
from ..core.lowering import DROP, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ._checkmate_model import MS, Formulation, Graph, build_graph, group, recomputable  # noqa: F401

DEFAULT_TIME_LIMIT = 120.0
DEFAULT_NODES = 120
DEFAULT_GAP = 1e-3
STAGE_CELLS = 24_000  # stages=0: at most this many (node, stage) pairs (200 stages at 120 nodes)


# ----------------------------------------------------------------------------- lowering


def lower(graph: Graph, keep: dict, redo: dict) -> list:
    """Per-tensor drop and recompute actions from a solution (``keep[(t, i)]``: S,
    ``redo[(t, i)]``: R; missing keys are 0). A tensor of a node not kept into backward is
    dropped after its last forward use; it is recomputed before a stage's first op when
    its node is recomputed there and it is read at or after that stage while the node stays
    kept until then; it is dropped after its last read in a stage when it is read later
    but its node is not kept into the next stage. A drop right before the tensor's own
    recompute is skipped with it. Raises ValueError when a tensor would be read while
    dropped (a solution that breaks the model's rules)."""
    profile, items, starts = graph.profile, graph.items, graph.starts
    ops = profile.ops
    reads: dict[str, dict[int, int]] = {t: {} for t in items}   # stage -> last op reading it there
    for tid in graph.order:
        for u in items[tid].reader_ops:
            s = graph.stage_of[u]
            reads[tid][s] = max(reads[tid].get(s, -1), u)
    steps, recomputes = [], []
    for tid in reversed(graph.order):     # a tensor's readers first: their recomputes read it
        item, i = items[tid], graph.node_of[tid]
        need = reads[tid]
        if not need:
            continue
        last = max(need)
        events: list[tuple[int, int]] = []   # (dropped after op, recomputed before op)
        resident = bool(keep.get((1, i)))
        dropped_after = None if resident else item.last_forward
        last_read = item.last_forward
        for t in range(1, last + 1):
            if not resident and redo.get((t, i)):
                upcoming = min(s for s in need if s >= t)
                if all(keep.get((s, i)) for s in range(t + 1, upcoming + 1)):
                    events.append((dropped_after, starts[t]))
                    resident, dropped_after, last_read = True, None, starts[t]
            if t in need:
                if not resident:
                    raise ValueError(f"tensor {tid!r} is read in stage {t} but neither kept nor recomputed")
                last_read = max(last_read, need[t])
            if resident and t < last and not keep.get((t + 1, i)):
                resident, dropped_after = False, last_read
        for after, before in events:
            if after >= before - 1:
                continue                 # dropped right before its recompute: kept instead
            steps.append(Step(after, DROP, before, tid, drop(tid, ops[after].id)))
            recomputes.append((before, item.producer, tid))
            t = graph.stage_of[before]
            for src in item.sources:
                if src in items:
                    reads[src][t] = max(reads[src].get(t, -1), before)
    recomputes.sort()
    return issue_order(steps) + [recompute(tid, ops[before].id) for before, _, tid in recomputes]


# ----------------------------------------------------------------------------- the planner


def _checked(solution, form: Formulation, gap: float):
    """The solution with its objective taken from its values (HiGHS's own figure can be
    wrong for an incumbent it was given), the gap taken again against the dual bound,
    and the status optimal only within ``gap``."""
    from ..shared.highs import Solution

    if solution.values is None:
        return solution
    objective = float(np.dot(form.model.cost, np.round(solution.values)))
    found_gap = None if solution.bound is None else max(0.0, (objective - solution.bound) / abs(objective))
    status = "optimal" if found_gap is not None and found_gap <= gap + 1e-9 else "feasible"
    return Solution(status, solution.values, objective, solution.bound, found_gap, solution.model_status)


def _hint(profile, hardware, budget) -> set[str]:
    """The tensors torch-budget's knapsack drops (planner/recompute/torch_budget.py): where some of
    the starting solutions start."""
    from .torch_budget import plan_torch_budget
    return {a.tensor for a in plan_torch_budget(profile, hardware, budget).actions if a.kind == "drop"}


def _start(form: Formulation, hint: set[str], seconds: float) -> np.ndarray | None:
    """The cheapest of the greedy starts (``Formulation.greedy_start``) from no node
    dropped and from the nodes whose bytes read after the forward pass the ``hint``
    mostly drops (more than 30, 50, 70, 90% of them)."""
    graph, stop = form.graph, time.perf_counter() + seconds
    tried, best = [], None
    for share in (None, 0.3, 0.5, 0.7, 0.9):
        dropped = set()
        if share is not None:
            for i, run in enumerate(graph.nodes):
                read = [graph.items[t].nbytes for t in run if graph.items[t].need]
                mostly = sum(graph.items[t].nbytes for t in run if graph.items[t].need and t in hint)
                if read and mostly > share * sum(read):
                    dropped.add(i)
        if dropped in tried:
            continue
        tried.append(dropped)
        x = form.greedy_start(max(0.0, stop - time.perf_counter()), dropped)
        if x is not None and (best is None or np.dot(form.model.cost, x) < np.dot(form.model.cost, best)):
            best = x
    return best


def _chen(profile, hardware, budget, sim):
    from .chen import plan_chen
    return plan_chen(profile, hardware, budget, options=replace(DEFAULT_OPTIONS, simulator=sim))


@register(
    "checkmate",
    "Checkmate (MLSys'20): the rematerialization MILP (recompute R[t,i], keep S[t,i] per stage, memory under "
    "the budget, least recompute time) on the forward pass coarsened to at most `nodes` super-nodes, solved by "
    "HiGHS, lowered to per-tensor drops and recomputes; chen's plan as the fallback.",
    params=(Param("nodes", DEFAULT_NODES, "super-nodes the recomputable tensors are grouped into (runs "
                                          "consecutive in the forward pass)", low=1, high=100_000),
            Param("stages", 0, "backward stages at most (0: one per op that reads a recomputable tensor, up to "
                               "24,000 / nodes)", low=0, high=1_000_000),
            Param("gap", DEFAULT_GAP, "stop when the solution is proven within this relative gap of the optimum",
                  low=0.0, high=1.0)),
    moves_persistent=False,
    recomputes=True,
    family="recompute",
    paper="Jain et al., Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization, MLSys 2020",
    searches=True,
)
def plan_checkmate(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, nodes=DEFAULT_NODES, stages=0,
                   gap=DEFAULT_GAP):
    started = time.perf_counter()
    deadline = options.deadline(started, DEFAULT_TIME_LIMIT)
    if profile.peak_bytes <= budget_bytes:
        return Draft(status="optimal", gap=0.0, estimate_us=profile.ideal_us, notes={"recomputes": 0})
    sim = simulator_for(profile, hardware, options)
    graph = build_graph(profile, budget_bytes, stages)
    if not stages and graph.items:      # HiGHS's root cut rounds outran the time limit on larger models
        cap = max(1, STAGE_CELLS // min(nodes, len(graph.items)))
        if graph.stages - 1 > cap:
            graph = build_graph(profile, budget_bytes, cap)
    graph = group(graph, nodes)
    notes = {"recomputable_tensors": len(graph.items), "nodes": len(graph.nodes), "stages": graph.stages - 1}

    def fallback(why: str) -> Draft:
        backup = _chen(profile, hardware, budget_bytes, sim)
        notes.update(fallback=f"{why}: chen's budgeted search", chen=backup.notes)
        return Draft(actions=backup.actions, status="fallback", notes=notes)

    if not graph.items:
        return fallback("nothing in the forward pass can be recomputed")
    form = Formulation(graph, budget_bytes)
    notes.update(columns=form.model.num_cols, rows=form.model.num_rows, memory_rows=form.memory_rows)
    if form.infeasible is not None:
        return fallback(f"op {form.infeasible!r} is over the budget with every recomputable tensor dropped")
    start = _start(form, _hint(profile, hardware, budget_bytes), 0.1 * (deadline - time.perf_counter()))
    if start is not None:
        notes.update(start_us=float(np.dot(form.model.cost, start)) / MS)
    left = deadline - time.perf_counter()
    limit = left - min(10.0, 0.05 * left)     # the rest: lowering, simulating, the fallback
    if limit <= 0:
        return fallback("the time limit was spent before the solver could start")
    options.say(f"checkmate MILP: {len(graph.nodes)} nodes, {graph.stages - 1} stages, {form.model.num_cols} "
                f"columns, {form.model.num_rows} rows; solving (limit {limit:.0f} s)")
    solution = _checked(form.model.solve(limit, options.threads, options.seed, gap, start=start), form, gap)
    if start is not None and solution.status == "feasible" and solution.model_status == "Optimal":
        # HiGHS (1.16) can misreport the objective of an incumbent it was given, and stop on it:
        # solve again without it in the time left, and keep the better
        left = deadline - time.perf_counter()
        if left - min(10.0, 0.05 * left) > 0:
            again = _checked(form.model.solve(left - min(10.0, 0.05 * left), options.threads, options.seed, gap),
                             form, gap)
            if again.values is not None and again.objective <= solution.objective:
                solution = again
        notes.update(solved_twice=True)
    options.say(f"checkmate MILP: {solution.model_status} after {time.perf_counter() - started:.1f} s")
    notes.update(solver=solution.model_status, mip_gap=solution.gap,
                 model_bound_us=None if solution.bound is None else solution.bound / MS)
    if solution.values is None:
        why = "no plan within the model fits the budget" if solution.model_status == "Infeasible" \
            else "the solver found no solution in time"
        return fallback(why)
    keep, redo = form.decode(solution.values)
    estimate = solution.objective / MS
    try:
        actions = lower(graph, keep, redo)
    except ValueError as error:
        return fallback(f"the solution could not be lowered ({error})")
    result = score(sim, budget_bytes, actions)
    recomputed = [a for a in actions if a.kind == "recompute"]
    notes.update(model_objective_us=estimate, simulated_us=result.iteration_us if result.ok else None,
                 recomputes=len(recomputed), recomputed_tensors=len({a.tensor for a in recomputed}))
    if not result.ok:
        return fallback("the solver's plan does not run within the budget in the simulator "
                        f"({result.rule}: {result.reason})")
    backup = _chen(profile, hardware, budget_bytes, sim)
    backup_result = score(sim, budget_bytes, backup.actions)
    notes.update(chen_us=backup_result.iteration_us if backup_result.ok else None)
    if backup_result.ok and backup_result.iteration_us < result.iteration_us:
        notes.update(fallback=f"chen's plan simulated faster than the solver's ({backup_result.iteration_us:.0f} us "
                              f"against {result.iteration_us:.0f} us): chen's budgeted search", chen=backup.notes)
        return Draft(actions=backup.actions, status="fallback", notes=notes)
    return Draft(actions=actions, status=solution.status, gap=solution.gap, estimate_us=estimate, notes=notes)
