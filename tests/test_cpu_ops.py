"""Ops on the CPU (R24-R28), hand-computed on a ZeRO-Offload-shaped step.

The step: f and b on the GPU make the gradient g of the weight w; ``adam`` reads g and
updates the fp32 master m and the state s; ``cast`` makes the new low-precision weight n
from m; ``copy`` writes n into w. The test machine moves 1 byte/us over PCIe, 0.5 byte/us
to and from the SSD, and its CPU moves 10 bytes/us with 5 us per op (no FLOPs counted:
the ops have none). So on the CPU ``adam`` takes 5 + (100 + 2*(100 + 100)) / 10 = 55 us
and ``cast`` 5 + (100 + 150) / 10 = 30 us (R25).
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from simulator.api import Simulator
from simulator.compile.program import cpu_time_us
from simulator.errors import InputError
from simulator.plan import load, offload, plan_from_dict, prefetch, store
from tests.conftest import make_profile
from tests.engine_helpers import machine, plan

TENSORS = {"w": (100, "weight"), "x": (10, "input"), "a": (40, "activation"), "g": (100, "gradient"),
           "m": (100, "optimizer_state"), "s": (100, "optimizer_state"), "n": (150, "activation")}
OPS = [
    ("f", "forward", 10.0, ["x", "w"], ["a"]),
    ("b", "backward", 20.0, ["a", "w"], ["g"]),
    ("adam", "optimizer", 5.0, ["g"], [], ["m", "s"]),
    ("cast", "optimizer", 2.0, ["m"], ["n"]),
    ("copy", "optimizer", 1.0, ["n"], [], ["w"]),
]
CPU = {"model": "test-cpu", "tflops": 1, "mem_gbps": 0.01, "launch_us": 5}


def zero_step():
    return make_profile(TENSORS, OPS, "zero-step")


def cpu_machine(**kw):
    return machine(cpu=CPU, **kw)


def offload_plan(profile, **kw):
    """Optimizer on the CPU: g down after b, n up after cast for copy; m and s live in host."""
    initial = kw.pop("initial", {"m": "host", "s": "host"})
    actions = kw.pop("actions", (offload("g", "b"), prefetch("n", "cast", "copy")))
    return plan(profile, *actions, initial=initial, cpu_ops=("adam", "cast"), **kw)


def test_cpu_time_is_launch_plus_roofline():
    profile = zero_step()
    ops = {op.id: op for op in profile.ops}
    cpu = (1.0, 0.01, 5.0)
    assert cpu_time_us(ops["adam"], profile.tensor_by_id, cpu) == pytest.approx(55.0)
    assert cpu_time_us(ops["cast"], profile.tensor_by_id, cpu) == pytest.approx(30.0)
    # FLOP-bound when the FLOPs take longer than the bytes: 10^6 FLOPs at 10^-3 TFLOPS = 1000 us
    heavy = dataclasses.replace(ops["cast"], flops=1e6)
    assert cpu_time_us(heavy, profile.tensor_by_id, (1e-3, 0.01, 5.0)) == pytest.approx(1005.0)


def test_optimizer_on_the_cpu_hand_computed():
    """f 0-10, b 10-30, offload g 30-130; adam waits for it: 130-185; cast 185-215;
    prefetch n 215-365; copy waits for it: 365-366. The GPU waits 335 us for data."""
    profile = zero_step()
    result = Simulator(profile, cpu_machine()).simulate(offload_plan(profile), record=True)
    assert result.valid and result.feasible, result.reason
    assert result.iteration_us == pytest.approx(366.0)
    assert result.compute_us == pytest.approx(31.0)
    assert result.cpu_us == pytest.approx(85.0)
    assert result.stall_data_us == pytest.approx(335.0)
    spans = {s.name: (s.start_us, s.end_us) for s in result.timeline.spans if s.track == "cpu"}
    assert spans == {"adam": (130.0, 185.0), "cast": (185.0, 215.0)}
    # the host holds m and s, then g until adam ends, then n: 350 bytes at most
    assert result.host_peak_bytes == 350


def test_cpu_op_starts_when_its_host_input_is_written():
    """A faster link: g is down 0.1 us after b ends, and adam starts then (R27)."""
    profile = zero_step()
    fast_link = cpu_machine(h2d=1.0, d2h=1.0)    # 1000 bytes/us: g is down 0.1 us after b
    result = Simulator(profile, fast_link).simulate(offload_plan(profile), record=True)
    spans = {s.name: (s.start_us, s.end_us) for s in result.timeline.spans if s.track == "cpu"}
    assert spans["adam"][0] == pytest.approx(30.1)
    assert result.iteration_us == pytest.approx(30.1 + 55 + 30 + 0.15 + 1)


def test_states_on_the_ssd_load_and_store():
    """m starts on the SSD: load 0-200 (0.5 byte/us); adam 200-255; cast 255-285; n up
    285-435, copy 435-436; store m after cast 285-485: the iteration ends at 485."""
    profile = zero_step()
    actions = (load("m", None), offload("g", "b"), prefetch("n", "cast", "copy"),
               store("m", "cast"))
    result = Simulator(profile, cpu_machine()).simulate(
        offload_plan(profile, initial={"m": "ssd", "s": "host"}, actions=actions))
    assert result.valid and result.feasible, result.reason
    assert result.iteration_us == pytest.approx(485.0)
    assert result.tail_us == pytest.approx(485.0 - 436.0)
    assert result.link_bytes["ssd_read_link"] == 100 and result.link_bytes["ssd_write_link"] == 100
    assert result.link_bytes["pcie_up"] == 100 and result.link_bytes["pcie_down"] == 150


def test_state_updated_in_host_must_be_stored_back():
    """R20: m started on the SSD; updated in host memory, its SSD copy is stale."""
    profile = zero_step()
    actions = (load("m", None), offload("g", "b"), prefetch("n", "cast", "copy"))
    result = Simulator(profile, cpu_machine()).simulate(
        offload_plan(profile, initial={"m": "ssd", "s": "host"}, actions=actions))
    assert not result.valid and result.rule == "R20" and result.tensor == "m"


@pytest.mark.parametrize("actions, rule, tensor, words", [
    # g never reaches host memory: adam has nothing to read
    ((prefetch("n", "cast", "copy"),), "R26", "g", "no valid copy in host memory"),
    # n is prefetched before cast, a CPU op
    ((offload("g", "b"), prefetch("n", "cast", "cast")), "R26", "n", "runs on the CPU"),
    # the store empties host memory before cast reads m
    ((offload("g", "b"), store("m", "adam"), prefetch("n", "cast", "copy")), "R26", "m",
     "no valid copy in host memory"),
])
def test_invalid_cpu_plans(actions, rule, tensor, words):
    profile = zero_step()
    result = Simulator(profile, cpu_machine()).simulate(offload_plan(profile, actions=actions))
    assert not result.valid
    assert (result.rule, result.tensor) == (rule, tensor), result.reason
    if words:
        assert words in result.reason


def test_cpu_op_may_not_update_a_tensor_on_the_gpu():
    """m starts on the GPU: adam on the CPU would update a stale host copy (R26)."""
    profile = zero_step()
    result = Simulator(profile, cpu_machine()).simulate(offload_plan(profile, initial={"s": "host"}))
    assert not result.valid and result.rule == "R26" and result.tensor == "m"


def test_host_capacity_counts_cpu_outputs():
    """R19: n is made in host memory; with room for m, s and g (300 bytes), it does not fit."""
    profile = zero_step()
    result = Simulator(profile, cpu_machine(host="320B")).simulate(offload_plan(profile))
    assert result.valid and not result.feasible
    assert result.rule == "R19" and result.tensor == "n"


def test_score_matches_simulate():
    profile = zero_step()
    sim = Simulator(profile, cpu_machine())
    p = offload_plan(profile)
    score = sim.score(p)
    assert score.ok and score.iteration_us == pytest.approx(sim.simulate(p).iteration_us)


def test_plan_json_round_trip(tmp_path):
    profile = zero_step()
    p = offload_plan(profile, actions=(load("m", None), offload("g", "b"),
                                       prefetch("n", "cast", "copy"), store("m", "cast")))
    data = p.to_dict()
    assert data["cpu_ops"] == ["adam", "cast"]
    assert {"kind": "load", "tensor": "m", "after": None} in data["actions"]
    assert {"kind": "store", "tensor": "m", "after": "cast"} in data["actions"]
    again = plan_from_dict(json.loads(json.dumps(data)))
    assert again.cpu_ops == p.cpu_ops and again.actions == p.actions
    # no cpu_ops key at all when nothing runs on the CPU
    assert "cpu_ops" not in plan(profile).to_dict()


def test_cpu_plan_on_a_machine_without_a_cpu_is_an_input_error():
    profile = zero_step()
    with pytest.raises(InputError, match="cpu_ops.*describes no CPU"):
        Simulator(profile, machine()).simulate(offload_plan(profile))


@pytest.mark.parametrize("cpu_ops, field, words", [
    (("adam", "nope"), "cpu_ops[1]", "unknown op 'nope'"),
    (("adam", "adam"), "cpu_ops[1]", "listed twice"),
])
def test_bad_cpu_ops_are_input_errors(cpu_ops, field, words):
    profile = zero_step()
    bad = plan(profile, initial={"m": "host", "s": "host"}, cpu_ops=cpu_ops)
    with pytest.raises(InputError) as info:
        Simulator(profile, cpu_machine()).simulate(bad)
    assert info.value.where == field and words in str(info.value)


@pytest.mark.parametrize("cpu, field", [
    ({"tflops": 0, "mem_gbps": 10}, "cpu.tflops"),
    ({"tflops": 1}, "cpu.mem_gbps"),
    ({"tflops": 1, "mem_gbps": 10, "cores": 8}, "cpu"),
])
def test_bad_cpu_sections_are_input_errors(cpu, field):
    with pytest.raises(InputError) as info:
        machine(cpu=cpu)
    assert field in info.value.where


def test_chrome_trace_has_a_cpu_track():
    from simulator.timeline import chrome_trace
    profile = zero_step()
    result = Simulator(profile, cpu_machine()).simulate(offload_plan(profile), record=True)
    events = chrome_trace(result)["traceEvents"]
    names = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    on_cpu = {e["name"] for e in events if e.get("ph") == "X" and e["tid"] == names["cpu"]}
    assert on_cpu == {"adam", "cast"}


def test_executor_refuses_cpu_plans_in_one_line():
    from executor.api import replay
    profile = zero_step()
    with pytest.raises(InputError) as info:
        replay(profile, offload_plan(profile), cpu_machine())
    assert info.value.where == "cpu_ops" and "simulate" in str(info.value)


def test_fp32_step_updates_the_offloaded_weight_on_the_cpu():
    """ZeRO-Offload without mixed precision: adam on the CPU updates w itself. w is
    offloaded after b (its last GPU read), updated in host memory, and prefetched back by
    the end (R20). f 0-10, b 10-30; g and w go down over one link: g 30-130, w 130-230;
    adam (5 + (100 + 2*300)/10 = 75 us) 230-305; w back 305-405."""
    ops = [("f", "forward", 10.0, ["x", "w"], ["a"]), ("b", "backward", 20.0, ["a", "w"], ["g"]),
           ("adam", "optimizer", 5.0, ["g"], [], ["w", "m", "s"])]
    profile = make_profile({k: TENSORS[k] for k in ("w", "x", "a", "g", "m", "s")}, ops, "fp32-step")
    actions = (offload("g", "b"), offload("w", "b"), prefetch("w", "adam", None))
    p = plan(profile, *actions, initial={"m": "host", "s": "host"}, cpu_ops=("adam",))
    result = Simulator(profile, cpu_machine()).simulate(p)
    assert result.ok, result.reason
    assert result.iteration_us == pytest.approx(405.0)
    # without the prefetch, w does not end on the GPU where it started
    p = plan(profile, *actions[:2], initial={"m": "host", "s": "host"}, cpu_ops=("adam",))
    result = Simulator(profile, cpu_machine()).simulate(p)
    assert not result.valid and result.rule == "R20" and result.tensor == "w"
