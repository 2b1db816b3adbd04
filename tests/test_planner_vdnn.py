"""vdnn: which layers' input feature maps are offloaded (all / conv / dyn), when the
offloads and prefetches are issued, and the sweep over the shipped profiles."""
from __future__ import annotations

import pytest

from planner.core.api import make_plan
from planner.swap.vdnn import op_kind
from planner.swap.vdnn import plan_vdnn
from simulator.catalog import open_profile
from simulator.api import simulate
from simulator.hardware import load_hardware
from simulator.plan import Plan
from simulator.profile import profile_from_dict
from tests.conftest import profile_dict
from tests.engine_helpers import machine

TEST_MACHINE = machine()   # 1 byte per microsecond each way


def layered_profile(tensors, ops, name="layered", modules=True):
    """Like conftest.make_profile, with each op spec ending in (module, op name)."""
    plain = [spec[:-2] for spec in ops]
    data = profile_dict(tensors, plain, name)
    for op, spec in zip(data["ops"], ops):
        op["name"] = spec[-1]
        if modules:
            op["module"] = spec[-2]
    return profile_from_dict(data)


# A small CNN. Layers in forward order (index: module, kind, input feature map):
#   0 conv1 conv (x: persistent input)   1 relu1 activation (a1)   2 conv2 conv (a2)
#   3 bn other (a3)   4 fc fc (a4)   5 softmax softmax (a5)   6 loss other, last (a6)
# Every one of a1..a6 is read again in backward, so only the layer rules decide.
CNN_TENSORS = {
    "x": (10, "input"), "w1": (10, "weight"), "w2": (10, "weight"), "w3": (10, "weight"), "w4": (10, "weight"),
    "a1": (100, "activation"), "a2": (100, "activation"), "a3": (100, "activation"), "a4": (100, "activation"),
    "a5": (10, "activation"), "a6": (10, "activation"), "l": (1, "activation"),
    "g6": (10, "gradient"), "g5": (10, "gradient"), "g4": (100, "gradient"), "g3": (100, "gradient"),
    "g2": (100, "gradient"), "g1": (100, "gradient"),
    "gw1": (10, "gradient"), "gw2": (10, "gradient"), "gw3": (10, "gradient"), "gw4": (10, "gradient"),
}
CNN_OPS = [
    ("f1", "forward", 10.0, ["x", "w1"], ["a1"], None, None, "conv1", "aten::cudnn_convolution"),
    ("f2", "forward", 10.0, ["a1"], ["a2"], None, None, "relu1", "aten::relu"),
    ("f3", "forward", 10.0, ["a2", "w2"], ["a3"], None, None, "conv2", "aten::cudnn_convolution"),
    ("f4", "forward", 10.0, ["a3", "w4"], ["a4"], None, None, "bn", "aten::native_batch_norm"),
    ("f5", "forward", 10.0, ["a4", "w3"], ["a5"], None, None, "fc", "aten::addmm"),
    ("f6", "forward", 10.0, ["a5"], ["a6"], None, None, "softmax", "aten::_softmax"),
    ("f7", "forward", 10.0, ["a6"], ["l"], None, None, "loss", "aten::mse_loss"),
    ("b7", "backward", 10.0, ["l", "a6"], ["g6"], None, None, "loss", "aten::mse_loss_backward"),
    ("b6", "backward", 10.0, ["g6", "a5"], ["g5"], None, None, "softmax", "aten::_softmax_backward_data"),
    ("b5", "backward", 10.0, ["g5", "a4", "w3"], ["g4", "gw3"], None, None, "fc", "aten::linear_backward"),
    ("b4", "backward", 10.0, ["g4", "a3", "w4"], ["g3", "gw4"], None, None, "bn", "aten::native_batch_norm_backward"),
    ("b3", "backward", 10.0, ["g3", "a2", "w2"], ["g2", "gw2"], None, None, "conv2", "aten::convolution_backward"),
    ("b2", "backward", 10.0, ["g2", "a1"], ["g1"], None, None, "relu1", "aten::threshold_backward"),
    ("b1", "backward", 10.0, ["g1", "x", "w1"], ["gw1"], None, None, "conv1", "aten::convolution_backward"),
    ("u1", "optimizer", 1.0, ["gw1"], [], ["w1"], None, "conv1", "aten::_fused_adam_"),
    ("u2", "optimizer", 1.0, ["gw2"], [], ["w2"], None, "conv2", "aten::_fused_adam_"),
    ("u3", "optimizer", 1.0, ["gw3"], [], ["w3"], None, "fc", "aten::_fused_adam_"),
    ("u4", "optimizer", 1.0, ["gw4"], [], ["w4"], None, "bn", "aten::_fused_adam_"),
]


