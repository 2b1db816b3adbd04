"""``modnn`` (moDNN, DATE'18) and ``deeptm`` (DeepTM, TPDS'24) on graphs built for their
defining behaviour, and both on small synthetic models at 50% of the peak.

The test machine (tests/engine_helpers.py) moves 1 byte per microsecond each way over
PCIe; latency only where asked.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner.core.api import make_plan, score
from planner.swap.deeptm import aggregate, heat
from planner.swap.modnn import smallest_cover
from planner.core.registry import RunOptions, get_planner
from simulator.api import Simulator
from simulator.catalog import open_profile
from simulator.errors import InfeasibleError
from simulator.hardware import load_hardware
from simulator.plan import plan_json
from simulator.profile import profile_from_dict
from tests.conftest import make_profile, profile_dict
from tests.engine_helpers import machine
from tracer.synthetic import synthesize

# ----------------------------------------------------------------------------- modnn

# p makes a (300 B), b (500 B) and c (900 B), which only q reads, in backward. The
# conv-like op x (1,000 us, 940-byte workspace) reads the weight w (100 B) and makes y
# (10 B); its variants: huge (100 us, 5,000-byte workspace: never fits a 2,000-byte
# budget, whatever is offloaded), fast (500 us, 980 B), small (2,000 us, none).
# At x, w + a + b + c = 1,800 B are resident: 200 free, x needs 950, 750 short.
CONV_TENSORS = {"w": (100, "weight"), "a": (300, "activation"), "b": (500, "activation"),
                "c": (900, "activation"), "y": (10, "activation"), "g": (1, "gradient")}
CONV_OPS = [("p", "forward", 1.0, [], ["a", "b", "c"]),
            ("x", "forward", 1000.0, ["w"], ["y"], None, 940),
            ("q", "backward", 1.0, ["y", "a", "b", "c"], ["g"])]
VARIANTS = [{"name": "huge", "time_us": 100, "workspace_bytes": 5000},
            {"name": "fast", "time_us": 500, "workspace_bytes": 980},
            {"name": "small", "time_us": 2000, "workspace_bytes": 0}]


def conv_profile(workspace=940, variants=VARIANTS):
    data = profile_dict(CONV_TENSORS, CONV_OPS, "modnn-conv")
    data["ops"][1]["workspace_bytes"] = workspace
    data["ops"][1]["variants"] = list(variants)
    return profile_from_dict(data)


def test_smallest_cover_takes_the_fewest_bytes():
    # 750 short: {300, 500} (800 B) beats {900}; 450 short: {500} beats {300, 500} and {900}
    items = [(300, 300), (500, 500), (900, 900)]
    assert smallest_cover(items, 750) == [0, 1]
    assert smallest_cover(items, 450) == [1]
    assert smallest_cover(items, 900) == [2]          # ties (900 = 900 < 300 + 900): one tensor
    assert smallest_cover(items, 1701) is None
    assert smallest_cover([(0, 400), (500, 500)], 300) == [0]   # what costs no copy first


def test_modnn_offloads_the_smallest_set_then_takes_the_fastest_variant_that_fits():
    profile, hw = conv_profile(), machine()
    planned = make_plan(profile, hw, 2000, "modnn")
    plan, result = planned.plan, planned.result
    assert result.ok
    offloaded = {a.tensor for a in plan.actions if a.kind == "offload"}
    assert offloaded == {"a", "b"}                     # 800 B, not c (900 B) nor all three
    assert all(a.after == "p" for a in plan.actions if a.kind == "offload")
    assert {(a.tensor, a.after, a.before) for a in plan.actions if a.kind == "prefetch"} == \
        {("a", "x", "q"), ("b", "x", "q")}
    # huge never fits (x alone would need 100 + 10 + 5,000 B); fast fits the 1,000 B freed
    assert plan.variants == {"x": "fast"}
    default = score(Simulator(profile, hw), 2000, plan.actions)
    assert default.ok and result.iteration_us == default.iteration_us - 500
    assert not score(Simulator(profile, hw), 2000, plan.actions, variants={"x": "huge"}).ok


def test_modnn_without_variants_is_offload_on_failure():
    profile = conv_profile(variants=())
    planned = make_plan(profile, machine(), 2000, "modnn")
    assert planned.result.ok and not planned.plan.variants
    assert {a.tensor for a in planned.plan.actions if a.kind == "offload"} == {"a", "b"}
    assert planned.plan.planner.notes["rounds"] == 1


def test_modnn_starts_from_the_smallest_workspaces_when_the_defaults_cannot_fit():
    # x's default workspace (3,000 B) never fits 2,000 B; from the smallest-workspace start
    # (small, none) x upgrades to the fastest variant that fits without moving more: mid
    # (1,200 us, 150 B fits the 200 B free beside w, a, b and c)
    variants = [{"name": "small", "time_us": 2000, "workspace_bytes": 0},
                {"name": "mid", "time_us": 1200, "workspace_bytes": 150},
                {"name": "huge", "time_us": 100, "workspace_bytes": 5000}]
    profile, hw = conv_profile(workspace=3000, variants=variants), machine()
    planned = make_plan(profile, hw, 2000, "modnn")   # the floor counts x's smallest workspace
    assert planned.plan.variants == {"x": "mid"} and planned.plan.actions == ()
    assert planned.result.ok and "smallest-workspace" in planned.plan.planner.notes["start"]
    # the bound counts each op at its fastest algorithm: no plan beats it, this one included
    assert planned.result.iteration_us >= planned.plan.planner.lower_bound_us - 1e-6
    # a planner that never chooses variants (or modnn told not to) is refused that budget
    for planner, params in (("capuchin", {}), ("modnn", {"variants": False})):
        with pytest.raises(InfeasibleError, match="smallest budget planner"):
            make_plan(profile, hw, 2000, planner, params)


def test_the_floor_and_the_bound_with_variants():
    from planner.shared.facts import budget_floor
    from planner.shared.bound import lower_bound
    variants = [{"name": "small", "time_us": 2000, "workspace_bytes": 0},
                {"name": "huge", "time_us": 100, "workspace_bytes": 5000}]
    profile, hw = conv_profile(workspace=3000, variants=variants), machine()
    # at x: w (100) + y (10) + workspace, weights kept: w counted once in the base
    assert budget_floor(profile, moves_persistent=False) == (100 + 10 + 3000, "x")
    assert budget_floor(profile, moves_persistent=False, variants=True) == (100 + 10 + 300 + 500 + 900 + 1, "q")
    plain, relaxed = lower_bound(profile, hw, 10**6), lower_bound(profile, hw, 10**6, variants=True)
    assert plain.iteration_us == profile.ideal_us == 1002
    assert relaxed.iteration_us == 1.0 + 100 + 1.0     # x at its fastest (huge)
    assert lower_bound(conv_profile(variants=()), hw, 10**6, variants=True).iteration_us == 1002


# ----------------------------------------------------------------------------- deeptm

# p makes eight 100-byte tensors a0..a7 that only c reads, at the end; m1..m5 (300 us
# each) chain 1,000-byte tensors. The budget (2,000 B) leaves no room for the a's
# during m2..m5: all eight leave after p and come back after m5. PCIe: 1 B/us after a
# 50 us latency, so eight copies one by one take 1,200 us, one group of them 850 us.
def small_tensors():
    tensors = {f"a{k}": (100, "activation") for k in range(8)}
    tensors.update({f"x{k}": (1000, "activation") for k in range(1, 6)})
    tensors.update({"y": (1, "activation"), "g": (1, "gradient")})
    ops = [("p", "forward", 1.0, [], [f"a{k}" for k in range(8)])]
    previous: list[str] = []
    for k in range(1, 6):
        ops.append((f"m{k}", "forward", 300.0, previous, [f"x{k}"]))
        previous = [f"x{k}"]
    ops += [("n", "forward", 1.0, ["x5"], ["y"]),
            ("c", "backward", 1.0, [f"a{k}" for k in range(8)] + ["y"], ["g"])]
    return make_profile(tensors, ops, "small-tensors")


def test_deeptm_groups_adjacent_transfers_and_the_grouped_plan_is_faster():
    profile, hw = small_tensors(), machine(pcie_latency=50)
    planned = make_plan(profile, hw, 2000, "deeptm")
    plan, result = planned.plan, planned.result
    assert result.ok
    groups = {a.group for a in plan.actions}
    assert None not in groups and len(groups) == 2      # one offload group, one prefetch group
    assert sorted(a.tensor for a in plan.actions if a.kind == "offload") == [f"a{k}" for k in range(8)]
    ungrouped = score(Simulator(profile, hw), 2000, [replace(a, group=None) for a in plan.actions])
    assert ungrouped.ok and result.iteration_us < ungrouped.iteration_us
    # the offloads: 850 us instead of 1,200 us, and so the prefetches (350 us saved each)
    assert ungrouped.iteration_us - result.iteration_us == pytest.approx(700.0)
    assert planned.plan.planner.notes["ungrouped_us"] == ungrouped.iteration_us


def test_deeptm_aggregation_respects_page_runs_and_latency():
    profile = small_tensors()
    actions = make_plan(profile, machine(pcie_latency=50), 2000, "deeptm").plan.actions
    plain = [replace(a, group=None) for a in actions]
    # runs of at most 300 B: three groups of three, three and two tensors per direction
    grouped, groups, members = aggregate(plain, profile, machine(pcie_latency=50), 300)
    assert (groups, members) == (6, 16)
    # no latency, nothing to save: nothing grouped
    assert aggregate(plain, profile, machine(), 0)[1] == 0


def test_heat_rates_frequent_near_small_tensors_hot():
    # h: small, read by every op (hot); k: large, made first and read last (cold)
    profile = make_profile({"h": (10, "activation"), "k": (10_000, "activation"), "o": (1, "activation")},
                           [("f1", "forward", 10.0, [], ["h", "k"]), ("f2", "forward", 10.0, ["h"], []),
                            ("f3", "forward", 10.0, ["h"], []), ("f4", "forward", 10.0, ["h"], []),
                            ("b1", "backward", 10.0, ["h", "k"], ["o"])], "heat")
    rated = heat(profile, machine(pcie_latency=5), ["h", "k"], {"access": 1, "reuse": 1, "idle": 1, "size": 1})
    assert rated["h"] == 1.0 and rated["k"] == 0.0


# ----------------------------------------------------------------------------- validity

# the transformer at its default size and batch 16 (GPT-2 small): smaller ones peak in the logits,
# below which no planner that keeps the weights can go (the floor)
SYNTHETIC = {"transformer": dict(batch=16, seq=1024), "cnn": dict(layers=4, batch=16, seq=64)}


@pytest.fixture(scope="module")
def synthetic():
    return {model: synthesize(model, **kw) for model, kw in SYNTHETIC.items()}


@pytest.mark.parametrize("planner", ["modnn", "deeptm"])
@pytest.mark.parametrize("model", [m if m == "cnn" else pytest.param(m, marks=pytest.mark.slow) for m in SYNTHETIC])
def test_valid_and_within_budget_on_synthetic_models_at_half_the_peak(synthetic, planner, model):
    """`make test` plans the CNN (both planners, deeptm's MILP to its 10 s limit); `make
    test-slow` also the transformer (tests/test_planners_all.py plans it with both too)."""
    profile, hw = synthetic[model], load_hardware("a100-40gb-pcie4")
    budget = int(profile.peak_bytes * 0.5)
    planned = make_plan(profile, hw, budget, planner, options=RunOptions(time_limit=10.0))
    assert planned.result.valid, planned.result.reason
    assert planned.result.ok and planned.result.peak_bytes <= budget
    assert planned.plan.planner.status != "infeasible"


# test_planners_all.py runs deeptm (a time-limited search) on the synthetic profiles only,
# with a 3 s limit: here a real profile at its default limit's scale, and determinism.


@pytest.mark.slow
def test_deeptm_on_gpt2_at_half_the_peak_reports_its_solver():
    profile, hw = open_profile("gpt2-b48-s1024"), load_hardware("a100-40gb-pcie4")
    budget = min(int(profile.peak_bytes * 0.5), hw.gpu.memory_bytes)
    planned = make_plan(profile, hw, budget, "deeptm", options=RunOptions(time_limit=30.0))
    notes = planned.plan.planner.notes
    assert planned.result.ok and planned.result.peak_bytes <= budget
    assert notes["solver"] in ("Optimal", "Time limit reached") and notes["cold_candidates"] <= notes["candidates"]
    assert planned.plan.planner.status in ("optimal", "feasible", "heuristic")
    assert planned.result.iteration_us < 1.2 * profile.ideal_us


@pytest.mark.parametrize("case", ["small", pytest.param("transformer", marks=pytest.mark.slow)])
def test_deeptm_plans_are_deterministic(synthetic, case):
    """The same plan twice. `make test` runs the small tensors (the whole pipeline, the MILP
    solved to optimality in well under a second); `make test-slow` the synthetic transformer
    at half its peak, whose MILP takes about 26 s of CPU to optimality: near the default 60 s
    limit on a busy machine, where one run would stop at the limit and the other not, so it
    has room to end by optimality (the same plan is the claim, not the limit)."""
    options = None
    if case == "small":
        profile, hw, budget = small_tensors(), machine(pcie_latency=50), 2000
    else:
        profile, hw = synthetic["transformer"], load_hardware("a100-40gb-pcie4")
        budget = int(profile.peak_bytes * 0.5)
        options = RunOptions(seed=3, time_limit=600.0)   # make_plan takes the seed from options when given
    first = make_plan(profile, hw, budget, "deeptm", seed=3, options=options).plan
    second = make_plan(profile, hw, budget, "deeptm", seed=3, options=options).plan
    assert plan_json(first) == plan_json(second)
