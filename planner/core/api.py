"""``make_plan``: run a registered planner, score its plan with the simulator, and
return the Plan with its prediction filled in. The one path every planner goes through."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

from simulator.api import Simulator
from simulator.errors import InfeasibleError
from simulator.hardware import Hardware
from simulator.model.budget import check_budget
from simulator.plan import Plan, PlannerInfo
from simulator.profile import Profile
from simulator.profile.order import in_order
from simulator.result import Result

from ..shared.bound import Bound, bound_fields, lower_bound
from ..shared.facts import budget_floor, uvm_floor
from ..shared.grouping import group_actions
from ..shared.splitting import choose_splits, split_deeper
from .registry import RunOptions, get_planner


@dataclass
class Planned:
    """A plan, the simulator's verdict on it, and how long planning took (wall clock;
    reported, not stored in the plan, so that plans are byte-identical run to run)."""
    plan: Plan
    result: Result
    seconds: float


def make_plan(profile: Profile, hardware: Hardware, budget_bytes: int, planner: str = "none",
              params: dict | None = None, seed: int = 0, options: RunOptions | None = None,
              group: bool = False, split_ops: bool = True) -> Planned:
    """Plan ``profile`` for ``hardware`` within ``budget_bytes`` with the named planner.

    The plan's ``planner`` block is the planner report: its status (the planner's own
    verdict unless the simulator finds the plan infeasible or invalid, which it then
    says), parameters, seed, notes, its own estimate when it has one, and the lower
    bound for this budget (planner/shared/bound.py) with the plan's gap to it; ``predicted``
    holds the simulator's figures. ``group`` aggregates the plan's transfers issued
    together into groups (R53, planner/shared/grouping.py), kept only if the simulator finds
    the grouped plan no slower (the notes say which).
    ``split_ops`` False never runs an op in chunks (R54), as a framework without the
    technique runs it (fit's baseline).

    Raises InputError for an unknown planner or parameter or a budget above the GPU's
    memory, and InfeasibleError for a budget below the floor no plan of this planner can
    meet.
    """
    spec = get_planner(planner)
    resolved = spec.resolve(params or {})
    sim = simulator_for(profile, hardware, options)
    options = replace(options or RunOptions(seed=seed), simulator=sim)
    check_budget(budget_bytes, hardware)
    explicit = spec.memory != "uvm"
    floor, floor_op = _floor(spec, resolved, profile, hardware)
    splits, why_split = {}, None
    if budget_bytes < floor and explicit and split_ops:   # R54: an op alone over the budget may run in chunks
        splits, needed = _cell_splits(profile, hardware, budget_bytes, spec, resolved)
        if splits:
            why_split = f"op {floor_op!r} alone needs {floor} bytes, more than the budget"
            if splits != needed:
                why_split += (f"; {len(splits) - len(needed)} more ops split too, since that lowers the bound "
                              "(split_deeper)")
            floor, floor_op = _floor(spec, resolved, sim.split(_splitting(sim, splits))[0].profile, hardware)
    if budget_bytes < floor:
        why = (f"op {floor_op!r} needs its working set, and weights and optimizer state stay on the GPU"
               if not spec.moves_persistent else f"the working set of op {floor_op!r}")
        if not explicit:
            why = f"op {floor_op!r} needs its outputs, its workspace and one fault batch on the GPU (R32)"
        raise InfeasibleError(f"budget: {budget_bytes} bytes is below the smallest budget planner {planner!r} can "
                              f"meet: {floor} bytes ({why})", floor_bytes=floor, op=floor_op)
    plan, result, draft, seconds = _run_planner(spec, resolved, sim, splits, hardware, budget_bytes, options, group)
    target = (_split_target(profile, result, floor_op) if explicit and split_ops and not splits and not spec.searches
              else None)
    if target is not None:
        # the plan does not run: the op it stops at (or the one with the largest working set) run in chunks,
        # with its tensors' chain, may leave room enough
        retry = choose_splits(profile, budget_bytes, spec.moves_persistent, spec.cpu_phases,
                              variants=spec.chooses_variants(resolved), over=[target])
        if retry:
            result_whole_op = result.op
            tried = _run_planner(spec, resolved, sim, retry, hardware, budget_bytes, options, group)
            if tried[1].ok:
                plan, result, draft, seconds = tried[0], tried[1], tried[2], seconds + tried[3]
                splits, why_split = retry, (f"run whole, the plan waits for memory at op {result_whole_op!r} (R10); "
                                            f"split from op {profile.ops[target].id!r}")
    if splits:
        draft.notes["splits"] = f"{len(splits)} ops run in {next(iter(splits.values()))} chunks (R54): {why_split}"
    profile = sim.split(plan)[0].profile if plan.splits else profile   # the profile the plan's actions name
    profile = in_order(profile, plan.schedule)   # the bound argues in the order the plan runs (R21)
    # the bound of the plan's kind: what the planner declares, and what its plan does (a fallback's plan
    # may do more), so that no plan is ever below its own bound
    recomputes, moves_persistent = _what_it_does(profile, plan)
    bound = lower_bound(profile, hardware, budget_bytes, recompute=spec.recomputes or recomputes,
                        moves_persistent=spec.moves_persistent or moves_persistent, cpu_ops=plan.uses_cpu, uvm=plan.uvm,
                        codecs=plan.uses_codecs, variants=spec.chooses_variants(resolved) or bool(plan.variants))
    status = draft.status if result.ok else ("invalid" if not result.valid else "infeasible")
    plan.planner = PlannerInfo(name=planner, params=resolved, status=status, gap=draft.gap, seed=options.seed,
                               notes=_plain(draft.notes), estimate_us=draft.estimate_us,
                               lower_bound_us=bound.value_us,
                               bound=bound.kind)
    plan.predicted = prediction(result, bound)
    return Planned(plan, result, seconds)


def _cell_splits(profile: Profile, hardware: Hardware, budget_bytes: int, spec,
                 resolved: dict) -> tuple[dict[str, int], dict[str, int]]:
    """The ops to split (R54) for this planner: those a planner that keeps weights and
    optimizer state on the GPU would split, where there are any, so that the planners of
    one cell, and a solver and the heuristics it falls back to, plan the same split profile
    (a planner that moves them needs fewer chunks, and ran alone on fewer: joint on VGG-16
    at 30%, 4 chunks, with capuchin's plan on them 7.6% slower than capuchin's on 8); else
    this planner's own. Split deeper where that lowers the bound (``split_deeper``): (the
    splits, those needed to fit)."""
    variants = spec.chooses_variants(resolved)
    moves = spec.moves_persistent
    needed = choose_splits(profile, budget_bytes, False, spec.cpu_phases, variants=variants) if moves else {}
    if needed:
        moves = False
    else:
        needed = choose_splits(profile, budget_bytes, moves, spec.cpu_phases, variants=variants)
    return split_deeper(profile, hardware, budget_bytes, needed, moves, spec.cpu_phases, variants), needed


def can_meet(name: str, params: dict, profile: Profile, hardware: Hardware, budget_bytes: int) -> bool:
    """Can planner ``name`` meet this budget at all (its floor, as ``make_plan`` checks it)?
    Pools of heuristics skip those that cannot, rather than let them search in vain."""
    spec = get_planner(name)
    return budget_bytes >= _floor(spec, spec.resolve(params), profile, hardware)[0]


def _floor(spec, resolved: dict, profile: Profile, hardware: Hardware) -> tuple[int, str | None]:
    """The smallest budget a plan of this planner can meet on ``profile``, and the op that sets it."""
    if spec.memory == "uvm":
        return uvm_floor(profile, hardware.uvm.block_bytes, hardware.uvm.fault_batch_blocks)
    return budget_floor(profile, spec.moves_persistent, spec.cpu_phases, variants=spec.chooses_variants(resolved))


def _split_target(profile: Profile, result: Result, floor_op: str | None) -> int | None:
    """For a plan that does not run (valid, over the budget): the splittable op it stops at,
    else the splittable op that sets the budget floor; None if neither."""
    if not result.valid or result.ok:
        return None
    for op_id in (result.op, floor_op):
        index = profile.op_index.get(op_id)
        if index is not None and profile.ops[index].split is not None:
            return index
    return None


def _splitting(sim: Simulator, splits: dict) -> Plan:
    """An empty plan with these splits (R54), for ``Simulator.split``."""
    return Plan(sim.profile.name, profile_sha256=sim.compiled.sha256, splits=dict(splits))


def _run_planner(spec, resolved: dict, sim: Simulator, splits: dict, hardware: Hardware, budget_bytes: int,
                 options: RunOptions, group: bool):
    """Run the planner (on the split profile when ``splits``) and simulate its plan as
    exported: (Plan, Result, Draft, seconds). A split plan names the profile as given."""
    work = sim.split(_splitting(sim, splits))[0] if splits else sim
    started = time.perf_counter()
    draft = spec.func(work.profile, hardware, budget_bytes, options=replace(options, simulator=work), **resolved)
    seconds = time.perf_counter() - started
    plan = Plan(profile_name=work.profile.name, profile_sha256=work.compiled.sha256,
                actions=tuple(draft.actions), hardware=hardware.name, budget_bytes=budget_bytes,
                schedule=None if draft.schedule is None else tuple(draft.schedule),
                initial=dict(draft.initial), cpu_ops=tuple(draft.cpu_ops), memory=draft.memory,
                read_mostly=tuple(draft.read_mostly), uvm_backing=draft.uvm_backing, allow_lossy=draft.allow_lossy,
                variants=dict(draft.variants), placement=draft.placement)
    result = work.simulate(plan, budget_bytes)
    if group and plan.memory == "explicit":
        plan, result = _grouped(work, budget_bytes, plan, result, draft.notes)
    if splits:
        plan = replace(plan, profile_sha256=sim.compiled.sha256, splits=dict(splits))
        result = sim.as_whole(result)
    return plan, result, draft, seconds


def _what_it_does(profile: Profile, plan: Plan) -> tuple[bool, bool]:
    """(it recomputes, it moves weights or optimizer state) of a plan's actions."""
    persistent = {t.id for t in profile.tensors if t.persistent}
    recomputes = any(a.kind == "recompute" for a in plan.actions)
    moves = bool(plan.initial) or any(a.tensor in persistent and a.kind in ("offload", "drop", "store")
                                      for a in plan.actions)
    return recomputes, moves


