"""torch-budget: the knapsack over recomputable saved activations (torch.compile's
activation memory budget) and its plans."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from planner.core.api import make_plan
from planner.recompute.torch_budget import knapsack, recompute_cost_us
from simulator.profile import profile_from_dict
from tests.conftest import profile_dict
from tests.engine_helpers import machine


@pytest.mark.parametrize("seed", range(6))
def test_the_knapsack_finds_the_cheapest_set_brute_force_finds(seed):
    rng = np.random.default_rng(seed)
    weights = rng.integers(1, 100, size=8).astype(float)
    costs = rng.uniform(0, 10, size=8)
    need = int(weights.sum() * rng.uniform(0.2, 0.8))
    best = min((costs[list(s)].sum(), s) for r in range(9) for s in itertools.combinations(range(8), r)
               if weights[list(s)].sum() >= need)
    chosen = knapsack(weights, costs, need)
    assert weights[chosen].sum() >= need
    assert costs[chosen].sum() == pytest.approx(best[0])


def test_the_knapsack_takes_everything_when_nothing_less_frees_enough_and_nothing_when_nothing_is_asked():
    weights, costs = np.array([5.0, 5.0]), np.array([1.0, 2.0])
    assert knapsack(weights, costs, 100) == [0, 1]
    assert knapsack(weights, costs, 0) == []


# mm makes a (100 B, 1 GFLOP to remake), gelu makes g from a (100 B, no FLOP count: cheap);
# both are saved for backward; the budget needs 95 B of them gone: the knapsack drops g
TENSORS = {"x": (10, "input"), "w": (10, "weight"), "a": (100, "activation"), "g": (100, "activation"),
           "l": (1, "activation"), "dg": (1, "gradient"), "da": (1, "gradient")}
OPS = [("mm", "forward", 50.0, ["x", "w"], ["a"]), ("gelu", "forward", 50.0, ["a"], ["g"]),
       ("loss", "forward", 5.0, ["g"], ["l"]), ("mid", "forward", 5.0, [], [], [], 100),
       ("gelu_bw", "backward", 10.0, ["g", "l"], ["dg"]), ("mm_bw", "backward", 10.0, ["a", "dg", "x"], ["da"])]


def test_it_drops_the_activation_that_is_cheapest_to_recompute():
    data = profile_dict(TENSORS, OPS, "tb")
    data["ops"][0]["flops"] = 1e9   # the matmul's FLOP count
    profile, hw = profile_from_dict(data), machine()
    assert recompute_cost_us(profile.ops[0], hw) > recompute_cost_us(profile.ops[1], hw)
    budget = profile.peak_bytes - 95   # 5 B of slack for the backward ops around the recompute
    planned = make_plan(profile, hw, budget, "torch-budget")
    recomputed = [a.tensor for a in planned.plan.actions if a.kind == "recompute"]
    assert recomputed == ["g"] and planned.result.ok
    assert planned.plan.planner.notes["rounds"] == 1
