"""Refinement of an interval MILP's plan against its simulated timeline (planner/search/ilp/refine.py)."""
from __future__ import annotations

import numpy as np
import pytest

from planner.core.api import make_plan, simulator_for
from planner.core.registry import RunOptions
from planner.shared.ilp.rows import Formulation
from planner.shared.ilp.candidates import candidates
from planner.shared.ilp.decode import predicted_us
from planner.shared.ilp.refine import at_positions_of, observed_positions, unheld_moves, with_positions
from simulator.plan import Plan, offload, prefetch
from tests.conftest import make_profile
from tests.engine_helpers import machine


def _long_gap(scale: int = 1, small: int | None = None, late: int | None = None):
    # t (50 B) made by p (op 0), read by r1 (op 1), idle over i2 .. i12, read by u13; i8 makes w (60 B), read
    # by i9: the peak is at ops 8 and 9, where t must be away. Every op takes 10 us; each makes a small c.
    # ``scale`` multiplies t's and w's bytes; ``small``: a tensor s of that many bytes, made and read as t is;
    # ``late``: a tensor y of that many bytes made by i11 and read by i12 alone
    tensors = {"t": (50 * scale, "activation"), "w": (60 * scale, "activation"), "out": (1, "activation")}
    pair = ["t"] + (["s"] if small else [])
    if small:
        tensors["s"] = (small, "activation")
    ops = [("p", "forward", 10.0, [], list(pair))]
    for k in range(1, 14):
        tensors[f"c{k}"] = (2, "activation")
        name = {1: "r1", 13: "u13"}.get(k, f"i{k}")
        ins = (list(pair) if k in (1, 13) else []) + ([f"c{k - 1}"] if k > 1 else []) + (["w"] if k == 9 else [])
        outs = [f"c{k}"] + (["w"] if k == 8 else []) + (["y"] if late and k == 11 else [])
        ins += ["y"] if late and k == 12 else []
        ops.append((name, "forward" if k < 8 else "backward", 10.0, ins, outs))
    ops.append(("end", "backward", 10.0, ["c13"], ["out"]))
    if late:
        tensors["y"] = (late, "activation")
    return make_profile(tensors, ops, "ilp-long-gap" + ("-small" if small else "") + ("-late" if late else ""))


def _long_gap_run(rate: float):
    """The long-gap graph one byte under its peak on a machine of ``rate`` GB/s each way, its candidates
    (window 2), t offloaded after r1 and prefetched after i10, and that plan's simulated run."""
    profile, hw = _long_gap(), machine(h2d=rate, d2h=rate)
    budget = max(profile.resident_bytes) - 1
    actions = [offload("t", "r1"), prefetch("t", "i10", "u13")]
    sim = simulator_for(profile, hw)
    run = sim.simulate(Plan(profile_name=profile.name, profile_sha256=sim.compiled.sha256, actions=tuple(actions)),
                       budget, record=True)
    return profile, hw, budget, candidates(profile, hw, budget, 2, ("host",)), actions, run