@pytest.fixture
def cnn():
    return layered_profile(CNN_TENSORS, CNN_OPS, "small-cnn")


def actions_of(profile, mode, budget=10**6, hardware=TEST_MACHINE):
    return plan_vdnn(profile, hardware, budget, mode=mode).actions


def offloaded(actions):
    return [a.tensor for a in actions if a.kind == "offload"]


def prefetches(actions):
    return {a.tensor: a for a in actions if a.kind == "prefetch"}


def check_valid(profile, actions, budget=10**6, hardware=TEST_MACHINE):
    result = simulate(profile, Plan(profile.name, tuple(actions)), hardware, budget)
    assert result.valid, f"{result.rule}: {result.reason}"
    return result


def test_layer_kinds_are_recognised_from_op_names():
    assert op_kind("aten::cudnn_convolution") == "conv"
    assert op_kind("aten::conv2d") == "conv"
    assert op_kind("aten::addmm") == "fc"
    assert op_kind("aten::mm") == "fc"
    assert op_kind("aten::linear") == "fc"
    assert op_kind("aten::bmm") == "other"          # attention's batched product is not a layer of its own
    assert op_kind("aten::_softmax") == "softmax"
    assert op_kind("aten::cross_entropy_loss") == "softmax"
    assert op_kind("aten::relu") == "activation"
    assert op_kind("aten::gelu") == "activation"
    assert op_kind("aten::leaky_relu") == "activation"
    assert op_kind("aten::native_batch_norm") == "other"
    assert op_kind("aten::mse_loss") == "other"     # so the loss below is skipped for being last


def test_conv_offloads_only_convolution_inputs(cnn):
    # conv1 reads only the persistent input x; conv2 reads a2. Nothing else qualifies.
    actions = actions_of(cnn, "conv")
    assert offloaded(actions) == ["a2"]
    check_valid(cnn, actions)


def test_all_skips_activation_softmax_fc_and_last_layer_inputs(cnn):
    # a1 (relu1: activation), a4 (fc), a5 (softmax) and a6 (loss: the last layer, kind
    # "other") stay; a2 (conv2) and a3 (bn) go.
    actions = actions_of(cnn, "all")
    assert sorted(offloaded(actions)) == ["a2", "a3"]
    check_valid(cnn, actions)


def test_offload_is_issued_when_the_layer_starts(cnn):
    # conv2 starts after f2 (which produced a2); bn starts after f3 (which produced a3).
    after = {a.tensor: a.after for a in actions_of(cnn, "all") if a.kind == "offload"}
    assert after == {"a2": "f2", "a3": "f3"}


def test_prefetch_order_follows_the_backward_layer_order(cnn):
    # Backward starts with loss (b7): the nearest earlier offloaded layer is bn (index 3),
    # so a3 is fetched after f7, the op before b7. softmax (b6) starts next: bn is taken,
    # conv2 (index 2) is next, so a2 is fetched after b7. Each lands before its first
    # backward use (b4, b3).
    actions = actions_of(cnn, "all")
    fetched = prefetches(actions)
    assert (fetched["a3"].after, fetched["a3"].before) == ("f7", "b4")
    assert (fetched["a2"].after, fetched["a2"].before) == ("b7", "b3")
    order = [a.tensor for a in actions if a.kind == "prefetch"]
    assert order == ["a3", "a2"]
    check_valid(cnn, actions)


