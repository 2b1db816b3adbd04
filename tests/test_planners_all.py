"""Every registered planner on the shipped synthetic profiles at 90/70/50/30% of the peak:
each plan is valid, and within budget or honestly marked infeasible; plans are
deterministic. Plus the registry's own checks (floor, parameters)."""
from __future__ import annotations

import pytest

from planner.shared.facts import budget_floor
from planner.core.api import make_plan
from planner.core.registry import Param, RunOptions, get_planner, planners
from simulator.catalog import open_profile
from simulator.errors import InfeasibleError, InputError
from simulator.hardware import load_hardware
from simulator.plan import plan_json

PROFILES = ["synth-mlp-l16-w8192-b1024", "synth-cnn-l16-w128-b64-s224", "synth-transformer-l12-b16-s1024"]
# Real models (traced, and measured on an H100): every planner at its defaults.
REAL = ["gpt2-b48-s1024", "resnet50-b1024-s224", "vgg13-b512-h100-measured"]
FRACTIONS = [0.9, 0.7, 0.5, 0.3]
HW = load_hardware("a100-40gb-pcie4")


@pytest.fixture(scope="module")
def profiles():
    return {name: open_profile(name) for name in PROFILES + REAL}


# Every planner at its defaults, and the parameter settings that change what it does.
VARIANTS = [(spec.name, {}) for spec in planners()] + [
    ("vdnn", {"mode": "conv"}), ("vdnn", {"mode": "dyn"}), ("lms", {"autotune": "false"}),
    ("g10", {"ssd": "false"}), ("g10", {"fallback": "false"}), ("g10", {"recompute": "true"}),
    ("capuchin", {"recompute": "false"}), ("capuchin", {"swap": "false"}),
]


# Planners that search until a time limit (the MILPs, the GA): here on the synthetic
# profiles only, with a short limit; their own tests (tests/test_ilp.py,
# tests/test_swapadvisor.py, tests/test_checkmate.py, tests/test_modnn_deeptm.py) cover real profiles, solver
# status and determinism.
SEARCHING = {spec.name for spec in planners() if spec.searches}


def keeps_to_its_kind(spec, plan, profile) -> list[str]:
    """What a plan does that its planner's family and flags do not declare (its bound
    assumes them): recomputes, swaps, moved weights, ops on the CPU, codecs, variants,
    managed memory."""
    persistent = {t.id for t in profile.tensors if t.persistent}
    kinds = {a.kind for a in plan.actions}
    found = {
        "recompute": "recompute" in kinds,
        "swap": bool(kinds & {"offload", "prefetch", "load", "store"}),
        "persistent": bool(plan.initial) or any(a.tensor in persistent and a.kind in ("offload", "drop", "store")
                                                for a in plan.actions),
        "cpu": bool(plan.cpu_ops),
        "codecs": bool(kinds & {"encode", "decode"}) or any(a.codec for a in plan.actions),
        "variants": bool(plan.variants),
    }
    wrong = [what for what, done in found.items() if done and not spec.may(what, plan.planner.params)]
    if (plan.memory == "uvm") != (spec.memory == "uvm"):
        wrong.append(f"memory {plan.memory}")
    return wrong
QUICK = RunOptions(time_limit=3.0, threads=1)

# best runs a portfolio of the others up to its time limit: on one profile
CASES = [(name, planner, params) for name in PROFILES for planner, params in VARIANTS
         if planner != "best" or name == "synth-transformer-l12-b16-s1024"] + \
        [(name, spec.name, {}) for name in REAL for spec in planners() if spec.name not in SEARCHING]


def _quick(name, planner, params) -> bool:
    """Whether `make test` runs this case; `make test-slow` runs the others. Every variant
    of every planner that plans without a search runs on the three synthetic profiles and
    on the measured VGG13; the ones that search run on one synthetic profile each (in turn,
    so each profile sees some: a search stops at its time limit either way), and the
    others on one of GPT-2 and ResNet-50 each (in turn, so both models are planned)."""
    if name == "vgg13-b512-h100-measured" or (name in PROFILES and planner not in SEARCHING) or planner == "best":
        return True
    if name in PROFILES:
        return PROFILES[sorted(SEARCHING - {"best"}).index(planner) % len(PROFILES)] == name
    heuristic = [spec.name for spec in planners() if spec.name not in SEARCHING]
    return REAL[heuristic.index(planner) % 2] == name


