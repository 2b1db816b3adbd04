"""superneurons: checkpoints and cheap segments, cost-aware recomputation (speed- and
memory-centric), conv outputs offloaded in LRU order only when the budget needs it."""
from __future__ import annotations

import pytest

from planner.shared.facts import working_set
from planner.core.api import make_plan
from planner.swap_recompute.superneurons import (MEMORY, SPEED, Walked, forward_layers, name_kind, offload_candidates,
                                                 recompute_candidates, recompute_sources, segment_modes, transfer_steps)
from simulator.catalog import open_profile
from simulator.hardware import load_hardware
from simulator.plan import plan_json
from tests.conftest import make_profile
from tests.engine_helpers import machine

HW = machine()      # PCIe moves 1 byte per microsecond each way

# A two-block CNN: conv -> bn -> relu, twice, then a linear layer. Every activation is
# 400 B, every op long enough that a 400 us copy hides behind a few of them.
# Backward reads the conv outputs (bn_bw) and the relu outputs (relu_bw, the next conv's
# backward); the bn outputs are read only by their relu in forward.
# No-swap memory peaks at 2440 B at relu2_bw.
CNN_TENSORS = {
    "x": (10, "input"), "w1": (10, "weight"), "w2": (10, "weight"), "w3": (10, "weight"),
    "c1": (400, "activation"), "b1": (400, "activation"), "r1": (400, "activation"),
    "c2": (400, "activation"), "b2": (400, "activation"), "r2": (400, "activation"),
    "y": (10, "activation"),
    "dr2": (400, "gradient"), "db2": (400, "gradient"), "dc2": (400, "gradient"),
    "dr1": (400, "gradient"), "db1": (400, "gradient"), "dc1": (400, "gradient"),
    "g1": (10, "gradient"), "g2": (10, "gradient"), "g3": (10, "gradient"),
}
CNN_OPS = [
    ("conv1", "forward", 500, ["x", "w1"], ["c1"]),
    ("bn1", "forward", 50, ["c1"], ["b1"]),
    ("relu1", "forward", 50, ["b1"], ["r1"]),
    ("conv2", "forward", 500, ["r1", "w2"], ["c2"]),
    ("bn2", "forward", 50, ["c2"], ["b2"]),
    ("relu2", "forward", 50, ["b2"], ["r2"]),
    ("linear", "forward", 100, ["r2", "w3"], ["y"]),
    ("linear_bw", "backward", 100, ["y", "r2", "w3"], ["dr2", "g3"]),
    ("relu2_bw", "backward", 50, ["dr2", "r2"], ["db2"]),
    ("bn2_bw", "backward", 50, ["db2", "c2"], ["dc2"]),
    ("conv2_bw", "backward", 1000, ["dc2", "r1", "w2"], ["dr1", "g2"]),
    ("relu1_bw", "backward", 50, ["dr1", "r1"], ["db1"]),
    ("bn1_bw", "backward", 50, ["db1", "c1"], ["dc1"]),
    ("conv1_bw", "backward", 1000, ["dc1", "x", "w1"], ["g1"]),
]
CONV_OUTPUTS = {"c1", "c2"}
NO_RECOMPUTE = {"recompute": "off", "fc": "false", "fallback": "false"}


def cnn(ops=CNN_OPS, tensors=CNN_TENSORS):
    return make_profile(tensors, ops, "sn-cnn")


