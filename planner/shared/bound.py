"""A fast lower bound on the iteration time any plan can reach within a budget.

The argument, op by op, for the profile's own order. Let E_p be the bytes by which op
p's no-swap resident set exceeds the budget. While p runs, at least E_p bytes of tensors
that p does not touch must be off the GPU. A non-persistent such tensor was produced on
the GPU before p and is used again after p, so each of its bytes was either

- swapped: it crossed the PCIe up link after its producer ran, before p started, and
  crosses the down link back after p started, before its next use; or
- recomputed: it was dropped and its producer runs again after p, before its next use.

With A_p the compute time before p, C_p the compute time from p's start to the end,
S bytes swapped and R recomputed (S + R = E_p):

    iteration >= max(A_p, F_p + lat + S / up) + max(C_p + recompute_time(R), lat + S / down + T_p)

because p cannot start before its predecessors have run nor before S bytes have left,
and the iteration cannot end before the rest of the compute (and the recomputes) has
run nor before S bytes have come back and the ops after them have run. Each term is
implied by the rules of docs/simulation.md:

- lat: the least latency of a copy that way, host or SSD (R17, R18: a transfer waits its
  latency before it moves a byte; a GPUDirect SSD copy pays the SSD's latency alone).
  Every copy crosses PCIe, so none moves faster than ``up`` or ``down`` (R17, R18), and
  all copies that way share that link, so S bytes take S / up of it at least.
- F_p: the earliest ideal end of the producer of a tensor live at p. An offload of a
  tensor that is not resident is invalid (R11), so no byte of one leaves before its
  producer has ended, and no op ends before its ideal end (the compute stream runs the
  ops one after another, R5, R6). A copy made in an earlier idle interval (dropped and
  prefetched again since) also left after its producer.
- T_p: the ideal compute from the latest last use of a tensor live at p to the end. A
  swapped byte comes back by a prefetch that ends before the op that next uses it starts
  (R6, R13), at or before that last use, and that op and every op after it still run.
- recompute_time(R): the least producer time that regenerates R bytes, taking the
  recomputable tensors idle at p cheapest per byte first and allowing fractions (a
  relaxation, so still a bound). A re-run regenerates only the tensor it is for (R15), so
  each tensor pays its producer's whole time. Recomputable: R15 makes a recompute invalid
  if the producer updates anything in place (a batch norm updates its running
  statistics) or if the tensor was updated in place after it was produced (an in-place
  ReLU); an update that ran before p has run before any recompute after p. Such tensors
  can only be swapped, so S is at least E_p less the recomputable idle bytes.

A data-parallel rank (R56-R58): its collectives run one at a time on the comm stream,
each at least its lone time (its ring steps' latency, then its wire bytes at the slowest
link it crosses, R57: sharing a link only slows it), and the iteration ends after the
last of them (R22), so it lasts at least their sum, whatever the plan (no plan removes,
splits or recomputes a collective, R15, R56).

(F_p and T_p are taken over every live tensor, those p touches too, which only
loosens them.) The bound is the maximum over ops of the minimum over S of that
expression, and never below the ideal time. The swap-only variant fixes R = 0.

Spills past host memory. On a machine with an SSD and host memory of H bytes, the S
swapped bytes are off the GPU at p in host memory or on the SSD, and host memory holds
at most H of them (R19), so at least (S - H)+ bytes are on the SSD at p: they crossed the
SSD route (its slowest link, ``ssd_w`` bytes per us, after its latency) after F_p and
before p, and cross it back (``ssd_r``) after p, before the ops of T_p:

    p starts >= F_p + lat_ssd + (S - H)+ / ssd_w,   the end >= p's start + lat_ssd + (S - H)+ / ssd_r + T_p

added to the two maxima above (each side is the larger of its terms). The expression
stays convex and piecewise linear in S.

Where weights and optimizer state may move too (planners that place them off the GPU),
an idle one at p that is used after p and is off the GPU at p comes back down after p
starts, before that use (no op runs on a tensor that is not resident, R13), so its
bytes W join S on the down link; it needs no copy out (it may start in host memory,
R20's ``initial``), so only S - W bytes cross the up link: the copies out end at
min(F_p + lat, A_p) + (S - W) / up at the earliest (the min keeps the expression convex
where S <= W), and the copies back end before the latest use of a weight, so T is the
smaller of T_p and the compute from there. One used no more after p is free to move
(it leaves the excess). They take no host memory in the argument (they may start on
the SSD).

Two ops (the two-op argument). For ops p before q, p's start is delayed by its copies
out, and the end by q's copies back; the ops from p to q run between the two, so

    iteration >= max(A_p, F_p + lat + S_p / up) + (A_q - A_p) + max(C_q + recompute_time(R_q), lat + S_q / down + T_q)

with S_p at least what p cannot recompute (its recomputes are left out: they only add)
and S_q chosen as for q alone. It adds the stalls of a forward that cannot send its
activations out fast enough and of a backward that cannot bring them back in time
(VGG-16 b1024 at 30%: 175 ms before o7, 142 ms after o87/1).

The bound holds for every plan that keeps the profile's op order; it ignores contention
between offloads of different ops.
What it still leaves out, each a relaxation: the memory a recompute needs while it runs
(the producer's inputs, R15's scratch), that a tensor moves whole, and that one plan must
serve every op at once (each op, or pair of ops, is argued alone).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from simulator.hardware import Hardware
from simulator.model.links import collective_us, link_speed, transfer_links
from simulator.model.recompute import recomputable_until
from simulator.model.splits import split_profile
from simulator.profile import Profile
from simulator.profile.order import in_order, order_violation

from .facts import fastest_time_us, least_workspace, op_start_us


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
    with_op: str | None = None   # the two-op argument: the earlier op, whose copies out delay ``op``

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
    best = max(profile.ideal_us, collectives_us(profile, hardware))   # R3's rounded ideal; a rank's comm stream
    if variants and any(op.variants for op in profile.ops):
        times = tuple(fastest_time_us(op) for op in profile.ops)
        starts = (0.0, *accumulate(times))
        spare = [op.workspace_bytes - least_workspace(op) for op in profile.ops]
        best = min(best, starts[-1])
    ideal = starts[-1]
    _, up = link_speed(hardware, "offload", "host")
    _, down = link_speed(hardware, "prefetch", "host")
    # the least latency of a copy each way, host or SSD (a direct SSD copy pays the SSD's alone, R18)
    tiers = ("host", "ssd") if hardware.ssd is not None else ("host",)
    out_latency = min(transfer_links(hardware, "offload", tier)[0] for tier in tiers)
    back_latency = min(transfer_links(hardware, "prefetch", tier)[0] for tier in tiers)
    spill = _Spill.of(hardware)
    tensors = profile.tensor_by_id
    persistent = profile.persistent_bytes
    last_use, used_after, persistent_tail = _persistent_uses(profile, starts) if moves_persistent else ({}, [], 0.0)
    where = None
    candidates = []
    first_end, tail = _copy_windows(profile, starts)
    for p, op in enumerate(profile.ops):
        excess = profile.resident_bytes[p] - spare[p] - budget_bytes
        if excess <= 0:
            continue
        touched = set(op.inputs) | set(op.outputs) | set(op.updates)
        touched_live = sum(tensors[t].bytes for t in touched if not tensors[t].persistent)
        # live non-persistent bytes p does not touch: the resident set less weights,
        # workspace and what p reads, writes or makes
        movable = profile.resident_bytes[p] - persistent - op.workspace_bytes - touched_live
        back_tail, returning = tail[p], 0
        if moves_persistent:
            # idle weights and optimizer state: those used after p come back down after p, the others are free
            returning = used_after[p] - sum(tensors[t].bytes for t in touched
                                            if tensors[t].persistent and last_use.get(t, -1) > p)
            idle = persistent - sum(tensors[t].bytes for t in touched if tensors[t].persistent)
            excess -= idle - returning
            movable += returning
            if returning:
                back_tail = min(back_tail, persistent_tail)
            if excess <= 0:
                continue
        if movable < excess:
            return Bound(float("inf"), op.id, recompute, moves_persistent, feasible=False)
        # the copies out start after the earliest producer of a tensor live at p has ended (weights need
        # none: they may start in host memory); the last copy back lands before the latest use of one,
        # and the ops from there run after it
        out_lag = first_end[p] + out_latency
        if returning:   # no copy out before p for its first ``returning`` bytes: S - W of them at least cross
            out_lag = min(out_lag, starts[p]) - returning / up
        lags = (out_lag, back_latency + back_tail)
        room = spill.at(first_end[p], back_tail).beside(returning)
        swap_only = _expression(starts[p], ideal - starts[p], excess, 0.0, *lags, up, down, room)
        candidates.append(_Candidate(swap_only, p, excess, touched, lags, room))
    candidates.sort(key=lambda c: -c.swap_only)
    lives = _Lifetimes(profile, times) if recompute and candidates else None
    for c in candidates:
        if c.swap_only <= best:
            break   # the recompute variant of this op and every later one is no larger
        value = c.swap_only
        if recompute:
            ratio, size = lives.idle_at(c.p, c.touched)
            if ideal + _recompute_all_us(ratio, size, c.excess) <= best:
                continue   # no larger than recomputing the whole excess (S = 0), which does not beat best
            value = _with_recompute(ratio, size, starts[c.p], ideal - starts[c.p], c.excess, *c.lags, up, down,
                                    c.room)
        if value > best:
            best, where = value, profile.ops[c.p].id
    two = _two_ops(candidates, starts, lives, up, down, best - ideal)
    earlier = None
    if two is not None and ideal + two[0] > best:
        best, earlier, where = ideal + two[0], profile.ops[two[1]].id, profile.ops[two[2]].id
    return Bound(best, where, recompute, moves_persistent, with_op=earlier)


def run_by(profile: Profile, plan) -> Profile:
    """The profile a plan runs, for its bound: in chunks where it splits ops (R54) and in
    its schedule's order (R21), since the argument reasons from op positions (a schedule
    that breaks R21 leaves the order as it is: that plan is invalid, and has no time)."""
    profile = split_profile(profile, plan.splits, plan.origin)
    if plan.schedule is None or order_violation(profile, plan.schedule) is not None:
        return profile
    return in_order(profile, plan.schedule)


def collectives_us(profile: Profile, hardware: Hardware) -> float:
    """A rank's collectives back to back, each at its lone time (R57): 0 for one GPU, or
    a machine without an interconnect (the simulator refuses that pair)."""
    if hardware.interconnect is None:
        return 0.0
    return sum(collective_us(hardware, op.collective.steps(), op.collective.wire_bytes(), op.collective.world)
               for op in profile.ops if op.collective is not None)


@dataclass(frozen=True)
class _Spill:
    """What the swapped bytes beyond host memory cost (the module docstring): host memory
    H, the SSD route's latency and slowest rate each way; None without an SSD."""
    host: float
    out_latency: float
    back_latency: float
    write: float
    read: float

    @staticmethod
    def of(hardware: Hardware):
        if hardware.ssd is None:
            return _NO_SPILL
        out_latency, write = link_speed(hardware, "offload", "ssd")
        back_latency, read = link_speed(hardware, "prefetch", "ssd")
        return _Spill(float(hardware.host.memory_bytes), out_latency, back_latency, write, read)

    def at(self, first_end: float, tail: float) -> "_Spill":
        """The spill terms at an op: lags counted from the iteration's start (after F_p)
        and to its end (before T_p)."""
        if self.host == float("inf"):
            return self
        return _Spill(self.host, first_end + self.out_latency, self.back_latency + tail, self.write, self.read)

    def beside(self, weights: float) -> "_Spill":
        """With ``weights`` bytes of weights and optimizer state among the swapped ones:
        they take no host memory (they may start on the SSD), so the spill begins later."""
        return self if not weights else _Spill(self.host + weights, self.out_latency, self.back_latency,
                                               self.write, self.read)

    def out_end(self, out_lag: float, swapped: float, up: float) -> float:
        """When ``swapped`` bytes can have left at the earliest: ``out_lag`` + S / up, and
        through the SSD route for the bytes past host memory (0 when nothing is swapped)."""
        if swapped <= 0:
            return 0.0
        end = out_lag + swapped / up
        return max(end, self.out_latency + (swapped - self.host) / self.write) if swapped > self.host else end

    def back_end(self, back_lag: float, swapped: float, down: float) -> float:
        """How long after p starts ``swapped`` bytes can be back at the earliest, the ops after
        the last of them included: ``back_lag`` + S / down, and the SSD route's side."""
        if swapped <= 0:
            return 0.0
        end = back_lag + swapped / down
        return max(end, self.back_latency + (swapped - self.host) / self.read) if swapped > self.host else end

    def without_out(self) -> "_Spill":
        """The same with the SSD's copies out never binding (the back side alone)."""
        return _Spill(self.host, -_FAR, self.back_latency, self.write, self.read)


