"""Issue 11's fixes on hand-made graphs: in-place updates in vdnn and lms, the g10 link
time of rules v2, parameter ranges, and the planner report."""
from __future__ import annotations

import pytest

from planner.core.api import make_plan
from planner.swap._g10_links import LinkTime
from planner.swap.lms import plan_lms
from planner.core.registry import get_planner
from planner.swap.vdnn import plan_vdnn
from simulator.errors import InputError
from simulator.plan import offload
from tests.conftest import make_profile
from tests.engine_helpers import machine
from tests.test_planner_vdnn import layered_profile

import numpy as np

# x -> f1 -> a (100) -> relu_ (in place, f2) -> f3 reads a -> ... -> b1 reads a
INPLACE_TENSORS = {"w": (10, "weight"), "a": (100, "activation"), "c": (10, "activation"),
                   "d": (10, "activation"), "e": (10, "activation"), "g": (10, "gradient"), "h": (10, "gradient")}
INPLACE_OPS = [
    ("f1", "forward", 10.0, ["w"], ["a"], None, None, "conv1", "aten::cudnn_convolution"),
    ("f2", "forward", 10.0, [], [], ["a"], None, "relu1", "aten::relu_"),
    ("f3", "forward", 10.0, ["a", "w"], ["c"], None, None, "conv2", "aten::cudnn_convolution"),
    ("f4", "forward", 10.0, ["c"], ["d"], None, None, "conv3", "aten::cudnn_convolution"),
    ("f5", "forward", 10.0, ["d"], ["e"], None, None, "conv4", "aten::cudnn_convolution"),
    ("b5", "backward", 10.0, ["e"], ["g"], None, None, "conv4", "aten::convolution_backward"),
    ("b3", "backward", 10.0, ["g", "c"], ["h"], None, None, "conv3", "aten::convolution_backward"),
    ("b2", "backward", 10.0, ["h", "a"], [], None, None, "conv2", "aten::convolution_backward"),
]


def test_vdnn_offloads_a_tensor_updated_in_place_after_its_last_update():
    # a is conv2's input feature map, updated in place by relu_ (f2): offloaded after f2,
    # not before it (the update would fall in the offload's window, R11)
    profile = layered_profile(INPLACE_TENSORS, INPLACE_OPS, "inplace")
    draft = plan_vdnn(profile, machine(), 10**6, mode="conv")
    assert offload("a", "f2", "host") in draft.actions
    # 125 B: during f4 (w, a, c, d = 130 B) a must be away; the plan runs in that budget
    planned = make_plan(profile, machine(h2d=1.0, d2h=1.0), 125, "vdnn", {"mode": "conv"})
    assert planned.result.ok and planned.result.peak_bytes <= 125, planned.result.reason


def test_lms_offloads_a_tensor_updated_in_place_after_its_last_update():
    profile = make_profile(INPLACE_TENSORS, [spec[:-2] for spec in INPLACE_OPS], "inplace")
    draft = plan_lms(profile, machine(h2d=1.0, d2h=1.0), 10**6, swapout_threshold=2, swapin_ahead=1)
    offloads = [a for a in draft.actions if a.kind == "offload"]
    assert offload("a", "f2", "host") in offloads and offload("a", "f1", "host") not in offloads
    planned = make_plan(profile, machine(h2d=1.0, d2h=1.0), 125, "lms")
    assert planned.result.ok and planned.plan.planner.notes["swapped_tensors"] >= 1


def test_g10_link_time_shares_pcie_by_bandwidth():
    # An SSD offload at 0.5 B/us over PCIe at 1 B/us uses half of PCIe's time; the SSD
    # link whole. A host copy uses PCIe whole. Half duplex adds the copy engine, whole.
    # The links and their order are the simulator's routes (transfer_links).
    hw = machine(ssd_write=0.0005)
    links = LinkTime(np.array([10.0, 10.0]), hw)
    assert links.links("offload", "ssd") == (("pcie_up", 2.0), ("ssd_write_link", 1.0))
    assert links.links("offload", "host") == (("pcie_up", 1.0),)
    # a 10 us SSD copy in kernel 0 leaves PCIe 5 us of its 10 for a host copy
    done = links.forward(links.links("offload", "ssd"), 0, 2, 10.0)
    links.take(done[2])
    assert links.left["pcie_up"][0] == pytest.approx(5.0) and links.left["ssd_write_link"][0] == pytest.approx(0.0)
    half = LinkTime(np.array([10.0]), machine(duplex="half"))
    assert half.links("prefetch", "ssd") == (("ssd_read_link", 1.0), ("pcie_down", 2.0), ("engine", 1.0))


