"""Invariants of the simulator over random training-like graphs and random valid plans."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import fastpath
from simulator.engine import simulate
from simulator.errors import InputError
from simulator.plan import Action, Plan, drop, recompute
from simulator.profile import order_violation
from tests.conftest import make_profile
from tests.engine_helpers import machine
from tests.plans import idle_gaps, swap_plan

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MACHINES = [machine(), machine(duplex="half", pcie_latency=3, ssd_latency=7),
            machine(ssd_path="direct", pcie_latency=1, h2d=0.002, ssd_read=0.003),
            machine(h2d=0.05, d2h=0.05, ssd_read=0.02, ssd_write=0.02)]  # copies faster than ops


@st.composite
def profiles(draw):
    """A random DAG in topological order: persistent weights, ops reading earlier
    tensors, some in-place updates of weights, workspaces."""
    n_weights = draw(st.integers(0, 3))
    tensors = {f"w{i}": (draw(st.integers(1, 50)), "weight") for i in range(n_weights)}
    ops = []
    produced: list[str] = []
    for k in range(draw(st.integers(1, 14))):
        pool = produced + [w for w in tensors if tensors[w][1] == "weight"]
        inputs = sorted(set(draw(st.lists(st.sampled_from(pool), max_size=4)))) if pool else []
        outputs = []
        for j in range(draw(st.integers(0 if inputs else 1, 2))):
            tid = f"t{k}_{j}"
            tensors[tid] = (draw(st.integers(0, 120)), draw(st.sampled_from(["activation", "gradient", "other"])))
            outputs.append(tid)
            produced.append(tid)
        weights = [w for w in tensors if tensors[w][1] == "weight"]
        updates = [draw(st.sampled_from(weights))] if weights and draw(st.booleans()) and not outputs else []
        updates = [u for u in updates if u not in inputs]
        ops.append((f"o{k}", draw(st.sampled_from(["forward", "backward", "optimizer"])),
                    float(draw(st.integers(0, 30))), inputs, outputs, updates, draw(st.integers(0, 40))))
    return make_profile(tensors, ops, "random")


def recomputable(profile, tid):
    producer = profile.ops[profile.producer[tid]]
    inputs_persistent = all(profile.tensor_by_id[i].persistent for i in producer.inputs)
    return not producer.updates and not profile.updaters[tid] and inputs_persistent


@st.composite
def scenarios(draw):
    """(profile, plan, machine, budget): swaps across idle gaps, to host or SSD, some
    replaced by drop + recompute."""
    profile = draw(profiles())
    candidates = [t.id for t in profile.tensors if not t.persistent and idle_gaps(profile, t.id)]
    chosen = draw(st.lists(st.sampled_from(candidates), unique=True)) if candidates else []
    recomputed = [t for t in chosen if recomputable(profile, t) and draw(st.booleans())]
    swapped = [t for t in chosen if t not in recomputed]
    plan = swap_plan(profile, swapped, lead=draw(st.integers(0, 3)), tier=draw(st.sampled_from(["host", "ssd"])),
                     early=draw(st.sampled_from([0, 1, 2, 3, 3])))
    extra = []
    for tid in recomputed:
        a, b = max(idle_gaps(profile, tid), key=lambda g: g[1] - g[0])
        extra += [drop(tid, profile.ops[a].id), recompute(tid, profile.ops[b].id)]
    plan = Plan(plan.profile_name, plan.actions + tuple(extra), profile_sha256=plan.profile_sha256)
    peak = max(profile.peak_bytes, profile.persistent_bytes)
    budget = draw(st.one_of(st.integers(peak, peak + 200), st.integers(profile.persistent_bytes, peak)))
    return profile, plan, draw(st.sampled_from(MACHINES)), budget


@SETTINGS
@given(scenarios())
def test_random_valid_plans_are_valid(scenario):
    profile, plan, hw, budget = scenario
    assert simulate(profile, plan, hw, budget).valid


@SETTINGS
@given(scenarios())
def test_memory_never_exceeds_the_budget(scenario):
    profile, plan, hw, budget = scenario
    result = simulate(profile, plan, hw, budget, record=True)
    assert result.peak_bytes <= budget
    assert all(0 <= nbytes <= budget for _, nbytes in result.timeline.memory)


@SETTINGS
@given(scenarios())
def test_iteration_is_never_shorter_than_ideal(scenario):
    profile, plan, hw, budget = scenario
    result = simulate(profile, plan, hw, budget)
    if result.ok:
        assert result.iteration_us >= result.ideal_us
        assert result.iteration_us >= result.compute_us + result.stall_us - 1e-9
        assert abs(result.iteration_us - (result.compute_us + result.stall_us + result.tail_us)) < 1e-6


@SETTINGS
@given(profiles(), st.sampled_from(MACHINES), st.integers(0, 100))
def test_empty_plan_above_peak_runs_exactly_at_ideal(profile, hw, slack):
    result = simulate(profile, Plan(profile.name), hw, profile.peak_bytes + slack)
    assert result.ok
    assert result.iteration_us == result.ideal_us
    assert result.peak_bytes == profile.peak_bytes and result.stall_us == 0.0


@SETTINGS
@given(st.data())
def test_adding_an_offload_never_lowers_bytes_moved(data):
    profile = data.draw(profiles())
    candidates = [t.id for t in profile.tensors if not t.persistent and idle_gaps(profile, t.id)]
    if not candidates:
        return
    chosen = data.draw(st.lists(st.sampled_from(candidates), unique=True, min_size=1))
    hw = data.draw(st.sampled_from(MACHINES))
    big = 10**9

    def moved(tensors):
        r = simulate(profile, swap_plan(profile, tensors), hw, big)
        assert r.ok
        return r.bytes_h2d + r.bytes_d2h + r.bytes_ssd_read + r.bytes_ssd_write

    assert moved(chosen) >= moved(chosen[:-1])


@SETTINGS
@given(scenarios())
def test_replay_gives_the_same_result(scenario):
    profile, plan, hw, budget = scenario
    first = simulate(profile, plan, hw, budget, record=True)
    second = simulate(profile, plan, hw, budget, record=True)
    assert first.to_dict() == second.to_dict()
    assert first.timeline == second.timeline


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_path_agrees_with_the_reference(scenario):
    """The C simulator alone (compile and run, no fallback): a result equal to the
    reference's when the reference succeeds, and 'not ok' (None) exactly when it does not."""
    profile, plan, hw, budget = scenario
    reference = simulate(profile, plan, hw, budget, reference=True)
    if not fastpath.available():
        return
    fast = fastpath.simulate_fast(profile, plan, hw, budget)
    if reference.ok:
        assert fast is not None and fast.to_dict() == reference.to_dict()
    else:
        assert fast is None


