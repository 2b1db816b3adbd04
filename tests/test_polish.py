"""Polish (planner/shared/polish.py): a local search on a plan's swaps and recomputes, judged
by the simulator.

Machine (tests/engine_helpers.py): PCIe 1 B/us each way, no latency: 100 B take 100 us.
"""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings

from planner.core.api import simulator_for
from planner.shared.polish import polish, polish_in_stages
from simulator.plan import Plan, drop, offload, prefetch, recompute
from tests.conftest import make_profile
from tests.engine_helpers import machine
from tests.test_engine_properties import scenarios
from tests.test_planner_g10 import chain_profile


def far():
    return time.perf_counter() + 60.0


def test_a_late_prefetch_is_issued_earlier():
    # p0..p7 of 100 us (ideal 800); A (100 B) made by p0, read by p7; a 50 B workspace at
    # p3: 100 + 2 chain tensors + 50 = 152 B there, over the 110 B budget. A out after p0
    # (100-200 us), back after p6: the copy runs 700-800 and p7 waits 100 us: 900 us.
    # The first shift tried that helps (-16 and -4 ops are before the offload or at p2):
    # issued after p2 (300 us), the copy waits for p3's workspace (R12) and runs 400-500;
    # A is back long before p7: 800 us, the ideal.
    profile = chain_profile("late", 8, {"A": (100, "activation")}, {0: ((), ("A",), 0), 3: ((), (), 50),
                                                                      7: (("A",), (), 0)})
    sim = simulator_for(profile, machine())
    actions = [offload("A", "p0"), prefetch("A", "p6", "p7")]
    assert sim.simulate(_plan(profile, actions), 110).iteration_us == pytest.approx(900.0)
    done = polish(sim, 110, actions, {}, far())
    assert done.result.ok and done.result.iteration_us == pytest.approx(800.0)
    assert done.changes == 1
    assert done.actions == [offload("A", "p0"), prefetch("A", "p2", "p7")]


def test_a_move_that_only_costs_is_taken_back():
    # p0..p3 of 100 us (ideal 400); B (300 B) made by p0, read by p3; everything fits the
    # budget. Out after p0 (copy 100-400 us), back after p1: the prefetch starts when the
    # offload has ended (400-700) and p3 waits until 700: 800 us. No shift helps (after
    # p2 the copy still starts at 400; the offload cannot move past its prefetch); without
    # the move the plan runs at the ideal.
    profile = chain_profile("costly", 4, {"B": (300, "activation")}, {0: ((), ("B",), 0), 3: (("B",), (), 0)})
    sim = simulator_for(profile, machine())
    actions = [offload("B", "p0"), prefetch("B", "p1", "p3")]
    done = polish(sim, 1000, actions, {}, far())
    assert done.result.iteration_us == pytest.approx(400.0)
    assert done.actions == [] and done.changes == 1


def test_a_plan_at_the_ideal_or_one_that_does_not_run_is_kept():
    # As the first test with a second tensor D (50 B, made by p1, read by p6) and the budget
    # at 160 B: with A out after p0, p3 holds D 50 + 2 + 50 = 102 B; A's prefetch after p5
    # runs 600-700 (p6 holds D 50 + 2 + A 100 = 152 B), so the plan runs at the ideal,
    # 800 us, and no change can be strictly faster: polish keeps it.
    tensors = {"A": (100, "activation"), "D": (50, "activation")}
    extra = {0: ((), ("A",), 0), 1: ((), ("D",), 0), 3: ((), (), 50), 6: (("D",), (), 0), 7: (("A",), (), 0)}
    profile = chain_profile("more", 8, tensors, extra)
    sim = simulator_for(profile, machine())
    alone = [offload("A", "p0"), prefetch("A", "p5", "p7")]
    done = polish(sim, 160, alone, {}, far())
    assert done.result.iteration_us == pytest.approx(800.0) and done.actions == alone and done.changes == 0
    # At 60 B the plan does not run (at p3, 102 B with A off): polish leaves it alone.
    done = polish(sim, 60, alone, {}, far())
    assert not done.result.ok and done.actions == alone and done.changes == 0


def test_the_changes_tried_in_order():
    # The first test's graph with D (50 B) made by p1 and read by p6, at a 110 B budget (p3
    # is over it): A's offload may be issued 1 or 3 ops later (before its prefetch after
    # p6), its prefetch 1 or 4 ops earlier or 1 later (after the offload, before p7); D may
    # move out after p1 and back after p6 - 4 = p2 (16 ops before p6 is before p2: p2 too,
    # tried once); A's move may be taken back.
    from planner.shared.polish import _addable_gaps, _neighbours
    tensors = {"A": (100, "activation"), "D": (50, "activation")}
    extra = {0: ((), ("A",), 0), 1: ((), ("D",), 0), 3: ((), (), 50), 6: (("D",), (), 0), 7: (("A",), (), 0)}
    profile = chain_profile("tried", 8, tensors, extra)
    actions = [offload("A", "p0"), prefetch("A", "p6", "p7")]
    assert _addable_gaps(profile, 110) == [("A", 0, 7), ("D", 1, 6)]
    assert _neighbours(profile, actions, {}, _addable_gaps(profile, 110)) == [
        ("issue", 0, 1), ("issue", 0, 3), ("issue", 1, 2), ("issue", 1, 5),
        ("add", "D", 1, 2, 6), ("keep", "A")]