def chain(n):
    """conv -> n cheap layers (100 B each, all read by backward) -> linear -> loss, and the
    backward in reverse: each cheap layer's backward reads its own output."""
    words = ["relu", "tanh", "sigmoid", "gelu"][:n]
    acts = [f"a{k}" for k in range(n)]
    tensors = {"x": (10, "input"), "w1": (10, "weight"), "w2": (10, "weight"), "c": (100, "activation"),
               "y": (10, "activation"), "l": (1, "activation"), "gc": (100, "gradient"),
               "gw1": (10, "gradient"), "gw2": (10, "gradient")}
    tensors.update({a: (100, "activation") for a in acts})
    tensors.update({f"g{a}": (100, "gradient") for a in acts})
    ops, previous = [("conv", "forward", 100, ["x", "w1"], ["c"])], "c"
    for word, a in zip(words, acts):
        ops.append((word, "forward", 10, [previous], [a]))
        previous = a
    ops += [("linear", "forward", 50, [previous, "w2"], ["y"]), ("loss", "forward", 10, ["y"], ["l"]),
            ("linear_bw", "backward", 50, ["l", previous, "w2"], [f"g{previous}", "gw2"])]
    grad = f"g{previous}"
    for k in range(n - 1, -1, -1):
        out = f"g{acts[k - 1]}" if k else "gc"
        ops.append((f"{words[k]}_bw", "backward", 10, [grad, acts[k]], [out]))
        grad = out
    ops.append(("conv_bw", "backward", 100, ["gc", "c", "x", "w1"], ["gw1"]))
    return make_profile(tensors, ops, f"sn-chain{n}")


def plan(profile, budget, **params):
    return make_plan(profile, HW, budget, "superneurons", {k: str(v) for k, v in params.items()})


def of_kind(planned, kind):
    return [a for a in planned.plan.actions if a.kind == kind]


# ----------------------------------------------------------------------------- layers


@pytest.mark.parametrize("name, kind", [
    ("aten::convolution", "conv"), ("aten::cudnn_convolution", "conv"), ("aten::conv2d", "conv"),
    ("aten::addmm", "fc"), ("aten::mm", "fc"), ("aten::linear", "fc"),
    ("aten::_scaled_dot_product_efficient_attention", "fc"), ("aten::cat", "concat"),
    ("aten::_convert_indices_from_coo_to_csr", None), ("aten::relu_", None), ("aten::add.Tensor", None),
    ("conv.overload", "conv"), ("aten::native_batch_norm", None),
])
def test_layer_kind_comes_from_the_name_without_namespace_or_overload(name, kind):
    assert name_kind(name) == kind


def test_checkpoints_split_the_forward_pass_into_segments():
    # conv -> relu (read by conv2 and add: fork) -> conv2 -> add(conv2, relu) (join) -> tanh
    tensors = {"x": (10, "input"), "w": (10, "weight"), "c": (100, "activation"), "r": (100, "activation"),
               "c2": (100, "activation"), "s": (100, "activation"), "t": (100, "activation"),
               "g": (10, "gradient")}
    ops = [("conv", "forward", 10, ["x", "w"], ["c"]), ("relu", "forward", 1, ["c"], ["r"]),
           ("conv_2", "forward", 10, ["r", "w"], ["c2"]), ("add", "forward", 1, ["c2", "r"], ["s"]),
           ("tanh", "forward", 1, ["s"], ["t"]), ("bw", "backward", 10, ["t", "c", "r", "c2"], ["g"])]
    layers = forward_layers(make_profile(tensors, ops, "sn-kinds"))
    assert [layers.kind[i] for i in range(5)] == ["conv", "fork", "conv", "join", "cheap"]
    assert [layers.segment[i] for i in range(5)] == [1, 2, 3, 4, 4]
    assert layers.last_forward == 4


# ----------------------------------------------------------------------------- recomputation


def test_cheap_layers_between_checkpoints_are_recomputed_and_conv_outputs_are_not():
    profile = cnn()
    layers = forward_layers(profile)
    # relu outputs are read by backward; bn outputs only by their relu: they come back
    # as sources when a relu output is recomputed (re-running the segment from the conv)
    assert recompute_candidates(profile, layers) == {"r1": 1, "r2": 2}
    assert recompute_sources(profile, layers) == {"b1": 1, "b2": 2}
    budget = 2340                                   # 100 B under the peak
    assert not plan(profile, budget, recompute="off", offload="off").result.ok
    planned = plan(profile, budget, recompute="speed", offload="off")
    assert planned.result.ok and planned.result.peak_bytes <= budget
    assert [(a.tensor, a.before) for a in of_kind(planned, "recompute")] == [("b1", "conv2_bw"), ("r1", "conv2_bw")]
    assert {(a.tensor, a.after) for a in of_kind(planned, "drop")} == {("b1", "relu1"), ("r1", "conv2")}
    touched = {a.tensor for a in planned.plan.actions}
    assert not touched & CONV_OUTPUTS and "r2" not in touched   # r2: read by the very next op


