"""chen: segments of the forward pass dropped after forward and recomputed before backward."""
from __future__ import annotations

import math

from planner.api import make_plan
from planner.chen import chen_actions, droppable, forward_ops, segment_of
from simulator.catalog import open_profile
from simulator.hardware import load_hardware

PROFILE = "synth-transformer-l12-b16-s1024"


def test_segments_split_the_forward_pass_evenly():
    profile = open_profile(PROFILE)
    forward = forward_ops(profile)
    segment = segment_of(profile, 4)
    sizes = [sum(1 for s in segment.values() if s == k) for k in range(4)]
    assert sum(sizes) == len(forward) and max(sizes) - min(sizes) <= math.ceil(len(forward) / 4)


def test_dropped_tensors_are_recomputed_from_resident_or_same_segment_sources():
    profile = open_profile(PROFILE)
    segment = segment_of(profile, 6)
    dropped = droppable(profile, segment)
    assert dropped
    for tid, seg in dropped.items():
        producer = profile.ops[profile.producer[tid]]
        assert not producer.updates and not profile.updaters[tid]
        for src in producer.inputs:
            assert profile.tensor_by_id[src].persistent or src not in dropped or dropped[src] == seg
    actions, notes = chen_actions(profile, 6)
    kinds = [a.kind for a in actions]
    assert kinds.count("drop") == kinds.count("recompute") == notes["dropped_tensors"] > 0


def test_the_budgeted_search_fits_where_nothing_moved_does_not():
    profile, hw = open_profile(PROFILE), load_hardware("a100-40gb-pcie4")
    budget = int(0.7 * profile.peak_bytes)
    assert not make_plan(profile, hw, budget, "none").result.ok
    planned = make_plan(profile, hw, budget, "chen")
    assert planned.result.ok and planned.result.peak_bytes <= budget and planned.result.recomputes > 0
    assert planned.plan.planner.notes["searched_segment_counts"] > 1
    fixed = make_plan(profile, hw, budget, "chen", {"segments": str(planned.plan.planner.notes["segments"])})
    assert fixed.plan.actions == planned.plan.actions
