"""The simulation rules R1-R22, each with a hand-computed expected result.

Machine (tests/engine_helpers.py): PCIe moves 1 B/us each way, the SSD 0.5 B/us, no
latency unless a test sets one. Ops take 10 us unless stated.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.errors import InputError
from simulator.plan import drop, offload, prefetch, recompute
from simulator.profile import Profile
from tests.conftest import make_profile
from tests.engine_helpers import both_paths, chain, machine, plan

HW = machine()


def simulate(profile, plan, hardware, budget_bytes=None, record=False):
    """Every test here runs both paths (tests/engine_helpers.py: both_paths)."""
    return both_paths(profile, plan, hardware, budget_bytes, record)


def spans(result, track):
    return [(s.name, s.start_us, s.end_us) for s in result.timeline.spans if s.track == track]


def assert_invalid(result, rule, op, tensor, words):
    assert (result.valid, result.feasible) == (False, False)
    assert (result.rule, result.op, result.tensor) == (rule, op, tensor), result.reason
    assert words in result.reason


# ----------------------------------------------------------------------------- baseline


def test_no_plan_runs_at_ideal_time_with_the_no_swap_peak():
    p = chain()
    r = simulate(p, plan(p), HW, budget_bytes=1000, record=True)
    assert r.ok and r.iteration_us == 60.0 == r.ideal_us and r.overhead == 0.0
    assert (r.peak_bytes, r.peak_at_us) == (200, 20.0) == (p.peak_bytes, 20.0)
    assert r.stall_us == 0.0 and r.tail_us == 0.0 and r.compute_us == 60.0


def test_swap_across_an_idle_gap():
    # offload a after f2: d2h 20-120. prefetch a after f3 (enqueued at 30) waits for its
    # source offload, h2d 120-220. b1 (ready at 40) waits for it: 180 us of data stall.
    # b1 220-230, b2 230-240.
    p = chain()
    r = simulate(p, plan(p, offload("a", "f2"), prefetch("a", "f3", "b1")), HW, budget_bytes=1000, record=True)
    assert r.ok
    assert spans(r, "d2h") == [("offload a", 20.0, 120.0)]
    assert spans(r, "h2d") == [("prefetch a", 120.0, 220.0)]
    assert r.iteration_us == 240.0 and r.overhead == pytest.approx(3.0)
    assert (r.stall_data_us, r.stall_memory_us) == (180.0, 0.0)
    assert r.stall_by_op == {"b1": {"data_us": 180.0, "memory_us": 0.0}}
    assert (r.bytes_d2h, r.bytes_h2d, r.host_peak_bytes) == (100, 100, 100)
    assert r.busy_us["d2h"] == 100.0 and r.busy_us["h2d"] == 100.0


# ----------------------------------------------------------------------------- R1 FIFO

# p1 makes a(100) and b(60); p2 makes c; p3 reads c; p4 reads a and b.
PAIR_TENSORS = {"a": (100, "activation"), "b": (60, "activation"), "c": (10, "activation"),
                "d": (10, "activation")}
PAIR_OPS = [("p1", "forward", 10.0, [], ["a", "b"]), ("p2", "forward", 10.0, [], ["c"]),
            ("p3", "forward", 10.0, ["c"], ["d"]), ("p4", "backward", 10.0, ["a", "b", "d"], [])]


def test_r1_transfers_enqueued_together_run_in_plan_order():
    # d2h: a 10-110, then b 110-170. h2d, in plan order: b waits for its offload (170),
    # 170-230; a queues behind it, 230-330. p4 starts at 330.
    p = make_profile(PAIR_TENSORS, PAIR_OPS, "pair")
    r = simulate(p, plan(p, offload("a", "p1"), offload("b", "p1"), prefetch("b", "p2", "p4"),
                         prefetch("a", "p2", "p4")), HW, budget_bytes=1000, record=True)
    assert spans(r, "d2h") == [("offload a", 10.0, 110.0), ("offload b", 110.0, 170.0)]
    assert spans(r, "h2d") == [("prefetch b", 170.0, 230.0), ("prefetch a", 230.0, 330.0)]
    assert r.iteration_us == 340.0


def test_r1_other_plan_order_other_timing():
    # Prefetch a first: a 110-210 (its offload ended at 110), b 210-270; p4 at 270.
    p = make_profile(PAIR_TENSORS, PAIR_OPS, "pair")
    r = simulate(p, plan(p, offload("a", "p1"), offload("b", "p1"), prefetch("a", "p2", "p4"),
                         prefetch("b", "p2", "p4")), HW, budget_bytes=1000, record=True)
    assert spans(r, "h2d") == [("prefetch a", 110.0, 210.0), ("prefetch b", 210.0, 270.0)]
    assert r.iteration_us == 280.0


# ----------------------------------------------------------------------------- R2 budget


def test_r2_budget_precedence_explicit_then_plan_then_gpu():
    p = chain()
    assert simulate(p, plan(p, budget_bytes=500), HW).budget_bytes == 500
    assert simulate(p, plan(p, budget_bytes=500), HW, budget_bytes=300).budget_bytes == 300
    assert simulate(p, plan(p), HW).budget_bytes == 2**30


def test_r2_budget_above_gpu_memory_is_an_input_error():
    p = chain()
    with pytest.raises(InputError, match="more than the GPU's memory"):
        simulate(p, plan(p), HW, budget_bytes=2**31)


def test_r2_memory_never_exceeds_budget_ops_wait_for_memory():
    # Budget 150. f2 allocates b at 10: a+b = 150. f3 needs c (50) at 20 but a (100) is
    # only released when its offload ends at 120: f3 waits 100 us for memory, 120-130.
    # f4 130-140 (d). At 130 the prefetch of a is enqueued but 60+100 > 150; at 140 c is
    # freed (10 left) and it runs 140-240. b1 waits for it from 140: 100 us data stall.
    p = chain()
    r = simulate(p, plan(p, offload("a", "f2"), prefetch("a", "f3", "b1")), HW, budget_bytes=150, record=True)
    assert r.ok and r.peak_bytes == 150
    assert spans(r, "h2d") == [("prefetch a", 140.0, 240.0)]
    assert (r.stall_memory_us, r.stall_data_us) == (100.0, 100.0)
    assert r.stall_by_op == {"f3": {"data_us": 0.0, "memory_us": 100.0}, "b1": {"data_us": 100.0, "memory_us": 0.0}}
    assert r.iteration_us == 260.0
    assert max(b for _, b in r.timeline.memory) <= 150


# ----------------------------------------------------------------------------- R4 peak


def test_r4_peak_counts_in_flight_prefetches_and_workspace():
    # x (20) is prefetched from host while op k (workspace 30) runs: during k the GPU
    # holds w 40 + x 20 (prefetch allocated at copy start) + y 5 + workspace 30 = 95.
    t = {"w": (40, "weight"), "x": (20, "weight"), "y": (5, "activation")}
    ops = [("k", "forward", 50.0, ["w"], ["y"], None, 30), ("m", "forward", 10.0, ["x", "y"], [])]
    p = make_profile(t, ops, "peak")
    r = simulate(p, plan(p, prefetch("x", None, "m"), drop("x", "m"), initial={"x": "host"}),
                 HW, budget_bytes=1000, record=True)
    assert r.ok and r.peak_bytes == 95 and r.peak_at_us == 0.0
    assert spans(r, "h2d") == [("prefetch x", 0.0, 20.0)]


# ----------------------------------------------------------------------------- R5-R8


def test_r5_recomputes_run_before_their_op_in_plan_order():
    # Drop b and c after f3 (they can be recomputed); recompute c then b before f4?
    # c's producer f3 reads b, so b must come first: recompute b, then c, before f4.
    t = {"a": (10, "activation"), "b": (10, "activation"), "c": (10, "activation"), "d": (1, "activation")}
    ops = [("f1", "forward", 10.0, [], ["a"]), ("f2", "forward", 20.0, ["a"], ["b"]),
           ("f3", "forward", 30.0, ["b"], ["c"]), ("f4", "forward", 10.0, ["a"], ["d"]),
           ("g", "backward", 10.0, ["b", "c", "d"], [])]
    p = make_profile(t, ops, "re")
    r = simulate(p, plan(p, drop("b", "f3"), drop("c", "f3"), recompute("b", "g"), recompute("c", "g")),
                 HW, budget_bytes=1000, record=True)
    assert r.ok
    assert [name for name, _, _ in spans(r, "compute")] == ["f1", "f2", "f3", "f4", "recompute b", "recompute c", "g"]
    # R15: recompute time is compute, not stall: 80 + 20 + 30 = 130
    assert (r.iteration_us, r.compute_us, r.recompute_us, r.stall_us) == (130.0, 130.0, 50.0, 0.0)


def test_r6_op_waits_for_its_prefetch_and_allocates_outputs_plus_workspace():
    # k (workspace 30) outputs y (5) and needs x, prefetched from host at start (0-20):
    # k starts at 20 with w 40 + x 20 + y 5 + ws 30 = 95; a budget of 94 never fits.
    t = {"w": (40, "weight"), "x": (20, "weight"), "y": (5, "activation")}
    ops = [("k", "forward", 50.0, ["w", "x"], ["y"], None, 30)]
    p = make_profile(t, ops, "ws")
    pl = plan(p, prefetch("x", None, "k"), drop("x", "k"), initial={"x": "host"})
    r = simulate(p, pl, HW, budget_bytes=95)
    assert r.ok and r.iteration_us == 70.0 and r.stall_data_us == 20.0 and r.peak_bytes == 95
    r = simulate(p, pl, HW, budget_bytes=94)
    assert not r.feasible and r.valid and r.rule == "R10" and r.op == "k"
    assert "needs 35 bytes, 34 free" in r.reason


def test_r15_recompute_holds_the_other_outputs_its_rerun_makes():
    # f2 makes b (10) and c (50) with workspace 7. Re-running f2 to recompute b makes c
    # again too (a kernel writes all its outputs): the recompute allocates b (10) and
    # holds c's 50 bytes with the workspace (7) while it runs.
    t = {"a": (10, "activation"), "b": (10, "activation"), "c": (50, "activation")}
    ops = [("f1", "forward", 10.0, [], ["a"]), ("f2", "forward", 10.0, ["a"], ["b", "c"], None, 7),
           ("f3", "forward", 10.0, ["c"], []), ("g", "backward", 10.0, ["a", "b"], [])]
    p = make_profile(t, ops, "re2")
    pl = plan(p, drop("b", "f2"), recompute("b", "g"))
    r = simulate(p, pl, HW, budget_bytes=1000, record=True)
    assert r.ok
    # t = 30: a 10 + b 10 + (ws 7 + c 50) = 77 (the first c was freed after f3);
    # at 40 the scratch is gone: a 10 + b 10 = 20 while g runs.
    at_recompute = [b for t_, b in r.timeline.memory if t_ == 30.0]
    assert at_recompute[-1] == 77
    assert [b for t_, b in r.timeline.memory if t_ == 40.0][-1] == 20
    # f2's own run (a 10 + b 10 + c 50 + ws 7 = 77) and the recompute tie for the peak.
    assert r.peak_bytes == 77
    # The budget binds at the recompute: 76 bytes is infeasible there, on both paths.
    for record in (True, False):
        short = simulate(p, pl, HW, budget_bytes=76, record=record)
        assert short.valid and not short.feasible and short.rule == "R10"
    # A profile may say a re-run makes only some outputs (rerun_outputs): then 10 + 10 + 7.
    only_b = replace(p.ops[1], rerun_outputs=("b",))
    q = Profile(p.name, p.tensors, (p.ops[0], only_b, *p.ops[2:]))
    r = simulate(q, plan(q, drop("b", "f2"), recompute("b", "g")), HW, budget_bytes=1000, record=True)
    assert [b for t_, b in r.timeline.memory if t_ == 30.0][-1] == 27
    fast = simulate(q, plan(q, drop("b", "f2"), recompute("b", "g")), HW, budget_bytes=1000)
    assert fast.peak_bytes == r.peak_bytes == 77 and fast.iteration_us == r.iteration_us


def test_r7_actions_are_enqueued_only_when_their_op_ends():
    # f1 runs 0-10; offload a after f1 starts at 10, not before.
    p = chain()
    r = simulate(p, plan(p, offload("a", "f1"), prefetch("a", "f3", "b1")), HW, budget_bytes=1000, record=True)
    assert r.valid, r.reason
    assert spans(r, "d2h")[0][1] == 10.0


def test_r7_offload_release_waits_for_the_last_reader_in_its_window():
    # offload a after f1 (copy 10-110); f2 reads a inside the window (10-20), so the GPU
    # copy is released at 110 (copy end), not at 20.
    p = chain()
    r = simulate(p, plan(p, offload("a", "f1"), prefetch("a", "f3", "b1")), HW, budget_bytes=1000, record=True)
    mem = dict(r.timeline.memory)
    # At 40 (f4 ended, c freed): a 100 is still held, plus d 10.
    assert mem[40.0] == 110
    # At 110 a is released and its prefetch (enqueued at 30) allocates it again at once.
    assert spans(r, "h2d") == [("prefetch a", 110.0, 210.0)]


def test_r11_release_when_the_last_reader_ends_after_the_copy():
    # A fast link (100 B/us): a's copy runs 10-11, but f2 reads a in the window until 20,
    # so a is released at 20: f3 then holds b 50 + c 50 = 100 instead of 200.
    p = chain()
    r = simulate(p, plan(p, offload("a", "f1"), prefetch("a", "f3", "b1")), machine(d2h=0.1, h2d=0.1),
                 budget_bytes=1000, record=True)
    assert spans(r, "d2h") == [("offload a", 10.0, 11.0)]
    assert dict(r.timeline.memory)[20.0] == 100
    assert r.peak_bytes == 160  # at f4: a is back (prefetched 30-31) + c 50 + d 10


def test_r8_recompute_extends_the_life_of_its_inputs():
    # b is recomputed from a before g, so a lives until the recompute (not until f2).
    t = {"a": (100, "activation"), "b": (10, "activation"), "c": (1, "activation")}
    ops = [("f1", "forward", 10.0, [], ["a"]), ("f2", "forward", 10.0, ["a"], ["b"]),
           ("f3", "forward", 10.0, [], ["c"]), ("g", "backward", 10.0, ["b", "c"], [])]
    p = make_profile(t, ops, "r8")
    base = simulate(p, plan(p), HW, budget_bytes=1000, record=True)
    dropped = simulate(p, plan(p, drop("b", "f2"), recompute("b", "g")), HW, budget_bytes=1000, record=True)
    # At 20, when f3 has allocated c (1): without the recompute a is gone (b 10 + c 1);
    # with it a (100) stays for the recompute, and b was dropped (a 100 + c 1).
    assert dict(base.timeline.memory)[20.0] == 11
    assert dict(dropped.timeline.memory)[20.0] == 101


# ----------------------------------------------------------------------------- R9, R10


def test_r9_completions_first_then_compute_head_then_transfers():
    # Budget 150 (as in the R2 test): at 130 f3 ends and frees b. Both f4 (d, 10) and the
    # prefetch of a (100) want memory; the compute head goes first, so f4 runs 130-140
    # and the prefetch (60 + 100 > 150) waits until c is freed at 140.
    p = chain()
    r = simulate(p, plan(p, offload("a", "f2"), prefetch("a", "f3", "b1")), HW, budget_bytes=150, record=True)
    assert ("f4", 130.0, 140.0) in spans(r, "compute")
    assert spans(r, "h2d")[0][1] == 140.0


# g1 makes a (100); g2 reads a and makes c (40); h makes x (20); g3 reads c; g4 reads a, d, x.
DEADLOCK_TENSORS = {"w": (10, "weight"), "a": (100, "activation"), "c": (40, "activation"),
                    "x": (20, "activation"), "d": (1, "activation")}
DEADLOCK_OPS = [("g1", "forward", 10.0, [], ["a"]), ("g2", "forward", 10.0, ["a", "w"], ["c"]),
                ("h", "forward", 10.0, [], ["x"]), ("g3", "forward", 10.0, ["c"], ["d"]),
                ("g4", "backward", 10.0, ["a", "d", "x"], [])]


def test_r10_infeasible_names_what_waits_bytes_and_residents():
    # Budget 160. a is offloaded after g2 (20-120) and prefetched back for g3. h needs x
    # (20) at 20 but a (100) + w + c fill 150: h waits until a is released at 120, runs
    # 120-130, and x stays. The GPU then holds w 10 + c 40 + x 20 = 70: a's prefetch needs
    # 100 (90 free), g3 waits for it, and nothing else can run: infeasible.
    p = make_profile(DEADLOCK_TENSORS, DEADLOCK_OPS, "deadlock")
    r = simulate(p, plan(p, offload("a", "g2"), prefetch("a", "g2", "g3")), HW, budget_bytes=160)
    assert r.valid and not r.feasible and r.rule == "R10"
    assert (r.op, r.tensor) == ("g3", "a")
    assert r.reason == ("the prefetch of 'a' waits for memory (op 'g3' waits): needs 100 bytes, "
                        "90 free; largest residents: c (40 B), x (20 B), w (10 B)")
    assert r.blocked["needed_bytes"] == 100 and r.blocked["free_bytes"] == 90
    assert r.blocked["largest_residents"] == [{"tensor": "c", "bytes": 40}, {"tensor": "x", "bytes": 20},
                                              {"tensor": "w", "bytes": 10}]
    # With 171 it fits (g3 adds d, 1 B): prefetch 120-220, g3 220-230, g4 230-240.
    ok = simulate(p, plan(p, offload("a", "g2"), prefetch("a", "g2", "g3")), HW, budget_bytes=171)
    assert ok.ok and ok.iteration_us == 240.0


def test_r10_persistent_tensors_over_budget_at_start():
    p = make_profile(DEADLOCK_TENSORS, DEADLOCK_OPS, "deadlock")
    r = simulate(p, plan(p), HW, budget_bytes=5)
    assert not r.feasible and r.valid and "at start" in r.reason and r.blocked["needed_bytes"] == 10


# ----------------------------------------------------------------------------- R11


def test_r11_offload_after_last_use_is_invalid():
    p = chain()  # b's last use is f3: it is freed when f3 ends, before actions are enqueued
    r = simulate(p, plan(p, offload("b", "f3")), HW)
    assert_invalid(r, "R11", "f3", "b", "not resident (freed after its last use)")


def test_r11_update_inside_the_offload_window_is_invalid():
    t = {"w": (10, "weight"), "g": (10, "gradient")}
    ops = [("k1", "forward", 10.0, ["w"], ["g"]), ("k2", "optimizer", 10.0, ["g"], [], ["w"]),
           ("k3", "forward", 10.0, ["w"], [])]
    p = make_profile(t, ops, "upd")
    # the window runs from k1 to the prefetch's after op k2 (included): k2 updates w
    r = simulate(p, plan(p, offload("w", "k1"), prefetch("w", "k2", "k3")), HW)
    assert_invalid(r, "R11", "k2", "w", "updates 'w' during its offload window")


def test_r11_second_offload_while_leaving_is_invalid():
    p = chain()
    r = simulate(p, plan(p, offload("a", "f1"), offload("a", "f2", "ssd")), HW)
    assert_invalid(r, "R11", "f2", "a", "already being offloaded")


# ----------------------------------------------------------------------------- R12


def test_r12_prefetch_of_resident_tensor_is_invalid():
    p = chain()
    r = simulate(p, plan(p, offload("a", "f2"), prefetch("a", "f2", "f3"), prefetch("a", "f3", "b1")), HW)
    assert_invalid(r, "R12", "f3", "a", "already resident")


def test_r12_prefetch_twice_is_invalid():
    p = chain()
    r = simulate(p, plan(p, offload("a", "f2"), prefetch("a", "f2", "b1"), prefetch("a", "f3", "b1")), HW)
    assert_invalid(r, "R12", "f3", "a", "already incoming")


def test_r12_before_must_come_after_after():
    p = chain()
    r = simulate(p, plan(p, offload("a", "f2"), prefetch("a", "f3", "f2")), HW)
    assert_invalid(r, "R12", "f3", "a", "does not come after")


def test_r12_non_persistent_prefetch_with_no_later_use_is_invalid():
    p = chain()  # a's last use is b1
    r = simulate(p, plan(p, offload("a", "f2"), prefetch("a", "f2", "b2")), HW)
    assert_invalid(r, "R12", "f2", "a", "not used at or after op 'b2'")
    r = simulate(p, plan(p, offload("a", "f2"), prefetch("a", "f2", None)), HW)
    assert_invalid(r, "R12", "f2", "a", "only persistent tensors")


# m1 makes a (100) and b (20); m2 makes big (70); m3 reads big; m4 reads a, b, big, s.
QUEUE_TENSORS = {"a": (100, "activation"), "b": (20, "activation"), "big": (70, "activation"),
                 "s": (1, "activation")}
QUEUE_OPS = [("m1", "forward", 10.0, [], ["a", "b"]), ("m2", "forward", 10.0, [], ["big"]),
             ("m3", "forward", 10.0, ["big"], ["s"]), ("m4", "backward", 10.0, ["a", "b", "big", "s"], [])]


def test_r12_prefetch_waiting_for_memory_blocks_its_queue():
    # Budget 150. a (100) can never come back while big (70) is alive, so its prefetch
    # waits forever; b's prefetch (20) would fit but queues behind it and never starts.
    p = make_profile(QUEUE_TENSORS, QUEUE_OPS, "queue")
    a_first = plan(p, offload("a", "m1"), offload("b", "m1"), prefetch("a", "m1", "m4"), prefetch("b", "m1", "m4"))
    r = simulate(p, a_first, HW, budget_bytes=150)
    assert r.valid and not r.feasible and r.tensor == "a" and r.bytes_h2d == 0
    # In the other order b's prefetch runs (130-150) before a's blocks the queue.
    b_first = plan(p, offload("a", "m1"), offload("b", "m1"), prefetch("b", "m1", "m4"), prefetch("a", "m1", "m4"))
    r = simulate(p, b_first, HW, budget_bytes=150)
    assert r.valid and not r.feasible and r.tensor == "a" and r.bytes_h2d == 20


# ----------------------------------------------------------------------------- R13


def test_r13_use_of_a_dropped_tensor_is_invalid():
    # a's window closes at its prefetch (after f1), so the drop after f2 is valid (its host
    # copy is valid); b1 then reads a, which is gone.
    p = chain()
    r = simulate(p, plan(p, offload("a", "f1"), prefetch("a", "f1", "f2"), drop("a", "f2")), HW)
    assert_invalid(r, "R13", "b1", "a", "b1 reads 'a', which is not resident")


def test_r13_use_between_prefetch_issue_and_its_before_op_is_invalid():
    p = chain()  # f2 reads a after its prefetch (issued at f1) but before b1
    r = simulate(p, plan(p, offload("a", "f1"), prefetch("a", "f1", "b1")), HW)
    assert_invalid(r, "R13", "f2", "a", "after its prefetch was issued but before its before op 'b1'")


# ----------------------------------------------------------------------------- R14


def test_r14_drop_frees_at_once_when_recomputed_later():
    # drop a after f2 (recomputed before b1): the peak of 200 at f3 (a + b + c) becomes
    # 150 at f2 (a + b); f3 holds only b + c = 100.
    p = chain()
    r = simulate(p, plan(p, drop("a", "f2"), recompute("a", "b1")), HW, budget_bytes=1000)
    assert r.ok and (r.peak_bytes, r.peak_at_us) == (150, 10.0)
    assert r.iteration_us == 70.0 and r.recompute_us == 10.0


def test_r14_drop_without_copy_or_recompute_is_invalid():
    p = chain()
    r = simulate(p, plan(p, drop("a", "f2")), HW)
    assert_invalid(r, "R14", "f2", "a", "no valid copy in host or SSD")


def test_r14_persistent_tensor_has_no_copy_until_offloaded():
    t = {"w": (10, "weight"), "y": (1, "activation")}
    p = make_profile(t, [("k", "forward", 10.0, ["w"], ["y"]), ("k2", "forward", 10.0, ["y"], [])], "pw")
    r = simulate(p, plan(p, drop("w", "k")), HW)
    assert_invalid(r, "R14", "k", "w", "no valid copy")


def test_r14_drop_inside_an_offload_window_is_invalid():
    p = chain()
    r = simulate(p, plan(p, offload("a", "f2"), drop("a", "f2"), prefetch("a", "f3", "b1")), HW)
    assert_invalid(r, "R14", "f2", "a", "inside the window of its offload after 'f2'")


CHAIN_TENSORS_LONG = {"a": (100, "activation"), "b": (50, "activation"), "c": (50, "activation"),
                      "d": (10, "activation"), "e": (10, "gradient")}
CHAIN_OPS_LONG = [("f1", "forward", 10.0, [], ["a"]), ("f2", "forward", 10.0, ["a"], ["b"]),
                  ("f3", "forward", 10.0, ["b"], ["c"]), ("f4", "forward", 200.0, ["c"], ["d"]),
                  ("b1", "backward", 10.0, ["d", "a"], ["e"]), ("b2", "backward", 10.0, ["e"], [])]


def test_r14_drop_in_a_window_is_invalid_however_long_the_copy_took():
    # v2: offload a after f2 (20-120); f4 is long (30-230), so the copy is complete when
    # the drop after f4 comes, but the drop is inside the offload's window (f2 up to the
    # prefetch after f4): invalid from the plan alone, on every machine.
    p = make_profile(CHAIN_TENSORS_LONG, CHAIN_OPS_LONG, "long")
    pl = plan(p, offload("a", "f2"), drop("a", "f4"), prefetch("a", "f4", "b1"))
    for hw in (HW, machine(h2d=1.0, d2h=1.0), machine(d2h=1e-6)):
        assert_invalid(simulate(p, pl, hw, budget_bytes=1000), "R14", "f4", "a", "inside the window")


# ----------------------------------------------------------------------------- R15


def test_r15_recompute_of_resident_or_dead_tensor_is_invalid():
    p = chain()
    assert_invalid(simulate(p, plan(p, recompute("a", "b1")), HW), "R15", "b1", "a", "it is resident")
    assert_invalid(simulate(p, plan(p, recompute("b", "b1")), HW), "R15", "b1", "b", "freed after its last use")


def test_r15_recompute_of_a_tensor_updated_in_place_is_invalid():
    t = {"g": (10, "gradient"), "h": (10, "gradient")}
    ops = [("k1", "backward", 10.0, [], ["g"]), ("k2", "backward", 10.0, [], ["h"]),
           ("acc", "backward", 10.0, ["h"], [], ["g"]), ("use", "optimizer", 10.0, ["g"], [])]
    p = make_profile(t, ops, "acc")
    r = simulate(p, plan(p, drop("g", "acc"), recompute("g", "use")), HW)
    assert_invalid(r, "R15", "use", "g", "updated in place after it was produced (by op 'acc')")


def test_r15_recompute_after_an_input_of_its_producer_was_updated_is_invalid():
    # f1 reads the weight w and makes a; step updates w in place; g reads a. In profile
    # order (f1, g, step) a recompute of a before g re-runs f1 on the old w: valid, f1
    # 0-10, the recompute 10-20, g 20-30, step 30-40. A schedule that runs step before g
    # (R21 allows it: g does not read w) makes the same recompute read the new w: R15.
    t = {"w": (10, "weight"), "a": (20, "activation")}
    ops = [("f1", "forward", 10.0, ["w"], ["a"]), ("g", "backward", 10.0, ["a"], []),
           ("step", "optimizer", 10.0, [], [], ["w"])]
    p = make_profile(t, ops, "stale")
    r = simulate(p, plan(p, drop("a", "f1"), recompute("a", "g")), HW)
    assert r.valid and r.iteration_us == 40.0 and r.recompute_us == 10.0
    early = plan(p, drop("a", "f1"), recompute("a", "g"), schedule=("f1", "step", "g"))
    assert_invalid(simulate(p, early, HW), "R15", "g", "a", "reads 'w', updated in place since by op 'step'")
    # a weight that starts in host memory (named by the plan) counts the same
    host = plan(p, prefetch("w", None, "f1"), drop("a", "f1"), recompute("a", "g"), offload("w", "step"),
                schedule=("f1", "step", "g"),
                initial={"w": "host"})
    assert_invalid(simulate(p, host, HW), "R15", "g", "a", "by op 'step'")
    assert simulate(p, replace(host, schedule=None), HW).valid


def test_r15_recompute_whose_producer_updates_in_place_is_invalid():
    t = {"w": (10, "weight"), "y": (5, "activation"), "z": (1, "activation")}
    ops = [("k", "forward", 10.0, [], ["y"], ["w"]), ("m", "forward", 10.0, [], ["z"]),
           ("n", "backward", 10.0, ["y", "z"], [])]
    p = make_profile(t, ops, "prod")
    r = simulate(p, plan(p, drop("y", "k"), recompute("y", "n")), HW)
    assert_invalid(r, "R15", "n", "y", "updates 'w' in place")


def test_r15_recompute_waits_for_the_older_copy_to_be_released():
    # offload a after f2 (20-120), recompute a before b1: the window ends at the
    # recompute, which waits for the GPU copy's release at 120: 120-130, b1 130-140.
    p = chain()
    r = simulate(p, plan(p, offload("a", "f2"), recompute("a", "b1")), HW, budget_bytes=1000, record=True)
    assert r.ok
    assert ("recompute a", 120.0, 130.0) in spans(r, "compute")
    assert r.iteration_us == 150.0 and r.stall_data_us == 80.0 and r.recompute_us == 10.0


# ----------------------------------------------------------------------------- R16


def test_r16_in_place_update_makes_the_host_copy_stale():
    # w starts in host; it is prefetched, updated by k2, and dropped: its host copy is
    # stale, so the drop is invalid (it needs an offload to write it back).
    t = {"w": (10, "weight"), "g": (10, "gradient")}
    ops = [("k1", "backward", 10.0, [], ["g"]), ("k2", "optimizer", 10.0, ["g"], [], ["w"])]
    p = make_profile(t, ops, "stale")
    r = simulate(p, plan(p, prefetch("w", None, "k2"), drop("w", "k2"), initial={"w": "host"}), HW)
    assert_invalid(r, "R14", "k2", "w", "no valid copy")
    ok = simulate(p, plan(p, prefetch("w", None, "k2"), offload("w", "k2"), initial={"w": "host"}), HW)
    assert ok.ok, ok.reason


# ----------------------------------------------------------------------------- R17, R18


def test_r17_latency_is_paid_per_transfer():
    p = chain()
    r = simulate(p, plan(p, offload("a", "f2"), prefetch("a", "f3", "b1")), machine(pcie_latency=5),
                 budget_bytes=1000, record=True)
    assert spans(r, "d2h") == [("offload a", 20.0, 125.0)]
    assert spans(r, "h2d") == [("prefetch a", 125.0, 230.0)]


# v (30) starts on the GPU and w (80) in host; k1 reads w, k2 reads v.
DUPLEX_TENSORS = {"v": (30, "weight"), "w": (80, "weight"), "y": (1, "activation")}
DUPLEX_OPS = [("k1", "forward", 10.0, ["w"], ["y"]), ("k2", "forward", 10.0, ["v", "y"], [])]


def _duplex_plan(p):
    return plan(p, prefetch("w", None, "k1"), offload("v", None), prefetch("v", "k1", "k2"), drop("w", "k1"),
                initial={"w": "host"})


def test_r17_full_duplex_directions_run_at_once():
    # h2d: w 0-80; d2h: v 0-30. k1 80-90; v comes back 90-120; k2 120-130.
    p = make_profile(DUPLEX_TENSORS, DUPLEX_OPS, "duplex")
    r = simulate(p, _duplex_plan(p), machine(duplex="full"), budget_bytes=1000, record=True)
    assert spans(r, "h2d") == [("prefetch w", 0.0, 80.0), ("prefetch v", 90.0, 120.0)]
    assert spans(r, "d2h") == [("offload v", 0.0, 30.0)]
    assert r.iteration_us == 130.0


def test_r17_half_duplex_shares_one_link():
    # The link: w 0-80 (enqueued first), then v's offload 80-110; k1 80-90; v's prefetch
    # waits for its offload: 110-140; k2 140-150.
    p = make_profile(DUPLEX_TENSORS, DUPLEX_OPS, "duplex")
    r = simulate(p, _duplex_plan(p), machine(duplex="half"), budget_bytes=1000, record=True)
    assert spans(r, "h2d") == [("prefetch w", 0.0, 80.0), ("prefetch v", 110.0, 140.0)]
    assert spans(r, "d2h") == [("offload v", 80.0, 110.0)]
    assert r.iteration_us == 150.0


def test_r17_half_duplex_prefetch_waiting_for_memory_does_not_hold_the_link():
    # Budget 100: w (80) cannot come in until v (30) has left, so v's offload takes the
    # link first (0-30) although it was enqueued after w's prefetch; w then 30-110.
    p = make_profile(DUPLEX_TENSORS, DUPLEX_OPS, "duplex")
    r = simulate(p, _duplex_plan(p), machine(duplex="half"), budget_bytes=100, record=True)
    assert spans(r, "d2h") == [("offload v", 0.0, 30.0)]
    assert spans(r, "h2d")[0] == ("prefetch w", 30.0, 110.0)


def test_r18_a_lone_ssd_transfer_moves_at_the_slower_link():
    # to SSD on ssd_write alone: one flow over pcie_up (1 B/us) and the SSD link (0.5 B/us)
    # -> 100 B in 200 us, after latency 5 (PCIe) + 20 (SSD); back the same way on ssd_read.
    p = chain()
    hw = machine(pcie_latency=5, ssd_latency=20)
    r = simulate(p, plan(p, offload("a", "f2", "ssd"), prefetch("a", "f3", "b1", "ssd")), hw,
                 budget_bytes=1000, record=True)
    assert spans(r, "ssd_write") == [("offload a", 20.0, 245.0)] and spans(r, "d2h") == []
    assert spans(r, "ssd_read") == [("prefetch a", 245.0, 470.0)] and spans(r, "h2d") == []
    # bytes count on the SSD and the PCIe figures
    assert (r.bytes_d2h, r.bytes_ssd_write, r.bytes_h2d, r.bytes_ssd_read) == (100, 100, 100, 100)
    assert r.busy_us["d2h"] == 0.0 and r.busy_us["ssd_write"] == 225.0
    assert r.ssd_peak_bytes == 100 and r.host_peak_bytes == 0  # host staging is not charged


def test_r18_direct_path_pays_only_ssd_latency():
    p = chain()
    hw = machine(pcie_latency=5, ssd_latency=20, ssd_path="direct")
    r = simulate(p, plan(p, offload("a", "f2", "ssd"), prefetch("a", "f3", "b1", "ssd")), hw,
                 budget_bytes=1000, record=True)
    assert spans(r, "ssd_write") == [("offload a", 20.0, 240.0)]


# ----------------------------------------------------------------------------- R19, R20


def test_r19_host_capacity_exceeded_is_infeasible():
    p = make_profile(PAIR_TENSORS, PAIR_OPS, "pair")
    pl = plan(p, offload("a", "p1"), offload("b", "p1"), prefetch("a", "p2", "p4"), prefetch("b", "p2", "p4"))
    r = simulate(p, pl, machine(host="150B"), budget_bytes=1000)
    assert r.valid and not r.feasible and r.rule == "R19" and r.tensor == "b"
    assert "host capacity exceeded: 160 bytes needed, 150 available" in r.reason
    assert simulate(p, pl, machine(host="160B"), budget_bytes=1000).ok


def test_r19_re_offload_to_the_same_tier_reuses_its_space():
    t = {"w": (100, "weight"), "g": (1, "gradient")}
    ops = [("k1", "backward", 10.0, [], ["g"]), ("k2", "optimizer", 10.0, ["g"], [], ["w"])]
    p = make_profile(t, ops, "reuse")
    r = simulate(p, plan(p, prefetch("w", None, "k2"), offload("w", "k2"), initial={"w": "host"}),
                 machine(host="100B"), budget_bytes=1000)
    assert r.ok and r.host_peak_bytes == 100


def test_r20_persistent_tensor_must_end_where_it_began():
    t = {"w": (10, "weight"), "y": (1, "activation")}
    p = make_profile(t, [("k", "forward", 10.0, ["w"], ["y"]), ("k2", "forward", 10.0, ["y"], [])], "ss")
    r = simulate(p, plan(p, offload("w", "k")), HW)
    assert_invalid(r, "R20", None, "w", "started on the GPU but is not resident at the end")
    r = simulate(p, plan(p, prefetch("w", None, "k"), initial={"w": "host"}), HW)
    assert_invalid(r, "R20", None, "w", "started in host but does not end there")


# ----------------------------------------------------------------------------- R21, R22


def test_r21_reordered_schedule_is_honoured():
    # p2 and p1 are independent: run p2 first.
    p = make_profile(PAIR_TENSORS, PAIR_OPS, "pair")
    r = simulate(p, plan(p, schedule=("p2", "p1", "p3", "p4")), HW, budget_bytes=1000, record=True)
    assert [n for n, _, _ in spans(r, "compute")] == ["p2", "p1", "p3", "p4"]
    # v2: a schedule that breaks a dependency is a rule break (a result), not an input error
    assert_invalid(simulate(p, plan(p, schedule=("p3", "p2", "p1", "p4")), HW), "R21", "p3", "c",
                   "runs before op 'p2', which produces tensor 'c'")
    with pytest.raises(InputError, match="missing"):   # not a permutation: an input error
        simulate(p, plan(p, schedule=("p2", "p1", "p3")), HW)


def test_r22_iteration_ends_when_the_last_transfer_ends():
    # w (100) comes in from host for k2 and is written back after it: the write-back
    # runs 20-120 after compute ended at 20, so the tail is 100 us.
    t = {"w": (100, "weight"), "g": (1, "gradient")}
    ops = [("k1", "backward", 10.0, [], ["g"]), ("k2", "optimizer", 10.0, ["g"], [], ["w"])]
    p = make_profile(t, ops, "tail")
    r = simulate(p, plan(p, prefetch("w", None, "k2"), offload("w", "k2"), initial={"w": "host"}), HW,
                 budget_bytes=1000)
    # prefetch 0-100; k1 0-10; k2 100-110; write-back 110-210
    assert r.ok and r.iteration_us == 210.0 and r.tail_us == 100.0


def test_an_ssd_action_on_a_machine_without_ssd_is_an_input_error():
    from dataclasses import replace
    p = chain()
    with pytest.raises(InputError, match=r"actions\[0\] \(offload a\)\.to: the hardware has no SSD"):
        simulate(p, plan(p, offload("a", "f2", "ssd"), prefetch("a", "f3", "b1", "ssd")), replace(HW, ssd=None))
