"""The interval MILP every ILP planner here shares: one choice per idle interval of a
tensor (keep it, or move it to a tier and back), with its release and its prefetch
chosen within a window of ops, memory counted at every op over the budget, and the
copies placed as continuous amounts of link time in the steps between.

Ops run in the profile's default order on the ideal timeline; step i is op i's run.
For an idle interval of tensor x (last touched by op a, next by op b) moved to tier k:

- ``Y[r]`` (binary, non-decreasing in r): x is off the GPU from op r on, r in
  [a+2, a+1+W]: its offload, issued when a ends, ran in the steps a+1 .. r-1.
- ``Z[f]`` (binary, non-decreasing in f): its prefetch has been issued after op f,
  f in [b-1-W, b-2]: x is on the GPU again from op f+1 (memory is taken at issue, R12
  takes it at the copy's start: the model never has less in memory than the plan), and
  the copy runs in the steps f+1 .. b-1. ``Y`` at its last r equals ``Z`` at its last f
  (the interval is moved or not), and Z[j] <= Y[j] (x leaves before it is fetched).
- ``u[i]``, ``v[i]`` (continuous, in us of the copy's own stream time: latency + bytes /
  the route's rate): how much of the offload runs in step i (only before release:
  u[i] <= D_out (1 - Y[i])), and of the prefetch (only after issue: v[i] <= D_in Z[i-1]);
  they sum to D_out Y[last], D_in Z[last].
- Memory at op i over the budget: resident[i] - sum over intervals of bytes x (Y[i] -
  Z[i-1]) <= budget.
- Step time ``T[i]`` >= the op's time, >= the stream time each copy stream spends in
  step i, and >= the link time of each link (an SSD copy uses the PCIe link for its
  bytes / PCIe bandwidth, R17). The objective is the sum of the step times: a step
  longer than its op is time the simulator spends waiting for data or for memory.

``Formulation`` builds it (planner/core/highs.py solves it); ``decode`` reads the
chosen intervals back.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from simulator.model.links import link_speed, transfer_links
from simulator.model.recompute import recompute_problem
from simulator.profile import Profile

from ...core.analysis import idle_gaps, op_start_us, touches
from ...core.highs import Model
from .positions import chunks, early_fetches, late_releases, windows

MS = 1e-3     # the model's time unit is the millisecond (coefficients near 1); memory rows
              # are in units of the largest excess over the budget
SMALL = 1e-3   # tensors under this share of the largest excess over the budget are not candidates


def least_bytes(resident: np.ndarray, budget: int, min_bytes: int = 1, share: float = SMALL) -> int:
    """The smallest tensor worth a candidate: ``share`` of the largest excess over the
    budget (``min_bytes`` when nothing is over it), at least ``min_bytes`` and 1."""
    if resident.max() <= budget:
        return max(1, min_bytes)
    return max(1, min_bytes, int((resident.max() - budget) * share))


@dataclass(frozen=True)
class Candidate:
    """An idle interval of ``tensor`` (after op ``after``, before op ``before``) that
    may move to ``tier``, with the ops its release and its prefetch may happen at."""
    tensor: str
    nbytes: int
    after: int
    before: int
    tier: str
    release: tuple   # r: off the GPU from op r (increasing; between two, as from the earlier)
    fetch: tuple     # f: prefetch issued after op f (increasing)
    out_us: float    # the offload's stream time (latency + bytes / rate)
    in_us: float
    wraps: bool = False   # across the iteration's end: a persistent tensor that starts the iteration in
                          # ``tier`` (fetched before op ``before``, its first touch) and is written back
                          # after op ``after`` (its last); off the GPU from the start, ``release`` = (n,)
    coarse: bool = False  # copies between positions far apart in pieces of 1, 1, 2, 4, ... steps, not one each
                          # (``reach`` and ``far`` positions: ``positions.chunks``)
    issued: int = -1      # the op its offload may be issued after at the earliest (``earliest_issue``; -1: after)
    waits: tuple = ()     # release positions r where op r may wait for the offload to end (``out_pieces``)

    def off(self, release: int, fetch: int) -> range:
        """The ops the tensor is off the GPU for, released at ``release`` and fetched
        after ``fetch``."""
        return range(0 if self.wraps else release, fetch + 1)

    @property
    def span(self) -> range:
        """The ops the tensor may be off the GPU for."""
        return self.off(self.release[0], self.fetch[-1])

    @property
    def out_steps(self) -> range:
        return range(self.after + 1, self.release[-1])

    @property
    def in_steps(self) -> range:
        return range(self.fetch[0] + 1, self.before)

    @cached_property   # built once: the model reads it in every row family
    def out_pieces(self) -> tuple[tuple[int, int, int], ...]:
        """Where the offload may run, one column each: (start, stop, s): steps start ..
        stop-1, before release position s (released there or earlier, none of the copy
        runs in them: s = 0 before the first position), from the step after ``issued``
        (R11: the ops up to the last use read the tensor while it is copied out). One
        step each, or, ``coarse``, a longer stretch in pieces of 1, 1, 2, 4, ... steps
        from its start (``chunks``; a FIFO stream starts a copy as soon as it can), each
        spread over its ops in proportion to their times (``Formulation._spread``). Last,
        a piece in step r for each release position r in ``waits`` (``wait_pieces``): op
        r waits for it before it starts, as the simulator lets an op wait for memory an
        offload frees when it ends (R11)."""
        edges = ((self.after if self.issued < 0 else self.issued) + 1,) + tuple(self.release)
        return tuple((p, q, s) for s in range(len(self.release))
                     for p, q in chunks(edges[s], edges[s + 1], early=True, coarse=self.coarse)) \
            + tuple((r, r + 1, s) for s, r in enumerate(self.release) if r in self.waits)

    @cached_property
    def wait_pieces(self) -> range:
        """The indexes in ``out_pieces`` of the pieces ops wait for (the last ones)."""
        n = len(self.out_pieces)
        return range(n - sum(r in self.waits for r in self.release), n)

    @cached_property
    def in_pieces(self) -> tuple[tuple[int, int, int], ...]:
        """Where the prefetch may run: (start, stop, s), after fetch position s (issued
        there or earlier); one step each, or, ``coarse``, a longer stretch in pieces of
        1, 1, 2, 4, ... steps from its end (the next use)."""
        edges = tuple(f + 1 for f in self.fetch) + (self.before,)
        sync = ((self.before, self.before + 1, len(self.fetch) - 1),) if self.synchronous else ()
        return tuple((p, q, s) for s in range(len(self.fetch))
                     for p, q in chunks(edges[s], edges[s + 1], early=False, coarse=self.coarse)) + sync

    @property
    def synchronous(self) -> bool:
        """Whether the last fetch position is the op before the next use (``candidates(sync=True)``):
        the prefetch then runs while the use waits for it (its piece, the last, in step ``before``)."""
        return bool(self.fetch) and self.fetch[-1] == self.before - 1 and not self.wraps


def candidates(profile: Profile, hardware, budget: int, window: int, tiers: tuple[str, ...],
               min_bytes: int = 1, reach: bool = False, far: int = 0, only=None,
               sync: bool = False) -> list[Candidate]:
    """Every idle interval, per allowed tier, that could take its tensor off the GPU
    during an op over the budget (at least 4 ops apart: one step to write it out, one
    op away, one step to read it back), of a tensor at least ``SMALL`` of the largest
    excess over the budget (smaller ones cost binaries and free next to nothing). A tier
    other than host only where the interval is longer than its two copies: elsewhere a
    host move is faster (host capacity is the simulator's to check, R19). ``reach``: the
    release and fetch positions reach past the window to the interval's ops over the
    budget (``windows``). ``only``: these tensors alone, whatever their size (a given
    plan's moves). ``sync``: a last fetch position at the op before the next use (R10: the
    use waits for the copy), where the model without it cannot hold the budget."""
    resident = np.asarray(profile.resident_bytes, dtype=np.int64)
    min_bytes = least_bytes(resident, budget, min_bytes) if only is None else 1
    over = np.concatenate(([0], np.cumsum(resident > budget)))
    over_at = np.flatnonzero(resident > budget).tolist()
    starts = op_start_us(profile)
    speeds = {(d, t): link_speed(hardware, d, t) for d in ("offload", "prefetch") for t in tiers}
    found = []
    for tensor in profile.tensors:
        if tensor.bytes < min_bytes or (only is not None and tensor.id not in only):
            continue
        gaps = idle_gaps(profile, tensor.id, starts)
        for g, gap in enumerate(gaps):
            a, b = gap.after, gap.before
            if b - a < 4 or over[b - 1] - over[a + 2] == 0:
                continue
            issued = earliest_issue(profile, tensor.id, a, gaps[g - 1].before if g else -1)
            inside = over_at[bisect_left(over_at, a + 2):bisect_right(over_at, b - 2)] if reach or far else None
            release, fetch = windows(a, b, window, inside) if reach else windows(a, b, window)
            if far:
                release, fetch = release + late_releases(release[-1], inside, fetch, far), \
                    early_fetches(release[0], inside, fetch, far) + fetch
            if sync and not reach:
                fetch = fetch + (b - 1,)
            for tier in tiers:
                (lat_out, rate_out), (lat_in, rate_in) = speeds["offload", tier], speeds["prefetch", tier]
                out_us, in_us = lat_out + tensor.bytes / rate_out, lat_in + tensor.bytes / rate_in
                if tier != "host" and starts[b] - starts[a + 1] < out_us + in_us:
                    continue   # a slower tier only where its copies could hide: else host is faster
                found.append(Candidate(tensor.id, tensor.bytes, a, b, tier, release, fetch, out_us, in_us,
                                       coarse=reach or far > 0, issued=issued))
    return found


def earliest_issue(profile: Profile, tid: str, after: int, back: int) -> int:
    """The earliest op an offload of the tensor's idle interval after op ``after`` may be
    issued after, as ``common.offload_points`` lowers it: its last write up to ``after``
    (its producer or an in-place update; none: its first touch), or ``back``, the end
    of its idle interval before (where a move of it may have brought it back),
    whichever is later."""
    ops = profile.ops
    points = [p for p in touches(profile, tid) if p <= after]
    written = [p for p in points if tid in ops[p].outputs or tid in ops[p].updates]
    return max(written[-1] if written else points[0], back)


def moves_by_tensor(cands: list[Candidate]) -> dict[tuple[str, str], list[int]]:
    """The indexes of the candidates (not the wrap ones) per (tensor, tier), in order."""
    found: dict[tuple[str, str], list[int]] = {}
    for k, c in enumerate(cands):
        if not c.wraps:
            found.setdefault((c.tensor, c.tier), []).append(k)
    return found


def moved_interval(cands: list[Candidate], by_tensor: dict[tuple[str, str], list[int]], tensor: str, tier: str,
                   issued: int, due: int) -> int | None:
    """The candidate a plan's offload of ``tensor`` to ``tier``, issued after op ``issued``,
    and its prefetch due at op ``due`` move: the interval ending at ``due`` (wherever before
    it the offload was issued: LMS issues it after the producer, R11), else, for a
    prefetch due early at a recompute that reads the tensor inside an interval
    (``retarget``), that interval; None when the model has neither (``by_tensor``:
    ``moves_by_tensor(cands)``)."""
    mine = by_tensor.get((tensor, tier), ())
    k = next((j for j in mine if issued < cands[j].before == due), None)
    if k is None:
        k = next((j for j in mine if cands[j].after < due < cands[j].before and issued < due), None)
    return k


def slower_tiers_dominated(hardware, cands: list[Candidate]) -> bool:
    """Whether no candidate needs a tier past host memory: host memory holds every
    candidate tensor at once (R19 counts a tensor's host copy once, from its first
    offload until it dies), and a host copy is no slower than one to the SSD and crosses
    no link the SSD copy does not (R17, R18: the SSD route is PCIe and the SSD). Then an
    SSD move is never better than the same move to host, and the SSD's candidates only
    make the model larger."""
    host_bytes = sum({c.tensor: c.nbytes for c in cands}.values())
    if host_bytes > hardware.host.memory_bytes:
        return False
    links = lambda kind, tier: {name for name, _ in transfer_links(hardware, kind, tier)[1]}   # noqa: E731
    for kind in ("offload", "prefetch"):
        host_lat, host_rate = link_speed(hardware, kind, "host")
        for tier in {c.tier for c in cands} - {"host"}:
            lat, rate = link_speed(hardware, kind, tier)
            if host_lat > lat or host_rate < rate or not links(kind, "host") <= links(kind, tier):
                return False
    return True


WRAP_SMALL = 0.1   # of SMALL: one wrap candidate per tensor costs a binary and its fetch window, no more
                   # (on GPT-2 at 50% g10 starts 297 weights and optimizer states in host, most under SMALL)


def wrap_candidates(profile: Profile, hardware, budget: int, window: int, far: int = 0) -> list[Candidate]:
    """Every persistent tensor (of at least ``WRAP_SMALL`` x ``SMALL`` of the largest
    excess over the budget) that could start the iteration in host memory, off the GPU from op 0 until
    a prefetch before its first touch, written back after its last (R20: the copy there
    must be valid when the iteration ends), where an op over the budget comes before its
    first touch: AutoTM's choice of where weights live across iterations. Its fetch
    positions are the window before the first touch (and ``far`` earlier ones, as
    ``candidates``); the write-back runs in the steps after the last touch."""
    resident = np.asarray(profile.resident_bytes, dtype=np.int64)
    if resident.max() <= budget:
        return []
    n = len(profile.ops)
    min_bytes = least_bytes(resident, budget, share=SMALL * WRAP_SMALL)
    over_at = np.flatnonzero(resident > budget).tolist()
    (lat_out, rate_out), (lat_in, rate_in) = (link_speed(hardware, d, "host") for d in ("offload", "prefetch"))
    found = []
    for tensor in profile.tensors:
        if not tensor.persistent or tensor.bytes < min_bytes:
            continue
        points = touches(profile, tensor.id)
        if not points:
            continue
        first, last = points[0], points[-1]
        if first < 2 or last >= n - 1 or not over_at or over_at[0] > first - 2:
            continue
        fetch = tuple(range(max(0, first - 1 - window), first - 1))
        if far:
            fetch = early_fetches(0, over_at, fetch, far) + fetch
        found.append(Candidate(tensor.id, tensor.bytes, last, first, "host", (n,), fetch,
                               lat_out + tensor.bytes / rate_out, lat_in + tensor.bytes / rate_in, wraps=True,
                               coarse=far > 0))
    return found


@dataclass(frozen=True)
class Recompute:
    """An idle interval of ``tensor`` (after op ``after``, before op ``before``) that may
    be dropped after ``after`` and recomputed just before ``before`` (R14, R15), at the
    cost of its producer's time; ``sources`` are its producer's inputs, which must be on
    the GPU at ``before`` (the non-persistent ones are alive then; persistent ones may be
    moved by the plan, which the model then forbids around ``before``)."""
    tensor: str
    nbytes: int
    after: int
    before: int
    cost_us: float
    sources: tuple[str, ...]


def recomputes(profile: Profile, budget: int, min_bytes: int = 1) -> list[Recompute]:
    """Every idle interval over an op over the budget whose tensor R15 lets the plan
    recompute from sources still alive at its next use: its producer updates nothing
    in place, nothing updates it, and each non-persistent source lives until then and
    is not updated after the producer read it."""
    resident = np.asarray(profile.resident_bytes, dtype=np.int64)
    min_bytes = least_bytes(resident, budget, min_bytes)
    over = np.concatenate(([0], np.cumsum(resident > budget)))
    tensors = profile.tensor_by_id
    found = []
    for tensor in profile.tensors:
        made_by = profile.producer[tensor.id]
        if tensor.persistent or tensor.bytes < min_bytes or made_by is None:
            continue
        if recompute_problem(profile, tensor.id) is not None:   # R15
            continue
        producer = profile.ops[made_by]
        sources = tuple(dict.fromkeys(producer.inputs))
        transient = [t for t in sources if not tensors[t].persistent]
        for gap in idle_gaps(profile, tensor.id):
            a, b = gap.after, gap.before
            if over[b] - over[a + 1] == 0:
                continue
            if any(profile.last_use[t] is None or profile.last_use[t] < b
                   or any(made_by < u <= b for u in profile.updaters[t]) for t in transient):
                continue
            found.append(Recompute(tensor.id, tensor.bytes, a, b, producer.time_us, sources))
    return found


def link_shares(hardware, tier: str, direction: str) -> tuple[dict[str, float], bool]:
    """The links a copy to or from ``tier`` crosses, as link -> bandwidth in bytes/us, and
    whether it holds the one copy engine: the simulator's route (R17, R18,
    ``transfer_links``). A candidate's link time per us of its stream time is bytes / link
    bandwidth over latency + bytes / rate, taken at its bytes."""
    _, links, uses_engine = transfer_links(hardware, direction, tier)
    return dict(links), uses_engine


@dataclass
class Columns:
    """Where one candidate's variables start in the model."""
    Y: int
    Z: int
    u: int
    v: int


