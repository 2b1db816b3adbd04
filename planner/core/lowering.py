"""From a planner's decisions to plan actions, the same way for every planner.

A planner decides, per tensor, when it leaves the GPU and when it comes back; the plan
lists actions in the order a runtime issues them. ``Step`` is one action with where it
is issued; ``issue_order`` sorts steps into that order: by the op they follow (the
iteration start first), at one op drops before offloads before prefetches (a drop frees
memory at once, an offload's copy queues before the prefetches that may wait for it),
prefetches by the op that needs them, then the planner's own tie-break.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.plan import Action, offload, prefetch

DROP, OFFLOAD, PREFETCH = 0, 1, 2


@dataclass(frozen=True)
class Step:
    """One action, issued after op position ``at`` (-1: at the iteration start)."""
    at: int
    phase: int      # DROP | OFFLOAD | PREFETCH
    need: int       # the op position the step serves (a prefetch: its before op)
    order: Any      # the planner's tie-break among equal (at, phase, need)
    action: Action

    def key(self) -> tuple:
        return (self.at, self.phase, self.need, self.order)


def phase_of(action: Action) -> int:
    return {"drop": DROP, "offload": OFFLOAD, "prefetch": PREFETCH}[action.kind]


def issue_order(steps: list[Step], fifo: bool = False) -> list[Action]:
    """The actions of ``steps`` in the order a runtime issues them. ``fifo``: at one op
    and phase, in the planner's own order (the order its copy-queue model took them in)
    instead of by the op they serve."""
    key = (lambda step: (step.at, step.phase, step.order)) if fifo else Step.key
    return [step.action for step in sorted(steps, key=key)]


def host_swaps(profile, swaps) -> list[Action]:
    """Offload and prefetch actions, in issue order, for (tensor, a, b, c) swaps: out to
    host memory after op position a, back after op b, before op c."""
    ops = profile.ops
    steps = []
    for tid, a, b, c in swaps:
        steps.append(Step(a, OFFLOAD, c, tid, offload(tid, ops[a].id, "host")))
        steps.append(Step(b, PREFETCH, c, tid, prefetch(tid, ops[b].id, ops[c].id, "host")))
    return issue_order(steps)
