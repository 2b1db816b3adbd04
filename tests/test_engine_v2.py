"""The rules version 2 changed, each with a hand-computed result: links shared by
bandwidth (R17, R18), the copy engine of a half-duplex machine, latency that holds the
stream but not the links, integer time (R3), a queued offload that keeps its tensor
alive (R7), R10's waiter, the stall kind of R15, and the R23 limits.

Every case runs on both paths (tests/engine_helpers.py: both_paths).
"""
from __future__ import annotations

import pytest

from simulator.errors import InputError
from simulator.hardware import hardware_from_dict
from simulator.model.links import fair_rates
from simulator.plan import drop, offload, prefetch
from simulator.units import parse_size, us_to_ps
from tests.conftest import make_profile
from tests.engine_helpers import both_paths, machine, plan


def spans(result, track):
    return [(s.name, s.start_us, s.end_us) for s in result.timeline.spans if s.track == track]


# ----------------------------------------------------------------------------- fair sharing


def test_fair_rates_by_progressive_filling():
    # links: 0 = PCIe (10), 1 = SSD (2). A host flow on 0 and an SSD flow on 1 and 0:
    # round 1 floors are 10 // 2 = 5 on PCIe and 2 // 1 = 2 on the SSD: the SSD flow is
    # frozen at 2; round 2 gives the host flow the 8 that PCIe has left.
    assert fair_rates([(0,), (1, 0)], (10, 2)) == [8, 2]
    # two flows on one link split it; an odd capacity leaves a byte unused (floor)
    assert fair_rates([(0,), (0,)], (11, 5)) == [5, 5]
    # links whose floors tie are frozen in the same round
    assert fair_rates([(0,), (1,)], (4, 4)) == [4, 4]
    # a rate is never 0, even when there are more flows than bytes per second
    assert fair_rates([(0,), (0,), (0,)], (2, 1)) == [1, 1, 1]


SHARE_TENSORS = {"w": (200, "weight"), "v": (40, "weight"), "y": (1, "activation")}
SHARE_OPS = [("k", "forward", 10.0, ["w", "v"], ["y"]), ("k2", "forward", 10.0, ["y"], [])]


def _share_plan(p):
    # w comes from host and v from SSD, both issued at the start; both go back by a drop
    # after k (their copies stay valid: nothing updates them).
    return plan(p, prefetch("w", None, "k"), prefetch("v", None, "k", "ssd"), drop("w", "k"), drop("v", "k"),
                initial={"w": "host", "v": "ssd"})


def test_r17_a_host_and_an_ssd_prefetch_share_pcie():
    # PCIe down 1 B/us, SSD read 0.2 B/us. From 0 the SSD flow is held to 0.2 B/us by the
    # SSD and the host flow gets the 0.8 B/us PCIe has left. v (40 B) ends at 200 us; w
    # has moved 160 B by then and moves its last 40 B alone at 1 B/us: ends at 240 us.
    # k runs 240-250, k2 250-260. (v1, PCIe held whole by one copy at a time: w 0-200,
    # then v 200-400.)
    p = make_profile(SHARE_TENSORS, SHARE_OPS, "share")
    hw = machine(ssd_read=0.0002)
    r = both_paths(p, _share_plan(p), hw, budget_bytes=1000, record=True)
    assert r.ok, r.reason
    assert spans(r, "h2d") == [("prefetch w", 0.0, 240.0)]
    assert spans(r, "ssd_read") == [("prefetch v", 0.0, 200.0)]
    assert r.iteration_us == 260.0 and r.stall_data_us == 240.0
    rates = [(t, lr["pcie_down"], lr["ssd_read_link"]) for t, lr in r.timeline.link_rates]
    assert rates == [(0.0, 1_000_000, 200_000), (200.0, 1_000_000, 0), (240.0, 0, 0)]
    assert r.link_bytes == {"pcie_down": 240, "pcie_up": 0, "ssd_read_link": 40, "ssd_write_link": 0}
    assert r.link_utilisation["pcie_down"] == pytest.approx(240 / 260)


def test_r17_half_duplex_is_one_copy_engine_for_host_copies_and_host_path_ssd():
    # Half duplex: w's host prefetch (0-200) holds the engine, so v's SSD prefetch through
    # host memory waits for it: 200-400 at 0.2 B/us. k runs 400-410.
    p = make_profile(SHARE_TENSORS, SHARE_OPS, "share")
    r = both_paths(p, _share_plan(p), machine(duplex="half", ssd_read=0.0002), budget_bytes=1000, record=True)
    assert spans(r, "h2d") == [("prefetch w", 0.0, 200.0)]
    assert spans(r, "ssd_read") == [("prefetch v", 200.0, 400.0)]
    assert r.iteration_us == 420.0
    # GPUDirect Storage does not use the copy engine: the flows share PCIe as in full duplex
    direct = both_paths(p, _share_plan(p), machine(duplex="half", ssd_read=0.0002, ssd_path="direct"),
                        budget_bytes=1000, record=True)
    assert spans(direct, "h2d") == [("prefetch w", 0.0, 240.0)] and direct.iteration_us == 260.0


