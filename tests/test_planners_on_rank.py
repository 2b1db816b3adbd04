"""Every planner plans a data-parallel rank unchanged (issue 51): the rank's graph is a
profile, its collectives ops the planners leave to the simulator (R56-R58). Each plan is
valid and within its budget, or honestly infeasible; the collectives' bytes are all sent;
planners in managed memory are refused by R56, not broken."""
from __future__ import annotations

import pytest

from planner.core.api import make_plan
from planner.core.registry import RunOptions, planners
from shard import shard_profile
from simulator.catalog import open_profile
from simulator.errors import InfeasibleError
from simulator.hardware import load_hardware

HW = load_hardware("a100-80gb-sxm-x8")
QUICK = RunOptions(seed=0, time_limit=1.0, threads=1)
# the planners that search, at a short limit, run on one strategy each (their own tests
# cover their searches); the others on both
SEARCHING = {spec.name for spec in planners() if spec.searches}


@pytest.fixture(scope="module")
def ranks():
    base = open_profile("synth-transformer-l12-b16-s1024")
    return {strategy: shard_profile(base, strategy, 4) for strategy in ("zero3", "ddp")}


SLOW = {"superneurons"}     # seconds a plan here: on the zero3 rank only
CASES = [(strategy, spec.name) for spec in planners() for strategy in ("zero3", "ddp")
         if (spec.name not in SEARCHING and spec.name not in SLOW) or strategy == "zero3" and spec.name in SLOW
         or spec.name in SEARCHING and strategy == ("zero3" if sorted(SEARCHING).index(spec.name) % 2 else "ddp")]


@pytest.mark.parametrize("strategy, planner", CASES)
def test_every_planner_plans_a_rank(ranks, strategy, planner):
    rank = ranks[strategy]
    budget = int(rank.peak_bytes * 0.5)
    wire = sum(op.collective.wire_bytes() for op in rank.ops if op.collective is not None)
    try:
        planned = make_plan(rank, HW, budget, planner, {}, 0, QUICK)
    except InfeasibleError:
        return                          # refused before planning: below the planner's floor
    result = planned.result
    if planned.plan.memory == "uvm":    # managed memory does not model the collectives (R56)
        assert not result.valid and result.rule == "R56"
        return
    assert result.valid, (result.rule, result.reason)
    if result.feasible:
        assert result.peak_bytes <= budget
        assert result.link_bytes["interconnect"] == wire     # every collective ran, whole
        assert result.iteration_us >= rank.ideal_us
