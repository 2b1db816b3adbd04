"""Builders of valid plans for tests (not planners): swap chosen tensors across their
longest idle gap between two uses."""
from __future__ import annotations

from planner.shared import facts as analysis
from simulator.plan import Action, Plan, offload, prefetch
from simulator.profile import Profile, profile_sha256


def idle_gaps(profile: Profile, tid: str) -> list[tuple[int, int]]:
    """(previous touch, next use) op positions of a tensor's idle gaps."""
    return [(g.after, g.before) for g in analysis.idle_gaps(profile, tid)]


def swap_plan(profile: Profile, tensors, lead: int = 1, tier: str = "host", early: int = 0) -> Plan:
    """Offload each tensor after the op that opens its longest idle gap and prefetch it
    ``lead`` ops before the op that closes it (clamped to the gap).

    ``early`` > 0 issues the offload up to that many touches before the gap instead, when
    those touches only read the tensor: they then read it inside the offload's window.
    """
    ops = profile.ops
    actions: list[Action] = []
    for tid in tensors:
        gaps = idle_gaps(profile, tid)
        if not gaps:
            continue
        a, b = max(gaps, key=lambda g: (g[1] - g[0], -g[0]))
        after = max(a, b - 1 - lead)
        start = a
        touches = analysis.touches(profile, tid)
        for p in reversed(touches[max(0, touches.index(a) - early):touches.index(a)]):
            if any(u in profile.updaters[tid] for u in touches if p < u <= a):
                break
            start = p
        actions.append(offload(tid, ops[start].id, tier))
        actions.append(prefetch(tid, ops[after].id, ops[b].id, tier))
    return Plan(profile.name, tuple(actions), profile_sha256=profile_sha256(profile))


def swappable(profile: Profile) -> list[str]:
    """Non-persistent tensors with an idle gap, largest first."""
    found = [t for t in profile.tensors if not t.persistent and idle_gaps(profile, t.id)]
    return [t.id for t in sorted(found, key=lambda t: (-t.bytes, t.id))]
