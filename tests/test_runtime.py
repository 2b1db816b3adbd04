"""The runtime (runtime/): plans followed in real training steps on the CPU.

Four small models (an MLP, one with dropout, a tiny ResNet with batch norm, a tiny GPT-2
with dropout and attention dropout) are traced with node identity, bound to their graph,
planned by every planner, and run node by node following each plan the simulator calls
feasible: loss, parameters, optimizer state, buffers and batch must be bit-equal to the
graph called whole, the "GPU" pool must stay within the budget, and every action must be
applied. Plus: the node identity in profiles, the refusal of a plan that breaks a rule,
RNG replay, and the ``train`` command.
"""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="the runtime needs torch (the 'trace' extra)")
transformers = pytest.importorskip("transformers", reason="the tiny GPT-2 needs transformers")

from click.testing import CliRunner  # noqa: E402

from cli import app  # noqa: E402
from planner.core.api import make_plan  # noqa: E402
from planner.core.registry import RunOptions, get_planner, planners  # noqa: E402
from runtime import PlannedInterpreter, PlanRefused, bind, initial_values, reference_step  # noqa: E402
from runtime.train import _differences  # noqa: E402
from simulator.errors import InputError  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402
from simulator.plan import Plan, offload, plan_json  # noqa: E402
from simulator.profile import (FX_REWRITES, INPUT_ROLES, order_violation, profile_bytes, profile_from_dict,  # noqa: E402
                               profile_sha256)
from tracer.pytorch.trace import trace  # noqa: E402

ME = "runtime.small_models"
HW = load_hardware("a100-40gb-pcie4")
# Budgets, as a share of each model's traced no-swap peak, where most planners find a
# plan that fits (all five REQUIRED ones on the two models with dropout).
BUDGET = {"mlp": 0.85, "mlp_dropout": 0.8, "tiny_resnet": 0.85, "tiny_gpt2": 0.8}
REQUIRED = ("capuchin", "g10", "lms", "chen", "vdnn")
ILP = ("autotm", "checkmate", "deeptm", "joint", "tmof")    # searching planners: on the MLPs only, 2 s each


# The small models (mlp, mlp_dropout, tiny_resnet, tiny_gpt2) are runtime/small_models.py's.
MODELS = ("mlp", "mlp_dropout", "tiny_resnet", "tiny_gpt2")


class Bound:
    """A model traced with node identity, bound, with its seeded values and the
    reference step (the graph called whole) run once."""

    def __init__(self, name: str):
        self.name = name
        self.spec = f"{ME}:{name}"
        self.profile = trace(self.spec, runtime=True)
        self.bindings = bind(self.spec, self.profile)
        self.values = initial_values(self.bindings, seed=0)
        self.reference = self.values.clone()
        torch.manual_seed(0)
        self.loss = reference_step(self.bindings, self.reference)

    def run(self, plan, replay_rng=True):
        interpreter = PlannedInterpreter(self.bindings, plan, HW)
        interpreter.replay_rng = replay_rng
        values = self.values.clone()
        torch.manual_seed(0)
        report = interpreter.run(values, 1)[0]
        return interpreter, report, _differences(self.bindings, self.reference, values, [self.loss], [report.loss])


_BOUND: dict[str, Bound] = {}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)    # the same kernels' splits in every run (see runtime/train.py)
    yield
    torch.set_num_threads(before)


def bound(name: str) -> Bound:
    if name not in _BOUND:
        _BOUND[name] = Bound(name)
    return _BOUND[name]


# ----------------------------------------------------------------------------- node identity


def test_runtime_profiles_carry_node_identity_and_round_trip():
    p = bound("tiny_gpt2").profile
    assert p.source["fx"] == 1 and "--runtime" in p.source["from"]
    assert all(op.fx is not None and len(op.fx.nodes) == len(op.fx.overloads) >= 1 for op in p.ops)
    assert all(t.fx is not None for t in p.tensors)
    rewrites = {op.fx.rewrite for op in p.ops}
    assert rewrites <= set(FX_REWRITES) | {None} and {"inplace_accumulate", "foreach_split"} <= rewrites
    for op in p.ops:
        if op.fx.rewrite == "inplace_accumulate":
            assert op.name == "aten::add_" and op.fx.overloads == ("aten::add.Tensor",)
        if op.fx.rewrite == "foreach_split":
            assert op.name == "optim::adamw_foreach" and op.fx.slot is not None and op.workspace_bytes > 0
    random = {o for op in p.ops if op.fx.random for o in op.fx.overloads}
    assert {"aten::native_dropout.default", "aten::_scaled_dot_product_efficient_attention.default"} <= random
    roles = {t.fx.role for t in p.tensors if t.persistent}
    assert roles == {"parameter", "optimizer_state", "batch", "target"} and roles <= set(INPUT_ROLES)
    assert all((t.fx.role is None) == (not t.persistent) for t in p.tensors)
    multi = [t for t in p.tensors if t.fx.output not in (None, 0)]
    assert multi, "multi-output ops (native_dropout, native_layer_norm) name their outputs"
    again = profile_from_dict(json.loads(profile_bytes(p)))
    assert again.sha256 == p.sha256 and again.ops == p.ops and again.tensors == p.tensors


