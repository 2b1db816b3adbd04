"""One cell of a comparison: a (profile, hardware, planner, budget) to plan and score.

``run_cell`` is the unit of work a local process or a Dask worker runs: it plans, scores
and returns one result row and the plan's JSON, and never raises for a planner's failure
(the row says what happened), so that one bad cell never stops a sweep.
"""
from __future__ import annotations

import json
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache

from simulator.errors import InfeasibleError, InputError, SwapplanError

# A cell's status: the simulator's verdict on its plan, or why there is no plan.
OK, INFEASIBLE, INVALID = "ok", "infeasible", "invalid"
BELOW_FLOOR, TIMEOUT, ERROR = "below-floor", "timeout", "error"

# Columns of a result row, in the order results.csv writes them.
# ``family``, ``cell_bound_us`` and ``gap_to_cell_bound`` depend on the other rows of the
# budget's column: compare.grid.annotate fills them whenever the rows are written.
COLUMNS = ("profile", "hardware", "planner", "family", "params", "seed", "budget", "budget_bytes", "capped",
           "status", "planner_status", "fallback", "feasible", "iteration_us", "ideal_us", "overhead",
           "lower_bound_us", "gap_to_bound", "bound", "cell_bound_us", "gap_to_cell_bound", "peak_bytes",
           "bytes_pcie_down", "bytes_pcie_up", "bytes_ssd_read", "bytes_ssd_write", "actions", "planning_seconds",
           "plan_file", "error")


@dataclass(frozen=True)
class Cell:
    """What to run: ``profile`` and ``hardware`` as given on the command line (a shipped
    name or a file), ``budget`` as given (``70%`` or ``8GiB``) with its bytes resolved
    against the profile's peak and capped at the GPU's memory (``capped``)."""
    profile: str
    profile_name: str
    profile_sha256: str
    hardware: str
    hardware_name: str
    planner: str
    budget: str
    budget_bytes: int
    capped: bool
    seed: int = 0
    time_limit: float | None = None
    params: dict = field(default_factory=dict, hash=False, compare=False)
    split_ops: bool = True       # R54: ops may run in chunks where one alone is over the budget

    @property
    def key(self) -> str:
        """Identifies a finished cell across runs (resume): same profile content, machine,
        planner, parameters, budget and seed."""
        return "|".join((self.profile_sha256[:16], self.hardware_name, self.planner,
                         json.dumps(self.params, sort_keys=True), self.budget, str(self.budget_bytes), str(self.seed)))

    @property
    def work_key(self) -> str:
        """What is planned, whatever the budget was called: cells with the same work key
        give the same plan."""
        return "|".join((self.profile_sha256[:16], self.hardware_name, self.planner,
                         json.dumps(self.params, sort_keys=True), str(self.budget_bytes), str(self.seed)))

    @property
    def plan_file(self) -> str:
        """The plan's file name under ``plans/``: readable, and safe on any filesystem."""
        budget = self.budget.replace("%", "pct").replace(".", "_")
        parts = (self.profile_name, self.hardware_name, self.planner, budget)
        return "__".join("".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in part) for part in parts) + ".json"


class CellTimeout(BaseException):
    """The cell ran past its time limit. A BaseException, as KeyboardInterrupt is, so that
    no planner's ``except Exception`` (a seed that fails, a solver that gives up) can
    swallow it and run on."""


UNLIMITED_CELL_S = 900.0   # without a time limit a cell is still stopped after 15 minutes


def hard_limit_s(time_limit: float | None) -> float:
    """When a running cell is stopped: planners that can stop early get ``time_limit``
    itself (None: their own default, 60 s for the searching ones); anything still
    running at 1.5x + 1 s (or after UNLIMITED_CELL_S) is cut off, recorded as a timeout."""
    return UNLIMITED_CELL_S if time_limit is None else 1.5 * time_limit + 1.0


@contextmanager
def _deadline(seconds: float):
    """Raise CellTimeout in this thread after ``seconds``, and again every 0.25 s until
    the block ends, so that one swallowed where Python drops exceptions (a finaliser, a
    generator being closed) does not let the cell run on (main thread only: a Dask
    worker's thread runs on, bounded by the planner's own time limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return

    def expire(signum, frame):
        raise CellTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.25)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@lru_cache(maxsize=8)
def cell_profile(spec: str, sha256: str):
    """A cell's profile, read once per process, checked against the digest the cell was made with."""
    from simulator.catalog import open_profile
    profile = open_profile(spec)
    if profile.sha256 != sha256:
        raise InputError(spec, "profile", "changed on disk since the comparison started")
    return profile


