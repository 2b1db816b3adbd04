"""zero-offload and zero-infinity on a two-layer mixed-precision step made by hand.

Per weight w (fp16, 100 B): the gradient g (100 B), the fp32 master M and the two Adam
states m, v (200 B each); ``adam`` reads g and updates M, m, v; ``cast`` makes the new
fp16 weight n from M; ``copy`` writes n into w: the structure ``swapplan trace --amp``
gives (optim::adamw_foreach, optim::cast_master, optim::copy_param).
"""
from __future__ import annotations

import json

import pytest

from planner.core.api import make_plan
from planner.offload.zero import by_readiness, optimizer_ops
from simulator.errors import InputError
from tests.conftest import TWO_LAYER_OPS, TWO_LAYER_TENSORS, make_profile
from tests.engine_helpers import machine

TENSORS = {"x": (10, "input"), "w1": (100, "weight"), "w2": (100, "weight"),
           "a1": (40, "activation"), "a2": (40, "activation"), "l": (1, "activation"), "da1": (40, "gradient"),
           "g1": (100, "gradient"), "g2": (100, "gradient"),
           "M1": (200, "optimizer_state"), "M2": (200, "optimizer_state"), "m1": (200, "optimizer_state"),
           "v1": (200, "optimizer_state"), "m2": (200, "optimizer_state"), "v2": (200, "optimizer_state"),
           "n1": (100, "other"), "n2": (100, "other")}
OPS = [("f1", "forward", 10.0, ["x", "w1"], ["a1"]),
       ("f2", "forward", 10.0, ["a1", "w2"], ["a2"]),
       ("loss", "forward", 1.0, ["a2"], ["l"]),
       ("b2", "backward", 20.0, ["l", "a1", "w2"], ["g2", "da1"]),
       ("b1", "backward", 200.0, ["da1", "x", "w1"], ["g1"]),
       ("adam1", "optimizer", 5.0, ["g1"], [], ["M1", "m1", "v1"]),
       ("adam2", "optimizer", 5.0, ["g2"], [], ["M2", "m2", "v2"]),
       ("cast1", "optimizer", 1.0, ["M1"], ["n1"]),
       ("cast2", "optimizer", 1.0, ["M2"], ["n2"]),
       ("copy1", "optimizer", 1.0, ["n1"], [], ["w1"]),
       ("copy2", "optimizer", 1.0, ["n2"], [], ["w2"])]
CPU = {"model": "test-cpu", "tflops": 1, "mem_gbps": 0.01, "launch_us": 5}


def amp_step():
    return make_profile(TENSORS, OPS, "amp-two-layer")


def hw(**kw):
    return machine(cpu=CPU, **kw)


def planned(profile, name, budget=10**6, hardware=None, **params):
    out = make_plan(profile, hardware or hw(), budget, name, params)
    return out, out.plan.to_dict()


def test_offload_puts_the_optimizer_on_the_cpu_and_keeps_the_copy_on_the_gpu():
    out, plan = planned(amp_step(), "zero-offload")
    assert out.result.ok, out.result.reason
    assert sorted(plan["cpu_ops"]) == ["adam1", "adam2", "cast1", "cast2"]
    assert plan["initial"] == {t: "host" for t in ("M1", "M2", "m1", "m2", "v1", "v2")}
    kinds = {(a["kind"], a["tensor"]) for a in plan["actions"]}
    # gradients go down as backward makes them, the new weights come up
    assert {("offload", "g1"), ("offload", "g2"), ("prefetch", "n1"), ("prefetch", "n2")} <= kinds
    down = {a["tensor"]: a["after"] for a in plan["actions"] if a["kind"] == "offload"}
    assert down == {"g2": "b2", "g1": "b1"}
    # the weights themselves never leave the GPU
    assert not {t for k, t in kinds if t in ("w1", "w2")}
    assert out.result.cpu_us > 0 and out.plan.predicted["lower_bound_us"] is None


def test_reorder_overlaps_the_cpu_step_with_backward():
    """adam2 can start once g2 is down, while b1 (200 us) still runs: the reordered
    schedule puts it right after b2, and the plan is faster than the profile's order."""
    profile = amp_step()
    cpu = optimizer_ops(profile, copies_on_cpu=False)
    order = [profile.ops[i].id for i in by_readiness(profile, cpu)]
    assert order[:6] == ["f1", "f2", "loss", "b2", "adam2", "cast2"]
    # the copies go last, in the order their new weights are made
    assert order[-2:] == ["copy2", "copy1"]
    out, plan = planned(profile, "zero-offload")
    assert plan["schedule"] == order and out.plan.planner.notes["variant"]["reorder"] is True
    from planner.offload.zero import Variant, _try
    from simulator.api import Simulator
    _, _, in_order = _try(Simulator(profile, hw()), 10**6, False, Variant(reorder=False))
    assert out.result.iteration_us < in_order.iteration_us


