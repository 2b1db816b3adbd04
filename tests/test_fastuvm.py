"""UVM mode's C run (simulator/fast/uvm.py, simulator/fast/_fastuvm.c) against the Python
reference (simulator/run/uvm.py _UvmRun): every field of the Result must be identical.

The cases: the hand-computed ones of tests/test_uvm.py, plans of the UVM planners on
shipped profiles at several budgets and on two machines, infeasible runs (an item that
alone does not fit, the host's capacity), scores (an infeasible plan's is measured with
no budget), and random small profiles and plans. Where the C run does not apply (SSD
backing, half-duplex PCIe) the result must still be the reference's.
"""
from __future__ import annotations

import json

import random
from dataclasses import replace
from functools import lru_cache

import pytest

from planner.core.api import make_plan
from planner.uvm.deepum import deepum_actions
from planner.uvm.oc_dnn import oc_dnn_actions
from simulator.api import Simulator
from simulator.catalog import open_profile
from simulator.compile.lower import compile_program
from simulator.compile.program import PlanInvalid
from simulator.errors import InfeasibleError
from simulator.fast import uvm as fastuvm
from simulator.hardware import hardware_from_dict, load_hardware
from simulator.plan import Plan, drop, load_plan, offload, prefetch, recompute
from simulator.profile import load_profile
from tests.conftest import TWO_LAYER_OPS, TWO_LAYER_TENSORS, make_profile
from tests.engine_helpers import CHAIN_OPS, CHAIN_TENSORS
from tests.test_uvm import BARS, fault_profile, layered, ssd_machine, three_weights, uvm_machine, uvm_plan

pytestmark = pytest.mark.skipif(not fastuvm.available(),
                                reason="the C UVM run (simulator/fast/_fastuvm.c) is not built: "
                                       "`pip install -e .` or `python setup.py build_ext --inplace` builds it")

A100 = "a100-40gb-pcie4"


def with_host(hardware, nbytes: int):
    """The machine with ``nbytes`` of host memory (R19: the backing tier's capacity)."""
    return replace(hardware, host=replace(hardware.host, memory_bytes=nbytes))


def same(profile, plan, hardware, budget=None, c_path: bool | None = True):
    """Simulate with the C path and with the reference; the Results must be identical.
    ``c_path``: True when the C run must have been taken, False when it must not (None:
    either). Returns the Result."""
    sim = Simulator(profile, hardware)
    before = fastuvm.counts["c"]
    fast = sim.simulate(plan, budget)
    taken = fastuvm.counts["c"] > before
    reference = sim.simulate(plan, budget, reference=True)
    assert fast.to_dict() == reference.to_dict(), \
        [k for k, v in reference.to_dict().items() if fast.to_dict()[k] != v]
    if c_path is not None and fast.valid:
        assert taken == c_path, "the C run was " + ("not " if c_path else "") + "taken"
    return fast


# ----------------------------------------------------------------------------- tests/test_uvm.py's cases


def test_the_hand_computed_cases():
    p = fault_profile()
    hw = uvm_machine()
    assert same(p, uvm_plan(p, initial={"w": "host"}), hw, 200).iteration_us == pytest.approx(565.0)
    assert same(p, uvm_plan(p, initial={"w": "host"}), uvm_machine(batch=2), 200).iteration_us == pytest.approx(660.0)
    assert same(p, uvm_plan(p, initial={"w": "host"}, read_mostly=("w",)), hw, 200).iteration_us \
        == pytest.approx(365.0)
    assert same(p, uvm_plan(p, prefetch("w", "p0", "p1"), initial={"w": "host"}), hw, 200).iteration_us \
        == pytest.approx(655.0)
    assert same(p, uvm_plan(p, prefetch("w", None, "p1")), hw, 500).iteration_us == pytest.approx(50.0)
    assert same(p, uvm_plan(p, prefetch("w", None, "p1"), offload("w", "p1", "host")), hw, 500).iteration_us \
        == pytest.approx(410.0)
    assert same(p, uvm_plan(p, drop("w", "p1"), read_mostly=("w",)), hw, 500).faults == 2
    big = 2 * hw.gpu.memory_bytes     # R2 in UVM mode: the budget may pass the GPU's memory
    assert same(p, uvm_plan(p), hw, big).ok


