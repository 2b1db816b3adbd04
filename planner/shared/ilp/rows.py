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

``Formulation`` builds it over the candidates of candidates.py (planner/shared/highs.py
solves it), and reads a plan's moves as its choices (``choices_of_plan``, ``cover``: the
solver's start); decode.py reads the chosen intervals back.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from simulator.model.links import transfer_links
from simulator.profile import Profile

from ..highs import Model
from .candidates import MS, Candidate, Recompute, moved_interval, moves_by_tensor
from .decode import copy_times, decode_chains, fetched_after


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
