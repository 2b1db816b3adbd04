"""``capuchin``'s SSD tier: when host memory cannot hold every swap, the swaps with the
longest free time go on to the SSD (issue 35).

The test machine of tests/engine_helpers.py: PCIe moves 1 byte per microsecond each way,
the SSD 0.5, no latency; an SSD copy goes through host memory (R18), so a 100 B tensor
takes 100 us to or from host memory and 200 us to or from the SSD.
"""
from __future__ import annotations

from planner.core.api import make_plan
from simulator.hardware import hardware_from_dict
from tests.conftest import make_profile
from tests.engine_helpers import machine

# Two 100 B activations that cannot be recomputed (their producers update the running
# statistic ``rs`` in place, as batch norm does, R15), both in memory at ``peak``:
#
#   op      time  no-swap memory (w, rs 10 each + live tensors)
#   fA       10    120   A
#   fB       10    220   A B
#   c1       10    230   A B h1
#   long1  1000    240   A B h1 h2
#   peak     10    430   A B h2 P
#   u        10    430   A B P h3
#   long2  1000    240   A B h3 g1
#   bB       10    240   A B g1 g2
#   bA       10    140   A g2 g3
#
# Budget 240: at peak and u both A and B must be away (430 - 200 = 230). Host memory
# holds 150 B: one of them. A is idle longer (fB to bA) than B (c1 to bB), so A is the
# one that goes to the SSD; its 200 us copies hide in the 1,000 us ops.
TENSORS = {
    "w": (10, "weight"), "rs": (10, "weight"), "A": (100, "activation"), "B": (100, "activation"),
    "P": (200, "activation"), "h1": (10, "activation"), "h2": (10, "activation"), "h3": (10, "activation"),
    "g1": (10, "gradient"), "g2": (10, "gradient"), "g3": (10, "gradient"),
}
OPS = [
    ("fA", "forward", 10.0, ["w"], ["A"], ["rs"]),
    ("fB", "forward", 10.0, ["A"], ["B"], ["rs"]),
    ("c1", "forward", 10.0, ["B"], ["h1"]),
    ("long1", "forward", 1000.0, ["h1"], ["h2"]),
    ("peak", "forward", 10.0, ["h2"], ["P"]),
    ("u", "forward", 10.0, ["P"], ["h3"]),
    ("long2", "backward", 1000.0, ["h3"], ["g1"]),
    ("bB", "backward", 10.0, ["B", "g1"], ["g2"]),
    ("bA", "backward", 10.0, ["A", "g2"], ["g3"]),
]
BUDGET = 240


def two_big():
    return make_profile(TENSORS, OPS, "two-big")


def tiers(plan) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for action in plan.actions:
        if action.kind == "offload":
            found.setdefault(action.tensor, set()).add(action.to)
        if action.kind == "prefetch":
            found.setdefault(action.tensor, set()).add(action.source)
    return found


def test_without_the_ssd_tier_host_memory_is_too_small():
    planned = make_plan(two_big(), machine(host="150B"), BUDGET, "capuchin", params={"ssd": False})
    assert not planned.result.ok


def test_the_ssd_tier_makes_the_plan_run_with_the_longest_idle_tensor_on_the_ssd():
    planned = make_plan(two_big(), machine(host="150B"), BUDGET, "capuchin")
    result = planned.result
    assert result.ok
    assert result.stall_us == 0.0
    assert result.iteration_us == sum(op[2] for op in OPS)
    assert result.peak_bytes <= BUDGET
    assert result.host_peak_bytes <= 150
    assert result.bytes_ssd_write == 100 and result.bytes_ssd_read == 100
    assert tiers(planned.plan) == {"A": {"ssd"}, "B": {"host"}}
    assert planned.plan.planner.notes["ssd_swaps"] == 1


def test_the_ssd_tier_changes_nothing_when_host_memory_suffices():
    roomy = make_plan(two_big(), machine(host="1GiB"), BUDGET, "capuchin")
    host_only = make_plan(two_big(), machine(host="1GiB"), BUDGET, "capuchin", params={"ssd": False})
    assert roomy.plan.actions == host_only.plan.actions
    assert all(tier == {"host"} for tier in tiers(roomy.plan).values())


def test_without_an_ssd_on_the_machine_the_plan_stays_host_only():
    data = {"name": "no-ssd", "gpu": {"memory": "1GiB", "fp32_tflops": 1, "fp16_tflops": 1, "hbm_gbps": 1},
            "pcie": {"h2d_gbps": 0.001, "d2h_gbps": 0.001, "duplex": "full", "latency_us": 0},
            "host": {"memory": "150B"}}
    planned = make_plan(two_big(), hardware_from_dict(data), BUDGET, "capuchin")
    assert not planned.result.ok
    assert all(tier == {"host"} for tier in tiers(planned.plan).values())


def test_deterministic():
    first = make_plan(two_big(), machine(host="150B"), BUDGET, "capuchin")
    again = make_plan(two_big(), machine(host="150B"), BUDGET, "capuchin")
    assert again.plan.actions == first.plan.actions