def _y_column(c: Candidate, col: Columns, i: int) -> int | None:
    """Column of ``c``'s Y at op i: of the last release position at or before i; None
    before its first (a wrap candidate's one column at every op: it is off the GPU from
    before the iteration)."""
    if c.wraps:
        return col.Y
    at = bisect_right(c.release, i) - 1
    return None if at < 0 else col.Y + at


class Formulation:
    """The MILP for a profile, machine and budget over ``cands``; ``one_offload_at_a_time``
    adds TMOF's token (no two offloads in flight in any step)."""

    def __init__(self, profile: Profile, hardware, budget: int, cands: list[Candidate],
                 one_offload_at_a_time: bool = False, redo: list[Recompute] = (), reach: bool = False):
        self.profile, self.hardware, self.budget, self.cands = profile, hardware, budget, cands
        self.redo = list(redo)
        self.reach = reach   # candidates from ``candidates(reach=True)``: running-sum copy rows, FIFO offloads
        n = len(profile.ops)
        self.n = n
        self.times = np.array([op.time_us for op in profile.ops], dtype=float)
        model = self.model = Model()
        self.T = model.add_vars(n, cost=1.0)
        for i in range(n):
            model.lower[self.T + i] = self.times[i] * MS
        self.cols: list[Columns] = []
        for c in cands:
            Y = model.add_vars(len(c.release), upper=1.0, integer=True)
            Z = model.add_vars(len(c.fetch), upper=1.0, integer=True)
            u = model.add_vars(len(c.out_pieces), upper=c.out_us * MS)
            v = model.add_vars(len(c.in_pieces), upper=c.in_us * MS)
            self.cols.append(Columns(Y, Z, u, v))
            self._interval_rows(c, Columns(Y, Z, u, v))
        self.Q = model.add_vars(len(self.redo), upper=1.0, integer=True)   # recompute interval k
        self._exclusive_tiers()
        self._recompute_rows()
        self._memory_rows()
        self._step_rows()
        if one_offload_at_a_time:
            self._token_rows()
        if reach:
            self._fifo_rows()

    # -- one candidate

    def Y(self, k: int, i: int) -> int | None:
        """Column of Y at op i: of the last release position at or before i (the last one
        past the window), None before the window."""
        return _y_column(self.cands[k], self.cols[k], i)

    def Z(self, k: int, j: int) -> int | None:
        c, col = self.cands[k], self.cols[k]
        at = bisect_right(c.fetch, j) - 1
        return None if at < 0 else col.Z + at

    def _interval_rows(self, c: Candidate, col: Columns) -> None:
        m = self.model
        for k in range(1, len(c.release)):
            m.add_row([col.Y + k, col.Y + k - 1], [1.0, -1.0], lower=0.0)
        for k in range(1, len(c.fetch)):
            m.add_row([col.Z + k, col.Z + k - 1], [1.0, -1.0], lower=0.0)
        last_y, last_z = col.Y + len(c.release) - 1, col.Z + len(c.fetch) - 1
        m.add_row([last_y, last_z], [1.0, -1.0], 0.0, 0.0)
        for s, f in enumerate(c.fetch):                      # fetched only after it left
            if f >= c.release[-1]:
                break
            y = _y_column(c, col, f)
            m.add_row([col.Z + s] + ([y] if y is not None else []),
                      [1.0] + ([-1.0] if y is not None else []), upper=0.0)
        d_out, d_in = c.out_us * MS, c.in_us * MS
        if not self.reach:   # the paper's window: piece by piece (each one step)
            for j, (first, _, t) in enumerate(c.out_pieces):   # offload runs only before release
                if t > 0:
                    m.add_row([col.u + j, col.Y + t - 1], [1.0, d_out], upper=d_out)
            for j, (_, _, t) in enumerate(c.in_pieces):        # prefetch runs only after issue
                m.add_row([col.v + j, col.Z + t], [1.0, -d_in], upper=0.0)
        else:
            # As running sums: the copy before release position s is at least D_out Y[s],
            # the prefetch up to the pieces after fetch position s at most D_in Z[s] (with
            # integral Y and Z the same as piece by piece; the LP relaxation can then not
            # release a fraction it has not copied, which on GPT-2 at 50% lifts its bound
            # from the ideal time to within 1.5% of the MILP's solutions).
            done = []
            for s in range(len(c.release)):
                done += [col.u + j for j, (_, _, t) in enumerate(c.out_pieces) if t == s]
                m.add_row(done + [col.Y + s], [1.0] * len(done) + [-d_out], lower=0.0)
            run = []
            for s in range(len(c.fetch)):
                run += [col.v + j for j, (_, _, t) in enumerate(c.in_pieces) if t == s]
                m.add_row(run + [col.Z + s], [1.0] * len(run) + [-d_in], upper=0.0)
        m.add_row(list(range(col.u, col.u + len(c.out_pieces))) + [last_y],
                  [1.0] * len(c.out_pieces) + [-d_out], 0.0, 0.0)
        m.add_row(list(range(col.v, col.v + len(c.in_pieces))) + [last_z],
                  [1.0] * len(c.in_pieces) + [-d_in], 0.0, 0.0)

    def _exclusive_tiers(self) -> None:
        """An interval moves to one tier at most."""
        by_interval: dict[tuple, list[int]] = {}
        for k, c in enumerate(self.cands):
            by_interval.setdefault((c.tensor, c.after), []).append(self.Y(k, c.release[-1]))
        for k, r in enumerate(self.redo):
            by_interval.setdefault((r.tensor, r.after), []).append(self.Q + k)
        for cols in by_interval.values():
            if len(cols) > 1:
                self.model.add_row(cols, [1.0] * len(cols), upper=1.0)

    def _recompute_rows(self) -> None:
        """A recompute before op b reads its sources there. A source moved in an interval
        around b cannot be read (R13): the two exclude each other. A source dropped for a
        recompute across b is regenerated at b first, a chain (``W[b, s]``, continuous,
        >= need + Q - 1, costs the producer's time, and holds s's bytes through op b,
        after which it is dropped again), and its own sources are needed at b in turn."""
        moved: dict[str, list[int]] = {}
        for k, c in enumerate(self.cands):
            moved.setdefault(c.tensor, []).append(k)
        dropped: dict[str, list[int]] = {}
        for k, r in enumerate(self.redo):
            dropped.setdefault(r.tensor, []).append(k)
        model = self.model
        self.chains: dict[tuple[int, str], int] = {}   # (op, tensor) -> column of W
        work = [(r.before, self.Q + k, r.sources) for k, r in enumerate(self.redo)]
        while work:
            at, need, sources = work.pop()
            for src in sources:
                for j in moved.get(src, ()):
                    c = self.cands[j]
                    if c.after < at < c.before:
                        self._read_in_moved_interval(j, at, need)
                for j in dropped.get(src, ()):
                    r = self.redo[j]
                    if not r.after < at < r.before:
                        continue
                    w = self.chains.get((at, src))
                    if w is None:
                        w = self.chains[at, src] = model.add_vars(1, upper=1.0)
                        work.append((at, w, r.sources))
                    model.add_row([w, need, self.Q + j], [1.0, -1.0, -1.0], lower=-1.0)

    def _read_in_moved_interval(self, j: int, at: int, need: int) -> None:
        """A recompute (column ``need``) reads candidate j's tensor before op ``at``, inside
        its interval: the tensor is still on the GPU (not yet released, ``Y[at] = 0``) or
        back (its prefetch issued by op at-1, ``Z[at-1] = 1``, and none of it copied in
        step ``at`` or later: the plan's prefetch is then due at ``at``)."""
        c, col, model = self.cands[j], self.cols[j], self.model
        y = self.Y(j, at)
        if y is None:
            return                    # released no earlier than op at: still on the GPU
        z = self.Z(j, at - 1)
        if z is None:
            model.add_row([need, y], [1.0, 1.0], upper=1.0)
            return
        model.add_row([need, y, z], [1.0, 1.0, -1.0], upper=1.0)
        d_in = c.in_us * MS
        for s, (_, stop, _) in enumerate(c.in_pieces):
            if stop > at:   # a piece with a step at or after op at
                model.add_row([col.v + s, need, y], [1.0, d_in, d_in], upper=2 * d_in)

    def _memory_rows(self) -> None:
        resident = self.profile.resident_bytes
        spanning: dict[int, list[int]] = {}
        for k, c in enumerate(self.cands):
            for i in c.span:
                if resident[i] > self.budget:
                    spanning.setdefault(i, []).append(k)
        for k, r in enumerate(self.redo):
            for i in range(r.after + 1, r.before):
                if resident[i] > self.budget:
                    spanning.setdefault(i, []).append(-1 - k)   # negative: a recompute
        held: dict[int, list[tuple[int, int]]] = {}   # a chain source is on the GPU through its op
        for (at, tid), w in self.chains.items():
            held.setdefault(at, []).append((w, self.profile.tensor_by_id[tid].bytes))
        self.over_ops = sorted(i for i in range(self.n) if resident[i] > self.budget)
        unit = max([resident[i] - self.budget for i in self.over_ops], default=1)  # right-hand sides <= 1
        self.uncovered = [self.profile.ops[i].id for i in self.over_ops if i not in spanning]
        for i in self.over_ops:
            index, value = [], []
            for k in spanning.get(i, ()):
                if k < 0:   # dropped from the op after its last use up to its recompute
                    index.append(self.Q - 1 - k)
                    value.append(self.redo[-1 - k].nbytes / unit)
                    continue
                share = self.cands[k].nbytes / unit
                index.append(self.Y(k, i))
                value.append(share)
                z = self.Z(k, i - 1)
                if z is not None:
                    index.append(z)
                    value.append(-share)
            for w, nbytes in held.get(i, ()):
                index.append(w)
                value.append(-nbytes / unit)
            self.model.add_row(index, value, lower=(resident[i] - self.budget) / unit)

    def _step_rows(self) -> None:
        """T[i] >= every copy stream's time in step i (R17: one copy at a time per stream;
        on a half-duplex machine one stream for both directions), and, when SSD copies
        share PCIe with host copies, >= each link's time (bytes / bandwidth)."""
        hw = self.hardware
        half = hw.pcie.duplex == "half"
        with_links = any(c.tier == "ssd" for c in self.cands)
        loads: dict[tuple[int, str], tuple[list[int], list[float]]] = {}
        for c, col in zip(self.cands, self.cols):
            for direction, pieces, first, us in (("offload", c.out_pieces, col.u, c.out_us),
                                                  ("prefetch", c.in_pieces, col.v, c.in_us)):
                if c.tier == "host":
                    stream = "copy" if half else "d2h" if direction == "offload" else "h2d"
                else:
                    stream = "ssd_write" if direction == "offload" else "ssd_read"
                uses = {stream: 1.0}
                links, uses_engine = link_shares(hw, c.tier, direction)
                if uses_engine:
                    uses["copy"] = 1.0     # a half-duplex machine's one copy engine, held whole
                if with_links:
                    uses.update({link: (c.nbytes / bw) / us for link, bw in links.items()})
                for s, (start, stop, _) in enumerate(pieces):
                    for i, part in self._spread(start, stop):
                        for what, share in uses.items():
                            index, value = loads.setdefault((i, what), ([], []))
                            index.append(first + s)
                            value.append(-share * part)
        for (i, _), (index, value) in sorted(loads.items()):
            self.model.add_row([self.T + i] + index, [1.0] + value, lower=0.0)
        self.step_loads = loads
        by_op: dict[int, tuple[list[int], list[float]]] = {}
        for k, r in enumerate(self.redo):
            index, value = by_op.setdefault(r.before, ([], []))
            index.append(self.Q + k)
            value.append(-r.cost_us * MS)
        for c, col in zip(self.cands, self.cols):   # a synchronous prefetch: its use waits for it
            if c.synchronous:
                index, value = by_op.setdefault(c.before, ([], []))
                index.append(col.v + len(c.in_pieces) - 1)
                value.append(-1.0)
            for j in c.wait_pieces:                   # an op waits for an offload to end (its memory)
                index, value = by_op.setdefault(c.out_pieces[j][0], ([], []))
                index.append(col.u + j)
                value.append(-1.0)
        ops = self.profile.ops
        for (at, tid), w in self.chains.items():
            index, value = by_op.setdefault(at, ([], []))
            index.append(w)
            value.append(-ops[self.profile.producer[tid]].time_us * MS)
        for i, (index, value) in sorted(by_op.items()):   # the op waits for the recomputes before it (R5)
            self.model.add_row([self.T + i] + index, [1.0] + value, lower=self.times[i] * MS)

    def _fifo_rows(self) -> None:
        """The offload streams run their copies in issue order (R17's FIFO streams): a
        copy issued after op a ends no earlier than the stream's backlog then allows. A
        fluid queue per offload stream: ``B[i]`` (continuous, ms) >= B[i-1] + the copies
        issued after op i - T[i], >= 0 (at least the work still queued when op i ends),
        and ``S[i]`` the start of op i (the sum of the steps before it). Released at
        position r, an interval's offload has ended: S[r] - S[a+1] >= B[a] when Y[r] = 1
        (a big-M row; M the copies issued up to a). Without it the model could finish a
        copy issued late ahead of the queue, and fetch it back across a short interval,
        where the simulator waits for the queue."""
        m, n = self.model, self.n
        half = self.hardware.pcie.duplex == "half"
        self.S = m.add_vars(n + 1)
        m.upper[self.S] = 0.0
        for i in range(n):
            m.add_row([self.S + i + 1, self.S + i, self.T + i], [1.0, -1.0, -1.0], 0.0, 0.0)
        streams: dict[str, list[int]] = {}
        for k, c in enumerate(self.cands):
            stream = ("copy" if half else "d2h") if c.tier == "host" else "ssd_write"
            streams.setdefault(stream, []).append(k)
        self.backlog: dict[str, int] = {}
        for stream, ks in sorted(streams.items()):
            first = min(self.cands[k].after for k in ks)
            last = max(self.cands[k].release[-1] for k in ks)
            B = self.backlog[stream] = m.add_vars(n)
            issued: dict[int, list[int]] = {}
            for k in ks:
                issued.setdefault(self.cands[k].after, []).append(k)
            queued = 0.0
            bound_at = np.zeros(n)
            for i in range(first, min(last, n)):
                ks_i = issued.get(i, [])
                queued += sum(self.cands[k].out_us * MS for k in ks_i)
                bound_at[i] = queued
                index = [B + i, self.T + i] + ([B + i - 1] if i > first else [])
                value = [1.0, 1.0] + ([-1.0] if i > first else [])
                for k in ks_i:
                    index.append(self.Y(k, self.cands[k].release[-1]))
                    value.append(-self.cands[k].out_us * MS)
                m.add_row(index, value, lower=0.0)
            for k in ks:
                c, col = self.cands[k], self.cols[k]
                big = bound_at[c.after]
                for s_, r in enumerate(c.release):
                    m.add_row([self.S + r, self.S + c.after + 1, B + c.after, col.Y + s_],
                              [1.0, -1.0, -1.0, -big], lower=-big)

    def _spread(self, start: int, stop: int) -> list[tuple[int, float]]:
        """How a piece of copy over the steps start .. stop-1 falls on each: in proportion
        to the ops' times (evenly where they take none), as a stream that works through
        its queue at a steady share of its link while those ops run."""
        if stop - start == 1:
            return [(start, 1.0)]
        times = self.times[start:stop]
        total = float(times.sum())
        return [(start + j, float(t) / total if total > 0 else 1.0 / (stop - start)) for j, t in enumerate(times)]

    def extend(self, part: "Formulation", values: np.ndarray) -> np.ndarray:
        """A solution of ``part`` (a formulation over a subset of these candidates) as a
        solution of this one: the same moves, the others not taken."""
        x = np.zeros(self.model.num_cols)
        x[self.T:self.T + self.n] = values[part.T:part.T + part.n]
        where = {(c.tensor, c.after, c.tier): k for k, c in enumerate(self.cands)}
        for c, col in zip(part.cands, part.cols):
            mine = self.cols[where[c.tensor, c.after, c.tier]]
            for first, size, theirs in ((mine.Y, len(c.release), col.Y), (mine.Z, len(c.fetch), col.Z),
                                        (mine.u, len(c.out_pieces), col.u), (mine.v, len(c.in_pieces), col.v)):
                x[first:first + size] = values[theirs:theirs + size]
        self._stretch_steps(x)
        return x

    def _stretch_steps(self, x: np.ndarray) -> None:
        """Make each step in ``x`` as long as the copies ``x`` places in it need."""
        for (i, _), (index, value) in self.step_loads.items():
            x[self.T + i] = max(x[self.T + i], -float(np.dot(value, x[index])))

    def start(self) -> np.ndarray | None:
        """A feasible solution to start the solver from, or None: the largest tensors
        moved (host first), each released as early and fetched as late as its window
        allows, until every op fits; steps as long as their copies make them."""
        need = {i: self.profile.resident_bytes[i] - self.budget for i in self.over_ops}
        x = np.zeros(self.model.num_cols)
        taken: set[tuple] = set()
        order = sorted(range(len(self.cands)), key=lambda k: (self.cands[k].tier != "host", -self.cands[k].nbytes, k))
        for k in order:
            c, col = self.cands[k], self.cols[k]
            span = c.span
            if (c.tensor, c.after) in taken or not any(need.get(i, 0) > 0 for i in span):
                continue
            taken.add((c.tensor, c.after))
            for i in span:
                if i in need:
                    need[i] -= c.nbytes
            x[col.Y:col.Y + len(c.release)] = 1.0
            x[col.Z + len(c.fetch) - 1] = 1.0
            x[col.u] = c.out_us * MS                 # the whole copy in step a+1
            x[col.v + len(c.in_pieces) - 1] = c.in_us * MS   # and in step b-1
        if any(v > 0 for v in need.values()):
            return None
        x[self.T:self.T + self.n] = self.times * MS
        self._stretch_steps(x)
        return x

    def choices_of_plan(self, actions, timeline=None, initial=None,
                        copy_start: bool = False) -> tuple[dict[int, tuple[int, int]], set[int], int]:
        """A plan's moves and recomputes as this model's integer choices: candidate k ->
        (release, fetch) for each offload and prefetch pair whose interval and tier are a
        candidate's (the interval ending at the prefetch's ``before``, wherever before it
        the offload was issued: LMS issues it after the producer, R11), and the recompute
        candidates a drop before and a recompute after match. The release is the first
        position whose op started once the plan's offload had ended on ``timeline`` (the
        plan's simulated spans; without one, the first position), clipped so that the tensor leaves before it is fetched; the
        fetch is the last position at or before the prefetch's issue op (the first
        position when it was issued earlier; in the ``reach`` model or with ``copy_start``,
        at or before ``fetched_after`` the start of its copy on ``timeline``, as memory
        is taken then, R12). A tensor the plan starts in host memory (``initial``) whose first prefetch
        is due at its first touch is the wrap candidate's move (``wrap_candidates``),
        its write-back part of it. Also returns how many of the plan's offloads have no
        candidate here (moves of small tensors, intervals the model does not have)."""
        index = self.profile.op_index
        pos = lambda op: -1 if op is None else index[op]   # noqa: E731
        by_tensor = moves_by_tensor(self.cands)
        wrapping = {(c.tensor, c.before, c.tier): k for k, c in enumerate(self.cands) if c.wraps}
        redo_gaps: dict[str, list[tuple[int, int]]] = {}
        for r in self.redo:
            redo_gaps.setdefault(r.tensor, []).append((r.after, r.before))
        op_starts, op_ends, ended, began = copy_times(self.profile, timeline) if timeline is not None \
            else (None, None, {}, {})
        moved: dict[int, tuple[int, int]] = {}
        pending: dict[str, tuple[int, str, int]] = {}
        count: dict[str, int] = {}
        fetched: dict[str, int] = {}
        dropped: dict[str, list[int]] = {}   # every op a tensor is dropped after (a list's order is not time's:
        for act in actions:                   # ``to_actions`` puts the recomputes after every drop)
            if act.kind == "drop":
                dropped.setdefault(act.tensor, []).append(pos(act.after))
        redo = {(r.tensor, r.after, r.before): k for k, r in enumerate(self.redo)}
        recomputed: set[int] = set()
        taken: set[tuple[str, int]] = set()
        starts_in, wrapped = initial or {}, set()   # the plan's initial placements; tensors matched to a wrap
        unmatched = 0
        for act in actions:
            if act.kind == "offload":
                n = count.get(act.tensor, 0)
                count[act.tensor] = n + 1
                pending[act.tensor] = (pos(act.after), act.to, n)
            elif act.kind == "recompute":   # a chain's (due inside the interval) is the model's to add
                b = pos(act.before)
                for a, before in redo_gaps.get(act.tensor, ()):
                    if before == b and (act.tensor, a) not in taken \
                            and any(a <= at < b for at in dropped.get(act.tensor, ())):
                        recomputed.add(redo[act.tensor, a, b])
                        taken.add((act.tensor, a))
            elif act.kind == "prefetch":
                nth = fetched.get(act.tensor, 0)
                fetched[act.tensor] = nth + 1
                k = wrapping.get((act.tensor, pos(act.before), starts_in.get(act.tensor)))
                if act.tensor not in pending and nth == 0 and k is not None:   # in host since the start
                    c = self.cands[k]
                    moved[k] = (c.release[0], c.fetch[max(0, bisect_right(c.fetch, pos(act.after)) - 1)])
                    wrapped.add(act.tensor)
                    continue
                if act.tensor not in pending:
                    continue
                at, tier, n = pending.pop(act.tensor)
                f, b = pos(act.after), pos(act.before)
                copied = began.get((act.tensor, nth))
                if (self.reach or copy_start) and copied is not None and op_starts is not None:   # taken then (R12)
                    f = max(f, fetched_after(op_starts, op_ends, copied))
                k = moved_interval(self.cands, by_tensor, act.tensor, tier, at, b)
                if k is None or (act.tensor, self.cands[k].after) in taken:
                    unmatched += 1
                    continue
                c = self.cands[k]
                if b < c.before:   # due early, at a recompute: its copy done before op b (``_read_in_moved_interval``)
                    f = min(f, b - 2)
                fetch = c.fetch[max(0, bisect_right(c.fetch, f) - 1)]
                done = ended.get((act.tensor, n))
                if done is None or op_starts is None:
                    release = c.release[0]
                else:   # the first position whose op started once the copy had ended
                    release = next((r for r in c.release if op_starts[r] >= done), c.release[-1])
                if release > fetch:   # the tensor leaves before it is fetched
                    earlier = [r for r in c.release if r <= fetch]
                    if not earlier:
                        unmatched += 1
                        continue
                    release = earlier[-1]
                moved[k] = (release, fetch)
                taken.add((act.tensor, c.after))
        unmatched += len(set(pending) - wrapped)   # a wrapped tensor's last offload is its write-back
        return moved, recomputed, unmatched

    def values_of(self, moved: dict[int, tuple[int, int]], recomputed=frozenset()) -> np.ndarray:
        """The integer columns of these choices (candidate k -> (release, fetch), the
        recompute candidates taken); the continuous ones zero."""
        x = np.zeros(self.model.num_cols)
        for k, (release, fetch) in moved.items():
            c, col = self.cands[k], self.cols[k]
            x[col.Y + c.release.index(release):col.Y + len(c.release)] = 1.0
            x[col.Z + c.fetch.index(fetch):col.Z + len(c.fetch)] = 1.0
        for k in recomputed:
            x[self.Q + k] = 1.0
        return x

    def cover(self, moved: dict[int, tuple[int, int]], recomputed=frozenset(),
              short: list | None = None) -> dict[int, tuple[int, int]]:
        """``moved`` with more moves until every op over the budget fits in the model
        (as ``start`` adds them: the largest first, host first, each released as early
        and fetched as late as it may be); candidates of intervals already moved or
        recomputed are skipped, and those whose tensor a recompute taken reads inside the
        interval (R13: the model forbids it there, ``_read_in_moved_interval``); the chain
        sources the recomputes regenerate count at their ops (``decode_chains``). The ops
        still over the budget after all that are appended to ``short``."""
        resident = self.profile.resident_bytes
        need = {i: resident[i] - self.budget for i in self.over_ops}
        taken = {(self.redo[k].tensor, self.redo[k].after) for k in recomputed}
        for k in recomputed:
            r = self.redo[k]
            for i in range(r.after + 1, r.before):
                if i in need:
                    need[i] -= r.nbytes
        for at, tid in decode_chains([self.redo[k] for k in recomputed]):   # a chain source held through op at
            if at in need:
                need[at] += self.profile.tensor_by_id[tid].bytes
        for k, (release, fetch) in moved.items():
            c = self.cands[k]
            taken.add((c.tensor, c.after))
            for i in c.off(release, fetch):
                if i in need:
                    need[i] -= c.nbytes
        out = dict(moved)
        read_at: dict[str, list[int]] = {}   # sources of the recomputes taken: not moved across their reads
        for k in recomputed:
            for src in self.redo[k].sources:
                read_at.setdefault(src, []).append(self.redo[k].before)
        order = sorted(range(len(self.cands)), key=lambda k: (self.cands[k].tier != "host", -self.cands[k].nbytes, k))
        for k in order:
            c = self.cands[k]
            span = c.span
            if (c.tensor, c.after) in taken or not any(need.get(i, 0) > 0 for i in span) \
                    or any(c.after < at < c.before for at in read_at.get(c.tensor, ())):
                continue
            taken.add((c.tensor, c.after))
            out[k] = (c.release[0], c.fetch[-1])
            for i in span:
                if i in need:
                    need[i] -= c.nbytes
        for k in sorted(out, key=lambda k: (-self.cands[k].nbytes, k)):   # then the moves given, widened
            c, (release, fetch) = self.cands[k], out[k]
            given = c.off(release, fetch)
            if any(need.get(i, 0) > 0 for i in c.span if i not in given):
                for i in c.span:
                    if i in need and i not in given:
                        need[i] -= c.nbytes
                out[k] = (c.release[0], c.fetch[-1])
        if short is not None:
            short.extend(i for i, left in need.items() if left > 0)
        return out

    def priced(self, x: np.ndarray, time_limit: float, threads: int) -> np.ndarray | None:
        """``x``'s integer choices with the best continuous values for them (copy
        placement, step times, chain recomputes: an LP), or None when no continuous
        values make them feasible in the model."""
        fixed = self.model.with_integers_fixed(x, time_limit, threads)
        if fixed.values is None or fixed.status != "optimal":
            return None
        return np.where(np.asarray(self.model.integer, dtype=bool), np.round(x), fixed.values)

    def _token_rows(self) -> None:
        """TMOF's token: in any step at most one offload is in flight (moved, not yet
        released): sum over intervals of Y[last] - Y[i] <= 1."""
        active: dict[int, list[int]] = {}
        for k, c in enumerate(self.cands):
            for i in c.out_steps:
                active.setdefault(i, []).append(k)
        for i, ks in sorted(active.items()):
            index, value = [], []
            for k in ks:
                c = self.cands[k]
                index.append(self.Y(k, c.release[-1]))
                value.append(1.0)
                y = self.Y(k, i)
                if y is not None:
                    index.append(y)
                    value.append(-1.0)
            self.model.add_row(index, value, upper=1.0)