def test_an_item_larger_than_memory_streams_through_its_inputs():
    p = make_profile({"w": (200, "weight"), "y": (10, "activation")}, [("k", "forward", 10.0, ["w"], ["y"])],
                     "stream")
    assert same(p, uvm_plan(p, initial={"w": "host"}), uvm_machine(), 150).iteration_us == pytest.approx(215.0)
    fill = make_profile({"w": (200, "weight"), "x": (100, "weight")},
                        [("k1", "forward", 10.0, ["w"], []), ("k2", "forward", 10.0, ["x"], [])], "fill")
    assert same(fill, uvm_plan(fill), uvm_machine(), 250).iteration_us == pytest.approx(430.0)


def test_infeasible_runs():
    p = fault_profile()
    alone = same(p, uvm_plan(p, initial={"w": "host"}), uvm_machine(), 150)      # R32: p3's outputs alone
    assert alone.rule == "R10" and alone.op == "p3" and "alone does not fit" in alone.reason
    small_host = with_host(uvm_machine(), 250)
    capacity = same(p, uvm_plan(p, initial={"w": "host"}), small_host, 200)   # R19: write-backs fill the host
    assert capacity.rule == "R19" and not capacity.feasible


def test_an_item_waits_while_a_hint_pins_the_room_it_needs():
    # o2 needs z (3 blocks) at 10 us when only w (2 blocks) is evictable: the prefetch of
    # y, running 0-100 us, pins y. o2's room is decided again once the prefetch has ended
    # (a memory stall of 90 us); o4 brings w back, so iteration 2 starts as iteration 1.
    p = make_profile({"w": (200, "weight"), "y": (100, "weight"), "z": (300, "weight")},
                     [("o1", "forward", 10.0, ["w"], []), ("o2", "forward", 10.0, ["z"], []),
                      ("o3", "forward", 10.0, ["y"], []), ("o4", "forward", 10.0, ["w"], [])], "waits")
    plan = uvm_plan(p, prefetch("y", None, "o3"), offload("y", "o3", "host"), initial={"y": "host", "z": "host"})
    r = same(p, plan, uvm_machine(), 300)
    assert r.ok and r.stall_by_op["o2"]["memory_us"] == pytest.approx(90.0)


def test_the_acceptance_toy_and_the_no_swap_peak():
    if (BARS / "uvm-toy-profile.json").exists():
        profile, plan = load_profile(BARS / "uvm-toy-profile.json"), load_plan(BARS / "uvm-toy-plan.json")
        hardware = load_hardware(BARS / "v2-share-hw.json")
        # no uvm section: the first model, one batch for the 2 MiB block (tests/test_uvm.py)
        assert same(profile, plan, hardware, 6 * 2**20).iteration_us == pytest.approx(764.4304, abs=1e-6)
        # the driver's model: two batches of 256 pages at the paging rate, the item's
        # first-fault cost and o2's first touch of w.1's evicted page (tests/test_uvm.py computes it)
        driver = hardware_from_dict({**json.loads((BARS / "v2-share-hw.json").read_text()), "uvm": {}})
        assert same(profile, plan, driver, 6 * 2**20).iteration_us == pytest.approx(2412.96611, abs=1e-6)
        assert same(profile, plan, hardware, 8 * 2**20).faults == 0
    hw = load_hardware(A100)
    for p in (make_profile(TWO_LAYER_TENSORS, TWO_LAYER_OPS, "two-layer"),
              make_profile(CHAIN_TENSORS, CHAIN_OPS, "chain"), open_profile("synth-mlp-l16-w8192-b1024")):
        for budget in (p.peak_bytes, p.peak_bytes + 12345):
            r = same(p, uvm_plan(p), hw, budget)      # no fault, no eviction, every page reused (R31)
            assert (r.faults, r.evictions, r.stall_fault_us) == (0, 0, 0.0) and r.iteration_us == p.ideal_us