# A chain with two offloaded convolution layers (conv mode), indices:
#   0 stem (a0)   1 convA (reads a0)   2 reluA   3 convB (reads a2)   4 reluB   5 loss
# Backward: loss (bl) finds convB; reluB (brB) searches index 3, convB, already
# prefetched and a convolution: the search stops there; convB (bcB) then finds convA.
CHAIN_TENSORS = {
    "x": (10, "input"), "wa": (10, "weight"), "wb": (10, "weight"),
    "a0": (100, "activation"), "a1": (100, "activation"), "a2": (100, "activation"),
    "a3": (100, "activation"), "a4": (100, "activation"), "l": (1, "activation"),
    "g4": (100, "gradient"), "g3": (100, "gradient"), "g2": (100, "gradient"), "g1": (100, "gradient"),
    "g0": (100, "gradient"), "gwa": (10, "gradient"), "gwb": (10, "gradient"),
}
CHAIN_OPS = [
    ("fs", "forward", 10.0, ["x"], ["a0"], None, None, "stem", "aten::add"),
    ("fa", "forward", 10.0, ["a0", "wa"], ["a1"], None, None, "convA", "aten::cudnn_convolution"),
    ("fra", "forward", 10.0, ["a1"], ["a2"], None, None, "reluA", "aten::relu"),
    ("fb", "forward", 10.0, ["a2", "wb"], ["a3"], None, None, "convB", "aten::cudnn_convolution"),
    ("frb", "forward", 10.0, ["a3"], ["a4"], None, None, "reluB", "aten::relu"),
    ("fl", "forward", 10.0, ["a4"], ["l"], None, None, "loss", "aten::mse_loss"),
    ("bl", "backward", 10.0, ["l", "a4"], ["g4"], None, None, "loss", "aten::mse_loss_backward"),
    ("brb", "backward", 10.0, ["g4", "a4"], ["g3"], None, None, "reluB", "aten::threshold_backward"),
    ("bcb", "backward", 10.0, ["g3", "a2", "wb"], ["g2", "gwb"], None, None, "convB", "aten::convolution_backward"),
    ("bra", "backward", 10.0, ["g2", "a2"], ["g1"], None, None, "reluA", "aten::threshold_backward"),
    ("bca", "backward", 10.0, ["g1", "a0", "wa"], ["g0", "gwa"], None, None, "convA", "aten::convolution_backward"),
    ("ua", "optimizer", 1.0, ["gwa"], [], ["wa"], None, "convA", "aten::_fused_adam_"),
    ("ub", "optimizer", 1.0, ["gwb"], [], ["wb"], None, "convB", "aten::_fused_adam_"),
]


def test_prefetch_search_stops_at_a_convolution_layer():
    profile = layered_profile(CHAIN_TENSORS, CHAIN_OPS, "conv-chain")
    actions = actions_of(profile, "conv")
    fetched = prefetches(actions)
    assert (fetched["a2"].after, fetched["a2"].before) == ("fl", "bcb")
    # Not after bl (reluB's backward start), which a search past convB would give.
    assert (fetched["a0"].after, fetched["a0"].before) == ("brb", "bca")
    check_valid(profile, actions)


def test_without_modules_each_op_is_a_layer(cnn):
    profile = layered_profile(CNN_TENSORS, CNN_OPS, "small-cnn-flat", modules=False)
    draft = plan_vdnn(profile, TEST_MACHINE, 10**6, mode="all")
    assert draft.notes["layers"].startswith("one op per layer")
    assert sorted(offloaded(draft.actions)) == ["a2", "a3"]
    check_valid(profile, draft.actions)