def test_node_identity_is_opt_in_and_changes_nothing_else():
    plain = trace(f"{ME}:tiny_resnet")
    rich = bound("tiny_resnet").profile
    assert "fx" not in plain.source and all(op.fx is None for op in plain.ops)
    assert '"fx":' not in profile_bytes(plain).decode()
    strip = [(op.id, op.name, op.inputs, op.outputs, op.updates) for op in rich.ops]
    assert strip == [(op.id, op.name, op.inputs, op.outputs, op.updates) for op in plain.ops]
    assert [t.to_dict() for t in plain.tensors] == [{k: v for k, v in t.to_dict().items() if k != "fx"}
                                                   for t in rich.tensors]
    roles = {t.fx.role for t in rich.tensors if t.persistent}
    assert "buffer" in roles   # batch-norm running statistics


def test_profile_fx_fields_are_checked_on_load():
    data = json.loads(profile_bytes(bound("mlp").profile))
    data["ops"][0]["fx"]["overloads"] = []
    with pytest.raises(InputError, match="overloads"):
        profile_from_dict(data, "p.json")
    data = json.loads(profile_bytes(bound("mlp").profile))
    data["tensors"][0]["fx"]["role"] = "teacher"
    with pytest.raises(InputError, match="role"):
        profile_from_dict(data, "p.json")


@pytest.mark.parametrize("name", MODELS)
def test_unplanned_run_holds_the_traced_peak(name):
    """The interpreter with no plan: bit-equal to the graph called whole, and its "GPU"
    peak (live storages plus the optimizer's temporaries) is the profile's no-swap peak
    within 0.5%."""
    b = bound(name)
    interpreter, report, differences = b.run(None)
    assert not differences
    assert report.peak_bytes == pytest.approx(b.profile.peak_bytes, rel=0.005)
    assert not report.size_mismatches


def test_bind_checks_the_profile():
    b = bound("mlp")
    with pytest.raises(InputError, match="no node identity"):
        bind(b.spec, trace(b.spec))
    with pytest.raises(InputError, match="traced from"):
        bind(f"{ME}:mlp_dropout", b.profile)
    data = json.loads(profile_bytes(b.profile))
    data["ops"][0]["time_us"] += 1.0
    with pytest.raises(InputError, match="not this profile"):
        bind(b.spec, profile_from_dict(data))


# ----------------------------------------------------------------------------- plans


def _plan(b: Bound, planner: str, known_infeasible: bool = False):
    """The planner's plan, or None where ``known_infeasible`` and the simulator finds it so."""
    limit = 2.0 if planner in ILP or get_planner(planner).searches else None   # searches stop by then
    budget = int(b.profile.peak_bytes * BUDGET[b.name])
    try:
        planned = make_plan(b.profile, HW, budget, planner, {}, 0, RunOptions(seed=0, time_limit=limit, threads=1))
    except Exception as exc:   # a budget below what the planner can meet
        pytest.skip(f"{planner} does not plan {b.spec} at {BUDGET[b.name]:.0%}: {exc}")
    if not planned.result.ok:
        if known_infeasible:
            return None
        pytest.skip(f"the simulator finds {planner}'s plan for {b.spec} infeasible or invalid")
    assert not known_infeasible, f"{planner}'s plan for {b.spec} fits now: take it off INFEASIBLE"
    return planned.plan


CASES = [(m, s.name) for m in MODELS for s in planners()
         if s.name not in ILP or m in ("mlp", "mlp_dropout")]


# Plans the simulator finds infeasible at BUDGET (none never fits below the peak; recompute
# alone cannot fit the MLP, which checkmate's MILP proves within its 2 s): the test checks
# they still are and has nothing to run.
INFEASIBLE = {("mlp", "none"), ("mlp", "torch-budget"), ("mlp_dropout", "none"),
              ("tiny_resnet", "none"), ("tiny_resnet", "chen"), ("tiny_resnet", "torch-budget"),
              ("tiny_resnet", "flashneuron"), ("tiny_gpt2", "none")}


