"""A fast lower bound on the iteration time any plan can reach within a budget.

The argument, op by op, for the profile's own order. Let E_p be the bytes by which op
p's no-swap resident set exceeds the budget. While p runs, at least E_p bytes of tensors
that p does not touch must be off the GPU. A non-persistent such tensor was produced on
the GPU before p and is used again after p, so each of its bytes was either

- swapped: it crossed the PCIe up link after its producer ran, before p started, and
  crosses the down link back after p started, before its next use; or
- recomputed: it was dropped and its producer runs again after p, before its next use.

With A_p the compute time before p, C_p the compute time from p's start to the end,
S bytes swapped and R recomputed (S + R = E_p), and one PCIe latency each way:

    iteration >= max(A_p, lat + S / up) + max(C_p + recompute_time(R), lat + S / down)

because p cannot start before its predecessors have run nor before S bytes have left,
and the iteration cannot end before the rest of the compute (and the recomputes) has
run nor before S bytes have come back. recompute_time(R) is the least producer time
that regenerates R bytes, taking tensors live and idle at p cheapest per byte first and
allowing fractions (a relaxation, so still a bound). The bound is the maximum over ops
of the minimum over S of that expression, and never below the ideal time. The swap-only
variant fixes R = 0.

Where weights and optimizer state may move too (planners that place them off the GPU),
their idle bytes at p are counted as free to move (a relaxation again). The bound holds
for every plan that keeps the profile's op order; it ignores SSD speed (an SSD copy also
crosses PCIe, so it is never faster) and contention between offloads of different ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from simulator.compile.compiled import link_speed
from simulator.hardware import Hardware
from simulator.profile import Profile

from .analysis import fastest_time_us, least_workspace, op_start_us


@dataclass(frozen=True)
class Bound:
    """A lower bound on the iteration time, the op that sets it and why."""
    iteration_us: float
    op: str | None
    recompute: bool
    moves_persistent: bool
    feasible: bool = True     # False: no plan of this kind fits the budget at all
    applies: bool = True      # False: the plan does what the argument leaves out (``outside``)
    uvm: bool = False         # a UVM plan (R30-R37): the bound is the ideal time
    outside: str = "ops on the CPU"   # what the argument leaves out, when it does not apply

    @property
    def kind(self) -> str:
        """Which bound: ``swap`` or ``swap+recompute``, ``+persistent`` when weights move;
        ``none (ops on the CPU)`` or ``none (codecs)`` when it does not apply; ``uvm (the
        ideal)`` for UVM plans."""
        if self.uvm:
            return "uvm (the ideal)"
        if not self.applies:
            return f"none ({self.outside})"
        return ("swap+recompute" if self.recompute else "swap") + ("+persistent" if self.moves_persistent else "")

    @property
    def words(self) -> str:
        """The kind as users read it, the one wording `plan`, `simulate` and `compare` print."""
        return bound_words(self.kind)

    @property
    def value_us(self) -> float | None:
        """The bound in us; None when no plan of its kind fits or it does not apply."""
        return self.iteration_us if self.feasible and self.applies else None

    def gap(self, iteration_us: float) -> float | None:
        """How far a plan's time is above the bound (0.05 = 5% above); None if infinite."""
        if not self.feasible or not self.applies or self.iteration_us <= 0:
            return None
        return iteration_us / self.iteration_us - 1.0