# For vDNN_dyn: the peak is the loss op's 300-byte workspace at the end of forward, so
# offloading forward inputs lowers it. Layers: 0 stem (x: persistent) 1 conv (s)
# 2 bn (c, kind "other") 3 relu (n: activation, and never read in backward) 4 loss (r: last).
# On a 1 GB/s machine every copy takes 0.1 us, within the 10 us ops.
#   none: at fl  30 (weights, input) + s 100 + c 100 + r 10 + l 1 + ws 300 = 541
#   conv: s is away at fl:                                   541 - 100 = 441
#   all:  s and c are away at fl:                            541 - 200 = 341
# In backward the workspace is gone, and vDNN brings c back after fl and s after bl:
# at most 30 + r 10 + l 1 + gr 10 + c 100 + s 100 = 251 (all), below each forward peak.
DYN_TENSORS = {
    "x": (10, "input"), "wc": (10, "weight"), "wn": (10, "weight"),
    "s": (100, "activation"), "c": (100, "activation"), "n": (100, "activation"),
    "r": (10, "activation"), "l": (1, "activation"),
    "gr": (10, "gradient"), "gn": (10, "gradient"), "gc": (10, "gradient"), "gs": (10, "gradient"),
    "gwc": (10, "gradient"), "gwn": (10, "gradient"),
}
DYN_OPS = [
    ("fs", "forward", 10.0, ["x"], ["s"], None, None, "stem", "aten::add"),
    ("fc", "forward", 10.0, ["s", "wc"], ["c"], None, None, "conv", "aten::cudnn_convolution"),
    ("fn", "forward", 10.0, ["c", "wn"], ["n"], None, None, "bn", "aten::native_batch_norm"),
    ("fr", "forward", 10.0, ["n"], ["r"], None, None, "relu", "aten::relu"),
    ("fl", "forward", 10.0, ["r"], ["l"], None, 300, "loss", "aten::mse_loss"),
    ("bl", "backward", 10.0, ["l", "r"], ["gr"], None, None, "loss", "aten::mse_loss_backward"),
    ("br", "backward", 10.0, ["gr", "r"], ["gn"], None, None, "relu", "aten::threshold_backward"),
    ("bn", "backward", 10.0, ["gn", "c", "wn"], ["gc", "gwn"], None, None, "bn", "aten::native_batch_norm_backward"),
    ("bc", "backward", 10.0, ["gc", "s", "wc"], ["gs", "gwc"], None, None, "conv", "aten::convolution_backward"),
    ("uc", "optimizer", 1.0, ["gwc"], [], ["wc"], None, "conv", "aten::_fused_adam_"),
    ("un", "optimizer", 1.0, ["gwn"], [], ["wn"], None, "bn", "aten::_fused_adam_"),
]
FAST_MACHINE = machine(h2d=1.0, d2h=1.0)


def test_dyn_keeps_the_first_of_none_conv_all_that_fits():
    profile = layered_profile(DYN_TENSORS, DYN_OPS, "dyn")
    assert profile.peak_bytes == 541
    choices = {}
    for budget in (541, 441, 341):
        draft = plan_vdnn(profile, FAST_MACHINE, budget, mode="dyn")
        choices[budget] = (draft.notes["dyn_choice"], sorted(offloaded(draft.actions)))
        result = check_valid(profile, draft.actions, budget, FAST_MACHINE)
        assert result.feasible and result.peak_bytes <= budget
    assert choices == {541: ("none", []), 441: ("conv", ["s"]), 341: ("all", ["c", "s"])}


def test_dyn_returns_all_when_nothing_fits():
    profile = layered_profile(DYN_TENSORS, DYN_OPS, "dyn")
    draft = plan_vdnn(profile, FAST_MACHINE, 340, mode="dyn")
    assert sorted(offloaded(draft.actions)) == ["c", "s"]
    assert draft.notes["dyn_choice"].startswith("all")
    assert not check_valid(profile, draft.actions, 340, FAST_MACHINE).feasible


# ----------------------------------------------------------------------------- shipped profiles

PROFILES = ["synth-transformer-l12-b16-s1024", "synth-cnn-l16-w128-b64-s224", "synth-mlp-l16-w8192-b1024"]
HW = load_hardware("a100-40gb-pcie4")


@pytest.fixture(scope="module")
def shipped():
    return {name: open_profile(name) for name in PROFILES}


def test_shipped_cnn_offloads_convolution_inputs_and_fits_at_30_percent(shipped):
    profile = shipped["synth-cnn-l16-w128-b64-s224"]
    budget = int(profile.peak_bytes * 0.3)
    planned = make_plan(profile, HW, budget, "vdnn", {"mode": "dyn"})
    assert planned.result.ok
    conv_inputs = {t for op in profile.ops if op.phase == "forward" and "convolution" in op.name
                   for t in op.inputs if not profile.tensor_by_id[t].persistent}
    moved = {a.tensor for a in planned.plan.actions if a.kind == "offload"}
    assert conv_inputs & moved == {t for t in conv_inputs if profile.consumers[t] and
                                   any(profile.ops[c].phase == "backward" for c in profile.consumers[t])}