@pytest.mark.parametrize("actions", [(recompute("z", "p2"),), (offload("w", "p1", "ssd"),), (drop("w", "p1"),),
                                     (prefetch("z", "p2", "p3"),), (prefetch("w", "p1", "p1"),)])
def test_invalid_plans_are_the_references(actions):
    p = fault_profile()
    r = same(p, uvm_plan(p, *actions), load_hardware(A100), 10**6)
    assert not r.valid


def test_the_planners_on_a_small_graph():
    p = layered()
    for name in ("uvm", "oc-dnn", "deepum"):
        same(p, make_plan(p, uvm_machine(), 700, name).plan, uvm_machine(), 700)
    assert same(p, make_plan(p, load_hardware(A100), 700, "dragon").plan, load_hardware(A100), 700, c_path=False).ok


def test_where_the_c_run_does_not_apply_the_reference_runs():
    p = fault_profile()
    half = same(p, uvm_plan(p, initial={"w": "host"}), uvm_machine(duplex="half"), 200, c_path=False)
    assert half.iteration_us == pytest.approx(665.0)
    w = three_weights()
    for cache in (200, 100):      # R35: SSD backing and its page cache
        same(w, uvm_plan(w, uvm_backing="ssd"), ssd_machine(cache), 100, c_path=False)
    assert same(p, uvm_plan(p, initial={"w": "host"}), uvm_machine(), 200, c_path=True).ok


# ----------------------------------------------------------------------------- shipped profiles


@lru_cache(maxsize=None)
def _profile(name):
    return open_profile(name)


