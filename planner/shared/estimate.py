"""The op-granularity GPU memory estimate that g10, capuchin and flashneuron share.

Each of those planners decides where tensors go by asking which ops would be over the
budget, so they keep one estimate, built one way: ``profile.resident_bytes`` (the bytes
resident at each op with no swapping), less each tensor's bytes over the op positions it
is counted away. It approximates the simulator's memory with whole ops on the ideal
timeline: a tensor is away for whole op positions or not at all, and copies in flight,
their queues and the allocator are not modelled.
"""
from __future__ import annotations

import numpy as np

from simulator.units import us_to_ps


class MemoryEstimate:
    """Bytes on the GPU at each op position (``bytes``, int64) against ``budget``.

    Ranges are op positions [lo, hi). Over-budget kernel time in a range comes from a
    running sum of op times in integer picoseconds, rebuilt only after the estimate
    changed, so that a range with no op over the budget sums to exactly 0.
    """

    def __init__(self, profile, budget_bytes: int):
        self.budget = budget_bytes
        self.bytes = np.array(profile.resident_bytes, dtype=np.int64)
        self._times_us = np.array([op.time_us for op in profile.ops], dtype=float)
        self._times_ps: np.ndarray | None = None    # built on first use: not every planner asks for time
        self._over_sum: np.ndarray | None = None    # running sum of over-budget ps; None after a change

    def remove(self, nbytes: int, lo: int, hi: int) -> None:
        """A tensor of ``nbytes`` leaves the GPU at op positions [lo, hi)."""
        self.bytes[lo:hi] -= nbytes
        self._over_sum = None

    def add(self, nbytes: int, lo: int, hi: int) -> None:
        """A tensor of ``nbytes`` is on the GPU (again) at op positions [lo, hi)."""
        self.bytes[lo:hi] += nbytes
        self._over_sum = None

    def over(self) -> np.ndarray:
        """Per op position: is the estimate over the budget?"""
        return self.bytes > self.budget

    def any_over(self) -> bool:
        return bool(self.over().any())

    def over_in(self, lo: int, hi: int) -> np.ndarray:
        """The op positions in [lo, hi) over the budget, in order."""
        if hi <= lo:
            return np.empty(0, dtype=np.int64)
        return np.flatnonzero(self.bytes[lo:hi] > self.budget) + lo

    def last_over(self, nbytes: int, lo: int, hi: int, limit: float | None = None) -> int | None:
        """The last op position in [lo, hi) that ``nbytes`` more would put over ``limit``
        (the budget by default); None when they fit at every one."""
        limit = self.budget if limit is None else limit
        found = np.flatnonzero(self.bytes[lo:hi] + nbytes > limit)
        return lo + int(found[-1]) if found.size else None

    def over_us(self, lo: int, hi: int) -> float:
        """Kernel time in [lo, hi) with the estimate over the budget."""
        if hi <= lo:
            return 0.0
        if self._over_sum is None:
            if self._times_ps is None:
                self._times_ps = np.array([us_to_ps(t) for t in self._times_us.tolist()], dtype=np.int64)
            self._over_sum = np.concatenate(([0], np.cumsum(np.where(self.over(), self._times_ps, 0))))
        return float(self._over_sum[hi] - self._over_sum[lo]) / 1e6

    def over_us_at(self, where: np.ndarray | None = None) -> float:
        """Kernel time over the budget at the op positions of the mask ``where`` (all of
        them by default), summed in microseconds."""
        over = self.over() if where is None else where & self.over()
        return float(self._times_us[over].sum())
