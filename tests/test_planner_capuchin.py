"""The ``capuchin`` planner: swap where the copy hides, else the cheaper of a swap stall and
a recompute ranked by memory saved per second (MSPS), and a feedback pass that moves a
stalled prefetch's trigger earlier.

Hand-made graphs run on the test machine of tests/engine_helpers.py: PCIe moves 1 byte
per microsecond each way with no latency, so a tensor of N bytes takes N us to copy.
"""
from __future__ import annotations

import pytest

from planner.shared.facts import budget_floor
from planner.core.api import make_plan
from simulator.catalog import open_profile
from simulator.hardware import load_hardware
from simulator.plan import drop, offload, prefetch, recompute
from tests.conftest import make_profile
from tests.engine_helpers import machine

HW = machine()

# L is idle from c1 to bL across two 300 us ops: its copies (100 us each way) hide.
# S is idle from u1 to bS across 30 us only (less than one 100 us copy), and its
# producer fS takes 5 us.
#
#   op      time  starts  no-swap memory (w 10 + live tensors)
#   fL       10      0    110   L
#   c1       10     10    120   L h1
#   long1   300     20    130   L h1 h2
#   fS        5    320    220   L h2 S
#   u1       10    325    230   L h2 S h3
#   peak     20    335    420   L S h3 P
#   u2       10    355    420   L S P h4
#   bS       10    365    230   L S h4 g1
#   long2   300    375    130   L g1 g2
#   bL       10    675    130   L g2 g3        ideal 685 us
#
# Budget 220: peak and u2 are 200 over, so both L and S must be away then.
HYBRID_TENSORS = {
    "w": (10, "weight"), "L": (100, "activation"), "S": (100, "activation"), "P": (200, "activation"),
    "h1": (10, "activation"), "h2": (10, "activation"), "h3": (10, "activation"), "h4": (10, "activation"),
    "g1": (10, "gradient"), "g2": (10, "gradient"), "g3": (10, "gradient"),
}
HYBRID_OPS = [
    ("fL", "forward", 10.0, ["w"], ["L"]),
    ("c1", "forward", 10.0, ["L"], ["h1"]),
    ("long1", "forward", 300.0, ["h1"], ["h2"]),
    ("fS", "forward", 5.0, ["w"], ["S"]),
    ("u1", "forward", 10.0, ["S", "h2"], ["h3"]),
    ("peak", "forward", 20.0, ["h3"], ["P"]),
    ("u2", "forward", 10.0, ["P"], ["h4"]),
    ("bS", "backward", 10.0, ["S", "h4"], ["g1"]),
    ("long2", "backward", 300.0, ["g1"], ["g2"]),
    ("bL", "backward", 10.0, ["L", "g2"], ["g3"]),
]


def hybrid():
    return make_profile(HYBRID_TENSORS, HYBRID_OPS, "hybrid")


def kinds(plan) -> set[str]:
    return {a.kind for a in plan.actions}


def test_swaps_the_long_gap_and_recomputes_the_cheap_tensor_whose_gap_cannot_hide_a_swap():
    # L: offload after c1 ends (20) runs to 120, before fS (320), the first op it must be
    # away for; the prefetch must end by bL (675), so SwapInStart is 575 and the trigger is
    # bS (ends 375): FT = 575 - 120 = 455, fully hidden. S: a swap would stall ~170 us,
    # fS costs 5 us, so S is dropped after u1 and recomputed before bS. Iteration: the
    # ideal 685 plus the 5 us recompute.
    planned = make_plan(hybrid(), HW, 220, "capuchin")
    assert list(planned.plan.actions) == [
        offload("L", "c1"), drop("S", "u1"), prefetch("L", "bS", "bL"), recompute("S", "bS")]
    assert planned.result.ok
    assert planned.result.iteration_us == pytest.approx(690.0)
    assert planned.result.stall_us == pytest.approx(0.0)
    assert planned.result.peak_bytes <= 220