def test_the_positions_a_plan_ran_at_are_added_and_the_model_then_times_it_as_simulated():
    # 1 B/us each way: t's copies take 50 us (5 ops). Offload issued when r1 ends (20 us), done at 70 us: the
    # first op started by then is i7 (op 7). Prefetch issued after i10 (110 us), its copy 110-160 us, started
    # in i11: fetch position 10. u13 waits for it from 130 to 160 us: simulated 150 us of ops + 30 us = 180 us.
    profile, hw, budget, cands, actions, run = _long_gap_run(0.001)
    assert [(c.tensor, c.after, c.before, c.release, c.fetch) for c in cands] == [("t", 1, 13, (3, 4), (10, 11))]
    assert run.ok and run.iteration_us == pytest.approx(180.0)
    found = observed_positions(profile, cands, actions, run.timeline)
    assert found == {0: (7, 10, 1, False)}   # its offload issued after r1 (op 1); i7 did not wait for it
    grown, count = with_positions(cands, found)
    assert count == 1 and grown[0].release == (3, 4, 7) and grown[0].fetch == (10, 11) and grown[0].issued == 1
    assert cands[0].issued == 0   # the model's own: after t's producer p (R11: r1 reads it while it is copied)
    assert with_positions(grown, found) == (grown, 0)   # nothing new the second time

    def price(cs):
        form = Formulation(profile, hw, budget, cs)
        moved, redone, missing = form.choices_of_plan(actions, run.timeline, copy_start=True)
        assert missing == 0
        return predicted_us(form, form.priced(form.values_of(moved, redone), 10, 1)), moved

    # within the window the offload must be done by op 4: issued after p, steps 1-3 stretch to 50 us (+20 us),
    # and the prefetch's 50 us in steps 11-12 (+30 us): 200 us; at the positions it ran at (issued after r1),
    # the offload runs over steps 2-6 under their 50 us of compute: 180 us, the simulated time
    before, moved = price(cands)
    assert moved == {0: (4, 10)} and before == pytest.approx(200.0)
    after, moved = price(grown)
    assert moved == {0: (7, 10)} and after == pytest.approx(run.iteration_us)


@pytest.mark.parametrize("planner", ["autotm", "tmof"])
def test_a_solvers_plan_is_timed_by_the_refined_model(planner):
    # A window of 2 cannot hold t's 50 us copies: the refined model times the returned plan as simulated
    profile, hw = _long_gap(), machine(h2d=0.001, d2h=0.001)
    budget = max(profile.resident_bytes) - 1
    planned = make_plan(profile, hw, budget, planner, {"window": 2, "start_positions": False},
                        options=RunOptions(time_limit=20, threads=1))   # the model's own positions, refined
    notes = planned.plan.planner.notes
    assert planned.result.ok and "fallback" not in notes
    assert notes["refinement"] and notes["refinement"][0]["grown"] >= 1
    assert notes["first_model_objective_us"] > notes["simulated_us"] * 1.1
    assert notes["model_objective_us"] == pytest.approx(notes["simulated_us"], rel=1e-6)


def test_a_heuristic_start_is_priced_at_the_positions_it_ran_at():
    # The hand-computed plan of the first test as the MIP start: the window's model prices it at 200 us, the
    # model with its positions (at_positions_of) at 180 us, its simulated time
    profile, hw = _long_gap(), machine(h2d=0.001, d2h=0.001)
    budget = max(profile.resident_bytes) - 1
    actions = [offload("t", "r1"), prefetch("t", "i10", "u13")]
    sim = simulator_for(profile, hw)
    form = Formulation(profile, hw, budget, candidates(profile, hw, budget, 2, ("host",)))
    grown_form, grown = at_positions_of(form, sim, budget, actions, {}, False)
    assert grown == 1 and grown_form.cands[0].release == (3, 4, 7)
    assert at_positions_of(grown_form, sim, budget, actions, {}, False) == (grown_form, 0)

    def price(f, copy_start):
        run = sim.simulate(Plan(profile_name=profile.name, profile_sha256=sim.compiled.sha256,
                                actions=tuple(actions)), budget, record=True)
        moved, redone, _ = f.choices_of_plan(actions, run.timeline, copy_start=copy_start)
        return predicted_us(f, f.priced(f.values_of(moved, redone), 10, 1))
    assert price(form, False) == pytest.approx(200.0) and price(grown_form, True) == pytest.approx(180.0)


