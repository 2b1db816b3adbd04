"""The g10 planner (G10, MICRO'23): the 2.5x destination rule, host capacity, the
benefit order of the greedy, eager prefetch, persistent tensors across the iteration
boundary, and every shipped profile at 90/70/50/30% of its peak.

Machine (tests/engine_helpers.py): PCIe moves 1 B/us each way, the SSD 0.5 B/us; the
SSD is reached through host memory, so an SSD transfer costs PCIe + SSD latency.
Ops take 100 us, so each kernel offers 100 us of every link.
"""
from __future__ import annotations

import pytest

from planner.api import make_plan
from simulator.plan import offload, prefetch
from tests.conftest import make_profile
from tests.engine_helpers import machine


def chain_profile(name, length, tensors, extra):
    """Ops p0..p{length-1} of 100 us; op k reads c{k-1} and writes c{k} (1 B each), so
    the chain tensors never idle. ``extra``: {position: (inputs, outputs, workspace)}."""
    specs = {f"c{k}": (1, "activation") for k in range(length)}
    specs.update(tensors)
    ops = []
    for k in range(length):
        inputs, outputs, workspace = extra.get(k, ((), (), 0))
        ops.append((f"p{k}", "forward", 100.0, [*inputs, *([f"c{k - 1}"] if k else [])],
                    [*outputs, f"c{k}"], None, workspace))
    return make_profile(specs, ops, name)


# Two tensors of 100 B, each idle across a stretch where a 50 B workspace puts memory over
# the 110 B budget:
#   long:  made by p0, read by p11: idle p1..p10 = 1000 us; workspaces at p4..p7
#   short: made by p12, read by p18: idle p13..p17 = 500 us; workspace at p15
# Resident there: tensor 100 + two chain tensors 2 + workspace 50 = 152 > 110; without the
# tensor 52. The floor (largest single-op working set) is 102 (p11: long + c10 + c11).
#
# The 2.5x rule with PCIe latency 10 us and SSD latency 20 us, for 100 B:
#   SSD:  2.5 x (20 + 10 + 100 / 0.5) = 2.5 x 230 = 575 us
#   host: 2.5 x (10 + 100 / 1)        = 2.5 x 110 = 275 us
# long (1000 us) passes the SSD rule; short (500 us) fails it and passes the host rule.
TWO_GAPS = {"long": (100, "activation"), "short": (100, "activation")}
TWO_GAPS_OPS = {0: ((), ("long",), 0), 4: ((), (), 50), 5: ((), (), 50), 6: ((), (), 50),
                7: ((), (), 50), 11: (("long",), (), 0), 12: ((), ("short",), 0),
                15: ((), (), 50), 18: (("short",), (), 0)}
LATENT = machine(pcie_latency=10, ssd_latency=20)


def two_gaps():
    return chain_profile("two-gaps", 19, TWO_GAPS, TWO_GAPS_OPS)


def test_a_long_interval_goes_to_ssd_and_a_short_one_to_host():
    # long to SSD: 230 us each way. Eviction after p0 ends in kernel 3 (100 + 100 + 30);
    # the latest prefetch counting back from p11 starts in kernel 8 (p10, p9 and 30 us of
    # p8), issued after p7: long is away for p4..p7, the kernels over budget. Eager
    # prefetch cannot move it earlier (p7 with long: 152 > 0.99 x 110).
    # short to host: 110 us each way. Eviction after p12 ends in kernel 14; the prefetch
    # starts in kernel 16 (p17 and 10 us of p16), issued after p15: away for p15.
    profile = two_gaps()
    planned = make_plan(profile, LATENT, 110, "g10")
    assert list(planned.plan.actions) == [
        offload("long", "p0", "ssd"), prefetch("long", "p7", "p11", "ssd"),
        offload("short", "p12", "host"), prefetch("short", "p15", "p18", "host")]
    result = planned.result
    assert result.ok and result.peak_bytes <= 110
    assert result.iteration_us == profile.ideal_us == 1900.0  # every transfer hidden


def test_an_interval_that_passes_neither_rule_stays_on_the_gpu():
    # rule_factor 5: SSD needs 5 x 230 = 1150 us, host 5 x 110 = 550 us. long (1000 us)
    # now goes to host; short (500 us) passes neither rule and stays, although p15 is over
    # budget, so the plan cannot run in 110 B.
    planned = make_plan(two_gaps(), LATENT, 110, "g10", {"rule_factor": 5.0})
    assert {(a.kind, a.tensor, a.to or a.source) for a in planned.plan.actions} == {
        ("offload", "long", "host"), ("prefetch", "long", "host")}
    assert planned.plan.planner.status == "infeasible"


@pytest.mark.parametrize("host_bytes, moved", [(99, set()), (100, {"long", "short"})])
def test_host_capacity_is_respected_over_time(host_bytes, moved):
    # Without the SSD both tensors pass the host rule. A copy holds host space from its
    # eviction until the tensor dies (R19): long from p1 to p11, short from p13 to p18, so
    # they never hold it together: 100 B of host memory takes both, 99 B neither.
    planned = make_plan(two_gaps(), machine(pcie_latency=10, ssd_latency=20, host=host_bytes), 110, "g10",
                        {"ssd": False})
    assert {a.tensor for a in planned.plan.actions} == moved
    assert planned.result.valid and planned.result.host_peak_bytes == (100 if moved else 0)