def test_with_recompute_false_it_never_recomputes():
    # S must now be swapped: its offload (335-435) makes peak wait 100 us for memory, and
    # its prefetch, issued after u2 ends (465), makes bS wait until 565: 200 us of stall.
    planned = make_plan(hybrid(), HW, 220, "capuchin", {"recompute": False})
    assert kinds(planned.plan) == {"offload", "prefetch"}
    assert offload("S", "u1") in planned.plan.actions
    assert planned.result.ok
    assert planned.result.stall_us == pytest.approx(200.0)
    assert planned.result.iteration_us == pytest.approx(885.0)


def test_with_swap_false_it_never_swaps():
    # L is recomputed too (fL, 10 us, reads only the weight w): 685 + 5 + 10.
    planned = make_plan(hybrid(), HW, 220, "capuchin", {"swap": False})
    assert kinds(planned.plan) == {"drop", "recompute"}
    assert recompute("L", "bL") in planned.plan.actions
    assert planned.result.ok
    assert planned.result.iteration_us == pytest.approx(700.0)


def test_a_tensor_updated_in_place_is_swapped_not_recomputed():
    # u1 now updates S in place: recomputing S before bS would be invalid (R15), so the
    # planner swaps it although the swap stalls.
    ops = [op if op[0] != "u1" else ("u1", "forward", 10.0, ["h2"], ["h3"], ["S"]) for op in HYBRID_OPS]
    planned = make_plan(make_profile(HYBRID_TENSORS, ops), HW, 220, "capuchin")
    assert all(a.tensor != "S" or a.kind in ("offload", "prefetch") for a in planned.plan.actions)
    assert offload("S", "u1") in planned.plan.actions
    assert planned.result.ok


def msps_profile(b_producer_us: float):
    # A: 100 B made by fA in 50 us (2 B/us). B: 60 B made by fB in b_producer_us.
    #   op    no-swap memory (w 10 + live)
    #   fA    110  A            uB    190  A B h1 h2
    #   fB    170  A B          peak  280  A B h2 P
    #   uA    180  A B h1       u     280  A B P h3
    #   bB    190  A B h3 g1    bA    130  A g1 g2
    # Budget 230: peak and u are 50 over; evicting either A (idle uA..bA) or B (idle
    # uB..bB) is enough. No swap can hide on this machine (A's gap is 40 us, B's 20 us).
    tensors = {"w": (10, "weight"), "A": (100, "activation"), "B": (60, "activation"),
               "h1": (10, "activation"), "h2": (10, "activation"), "P": (100, "activation"),
               "h3": (10, "activation"), "g1": (10, "gradient"), "g2": (10, "gradient")}
    ops = [("fA", "forward", 50.0, ["w"], ["A"]),
           ("fB", "forward", b_producer_us, ["w"], ["B"]),
           ("uA", "forward", 10.0, ["A"], ["h1"]),
           ("uB", "forward", 10.0, ["B", "h1"], ["h2"]),
           ("peak", "forward", 10.0, ["h2"], ["P"]),
           ("u", "forward", 10.0, ["P"], ["h3"]),
           ("bB", "backward", 10.0, ["B", "h3"], ["g1"]),
           ("bA", "backward", 10.0, ["A", "g1"], ["g2"])]
    return make_profile(tensors, ops, "msps")


def test_msps_picks_the_higher_memory_per_second_tensor_first():
    # fB = 10 us: B saves 6 B/us against A's 2 B/us, so B goes although A is larger, and
    # then nothing is over budget: A stays.
    planned = make_plan(msps_profile(10.0), HW, 230, "capuchin")
    assert list(planned.plan.actions) == [drop("B", "uB"), recompute("B", "bB")]
    assert planned.result.ok
    assert planned.result.iteration_us == pytest.approx(120.0 + 10.0)
    # fB = 100 us: B saves only 0.6 B/us, so A (2 B/us) goes instead.
    planned = make_plan(msps_profile(100.0), HW, 230, "capuchin")
    assert list(planned.plan.actions) == [drop("A", "uA"), recompute("A", "bA")]
    assert planned.result.ok
    assert planned.result.iteration_us == pytest.approx(210.0 + 50.0)


