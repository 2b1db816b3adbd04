"""The flashneuron planner (FlashNeuron phase 1, FAST'21): which tensors it offloads, when
it stops, where they go and when they come back; and every shipped profile at
90/70/50/30% of its peak.

Machine (tests/engine_helpers.py): PCIe 1 B/us each way, SSD 0.5 B/us, no latency: a
100 B tensor takes 200 us to or from the SSD.
"""
from __future__ import annotations

import pytest

from planner.shared.facts import budget_floor
from planner.core.api import make_plan
from planner.swap.flashneuron import activation_budget, choose_offloads, loss_position, offload_actions, offloadable
from simulator.api import Simulator
from simulator.hardware import hardware_from_dict
from simulator.plan import Plan, offload, prefetch
from tests.conftest import make_profile
from tests.engine_helpers import machine

# A training step; every op takes 100 us.
#   forward:  f1: x, w -> a1 (100)   f2: a1 -> a2 (100)   f3: a2 -> s (40)
#             f4: s -> a4 (100)      loss: a4 -> l (1)
#   backward: b4: l, a4 -> d4        bx1: d4 -> e1        bx2: e1 -> e2
#             b3: e2, a2 -> d3       b2: d3, a1 -> d2     b1: d2, x, w -> g
#   optimizer: u: g updates w
# Forward tensors used after the loss: a1 (last touched by f2, next by b2), a2 (f3, b3),
# a4 (loss, b4: no op in between, so nothing could run while it is away) and l (made by
# the loss, read by b4: the same). s dies in forward; d*, e*, g are made in backward.
# Offloadable: a1 then a2 (kernel order), 200 B in all.
# Persistent: w 10 + x 1 = 11 B. Largest non-persistent working set: f2, a1 + a2 = 200 B.
# Room for activations = budget - 11 - 200.
STEP = {"w": (10, "weight"), "x": (1, "input"), "a1": (100, "activation"), "a2": (100, "activation"),
        "s": (40, "activation"), "a4": (100, "activation"), "l": (1, "activation"),
        "d4": (10, "gradient"), "e1": (10, "gradient"), "e2": (10, "gradient"), "d3": (10, "gradient"),
        "d2": (10, "gradient"), "g": (10, "gradient")}
STEP_OPS = [
    ("f1", "forward", 100.0, ["x", "w"], ["a1"]),
    ("f2", "forward", 100.0, ["a1"], ["a2"]),
    ("f3", "forward", 100.0, ["a2"], ["s"]),
    ("f4", "forward", 100.0, ["s"], ["a4"]),
    ("loss", "forward", 100.0, ["a4"], ["l"]),
    ("b4", "backward", 100.0, ["l", "a4"], ["d4"]),
    ("bx1", "backward", 100.0, ["d4"], ["e1"]),
    ("bx2", "backward", 100.0, ["e1"], ["e2"]),
    ("b3", "backward", 100.0, ["e2", "a2"], ["d3"]),
    ("b2", "backward", 100.0, ["d3", "a1"], ["d2"]),
    ("b1", "backward", 100.0, ["d2", "x", "w"], ["g"]),
    ("u", "optimizer", 100.0, ["g"], [], ["w"]),
]


def step():
    return make_profile(STEP, STEP_OPS, "step")


def offloaded(planned):
    return [a.tensor for a in planned.plan.actions if a.kind == "offload"]


def test_only_forward_activations_used_after_the_loss_are_offloaded():
    # At the floor (11 + 200 = 211) the room is 0: every offloadable tensor goes, and
    # nothing else (not s, a4, l, the gradients or the weights).
    profile = step()
    assert budget_floor(profile, moves_persistent=False)[0] == 211
    planned = make_plan(profile, machine(), 211, "flashneuron")
    assert offloaded(planned) == ["a1", "a2"]
    assert planned.result.valid


@pytest.mark.parametrize("budget, by_rule, expected", [(411, 0, []), (311, 1, ["a1"]), (310, 2, ["a1"])])
def test_offloading_stops_once_the_rest_fits(budget, by_rule, expected):
    # room = budget - 211. 411: room 200 holds a1 + a2, nothing moves. 311: room 100; a1
    # (first in kernel order) goes and the rest, a2 (100), fits. 310: room 99, so the rule
    # offloads both; but the largest working set it reserves on top is not all needed at
    # once, and the simulator runs the plan with a1 alone in 310 B: only a1 goes.
    planned = make_plan(step(), machine(), budget, "flashneuron")
    assert offloaded(planned) == expected
    assert planned.plan.planner.notes["offloaded_by_rule"] == by_rule
    assert planned.result.ok


def test_offloads_go_to_the_ssd_after_the_last_touch_before_the_loss():
    planned = make_plan(step(), machine(), 211, "flashneuron")
    offloads = [a for a in planned.plan.actions if a.kind == "offload"]
    assert offloads == [offload("a1", "f2", "ssd"), offload("a2", "f3", "ssd")]
    assert all(a.source == "ssd" for a in planned.plan.actions if a.kind == "prefetch")
    assert planned.result.bytes_ssd_write == 200 and planned.result.bytes_ssd_read == 200


def test_prefetches_are_serialised_and_as_late_as_the_ssd_allows():
    # Budget 310: room 99, both go. Each prefetch takes 200 us. Counting back from the last
    # use: a1 must end by b2 (starts 900), so it starts at 700: issued after bx1 (ends
    # 700). a2 must end by b3 (800) and before a1 starts (700): it starts at 500, issued
    # after the loss (ends 500). Memory allows both (at most 11 + 120 + 100 = 231 B).
    # Neither use waits: a2 arrives at 700, a1 at 900.
    profile = step()
    loss = loss_position(profile)
    chosen = choose_offloads(offloadable(profile, loss), activation_budget(profile, 310))
    actions = offload_actions(profile, machine(), chosen, "ssd", loss, 310)
    prefetches = [a for a in actions if a.kind == "prefetch"]
    assert prefetches == [prefetch("a2", "loss", "b3", "ssd"), prefetch("a1", "bx1", "b2", "ssd")]
    result = Simulator(profile, machine()).simulate(Plan(profile.name, tuple(actions)), 310)
    assert result.ok and result.stall_data_us == 0.0


def test_a_prefetch_waits_until_memory_allows():
    # Budget 211. a2 back during b4 would need 11 + (l + a4 + d4) 111 + 100 = 222 B, so it
    # is issued after b4 (600-800, in time for b3). a1 back during b3 would need 11 + (e2 +
    # a2 + d3) 120 + 100 = 231 B, so it is issued after b3: 900-1100, and b2 waits 200 us.
    planned = make_plan(step(), machine(), 211, "flashneuron")
    prefetches = [a for a in planned.plan.actions if a.kind == "prefetch"]
    assert prefetches == [prefetch("a2", "b4", "b3", "ssd"), prefetch("a1", "b3", "b2", "ssd")]
    result = planned.result
    assert result.ok and result.peak_bytes <= 211
    assert result.stall_data_us == 200.0


def test_without_an_ssd_activations_go_to_host_memory():
    no_ssd = hardware_from_dict({
        "name": "no-ssd", "gpu": {"memory": "1GiB", "fp32_tflops": 1, "fp16_tflops": 1, "hbm_gbps": 1},
        "pcie": {"h2d_gbps": 0.001, "d2h_gbps": 0.001}, "host": {"memory": "1GiB"}})
    planned = make_plan(step(), no_ssd, 211, "flashneuron")
    assert offloaded(planned) == ["a1", "a2"]
    assert {a.to or a.source for a in planned.plan.actions} == {"host"}
    assert planned.result.ok