def test_r17_latency_holds_the_stream_but_not_the_links():
    # PCIe latency 30 us, SSD direct with no latency, both links 1 B/us. v (100 B from SSD)
    # moves alone at 1 B/us for the 30 us of w's latency (30 B), then both share PCIe at
    # 0.5 B/us: v's last 70 B end at 170 us; w has moved 70 B by then and its last 30 B
    # at 1 B/us end at 200 us. The h2d stream is busy 0-200, latency included.
    t = {"w": (100, "weight"), "v": (100, "weight"), "y": (1, "activation")}
    p = make_profile(t, SHARE_OPS, "latency")
    hw = machine(pcie_latency=30, ssd_path="direct", ssd_read=0.001)
    r = both_paths(p, _share_plan(p), hw, budget_bytes=1000, record=True)
    assert spans(r, "ssd_read") == [("prefetch v", 0.0, 170.0)]
    assert spans(r, "h2d") == [("prefetch w", 0.0, 200.0)]
    assert r.busy_us["h2d"] == 200.0 and r.busy_us["ssd_read"] == 170.0


def test_r17_a_stream_runs_one_transfer_at_a_time():
    # two host prefetches on h2d do not share PCIe: they run one after the other (FIFO)
    t = {"w": (100, "weight"), "v": (100, "weight"), "y": (1, "activation")}
    p = make_profile(t, SHARE_OPS, "fifo")
    pl = plan(p, prefetch("w", None, "k"), prefetch("v", None, "k"), drop("w", "k"), drop("v", "k"),
              initial={"w": "host", "v": "host"})
    r = both_paths(p, pl, machine(), budget_bytes=1000, record=True)
    assert spans(r, "h2d") == [("prefetch w", 0.0, 100.0), ("prefetch v", 100.0, 200.0)]


def test_r17_rates_and_ends_are_integers():
    # 0.003 GB/s = 3,000,000 B/s: 10 B take ceil(10e12 / 3e6) ps = 3,333,334 ps.
    t = {"w": (10, "weight"), "y": (1, "activation")}
    p = make_profile(t, [("k", "forward", 10.0, ["w"], ["y"]), ("k2", "forward", 10.0, ["y"], [])], "int")
    pl = plan(p, prefetch("w", None, "k"), drop("w", "k"), initial={"w": "host"})
    r = both_paths(p, pl, machine(h2d=0.003), budget_bytes=1000, record=True)
    assert spans(r, "h2d") == [("prefetch w", 0.0, 3.333334)]
    assert r.iteration_us == 23.333334


# ----------------------------------------------------------------------------- R3


def test_r3_same_instant_is_equal_integers():
    # The SSD prefetch of v (0 bytes) waits PCIe 0.1 + SSD 0.2 us of latency: it ends at
    # 300,000 ps, the instant k1 (0.3 us) ends, so k2 starts at once: no stall. In floats
    # 0.1 + 0.2 > 0.3 and k2 would stall for 5e-17 us.
    t = {"v": (0, "weight"), "y": (1, "activation")}
    ops = [("k1", "forward", 0.3, [], ["y"]), ("k2", "forward", 0.2, ["v", "y"], [])]
    p = make_profile(t, ops, "ties")
    pl = plan(p, prefetch("v", None, "k2", "ssd"), drop("v", "k2"), initial={"v": "ssd"})
    r = both_paths(p, pl, machine(pcie_latency=0.1, ssd_latency=0.2), budget_bytes=1000)
    assert r.ok and r.stall_us == 0.0 and r.iteration_us == 0.5 and r.ideal_us == 0.5


def test_r3_conversions_round_halves_up():
    assert us_to_ps(0.1) == 100_000 and us_to_ps(1e-6) == 1 and us_to_ps(4e-7) == 0 and us_to_ps(5e-7) == 1
    assert parse_size("1.001KB") == 1001 and parse_size("1.0004KB") == 1000 and parse_size(2.5) == 3


# ----------------------------------------------------------------------------- R7