_NO_SPILL = _Spill(float("inf"), 0.0, 0.0, 1.0, 1.0)


def _expression(before_us: float, rest_us: float, swapped: float, recompute_us: float,
                out_lag: float, back_lag: float, up: float, down: float, spill: _Spill = _NO_SPILL) -> float:
    """The bound's expression for S = ``swapped`` bytes: the copies out end ``out_lag`` +
    S / up after the iteration starts at the earliest, the copies back ``back_lag`` + S /
    down after p starts; the bytes past host memory cross the SSD route both ways too."""
    if swapped <= 0:
        return before_us + rest_us + recompute_us
    out = max(before_us, spill.out_end(out_lag, swapped, up))
    return out + max(rest_us + recompute_us, spill.back_end(back_lag, swapped, down))


def _copy_windows(profile: Profile, starts) -> tuple[list, list]:
    """For each op p, over the non-persistent tensors live at p (those p touches too,
    which only loosens both): the earliest ideal end of their producers (no copy out of
    one starts before it, R11: an offload needs its tensor resident) and the ideal compute
    from the latest of their last uses to the end (a tensor back by prefetch is back
    before its next use, at or before that op, R6, R13)."""
    n = len(profile.ops)
    earliest = [n] * (n + 1)    # earliest[p]: least producer position of a tensor last used at p or later
    latest = [-1] * (n + 1)     # latest[p]: greatest last use of a tensor made at p or earlier
    for t in profile.tensors:
        if t.persistent or t.bytes <= 0:
            continue
        first, last = profile.lifetime(t.id)
        earliest[last] = min(earliest[last], first)
        latest[first] = max(latest[first], last)
    for p in range(n - 1, -1, -1):
        earliest[p] = min(earliest[p], earliest[p + 1])
    for p in range(1, n):
        latest[p] = max(latest[p], latest[p - 1])
    ideal = starts[-1]
    first_end = [starts[min(earliest[p], p) + 1] if earliest[p] <= p else 0.0 for p in range(n)]
    tail = [ideal - starts[latest[p]] if latest[p] >= p else 0.0 for p in range(n)]
    return first_end, tail