def test_a_tensor_with_other_actions_is_left_alone():
    # A is dropped and recomputed besides its move: polish changes none of its actions.
    profile = chain_profile("other", 8, {"A": (100, "activation")}, {0: ((), ("A",), 0), 3: ((), (), 50),
                                                                       4: (("A",), (), 0), 7: (("A",), (), 0)})
    sim = simulator_for(profile, machine())
    actions = [offload("A", "p0"), prefetch("A", "p2", "p4"), drop("A", "p4"), recompute("A", "p7")]
    start = sim.simulate(_plan(profile, actions), 110)
    done = polish(sim, 110, actions, {}, far())
    assert done.actions == actions and done.result.iteration_us == start.iteration_us


def test_a_tensor_recomputed_twice_stays_after_its_first_recompute_where_it_fits():
    # p0..p7 of 100 us (ideal 800); A (100 B) made by p0, read by p3 and p6; a 50 B
    # workspace at p1: 152 B there with A, over the 110 B budget, so A is off at p1 and p2.
    # Dropped after p0, recomputed before p3 (p0 again, 100 us), dropped after p3 and
    # recomputed before p6: 1,000 us. From p3 to p6 it fits (102 B): the second drop and
    # recompute are taken back, 900 us; the first pair is not (A at p1 would not fit).
    profile = chain_profile("twice", 8, {"A": (100, "activation")}, {0: ((), ("A",), 0), 1: ((), (), 50),
                                                                       3: (("A",), (), 0), 6: (("A",), (), 0)})
    sim = simulator_for(profile, machine())
    actions = [drop("A", "p0"), recompute("A", "p3"), drop("A", "p3"), recompute("A", "p6")]
    assert sim.simulate(_plan(profile, actions), 110).iteration_us == pytest.approx(1000.0)
    done = polish(sim, 110, actions, {}, far())
    assert done.result.ok and done.result.iteration_us == pytest.approx(900.0) and done.changes == 1
    assert done.actions == [drop("A", "p0"), recompute("A", "p3")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_polish_never_slows_a_plan_and_repeats_itself(scenario):
    profile, plan, hardware, budget = scenario
    sim = simulator_for(profile, hardware)
    before = sim.simulate(plan, budget)
    first = polish(sim, budget, list(plan.actions), {}, far())
    again = polish(sim, budget, list(plan.actions), {}, far())
    assert first.actions == again.actions and first.changes == again.changes
    if not before.ok:
        assert first.actions == list(plan.actions)
        return
    assert first.result.ok and first.result.iteration_us <= before.iteration_us
    assert (first.changes == 0) == (first.result.iteration_us == before.iteration_us)
    assert sim.simulate(_plan(profile, first.actions), budget).iteration_us == \
        pytest.approx(first.result.iteration_us)


def _plan(profile, actions):
    return Plan(profile.name, tuple(actions))


def _ops(spec):
    """Ops q0.. in order from (time us, inputs, outputs, workspace) tuples."""
    return [(f"q{k}", "forward", t, list(i), list(o), None, w) for k, (t, i, o, w) in enumerate(spec)]


def _run(profile, actions, budget, initial=None):
    sim = simulator_for(profile, machine())
    return sim.simulate(Plan(profile.name, tuple(actions), initial=dict(initial or {})), budget)


def _sharing_the_up_link(tid: str, kind: str, reader: int):
    """q0..q7 of 100 us: ``tid`` (100 B, ``kind``) read by op ``reader``, which makes A
    (100 B); a 150 B workspace two ops later; both read by q7."""
    spec = [(100, (), (), 0)] * 8
    spec[reader] = (100, (tid,), ("A",), 0)
    spec[reader + 2] = (100, (), (), 150)
    spec[7] = (100, (tid, "A"), (), 0)
    return make_profile({tid: (100, kind), "A": (100, "activation")}, _ops(spec), kind)


def test_the_input_is_copied_out_from_the_start_while_the_first_op_reads_it():
    # q0..q7 of 100 us (ideal 800). X, the input (100 B), is read by q0 and q7; A (100 B)
    # is made by q0 and read by q7; a 150 B workspace at q2 needs both off (budget 210:
    # 100 + 100 + 150 = 350, one of them 250, neither 150). Copied out after q0, X runs
    # 100-200 and A 200-300 on the up link, so q2 waits until 300; both come back after q4
    # (X 600-700, A 700-800) and q7 runs 800-900: 900 us. X's copy issued at the start runs
    # 0-100 while q0 reads it (R11: the window's reads; released after q0), A's 100-200,
    # q2 starts at 200 on time; back after q4 (500-600, 600-700), q7 at 700: 800 us.
    profile = _sharing_the_up_link("X", "input", 0)
    actions = [offload("X", "q0"), offload("A", "q0"), prefetch("X", "q4", "q7"), prefetch("A", "q4", "q7")]
    assert _run(profile, actions, 210).iteration_us == pytest.approx(900.0)
    done = polish(simulator_for(profile, machine()), 210, actions, {}, far(), kinds=("start",))
    assert done.result.iteration_us == pytest.approx(800.0) and done.changes == 1
    assert done.actions == [offload("X", None)] + actions[1:]


def test_a_weight_starts_in_host_memory_and_leaves_the_up_link_to_an_activation():
    # As above with W a weight read by q1 and q7 (never updated) and A made by q1. Copied out
    # after q1, W runs 200-300 and A 300-400: q3 (the 150 B workspace) waits until 400;
    # back after q4 (500-600, 600-700), q7 at 700: 900 us. Started in host memory, W comes
    # down before q1 (0-100, the down link is idle), is dropped after q1 (its host copy is
    # the value it started with, R16) and again after q7 (R20: it ends in host memory): A
    # alone crosses the up link (200-300), q3 starts at 300 on time: 800 us.
    profile = _sharing_the_up_link("W", "weight", 1)
    actions = [offload("W", "q1"), offload("A", "q1"), prefetch("W", "q4", "q7"), prefetch("A", "q4", "q7")]
    assert _run(profile, actions, 210).iteration_us == pytest.approx(900.0)
    done = polish(simulator_for(profile, machine()), 210, actions, {}, far(), kinds=("host",))
    assert done.result.iteration_us == pytest.approx(800.0) and done.changes == 1
    assert done.initial == {"W": "host"}
    assert done.actions == [prefetch("W", None, "q1"), offload("A", "q1"), drop("W", "q1"),
                            prefetch("W", "q4", "q7"), prefetch("A", "q4", "q7"), drop("W", "q7")]


def test_a_recompute_source_is_recomputed_too_where_a_dearer_recompute_gives_way():
    # q0 (10 us) makes X (100 B), q1 (10 us) makes A from X, q2 (100 us) makes B; q3..q6 take
    # 100 us (a 50 B workspace at q4), q7 reads B, q8 A, q9 X: ideal 820 us, budget 200. The
    # plan keeps X and recomputes A (10 us, from X) and B (100 us): 930 us. Taking back B
    # alone or A alone does not fit (X + B + 50 at q4); recomputing X before A's recompute
    # alone costs 10 us more (940); with B's recompute taken back B stays on the GPU from q2
    # to q7 in X's place (150 B at q4; 200 at q8: X and A): 820 + 10 + 10 = 840 us.
    tensors = {"X": (100, "activation"), "A": (100, "activation"), "B": (100, "activation")}
    ops = _ops([(10, (), ("X",), 0), (10, ("X",), ("A",), 0), (100, (), ("B",), 0), (100, (), (), 0),
                (100, (), (), 50), (100, (), (), 0), (100, (), (), 0), (100, ("B",), (), 0),
                (100, ("A",), (), 0), (100, ("X",), (), 0)])
    profile = make_profile(tensors, ops, "chain")
    actions = [drop("A", "q1"), drop("B", "q2"), recompute("B", "q7"), recompute("A", "q8")]
    assert _run(profile, actions, 200).iteration_us == pytest.approx(930.0)
    chained = [drop("A", "q1"), recompute("X", "q8"), recompute("A", "q8"), drop("X", "q1")]
    assert _run(profile, chained + actions[1:3], 200).iteration_us == pytest.approx(940.0)
    done = polish(simulator_for(profile, machine()), 200, actions, {}, far(), kinds=("remake", "chain"))
    assert done.result.iteration_us == pytest.approx(840.0) and done.changes == 1
    assert done.actions == chained


def test_a_recompute_becomes_a_swap_where_the_up_link_has_room():
    # q0..q11 of 100 us (ideal 1,200); q0 makes A (100 B), read by q11; a 50 B workspace at
    # q2 (budget 110: A must be off there). Recomputed (q0 again): 1,300 us. Swapped instead:
    # out after q0 (100-200, freed as q2 starts), back by a prefetch issued 8 ops before
    # q11, after q3 (400-500): 1,200 us. The stages: taking the recompute back does not fit,
    # so the first stage changes nothing, and the second makes it a swap.
    tensors = {"A": (100, "activation")}
    ops = _ops([(100, (), ("A",), 0), (100, (), (), 0), (100, (), (), 50)] + [(100, (), (), 0)] * 8
               + [(100, ("A",), (), 0)])
    profile = make_profile(tensors, ops, "swap")
    actions = [drop("A", "q0"), recompute("A", "q11")]
    assert _run(profile, actions, 110).iteration_us == pytest.approx(1300.0)
    sim = simulator_for(profile, machine())
    done = polish_in_stages(sim, 110, actions, {}, far(), stages=(("remake",), ("swap",)))
    assert done.result.iteration_us == pytest.approx(1200.0) and done.changes == 1
    assert done.actions == [offload("A", "q0"), prefetch("A", "q3", "q11")]
    assert done.runs == 2 + 2   # each stage scores the plan it starts from, then one change