def test_r7_a_queued_offload_keeps_its_tensor_alive():
    # p1 makes x (100) and y (50); both go to host after p1: x copies 10-110, y waits
    # behind it on d2h and copies 110-160. p2 is y's last use (10-20), but y's offload is
    # only queued: y stays until its copy ends at 160 (v1 freed it at 20 and its copy ran
    # from freed memory). p3 allocates w (80) at 20: the peak is x + y + z + w = 290.
    t = {"x": (100, "activation"), "y": (50, "activation"), "z": (60, "activation"), "w": (80, "activation")}
    ops = [("p1", "forward", 10.0, [], ["x", "y"]), ("p2", "forward", 10.0, ["y"], ["z"]),
           ("p3", "forward", 10.0, ["z"], ["w"]), ("p4", "forward", 10.0, ["x", "w"], [])]
    p = make_profile(t, ops, "queued")
    pl = plan(p, offload("x", "p1"), offload("y", "p1"), prefetch("x", "p3", "p4"))
    r = both_paths(p, pl, machine(), budget_bytes=1000, record=True)
    assert r.ok and (r.peak_bytes, r.peak_at_us) == (290, 20.0)
    memory = dict(r.timeline.memory)
    assert memory[110.0] == 50 + 80 + 100   # x released (110), z freed (30), x back in at 110
    assert memory[160.0] == 80 + 100        # y freed when its offload ends
    assert r.host_peak_bytes == 150


# ----------------------------------------------------------------------------- R10


def test_r10_names_the_head_prefetch_that_waits_for_room():
    # k2 waits for b's prefetch, queued behind a's, which waits for room: a is named.
    t = {"a": (100, "weight"), "b": (10, "weight"), "y": (60, "activation")}
    ops = [("k1", "forward", 10.0, [], ["y"]), ("k2", "forward", 10.0, ["b", "y"], []),
           ("k3", "forward", 10.0, ["a"], [])]
    p = make_profile(t, ops, "waiter")
    pl = plan(p, prefetch("a", None, "k3"), prefetch("b", None, "k2"), drop("a", "k3"), drop("b", "k2"),
              initial={"a": "host", "b": "host"})
    r = both_paths(p, pl, machine(), budget_bytes=150)
    assert r.valid and not r.feasible and (r.rule, r.op, r.tensor) == ("R10", "k2", "a")
    assert r.reason.startswith("the prefetch of 'a' waits for memory (op 'k2' waits): needs 100 bytes, 90 free")


def test_r10_at_start_reports_what_was_placed():
    t = {"w": (60, "weight"), "v": (60, "weight"), "y": (1, "activation")}
    p = make_profile(t, [("k", "forward", 10.0, ["w", "v"], ["y"]), ("k2", "forward", 1.0, ["y"], [])], "start")
    r = both_paths(p, plan(p), machine(), budget_bytes=100)
    assert not r.feasible and r.rule == "R10" and r.tensor == "v" and r.peak_bytes == 60 <= 100
    assert "at start: persistent tensor 'v' does not fit" in r.reason


# ----------------------------------------------------------------------------- R15


def test_r15_waiting_for_the_older_copy_is_a_data_stall():
    # a is offloaded after f2 (20-120) and recomputed before b1: the recompute waits for
    # the GPU copy's release at 120 (ready at 40): 80 us of data stall, none of memory.
    from tests.engine_helpers import chain
    from simulator.plan import recompute
    p = chain()
    r = both_paths(p, plan(p, offload("a", "f2"), recompute("a", "b1")), machine(), budget_bytes=1000)
    assert r.stall_data_us == 80.0 and r.stall_memory_us == 0.0
    assert r.stall_by_op == {"b1": {"data_us": 80.0, "memory_us": 0.0}}


# ----------------------------------------------------------------------------- R23


def _hw(**pcie):
    base = {"h2d_gbps": 1, "d2h_gbps": 1, "latency_us": 0}
    base.update(pcie)
    return {"name": "x", "gpu": {"memory": "1GiB", "fp32_tflops": 1, "fp16_tflops": 1, "hbm_gbps": 1},
            "pcie": base, "host": {"memory": "1GiB"}}


@pytest.mark.parametrize("pcie, words", [
    ({"h2d_gbps": 0}, "pcie.h2d_gbps: must be > 0"),
    ({"d2h_gbps": 1e6 + 1}, "pcie.d2h_gbps: must be > 0 and at most 10^6 GB/s"),
    ({"latency_us": 1e9}, "pcie.latency_us: must be from 0 to below 10^9 us"),
])
def test_r23_hardware_limits(pcie, words):
    with pytest.raises(InputError, match=words.replace("^", r"\^")):
        hardware_from_dict(_hw(**pcie))