@dataclass(frozen=True)
class _Candidate:
    """An op over the budget: its swap-only value, position, excess, the tensors it
    touches, the lags of its copies (out, back) and what spills past host memory cost."""
    swap_only: float
    p: int
    excess: float
    touched: set
    lags: tuple
    room: "_Spill"


def _persistent_uses(profile: Profile, starts) -> tuple[dict, list, float]:
    """The last use of each weight and optimizer state (``Profile.last_use``), the bytes of
    those used after each op (off the GPU there, they come back down after it), and the
    ideal compute from the latest such use to the end (a weight back by prefetch is back
    before that op at the latest)."""
    last = {t.id: profile.last_use[t.id] for t in profile.tensors
            if t.persistent and profile.last_use[t.id] is not None}
    n = len(profile.ops)
    at = [0] * n                 # at[i]: bytes of persistent tensors last used at op i
    for t, i in last.items():
        at[i] += profile.tensor_by_id[t].bytes
    after = list(accumulate(reversed(at[1:]), initial=0))[::-1]   # after[i]: last used after op i
    latest = max(last.values(), default=n - 1)
    return last, after, starts[-1] - starts[latest]


def _two_ops(candidates: list, starts, lives, up: float, down: float, floor: float):
    """The two-op argument (module docstring): the most by which the copies out before an op
    p and the copies back after a later op q delay the iteration together, as (stall, p, q);
    None when it cannot exceed ``floor`` (what the one-op argument already gives)."""
    if len(candidates) < 2:
        return None
    ideal = starts[-1]
    by_position = sorted(candidates, key=lambda c: c.p)
    # upper bounds first: swap alone on each side (recomputing only lowers both)
    outs = [max(0.0, c.room.out_end(c.lags[0], c.excess, up) - starts[c.p]) for c in by_position]
    backs = [max(0.0, c.room.back_end(c.lags[1], c.excess, down) - (ideal - starts[c.p])) for c in by_position]
    ahead = list(accumulate(outs, max))
    if max((ahead[i - 1] + backs[i] for i in range(1, len(by_position))), default=0.0) <= floor:
        return None
    # the earliest copies out: p's own least bytes to swap (the excess less what may be recomputed)
    out_stall = []
    for c, bound_out in zip(by_position, outs):
        if bound_out <= 0 or lives is None:
            out_stall.append(bound_out)
            continue
        _, size = lives.idle_at(c.p, c.touched)
        least = max(0.0, c.excess - float(size.sum()))
        out_stall.append(max(0.0, c.room.out_end(c.lags[0], least, up) - starts[c.p]) if least > 0 else 0.0)
    best, found, lead, lead_at = floor, None, 0.0, None
    for i, c in enumerate(by_position):
        if lead_at is not None and lead + backs[i] > best:
            back = backs[i]
            if lives is not None:   # the least over S of the copies back against the compute and recomputes after q
                ratio, size = lives.idle_at(c.p, c.touched)
                back = _with_recompute(ratio, size, starts[c.p], ideal - starts[c.p], c.excess, -_FAR, c.lags[1],
                                       up, down, c.room.without_out()) - ideal
            if lead + back > best:
                best, found = lead + back, (lead + back, lead_at, c.p)
        if out_stall[i] > lead:
            lead, lead_at = out_stall[i], c.p
    return found


