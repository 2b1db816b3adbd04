"""The planner registry: every planner is a plain function registered by name with the
parameters it takes, so the command line can list them and check what users pass.

A planner function has the signature

    def my_planner(profile, hardware, budget_bytes, *, seed, **params) -> Draft

and returns a Draft (its actions, and optionally a schedule and initial placements);
``planner.api.make_plan`` turns it into a Plan, scored by the simulator.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from simulator.errors import InputError
from simulator.plan import Action


@dataclass(frozen=True)
class Param:
    """One parameter of a planner: its default and a line of help. The type is the
    default's (int, float, bool or str); ``choices`` limits a str."""
    name: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None

    def parse(self, value: Any, planner: str) -> Any:
        """Coerce a value (a string from the command line, or a Python value) to the type."""
        where = f"{planner}.{self.name}"
        kind = type(self.default)
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
            else:
                value = str(value)
        except (TypeError, ValueError):
            raise InputError("<argument>", f"--param {where}",
                             f"expected {kind.__name__}, got {value!r}") from None
        if self.choices is not None and value not in self.choices:
            raise InputError("<argument>", f"--param {where}",
                             f"{value!r} is not one of {', '.join(self.choices)}")
        return value


@dataclass
class Draft:
    """What a planner decided, before it is scored: actions in the order a runtime issues
    them, and optionally an op schedule and persistent tensors that start off the GPU."""
    actions: list[Action] = field(default_factory=list)
    schedule: list[str] | None = None
    initial: dict[str, str] = field(default_factory=dict)
    status: str = "ok"            # the planner's own verdict; the simulator has the last word
    gap: float | None = None      # for solvers: the optimality gap
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


def register(name: str, summary: str, params: tuple[Param, ...] = (), moves_persistent: bool = False,
             paper: str = ""):
    """Decorator: register a planner function under ``name``."""
    def wrap(func: Callable[..., Draft]) -> Callable[..., Draft]:
        if name in REGISTRY:
            raise ValueError(f"planner {name!r} registered twice")
        REGISTRY[name] = PlannerSpec(name, func, summary, tuple(params), moves_persistent, paper)
        return func
    return wrap


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