def test_r23_profile_limits():
    with pytest.raises(InputError, match=r"tensors\[0\] \(a\)\.bytes: must be a whole number from 0 to 2\^53 - 1"):
        make_profile({"a": (2**53, "activation")}, [("k", "forward", 1.0, [], ["a"])])
    with pytest.raises(InputError, match=r"ops\[0\] \(k\)\.time_us: must be a number from 0 to below 10\^9"):
        make_profile({"a": (1, "activation")}, [("k", "forward", 1e9, [], ["a"])])
    make_profile({"a": (2**53 - 1, "activation")}, [("k", "forward", 1e9 - 1, [], ["a"])])


def test_r23_times_past_2_to_the_63_ps_are_exact():
    # a 2^52-byte copy at 0.9 GB/s takes about 5 x 10^18 ps; there and back passes 2^63:
    # the C path hands the run to the reference, which has arbitrary-precision integers.
    big = 2**53 - 1
    t = {"a": (2**52, "activation"), "y": (1, "activation")}
    ops = [("p", "forward", 1.0, [], ["a"]), ("q", "forward", 1.0, [], ["y"]), ("r", "forward", 1.0, ["a", "y"], [])]
    p = make_profile(t, ops, "huge")
    hw = hardware_from_dict({"name": "big", "gpu": {"memory": big, "fp32_tflops": 1, "fp16_tflops": 1,
                                                    "hbm_gbps": 1},
                             "pcie": {"h2d_gbps": 0.9, "d2h_gbps": 0.9}, "host": {"memory": big}})
    r = both_paths(p, plan(p, offload("a", "p"), prefetch("a", "q", "r")), hw)
    copy_ps = -(-2**52 * 10**12 // 900_000_000)
    assert 2 * copy_ps > 2**63
    assert r.ok and r.iteration_us == (1_000_000 + 2 * copy_ps + 1_000_000) / 10**6


def test_chrome_trace_has_a_rate_counter_per_used_link():
    from simulator.timeline import chrome_trace
    p = make_profile(SHARE_TENSORS, SHARE_OPS, "share")
    r = both_paths(p, _share_plan(p), machine(ssd_read=0.0002), budget_bytes=1000, record=True)
    events = chrome_trace(r)["traceEvents"]
    pcie = [(e["ts"], e["args"]["rate"]) for e in events if e["name"] == "pcie_down (GB/s)"]
    ssd = [(e["ts"], e["args"]["rate"]) for e in events if e["name"] == "ssd_read_link (GB/s)"]
    assert pcie == [(0.0, 0.001), (200.0, 0.001), (240.0, 0.0)]
    assert ssd == [(0.0, 0.0002), (200.0, 0.0), (240.0, 0.0)]
    assert not any(e["name"].startswith("pcie_up") for e in events)   # unused links are left out


# ----------------------------------------------------------------------------- scoring


def test_score_ranks_and_grades_failure():
    """The compile-once API: a feasible plan by time, an infeasible one by how far over
    budget it goes, an invalid one by its rule, without the reference explaining them."""
    from simulator.api import Simulator
    p = make_profile(SHARE_TENSORS, SHARE_OPS, "share")
    sim = Simulator(p, machine(ssd_read=0.0002))
    good = sim.score(_share_plan(p), 1000)
    assert good.ok and good.iteration_us == 260.0 and good.rank() == (0, 260.0)
    # at 230 bytes both prefetches cannot be in at once (200 + 40): run with no budget the
    # plan peaks at 241 (w, v and y), 11 over
    tight = sim.score(_share_plan(p), 230)
    assert (tight.valid, tight.feasible, tight.rule, tight.over_budget_bytes) == (True, False, "R10", 11)
    bad = sim.score(plan(p, drop("w", "k")), 1000)
    assert (bad.valid, bad.rule, bad.op, bad.tensor) == (False, "R14", "k", "w") and bad.rank() == (2,)
    assert sorted([bad, tight, good], key=lambda s: s.rank()) == [good, tight, bad]
    many = sim.score_many([_share_plan(p), plan(p, drop("w", "k"))], 1000)
    assert [s.ok for s in many] == [True, False]


@pytest.mark.parametrize("actions, words", [
    ([prefetch("ghost", None, "k")], "unknown tensor 'ghost'"),
    ([prefetch("w", None, "nowhere")], "unknown op 'nowhere'"),
    ([drop("w", None)], "needs the op after which"),
    ([prefetch("w", None, "k", "ssd")], "the hardware has no SSD"),
])
def test_score_reports_structural_problems_as_input_errors(actions, words):
    from dataclasses import replace
    from simulator.api import Simulator
    p = make_profile(SHARE_TENSORS, SHARE_OPS, "share")
    sim = Simulator(p, replace(machine(), ssd=None))
    with pytest.raises(InputError, match=words):
        sim.score(plan(p, *actions), 1000)
