"""The plan format: schema validation, round-trips, structural checks against a profile."""
from __future__ import annotations

import json

import pytest

from simulator.errors import InputError
from simulator.plan import (
    Action, Plan, PlannerInfo, check_plan, drop, empty_plan, load_plan, offload, plan_from_dict, plan_json,
    prefetch, recompute, save_plan,
)
from simulator.profile import profile_sha256


def _plan(profile, actions=(), **kw):
    return Plan(profile_name=profile.name, profile_sha256=profile_sha256(profile), actions=tuple(actions), **kw)


def _full(profile):
    return _plan(profile, [offload("a1", "f2"), prefetch("a1", "loss", "b2"),
                           drop("a2", "loss"), recompute("a2", "b2")],
                 hardware="a100-40gb-pcie4", budget_bytes=400,
                 planner=PlannerInfo("test", {"k": 1}, 0.5, "ok", 0.0, 7),
                 schedule=tuple(op.id for op in profile.ops), initial={"w1": "host"},
                 predicted={"iteration_us": 81.0, "overhead": 0.0, "peak_bytes": 400})


def test_round_trip(two_layer, tmp_path):
    plan = _full(two_layer)
    save_plan(plan, tmp_path / "p.json")
    again = load_plan(tmp_path / "p.json")
    assert again == plan
    check_plan(again, two_layer)


def test_saved_text_is_deterministic(two_layer):
    assert plan_json(_full(two_layer)) == plan_json(_full(two_layer))
    for plan in (_full(two_layer), empty_plan(two_layer)):   # the empty action list's text too
        assert json.loads(plan_json(plan)) == plan.to_dict()


def test_every_saved_plan_validates_against_schema(two_layer):
    import jsonschema

    from simulator.plan import schema_path
    validator = jsonschema.Draft202012Validator(json.loads(schema_path().read_text(encoding="utf-8")))
    for plan in (_full(two_layer), empty_plan(two_layer)):
        data = json.loads(plan_json(plan))
        assert [e.message for e in validator.iter_errors(data)] == []   # the whole document
        assert plan_from_dict(data) == plan


def _schema_error(data) -> str:
    with pytest.raises(InputError) as info:
        plan_from_dict(data, "p.json")
    return str(info.value)


def _base():
    return {"format": "swapplan-plan/1", "profile": {"name": "two-layer"}, "actions": []}


@pytest.mark.parametrize("patch, expected", [
    (lambda d: d.update(format="swapplan-plan/0"), "p.json: format: "),
    (lambda d: d.pop("actions"), "p.json: top level: 'actions' is missing (required)"),
    (lambda d: d.update(budget_bytes=-1), "p.json: budget_bytes: -1 is less than the minimum of 0"),
    (lambda d: d.update(budget_bytes="8GiB"), "p.json: budget_bytes: "),
    (lambda d: d.update(initial={"w1": "gpu"}), "p.json: initial.w1: \"gpu\" is not one of host, ssd"),
    (lambda d: d["profile"].update(sha256="abc"), "p.json: profile.sha256: "),
    (lambda d: d.update(actions=[{"kind": "offload", "tensor": "a1", "to": "disk", "after": "f1"}]),
     "p.json: actions[0].to: \"disk\" is not one of host, ssd"),
    (lambda d: d.update(actions=[{"kind": "prefetch", "tensor": "a1", "from": "host", "after": "f1"}]),
     "p.json: actions[0]: 'before' is missing (required)"),
    (lambda d: d.update(actions=[{"kind": "swap", "tensor": "a1"}]), "p.json: actions[0].kind: "),
    (lambda d: d.update(actions=[{"kind": "drop", "tensor": "a1", "after": None}]), "p.json: actions[0].after: "),
    (lambda d: d.update(actions=[{"kind": "recompute", "tensor": "a1", "before": "b2", "after": "f1"}]),
     "p.json: actions[0]: unknown field"),
    (lambda d: d.update(schedule="f1"), "p.json: schedule: "),
    (lambda d: d.update(extra=1), "p.json: top level: unknown field"),
])
def test_schema_errors_name_the_field(patch, expected):
    data = _base()
    patch(data)
    assert _schema_error(data).startswith(expected)


def _check_error(plan, profile) -> str:
    with pytest.raises(InputError) as info:
        check_plan(plan, profile)
    return str(info.value)


