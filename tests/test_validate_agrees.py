"""``swapplan validate PROFILE PLAN`` runs the static rules ``simulate`` runs (one function,
simulator.api.check_static): on a corpus of plans (the hand-made kinds of issue 33,
planners' plans, their mutations and benchmarks/fuzz_cli.py's mutations of the hostile
seed plan), validate passes iff simulate finds the plan valid, names the same rule and
reason when it does not, and fails on the same input error otherwise."""
from __future__ import annotations

import copy
import importlib.util
import json
import random
from pathlib import Path

import pytest

from planner.core.api import make_plan
from simulator.api import check_static
from simulator.hardware import load_hardware
from simulator.plan import plan_json
from simulator.profile import load_profile, save_profile
from tests.conftest import TWO_LAYER_OPS, TWO_LAYER_TENSORS, make_profile, run_cli_in as run
from tests.hostile import two_layer_plan

ROOT = Path(__file__).resolve().parents[1]
PLANNERS = ["lms", "capuchin", "modnn", "chen", "sentinel", "cdma", "layrub", "cachedarrays", "flashneuron",
            "zero-offload", "zero-infinity", "uvm", "deepum"]
MUTATIONS = 12        # per planner plan
FUZZED = 120          # fuzz_cli mutations of the two-layer seed plan