def test_fast_path_is_built_where_a_compiler_is():
    import shutil

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the C fast path is optional and the reference is used")
    assert fastpath.available()


@st.composite
def arbitrary_plans(draw):
    """Any structurally well-formed plan over a random profile: actions of random kinds on
    random tensors and ops, most of them breaking some rule."""
    profile = draw(profiles())
    tensor_ids = [t.id for t in profile.tensors]
    op_ids = [op.id for op in profile.ops]
    persistent = [t.id for t in profile.tensors if t.persistent]
    actions = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["offload", "prefetch", "drop", "recompute"]))
        tid = draw(st.sampled_from(tensor_ids)) if tensor_ids else None
        if tid is None:
            break
        after = draw(st.sampled_from(op_ids))
        before = draw(st.sampled_from(op_ids))
        tier = draw(st.sampled_from(["host", "ssd"]))
        if kind == "offload":
            actions.append(Action("offload", tid, to=tier, after=draw(st.sampled_from([after, None]))))
        elif kind == "prefetch":
            actions.append(Action("prefetch", tid, source=tier, after=draw(st.sampled_from([after, None])),
                                  before=draw(st.sampled_from([before, None]))))
        elif kind == "drop":
            actions.append(drop(tid, after))
        else:
            actions.append(recompute(tid, before))
    initial = {tid: draw(st.sampled_from(["host", "ssd"]))
               for tid in draw(st.lists(st.sampled_from(persistent), unique=True, max_size=2))} if persistent else {}
    schedule = None
    if draw(st.booleans()):  # a reordered schedule: random swaps of neighbours that keep it valid
        order = [op.id for op in profile.ops]
        for i in draw(st.lists(st.integers(0, max(len(order) - 2, 0)), max_size=10)):
            swapped = order[:i] + order[i:i + 2][::-1] + order[i + 2:]
            if order_violation(profile, swapped) is None:
                order = swapped
        schedule = tuple(order)
    return profile, Plan(profile.name, tuple(actions), initial=initial, schedule=schedule)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arbitrary_plans(), st.sampled_from(MACHINES), st.integers(0, 400))
def test_any_plan_gives_a_result_or_an_input_error(scenario, hw, budget):
    """Broken plans are reported (invalid with a rule, or an InputError for structure),
    never a crash; both loops agree on them."""
    profile, plan = scenario
    try:
        reference = simulate(profile, plan, hw, budget, reference=True)
    except InputError:
        return
    fast = simulate(profile, plan, hw, budget)
    assert fast.to_dict() == reference.to_dict()
    if fastpath.available():  # the C simulator alone: None exactly when the plan fails
        alone = fastpath.simulate_fast(profile, plan, hw, budget)
        assert (alone is None) if not reference.ok else (alone.to_dict() == reference.to_dict())
    if not reference.valid:
        assert reference.rule and reference.reason
    elif not reference.feasible:
        assert reference.rule in ("R10", "R19") and reference.reason
