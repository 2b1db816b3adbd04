"""g10's ``recompute`` (not in the paper; planner/swap/g10.py, the last departure): where
the link falls furthest behind g10's moves, the cheapest tensors that may be recomputed
there are, and G10's greedy plans the rest around them, the bytes searched by simulation.
"""
from __future__ import annotations

from typing import Callable

from ..core.api import score
from ..core.registry import Draft
from ..shared.regen import Regen, candidates, cover, shortfall

RECOMPUTE_STEP = 1.5   # the recomputed bytes grow (or shrink) by this factor per draft


def tier_shortfall(state, moves, tier: str) -> tuple[int, float]:
    """Where the tier falls furthest behind g10's ``moves`` (``state``: their G10State),
    and by how many bytes (regen.py ``shortfall``)."""
    held = [(lo, hi, m.interval.nbytes) for m in moves if m.tier == tier and not m.interval.wraps
            and m.interval.after is not None for lo, hi in m.away(state.n)]
    return shortfall(state.starts[:state.n], state._speeds["offload", tier][1], held)


def recompute_spills(sim, budget_bytes: int, best: Draft, state, moves,
                     drafts_with: Callable[[tuple[Regen, ...]], list[Draft]]) -> Draft:
    """G10's drafts again (``drafts_with``: host memory first, then the spread one) with the
    cheapest recomputable tensors idle where the link falls furthest behind ``moves``
    (``tier_shortfall``: the SSD when any move goes there, else PCIe) recomputed instead of
    moved, as many bytes as that shortfall, then more by ``RECOMPUTE_STEP`` while the
    simulated iteration shortens (fewer when more did not); the fastest draft of all,
    ``best`` included."""
    tier = "ssd" if any(m.tier == "ssd" for m in moves) else "host"
    at, short = tier_shortfall(state, moves, tier)
    if short <= 0:
        return best
    found = candidates(state.profile, 1.0 / state._speeds["offload", tier][1])

    def timed(draft: Draft) -> float:
        result = score(sim, budget_bytes, draft.actions, draft.initial)
        return result.iteration_us if result.ok else float("inf")

    tried: dict[tuple, tuple[float, Draft]] = {}

    def attempt(margin: float) -> tuple[float, Draft] | None:
        regens = tuple(cover(found, at, int(short * margin)))
        if not regens or regens in tried:
            return None
        drafts = list(reversed(drafts_with(regens)))   # the spread one first on ties
        times = [timed(d) for d in drafts]
        fastest = times.index(min(times))
        tried[regens] = (times[fastest], drafts[fastest])
        return tried[regens]

    best_us = timed(best)
    for step in (RECOMPUTE_STEP, 1.0 / RECOMPUTE_STEP):
        margin, gains = (1.0 if step > 1.0 else 1.0 / RECOMPUTE_STEP), 0
        while (found_now := attempt(margin)) is not None and found_now[0] < best_us:
            best_us, best = found_now
            margin *= step
            gains += 1
        if gains > 1:
            break   # more than the shortfall did better: fewer will not
    return best
