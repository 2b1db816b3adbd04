"""The search for one family's largest size: doubling from a start, then bisection.

Sizes are whole steps (a batch of k samples, or a context of k x ``--step`` tokens).
The search never extrapolates: it ends with ``largest`` tried and fitting and
``largest + 1`` tried and not fitting (or ``largest`` at the limit), so the edge it
reports is exact even where fitting is not monotone in the size.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EdgeSearch:
    """Which step to try next, given what was tried (``record``); ``next`` is None when the
    edge is found. ``start``: the first step tried; ``limit``: the largest step tried."""
    start: int = 1
    limit: int = 1 << 20
    tried: dict[int, bool] = field(default_factory=dict)

    def __post_init__(self):
        if not 1 <= self.start <= self.limit:
            raise ValueError(f"start {self.start} must be within 1..{self.limit}")

    @property
    def largest(self) -> int:
        """The largest step tried that fits (0: none does)."""
        return max((k for k, fits in self.tried.items() if fits), default=0)

    @property
    def smallest_failing(self) -> int | None:
        """The smallest step tried that does not fit, above ``largest``."""
        return min((k for k, fits in self.tried.items() if not fits and k > self.largest), default=None)

    @property
    def at_limit(self) -> bool:
        """The search stopped because every step up to ``limit`` it tried fits."""
        return self.largest >= self.limit

    def next(self) -> int | None:
        """The next step to try, or None when the edge is known."""
        lo, hi = self.largest, self.smallest_failing
        if lo >= self.limit:
            return None
        if hi is None:
            step = self.start if not self.tried else min(self.limit, max(2 * lo, lo + 1))
        elif hi - lo <= 1:
            return None
        else:                       # bisect (from 0 when nothing fits yet: halving down from the start)
            step = (lo + hi) // 2
        return None if step in self.tried else step

    def record(self, step: int, fits: bool) -> None:
        self.tried[step] = fits


def peak_next(speeds: dict[int, float | None]) -> int | None:
    """The next step to try in the search for the best throughput, or None when it is
    found: ``speeds`` maps each step tried to its throughput (None: it does not fit). The
    fastest step so far is bracketed by the nearest steps tried on each side, and the
    wider bracket is bisected until both of its neighbours were tried, so the step
    reported is a maximum among its neighbours (exact where throughput rises, then falls)."""
    fitting = {k: s for k, s in speeds.items() if s is not None}
    if not fitting:
        return None
    best = max(fitting, key=lambda k: (fitting[k], -k))
    below = max((k for k in speeds if k < best), default=0)
    above = min((k for k in speeds if k > best), default=None)
    gaps = []
    if best - below > 1:
        gaps.append((below, best))
    if above is not None and above - best > 1:
        gaps.append((best, above))
    if not gaps:
        return None
    lo, hi = max(gaps, key=lambda gap: (gap[1] - gap[0], -gap[0]))
    return (lo + hi) // 2
