"""G10's candidates (planner/swap/g10.py, steps 1 and 3: its tensor vitality analysis):
every tensor's idle intervals between uses, each persistent tensor's interval across the
iteration boundary (``Interval``, ``candidate_intervals``), and the tiers the 2.5x rule
allows an interval (``move_speeds``, ``rule_tiers``).
"""
from __future__ import annotations

from dataclasses import dataclass

from simulator.model.links import link_speed

from ..shared.facts import touches
from ..shared.regen import Regen


@dataclass(frozen=True)
class Interval:
    """A candidate move: tensor ``tensor`` is not touched after op ``after`` until op
    ``before``. ``wraps``: the interval runs across the iteration boundary (persistent
    tensors), from the last touch ``after`` to the first touch ``before``; ``after`` and
    ``before`` are None for a persistent tensor no op touches."""
    tensor: str
    nbytes: int
    after: int | None
    before: int | None
    length_us: float
    wraps: bool
    persistent: bool
    updated: bool       # some op updates it in place (its lower-tier copies go stale, R16)
    order: int


def candidate_intervals(profile, starts: list[float], regens: tuple[Regen, ...] = ()) -> list[Interval]:
    """Every tensor's idle intervals, and each persistent tensor's interval across the
    iteration boundary (or the whole iteration when no op touches it). ``regens``: the
    gaps recomputed instead (not candidates), whose recomputes read their sources (a
    touch that splits a source's interval)."""
    found: list[Interval] = []
    n = len(profile.ops)
    ideal = starts[-1]
    skipped = {(r.tensor, r.after) for r in regens}
    read_at: dict[str, set[int]] = {}
    for r in regens:
        for source in r.sources:
            read_at.setdefault(source, set()).add(r.before)
    for tensor in profile.tensors:
        if tensor.bytes <= 0:
            continue
        updated = bool(profile.updaters[tensor.id])
        for after, before in _gaps(profile, tensor.id, read_at.get(tensor.id)):
            if (tensor.id, after) not in skipped:
                found.append(Interval(tensor.id, tensor.bytes, after, before, starts[before] - starts[after + 1],
                                      False, tensor.persistent, updated, len(found)))
        if not tensor.persistent:
            continue
        points = sorted(set(touches(profile, tensor.id)) | read_at.get(tensor.id, set()))
        if not points:
            found.append(Interval(tensor.id, tensor.bytes, None, None, ideal, True, True, False, len(found)))
            continue
        first, last = points[0], points[-1]
        if n - 1 - last + first >= 1:
            length = ideal - starts[last + 1] + starts[first]
            found.append(Interval(tensor.id, tensor.bytes, last, first, length, True, True, updated,
                                  len(found)))
    return found


def _gaps(profile, tid: str, extra: set[int] | None) -> list[tuple[int, int]]:
    """(after, before) of the tensor's idle gaps (as ``idle_gaps``), with ``extra`` op
    positions counted as touches."""
    points = sorted(set(touches(profile, tid)) | extra) if extra else touches(profile, tid)
    return [(a, b) for a, b in zip(points, points[1:]) if b - a >= 2]


def move_speeds(hardware, use_ssd: bool) -> dict[str, tuple[float, float]]:
    """Per tier the 2.5x rule may choose, SSD first: (latency in us, bytes per us) of the
    slower of a move's two lone transfers, on the simulator's routes (``link_speed``)."""
    found = {}
    for tier in (("ssd", "host") if use_ssd and hardware.ssd is not None else ("host",)):
        speeds = [link_speed(hardware, kind, tier) for kind in ("offload", "prefetch")]
        found[tier] = (max(latency for latency, _ in speeds), min(rate for _, rate in speeds))
    return found


def rule_tiers(interval: Interval, speeds: dict[str, tuple[float, float]], factor: float) -> list[str]:
    """The tiers the 2.5x rule allows for this interval, SSD first: the interval must be
    ``factor`` times the move's transfer time (``move_speeds``)."""
    return [tier for tier, (latency, rate) in speeds.items()
            if interval.length_us > factor * (latency + interval.nbytes / rate)]