def copy_times(profile: Profile, timeline) -> tuple[np.ndarray, np.ndarray, dict, dict]:
    """A simulated plan's ``timeline`` read for its copies: the time each op started (kept
    non-decreasing, so that a search finds the first op started by a time) and ended (inf
    when it did not run), the end of the n-th offload of each tensor ((tensor, n) -> us)
    and the start of its n-th prefetch (grouped copies, R53, are left out)."""
    ended: dict[tuple[str, int], float] = {}
    began: dict[tuple[str, int], float] = {}
    seen: dict[tuple[str, str], int] = {}
    for span in timeline.spans:
        kind = span.args.get("kind")
        if kind in ("offload", "prefetch") and "members" not in span.args:
            n = seen.get((kind, span.args["tensor"]), 0)
            seen[kind, span.args["tensor"]] = n + 1
            if kind == "offload":
                ended[span.args["tensor"], n] = span.end_us
            else:
                began[span.args["tensor"], n] = span.start_us
    ran = {span.name: (span.start_us, span.end_us) for span in timeline.spans if span.track == "compute"}
    spans = [ran.get(op.id, (np.inf, np.inf)) for op in profile.ops]
    return (np.maximum.accumulate([start for start, _ in spans]), np.array([end for _, end in spans]),
            ended, began)


