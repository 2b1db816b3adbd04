"""A data-parallel rank's collectives (R56-R58): the comm stream, ring costs on the
interconnect, issue order, data waits, memory, link sharing; every figure by hand."""
from __future__ import annotations

import copy

import pytest

from simulator.api import Simulator
from simulator.errors import InputError
from simulator.hardware import hardware_from_dict
from simulator.plan import Action, Plan
from simulator.profile import profile_from_dict

HW = {"name": "toy", "gpu": {"memory": "1GiB", "fp32_tflops": 1, "fp16_tflops": 1, "hbm_gbps": 1},
      "pcie": {"h2d_gbps": 1, "d2h_gbps": 1, "latency_us": 0}, "host": {"memory": "1GiB"},
      "interconnect": {"kind": "nvlink", "gpus": 4, "gbps": 1, "latency_us": 1}}


def _profile(gather_bytes=400, order=("a0", "ag", "f"), kind="all_gather"):
    """a0 (10 us) makes x; ag gathers w (100 B a shard, world 4) into wf; f (20 us) reads x and wf."""
    ops = {"a0": {"id": "a0", "name": "k", "phase": "forward", "time_us": 10, "outputs": ["x"]},
           "ag": {"id": "ag", "name": kind, "phase": "forward", "time_us": 0, "inputs": ["w"], "outputs": ["wf"],
                  "collective": {"kind": kind, "world": 4, "bytes": gather_bytes}},
           "f": {"id": "f", "name": "mm", "phase": "forward", "time_us": 20, "inputs": ["x", "wf"],
                 "outputs": ["y"]}}
    return profile_from_dict({
        "format": "swapplan-profile/1", "name": "rank",
        "tensors": [{"id": "w", "bytes": 100, "kind": "weight"}, {"id": "x", "bytes": 10, "kind": "activation"},
                    {"id": "wf", "bytes": 400, "kind": "other"}, {"id": "y", "bytes": 10, "kind": "activation"}],
        "ops": [ops[o] for o in order]})


def _hw(**interconnect):
    data = copy.deepcopy(HW)
    data["interconnect"].update(interconnect)
    return hardware_from_dict(data)


def _run(profile, hardware=None, plan=None, budget=None):
    sim = Simulator(profile, hardware or _hw())
    return sim.simulate(plan or Plan(profile_name=profile.name), budget, record=True)


def _span(result, name):
    return next((s.start_us, s.end_us) for s in result.timeline.spans if s.name == name)


def test_r57_an_all_gather_overlaps_compute_and_costs_its_ring():
    # wire bytes 400 x 3/4 = 300 at 1 GB/s = 0.3 us, after 3 ring steps x 1 us: 0 .. 3.3 us beside a0
    r = _run(_profile())
    assert _span(r, "ag") == (0.0, 3.3)
    assert _span(r, "f") == (10.0, 30.0)
    assert r.iteration_us == 30.0 and r.stall_us == 0.0
    assert r.link_bytes["interconnect"] == 300 and r.busy_us["comm"] == 3.3
    assert r.peak_bytes == 100 + 10 + 400 + 10     # the gathered copy is allocated when the gather starts


def test_r58_an_op_waits_for_the_collective_it_reads():
    # 200,000 bytes over 4: 150,000 wire bytes = 150 us + 3 us; f waits from 10 to 153 (data stall)
    r = _run(_profile(gather_bytes=200_000))
    assert _span(r, "ag") == (0.0, 153.0)
    assert _span(r, "f") == (153.0, 173.0)
    assert r.iteration_us == 173.0 and r.stall_data_us == 143.0


def test_r58_a_collective_is_issued_after_the_gpu_op_before_it_starts():
    # order a0, b (5 us), ag, f: ag waits for b to start at 10 us, then 3.3 us
    profile = profile_from_dict({
        **_profile().to_dict(),
        "tensors": [t.to_dict() for t in _profile().tensors] + [{"id": "z", "bytes": 1, "kind": "activation"}],
        "ops": [_profile().ops[0].to_dict(),
                {"id": "b", "name": "k", "phase": "forward", "time_us": 5, "outputs": ["z"]},
                _profile().ops[1].to_dict(), _profile().ops[2].to_dict()]})
    r = _run(profile)
    assert _span(r, "b") == (10.0, 15.0)
    assert _span(r, "ag") == (10.0, 13.3)
    assert _span(r, "f") == (15.0, 35.0)


