"""Grouped transfers (R53) for any planner: ``make_plan(..., group=True)`` and ``swapplan plan
--group``. Offloads (or prefetches) issued after the same op, with the same ``before``
and tier, move as one transfer: one latency for many copies, as DeepTM aggregates the
migration of adjacent tensors."""
from __future__ import annotations

from dataclasses import replace

from simulator.hardware import Hardware
from simulator.plan import Action


def group_actions(actions: list[Action], hardware: Hardware) -> tuple[list[Action], int, int]:
    """The actions with every set of two or more ungrouped offloads or prefetches of the
    same kind, ``after``, ``before`` and tier (and no compute codec: its copies follow
    their own encode kernels) given one group id, ``g1``, ``g2``, ... in the order of
    their first member; and (groups, members). Nothing is grouped on a link without
    latency: there is nothing to save."""
    codecs = {codec.name: codec for codec in hardware.codecs}

    def key(action: Action):
        if action.kind not in ("offload", "prefetch") or action.group is not None:
            return None
        if action.codec is not None and codecs.get(action.codec) is not None \
                and codecs[action.codec].where == "compute":
            return None
        tier = action.to if action.kind == "offload" else action.source
        latency = hardware.pcie.latency_us + (hardware.ssd.latency_us if tier == "ssd" and hardware.ssd else 0)
        if latency <= 0:
            return None
        return action.kind, action.after, action.before, tier

    counts: dict = {}
    for action in actions:
        k = key(action)
        if k is not None:
            counts[k] = counts.get(k, 0) + 1
    names: dict = {}
    out = []
    for action in actions:
        k = key(action)
        if k is None or counts[k] < 2:
            out.append(action)
            continue
        if k not in names:
            names[k] = f"g{len(names) + 1}"
        out.append(replace(action, group=names[k]))
    return out, len(names), sum(counts[k] for k in names)
