"""Recompute instead of spilling: which idle tensors a swap planner may drop and run
again (R15) where its slowest tier cannot take them in time.

When a plan must put more on the SSD before an op than the SSD can write by then, every
byte over is a stall; a tensor whose producer re-runs in less time per byte than the SSD
writes one costs less recomputed than spilled. ``candidates`` lists the idle gaps a
recompute may replace, cheapest per byte first; ``cover`` takes the cheapest of those
idle at an op until they hold a given number of bytes. A swap planner then plans the
rest around them (planner/swap/g10.py, its ``recompute`` parameter).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.model.recompute import recompute_problem
from simulator.profile import Profile

from .facts import held_per_op, idle_gaps, op_start_us, touches


@dataclass(frozen=True)
class Regen:
    """Tensor ``tensor`` dropped after op position ``after`` and recomputed before op
    position ``before`` by its producer (position ``producer``), whose inputs
    ``sources`` must then be on the GPU; ``us_per_byte``: the producer's time per byte."""
    tensor: str
    nbytes: int
    after: int
    before: int
    producer: int
    sources: tuple[str, ...]
    us_per_byte: float


def candidates(profile: Profile, max_us_per_byte: float, min_gap: int = 2) -> list[Regen]:
    """The idle gaps (at least ``min_gap`` ops long) of non-persistent tensors that a
    recompute may replace, cheapest per byte first (then the larger, then profile order),
    keeping those under ``max_us_per_byte``. R15 (``recompute_problem``): the producer
    updates nothing in place, and the tensor is not updated in place before the gap's
    end. The producer's inputs must be what they were when it ran (none updated in place
    between the producer and the gap's end, weights included) and still needed at or
    after the gap's end (a recompute that would keep a dead input alive is not offered)."""
    found: list[Regen] = []
    producer = profile.producer
    starts = op_start_us(profile)
    last_touch: dict[str, int] = {}
    for tensor in profile.tensors:
        made_by = producer[tensor.id]
        if tensor.persistent or tensor.bytes <= 0 or made_by is None:
            continue
        op = profile.ops[made_by]
        if not op.time_us >= 0:
            continue
        ratio = op.time_us / tensor.bytes
        if ratio >= max_us_per_byte:
            continue
        for gap in idle_gaps(profile, tensor.id, starts):
            if gap.before - gap.after < min_gap or not _may_recompute(profile, tensor.id, op, gap.before,
                                                                      last_touch):
                continue
            found.append(Regen(tensor.id, tensor.bytes, gap.after, gap.before, made_by, tuple(op.inputs), ratio))
    found.sort(key=lambda r: (r.us_per_byte, -r.nbytes, r.producer, r.after))
    return found


def _may_recompute(profile: Profile, tid: str, op, before: int, last_touch: dict[str, int]) -> bool:
    if recompute_problem(profile, tid, before) is not None:   # R15
        return False
    for source in op.inputs:
        if source not in last_touch:
            points = touches(profile, source)
            last_touch[source] = points[-1] if points else -1
        if last_touch[source] < before:
            return False
    return True


def cover(found: list[Regen], at: int, nbytes: int) -> list[Regen]:
    """The cheapest of ``found`` idle across op position ``at`` until they hold
    ``nbytes`` (fewer when they hold less), none the source of another's recompute while
    dropped (no chains)."""
    chosen: list[Regen] = []
    held = 0
    for r in found:
        if held >= nbytes:
            break
        if not r.after < at < r.before or _clashes(r, chosen):
            continue
        chosen.append(r)
        held += r.nbytes
    return chosen


def _clashes(r: Regen, chosen: list[Regen]) -> bool:
    for other in chosen:
        if other.tensor in r.sources and other.after < r.before < other.before:
            return True
        if r.tensor in other.sources and r.after < other.before < r.before:
            return True
    return False


def shortfall(starts_us, bytes_per_us: float, held: list[tuple[int, int, int]]) -> tuple[int, float]:
    """Where a tier written at ``bytes_per_us`` falls furthest behind what a plan holds
    there, and by how many bytes: at each op position k, the bytes of ``held`` ((lo, hi,
    bytes): in the tier at op positions [lo, hi)), which were written by then, less what
    the tier can write from the iteration start to k's start (``starts_us``)."""
    behind = held_per_op(len(starts_us), held) - bytes_per_us * np.asarray(starts_us, dtype=float)
    at = int(np.argmax(behind))
    return at, float(behind[at])