def test_what_r15_forbids_is_kept():
    # bn1 updates a running statistic in place (PyTorch's native_batch_norm): b1 cannot
    # be recomputed, so neither can r1, which is made from it
    tensors = dict(CNN_TENSORS, stat=(4, "weight"))
    ops = [("bn1", "forward", 50, ["c1"], ["b1"], ["stat"]) if op[0] == "bn1" else op for op in CNN_OPS]
    profile = cnn(ops, tensors)
    layers = forward_layers(profile)
    assert "b1" not in recompute_sources(profile, layers)
    planned = plan(profile, 2340, recompute="speed", offload="off")
    assert not of_kind(planned, "recompute") and not planned.result.ok
    # relu2 in place on b2 (relu_): b2 is updated after it is made, r2 is no longer made
    ops = [("relu2_", "forward", 50, [], [], ["b2"]) if op[0] == "relu2" else op for op in CNN_OPS]
    ops = [(o[0], o[1], o[2], [("b2" if t == "r2" else t) for t in o[3]], o[4]) + tuple(o[5:]) for o in ops]
    profile = cnn(ops, {k: v for k, v in CNN_TENSORS.items() if k != "r2"})
    layers = forward_layers(profile)
    assert "b2" not in recompute_candidates(profile, layers) | recompute_sources(profile, layers)


def test_speed_centric_recomputes_a_segment_once_memory_centric_per_backward_layer():
    profile = chain(3)       # a0 -> a1 -> a2, each made from the one before
    assert profile.peak_bytes == 630
    speed = plan(profile, 600, recompute="speed", offload="off")
    memory = plan(profile, 600, recompute="memory", offload="off")
    assert [(a.tensor, a.before) for a in of_kind(speed, "recompute")] == \
        [("a0", "linear_bw"), ("a1", "linear_bw"), ("a2", "linear_bw")]
    # memory-centric: each backward layer gets what it needs, dropped again after (a0
    # and a1 come back once more for tanh_bw; relu_bw, the very next op, keeps a0)
    assert [(a.tensor, a.before) for a in of_kind(memory, "recompute")] == \
        [("a0", "linear_bw"), ("a1", "linear_bw"), ("a2", "linear_bw"), ("a0", "tanh_bw"), ("a1", "tanh_bw")]
    assert {(a.tensor, a.after) for a in of_kind(memory, "drop")} >= {("a0", "linear_bw"), ("a1", "linear_bw")}
    assert memory.result.ok and memory.result.peak_bytes <= 600
    assert not speed.result.ok                    # keeping the segment holds the peak at sigmoid_bw
    auto = plan(profile, 600, offload="off")
    assert auto.result.ok and auto.plan.planner.notes["recompute"] == "memory"