@lru_cache(maxsize=None)
def _plan(profile_name, hardware_name, percent, planner):
    """A planner's plan at ``percent`` of the profile's peak (at most the GPU's memory), or
    None below the planner's floor."""
    profile, hardware = _profile(profile_name), load_hardware(hardware_name)
    budget = min(profile.peak_bytes * percent // 100, hardware.gpu.memory_bytes)
    try:
        return make_plan(profile, hardware, budget, planner).plan, budget
    except InfeasibleError:
        return None, budget


SHIPPED = [(name, A100) for name in ("gpt2-b48-s1024", "resnet50-b1024-s224", "bert-base-b160-s512",
                                     "synth-transformer-l12-b16-s1024", "synth-cnn-l16-w128-b64-s224")]
SHIPPED += [("gpt2-b48-s1024", "v100-16gb-pcie3"), ("synth-mlp-l16-w8192-b1024", "v100-16gb-pcie3")]


@pytest.mark.parametrize("profile_name, hardware_name", SHIPPED)
@pytest.mark.parametrize("planner", ["uvm", "oc-dnn", "deepum", "dragon"])
def test_shipped_profiles(profile_name, hardware_name, planner):
    profile, hardware = _profile(profile_name), load_hardware(hardware_name)
    for percent in (30, 50, 100):
        if planner == "dragon" and percent != 50:
            continue    # the reference runs dragon's SSD-backed plans either way: one budget is enough
        plan, budget = _plan(profile_name, hardware_name, percent, planner)
        if plan is not None:
            same(profile, plan, hardware, budget, c_path=planner != "dragon")


def test_gpt2_uvm_and_deepum_at_half_the_peak_run_in_c():
    profile, hardware = _profile("gpt2-b48-s1024"), load_hardware(A100)
    sim = Simulator(profile, hardware)
    for planner in ("uvm", "deepum"):
        plan, budget = _plan("gpt2-b48-s1024", A100, 50, planner)
        program = compile_program(profile, sim.compiled, plan, sim.machine)
        assert fastuvm.applies(program, sim.machine, budget)
        result = fastuvm.run(sim.compiled, program, sim.machine, budget)
        assert result is not None and result.ok
        assert result.to_dict() == sim.simulate(plan, budget, reference=True).to_dict()


def test_scores_and_infeasible_results_on_a_shipped_profile(monkeypatch):
    profile, hardware = _profile("gpt2-b48-s1024"), load_hardware(A100)
    sim = Simulator(profile, hardware)
    plan, _ = _plan("gpt2-b48-s1024", A100, 50, "deepum")
    budgets = (profile.peak_bytes // 2, profile.peak_bytes // 20, 10**8)    # feasible, then an item alone does not fit
    small_host = with_host(hardware, 8 * 2**30)
    fast = [sim.score(plan, b) for b in budgets] + [Simulator(profile, small_host).score(plan, budgets[0])]
    infeasible = [same(profile, plan, hardware, b) for b in budgets[1:]]
    assert [r.rule for r in infeasible] == ["R10", "R10"]
    assert same(profile, plan, small_host, budgets[0]).rule == "R19"
    monkeypatch.setattr(fastuvm, "_fastuvm", None)      # the reference alone
    reference = [sim.score(plan, b) for b in budgets] + [Simulator(profile, small_host).score(plan, budgets[0])]
    assert fast == reference
    assert fast[0].ok and not fast[1].ok and fast[1].over_budget_bytes > 0


# ----------------------------------------------------------------------------- random small cases


def _random_profile(rng):
    """Weights, ops reading weights and earlier activations, some updating a weight."""
    n_weights, n_ops = rng.randint(1, 4), rng.randint(2, 9)
    tensors = {f"w{i}": (rng.choice([0, 50, 100, 150, 250, 333, 1000]), "weight") for i in range(n_weights)}
    ops, made = [], []
    for i in range(n_ops):
        inputs = rng.sample(sorted(t for t in tensors if t.startswith("w")), rng.randint(0, n_weights))
        inputs += rng.sample(made, min(len(made), rng.randint(0, 3)))
        outputs = []
        for o in range(rng.randint(0 if i else 1, 2)):
            tensors[f"a{i}_{o}"] = (rng.choice([0, 10, 90, 100, 101, 299, 500]), "activation")
            outputs.append(f"a{i}_{o}")
        updates = [f"w{rng.randrange(n_weights)}"] if rng.random() < 0.25 else []
        ops.append((f"o{i}", "optimizer" if updates else "forward", float(rng.choice([1, 5, 10, 50, 200])), inputs,
                    outputs, updates, rng.choice([0, 0, 30, 120])))
        made += outputs
    return make_profile(tensors, ops, "random")


def _random_machine(rng):
    return hardware_from_dict({
        "name": "random", "gpu": {"memory": "1GiB", "fp32_tflops": 1, "fp16_tflops": 1, "hbm_gbps": 1},
        "pcie": {"h2d_gbps": rng.choice([0.001, 0.0005]), "d2h_gbps": rng.choice([0.001, 0.003]), "duplex": "full",
                 "latency_us": rng.choice([0, 3])},
        "host": {"memory": rng.choice([300, 2000, 10**6, 10**6])},
        "uvm": _random_uvm(rng)})


def _random_uvm(rng) -> dict:
    """The first model (fault_batch_blocks) or the driver's (pages, big pages, batches of
    faults, the prefetcher's threshold, R31), with blocks whose last one is often short."""
    if rng.random() < 0.4:
        return {"block": rng.choice([50, 100, 128]), "fault_latency_us": rng.choice([0, 5]),
                "fault_batch_blocks": rng.choice([1, 1, 2, 3])}
    page = rng.choice([1, 4, 8, 25])
    block = page * rng.choice([1, 3, 4, 16, 20])
    big = page * rng.choice([m for m in (1, 2, 4, 16) if page * m <= block])
    return {"block": block, "page": page, "big_page": big, "fault_latency_us": rng.choice([0, 5]),
            "fault_batch_faults": rng.choice([1, 2, 3, 5, 16, 256]), "prefetch_threshold": rng.choice([0, 30, 51, 51, 100])}


def _random_plan(rng, profile, sim):
    """Hints from deepum or oc-dnn, or none, then random hints kept where the plan stays valid."""
    tensors, ops = [t.id for t in profile.tensors], [op.id for op in profile.ops]
    read_mostly = tuple(t for t in tensors if rng.random() < 0.3)
    initial = {t.id: "host" for t in profile.tensors if t.persistent and rng.random() < 0.3}

    def valid(actions) -> bool:
        try:
            compile_program(profile, sim.compiled, Plan(profile.name, tuple(actions), memory="uvm",
                                                        read_mostly=read_mostly, initial=initial), sim.machine)
        except PlanInvalid:
            return False
        return True

    pick = rng.random()
    actions = (deepum_actions(profile, int(profile.peak_bytes * rng.uniform(0.2, 0.9)), "host", rng.randint(1, 3),
                              rng.random() < 0.7) if pick < 0.3 else
               oc_dnn_actions(profile, "host", ahead=rng.randint(0, 2)) if pick < 0.5 else [])
    actions = list(actions) if valid(actions) else []
    for _ in range(rng.randint(0, 10)):
        t, kind, i = rng.choice(tensors), rng.random(), rng.randrange(-1, len(ops) - 1)
        if kind < 0.4:
            action = offload(t, rng.choice(ops), "host")
        elif kind < 0.85:
            action = prefetch(t, None if i < 0 else ops[i], rng.choice([None] + ops[i + 1:]), "host")
        else:
            action = drop(t, rng.choice(ops))
        if valid(actions + [action]):
            actions.append(action)
    return Plan(profile.name, tuple(actions), memory="uvm", read_mostly=read_mostly, initial=initial)


def test_random_profiles_and_plans():
    outcomes = set()
    for seed in range(120):
        rng = random.Random(seed)
        profile, hardware = _random_profile(rng), _random_machine(rng)
        plan = _random_plan(rng, profile, Simulator(profile, hardware))
        for budget in (int(profile.peak_bytes * rng.uniform(0.1, 0.6)), int(profile.peak_bytes * rng.uniform(0.4, 1.1)),
                       rng.randint(0, 3000), 10**6):
            r = same(profile, plan, hardware, budget)
            outcomes.add(r.rule if not r.ok else "ok")
    assert outcomes == {"ok", "R10", "R19"}


def test_random_caching_allocator_runs_on_the_reference():
    """R38 (caching_allocator: true) is not in the C run: fastuvm declines it and the
    Python reference gives the result; the same cases without it still run in C. The
    pool keeps the ledger within the budget and frees nothing that was not counted."""
    outcomes = set()
    for seed in range(60):
        rng = random.Random(1000 + seed)
        profile, hardware = _random_profile(rng), _random_machine(rng)
        plan = _random_plan(rng, profile, Simulator(profile, hardware))
        pooled = replace(hardware, uvm=replace(hardware.uvm, caching_allocator=True))
        for budget in (int(profile.peak_bytes * rng.uniform(0.1, 0.6)), int(profile.peak_bytes * rng.uniform(0.4, 1.1)),
                       10**6):
            r = same(profile, plan, pooled, budget, c_path=False)
            outcomes.add(r.rule if not r.ok else "ok")
            if r.ok:
                assert r.peak_bytes <= budget and r.host_peak_bytes >= 0
            same(profile, plan, hardware, budget, c_path=True)
    assert "ok" in outcomes and outcomes <= {"ok", "R10", "R19"}
