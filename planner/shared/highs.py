"""A sparse MILP handed to HiGHS directly (highspy), with its verdict read honestly.

Models here have 10^4-10^5 columns; building them row by row in PuLP costs seconds, and
PuLP reports a time-limit stop as "Optimal" even without a solution. So rows are
collected as arrays, passed in one call, and the status, the MIP gap and the dual bound
come from HiGHS's own info.

HiGHS checks its ``time_limit`` between phases; its root cut rounds and presolve ran
seconds past it on a busy machine (tmof on ResNet-152 b512 at 30% with a solve beside:
a 12 s limit ended after 18 s). So every solve also interrupts itself from HiGHS's MIP,
simplex and IPM callbacks once ``OVERRUN_S`` past its limit, keeping its incumbent, or
earlier, at the last callback before it: where the next one, twice as far off as the
longer of the two intervals before, would come past it. HiGHS calls back only between its phases,
and a phase may run long (its MIP callbacks on ResNet-152 b512 at 30% came every second
through the root cuts, then not for 7 s: a 12.2 s limit ended after 18.8 s; now at 11.6 s).
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

INF = math.inf
HEURISTIC_EFFORT = 0.3   # of the search spent on primal heuristics (HiGHS default 0.05): a plan early matters most
OVERRUN_S = 0.25         # a solve interrupts itself this long after its time limit (the module docstring)
INTEGRAL = 1e-6          # an LP value this close to an integer counts as integral (``Model.around``)


class Model:
    """Columns (bounds, cost, integrality) and rows (sparse, with bounds), built up in
    blocks; ``add_vars`` returns the first column index of a block."""

    def __init__(self):
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.cost: list[float] = []
        self.integer: list[int] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []
        self._starts: list[int] = [0]
        self._index: list[int] = []
        self._value: list[float] = []

    @property
    def num_cols(self) -> int:
        return len(self.cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    def add_vars(self, count: int, lower: float = 0.0, upper: float = INF, cost: float = 0.0,
                 integer: bool = False) -> int:
        first = len(self.cost)
        self.lower.extend([lower] * count)
        self.upper.extend([upper] * count)
        self.cost.extend([cost] * count)
        self.integer.extend([1 if integer else 0] * count)
        return first

    def add_row(self, index, value, lower: float = -INF, upper: float = INF) -> None:
        """One row: lower <= sum value[k] x[index[k]] <= upper (repeated columns add up)."""
        self._index.extend(index)
        self._value.extend(value)
        self._starts.append(len(self._index))
        self.row_lower.append(lower)
        self.row_upper.append(upper)

    def with_integers_fixed(self, values, time_limit: float, threads: int) -> "Solution":
        """The LP left when every integer column is fixed to its value in ``values``: the
        best continuous values for those choices (the model is restored after)."""
        lower, upper, integer = self.lower, self.upper, self.integer
        with self._changed(lower=[float(values[k]) if integer[k] else lower[k] for k in range(self.num_cols)],
                           upper=[float(values[k]) if integer[k] else upper[k] for k in range(self.num_cols)],
                           integer=[0] * self.num_cols):
            return self.solve(time_limit, threads, 0, 0.0)

    def polish(self, solution: "Solution", time_limit: float, threads: int, gap: float) -> "Solution":
        """``solution`` with its integer columns fixed and the continuous ones solved
        for (a heuristic incumbent's continuous values are often far from their best);
        the dual bound stays the MIP's, the gap is taken again, and the status becomes
        optimal when that gap is within ``gap``."""
        if solution.values is None or not any(self.integer):
            return solution
        rounded = np.round(solution.values)
        fixed = self.with_integers_fixed(rounded, time_limit, threads)
        if fixed.values is None or fixed.objective >= solution.objective:
            return solution
        values = np.where(np.asarray(self.integer, dtype=bool), rounded, fixed.values)
        new_gap = None if solution.bound is None else max(0.0, (fixed.objective - solution.bound) / abs(fixed.objective))
        status = "optimal" if new_gap is not None and new_gap <= gap else solution.status
        return Solution(status, values, fixed.objective, solution.bound, new_gap, solution.model_status)

    def around(self, values, time_limit: float, threads: int, seed: int, gap: float) -> "Solution":
        """The MIP with every integer column that is integral in ``values`` (an LP
        relaxation's solution) fixed there, the fractional ones left free (RENS): a small
        MIP whose solution is one of the full model's (the model is restored after)."""
        x = np.asarray(values, dtype=float)
        whole = np.asarray(self.integer, dtype=bool) & (np.abs(x - np.round(x)) <= INTEGRAL)
        with self._changed(lower=np.where(whole, np.round(x), self.lower).tolist(),
                           upper=np.where(whole, np.round(x), self.upper).tolist()):
            return self.solve(time_limit, threads, seed, gap)

    def relaxation(self, time_limit: float, threads: int) -> "Solution":
        """The LP relaxation (integrality dropped), by the interior point method: on these
        models far faster than simplex at the root (the prototype: 23 s against 115 s)."""
        with self._changed(integer=[0] * self.num_cols):
            return self.solve(time_limit, threads, 0, 0.0, lp_solver="ipm")

    @contextmanager
    def _changed(self, **columns):
        """The model with these column fields (``lower``, ``upper``, ``integer``) replaced
        while the block runs, restored after."""
        saved = {name: getattr(self, name) for name in columns}
        for name, value in columns.items():
            setattr(self, name, value)
        try:
            yield self
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    def solve(self, time_limit: float, threads: int, seed: int, gap: float, log=None,
              start: np.ndarray | None = None, lp_solver: str = "choose") -> "Solution":
        import highspy

        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = self.num_cols, self.num_rows
        lp.col_cost_ = np.asarray(self.cost, dtype=float)
        lp.col_lower_ = np.asarray(self.lower, dtype=float)
        lp.col_upper_ = np.asarray(self.upper, dtype=float)
        lp.row_lower_ = np.asarray(self.row_lower, dtype=float)
        lp.row_upper_ = np.asarray(self.row_upper, dtype=float)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.asarray(self._starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.asarray(self._index, dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray(self._value, dtype=float)
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = self.num_cols, self.num_rows
        lp.integrality_ = [highspy.HighsVarType.kInteger if k else highspy.HighsVarType.kContinuous
                           for k in self.integer]
        highs = _quiet_highs(highspy)
        highs.setOptionValue("output_flag", log is not None)
        highs.setOptionValue("time_limit", float(time_limit))
        highs.setOptionValue("threads", int(threads))
        highs.setOptionValue("random_seed", int(seed) % 2147483647)
        highs.setOptionValue("mip_rel_gap", float(gap))
        highs.setOptionValue("mip_heuristic_effort", HEURISTIC_EFFORT)
        highs.setOptionValue("solver", lp_solver)
        highs.passModel(lp)
        if start is not None:
            given = highspy.HighsSolution()
            given.col_value = list(map(float, start))
            given.value_valid = True
            highs.setSolution(given)
        stop_at = time.perf_counter() + float(time_limit) + OVERRUN_S
        seen = [time.perf_counter(), 0.0, 0.0]   # the last callback, the two intervals before it
        stopped: list[float] = []

        def stop(event) -> None:
            now = time.perf_counter()
            seen[1:] = seen[2], now - seen[0]
            seen[0] = now
            if now + 2.0 * max(seen[1], seen[2]) > stop_at:   # the next callback may come past the limit
                event.interrupt()
                stopped.append(now)

        for event in (highs.cbMipInterrupt, highs.cbSimplexInterrupt, highs.cbIpmInterrupt):
            event.subscribe(stop)
        highs.run()
        return _solution(highs, by_limit=bool(stopped))


def _quiet_highs(highspy):
    """A Highs instance, without the banner its constructor prints on stdout (which
    would corrupt ``--json`` output)."""
    import os
    import sys
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highs = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return highs


@dataclass
class Solution:
    """What HiGHS found: ``status`` optimal (within the gap asked), feasible (a
    solution, stopped early), or none; the values, objective, dual bound and gap."""
    status: str
    values: np.ndarray | None
    objective: float | None
    bound: float | None
    gap: float | None
    model_status: str

    def against_bound(self, bound: float) -> "Solution":
        """This solution judged against another (weaker, still valid) dual bound: the gap
        is taken again, the status is at best feasible (its optimality was for a smaller model)."""
        if self.values is None:
            return Solution(self.status, None, None, bound, None, self.model_status)
        gap = max(0.0, (self.objective - bound) / abs(self.objective))
        return Solution("feasible", self.values, self.objective, bound, gap, self.model_status)


def _solution(highs, by_limit: bool = False) -> Solution:
    import highspy

    model_status = highs.getModelStatus()
    info = highs.getInfo()
    has_solution = info.primal_solution_status == 2   # kSolutionStatusFeasible
    values = np.asarray(highs.getSolution().col_value) if has_solution else None
    objective = info.objective_function_value if has_solution else None
    bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
    gap = info.mip_gap if has_solution and math.isfinite(info.mip_gap) else None
    if model_status == highspy.HighsModelStatus.kOptimal and has_solution:
        status = "optimal"
    elif has_solution:
        status = "feasible"
    else:
        status = "none"
    words = highs.modelStatusToString(model_status)
    if by_limit and model_status == highspy.HighsModelStatus.kInterrupt:
        words = "Time limit reached"   # our own stop at the limit, not a user's interrupt
    return Solution(status, values, objective, bound, gap, words)