def test_check_sha_mismatch(two_layer):
    plan = _plan(two_layer)
    plan.profile_sha256 = "0" * 64
    assert "profile.sha256: plan was made for another profile" in _check_error(plan, two_layer)


def test_check_sha_optional(two_layer):
    plan = _plan(two_layer, [offload("a1", "f2")])
    plan.profile_sha256 = None
    check_plan(plan, two_layer)


def test_check_unknown_tensor(two_layer):
    assert "actions[0] (offload ghost).tensor: unknown tensor 'ghost'" in _check_error(
        _plan(two_layer, [offload("ghost", "f1")]), two_layer)


def test_check_unknown_op(two_layer):
    assert "actions[1] (prefetch a1).before: unknown op 'zz'" in _check_error(
        _plan(two_layer, [offload("a1", "f1"), prefetch("a1", "f2", "zz")]), two_layer)


def test_check_prefetch_of_initial_placement_is_fine(two_layer):
    check_plan(_plan(two_layer, [prefetch("w1", None, "f1", "ssd"), offload("w1", "u1", "ssd")],
                     initial={"w1": "ssd"}), two_layer)


@pytest.mark.parametrize("action, where, words", [
    (Action("swap", "a1", after="f1"), "actions[0] (swap a1).kind", "unknown action kind 'swap'"),
    (Action("offload", "a1", to="disk", after="f1"), "actions[0] (offload a1).to", "not 'disk'"),
    (Action("prefetch", "a1", after="f1", before="b1"), "actions[0] (prefetch a1).from", "not None"),
    (Action("drop", "a1"), "actions[0] (drop a1).after", "needs the op after which"),
    (Action("recompute", "a1"), "actions[0] (recompute a1).before", "needs the op it runs before"),
])
def test_check_fields_of_plans_built_in_memory(two_layer, action, where, words):
    """Plans from files meet the schema; plans that planners build in memory are held
    to the same fields by check_plan."""
    message = _check_error(_plan(two_layer, [action]), two_layer)
    assert f"{where}: " in message and words in message


def test_check_initial_tier(two_layer):
    assert "initial.w1: must be one of host, ssd, not 'gpu'" in _check_error(
        _plan(two_layer, initial={"w1": "gpu"}), two_layer)


def test_check_initial_unknown(two_layer):
    assert "initial.zz: unknown tensor 'zz'" in _check_error(_plan(two_layer, initial={"zz": "host"}), two_layer)


def test_check_schedule_incomplete(two_layer):
    assert "schedule: op 'f2' is missing" in _check_error(_plan(two_layer, schedule=("f1",)), two_layer)


@pytest.mark.parametrize("actions, initial, schedule, rule, tensor, words", [
    ([prefetch("a1", "f2", "b2")], {}, None, "R12", "a1", "it is already resident"),
    ([offload("a1", "f1", "host"), prefetch("a1", "f2", "b2", "ssd")], {}, None, "R12", "a1", "no valid copy there"),
    ([recompute("w1", "f1")], {}, None, "R15", "w1", "recompute of persistent tensor 'w1'"),
    ([], {"a1": "host"}, None, "R20", "a1", "only persistent tensors can start off the GPU"),
    ([], {}, ("f2", "f1", "loss", "b2", "b1", "u2", "u1"), "R21", "a1", "op 'f2' runs before op 'f1'"),
])
def test_rule_breaks_pass_check_plan_and_are_results(two_layer, actions, initial, schedule, rule, tensor, words):
    """v2: a plan that breaks a simulation rule is an invalid result, not an input error."""
    from tests.engine_helpers import both_paths, machine
    pl = _plan(two_layer, actions, initial=initial, schedule=schedule)
    check_plan(pl, two_layer)
    result = both_paths(two_layer, pl, machine())
    assert (result.valid, result.rule, result.tensor) == (False, rule, tensor)
    assert words in result.reason


def test_check_ssd_on_a_machine_without_one(two_layer):
    pl = _plan(two_layer, [prefetch("w1", None, "f1", "ssd"), offload("w1", "u1", "ssd")], initial={"w1": "ssd"})
    with pytest.raises(InputError, match=r"initial.w1: the hardware has no SSD"):
        check_plan(pl, two_layer, has_ssd=False)