@pytest.mark.parametrize("planner", ["autotm", "tmof", "deeptm"])
def test_start_positions_price_the_heuristics_plan_at_its_own_timeline(planner):
    # lms's plan (170 us simulated: offload after r1, prefetch after i9) costs the window's model 200 us, as the
    # first test's plan does; with start_positions its offload's release gains op 7, where it ended, and the
    # start costs 170 us, as simulated; the solver's plan is then timed as simulated (deeptm's too, whose own
    # plan without the positions simulates at 180 us: without polish it returns lms's plan, polished its
    # prefetch goes one op earlier and it runs at 170 us, its own)
    profile, hw = _long_gap(), machine(h2d=0.001, d2h=0.001)
    budget = max(profile.resident_bytes) - 1
    extra = {"hot": 0.0} if planner == "deeptm" else {}
    options = RunOptions(time_limit=20, threads=1)
    off = make_plan(profile, hw, budget, planner, {"window": 2, "start_positions": False, "polish": False, **extra},
                    options=options).plan.planner.notes
    on = make_plan(profile, hw, budget, planner, {"window": 2, "start_positions": True, **extra},
                   options=options).plan.planner.notes
    assert "start_positions" not in off and off["start_model_us"] == pytest.approx(200.0)
    assert on["start_positions"] == 1 and on["start_model_us"] == pytest.approx(170.0)
    assert on["heuristic_us"] == pytest.approx(170.0) and "fallback" not in on
    assert on["model_objective_us"] == pytest.approx(on["simulated_us"]) == pytest.approx(170.0)
    assert ("fallback" in off) == (planner == "deeptm")
    polished = make_plan(profile, hw, budget, planner, {"window": 2, "start_positions": False, **extra},
                         options=options).plan.planner.notes
    assert "fallback" not in polished and polished["simulated_us"] == pytest.approx(170.0)
    assert ("polish" in polished) == (planner == "deeptm")
    if planner == "deeptm":
        assert polished["polish"]["before_us"] == pytest.approx(180.0) and polished["polish"]["changes"] == 1


def test_a_heuristics_moves_of_small_tensors_gain_candidates_at_their_positions():
    # _long_gap at 200x the bytes, with s (5 B) made and read as t: the largest excess over a budget 9,000 B
    # under the peak makes 9 B the smallest candidate tensor (SMALL), so s has none
    profile, hw = _long_gap(scale=200, small=5), machine(h2d=0.2, d2h=0.2)
    budget = max(profile.resident_bytes) - 9_000
    form = Formulation(profile, hw, budget, candidates(profile, hw, budget, 2, ("host",)))
    assert {c.tensor for c in form.cands} == {"t"}
    actions = [offload("t", "r1"), offload("s", "r1"), prefetch("t", "i11", "u13"), prefetch("s", "i11", "u13")]
    assert unheld_moves(form, actions) == {("s", 13, "host")}
    sim = simulator_for(profile, hw)
    grown_form, grown = at_positions_of(form, sim, budget, actions, {}, False, window=2)
    assert {c.tensor for c in grown_form.cands} == {"t", "s"} and grown >= 1
    assert unheld_moves(grown_form, actions) == set()
    run = sim.simulate(Plan(profile_name=profile.name, profile_sha256=sim.compiled.sha256, actions=tuple(actions)),
                       budget, record=True)
    moved, _, missing = grown_form.choices_of_plan(actions, run.timeline, copy_start=True)
    assert missing == 0 and len(moved) == 2

    def price(f):
        moved, redone, _ = f.choices_of_plan(actions, run.timeline, copy_start=True)
        return predicted_us(f, f.priced(f.values_of(f.cover(moved, redone), redone), 10, 1))
    # without s's candidate the model holds t's move alone, at the window's release (op 4), its copy from
    # step 1 (issued after p, the model's earliest): 210 us; with both
    # at the positions they ran at, the plan's simulated 190 us
    assert price(form) == pytest.approx(210.0)
    assert price(grown_form) == pytest.approx(run.iteration_us, rel=1e-3) and run.iteration_us < 200.0