@pytest.mark.parametrize("profile_name, planner, params", [
    pytest.param(*case, id=f"{case[0]}-{case[1]}{case[2] or ''}", marks=() if _quick(*case) else pytest.mark.slow)
    for case in CASES])
def test_plans_are_valid_and_within_budget_or_marked_infeasible(profiles, planner, params, profile_name):
    """Each plan valid, within budget or marked infeasible, in its family's kind, no faster
    than its bound. `make test` runs the cases ``_quick`` picks, `make test-slow` the rest."""
    profile = profiles[profile_name]
    spec = get_planner(planner)
    floor, _ = budget_floor(profile, spec.moves_persistent, spec.cpu_phases)
    for fraction in FRACTIONS:
        budget = min(int(profile.peak_bytes * fraction), HW.gpu.memory_bytes)
        if budget < floor:
            continue
        planned = make_plan(profile, HW, budget, planner, params, options=QUICK if planner in SEARCHING else None)
        result = planned.result
        assert result.valid, f"{planner} {profile_name} {fraction}: {result.rule} {result.reason}"
        if result.feasible:
            assert result.peak_bytes <= budget
            assert planned.plan.planner.status != "infeasible"
        else:
            assert planned.plan.planner.status == "infeasible"
        assert planned.plan.predicted["feasible"] == result.feasible
        assert not keeps_to_its_kind(spec, planned.plan, profile), (planner, spec.family)
        bound = planned.plan.planner.lower_bound_us
        if result.ok and bound is not None:     # no plan is faster than the bound of its own kind
            assert result.iteration_us >= bound * (1 - 1e-9), (planner, result.iteration_us, bound)


@pytest.mark.parametrize("planner", [spec.name for spec in planners() if spec.name not in SEARCHING])
def test_same_inputs_and_seed_give_byte_identical_plans(profiles, planner):
    profile = profiles["synth-transformer-l12-b16-s1024"]
    budget = int(profile.peak_bytes * 0.7)
    first = make_plan(profile, HW, budget, planner, seed=3).plan
    second = make_plan(profile, HW, budget, planner, seed=3).plan
    assert plan_json(first) == plan_json(second)


def test_budget_below_the_floor_names_it(profiles):
    profile = profiles["synth-mlp-l16-w8192-b1024"]
    floor, op = budget_floor(profile, moves_persistent=False)
    with pytest.raises(InfeasibleError, match=f"smallest budget planner 'none' can meet: {floor} bytes \\(op '{op}'"):
        make_plan(profile, HW, floor - 1, "none")


def test_floor_counts_persistent_tensors_only_for_planners_that_keep_them(two_layer):
    # two-layer: persistent 210 B. b2's working set: l 1 + a1 40 + w2 100 + g2 100 + da1 40 = 281
    # (281 - 100 = 181 without w2). Keeping weights: 210 + 181 = 391 at b2; moving them:
    # the largest working set of any op including weights, 281 at b2.
    assert budget_floor(two_layer, moves_persistent=False) == (391, "b2")
    assert budget_floor(two_layer, moves_persistent=True) == (281, "b2")


def test_unknown_planner_and_parameter_are_input_errors(two_layer):
    with pytest.raises(InputError, match="unknown planner 'magic'"):
        make_plan(two_layer, HW, 1000, "magic")
    with pytest.raises(InputError, match="planner 'none' has no parameter 'x'"):
        make_plan(two_layer, HW, 1000, "none", {"x": "1"})


@pytest.mark.parametrize("default, text, expected", [
    (1, "7", 7), (0.5, "0.25", 0.25), (True, "false", False), (True, "yes", True), ("all", "conv", "conv"),
])
def test_param_parsing_from_the_command_line(default, text, expected):
    assert Param("p", default, "help", ("all", "conv") if isinstance(default, str) else None).parse(text, "t") == expected


@pytest.mark.parametrize("default, text", [(1, "seven"), (1, "1.5"), (True, "maybe"), ("all", "some")])
def test_param_parsing_rejects(default, text):
    with pytest.raises(InputError):
        Param("p", default, "help", ("all", "conv") if isinstance(default, str) else None).parse(text, "t")