def fetched_after(op_starts: np.ndarray, ends: np.ndarray, copied: float) -> int:
    """The fetch position of a prefetch whose copy started at ``copied`` (R12: its memory
    is taken then): the op before the last one started by then, or that op itself when it
    had ended (the copy started while the next op waited, which ran without it before)."""
    j = int(np.searchsorted(op_starts, copied, side="right")) - 1
    return j if j >= 0 and ends[j] <= copied else j - 1


@dataclass(frozen=True)
class Chosen:
    """A moved interval as the solution has it: off the GPU from op ``release``, its
    prefetch issued after op ``fetch``, done in step ``done`` (the last step the model
    gives some of its copy) and due at ``before``."""
    candidate: Candidate
    release: int
    fetch: int
    done: int
    due: int = -1     # the op its prefetch is due at: the interval's end, or a recompute reading it

    @property
    def before(self) -> int:
        return self.candidate.before if self.due < 0 else self.due


def decode(form: Formulation, values: np.ndarray) -> list[Chosen]:
    chosen = []
    for k, (c, col) in enumerate(zip(form.cands, form.cols)):
        if values[form.Y(k, c.release[-1])] < 0.5:
            continue
        release = next(r for r in c.release if values[form.Y(k, r)] > 0.5)
        fetch = next(f for f in c.fetch if values[form.Z(k, f)] > 0.5)
        pieces = values[col.v:col.v + len(c.in_pieces)]
        busy = np.flatnonzero(pieces > 1e-6 * max(c.in_us * MS, 1e-9))
        done = c.in_pieces[busy[-1]][1] - 1 if len(busy) else c.before - 1
        chosen.append(Chosen(c, release, fetch, done))
    return chosen