def _fuzz_cli():
    spec = importlib.util.spec_from_file_location("fuzz_cli", ROOT / "benchmarks" / "fuzz_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hand_made(profile: dict) -> dict[str, dict]:
    """The plans validate said ok to and simulate called INVALID (issue 33)."""
    head = {"format": "swapplan-plan/1", "profile": {"name": profile["name"]}}
    activation = next(t["id"] for t in profile["tensors"] if t["kind"] == "activation")
    weight = next(t["id"] for t in profile["tensors"] if t["kind"] == "weight")
    producer = next(o for o in profile["ops"] if activation in o["outputs"])
    reader = next(o for o in profile["ops"] if activation in o["inputs"] and o["id"] != producer["id"])
    ops = [o["id"] for o in profile["ops"]]
    return {
        "r20-initial-activation": {**head, "actions": [], "initial": {activation: "host"}},
        "reversed-schedule": {**head, "actions": [], "schedule": ops[::-1]},
        "prefetch-never-offloaded": {**head, "actions": [{"kind": "prefetch", "tensor": activation, "from": "host",
                                                          "after": producer["id"], "before": reader["id"]}]},
        "recompute-weight": {**head, "actions": [{"kind": "drop", "tensor": weight, "after": ops[1]},
                                                 {"kind": "recompute", "tensor": weight, "before": ops[-1]}]},
    }


def _mutations(plan: dict, profile: dict, rng: random.Random, count: int) -> list[dict]:
    """Plans near a planner's: an action moved, retargeted, re-kinded, dropped or doubled, an
    initial placement added, the actions reversed, two ops of the order swapped."""
    ops = [o["id"] for o in profile["ops"]]
    tensors = [t["id"] for t in profile["tensors"]]
    out = []
    for _ in range(count):
        doc = copy.deepcopy(plan)
        actions = doc["actions"]
        how = rng.randrange(8)
        if actions and how == 0:
            rng.choice(actions)[rng.choice(["after", "before"])] = rng.choice(ops + [None])
        elif actions and how == 1:
            rng.choice(actions)["tensor"] = rng.choice(tensors)
        elif actions and how == 2:
            action = rng.choice(actions)
            action["kind"] = rng.choice(["offload", "prefetch", "drop", "recompute"])
        elif actions and how == 3:
            actions.pop(rng.randrange(len(actions)))
        elif actions and how == 4:
            actions.append(copy.deepcopy(rng.choice(actions)))
        elif how == 5:
            doc["initial"] = {**doc.get("initial", {}), rng.choice(tensors): "host"}
        elif how == 6:
            actions.reverse()
        else:
            order = list(doc.get("schedule") or ops)
            i, j = rng.randrange(len(order)), rng.randrange(len(order))
            order[i], order[j] = order[j], order[i]
            doc["schedule"] = order
        out.append(doc)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(folder, profile file, [plan files]) for a small synth profile and the two-layer one."""
    folder = tmp_path_factory.mktemp("agree")
    assert run(folder, "synth", "mlp", "--layers", "6", "--width", "128", "--batch", "512",
               "-o", "m.json").exit_code == 0
    profile = load_profile(folder / "m.json")
    profile_doc = json.loads((folder / "m.json").read_text())
    hardware = load_hardware("a100-40gb-pcie4")
    rng = random.Random(33)
    plans: dict[str, dict] = dict(_hand_made(profile_doc))
    for name in PLANNERS:
        planned = make_plan(profile, hardware, int(profile.peak_bytes * 0.92), name)
        doc = json.loads(plan_json(planned.plan))
        plans[f"planner-{name}"] = doc
        for k, mutated in enumerate(_mutations(doc, profile_doc, rng, MUTATIONS)):
            plans[f"planner-{name}-mutated-{k}"] = mutated
    synth = []
    for name, doc in plans.items():
        (folder / f"{name}.json").write_text(json.dumps(doc))
        synth.append(f"{name}.json")

    save_profile(make_profile(TWO_LAYER_TENSORS, TWO_LAYER_OPS, "two-layer"), folder / "two.json")
    fuzz = _fuzz_cli()
    fuzzed = ["seed.json"]
    (folder / "seed.json").write_text(json.dumps(two_layer_plan()))
    for k in range(FUZZED):
        (folder / f"fuzz-{k}.json").write_text(json.dumps(fuzz._mutate(two_layer_plan(), rng)))
        fuzzed.append(f"fuzz-{k}.json")
    return folder, [("m.json", synth), ("two.json", fuzzed)]


def _verdicts(folder: Path, profile: str, plan: str):
    checked = run(folder, "validate", profile, plan)
    simulated = run(folder, "simulate", profile, plan, "--json")
    return checked, simulated


def test_validate_agrees_with_simulate(corpus):
    folder, groups = corpus
    seen = {"valid": 0, "invalid": 0, "input error": 0}
    rules = set()
    for profile, plans in groups:
        for plan in plans:
            checked, simulated = _verdicts(folder, profile, plan)
            where = f"{profile} {plan}: validate {checked.exit_code} {checked.output!r}, " \
                    f"simulate {simulated.exit_code} {simulated.output[-300:]!r}"
            assert checked.exit_code in (0, 1, 2) and simulated.exit_code in (0, 1, 2), where
            if simulated.exit_code == 2:
                assert checked.exit_code == 2 and checked.stderr == simulated.stderr, where
                seen["input error"] += 1
                continue
            result = json.loads(simulated.stdout)
            if result["valid"]:
                assert checked.exit_code == 0 and "valid on a100-40gb-pcie4" in checked.stdout, where
                seen["valid"] += 1
            else:
                assert checked.exit_code == 1, where
                line = checked.stdout.splitlines()[-1]
                assert line == f"INVALID: plan {plan} on a100-40gb-pcie4: {result['rule']}: {result['reason']}", where
                seen["invalid"] += 1
                rules.add(result["rule"])
    # the corpus covers every verdict, and many rules
    assert seen["valid"] >= len(PLANNERS) and seen["invalid"] >= 40 and seen["input error"] >= 20, seen
    assert {"R12", "R15", "R20", "R21"} <= rules, rules


@pytest.mark.parametrize("name, rule", [("r20-initial-activation", "R20"), ("reversed-schedule", "R21"),
                                        ("prefetch-never-offloaded", "R12"), ("recompute-weight", "R15")])
def test_the_plans_validate_passed_now_fail_with_their_rule(corpus, name, rule):
    folder, _ = corpus
    checked, simulated = _verdicts(folder, "m.json", f"{name}.json")
    assert simulated.exit_code == 1 and json.loads(simulated.stdout)["rule"] == rule
    assert checked.exit_code == 1 and f": {rule}: " in checked.stdout.splitlines()[-1]
    assert checked.stderr == ""


def test_validate_takes_hardware_as_simulate_does(corpus):
    folder, _ = corpus
    ok = run(folder, "validate", "m.json", "planner-lms.json", "--hardware", "h100-80gb-pcie5")
    assert ok.exit_code == 0 and "valid on h100-80gb-pcie5" in ok.stdout, ok.output
    big = json.loads((folder / "planner-lms.json").read_text())
    big["budget_bytes"] = 60 * 2**30      # more than an A100-40GB's memory
    (folder / "big.json").write_text(json.dumps(big))
    assert run(folder, "validate", "m.json", "big.json", "--hardware", "a100-80gb-pcie4").exit_code == 0
    for plan, hardware in (("planner-lms.json", "nosuch"), ("big.json", "a100-40gb-pcie4"), ("big.json", None)):
        more = ["--hardware", hardware] if hardware else []
        checked = run(folder, "validate", "m.json", plan, *more)
        simulated = run(folder, "simulate", "m.json", plan, *more)
        assert checked.exit_code == simulated.exit_code == 2 and checked.stderr == simulated.stderr
        assert len(checked.stderr.splitlines()) == 1
    assert run(folder, "validate", "m.json", "--hardware", "nosuch").exit_code == 2


def test_check_static_is_what_simulate_decides(corpus):
    folder, _ = corpus
    from simulator.api import Simulator
    from simulator.plan import load_plan
    profile = load_profile(folder / "m.json")
    simulator = Simulator(profile, load_hardware("a100-40gb-pcie4"))
    for name in ("r20-initial-activation", "planner-lms", "planner-deepum"):
        plan = load_plan(folder / f"{name}.json")
        broken = check_static(profile, plan, simulator.hardware, simulator=simulator)
        result = simulator.simulate(plan)
        assert (broken is None) == result.valid
        if broken is not None:
            assert (broken.rule, broken.reason) == (result.rule, result.reason)