def lower_bound(profile: Profile, hardware: Hardware, budget_bytes: int, recompute: bool = True,
                moves_persistent: bool = False, cpu_ops: bool = False, uvm: bool = False,
                codecs: bool = False, variants: bool = False) -> Bound:
    """The lower bound of the module docstring for ``budget_bytes`` on ``hardware``.

    With ``cpu_ops`` (a plan that runs ops on the host CPU, R24) the argument does not
    hold, since such a plan takes work off the GPU: the Bound says it does not apply.
    With ``uvm`` (a plan in managed memory, R30-R37) it does not hold either: a block
    with a valid backing copy leaves the GPU without crossing the up link (R34), a
    prefetch hint pays no fault latency, and the budget may pass the GPU's memory; what
    does hold is that no UVM plan beats the ideal time (compute never waits less than
    nothing), so the bound reported is the ideal, of kind ``uvm (the ideal)``. With
    ``codecs`` (R40-R42: compressed transfers move fewer bytes than the tensor, an
    encoded tensor takes less memory) it does not apply either. With ``variants`` (a plan
    that may choose op variants, R52) each op counts at its fastest algorithm's time and
    its smallest workspace (a relaxation: the bound holds for every choice), and the
    bound may then lie below the profile's ideal time.
    """
    if uvm:
        return Bound(profile.ideal_us, None, recompute, moves_persistent, uvm=True)
    if cpu_ops:
        return Bound(float("nan"), None, recompute, moves_persistent, applies=False)
    if codecs:
        return Bound(float("nan"), None, recompute, moves_persistent, applies=False, outside="codecs")
    starts = op_start_us(profile)
    times = tuple(op.time_us for op in profile.ops)
    spare = [0] * len(profile.ops)   # workspace bytes a smaller variant frees at each op
    best = profile.ideal_us          # the rounded ideal time (R3) the simulator reports
    if variants and any(op.variants for op in profile.ops):
        times = tuple(fastest_time_us(op) for op in profile.ops)
        starts = (0.0, *accumulate(times))
        spare = [op.workspace_bytes - least_workspace(op) for op in profile.ops]
        best = min(best, starts[-1])
    ideal = starts[-1]
    latency, up = link_speed(hardware, "offload", "host")
    _, down = link_speed(hardware, "prefetch", "host")
    tensors = profile.tensor_by_id
    persistent = profile.persistent_bytes
    where = None
    candidates = []
    for p, op in enumerate(profile.ops):
        excess = profile.resident_bytes[p] - spare[p] - budget_bytes
        if excess <= 0:
            continue
        touched = set(op.inputs) | set(op.outputs) | set(op.updates)
        touched_persistent = sum(tensors[t].bytes for t in touched if tensors[t].persistent)
        touched_live = sum(tensors[t].bytes for t in touched if not tensors[t].persistent)
        # live non-persistent bytes p does not touch: the resident set less weights,
        # workspace and what p reads, writes or makes
        movable = profile.resident_bytes[p] - persistent - op.workspace_bytes - touched_live
        if moves_persistent:
            excess -= persistent - touched_persistent
            if excess <= 0:
                continue
        if movable < excess:
            return Bound(float("inf"), op.id, recompute, moves_persistent, feasible=False)
        swap_only = _expression(starts[p], ideal - starts[p], excess, 0.0, latency, up, down)
        candidates.append((swap_only, p, excess, touched))
    candidates.sort(key=lambda c: -c[0])
    lives = _Lifetimes(profile, times) if recompute and candidates else None
    for swap_only, p, excess, touched in candidates:
        if swap_only <= best:
            break   # the recompute variant of this op and every later one is no larger
        value = swap_only
        if recompute:
            ratio, size = lives.idle_at(p, touched)
            value = _with_recompute(ratio, size, starts[p], ideal - starts[p], excess, latency, up, down)
        if value > best:
            best, where = value, profile.ops[p].id
    return Bound(best, where, recompute, moves_persistent)


def _expression(before_us: float, rest_us: float, swapped: float, recompute_us: float,
                latency: float, up: float, down: float) -> float:
    out = max(before_us, latency + swapped / up) if swapped > 0 else before_us
    back = latency + swapped / down if swapped > 0 else 0.0
    return out + max(rest_us + recompute_us, back)


