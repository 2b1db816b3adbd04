"""Issue 32's one home for each rule, pinned: one budget reader, one route and link model
(the simulator's) for g10 and the ILP, the compiled program built once per plan and
handed to the planners, UVM touches made by the compile, and what both runs share."""
from __future__ import annotations

import numpy as np
import pytest

from planner.core.api import make_plan, simulator_for
from planner.core.registry import RunOptions
from planner.shared.ilp.rows import link_shares
from planner.swap._g10_links import LinkTime
from planner.swap._g10_intervals import move_speeds
from simulator.api import Simulator
from simulator.compile.compiled import compile_profile
from simulator.compile.lower import compile_program
from simulator.errors import InputError
from simulator.model.links import link_speed, transfer_links
from simulator.plan import Plan
from simulator.run import engine, state, uvm
from simulator.units import planning_budget
from tests.conftest import make_profile
from tests.engine_helpers import CHAIN_OPS, CHAIN_TENSORS, machine


def test_one_budget_reader_caps_percentages_not_sizes_unless_asked():
    assert planning_budget("50%", 1000, 400) == (400, 500)          # capped, and what was asked
    assert planning_budget("30%", 1000, 400) == (300, None)
    assert planning_budget("500", 1000, 400) == (500, None)          # a size is left for R2 to refuse
    assert planning_budget("500", 1000, 400, cap_sizes=True) == (400, 500)   # compare: one list, many machines
    assert planning_budget(350, 1000, 400) == (350, None)            # bytes already
    with pytest.raises(InputError, match="--budgets"):
        planning_budget("lots", 1000, 400, "--budgets")


def test_g10_and_the_ilp_take_the_simulators_routes():
    # direct SSD path: the SSD's latency alone, and no copy engine for SSD copies (R17, R18)
    for path in ("host", "direct"):
        hw = machine(duplex="half", pcie_latency=7, ssd_latency=40, ssd_path=path, ssd_read=0.0005,
                     ssd_write=0.00025)
        latency, links, engine_held = transfer_links(hw, "offload", "ssd")
        assert latency == (47.0 if path == "host" else 40.0) and engine_held == (path == "host")
        assert dict(links) == {"pcie_up": 1.0, "ssd_write_link": 0.25}     # bytes per us
        assert link_speed(hw, "offload", "ssd") == (latency, 0.25)
        assert link_shares(hw, "ssd", "offload") == (dict(links), engine_held)
        route = LinkTime(np.array([1.0]), hw).links("offload", "ssd")
        assert route == (("pcie_up", 4.0), ("ssd_write_link", 1.0)) + ((("engine", 1.0),) if engine_held else ())
        # the 2.5x rule: the slower of the two lone transfers, on the same routes
        speeds = move_speeds(hw, use_ssd=True)
        assert speeds["ssd"] == (latency, 0.25) and speeds["host"] == (7.0, 1.0)


def test_the_run_compiles_once_and_planners_score_on_it():
    profile = make_profile(CHAIN_TENSORS, CHAIN_OPS, "chain")
    hw = machine()
    assert compile_profile(profile) is not compile_profile(profile)   # no hidden cache: build it once
    sim = Simulator(profile, hw)
    assert simulator_for(profile, hw, RunOptions(simulator=sim)) is sim
    assert simulator_for(profile, machine(h2d=0.002), RunOptions(simulator=sim)) is not sim   # another machine
    built = []
    real_init = Simulator.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        real_init(self, *args, **kwargs)

    Simulator.__init__ = counting
    try:
        make_plan(profile, hw, 150, "capuchin")
    finally:
        Simulator.__init__ = real_init
    assert len(built) == 1      # make_plan's, handed to capuchin's feedback loop


def test_uvm_touches_are_made_by_the_compile_and_both_runs_share_one_state():
    profile = make_profile(CHAIN_TENSORS, CHAIN_OPS, "chain")
    sim = Simulator(profile, machine())
    program = compile_program(profile, sim.compiled, Plan(profile.name, (), memory="uvm"), sim.machine)
    assert program.seq.uvm is not None and len(program.seq.uvm.items) == len(program.seq)
    assert issubclass(engine._Run, state.RunState) and issubclass(uvm._UvmRun, state.RunState)
    assert not issubclass(uvm._UvmRun, engine._Run)   # the UVM run is not a subclass overriding the loop