def test_new_weights_can_come_up_after_backward():
    """new_late: n2, made on the CPU while b1 runs, is copied up only after b1 (the last
    backward op), so that it takes no GPU memory during backward."""
    from planner.offload.zero import Variant, _try
    from simulator.api import Simulator
    _, (actions, _, _, _), result = _try(Simulator(amp_step(), hw()), 10**6, False, Variant(new_late=True))
    assert result.ok, result.reason
    up = {a.tensor: (a.after, a.before) for a in actions if a.kind == "prefetch"}
    assert up == {"n2": ("b1", "copy2"), "n1": ("cast1", "copy1")}
    _, (actions, _, _, _), _ = _try(Simulator(amp_step(), hw()), 10**6, False, Variant(new_late=False))
    assert {a.tensor: a.after for a in actions if a.kind == "prefetch"}["n2"] == "cast2"


def test_infinity_keeps_state_on_the_ssd_and_weights_in_host():
    out, plan = planned(amp_step(), "zero-infinity", ahead=1)
    assert out.result.ok, out.result.reason
    assert set(plan["cpu_ops"]) == {"adam1", "adam2", "cast1", "cast2", "copy1", "copy2"}
    assert {t: plan["initial"][t] for t in ("M1", "m1", "v2", "w1", "w2")} == \
        {"M1": "ssd", "m1": "ssd", "v2": "ssd", "w1": "host", "w2": "host"}
    by_kind = {}
    for a in plan["actions"]:
        by_kind.setdefault(a["kind"], []).append(a["tensor"])
    # every state is loaded once and stored once; each weight fetched for forward and backward
    assert sorted(by_kind["load"]) == sorted(by_kind["store"]) == ["M1", "M2", "m1", "m2", "v1", "v2"]
    assert sorted(by_kind["prefetch"]) == ["w1", "w1", "w2", "w2"]
    assert sorted(by_kind["drop"]) == ["w1", "w1", "w2", "w2"]
    stores = {a["tensor"]: a["after"] for a in plan["actions"] if a["kind"] == "store"}
    assert stores["M1"] == "cast1" and stores["m1"] == "adam1"   # after the last CPU use
    assert out.result.ssd_peak_bytes == 1200


def test_infinity_can_spill_gradients_to_the_ssd():
    """grads_to=ssd: each gradient goes to NVMe after backward makes it and is loaded into
    host memory for its step; the default (room in host memory) keeps them in host."""
    from planner.offload.zero import Variant, _try
    from simulator.api import Simulator
    profile = amp_step()
    _, (actions, _, _, _), result = _try(Simulator(profile, hw()), 10**6, True, Variant(ahead=1, grads_to="ssd"))
    assert result.ok, result.reason
    down = {a.tensor: a.to for a in actions if a.kind == "offload"}
    assert down == {"g1": "ssd", "g2": "ssd"}
    assert {"g1", "g2"} <= {a.tensor for a in actions if a.kind == "load"}
    _, plan = planned(profile, "zero-infinity")
    assert {a["tensor"]: a["to"] for a in plan["actions"] if a["kind"] == "offload"} == {"g1": "host", "g2": "host"}


def test_fp32_adam_updates_the_weight_after_it_went_down():
    """Without mixed precision, adam updates the weight: it goes down after backward's
    last read and comes back by the end of the iteration."""
    profile = make_profile(TWO_LAYER_TENSORS, TWO_LAYER_OPS, "two-layer")
    out, plan = planned(profile, "zero-offload")
    assert out.result.ok, out.result.reason
    assert sorted(plan["cpu_ops"]) == ["u1", "u2"]
    moves = [(a["kind"], a["tensor"], a.get("after"), a.get("before")) for a in plan["actions"]]
    assert ("offload", "w2", "b2", None) in moves and ("prefetch", "w2", "u2", None) in moves


def test_chen_segments_are_added_when_activations_do_not_fit():
    """A long chain of big activations over a small budget: no layout fits without
    recomputation; with it, one does."""
    layers = 12
    tensors = {"x": (10, "input"), "w": (10, "weight"), "g": (10, "gradient"), "M": (20, "optimizer_state")}
    ops = []
    prev = "x"
    for i in range(layers):
        tensors[f"a{i}"] = (100, "activation")
        ops.append((f"f{i}", "forward", 10.0, [prev, "w"], [f"a{i}"]))
        prev = f"a{i}"
    grad = prev
    for i in reversed(range(layers)):
        tensors[f"d{i}"] = (100, "gradient")
        ops.append((f"b{i}", "backward", 10.0, [grad, f"a{i}", "w"], [f"d{i}"]))
        grad = f"d{i}"
    ops.append(("gsum", "backward", 1.0, [grad], ["g"]))
    ops.append(("adam", "optimizer", 1.0, ["g"], [], ["M", "w"]))
    profile = make_profile(tensors, ops, "deep")
    out, plan = planned(profile, "zero-offload", budget=800)
    assert out.result.ok, out.result.reason
    assert out.plan.planner.notes["chen_segments"] is not None
    assert any(a["kind"] == "recompute" for a in plan["actions"])
    without = make_plan(profile, hw(), 800, "zero-offload", {"recompute": False})
    assert without.result.valid and not without.result.feasible


def test_deterministic():
    first = json.dumps(planned(amp_step(), "zero-infinity")[1], sort_keys=True)
    again = json.dumps(planned(amp_step(), "zero-infinity")[1], sort_keys=True)
    assert first == again


def test_a_machine_without_a_cpu_is_a_one_line_error():
    with pytest.raises(InputError, match="cpu.*section"):
        make_plan(amp_step(), machine(), 10**6, "zero-offload")