_FAR = 1e30   # a lag that never binds


class _Lifetimes:
    """The non-persistent tensors of a profile as arrays (first and last op position,
    bytes, the producer's time per byte, and the first op from which R15 forbids a
    recompute), to find the idle ones at an op that a plan may recompute at once."""

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
        self.until = np.array([recomputable_until(profile, kept[i].id) for i in order], dtype=np.int64)

    def idle_at(self, p: int, touched) -> tuple[np.ndarray, np.ndarray]:
        """(time per byte, bytes) of the tensors live at op p that p does not touch and
        that a plan may recompute after p (R15), cheapest per byte first (then the smaller
        first). The other idle tensors can be off the GPU at p only by a swap."""
        live = (self.first <= p) & (self.last >= p)
        for t in touched:
            k = self.index.get(t)
            if k is not None:
                live[k] = False
        may = live & (self.until > p)
        return self.ratio[may], self.size[may]


def _recompute_all_us(ratio: np.ndarray, size: np.ndarray, excess: int) -> float:
    """The recompute time of ``excess`` bytes taken cheapest per byte first from these
    idle tensors (the last one in part), infinite when they hold fewer: the expression at
    S = 0 is the ideal time plus this, an upper bound on its minimum that is quick to find."""
    sums = size.cumsum()
    if not len(sums) or sums[-1] < excess:
        return float("inf")
    j = int(sums.searchsorted(excess, side="left"))
    before = float(sums[j - 1]) if j else 0.0
    spent = float(np.dot(ratio[:j], size[:j])) if j else 0.0
    return spent + (excess - before) * float(ratio[j])