def test_eager_prefetch_moves_a_prefetch_earlier_while_memory_stays_under_the_limit():
    # Host only, long: eviction after p0 ends in kernel 2 (110 us); the latest prefetch
    # starts in kernel 9 (p10 and 10 us of p9), issued after p8. Memory in p8 with long
    # back is 2 + 100 = 102 <= 0.99 x 110 = 108.9, so the prefetch moves to kernel 8
    # (issued after p7); p7 with long would be 152. With eager_limit 0.9 (99 B) it stays.
    hw = machine(pcie_latency=10)
    eager = make_plan(two_gaps(), hw, 110, "g10", {"ssd": False})
    assert prefetch("long", "p7", "p11", "host") in eager.plan.actions
    lazy = make_plan(two_gaps(), hw, 110, "g10", {"ssd": False, "eager_limit": 0.9})
    assert prefetch("long", "p8", "p11", "host") in lazy.plan.actions
    assert eager.result.ok and lazy.result.ok


# A (150 B, made by p0, read by p11) and B (100 B, made by p4, read by p14); host only,
# no latency, budget 260. Workspaces put memory over budget at p6 (A and B resident:
# 252 + 50), at p10 and p11 (252 + 50) and at p12 (B + 2 + 200):
#   A: evicted in kernels 1-2 (150 us), latest prefetch in kernels 9-10: away for p3..p8,
#      which holds one over-budget kernel (p6). Window: half written in kernel 1, half
#      read from kernel 10: over budget at p6 and p10: 200 us. Benefit 150 x 200 = 30,000.
#   B: evicted in kernel 5, prefetched in kernel 13: away for p6..p12. Window p5..p13:
#      over budget at p6, p10, p11, p12: 400 us. Benefit 100 x 400 = 40,000.
# B is taken first and alone brings every kernel under budget (302 - 100 = 202), so A is
# not moved. Picking the bigger tensor, or the longer interval (A: 150 x 1000 us against
# B: 100 x 900 us), would have moved A first and then B as well.
BENEFIT = {"A": (150, "activation"), "B": (100, "activation")}
BENEFIT_OPS = {0: ((), ("A",), 0), 4: ((), ("B",), 0), 6: ((), (), 50), 10: ((), (), 50),
               11: (("A",), (), 50), 12: ((), (), 200), 14: (("B",), (), 0)}


def test_the_interval_with_more_bytes_times_over_budget_time_is_taken_first():
    profile = chain_profile("benefit", 15, BENEFIT, BENEFIT_OPS)
    planned = make_plan(profile, machine(), 260, "g10", {"ssd": False})
    assert {a.tensor for a in planned.plan.actions} == {"B"}
    assert planned.result.ok and planned.result.peak_bytes <= 260


def test_with_equal_over_budget_time_the_bigger_tensor_is_taken():
    # Only p6 over budget (the other workspaces gone): both windows hold it, so the
    # benefits are 150 x 100 (A) and 100 x 100 (B); A is taken and p6 then fits.
    ops = {**BENEFIT_OPS, 10: ((), (), 0), 11: (("A",), (), 0), 12: ((), (), 0)}
    planned = make_plan(chain_profile("benefit-tie", 15, BENEFIT, ops), machine(), 260, "g10", {"ssd": False})
    assert {a.tensor for a in planned.plan.actions} == {"A"}
    assert planned.result.ok


# Persistent tensors across the iteration boundary. w (weight, 100 B) is read by every op;
# m (optimizer state, 100 B) only by the update u, the last op. f2 and f3 have 150 B
# workspaces: 352 and 353 B with everything resident, over the 260 B budget. m's only
# idle interval runs from u to u of the next iteration (400 us; host rule 2.5 x 100 =
# 250 us). Taking it: m starts in host (initial), comes back before u (the latest start
# counting back from u is b1, so it is issued after f3) and is written back after u. No
# link time is left after u inside the iteration, so the rules alone cannot take it; the
# fallback lets the write-back run after the last op: a 100 us tail.
STEADY = {"w": (100, "weight"), "m": (100, "optimizer_state"), "a": (1, "activation"),
          "c1": (1, "activation"), "c2": (1, "activation"), "g": (50, "gradient")}
STEADY_OPS = [
    ("f1", "forward", 100.0, ["w"], ["a"]),
    ("f2", "forward", 100.0, ["a", "w"], ["c1"], None, 150),
    ("f3", "forward", 100.0, ["c1", "w"], ["c2"], None, 150),
    ("b1", "backward", 100.0, ["c2", "a", "w"], ["g"]),
    ("u", "optimizer", 100.0, ["g"], [], ["w", "m"]),
]


def test_an_optimizer_state_starts_in_host_and_is_written_back_after_its_update():
    profile = make_profile(STEADY, STEADY_OPS, "steady")
    planned = make_plan(profile, machine(), 260, "g10", {"ssd": False})
    assert planned.plan.initial == {"m": "host"}
    assert list(planned.plan.actions) == [prefetch("m", "f3", "u", "host"), offload("m", "u", "host")]
    result = planned.result
    assert result.ok and result.peak_bytes <= 260  # R20: m ends in host with a valid copy
    assert result.tail_us == 100.0


def test_without_the_fallback_only_the_rules_apply():
    profile = make_profile(STEADY, STEADY_OPS, "steady")
    planned = make_plan(profile, machine(), 260, "g10", {"ssd": False, "fallback": False})
    assert planned.plan.initial == {} and planned.plan.planner.status == "infeasible"