def test_a_recompute_chain_regenerates_its_freed_source_first():
    # T = relu(U) is needed again by bT, but U was freed after relu. Recomputing T there
    # needs U first (fU, 5 us, reads the weight): the chain costs 5 + 5 us, far less than
    # a 100 us swap of T across a 20 us gap.
    #   op     time  no-swap memory (w 10 + live)
    #   fU       5   60   U
    #   relu     5   160  U T
    #   long   100   120  T h
    #   peak    10   320  T h P
    #   u       10   320  T P k
    #   bT      10   130  T k g        budget 220: T must be away at peak and u
    tensors = {"w": (10, "weight"), "U": (50, "activation"), "T": (100, "activation"),
               "h": (10, "activation"), "P": (200, "activation"), "k": (10, "activation"),
               "g": (10, "gradient")}
    ops = [("fU", "forward", 5.0, ["w"], ["U"]),
           ("relu", "forward", 5.0, ["U"], ["T"]),
           ("long", "forward", 100.0, ["T"], ["h"]),
           ("peak", "forward", 10.0, ["h"], ["P"]),
           ("u", "forward", 10.0, ["P"], ["k"]),
           ("bT", "backward", 10.0, ["T", "k"], ["g"])]
    planned = make_plan(make_profile(tensors, ops), HW, 220, "capuchin")
    assert list(planned.plan.actions) == [
        drop("U", "relu"), drop("T", "long"), recompute("U", "bT"), recompute("T", "bT")]
    assert planned.result.ok
    assert planned.result.recompute_us == pytest.approx(10.0)
    assert planned.result.iteration_us == pytest.approx(140.0 + 10.0)


def feedback_profile():
    # X cannot be recomputed (its producer updates w in place); Y can (fY, 200 us).
    #   op     time  starts  no-swap memory
    #   fX      10      0    100  X
    #   uX      10     10    110  X a
    #   long   200     20    120  X a b
    #   fY     200    220    260  X b Y
    #   p1     100    420    380  X b Y P
    #   p2     100    520    400  X Y P c
    #   bX      10    620    290  X Y c d
    #   bY      10    630    170  Y d e        ideal 640 us
    # Budget 285: p1 needs X away (Y is read there); p2 and bX need Y away as well.
    tensors = {"w": (0, "weight"), "X": (100, "activation"), "Y": (150, "activation"),
               "a": (10, "activation"), "b": (10, "activation"), "P": (120, "activation"),
               "c": (30, "activation"), "d": (10, "gradient"), "e": (10, "gradient")}
    ops = [("fX", "forward", 10.0, [], ["X"], ["w"]),
           ("uX", "forward", 10.0, ["X"], ["a"]),
           ("long", "forward", 200.0, ["a"], ["b"]),
           ("fY", "forward", 200.0, [], ["Y"]),
           ("p1", "forward", 100.0, ["Y", "b"], ["P"]),
           ("p2", "forward", 100.0, ["P"], ["c"]),
           ("bX", "backward", 10.0, ["c", "X"], ["d"]),
           ("bY", "backward", 10.0, ["d", "Y"], ["e"])]
    return make_profile(tensors, ops, "feedback")