def _with_recompute(ratio: np.ndarray, size: np.ndarray, before_us: float, rest_us: float, excess: int,
                    out_lag: float, back_lag: float, up: float, down: float, spill: _Spill = _NO_SPILL) -> float:
    """The minimum over the bytes swapped S (the rest recomputed, from the recomputable
    idle tensors ``ratio`` per byte and ``size`` bytes, cheapest first) of the expression.
    S is at least what those tensors cannot cover (the other idle bytes can only be
    swapped). It is convex and piecewise linear in S, so the minimum lies at one of its
    breakpoints: the ends, where the copies out stop limiting the start of p, the ends of
    the recompute cost's pieces, and where on each piece the copies back meet the compute
    after p; with spills past host memory also H, where the SSD's terms cross the others,
    and where on each piece the SSD's copies back meet the compute after p."""
    total = int(size.sum()) if len(size) else 0
    least = max(0.0, float(excess - total))   # the bytes no recompute can take off
    # only the cheapest tensors that cover the excess can be recomputed (R <= excess): the pieces after
    # the one that reaches it hold no breakpoint in [0, excess]
    sums = size.cumsum()
    m = min(int(sums.searchsorted(excess, side="left")) + 1, len(ratio))
    ratio, size = ratio[:m], size[:m]
    cum_bytes = np.empty(m + 1, dtype=np.float64)
    cum_bytes[0] = 0.0
    cum_bytes[1:] = sums[:m]
    cum_time = np.empty(m + 1, dtype=np.float64)
    cum_time[0] = 0.0
    np.cumsum(ratio * size, out=cum_time[1:])
    head_bytes, head_time = cum_bytes[:-1], cum_time[:-1]
    # the pieces' ends: S = excess - cum_bytes[j], its recompute cost cum_time[j]
    ends = excess - cum_bytes
    # where on piece j the copies back meet the compute after p, if that lies on the piece
    meet = (rest_us + head_time + (excess - head_bytes) * ratio - back_lag) / (ratio + 1.0 / down)
    on = (meet >= ends[1:]) & (meet <= ends[:-1])
    meet_cost = head_time + (excess - meet - head_bytes) * ratio
    # the ends of the range and where the copies out stop limiting p's start, on whichever piece
    def cost_at(swapped: np.ndarray) -> np.ndarray:
        """The recompute time of the rest at these S, on whichever piece each falls."""
        if not m:
            return np.zeros_like(swapped)   # nothing recomputable: S = excess is the only way
        redo = np.minimum(excess - swapped, cum_bytes[-1])
        i = np.minimum(np.maximum(cum_bytes.searchsorted(redo, side="left"), 1), m)
        return cum_time[i - 1] + (redo - cum_bytes[i - 1]) * ratio[i - 1]

    fixed = np.array((0.0, least, float(excess), (before_us - out_lag) * up))
    fixed_cost = cost_at(fixed)
    points = np.concatenate((ends, meet[on], fixed))
    recompute_us = np.concatenate((cum_time, meet_cost[on], fixed_cost))
    if excess > spill.host:   # bytes past host memory cross the SSD route too: its kinks and meets
        host, w, r = spill.host, spill.write, spill.read
        turns = np.array((host, (before_us - spill.out_latency) * w + host,
                          _cross(out_lag, up, spill.out_latency - host / w, w),
                          _cross(back_lag, down, spill.back_latency - host / r, r)))
        turn_cost = cost_at(turns)
        meet_ssd = ((rest_us + head_time + (excess - head_bytes) * ratio - spill.back_latency + host / r)
                    / (ratio + 1.0 / r))
        on_ssd = (meet_ssd >= ends[1:]) & (meet_ssd <= ends[:-1])
        points = np.concatenate((points, turns, meet_ssd[on_ssd]))
        recompute_us = np.concatenate((recompute_us, turn_cost,
                                       (head_time + (excess - meet_ssd - head_bytes) * ratio)[on_ssd]))
    keep = (points >= least) & (points <= excess)
    points, recompute_us = points[keep], recompute_us[keep]
    swapped = points > 0
    out = np.where(swapped, np.maximum(before_us, out_lag + points / up), before_us)
    back = np.where(swapped, back_lag + points / down, 0.0)
    if excess > spill.host:
        past = np.maximum(points - spill.host, 0.0)
        spilled = past > 0
        out = np.where(spilled, np.maximum(out, spill.out_latency + past / spill.write), out)
        back = np.where(spilled, np.maximum(back, spill.back_latency + past / spill.read), back)
    return float(np.min(out + np.maximum(rest_us + recompute_us, back)))


def _cross(lag_a: float, rate_a: float, lag_b: float, rate_b: float) -> float:
    """The S at which lag_a + S / rate_a = lag_b + S / rate_b (nan when parallel)."""
    slope = 1.0 / rate_a - 1.0 / rate_b
    return (lag_b - lag_a) / slope if slope != 0 else float("nan")


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