def _grouped(sim: Simulator, budget_bytes, plan, result, notes: dict):
    """R53 for any planner: the plan with its transfers grouped, if that is no slower."""
    actions, groups, members = group_actions(list(plan.actions), sim.hardware)
    if not groups:
        notes["group"] = "nothing to group (no transfers issued together, or no latency to save)"
        return plan, result
    grouped = replace(plan, actions=tuple(actions))
    tried = sim.simulate(grouped, budget_bytes)
    if tried.ok and (not result.ok or tried.iteration_us <= result.iteration_us):
        notes["group"] = {"groups": groups, "members": members, "ungrouped_us": result.iteration_us if result.ok
                          else None}
        return grouped, tried
    notes["group"] = (f"kept ungrouped: grouping {members} transfers into {groups} groups "
                      f"{'does not run' if not tried.ok else 'is slower'} ({tried.iteration_us:.0f} us)")
    return plan, result


def simulator_for(profile: Profile, hardware: Hardware, options: RunOptions | None = None) -> Simulator:
    """The run's Simulator (``make_plan`` builds one per plan and hands it on in
    ``options``) when it is for this profile and machine, else a new one: compile once,
    score every candidate on it."""
    sim = options.simulator if options is not None else None
    if sim is not None and sim.profile is profile and sim.hardware == hardware:
        return sim
    return Simulator(profile, hardware)


