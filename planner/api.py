"""``make_plan``: run a registered planner, score its plan with the simulator, and
return the Plan with its prediction filled in. The one path every planner goes through."""
from __future__ import annotations

import time
from dataclasses import dataclass

from simulator.engine import check_budget, simulate
from simulator.errors import InputError
from simulator.hardware import Hardware
from simulator.plan import Plan, PlannerInfo
from simulator.profile import Profile, profile_sha256
from simulator.result import Result

from .analysis import budget_floor
from .registry import get_planner


@dataclass
class Planned:
    """A plan, the simulator's verdict on it, and how long planning took (wall clock;
    reported, not stored in the plan, so that plans are byte-identical run to run)."""
    plan: Plan
    result: Result
    seconds: float


def make_plan(profile: Profile, hardware: Hardware, budget_bytes: int, planner: str = "none",
              params: dict | None = None, seed: int = 0) -> Planned:
    """Plan ``profile`` for ``hardware`` within ``budget_bytes`` with the named planner.

    The plan's ``planner.status`` is the planner's own verdict unless the simulator
    finds the plan infeasible or invalid, which it then says; ``predicted`` holds the
    simulator's figures.

    Raises InputError for an unknown planner or parameter, a budget above the GPU's
    memory, or a budget below the floor no plan of this planner can meet.
    """
    spec = get_planner(planner)
    resolved = spec.resolve(params or {})
    check_budget(budget_bytes, hardware)
    floor, floor_op = budget_floor(profile, spec.moves_persistent)
    if budget_bytes < floor:
        why = (f"op {floor_op!r} needs its working set, and weights and optimizer state stay on the GPU"
               if not spec.moves_persistent else f"the working set of op {floor_op!r}")
        raise InputError("<argument>", "budget",
                         f"{budget_bytes} bytes is below the smallest budget planner {planner!r} can meet: "
                         f"{floor} bytes ({why})")
    started = time.perf_counter()
    draft = spec.func(profile, hardware, budget_bytes, seed=seed, **resolved)
    seconds = time.perf_counter() - started
    plan = Plan(profile_name=profile.name, profile_sha256=profile_sha256(profile),
                actions=tuple(draft.actions), hardware=hardware.name, budget_bytes=budget_bytes,
                schedule=None if draft.schedule is None else tuple(draft.schedule),
                initial=dict(draft.initial))
    result = simulate(profile, plan, hardware, budget_bytes)  # the plan as exported
    status = draft.status if result.ok else ("invalid" if not result.valid else "infeasible")
    plan.planner = PlannerInfo(name=planner, params=resolved, status=status, gap=draft.gap, seed=seed)
    plan.predicted = prediction(result)
    return Planned(plan, result, seconds)


def score(profile: Profile, hardware: Hardware, budget_bytes: int, actions, initial: dict | None = None,
          schedule=None) -> Result:
    """Simulate a candidate set of actions: how planners with a feedback loop or a tuner
    judge their own candidates."""
    plan = Plan(profile_name=profile.name, profile_sha256=profile_sha256(profile), actions=tuple(actions),
                initial=dict(initial or {}), schedule=None if schedule is None else tuple(schedule))
    return simulate(profile, plan, hardware, budget_bytes)


def prediction(result: Result) -> dict:
    """The ``predicted`` block of an exported plan."""
    data = {"valid": result.valid, "feasible": result.feasible, "iteration_us": result.iteration_us,
            "overhead": result.overhead, "peak_bytes": result.peak_bytes, "stall_us": result.stall_us,
            "bytes_h2d": result.bytes_h2d, "bytes_d2h": result.bytes_d2h,
            "bytes_ssd_read": result.bytes_ssd_read, "bytes_ssd_write": result.bytes_ssd_write}
    if not result.ok:
        data.update(rule=result.rule, op=result.op, tensor=result.tensor, reason=result.reason)
    return data