def test_speed_centric_brings_the_whole_segment_back_at_its_first_need():
    # relu(c) -> a and sigmoid(c) -> b, both cheap in the conv's segment, neither made
    # from the other; backward reads a at relu_bw and b two ops later at sigmoid_bw
    tensors = {"x": (10, "input"), "w1": (10, "weight"), "w2": (10, "weight"), "c": (100, "activation"),
               "a": (100, "activation"), "b": (100, "activation"), "y": (10, "activation"),
               "l": (1, "activation"), "ga": (100, "gradient"), "gb": (100, "gradient"),
               "g1": (100, "gradient"), "gm": (100, "gradient"), "g2": (100, "gradient"),
               "gw1": (10, "gradient"), "gw2": (10, "gradient")}
    ops = [("conv", "forward", 100, ["x", "w1"], ["c"]), ("relu", "forward", 10, ["c"], ["a"]),
           ("sigmoid", "forward", 10, ["c"], ["b"]), ("linear", "forward", 50, ["a", "b", "w2"], ["y"]),
           ("loss", "forward", 10, ["y"], ["l"]), ("linear_bw", "backward", 50, ["l", "w2"], ["ga", "gb", "gw2"]),
           ("relu_bw", "backward", 10, ["ga", "a"], ["g1"]), ("mid", "backward", 10, ["g1"], ["gm"]),
           ("sigmoid_bw", "backward", 10, ["gb", "b"], ["g2"]),
           ("conv_bw", "backward", 100, ["g2", "gm", "c", "x", "w1"], ["gw1"])]
    profile = make_profile(tensors, ops, "sn-branches")
    budget = profile.peak_bytes - 50
    speed = plan(profile, budget, recompute="speed", offload="off")
    memory = plan(profile, budget, recompute="memory", offload="off")
    assert [(a.tensor, a.before) for a in of_kind(speed, "recompute")] == [("a", "relu_bw"), ("b", "relu_bw")]
    assert [(a.tensor, a.before) for a in of_kind(memory, "recompute")] == [("a", "relu_bw"), ("b", "sigmoid_bw")]
    assert memory.result.ok and not speed.result.ok       # keeping b from relu_bw on costs its 100 B


def test_the_paper_rule_goes_memory_centric_when_a_segment_outweighs_the_peak_layer():
    for n, expected in ((3, SPEED), (4, MEMORY)):
        profile = chain(n)
        layers = forward_layers(profile)
        candidates = recompute_candidates(profile, layers)
        l_peak = max(working_set(profile, i, include_persistent=False) for i in range(len(profile.ops)))
        held = sum(profile.tensor_by_id[t].bytes for t, seg in candidates.items() if seg == 1)
        assert (held > l_peak) == (expected == MEMORY)           # 300 vs 300, then 400 vs 300
        assert segment_modes(profile, candidates, {1}, "paper") == {1: expected}
    paper = plan(chain(4), 700, recompute="paper", offload="off")
    memory = plan(chain(4), 700, recompute="memory", offload="off")
    assert paper.result.ok and paper.plan.actions == memory.plan.actions


# ----------------------------------------------------------------------------- offload


def test_nothing_is_done_when_the_profile_fits():
    for profile in (cnn(), chain(3)):
        planned = plan(profile, profile.peak_bytes)
        assert planned.result.ok and planned.plan.actions == ()
        assert planned.plan.planner.notes["choice"].startswith("nothing")


def test_conv_outputs_are_offloaded_only_as_far_as_the_budget_needs_in_lru_order():
    profile = cnn()
    one = plan(profile, 2340, **NO_RECOMPUTE)
    two = plan(profile, 1940, **NO_RECOMPUTE)
    # c1 is used last in forward before c2 is (bn1 before bn2): it is evicted first
    assert [a.tensor for a in of_kind(one, "offload")] == ["c1"]
    assert [a.tensor for a in of_kind(two, "offload")] == ["c1", "c2"]
    for planned in (one, two):
        assert planned.result.ok and planned.plan.planner.status == "heuristic"
        offloads = {a.tensor: a.after for a in of_kind(planned, "offload")}
        prefetches = {a.tensor: a.before for a in of_kind(planned, "prefetch")}
        assert offloads == {t: f"conv{t[1]}" for t in offloads}          # right after the conv
        assert prefetches == {t: f"bn{t[1]}_bw" for t in offloads}       # back by its first backward read
    everything = plan(profile, 2340, offload="all", recompute="off", fc="false")
    assert sorted(a.tensor for a in of_kind(everything, "offload")) == ["c1", "c2"]
    assert everything.result.iteration_us >= one.result.iteration_us


