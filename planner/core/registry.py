"""The planner registry: every planner is a plain function registered by name with the
parameters it takes, so the command line can list them and check what users pass.

A planner function has the signature

    def my_planner(profile, hardware, budget_bytes, *, options: RunOptions, **params) -> Draft

and returns a Draft (its actions, and optionally a schedule, initial placements, its own
estimate and notes); ``planner.core.api.make_plan`` turns it into a Plan, scored by the
simulator, with a lower bound beside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import math
import time
from typing import Any, Callable

from simulator.errors import InputError
from simulator.plan import Action

from .families import FAMILIES, FAMILY_NAMES


@dataclass(frozen=True)
class Param:
    """One parameter of a planner: its default, a line of help and the values it takes.

    The type is the default's (int, float, bool or str), or ``kind`` when the default is
    None (an optional value). ``choices`` limits a str; ``low`` / ``high`` bound a number
    (inclusive), and ``also`` lists special numbers outside them (-1: auto-tune).
    """
    name: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    also: tuple = ()
    kind: type | None = None

    @property
    def type(self) -> type:
        return self.kind or type(self.default)

    def describe(self) -> str:
        """The values it takes, for help text: ``one of a, b``, ``0 to 1``, ``>= 1 or -1``."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.low is None and self.high is None:
            return self.type.__name__
        if self.high is None:
            text = f">= {self.low:g}"
        elif self.low is None:
            text = f"<= {self.high:g}"
        else:
            text = f"{self.low:g} to {self.high:g}"
        return text + "".join(f" or {v:g}" for v in self.also)

    def parse(self, value: Any, planner: str) -> Any:
        """Coerce a value (a string from the command line, or a Python value) to the type
        and check it is one the parameter takes; InputError otherwise."""
        where = f"--param {planner}.{self.name}"
        kind = self.type
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if self.default is None:
                return None
            raise InputError("<argument>", where, f"expected {kind.__name__}, got {value!r}")
        try:
            if kind is bool:
                if isinstance(value, str):
                    if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                        raise ValueError
                    value = value.lower() in ("true", "1", "yes")
                elif not isinstance(value, bool):
                    raise ValueError
            elif kind is int:
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError
                value = int(value)
            elif kind is float:
                if isinstance(value, bool):
                    raise ValueError
                value = float(value)
                if not math.isfinite(value):
                    raise ValueError
            else:
                value = str(value)
        except (TypeError, ValueError, OverflowError):
            raise InputError("<argument>", where, f"expected a finite {kind.__name__}, got {value!r}") from None
        if self.choices is not None and value not in self.choices:
            raise InputError("<argument>", where, f"{value!r} is not one of {', '.join(self.choices)}")
        if kind in (int, float) and value not in self.also:
            if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
                raise InputError("<argument>", where, f"{value!r} is out of range (expected {self.describe()})")
        return value


STATUSES = ("optimal", "feasible", "heuristic", "fallback", "infeasible", "invalid")


@dataclass(frozen=True)
class RunOptions:
    """How any planner runs: its seed, a time limit (seconds; planners that search stop
    by then and return their best), threads for solvers, and a progress callback that
    receives short lines (the CLI prints them on stderr). ``simulator``: the run's
    compiled profile and machine (simulator.api.Simulator), which ``make_plan`` builds
    once and planners score their candidates on (``planner.core.api.simulator_for``)."""
    seed: int = 0
    time_limit: float | None = None
    threads: int = 1
    progress: Callable[[str], None] | None = None
    simulator: Any = field(default=None, compare=False, repr=False)

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    def deadline(self, started: float, default: float) -> float:
        """When a search begun at ``started`` stops searching: ``SEARCH_SHARE`` of its time
        limit (``default`` when none is set), so that what follows the search (lowering,
        the last simulations, the fallback's scoring) ends within the limit x 1.1 + 2 s."""
        return started + SEARCH_SHARE * (self.time_limit or default)

    def past(self, started: float, share: float) -> bool:
        """Has a run begun at ``started`` used ``share`` of its time limit (never, without one)?"""
        return self.time_limit is not None and time.perf_counter() - started > share * self.time_limit


