"""Recompute instead of spilling (planner/core/regen.py) and g10's ``recompute``.

Machine (tests/engine_helpers.py): PCIe 1 B/us each way, the SSD 0.5 B/us, no latency;
SSD transfers go through host memory at the slower link's rate: 100 B take 200 us.
"""
from __future__ import annotations

import pytest

from planner.core.api import make_plan
from planner.shared.regen import Regen, candidates, cover, shortfall
from simulator.plan import drop, offload, prefetch, recompute
from tests.engine_helpers import machine
from tests.test_planner_g10 import chain_profile

# Twelve ops p0..p11 of 100 us (ideal 1,200 us) on a chain of 1 B tensors c0..c11. Six
# activations A0..A5 of 100 B, made by p0..p5 and read back in reverse (A5 by p6, A0 by
# p11); X (1 B) made by p0 with A0, read by p1..p5 and p11. A1..A5 are made from X and
# the chain tensor before them, which dies at once: only A0 (p0 reads nothing) can be
# recomputed at its use, and p0 re-runs in 100 us for 100 B, 1 us a byte, under the
# SSD's 2 us a byte.
SPILL = {**{f"A{i}": (100, "activation") for i in range(6)}, "X": (1, "activation")}
SPILL_OPS = {0: ((), ("X", "A0"), 0), **{i: (("X",), (f"A{i}",), 0) for i in range(1, 6)},
             **{11 - i: ((f"A{i}",), (), 0) for i in range(1, 6)}, 11: (("A0", "X"), (), 0)}


def spill_profile():
    return chain_profile("regen", 12, SPILL, SPILL_OPS)


def test_only_a_tensor_whose_producer_can_run_again_at_its_use_is_a_candidate():
    assert candidates(spill_profile(), 2.0) == [Regen("A0", 100, 0, 11, 0, (), 1.0)]
    assert candidates(spill_profile(), 1.0) == []   # not cheaper per byte than the limit


def test_r15_and_the_sources_decide_what_may_be_recomputed():
    # q0 makes S (kept to the end) and B; q1 makes D from S; q2 updates S in place; q3 makes
    # E from S; q4 makes G; q7 makes F and updates G; q6 reads them all. B: q0 reads
    # nothing, a candidate. D: its source S is updated (q2) before D's use, so a re-run
    # would read another S. E: S is not updated after q3, a candidate. G: may be recomputed
    # before q7 updates it (its gap q4..q7), not before q6 (the update came first). F: its
    # producer updates in place, never a candidate.
    from tests.conftest import make_profile
    tensors = {"S": (1, "activation"), "B": (10, "activation"), "D": (10, "activation"),
               "E": (10, "activation"), "F": (10, "activation"), "G": (10, "activation")}
    ops = [("q0", "forward", 1.0, [], ["S", "B"]), ("q1", "forward", 1.0, ["S"], ["D"]),
           ("q2", "forward", 1.0, [], [], ["S"]), ("q3", "forward", 1.0, ["S"], ["E"]),
           ("q4", "forward", 1.0, [], ["G"]), ("q5", "forward", 1.0, [], []),
           ("q7", "forward", 1.0, [], ["F"], ["G"]), ("q8", "forward", 1.0, [], []),
           ("q9", "forward", 1.0, [], []), ("q6", "backward", 1.0, ["B", "D", "E", "S", "F", "G"], [])]
    found = candidates(make_profile(tensors, ops, "r15"), 1.0)
    assert [(r.tensor, r.after, r.before, r.sources) for r in found] == [
        ("B", 0, 9, ()), ("E", 3, 9, ("S",)), ("G", 4, 6, ())]


def test_cover_takes_the_cheapest_idle_at_the_op_without_chains():
    a = Regen("a", 10, 0, 9, 0, (), 0.1)
    b = Regen("b", 10, 1, 8, 1, ("a",), 0.2)     # its recompute (op 8) reads a, dropped until op 9
    c = Regen("c", 10, 5, 9, 5, (), 0.3)         # not idle at op 4
    d = Regen("d", 10, 2, 9, 2, (), 0.4)
    assert cover([a, b, c, d], 4, 15) == [a, d]
    assert cover([a, b, c, d], 4, 10) == [a]
    assert cover([a, b, c, d], 4, 100) == [a, d]


def test_shortfall_is_the_most_the_tier_falls_behind():
    # Ops start at 0, 100, 200, 300 us; the tier writes 0.5 B/us. 100 B held from op 1 and
    # 100 B from op 2: behind 100 - 50 = 50 at op 1, 200 - 100 = 100 at op 2, 200 - 150 =
    # 50 at op 3 (never less than 0 - 0 at op 0).
    assert shortfall([0.0, 100.0, 200.0, 300.0], 0.5, [(1, 4, 100), (2, 4, 100)]) == (2, 100.0)