def test_r57_all_reduce_sends_twice_and_takes_twice_the_steps():
    profile = profile_from_dict({
        "format": "swapplan-profile/1", "name": "ddp",
        "tensors": [{"id": "w", "bytes": 400, "kind": "weight"}, {"id": "g", "bytes": 400, "kind": "gradient"}],
        "ops": [{"id": "b", "name": "k", "phase": "backward", "time_us": 10, "inputs": ["w"], "outputs": ["g"]},
                {"id": "ar", "name": "all_reduce", "phase": "backward", "time_us": 0, "updates": ["g"],
                 "collective": {"kind": "all_reduce", "world": 4, "bytes": 400}},
                {"id": "opt", "name": "sgd", "phase": "optimizer", "time_us": 5, "inputs": ["g"], "updates": ["w"]}]})
    r = _run(profile)
    # issued when b starts (0), waits for b to end (it writes g): 10 + 6 steps x 1 us + 600 B at 1 GB/s = 16.6
    assert _span(r, "ar") == (10.0, 16.6)
    assert _span(r, "opt") == (16.6, 21.6)
    assert r.link_bytes["interconnect"] == 600


def test_r57_past_one_node_the_ring_crosses_the_network():
    profile = profile_from_dict({**_profile().to_dict(), "ops": [
        {**op.to_dict(), "collective": {"kind": "all_gather", "world": 8, "bytes": 800}} if op.collective else
        op.to_dict() for op in _profile().ops]})
    hw = _hw(gpus=4, nodes=2, inter_node_gbps=0.5, inter_node_latency_us=2)
    r = _run(profile, hw)
    # 7 steps x 2 us (the network's latency) + 700 wire bytes at 0.5 GB/s (1.4 us) = 15.4 us
    assert _span(r, "ag") == (0.0, 15.4)
    assert r.link_bytes["interconnect"] == 700 and r.link_bytes["network"] == 700


def test_r57_without_nvlink_a_collective_shares_pcie_with_an_offload():
    # kind pcie: the gather's 300,000 wire bytes cross the interconnect (1 GB/s) and both PCIe
    # directions; an offload of x (1,000,000 bytes) after a0 shares pcie_up with it at 0.5 GB/s
    hw = _hw(kind="pcie", latency_us=0)
    profile = profile_from_dict({**_profile().to_dict(), "tensors": [
        {"id": "w", "bytes": 100_000, "kind": "weight"}, {"id": "x", "bytes": 1_000_000, "kind": "activation"},
        {"id": "wf", "bytes": 400_000, "kind": "other"}, {"id": "y", "bytes": 10, "kind": "activation"}],
        "ops": [{**op.to_dict(), "collective": {"kind": "all_gather", "world": 4, "bytes": 400_000}}
                if op.collective else op.to_dict() for op in _profile(order=("a0", "ag", "f")).ops]})
    plan = Plan(profile_name=profile.name, actions=(Action("offload", "x", after="a0", to="host"),
                                                    Action("prefetch", "x", after="ag", before="f", source="host")))
    alone = _run(profile, hw)
    assert _span(alone, "ag") == (0.0, 300.0)          # 300,000 B at 1 GB/s
    shared = _run(profile, hw, plan)
    # 0..10: the gather alone at 1 GB/s (10,000 B); from 10 it shares pcie_up with the offload at
    # 0.5 GB/s each: its 290,000 B left take 580 us: ends at 590
    assert _span(shared, "ag") == (0.0, 590.0)
    assert shared.link_bytes["pcie_up"] == 300_000 + 1_000_000


def test_r58_a_collective_waits_for_room_for_its_outputs():
    # budget 520: w (100) + x (10) + wf (400) + y (10) fits; at 509 the gather's 400 bytes never
    # fit beside w and x, and the run names it
    assert _run(_profile(), budget=520).feasible
    r = _run(_profile(), budget=509)
    assert not r.feasible and r.rule == "R10"
    assert r.reason.startswith("collective 'ag' waits for memory (op 'f' waits): needs 400 bytes, 399 free")


def test_r56_a_gathered_copy_is_not_recomputed_and_a_collective_not_run_on_the_cpu():
    profile = _profile()
    plan = Plan(profile_name=profile.name, actions=(Action("drop", "wf", after="ag"),
                                                    Action("recompute", "wf", before="f")))
    r = _run(profile, plan=plan)
    assert not r.valid and r.rule == "R15" and "is a all_gather (R56)" in r.reason
    uvm = Plan(profile_name=profile.name, memory="uvm")
    r = _run(profile, plan=uvm)
    assert not r.valid and r.rule == "R56"