DEFAULT_OPTIONS = RunOptions()
# A search stops at this share of its time limit (``RunOptions.deadline``): on the frontier's
# cells (compare, two jobs on two cores, --time-limit 20) the solvers' lowering, refinement and
# last simulations took up to 4.8 s past a deadline at the whole limit (issue 53)
SEARCH_SHARE = 0.85


@dataclass
class Draft:
    """What a planner decided, before it is scored: actions in the order a runtime issues
    them, and optionally an op schedule, persistent tensors that start off the GPU and
    ops that run on the host CPU.

    ``status`` is the planner's own verdict (one of STATUSES: a solver's ``optimal`` or
    ``feasible``, a greedy's ``heuristic``, ``fallback`` when it left its own rules to
    fit); the simulator has the last word. ``estimate_us`` is the planner's own
    prediction of the iteration time, when it has a cost model that gives one.
    """
    actions: list[Action] = field(default_factory=list)
    schedule: list[str] | None = None
    initial: dict[str, str] = field(default_factory=dict)
    cpu_ops: tuple[str, ...] = ()  # ops run on the host CPU (R24)
    memory: str = "explicit"       # "uvm": the plan runs in managed memory (R30-R37)
    read_mostly: tuple[str, ...] = ()  # UVM: tensors advised read-mostly (R34)
    uvm_backing: str | None = None     # UVM: "ssd" backs managed memory with a file (R35)
    allow_lossy: bool = False          # the plan may use lossy codecs (R40)
    variants: dict = field(default_factory=dict)   # op id -> the variant it runs (R52)
    placement: Any = None              # an offset per GPU allocation (R50; simulator.plan.Placement)
    status: str = "heuristic"
    gap: float | None = None      # for solvers: the optimality gap
    estimate_us: float | None = None
    notes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PlannerSpec:
    """A registered planner."""
    name: str
    func: Callable[..., Draft]
    summary: str
    params: tuple[Param, ...] = ()
    moves_persistent: bool = False  # may it move weights and optimizer state?
    paper: str = ""
    recomputes: bool = False        # may it recompute (which lower bound applies)?
    cpu_phases: tuple[str, ...] = ()  # phases whose ops it may run on the host CPU (R24)
    memory: str = "explicit"        # "uvm": its plans run in managed memory (R30-R37)
    variants: str | None = None     # the parameter that lets it choose op variants (R52), if it may
    searches: bool = False          # it searches until the run's time limit (a solver, a genetic search)
    family: str = "swap"            # what kind of plan it makes (one of FAMILIES), as its registration says
                                    # (a spec made by hand, as a test's stub planner, is a swap planner)
    recompute_param: str | None = None   # a swap planner's parameter that lets it recompute too, if it has one

    def may(self, what: str, resolved: dict[str, Any] | None = None) -> bool:
        """Whether its plans may hold ``what``: ``swap`` (offloads and prefetches, or UVM
        hints), ``recompute`` (drops and recomputes), ``persistent`` (weights and optimizer
        state moved), ``cpu`` (ops on the CPU), ``codecs`` (R40-R42), ``variants`` (R52):
        the kind of actions its family and flags declare (and, for ``recompute``, its
        ``recompute_param`` among the ``resolved`` parameters), which its bound assumes."""
        family = self.family
        recomputes = self.recomputes or bool(self.recompute_param and (resolved or {}).get(self.recompute_param))
        return {"swap": family not in ("recompute", "baseline"), "recompute": recomputes,
                "persistent": self.moves_persistent, "cpu": bool(self.cpu_phases),
                "codecs": family in ("compression", "placement"), "variants": self.variants is not None}[what]

    def chooses_variants(self, resolved: dict[str, Any]) -> bool:
        """Whether a run with these (resolved) parameters may choose op variants."""
        return self.variants is not None and bool(resolved.get(self.variants))

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Defaults overlaid with ``given`` (checked and coerced). Unknown names are errors."""
        known = {p.name: p for p in self.params}
        for key in given:
            if key not in known:
                names = ", ".join(known) or "none"
                raise InputError("<argument>", f"--param {key}",
                                 f"planner {self.name!r} has no parameter {key!r} (parameters: {names})")
        return {name: (p.parse(given[name], self.name) if name in given else p.default)
                for name, p in known.items()}


REGISTRY: dict[str, PlannerSpec] = {}

QUICK = ("none", "vdnn", "lms", "capuchin", "g10", "chen", "uvm")   # compare's default: one or two per
                                                                     # family, each seconds on 11k ops
START_HERE = ("start here: capuchin (swaps and recomputes, seconds); g10 where the machine has an SSD; uvm when "
              "one op alone is bigger than the budget; `swapplan compare PROFILE` ranks the quick set "
              f"({', '.join(QUICK)}); swapadvisor and the MILPs (autotm, joint) search for better plans in minutes")


def register(name: str, summary: str, params: tuple[Param, ...] = (), moves_persistent: bool = False,
             paper: str = "", recomputes: bool = False, cpu_phases: tuple[str, ...] = (), memory: str = "explicit",
             variants: str | None = None, searches: bool = False, family: str | None = None,
             recompute_param: str | None = None):
    """Decorator: register a planner function under ``name`` (``family``: what kind of plan
    it makes, one of ``FAMILIES``, which every planner says, its module being in that
    family's folder, ``planner/<FOLDERS[family]>/``; ``variants``: the name of its boolean
    parameter that lets it choose op variants, for a planner that may; ``recompute_param``:
    that of a swap planner's boolean parameter that lets it recompute; ``searches``: it runs
    until the time limit, as solvers and genetic searches do)."""
    def wrap(func: Callable[..., Draft]) -> Callable[..., Draft]:
        if name in REGISTRY:
            raise ValueError(f"planner {name!r} registered twice")
        if family not in FAMILIES:
            raise ValueError(f"planner {name!r}: family {family!r} is not one of {', '.join(FAMILIES)}")
        REGISTRY[name] = PlannerSpec(name, func, summary, tuple(params), moves_persistent, paper, recomputes,
                                     tuple(cpu_phases), memory, variants, searches, family, recompute_param)
        return func
    return wrap


def select_planners(text: str, where: str = "--planners") -> list[str]:
    """The planners a comma-separated list names, in order and once each: planner names,
    ``quick`` (``QUICK``), ``all``, and families (``family:uvm`` or ``uvm``, ``swap``,
    ``recompute``, ``swap+recompute``, ``placement``, ``compression``, ``cpu-offload``,
    ``baseline``). InputError for a name that is none of these."""
    _load_all()
    chosen: list[str] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        key = token.lower().removeprefix("family:").replace(" ", "")
        if token in REGISTRY and not token.lower().startswith("family:"):
            chosen.append(token)
        elif key == "all":
            chosen += sorted(REGISTRY)
        elif key == "quick":
            chosen += QUICK
        elif key in FAMILY_NAMES:
            chosen += [name for name in sorted(REGISTRY) if REGISTRY[name].family == FAMILY_NAMES[key]]
        else:
            raise InputError("<argument>", where, f"unknown planner or family {token!r} (planners: "
                             f"{', '.join(sorted(REGISTRY))}; families: {', '.join(sorted(FAMILY_NAMES))}; "
                             "quick; all)")
    return list(dict.fromkeys(chosen))


def get_planner(name: str) -> PlannerSpec:
    """The planner called ``name``; InputError listing the known ones otherwise."""
    _load_all()
    if name not in REGISTRY:
        raise InputError("<argument>", "planner", f"unknown planner {name!r} (planners: {', '.join(sorted(REGISTRY))})")
    return REGISTRY[name]


def planners() -> list[PlannerSpec]:
    """Every registered planner, by name."""
    _load_all()
    return [REGISTRY[name] for name in sorted(REGISTRY)]


def _load_all() -> None:
    """Import the planner modules (each registers itself)."""
    from . import catalog  # noqa: F401
