"""The interval MILP's candidates (rows.py builds the model over them): the idle intervals
of a tensor that may move to a tier and back, each with the ops its release and its
prefetch may happen at (``Candidate``, ``candidates``; the positions from positions.py),
the persistent tensors that may start the iteration off the GPU (``wrap_candidates``), the
intervals that may instead be dropped and recomputed (``Recompute``, ``recomputes``), and
how a plan's move is matched to its candidate (``moved_interval``).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from simulator.model.links import link_speed, transfer_links
from simulator.model.recompute import recompute_problem
from simulator.profile import Profile

from ..facts import idle_gaps, op_start_us, touches
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