def test_g10_recomputes_what_the_ssd_cannot_write_in_time():
    # Budget 310 B, 99 B of host memory (it holds X, no activation).
    # G10 alone: A0, A1, A2 to the SSD after p0, p1, p2. The SSD writes A0 100-300, A1
    # 300-500, A2 500-700; p4 (A1, A2, A3, A4: 400 B) waits for A1 until 500, p5 for A2
    # until 700: p5 ends at 800. Back (p6 800-900): A2 read 900-1100, p9 at 1100; A1
    # 1100-1300, p10 waits 100 us; A0 1300-1500, p11 waits 100 us: 1,600 us, 400 us stalled.
    # recompute: A0 is dropped after p0 and p0 runs again before p11 (100 us); A1, A2 to
    # the SSD: written 200-400 and 400-600; p4 runs at 400, p5 waits for A2 until 600 and
    # ends at 700; A2 read 800-1000, p9 1000-1100; A1 1000-1200, p10 waits 100 us
    # (1200-1300); the recompute 1300-1400, p11 1400-1500: 1,500 us, 200 us stalled.
    profile, hw = spill_profile(), machine(host=99)
    alone = make_plan(profile, hw, 310, "g10")
    assert alone.result.ok and alone.result.iteration_us == 1600.0 and alone.result.stall_us == 400.0
    assert offload("A0", "p0", "ssd") in alone.plan.actions
    planned = make_plan(profile, hw, 310, "g10", params={"recompute": True})
    assert list(planned.plan.actions) == [
        drop("A0", "p0"), offload("A1", "p1", "ssd"), offload("A2", "p2", "ssd"),
        prefetch("A2", "p6", "p9", "ssd"), prefetch("A1", "p7", "p10", "ssd"), recompute("A0", "p11")]
    result = planned.result
    assert result.ok and result.iteration_us == 1500.0
    assert result.stall_us == 200.0 and result.recompute_us == 100.0
    assert planned.plan.planner.notes["recomputed"] == {"tensors": 1, "bytes": 100}


def test_g10_recompute_changes_nothing_where_the_link_keeps_up():
    # With host memory for every activation, PCIe (1 B/us) writes a 100 B tensor in one
    # 100 us op: g10's plan runs in the ideal time, there is nothing to win, and the plan
    # is the same.
    profile, hw = spill_profile(), machine()
    alone = make_plan(profile, hw, 310, "g10")
    assert alone.result.iteration_us == profile.ideal_us == 1200.0
    assert make_plan(profile, hw, 310, "g10", params={"recompute": True}).plan.actions == alone.plan.actions
    assert "recomputed" not in alone.plan.planner.notes


def test_g10_recompute_over_pcie_when_host_memory_holds_everything():
    # The same graph on a machine whose PCIe moves 0.5 B/us (as the SSD above) with host
    # memory for all: the same moves to host memory, the same copy times, so the same
    # figures as on the SSD: 1,600 us alone, 1,500 us with A0 recomputed.
    profile, hw = spill_profile(), machine(d2h=0.0005, h2d=0.0005)
    alone = make_plan(profile, hw, 310, "g10")
    assert {(a.tensor, a.to) for a in alone.plan.actions if a.kind == "offload"} == {
        ("A0", "host"), ("A1", "host"), ("A2", "host")}
    assert alone.result.iteration_us == 1600.0
    planned = make_plan(profile, hw, 310, "g10", params={"recompute": True})
    assert list(planned.plan.actions) == [
        drop("A0", "p0"), offload("A1", "p1", "host"), offload("A2", "p2", "host"),
        prefetch("A2", "p6", "p9", "host"), prefetch("A1", "p7", "p10", "host"), recompute("A0", "p11")]
    assert planned.result.iteration_us == 1500.0 and planned.result.recompute_us == 100.0


@pytest.mark.parametrize("name", ["synth-transformer-l12-b16-s1024", "synth-cnn-l16-w128-b64-s224",
                                  "synth-mlp-l16-w8192-b1024"])
def test_g10_recompute_is_never_slower_than_g10_and_keeps_the_budget(name):
    from planner.shared.facts import budget_floor
    from simulator.catalog import open_profile
    from simulator.hardware import load_hardware
    hw = load_hardware("a100-40gb-pcie4")
    profile = open_profile(name)
    floor, _ = budget_floor(profile, moves_persistent=True)
    for fraction in (0.7, 0.5, 0.3):
        budget = min(int(profile.peak_bytes * fraction), hw.gpu.memory_bytes)
        if budget < floor:
            continue
        alone = make_plan(profile, hw, budget, "g10").result
        planned = make_plan(profile, hw, budget, "g10", params={"recompute": True})
        result = planned.result
        assert result.ok and result.peak_bytes <= budget
        assert not alone.ok or result.iteration_us <= alone.iteration_us


def test_joint_may_return_g10s_recompute_plan_but_starts_from_the_others():
    # best_heuristic's ``also`` (joint's RECOMPUTE_ALSO): the fallback is the fastest of every
    # heuristic, g10's recompute plan (1,500 us, above) included; the MIP start leaves it out
    # and is g10's own plan (1,600 us; lms's is no faster here).
    from planner.core.api import score, simulator_for
    from planner.core.registry import RunOptions
    from planner.shared.ilp.common import best_heuristic
    profile, hw = spill_profile(), machine(d2h=0.0005, h2d=0.0005)
    pool = best_heuristic(profile, hw, 310, (("lms", {}), ("g10", {})), RunOptions(),
                          also=(("g10", {"recompute": True}),))
    sim = simulator_for(profile, hw)
    fallback, start = pool(), pool(start=True)
    assert fallback.notes["heuristic"] == "g10 (recompute=True)" and start.notes["heuristic"] == "g10"
    assert score(sim, 310, fallback.actions, fallback.initial).iteration_us == 1500.0
    assert score(sim, 310, start.actions, start.initial).iteration_us == 1600.0