def initial_of(chosen: list[Chosen]) -> dict[str, str]:
    """Where the moved wrap candidates start the iteration (the plan's ``initial``)."""
    return {ch.candidate.tensor: ch.candidate.tier for ch in chosen if ch.candidate.wraps}


def decode_recomputes(form: Formulation, values: np.ndarray) -> list[Recompute]:
    return [r for k, r in enumerate(form.redo) if values[form.Q + k] > 0.5]


def retarget(profile: Profile, chosen: list[Chosen], redone: list[Recompute],
             chains: list[tuple[int, str]]) -> list[Chosen]:
    """Each moved interval with its prefetch due at the first recompute that reads its
    tensor once it is off the GPU (the model has it back by then), else at its end."""
    reads: dict[str, list[int]] = {}
    for at, tid in [(r.before, r.tensor) for r in redone] + list(chains):
        for src in profile.ops[profile.producer[tid]].inputs:
            reads.setdefault(src, []).append(at)
    due = []
    for ch in chosen:
        c = ch.candidate
        early = [at for at in reads.get(c.tensor, ()) if ch.release <= at < c.before]
        due.append(replace(ch, due=min(early)) if early else ch)
    return due


def decode_chains(redone: list[Recompute]) -> list[tuple[int, str]]:
    """The chain sources the chosen recomputes need regenerated, as (op, tensor): a
    source dropped for a recompute across the op it is read at, recursively (as the
    model's ``W`` rows have it; read from the choices, not from ``W``'s values)."""
    across: dict[str, list[Recompute]] = {}
    for r in redone:
        across.setdefault(r.tensor, []).append(r)
    found: set[tuple[int, str]] = set()
    work = [(r.before, r.sources) for r in redone]
    while work:
        at, sources = work.pop()
        for src in sources:
            for r in across.get(src, ()):
                if r.after < at < r.before and (at, src) not in found:
                    found.add((at, src))
                    work.append((at, r.sources))
    return sorted(found)


def step_times(form: Formulation, values: np.ndarray) -> np.ndarray:
    """The model's step times, in us."""
    return values[form.T:form.T + form.n] / MS


def same_choices(form: Formulation, x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two solutions make the same integer choices (moves, releases, fetches,
    recomputes)."""
    integer = np.asarray(form.model.integer, dtype=bool)
    return bool(np.array_equal(np.round(x[integer]), np.round(y[integer])))


def predicted_us(form: Formulation, values: np.ndarray) -> float:
    return float(values[form.T:form.T + form.n].sum()) / MS