def test_a_copy_started_while_the_next_op_waits_is_fetched_after_the_op_that_ended():
    # Ops at 0-10, 10-20, 20-30 and 40-50 us (op 3 waited 10 us). R12 takes a prefetch's memory when its copy
    # starts: started at 25 us, during op 2, the model must hold it from op 2 (fetched after op 1); started at
    # 30 us, once op 2 had ended, from op 3 (fetched after op 2); at 20 us, as op 2 starts, from op 2.
    from planner.shared.ilp.decode import fetched_after
    starts, ends = np.array([0.0, 10.0, 20.0, 40.0]), np.array([10.0, 20.0, 30.0, 50.0])
    assert fetched_after(starts, ends, 25.0) == 1
    assert fetched_after(starts, ends, 30.0) == 2
    assert fetched_after(starts, ends, 35.0) == 2
    assert fetched_after(starts, ends, 20.0) == 1
    assert fetched_after(starts, ends, 0.0) == -1   # before the first op: fetched at the iteration's start


def _priced_at_own_positions(profile, hw, budget, plan, window):
    """A plan's choices in the joint model gained its own positions, and the model's time for them."""
    from planner.shared.ilp.candidates import recomputes
    sim = simulator_for(profile, hw)
    run = sim.simulate(plan, budget, record=True)
    form = Formulation(profile, hw, budget, candidates(profile, hw, budget, window, ("host",)),
                       redo=recomputes(profile, budget))
    form, _ = at_positions_of(form, sim, budget, plan.actions, plan.initial, False, window)
    moved, redone, missing = form.choices_of_plan(plan.actions, run.timeline, plan.initial, copy_start=True)
    x = form.priced(form.values_of(form.cover(moved, redone), redone), 10, 1)
    return form, moved, redone, missing, (None if x is None else predicted_us(form, x)), run


def test_a_chain_recompute_does_not_hide_the_recompute_of_its_interval():
    # joint's chain plan on the chain graph (tests/test_ilp.py): s is dropped after fs, regenerated before gx
    # (a chain: x's recompute reads it), dropped after gx and recomputed before gs. ``to_actions`` lists every
    # drop before the recomputes, so "drop s after gx" comes before "recompute s before gx" in the list: s's
    # interval recompute (fs .. gs) must still be read as one of the plan's choices, with x's, and the model
    # then prices the plan at the simulated 140 us (110 us ideal + fx and fs before gx + fs before gs)
    from tests.test_ilp import CHAIN_OPS, CHAIN_TENSORS
    profile, hw = make_profile(CHAIN_TENSORS, CHAIN_OPS, "ilp-chain"), machine(h2d=0.0001, d2h=0.0001)
    planned = make_plan(profile, hw, 183, "joint", {"search": False, "polish": False},   # polish keeps s (130 us)
                        options=RunOptions(time_limit=20, threads=1))
    kinds = [(a.kind, a.tensor) for a in planned.plan.actions]
    assert kinds.index(("drop", "s")) < kinds.index(("recompute", "s"))
    assert sum(k == ("drop", "s") for k in kinds) == 2
    form, moved, redone, missing, model_us, run = _priced_at_own_positions(profile, hw, 183, planned.plan, 8)
    assert {form.redo[k].tensor for k in redone} == {"s", "x"} and not moved and missing == 0
    assert run.iteration_us == pytest.approx(140.0) and model_us == pytest.approx(140.0)


def test_a_prefetch_due_at_a_recompute_inside_its_interval_is_that_intervals_move():
    # the retarget graph (tests/test_ilp.py): s goes to host memory and is prefetched for x's recompute before
    # gx, inside s's interval (fs .. gs). The model holds that move (its copy done before gx, fetched by op
    # gx-2 at the latest) and prices the plan at its simulated time; without it, more moves are added or none fit
    from tests.test_ilp import retarget_graph
    profile, hw = retarget_graph()
    planned = make_plan(profile, hw, 200, "joint", {"search": False}, options=RunOptions(time_limit=20, threads=1))
    assert ("prefetch", "s", "gx") in [(a.kind, a.tensor, a.before) for a in planned.plan.actions]
    form, moved, redone, missing, model_us, run = _priced_at_own_positions(profile, hw, 200, planned.plan, 8)
    index = profile.op_index
    (k, (release, fetch)), = [(k, v) for k, v in moved.items() if form.cands[k].tensor == "s"]
    assert form.cands[k].before == index["gs"] and fetch <= index["gx"] - 2 and missing == 0
    assert {form.redo[j].tensor for j in redone} == {"x"}
    assert model_us == pytest.approx(run.iteration_us, rel=1e-6)
    found = observed_positions(profile, form.cands, planned.plan.actions, run.timeline)
    assert found[k][1] is not None and found[k][1] <= index["gx"] - 2