@lru_cache(maxsize=8)
def cell_hardware(spec: str):
    """A cell's hardware, read once per process."""
    from simulator.hardware import load_hardware
    return load_hardware(spec)


def empty_row(cell: Cell) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(profile=cell.profile_name, hardware=cell.hardware_name, planner=cell.planner,
               params=json.dumps(cell.params, sort_keys=True), seed=cell.seed, budget=cell.budget,
               budget_bytes=cell.budget_bytes, capped=cell.capped, feasible=False)
    return row


def fallback_reason(planner_status: str | None, notes: dict | None) -> str | None:
    """Why the plan is a fallback (the planner's ``notes.fallback``, or its status
    ``fallback``), or None when it is the planner's own plan."""
    why = (notes or {}).get("fallback")
    if isinstance(why, str) and why:
        return why
    return "the planner fell back (status fallback)" if planner_status == "fallback" else None


def run_cell(cell: Cell) -> tuple[dict, str | None]:
    """Plan and score one cell: (its result row, the plan as JSON text or None).

    A planner that raises, or runs past the hard limit, gives a row with status
    ``error`` or ``timeout`` and the reason in ``error``; a budget below the planner's
    floor gives ``below-floor``.
    """
    from simulator.plan import plan_json

    row, planned, _ = plan_cell(cell)
    return row, None if planned is None else plan_json(planned.plan)


def plan_cell(cell: Cell):
    """``run_cell``'s work: (the row, the ``planner.core.api.Planned`` or None when there
    is no plan, and for a budget below the planner's floor ``{"floor_bytes", "op"}``),
    for callers that read more than the row holds (``fit``: where a plan stopped)."""
    from planner.core.api import make_plan
    from planner.core.registry import RunOptions

    row = empty_row(cell)
    started = time.perf_counter()
    try:
        with _deadline(hard_limit_s(cell.time_limit)) as armed:
            profile, hardware = cell_profile(cell.profile, cell.profile_sha256), cell_hardware(cell.hardware)
            row["ideal_us"] = profile.ideal_us
            options = RunOptions(seed=cell.seed, time_limit=cell.time_limit)
            planned = make_plan(profile, hardware, cell.budget_bytes, cell.planner, dict(cell.params),
                                cell.seed, options, split_ops=cell.split_ops)
            if armed and time.perf_counter() - started > hard_limit_s(cell.time_limit):
                raise CellTimeout()   # past the hard limit, whatever swallowed the alarm
    except InfeasibleError as exc:
        row.update(status=BELOW_FLOOR, error=str(exc))
        return row, None, {"floor_bytes": exc.floor_bytes, "op": exc.op}
    except CellTimeout:
        row.update(status=TIMEOUT, planning_seconds=round(time.perf_counter() - started, 3),
                   error=f"stopped after {hard_limit_s(cell.time_limit):g} s" +
                   (f" (time limit {cell.time_limit:g} s)" if cell.time_limit is not None else ""))
        return row, None, {}
    except SwapplanError as exc:
        row.update(status=ERROR, error=exc.line() if isinstance(exc, InputError) else str(exc))
        return row, None, {}
    except Exception as exc:  # a planner's bug: recorded, the sweep goes on
        last = traceback.extract_tb(exc.__traceback__)[-1]
        row.update(status=ERROR, error=f"{type(exc).__name__}: {exc} (at {last.filename.rsplit('/', 1)[-1]}:"
                                       f"{last.lineno})")
        return row, None, {}
    result, predicted, report = planned.result, planned.plan.predicted, planned.plan.planner
    links = result.link_bytes or {}
    row.update(status=OK if result.ok else (INVALID if not result.valid else INFEASIBLE),
               planner_status=report.status, fallback=fallback_reason(report.status, report.notes),
               feasible=result.ok,
               iteration_us=result.iteration_us if result.ok else None,   # a plan that stops has no time
               overhead=result.overhead if result.ok else None,
               lower_bound_us=predicted.get("lower_bound_us"), gap_to_bound=predicted.get("gap_to_bound"),
               bound=report.bound, peak_bytes=result.peak_bytes,
               bytes_pcie_down=links.get("pcie_down", 0), bytes_pcie_up=links.get("pcie_up", 0),
               bytes_ssd_read=links.get("ssd_read_link", 0), bytes_ssd_write=links.get("ssd_write_link", 0),
               actions=len(planned.plan.actions), planning_seconds=round(planned.seconds, 3),
               plan_file="plans/" + cell.plan_file,
               error=None if result.ok else result.reason)
    return row, planned, {}