@pytest.mark.parametrize("name,planner", CASES)
def test_feasible_plans_run_bit_equal_within_budget(name, planner):
    """Each feasible plan runs bit-equal within its budget; the plans the runtime does not
    follow (ops on the CPU, codecs, managed memory) are refused, and that refusal is the check."""
    b = bound(name)
    plan = _plan(b, planner, (name, planner) in INFEASIBLE)
    if plan is None:
        return
    if plan.uses_cpu:   # not followed by the runtime
        with pytest.raises(InputError, match="cpu_ops"):
            PlannedInterpreter(b.bindings, plan, HW)
        return
    if plan.uses_codecs:   # not followed by the runtime yet
        with pytest.raises(InputError, match="codecs"):
            PlannedInterpreter(b.bindings, plan, HW)
        return
    if getattr(plan, "memory", "explicit") != "explicit":   # CUDA managed memory (UVM): not followed
        with pytest.raises(InputError, match="managed memory"):
            PlannedInterpreter(b.bindings, plan, HW)
        return
    interpreter, report, differences = b.run(plan)
    assert not differences, differences
    assert report.actions_applied == len(plan.actions)
    assert not report.size_mismatches
    # R15 counts the other outputs a recompute's re-run makes: the simulator's peak, to the byte
    assert report.peak_bytes == interpreter.result.peak_bytes <= interpreter.budget_bytes


def test_recomputing_one_output_of_a_multi_output_op_holds_the_others():
    """Recomputing a dropout mask runs native_dropout again, which makes the output too
    (4x the mask's bytes). R15 counts those bytes while the recompute runs: chen's plan
    for the MLP with dropout holds them for real, and the simulator's peak is the real one."""
    b = bound("mlp_dropout")
    plan = _plan(b, "chen")
    interpreter, report, differences = b.run(plan)
    assert not differences
    assert report.recompute_extra_bytes > 0
    assert report.peak_bytes == interpreter.result.peak_bytes <= interpreter.budget_bytes
    seq = interpreter.rplan.seq
    remade = [k for k, tid in enumerate(seq.recomputed) if tid is not None]
    assert max(seq.workspace[k] for k in remade) >= report.recompute_extra_bytes


@pytest.mark.parametrize("planner", REQUIRED)
def test_required_planners_are_followed_on_the_transformer(planner):
    """Each of these plans tiny GPT-2 at 80% (so that none of them is only ever skipped)."""
    b = bound("tiny_gpt2")
    plan = _plan(b, planner)
    interpreter, report, differences = b.run(plan)
    assert not differences
    assert report.peak_bytes == interpreter.result.peak_bytes <= interpreter.budget_bytes
    assert report.actions_applied == len(plan.actions) > 0