def test_feedback_moves_a_stalled_prefetch_trigger_earlier():
    # X is chosen first (a swap stalling 100 us: 100 B / 100 us beats Y's recompute,
    # 150 B / 200 us). When X is chosen p2 is still over budget, so its prefetch may only
    # be issued after p2 (never inside the peak): it runs 620-720 and bX waits 100 us.
    # Y's recompute then frees p2, so the feedback pass moves X's trigger to p1: the
    # prefetch runs 520-620 during p2 (memory 120 + 30 + 100 = 250) and the stall is gone.
    profile = feedback_profile()
    assert budget_floor(profile, moves_persistent=False)[0] == 280
    first = make_plan(profile, HW, 285, "capuchin", {"feedback_rounds": 0})
    assert prefetch("X", "p2", "bX") in first.plan.actions
    assert first.result.ok
    assert first.result.stall_data_us == pytest.approx(100.0)
    assert first.result.iteration_us == pytest.approx(640.0 + 200.0 + 100.0)
    fed = make_plan(profile, HW, 285, "capuchin")
    assert prefetch("X", "p1", "bX") in fed.plan.actions
    assert fed.result.ok
    assert fed.result.stall_data_us == pytest.approx(0.0)
    assert fed.result.iteration_us == pytest.approx(640.0 + 200.0)


SHIPPED = ["synth-transformer-l12-b16-s1024", "synth-cnn-l16-w128-b64-s224", "synth-mlp-l16-w8192-b1024"]
A100 = load_hardware("a100-40gb-pcie4")


@pytest.fixture(scope="module")
def shipped():
    return {name: open_profile(name) for name in SHIPPED}


def test_recompute_false_never_recomputes_on_a_shipped_profile(shipped):
    profile = shipped["synth-transformer-l12-b16-s1024"]
    budget = int(profile.peak_bytes * 0.5)
    assert "recompute" in kinds(make_plan(profile, A100, budget, "capuchin").plan)
    planned = make_plan(profile, A100, budget, "capuchin", {"recompute": False})
    assert planned.result.valid
    assert kinds(planned.plan) <= {"offload", "prefetch", "drop"}
    assert planned.result.recomputes == 0


def test_a_second_swap_of_an_unchanged_tensor_drops_it_and_reuses_its_host_copy():
    # A is idle across two peaks. Each swap hides (FT = 220 us both times); the second
    # needs no offload since the host copy written by the first is still valid.
    #   op    time  starts  no-swap memory
    #   fA     10      0    100  A
    #   s1    200     10    110  A s          A's offload 10-110
    #   pk1    10    210    310  A s P1       budget 220: A must be away
    #   d1     10    220    310  A P1 q1      (trigger: prefetch 230-330)
    #   m1    200    230    120  A q1 m
    #   uA     10    430    120  A m r
    #   s2    200    440    120  A r t        drop after uA
    #   pk2    10    640    310  A t P2
    #   d2     10    650    310  A P2 q2      (trigger: prefetch 660-760)
    #   m2    200    660    120  A q2 n
    #   bA     10    860    120  A n z        ideal 870 us
    tensors = {"A": (100, "activation"), "P1": (200, "activation"), "P2": (200, "activation")}
    tensors.update({t: (10, "activation") for t in ("s", "q1", "m", "r", "t", "q2", "n", "z")})
    ops = [("fA", "forward", 10.0, [], ["A"]),
           ("s1", "forward", 200.0, [], ["s"]),
           ("pk1", "forward", 10.0, ["s"], ["P1"]),
           ("d1", "forward", 10.0, ["P1"], ["q1"]),
           ("m1", "forward", 200.0, ["q1"], ["m"]),
           ("uA", "forward", 10.0, ["A", "m"], ["r"]),
           ("s2", "forward", 200.0, ["r"], ["t"]),
           ("pk2", "forward", 10.0, ["t"], ["P2"]),
           ("d2", "forward", 10.0, ["P2"], ["q2"]),
           ("m2", "forward", 200.0, ["q2"], ["n"]),
           ("bA", "backward", 10.0, ["A", "n"], ["z"])]
    planned = make_plan(make_profile(tensors, ops), HW, 220, "capuchin")
    assert list(planned.plan.actions) == [
        offload("A", "fA"), prefetch("A", "d1", "uA"), drop("A", "uA"), prefetch("A", "d2", "bA")]
    assert planned.result.ok
    assert planned.result.iteration_us == pytest.approx(870.0)
    assert (planned.result.bytes_d2h, planned.result.bytes_h2d) == (100, 200)
