"""Where a move of the interval MILP may leave the GPU and be fetched back: the release and
fetch positions of an idle interval (the paper's window, or the ops over the budget it
reaches), positions past the window, and the pieces a copy runs in between them."""
from __future__ import annotations

import numpy as np

REACH_GROWTH = 1.5   # past the first ``window`` ops over the budget, positions this much farther apart


def windows(a: int, b: int, window: int, over: list[int] | None = None) -> tuple[tuple, tuple]:
    """The release and fetch positions of the idle interval (a, b). Without ``over``, the
    paper's window: the ``window`` ops after a+1 and before b-1. With ``over`` (the
    interval's ops over the budget, a+2 .. b-2), positions only at those ops, as far
    as the interval reaches: a release at another op frees memory at the same ops over
    the budget as one at the next op over it, with less time to copy; a fetch at another
    op takes memory back at the same ones as one at the op over it before, later. The
    first ``window`` of them after the last use (releases) and before the next
    (fetches) are all positions, the rest spaced out (``spaced``), the last (first) one
    included. Positions are increasing tuples; the model reads Y and Z between two
    positions as at the earlier one (``Formulation.Y``), and a copy runs in pieces
    between them (``Candidate.out_pieces``)."""
    if over is None:
        release = tuple(range(a + 2, min(a + 1 + window, b - 2) + 1))
        fetch = tuple(range(max(a + 2, b - 1 - window), b - 1))
        return release, fetch
    release = tuple(over[k] for k in spaced(len(over), window))
    fetch = tuple(sorted(over[len(over) - 1 - k] for k in spaced(len(over), window)))
    return release, fetch


def late_releases(last: int, over: list[int], fetch: tuple, far: int) -> tuple:
    """Up to ``far`` release positions past the window, at the interval's ops over the
    budget after ``last`` and before its first fetch position: the 1st, 2nd, 4th, 8th,
    ... of them (``log_spaced``). An offload queued behind others on the link still frees
    memory at the ops over the budget it reaches (the simulator frees it when the copy ends, R11); within the
    window alone the model must stretch steps to finish it."""
    beyond = [i for i in over if last < i < fetch[0]]
    return tuple(beyond[k] for k in log_spaced(len(beyond), far))


def early_fetches(first: int, over: list[int], fetch: tuple, far: int) -> tuple:
    """Up to ``far`` fetch positions before the window, at the interval's ops over the
    budget from ``first`` on: the 1st, 2nd, 4th, ... of them counting back from the
    window. A prefetch issued there takes memory back from the next op (as one issued at any op
    up to the next op over the budget would), and has that much longer to run."""
    before = [i for i in over if first <= i < fetch[0]]
    return tuple(sorted(before[len(before) - 1 - k] for k in log_spaced(len(before), far)))


def log_spaced(n: int, count: int) -> list[int]:
    """Up to ``count`` indexes of 0 .. n-1, doubling: 0, 1, 3, 7, ... (n-1 at most)."""
    if n <= 0 or count <= 0:
        return []
    return sorted({min(n - 1, 2 ** k - 1) for k in range(count)})


def spaced(n: int, dense: int) -> list[int]:
    """Indexes 0 .. n-1: the first ``dense`` all, then each ``REACH_GROWTH`` times as far
    from 0 as the one before, and n-1."""
    picked = list(range(min(n, dense)))
    k = max(dense, 1)
    while k < n - 1:
        picked.append(k)
        k = max(k + 1, int(np.ceil(k * REACH_GROWTH)))
    if n - 1 not in picked:
        picked.append(n - 1)
    return sorted(set(picked))


def chunks(start: int, stop: int, early: bool, coarse: bool = False) -> list[tuple[int, int]]:
    """The steps start .. stop-1 in pieces: one step each, or, ``coarse``, of 1, 1, 2, 4,
    ... steps from the ``early`` end (else from the late one), fine where a copy is most
    likely to run and few columns where positions are far apart by design (``reach``,
    ``far``). A piece's copy is spread over its steps in proportion to their ops' times
    (``Formulation._spread``): where a long op shares a piece with short ones, stacked
    pieces charge it more than a FIFO stream puts there (ResNet-152 b512 at 50%: joint's
    plan 3.311 s in the model with coarse pieces, 3.244 s one step each, 3.236 s simulated)."""
    if not coarse:
        return [(i, i + 1) for i in range(start, stop)]
    out, size, at = [], 1, 0
    while at < stop - start:
        length = min(size, stop - start - at)
        out.append((start + at, start + at + length) if early else (stop - at - length, stop - at))
        at += length
        size = 1 if at == 1 else 2 * size
    return out if early else out[::-1]