def test_when_conv_outputs_are_not_enough_the_fallback_offloads_other_saved_tensors():
    profile = cnn()
    strict = plan(profile, 1540, fallback="false")
    assert not strict.result.ok and strict.plan.planner.status == "infeasible"
    assert {a.tensor for a in of_kind(strict, "offload")} <= CONV_OUTPUTS
    wide = plan(profile, 1540)
    assert wide.result.ok and wide.plan.planner.status == "fallback"
    assert {a.tensor for a in of_kind(wide, "offload")} - CONV_OUTPUTS == {"r1"}


@pytest.mark.parametrize("ahead, c2_after, c1_after", [(0, "relu2_bw", "relu1_bw"), (1, "linear", "relu2_bw"),
                                                      (2, "linear", "linear")])
def test_a_prefetch_is_issued_when_backward_reaches_the_candidate_ahead_of_it(ahead, c2_after, c1_after):
    # needs: c2 at bn2_bw, c1 at bn1_bw; with room to spare nothing moves a trigger later
    profile = cnn()
    layers = forward_layers(profile)
    every = offload_candidates(profile, layers, {}, Walked(), frozenset({"conv"}), False)
    assert every == ["c1", "c2"]
    steps = transfer_steps(profile, layers, Walked(), every, every, ahead, 10**9)
    prefetched = {s.action.tensor: (s.action.after, s.action.before) for s in steps if s.action.kind == "prefetch"}
    assert prefetched == {"c2": (c2_after, "bn2_bw"), "c1": (c1_after, "bn1_bw")}


def test_prefetches_go_the_given_number_of_candidates_ahead_and_tuning_keeps_the_fastest():
    profile = cnn()
    on_demand = plan(profile, 1940, ahead=0, **NO_RECOMPUTE)
    one_ahead = plan(profile, 1940, ahead=1, **NO_RECOMPUTE)
    tuned = plan(profile, 1940, **NO_RECOMPUTE)
    after = [{a.tensor: a.after for a in of_kind(p, "prefetch")} for p in (on_demand, one_ahead)]
    assert after[0]["c1"] == "relu1_bw"          # just before bn1_bw
    assert after[1]["c1"] == "bn2_bw"            # when backward reaches c2's need, the candidate before
    assert one_ahead.result.iteration_us < on_demand.result.iteration_us
    assert tuned.result.iteration_us <= one_ahead.result.iteration_us
    assert tuned.plan.planner.notes["ahead"] >= 1


# ----------------------------------------------------------------------------- whole runs


def test_the_same_inputs_give_the_same_plan():
    for profile, budget in ((cnn(), 1540), (chain(4), 700)):
        first, second = plan(profile, budget), plan(profile, budget)
        assert plan_json(first.plan) == plan_json(second.plan)


def test_a_shipped_cnn_recomputes_relu_outputs_through_batch_norm_and_offloads_only_conv_outputs():
    profile = open_profile("synth-cnn-l16-w128-b64-s224")
    hardware = load_hardware("a100-40gb-pcie4")
    budget = int(0.3 * profile.peak_bytes)
    planned = make_plan(profile, hardware, budget, "superneurons")
    again = make_plan(profile, hardware, budget, "superneurons")
    assert plan_json(planned.plan) == plan_json(again.plan)
    paper_ahead = make_plan(profile, hardware, budget, "superneurons", {"ahead": "1"})
    assert planned.plan.planner.notes["ahead"] > 1           # one layer ahead is too late here
    assert planned.result.iteration_us < paper_ahead.result.iteration_us
    assert planned.result.ok and planned.plan.planner.status == "heuristic"
    made_by = {t: profile.ops[i].name for i, op in enumerate(profile.ops) for t in op.outputs}
    recomputed = {made_by[a.tensor] for a in of_kind(planned, "recompute")}
    assert {"aten::relu", "aten::cudnn_batch_norm"} <= recomputed       # relu outputs, bn as their source
    assert not recomputed & {"aten::cudnn_convolution", "aten::addmm", "aten::add"}   # checkpoints are kept
    assert {made_by[a.tensor] for a in of_kind(planned, "offload")} <= {"aten::cudnn_convolution", "aten::addmm"}