def test_a_reordered_schedule_is_followed():
    """SwapAdvisor reorders ops at half the peak: the runtime runs the plan's sequence."""
    b = bound("tiny_resnet")
    planned = make_plan(b.profile, HW, b.profile.peak_bytes // 2, "swapadvisor")
    plan = planned.plan
    assert planned.result.ok and plan.schedule is not None
    assert list(plan.schedule) != [op.id for op in b.profile.ops]
    interpreter, report, differences = b.run(plan)
    assert not differences and report.peak_bytes == interpreter.result.peak_bytes <= interpreter.budget_bytes


def test_a_schedule_that_reorders_random_ops_is_refused():
    b = bound("mlp_dropout")
    order = [op.id for op in b.profile.ops]
    i, j = [k for k, op in enumerate(b.profile.ops) if op.fx.random][:2]
    order[i], order[j] = order[j], order[i]
    plan = Plan(profile_name=b.profile.name, profile_sha256=profile_sha256(b.profile), schedule=tuple(order))
    with pytest.raises(InputError, match="reorders random ops"):
        PlannedInterpreter(b.bindings, plan, HW)


def test_several_steps_with_tensors_that_start_in_host_memory():
    """G10 keeps a weight in host memory between steps (``initial``): three steps, each
    bringing it in and putting it back, stay bit-equal to three reference steps."""
    b = bound("mlp_dropout")
    plan = _plan(b, "g10")
    assert plan.initial
    reference = b.values.clone()
    torch.manual_seed(0)
    losses = [reference_step(b.bindings, reference) for _ in range(3)]
    interpreter = PlannedInterpreter(b.bindings, plan, HW)
    values = b.values.clone()
    torch.manual_seed(0)
    reports = interpreter.run(values, 3)
    assert not _differences(b.bindings, reference, values, losses, [r.loss for r in reports])
    assert all(r.actions_applied == len(plan.actions) and r.peak_bytes <= interpreter.budget_bytes for r in reports)
    assert all(r.host_peak_bytes > 0 for r in reports)


def test_random_recomputes_replay_the_rng():
    """Chen's plan recomputes dropout outputs: bit-equal only because each recompute
    replays the RNG state its op first ran with."""
    b = bound("tiny_gpt2")
    plan = _plan(b, "chen")
    producers = {b.profile.ops[b.profile.producer[a.tensor]].fx for a in plan.actions if a.kind == "recompute"}
    assert any(fx.random for fx in producers)
    assert not b.run(plan)[2]
    assert b.run(plan, replay_rng=False)[2], "without replay the recomputed masks differ"


def test_a_plan_that_breaks_a_rule_is_refused_before_running():
    b = bound("mlp")
    later = next(t for t in b.profile.tensors if t.kind == "activation"
                 and len(b.profile.consumers[t.id]) > 1)
    first = b.profile.ops[b.profile.consumers[later.id][0]].id
    plan = Plan(profile_name=b.profile.name, profile_sha256=profile_sha256(b.profile),
                actions=(offload(later.id, first), offload(later.id, first)))
    before = b.values.clone()
    with pytest.raises(PlanRefused, match="invalid"):
        PlannedInterpreter(b.bindings, plan, HW)
    small = Plan(profile_name=b.profile.name, profile_sha256=profile_sha256(b.profile),
                 budget_bytes=b.profile.peak_bytes // 2)
    with pytest.raises(PlanRefused, match="infeasible"):
        PlannedInterpreter(b.bindings, small, HW)
    assert not _differences(b.bindings, before, b.values, [], [])


# ----------------------------------------------------------------------------- the command


def test_train_command_json(tmp_path):
    result = CliRunner().invoke(app, ["train", f"{ME}:mlp_dropout", "--planner", "capuchin", "--budget", "70%",
                                      "--steps", "2", "--json"], obj={})
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["bit_equal"] is True and report["differences"] == []
    assert report["peak_bytes"] <= report["budget_bytes"]
    assert report["actions_applied"] == report["actions_total"] > 0
    assert report["steps"] == 2 and len(report["loss"]) == 2
    assert set(report["seconds_per_step"]) == {"planned", "unplanned", "reference"}
    assert report["unplanned_peak_bytes"] == report["profile_peak_bytes"]
    for key in ("simulated_peak_bytes", "host_peak_bytes", "profile_sha256", "planner", "actions"):
        assert key in report


def test_train_command_with_a_plan_file_and_refusals(tmp_path):
    b = bound("mlp")
    planned = make_plan(b.profile, HW, int(b.profile.peak_bytes * BUDGET[b.name]), "lms")
    path = tmp_path / "plan.json"
    path.write_text(plan_json(planned.plan))
    ok = CliRunner().invoke(app, ["train", b.spec, "--plan", str(path)], obj={})
    assert ok.exit_code == 0, ok.output
    assert "bit-equal" in ok.stdout
    bad = Plan(profile_name=b.profile.name, profile_sha256=profile_sha256(b.profile),
               actions=(offload(b.profile.tensors[-1].id, b.profile.ops[-1].id),) * 2)
    path.write_text(plan_json(bad))
    refused = CliRunner().invoke(app, ["train", b.spec, "--plan", str(path)], obj={})
    assert refused.exit_code == 1 and "plan refused" in refused.stderr
    usage = CliRunner().invoke(app, ["train", b.spec], obj={})
    assert usage.exit_code == 2


def test_a_dropout_mask_made_before_the_tensor_it_is_shaped_like():
    """A dropout mask is empty_like(attention probabilities) filled by bernoulli_: the profile
    records no dependency on the probabilities (only their shape is read), so a schedule may
    make the mask first (swapadvisor did, on blocks at 60%). The runtime shapes it from the
    trace's metadata and the step stays bit-equal."""
    b = bound("blocks")
    ops = b.profile.ops
    k = next(k for k in range(1, len(ops)) if ops[k].name == "aten::bernoulli_" and not ops[k].inputs
             and ops[k - 1].name == "aten::_safe_softmax")
    order = [op.id for op in ops]
    order[k - 1], order[k] = order[k], order[k - 1]
    assert order_violation(b.profile, order) is None
    plan = Plan(profile_name=b.profile.name, profile_sha256=profile_sha256(b.profile), schedule=tuple(order))
    interpreter, report, differences = b.run(plan)
    assert not differences and report.peak_bytes == interpreter.result.peak_bytes