@pytest.mark.parametrize("planner, param, value, words", [
    ("capuchin", "feedback_step", "-1", "out of range (expected 0 to 1)"),
    ("capuchin", "feedback_rounds", "-5", "out of range (expected 0 to 1000)"),
    ("lms", "swapout_threshold", "-7", "out of range (expected >= 0 or -1)"),
    ("g10", "rule_factor", "nan", "expected a finite float"),
    ("g10", "eager_limit", "inf", "expected a finite float"),
])
def test_parameters_outside_their_range_are_input_errors(planner, param, value, words):
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
        get_planner(planner).resolve({param: value})
    assert get_planner("lms").resolve({"swapout_threshold": "-1"})["swapout_threshold"] == -1


def test_the_plan_carries_the_planner_report():
    profile = make_profile(INPLACE_TENSORS, [spec[:-2] for spec in INPLACE_OPS], "inplace")
    planned = make_plan(profile, machine(h2d=1.0, d2h=1.0), 125, "lms")
    info = planned.plan.planner
    assert info.status == "heuristic" and info.notes["levels"] > 0 and info.bound == "swap"
    data = planned.plan.to_dict()["planner"]
    assert data["notes"] == info.notes and data["lower_bound_us"] == info.lower_bound_us
    assert planned.plan.predicted["gap_to_bound"] == pytest.approx(
        planned.result.iteration_us / info.lower_bound_us - 1)


def test_g10_places_transfers_in_the_link_time_left():
    # kernels of 4, 2, 0 (taken), 6 us: a 7 us copy from kernel 0 ends in kernel 3 (4 + 2 + 0 + 1),
    # half of it done by kernel 0 (3.5 <= 4); placed as late as possible before kernel 4
    # it starts in kernel 1 (1 + 0 + 6) and its last half runs from kernel 3
    links = LinkTime(np.array([4.0, 2.0, 2.0, 6.0]), machine())
    route = links.links("offload", "host")
    links.take(links.forward(route, 2, 3, 2.0)[2])          # kernel 2's link time is gone
    end, half, ahead = links.forward(route, 0, 4, 7.0)
    assert (end, half) == (3, 0) and list(ahead.used) == pytest.approx([4.0, 2.0, 0.0, 1.0])
    start, late_half, behind = links.backward(route, 0, 4, 7.0)
    assert (start, late_half) == (1, 3) and list(behind.used) == pytest.approx([1.0, 0.0, 6.0])
    assert links.forward(route, 0, 4, 12.1) is None and links.backward(route, 1, 4, 9.0) is None
    links.take(ahead)
    assert list(links.left["pcie_up"][:4]) == pytest.approx([0.0, 0.0, 0.0, 5.0])
    assert links.forward(route, 0, 4, 5.0)[0] == 3          # the sums follow what was taken
    links.give_back(ahead)
    assert links.backward(route, 0, 4, 7.0)[0] == 1


def test_capuchin_replans_leaning_to_swaps_where_unsure_and_keeps_the_faster():
    # bert-base on an A100 at 40 GiB: the stall estimate prices swaps high enough that
    # phase 2 recomputes where swaps hide; the simulator prefers the swap-leaning replan
    from planner.swap_recompute.capuchin import _plan
    from simulator.api import Simulator
    from simulator.catalog import open_profile, shipped_profile_paths
    from simulator.hardware import load_hardware
    path = next(p for p in shipped_profile_paths() if "bert-base" in p.name)
    profile, hw = open_profile(path), load_hardware("a100-40gb-pcie4")
    budget = 40 * 2**30
    first, first_result, unsure = _plan(Simulator(profile, hw), budget, True, True, 1.0, 10, 0.05)
    assert unsure > 0 and first_result.ok
    planned = make_plan(profile, hw, budget, "capuchin")
    notes = planned.plan.planner.notes
    assert notes["judged_by_simulation"] == "swap-leaning replan"
    assert planned.result.iteration_us < first_result.iteration_us * 0.99


def test_vdnn_falls_back_to_every_layer_when_its_rules_do_not_fit():
    # GPT-2 at 50%: vDNN_all never moves fully-connected inputs nor what the MLP keeps for
    # its own backward, and does not fit; the fallback does, and says so
    from simulator.catalog import open_profile
    from simulator.hardware import load_hardware
    profile, hw = open_profile("gpt2-b48-s1024"), load_hardware("a100-40gb-pcie4")
    budget = profile.peak_bytes // 2
    strict = make_plan(profile, hw, budget, "vdnn", {"fallback": "false"})
    assert not strict.result.ok and strict.plan.planner.status == "infeasible"
    planned = make_plan(profile, hw, budget, "vdnn")
    assert planned.result.ok and planned.plan.planner.status == "fallback"
    assert len(planned.plan.actions) > len(strict.plan.actions)