def test_r57_the_machine_needs_an_interconnect_that_holds_the_world():
    data = copy.deepcopy(HW)
    del data["interconnect"]
    with pytest.raises(InputError, match="interconnect: profile 'rank' is one rank of 4"):
        Simulator(_profile(), hardware_from_dict(data))
    with pytest.raises(InputError, match="interconnect.gpus: .* the machine has 2 GPUs"):
        Simulator(_profile(), _hw(gpus=2))


def test_collective_fields_are_checked():
    data = _profile().to_dict()
    data["ops"][1]["time_us"] = 1.0
    with pytest.raises(InputError, match=r"ops\[1\] \(ag\).time_us: a collective op's time is the interconnect's"):
        profile_from_dict(data)
    data["ops"][1]["time_us"] = 0
    data["ops"][1]["collective"]["kind"] = "broadcast"
    with pytest.raises(InputError, match="collective.kind"):
        profile_from_dict(data)
    data["ops"][1]["collective"] = {"kind": "all_gather", "world": 0, "bytes": 1}
    with pytest.raises(InputError, match="collective.world: must be from 1 to 65536"):
        profile_from_dict(data)


def test_a_rank_plans_and_scores_with_the_reference():
    profile = _profile(gather_bytes=200_000)
    sim = Simulator(profile, _hw())
    score = sim.score(Plan(profile_name=profile.name))
    assert score.ok and score.iteration_us == 173.0


def test_the_bound_knows_the_collectives():
    # the comm stream alone: 3 steps x 1 us + 150,000 wire bytes at 1 GB/s = 153 us, above the
    # 30 us of compute; the plan simulates at 173 us, not below
    from planner.shared.bound import lower_bound
    profile = _profile(gather_bytes=200_000)
    bound = lower_bound(profile, _hw(), 10**6)
    assert bound.value_us == pytest.approx(153.0)
    assert _run(profile).iteration_us >= bound.value_us


def _unit_profile():
    """One zero3 unit over 4: gathered for forward (wf1) and again for backward (wf2);
    f reads x and wf1 and makes y (40 B), b reads y and wf2."""
    gather = {"kind": "all_gather", "world": 4, "bytes": 400}
    return profile_from_dict({
        "format": "swapplan-profile/1", "name": "unit",
        "tensors": [{"id": "w", "bytes": 100, "kind": "weight"}, {"id": "x", "bytes": 10, "kind": "input"},
                    {"id": "wf1", "bytes": 400, "kind": "other"}, {"id": "y", "bytes": 40, "kind": "activation"},
                    {"id": "z", "bytes": 1, "kind": "activation"},
                    {"id": "wf2", "bytes": 400, "kind": "other"}, {"id": "g", "bytes": 10, "kind": "gradient"}],
        "ops": [{"id": "agf", "name": "all_gather", "phase": "forward", "time_us": 0, "inputs": ["w"],
                 "outputs": ["wf1"], "collective": gather},
                {"id": "f", "name": "mm", "phase": "forward", "time_us": 10, "inputs": ["x", "wf1"], "outputs": ["y"]},
                {"id": "mid", "name": "k", "phase": "forward", "time_us": 10, "inputs": ["x"], "outputs": ["z"]},
                {"id": "agb", "name": "all_gather", "phase": "backward", "time_us": 0, "inputs": ["w"],
                 "outputs": ["wf2"], "collective": gather},
                {"id": "b", "name": "mm_backward", "phase": "backward", "time_us": 20,
                 "inputs": ["y", "z", "wf2"], "outputs": ["g"]}]})


def test_r60_a_recompute_reads_the_parameters_its_units_backward_gathered():
    profile = _unit_profile()
    assert profile.gather_twins["wf1"] == ((0, "wf1"), (3, "wf2"))
    plan = Plan(profile_name=profile.name, actions=(Action("drop", "y", after="f"),
                                                    Action("recompute", "y", before="b")))
    r = _run(profile, plan=plan)
    assert r.ok, r.reason
    # wf1 dies after f (no recompute reads it); the backward gather holds w + x + z + wf2 = 511,
    # the recompute of y adds 40 and b's g 10: the peak is 561 B at b, where reading wf1 again
    # would have kept it to the recompute (961 B)
    assert r.peak_bytes == 100 + 10 + 1 + 400 + 40 + 10
    seq_reads = Simulator(profile, _hw()).compiled.default_sequence.reads
    assert seq_reads == {}                      # no recompute in the profile's own sequence
    from simulator.model.recompute import recompute_reads
    assert recompute_reads(profile, 1, 4) == ("x", "wf2")    # before b: the backward's copy
    assert recompute_reads(profile, 1, 2) == ("x", "wf1")    # before mid: only the forward's exists