def score(sim: Simulator, budget_bytes: int, actions, initial: dict | None = None,
          schedule=None, cpu_ops=(), memory: str = "explicit", read_mostly=(), allow_lossy: bool = False,
          variants: dict | None = None, placement=None) -> Result:
    """Simulate a candidate set of actions on ``sim`` (``simulator_for``): how planners
    with a feedback loop or a tuner judge their own candidates."""
    plan = Plan(profile_name=sim.profile.name, profile_sha256=sim.compiled.sha256, actions=tuple(actions),
                initial=dict(initial or {}), schedule=None if schedule is None else tuple(schedule),
                cpu_ops=tuple(cpu_ops), memory=memory, read_mostly=tuple(read_mostly), allow_lossy=allow_lossy,
                variants=dict(variants or {}), placement=placement)
    return sim.simulate(plan, budget_bytes)


def fits(sim: Simulator, budget_bytes: int, actions) -> bool:
    """Does the simulator run these actions valid and within the budget?"""
    return score(sim, budget_bytes, actions).ok


def prediction(result: Result, bound: Bound | None = None) -> dict:
    """The ``predicted`` block of an exported plan: the simulator's figures, and the
    lower bound with the plan's gap to it (None when the plan does not run or the
    bound says no plan of its kind fits)."""
    data = {"valid": result.valid, "feasible": result.feasible, "iteration_us": result.iteration_us,
            "overhead": result.overhead, "peak_bytes": result.peak_bytes, "stall_us": result.stall_us,
            "bytes_h2d": result.bytes_h2d, "bytes_d2h": result.bytes_d2h,
            "bytes_ssd_read": result.bytes_ssd_read, "bytes_ssd_write": result.bytes_ssd_write}
    if bound is not None:
        fields = bound_fields(bound, result)
        data.update(lower_bound_us=fields["lower_bound_us"], gap_to_bound=fields["gap_to_bound"])
    if not result.ok:
        data.update(rule=result.rule, op=result.op, tensor=result.tensor, reason=result.reason)
    return data


def _plain(notes: dict) -> dict:
    """Notes as plain JSON data (numpy numbers and tuples become floats, ints, lists)."""
    return json.loads(json.dumps(notes, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