def test_copies_run_in_pieces_of_one_step_unless_positions_are_far_apart_by_design():
    # one step each: a FIFO stream's copy goes where the ops are, not in proportion to a piece's op times (a
    # long op in a piece with short ones was charged the copies of every piece stacked on it); ``reach`` and
    # ``far`` positions, sparse by design, keep pieces of 1, 1, 2, 4, ... steps
    from planner.shared.ilp.positions import chunks
    assert chunks(3, 7, early=True) == [(3, 4), (4, 5), (5, 6), (6, 7)]
    assert chunks(0, 7, early=True, coarse=True) == [(0, 1), (1, 2), (2, 4), (4, 7)]
    assert chunks(0, 7, early=False, coarse=True) == [(0, 3), (3, 5), (5, 6), (6, 7)]
    profile, hw = _long_gap(), machine(h2d=0.001, d2h=0.001)
    budget = max(profile.resident_bytes) - 1
    fine, = candidates(profile, hw, budget, 2, ("host",))
    coarse, = candidates(profile, hw, budget, 2, ("host",), far=1)
    assert not fine.coarse and coarse.coarse


def test_an_offload_may_copy_from_the_last_write_before_its_interval():
    # t is made by p (op 0) and read by r1 (op 1) before its idle interval: its offload may be issued after
    # p, as ``offload_points`` lowers it, so the copy may run in r1's step too (R11 lets r1 read it meanwhile);
    # an interval after an earlier idle interval of the same tensor starts no earlier than that one's end
    from planner.shared.ilp.candidates import earliest_issue
    profile = _long_gap()
    assert earliest_issue(profile, "t", 1, -1) == 0
    assert earliest_issue(profile, "t", 1, 1) == 1
    assert earliest_issue(profile, "w", 9, -1) == 8   # w made by i8, read by i9


def test_an_op_that_waited_for_an_offload_to_end_is_priced_with_the_wait():
    # 0.5 B/us: t's copies take 100 us. Offload issued after r1 (20 us), done at 120 us; ops 2-7 run 20-80 us
    # and i8 (the peak, where t must be away) waits for it until 120 us: the release is op 8, and op 8 waited.
    # Prefetch after i10 (150 us), done at 250 us; u13 waits from 170 us. Simulated: 150 us of ops, 40 us
    # before i8 and 80 us before u13, 270 us. The model at those positions: the offload's last 40 us a wait
    # before i8, T[8] = 10 + 40 us (a piece in step 8 that overlapped i8 would give 260 us)
    from planner.shared.ilp.candidates import MS
    profile, hw, budget, cands, actions, run = _long_gap_run(0.0005)
    assert run.ok and run.iteration_us == pytest.approx(270.0)
    found = observed_positions(profile, cands, actions, run.timeline)
    assert found == {0: (8, 10, 1, True)}
    grown, _ = with_positions(cands, found)
    c = grown[0]
    assert c.waits == (8,) and [c.out_pieces[j] for j in c.wait_pieces] == [(8, 9, 2)]
    form = Formulation(profile, hw, budget, grown)
    moved, redone, _ = form.choices_of_plan(actions, run.timeline, copy_start=True)
    x = form.priced(form.values_of(moved, redone), 10, 1)
    assert moved == {0: (8, 10)} and predicted_us(form, x) == pytest.approx(270.0)
    assert x[form.T + 8] / MS == pytest.approx(10.0 + x[form.cols[0].u + c.wait_pieces[0]] / MS)
