"""chen: segments of the forward pass dropped after forward and recomputed before backward."""
from __future__ import annotations

import math

from planner.core.api import make_plan
from planner.shared.checkpoint import chen_actions, droppable, forward_ops, segment_of
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
    notes = planned.plan.planner.notes
    fixed = make_plan(profile, hw, budget, "chen", {"segments": str(notes["segments"]), "lazy": str(notes["lazy"])})
    assert fixed.plan.actions == planned.plan.actions


def test_lazy_recomputes_each_tensor_just_before_it_is_needed():
    profile, hw = open_profile(PROFILE), load_hardware("a100-40gb-pcie4")
    eager, _ = chen_actions(profile, 4)
    lazy, _ = chen_actions(profile, 4, lazy=True)
    index = profile.op_index
    at = {a.tensor: index[a.before] for a in lazy if a.kind == "recompute"}
    assert set(at) == {a.tensor for a in eager if a.kind == "recompute"}
    # a tensor only the forward reads is re-made for a reader's re-run, before that reader
    first_backward = {t: min((u for u in profile.consumers[t] if profile.ops[u].phase != "forward"),
                             default=len(profile.ops)) for t in at}
    assert all(at[t] <= first_backward[t] for t in at)
    assert any(at[t] == first_backward[t] for t in at)
    assert len(set(at.values())) > len({index[a.before] for a in eager if a.kind == "recompute"})
    runs = [make_plan(profile, hw, profile.peak_bytes, "chen", {"segments": "4", "lazy": lazy})
            for lazy in ("false", "true")]
    assert all(run.result.ok for run in runs)
    # recomputed tensors live shorter: each comes back no earlier than with the eager re-forward,
    # some later, and the peak is no higher
    eager_at = {a.tensor: index[a.before] for a in eager if a.kind == "recompute"}
    assert all(at[t] >= eager_at[t] for t in at) and any(at[t] > eager_at[t] for t in at)
    assert runs[1].result.peak_bytes <= runs[0].result.peak_bytes


def test_a_source_updated_in_place_before_the_producer_read_it_does_not_stop_a_recompute():
    # x = relu_(bn) in place, then c = conv(x): c can be recomputed from x (ResNet's pattern)
    from tests.conftest import make_profile
    tensors = {"w": (10, "weight"), "bn": (100, "activation"), "c": (100, "activation"),
               "gc": (1, "gradient"), "gx": (1, "gradient")}
    ops = [("bn_op", "forward", 10.0, [], ["bn"]), ("relu_", "forward", 1.0, [], [], ["bn"]),
           ("conv", "forward", 10.0, ["bn", "w"], ["c"]), ("mid", "forward", 1.0, [], []),
           ("conv_bw", "backward", 10.0, ["c"], ["gc"]), ("bn_bw", "backward", 10.0, ["bn", "gc"], ["gx"])]
    profile = make_profile(tensors, ops, "chen-inplace")
    dropped = droppable(profile, segment_of(profile, 1))
    assert "c" in dropped