class _Lifetimes:
    """The non-persistent tensors of a profile as arrays (first and last op position,
    bytes, and the producer's time per byte), to find the idle ones at an op at once."""

    def __init__(self, profile: Profile, times: tuple):
        kept = [t for t in profile.tensors if not t.persistent and t.bytes > 0]
        size = np.array([t.bytes for t in kept], dtype=np.int64)
        ratio = np.array([times[profile.producer[t.id]] / t.bytes for t in kept], dtype=np.float64)
        order = np.lexsort((size, ratio))      # cheapest per byte first, then the smaller: once for every op
        spans = [profile.lifetime(kept[i].id) for i in order]
        self.index = {kept[i].id: k for k, i in enumerate(order)}
        self.first = np.array([first for first, _ in spans], dtype=np.int64)
        self.last = np.array([last for _, last in spans], dtype=np.int64)
        self.size, self.ratio = size[order], ratio[order]

    def idle_at(self, p: int, touched) -> tuple[np.ndarray, np.ndarray]:
        """(time per byte, bytes) of the tensors live at op p that p does not touch,
        cheapest per byte first (then the smaller first)."""
        live = (self.first <= p) & (self.last >= p)
        for t in touched:
            k = self.index.get(t)
            if k is not None:
                live[k] = False
        return self.ratio[live], self.size[live]


def _with_recompute(ratio: np.ndarray, size: np.ndarray, before_us: float, rest_us: float, excess: int,
                    latency: float, up: float, down: float) -> float:
    """The minimum over the bytes swapped S (the rest recomputed, from the idle tensors
    ``ratio`` per byte and ``size`` bytes, cheapest first) of the expression. It is convex
    and piecewise linear in S, so the minimum lies at one of its breakpoints: the ends,
    where the copies out stop limiting the start of p, the ends of the recompute cost's
    pieces, and where on each piece the copies back meet the compute after p."""
    cum_bytes = np.concatenate(([0], np.cumsum(size)))
    # only the cheapest tensors that cover the excess can be recomputed (R <= excess): the pieces after
    # the one that reaches it hold no breakpoint in [0, excess]
    m = min(int(np.searchsorted(cum_bytes, excess, side="left")), len(ratio))
    ratio, size, cum_bytes = ratio[:m], size[:m], cum_bytes[:m + 1]
    cum_time = np.concatenate(([0.0], np.cumsum(ratio * size)))
    fixed = np.array([0.0, float(excess), (before_us - latency) * up])
    lo, hi = excess - cum_bytes[1:], excess - cum_bytes[:-1]         # S on each piece of the cost
    meet = (rest_us + cum_time[:-1] + (excess - cum_bytes[:-1]) * ratio - latency) / (ratio + 1.0 / down)
    points = np.concatenate((fixed, lo, hi[:1], meet))    # hi[i] is lo[i - 1]: the pieces' ends once
    points = points[(points >= 0.0) & (points <= excess)]
    recomputed = excess - points
    if len(ratio):
        i = np.clip(np.searchsorted(cum_bytes, recomputed, side="left"), 1, len(ratio))
        recompute_us = cum_time[i - 1] + (recomputed - cum_bytes[i - 1]) * ratio[i - 1]
    else:
        recompute_us = np.zeros_like(points)   # no idle tensor: S = excess is the only way
    swapped = points > 0
    out = np.where(swapped, np.maximum(before_us, latency + points / up), before_us)
    back = np.where(swapped, latency + points / down, 0.0)
    return float(np.min(out + np.maximum(rest_us + recompute_us, back)))


def bound_fields(bound: Bound, result) -> dict:
    """``lower_bound_us``, ``gap_to_bound`` and ``bound`` (its kind) for a result: the gap
    only for a plan that runs, the bound None when no plan of its kind fits."""
    return {"lower_bound_us": bound.value_us,
            "gap_to_bound": bound.gap(result.iteration_us) if result.ok else None,
            "bound": bound.kind}


def bound_words(kind: str) -> str:
    """A bound's kind (``Bound.kind``, as plans store it) in words: which plans it is a
    bound for (``swap+recompute`` -> "plans that swap or recompute")."""
    if kind.startswith("uvm"):
        return "plans in managed memory (the bound is the ideal)"
    if kind.startswith("none"):
        return f"no bound: {kind[len('none'):].strip(' ()')} are outside the argument"
    verbs = {"swap": "swap", "recompute": "recompute", "persistent": "move weights and optimizer state"}
    parts = [verbs.get(part, part) for part in kind.split("+")]
    return "plans that " + (parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1])
