"""Compile a profile and a machine once; simulate or score many plans on them.

``Simulator(profile, hardware)`` is what a search uses (the genetic and ILP planners, a
tuner): ``score(plan)`` and ``score_many(plans)`` return a small ``Score`` from the C
fast path, with graded failure so that candidates can be ranked, and never fall back
to the Python reference to explain themselves. ``simulate(plan)`` returns the full
Result (reasons, per-op stalls, a timeline with ``record``) for people and files.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import replace
from functools import partial

from .compile.compiled import compile_machine, compile_profile
from .compile.lower import compile_program
from .compile.program import PlanInvalid
from .errors import InputError
from .compile.collectives import check_interconnect
from .fast import explicit as fastpath, uvm as fastuvm
from .hardware import Hardware, check_uvm_scale
from .model.allocation import allocation_keys
from .model.budget import check_budget, resolve_budget
from .model.splits import check_splits, split_profile
from .plan import Plan, check_plan
from .profile import Profile
from .result import Result, Score
from .run.arena import ALLOCATORS
from .run.caching import CACHING_ALLOCATORS
from .run.engine import allocation_lifetimes, invalid_result
from .run.iteration import run_program
from .units import MAX_COUNT

# every allocator model a plan without a placement may run against: online first and best
# fit over an arena (R51), and PyTorch's caching allocator, plain or with expandable
# segments (R55)
ALLOCATOR_NAMES = ALLOCATORS + CACHING_ALLOCATORS


def simulate(profile: Profile, plan: Plan, hardware: Hardware, budget_bytes: int | None = None,
             record: bool = False, reference: bool = False, allocator: str | None = None) -> Result:
    """Simulate one plan (see ``Simulator.simulate``). To simulate many plans of one
    profile and machine, make one ``Simulator``: it compiles them once."""
    return Simulator(profile, hardware).simulate(plan, budget_bytes, record=record, reference=reference,
                                                 allocator=allocator)


class Simulator:
    """A profile and a machine compiled once (simulator/compile/compiled.py), and the plans
    simulated on them."""

    def __init__(self, profile: Profile, hardware: Hardware):
        self.profile = profile
        self.hardware = hardware
        self.compiled = compile_profile(profile)
        self.machine = compile_machine(hardware)
        check_interconnect(self.compiled, self.machine, hardware.source or hardware.name)   # R57
        self._fast = fastpath.available() and not self.compiled.collectives   # C has no comm stream (R56)
        self._names = None
        self._uvm_scale_checked = False
        self._split: dict[tuple, "Simulator"] = {}

    def budget(self, plan: Plan, budget_bytes: int | None = None) -> int:
        """R2: the budget a plan runs under."""
        return resolve_budget(budget_bytes, plan, self.hardware)

    def simulate(self, plan: Plan, budget_bytes: int | None = None, record: bool = False,
                 reference: bool = False, allocator: str | None = None) -> Result:
        """Simulate ``plan``: the full Result.

        ``budget_bytes`` None takes the plan's, then the GPU's (R2). ``record`` keeps a
        Timeline in ``result.timeline``. ``reference`` always uses the Python reference;
        otherwise the C fast path runs when it is built (the reference explains an
        invalid plan's reason, and runs a plan whose times would overflow 64 bits); a
        UVM plan runs in C too (simulator/fast/uvm.py) where its C run applies.
        ``allocator`` (``first-fit`` or ``best-fit``, R51) models an online allocator's
        address ranges for a plan without a placement (on the reference); ``caching`` or
        ``caching-expandable`` (R55) models PyTorch's CUDA caching allocator: the budget
        then holds what it reserves, reported in ``result.reserved_bytes`` beside the live
        ``peak_bytes``. A plan with a placement, or in managed memory, runs as it would
        without one (the CLI refuses the pair). An unknown name is an InputError.

        Raises InputError for structural problems (unknown ids, a plan for another
        profile, an SSD action on a machine without one) and a budget above the GPU's
        memory. A plan that breaks a rule is a Result with ``valid`` False.
        """
        if allocator is not None and allocator not in ALLOCATOR_NAMES:
            raise InputError("<argument>", "allocator", f"{allocator!r} is not one of {', '.join(ALLOCATOR_NAMES)}")
        if plan.splits:
            sim, inner = self.split(plan)
            return self.as_whole(sim.simulate(inner, budget_bytes, record, reference, allocator))
        with _gc_paused():
            check_plan(plan, self.profile, self.machine.has_ssd, self.machine.cpu is not None)
            budget = self.budget(plan, budget_bytes)
            if allocator is not None and plan.placement is None and not plan.uvm:
                return self._reference(plan, budget, record, allocator)
            if not (record or reference or plan.reference_only) and self._fast:
                result = fastpath.simulate(self.compiled, self.machine, plan, budget)
                if result is not None:
                    return result
            if record or reference:
                return self._reference(plan, budget, record)
            return self._run(plan, budget)

    def split(self, plan: Plan) -> tuple["Simulator", Plan]:
        """R54: the Simulator of the profile a plan with ``splits`` runs (``split_profile``,
        made once per set of splits) and the plan as that profile's: its actions name
        chunks and slices (``o7/2``, ``t3/1``). InputError for a plan made for another
        profile or a bad split."""
        if plan.profile_sha256 and plan.profile_sha256 != self.compiled.sha256:
            check_plan(plan, self.profile, self.machine.has_ssd, self.machine.cpu is not None)   # words it
        check_splits(self.profile, plan.splits, plan.origin)
        key = tuple(sorted(plan.splits.items()))
        sim = self._split.get(key)
        if sim is None:
            sim = self._split[key] = Simulator(split_profile(self.profile, plan.splits, plan.origin), self.hardware)
        return sim, replace(plan, splits={}, profile_sha256=sim.compiled.sha256)

    def as_whole(self, result):
        """A split plan's Result or Score against this profile's ideal (R54: the chunks'
        launches are overhead, as a slower variant's time is, R52)."""
        ideal = self.profile.ideal_us
        if not result.valid or ideal <= 0:
            return result
        figures = {"overhead": result.iteration_us / ideal - 1.0}
        if isinstance(result, Result):
            figures["ideal_us"] = ideal
        return replace(result, **figures)

    def allocation_log(self, plan: Plan, budget: int):
        """R50: (Result, log, AllocationKeys) of an explicit-mode plan run under ``budget``
        with every GPU allocation logged (simulator/run/engine.py ``allocation_lifetimes``)
        and its allocation keys (simulator/model/allocation.py); None for a UVM plan (the
        driver places blocks). Raises PlanInvalid for a plan that breaks a rule. Assumes
        ``check_plan`` passed and the plan has no splits (``split`` it first)."""
        program = compile_program(self.profile, self.compiled, plan, self.machine)
        if program.uvm:
            return None
        result, log = allocation_lifetimes(self.compiled, program, self.machine, budget)
        return result, log, allocation_keys(program, self.compiled)

    def _run(self, plan: Plan, budget: int) -> Result:
        """The Result with no timeline of a plan the explicit C path does not run: a UVM
        plan's from C where that applies, else the Python reference's."""
        self._check_uvm_scale(plan)
        if not (plan.uvm and fastuvm.available()) or self.compiled.collectives:
            return self._reference(plan, budget, False)
        try:
            program = compile_program(self.profile, self.compiled, plan, self.machine)
        except PlanInvalid as exc:
            return invalid_result(exc, budget, self.compiled)
        result = None
        if fastuvm.applies(program, self.machine, budget):
            result = fastuvm.run(self.compiled, program, self.machine, budget)
        else:
            fastuvm.counts["reference"] += 1
        return result if result is not None else run_program(self.compiled, program, self.machine, budget)

    def _reference(self, plan: Plan, budget: int, record: bool, allocator: str | None = None) -> Result:
        self._check_uvm_scale(plan)
        try:
            program = compile_program(self.profile, self.compiled, plan, self.machine)
        except PlanInvalid as exc:
            return invalid_result(exc, budget, self.compiled)
        if record and self._names is None:
            self._names = [(op.id, op.name, op.phase) for op in self.profile.ops]
        return run_program(self.compiled, program, self.machine, budget, record, self._names, allocator)

    def _check_uvm_scale(self, plan: Plan) -> None:
        """R30: a UVM plan runs only where the machine's blocks and pages cut the profile's
        tensors into a number a run can afford (``check_uvm_scale``); checked once."""
        if plan.uvm and not self._uvm_scale_checked:
            check_uvm_scale(self.hardware, self.compiled.tensor_bytes.values(), self.profile.name)
            self._uvm_scale_checked = True

    def score(self, plan: Plan, budget_bytes: int | None = None) -> Score:
        """Score one plan (see ``Score``); the C fast path when built."""
        with _gc_paused():
            return self._score(plan, budget_bytes)

    def score_many(self, plans, budget_bytes: int | None = None) -> list[Score]:
        """Score plans one after the other, in order."""
        with _gc_paused():
            return [self._score(plan, budget_bytes) for plan in plans]

    def score_positions(self, kinds: bytes, tensors: bytes, afters: bytes, befores: bytes, schedule,
                        initial: bytes, budget_bytes: int, plan) -> Score:
        """``score(plan())`` for a plan given in positions (simulator/fast/explicit.py
        ``pack_positions``: action codes, tensor and op positions as int32 bytes, a schedule
        or None), with no Action objects made: what a search that decodes straight to
        positions (swapadvisor) scores. ``plan`` (a callable making the Plan) runs only to
        word an error, or where C cannot score it (not built, too many actions, 64-bit
        overflow)."""
        with _gc_paused():
            packed = fastpath.pack_positions(self.compiled, kinds, tensors, afters, befores, schedule, initial)
            if self._fast and len(packed[0]) <= MAX_COUNT:
                budget = check_budget(budget_bytes, self.hardware)
                check = partial(_check_made, plan, self.profile, self.machine.has_ssd)
                score = fastpath.score_packed(self.compiled, self.machine, packed, budget, check)
                if score is not None:
                    return score
            return self._score(plan(), budget_bytes)

    def _score(self, plan: Plan, budget_bytes: int | None) -> Score:
        if plan.splits:
            sim, inner = self.split(plan)
            return self.as_whole(sim._score(inner, budget_bytes))
        budget = self.budget(plan, budget_bytes)
        check = partial(check_plan, plan, self.profile, self.machine.has_ssd, self.machine.cpu is not None)
        if self._fast and not plan.reference_only:   # packing and C check the structure; check_plan words errors
            score = fastpath.score(self.compiled, self.machine, plan, budget, check)
            if score is not None:
                return score
        else:
            check()
        return score_of(self._run(plan, budget), self, plan)


def fast_available() -> bool:
    """True when the C simulator was built (``score`` and ``score_positions`` run in C)."""
    return fastpath.available()


def _check_made(plan, profile: Profile, has_ssd: bool) -> None:
    """check_plan of the plan ``plan()`` makes."""
    check_plan(plan(), profile, has_ssd)


def score_of(result: Result, simulator: Simulator, plan: Plan) -> Score:
    """A Score from a full Result (the reference's, or a UVM plan's C run); an infeasible
    plan is run once more with no budget to measure how far over it goes."""
    over = 0
    if result.valid and not result.feasible:
        unbounded = simulator._run(plan, fastpath.UNBOUNDED)
        over = max(1, unbounded.peak_bytes - result.budget_bytes)
    return Score(result.valid, result.feasible, result.iteration_us if result.valid else 0.0,
                 result.overhead if result.valid else 0.0, result.peak_bytes, over, result.progress,
                 result.rule, result.op, result.tensor)


@contextmanager
def _gc_paused():
    """A simulation makes many short-lived objects and no reference cycles: pausing the
    cyclic garbage collector keeps it from scanning a large profile again and again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def check_static(profile: Profile, plan: Plan, hardware: Hardware, budget_bytes: int | None = None,
                 simulator: Simulator | None = None) -> PlanInvalid | None:
    """The checks ``Simulator.simulate`` makes before it runs a plan, without running it:
    ``check_plan`` on this machine (InputError for the structure: unknown ids, a plan for
    another profile, an SSD or CPU the machine lacks), the budget (R2: InputError above
    the GPU's memory), then ``compile_program``, which decides every rule a plan breaks
    (simulate's ``valid: false`` comes from it alone, in every path). Returns the broken
    rule as a PlanInvalid (``rule``, ``op``, ``tensor``, ``reason``: what simulate
    reports), None for a plan that simulate finds valid. ``simulator``: one already
    made for this profile and machine."""
    sim = simulator if simulator is not None else Simulator(profile, hardware)
    if plan.splits:
        sim, plan = sim.split(plan)
        profile = sim.profile
    with _gc_paused():
        check_plan(plan, profile, sim.machine.has_ssd, sim.machine.cpu is not None)
        sim.budget(plan, budget_bytes)
        try:
            compile_program(profile, sim.compiled, plan, sim.machine)
        except PlanInvalid as exc:
            return exc
    return None
