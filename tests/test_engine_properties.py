"""Invariants of the simulator over random training-like graphs and random plans, and
the differential test: every case runs on the Python reference and the C path alone
(tests/engine_helpers.py: both_paths), which must agree on valid, infeasible and invalid
plans alike, so that every property asserted on the reference holds for C too."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.errors import InputError
from simulator.fast import explicit as fastpath
from simulator.model.recompute import recompute_problem
from simulator.plan import Action, Plan, drop, offload, prefetch, recompute
from simulator.profile import order_violation
from tests.conftest import make_profile
from tests.engine_helpers import both_paths, machine
from tests.plans import idle_gaps, swap_plan


def simulate(profile, plan, hw, budget, record=False):
    return both_paths(profile, plan, hw, budget, record)


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MACHINES = [machine(), machine(duplex="half", pcie_latency=3, ssd_latency=7),
            machine(ssd_path="direct", pcie_latency=1, h2d=0.002, ssd_read=0.003),
            machine(h2d=0.05, d2h=0.05, ssd_read=0.02, ssd_write=0.02)]  # copies faster than ops


@st.composite
def profiles(draw, huge=False):
    """A random DAG in topological order: persistent weights, ops reading earlier
    tensors, some in-place updates of weights, workspaces. ``huge``: sizes near 2^53."""
    n_weights = draw(st.integers(0, 3))
    size = st.integers(2**52, 2**53 - 1) if huge else st.integers(0, 120)
    tensors = {f"w{i}": (draw(st.integers(1, 50)), "weight") for i in range(n_weights)}
    ops = []
    produced: list[str] = []
    for k in range(draw(st.integers(1, 14))):
        pool = produced + [w for w in tensors if tensors[w][1] == "weight"]
        inputs = sorted(set(draw(st.lists(st.sampled_from(pool), max_size=4)))) if pool else []
        outputs = []
        for j in range(draw(st.integers(0 if inputs else 1, 2))):
            tid = f"t{k}_{j}"
            tensors[tid] = (draw(size), draw(st.sampled_from(["activation", "gradient", "other"])))
            outputs.append(tid)
            produced.append(tid)
        weights = [w for w in tensors if tensors[w][1] == "weight"]
        updates = [draw(st.sampled_from(weights))] if weights and draw(st.booleans()) and not outputs else []
        updates = [u for u in updates if u not in inputs]
        ops.append((f"o{k}", draw(st.sampled_from(["forward", "backward", "optimizer"])),
                    float(draw(st.integers(0, 30))), inputs, outputs, updates, draw(st.integers(0, 40))))
    return make_profile(tensors, ops, "random")


def widest_gap(profile, tid):
    return max(idle_gaps(profile, tid), key=lambda g: g[1] - g[0])


def recomputable(profile, tid):
    """Its producer reads only weights (resident) and R15 lets it be recomputed at the
    end of its widest idle gap (no weight the producer read updated since)."""
    producer = profile.ops[profile.producer[tid]]
    inputs_persistent = all(profile.tensor_by_id[i].persistent for i in producer.inputs)
    return inputs_persistent and recompute_problem(profile, tid, widest_gap(profile, tid)[1]) is None


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
        a, b = widest_gap(profile, tid)
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
    """On both paths: C reports the same peak as the reference (both_paths)."""
    profile, plan, hw, budget = scenario
    result = simulate(profile, plan, hw, budget, record=True)
    assert result.peak_bytes <= budget
    assert all(0 <= nbytes <= budget for _, nbytes in result.timeline.memory)
    assert max(nbytes for _, nbytes in result.timeline.memory) <= result.peak_bytes


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
@given(scenarios())
def test_bytes_on_each_link_are_the_bytes_the_plan_moves(scenario):
    """A run that completes moves each transfer's bytes once over every link it crosses
    (R17, R18): host copies over one PCIe direction, SSD copies over it and the SSD."""
    profile, plan, hw, budget = scenario
    result = simulate(profile, plan, hw, budget)
    if not result.ok:
        return
    size = profile.tensor_by_id
    want = {"pcie_down": 0, "pcie_up": 0, "ssd_read_link": 0, "ssd_write_link": 0}
    for a in plan.actions:
        if a.kind == "offload":
            want["pcie_up"] += size[a.tensor].bytes
            want["ssd_write_link"] += size[a.tensor].bytes if a.to == "ssd" else 0
        elif a.kind == "prefetch":
            want["pcie_down"] += size[a.tensor].bytes
            want["ssd_read_link"] += size[a.tensor].bytes if a.source == "ssd" else 0
    assert result.link_bytes == want
    assert (result.bytes_h2d, result.bytes_d2h) == (want["pcie_down"], want["pcie_up"])
    assert all(0.0 <= u <= 1.0 + 1e-9 for u in result.link_utilisation.values())


@SETTINGS
@given(scenarios())
def test_replay_gives_the_same_result(scenario):
    profile, plan, hw, budget = scenario
    first = simulate(profile, plan, hw, budget, record=True)
    second = simulate(profile, plan, hw, budget, record=True)
    assert first.to_dict() == second.to_dict()
    assert first.timeline == second.timeline


def test_fast_path_is_built_where_a_compiler_is():
    import shutil

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the C fast path is optional and the reference is used")
    assert fastpath.available()


@st.composite
def arbitrary_plans(draw, huge=False):
    """Any structurally well-formed plan over a random profile: actions of random kinds on
    random tensors and ops (offloads never brought back, drops after windows), random
    initial placements and reordered schedules; many break some rule."""
    profile = draw(profiles(huge))
    tensor_ids = [t.id for t in profile.tensors]
    op_ids = [op.id for op in profile.ops]
    persistent = [t.id for t in profile.tensors if t.persistent]
    actions = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["offload", "prefetch", "drop", "recompute", "swap"]))
        tid = draw(st.sampled_from(tensor_ids)) if tensor_ids else None
        if tid is None:
            break
        after = draw(st.sampled_from(op_ids))
        before = draw(st.sampled_from(op_ids))
        tier = draw(st.sampled_from(["host", "ssd"]))
        if kind == "swap":   # an offload, sometimes brought back, sometimes dropped after the window
            actions.append(offload(tid, after, tier))
            shape = draw(st.sampled_from(["never back", "back", "back then drop"]))
            if shape != "never back":
                actions.append(prefetch(tid, after, before, tier))
            if shape == "back then drop":
                actions.append(drop(tid, draw(st.sampled_from(op_ids))))
        elif kind == "offload":
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
    if draw(st.booleans()):  # a reordered schedule: random swaps of neighbours, most kept valid
        order = [op.id for op in profile.ops]
        keep_valid = draw(st.booleans())
        for i in draw(st.lists(st.integers(0, max(len(order) - 2, 0)), max_size=10)):
            swapped = order[:i] + order[i:i + 2][::-1] + order[i + 2:]
            if not keep_valid or order_violation(profile, swapped) is None:
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
        reference = simulate(profile, plan, hw, budget)
    except InputError:
        return
    if not reference.valid:
        assert reference.rule and reference.reason
    elif not reference.feasible:
        assert reference.rule in ("R10", "R19") and reference.reason


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arbitrary_plans(huge=True), st.sampled_from(MACHINES))
def test_sizes_near_2_to_the_53_never_wrap(scenario, hw):
    """R23: tensors just under 2^53 bytes, sums far past 2^63 ps and bytes: both paths agree."""
    from dataclasses import replace
    profile, plan = scenario
    big = replace(hw, gpu=replace(hw.gpu, memory_bytes=2**53 - 1),
                  host=replace(hw.host, memory_bytes=2**53 - 1))
    try:
        result = simulate(profile, plan, big, 2**53 - 1)
    except InputError:
        return
    assert result.valid or result.rule


def test_many_prefetches_and_recomputes_before_one_op():
    """Thousands of prefetches and recomputes wait on one op (the old C path counted the
    waits of each item in 32 bits and wrote past its buffer)."""
    n = 3000
    tensors = {f"w{i}": (1, "weight") for i in range(n)}
    tensors.update({f"r{i}": (1, "activation") for i in range(n)})
    ops = [(f"m{i}", "forward", 0.0, [], [f"r{i}"]) for i in range(n)]
    ops.append(("use", "forward", 1.0, [f"w{i}" for i in range(n)] + [f"r{i}" for i in range(n)], []))
    profile = make_profile(tensors, ops, "many")
    actions = [prefetch(f"w{i}", None, "use") for i in range(n)]
    actions += [drop(f"r{i}", f"m{i}") for i in range(n)] + [recompute(f"r{i}", "use") for i in range(n)]
    actions += [drop(f"w{i}", "use") for i in range(n)]
    plan = Plan(profile.name, tuple(actions), initial={f"w{i}": "host" for i in range(n)})
    hw = machine(h2d=1.0)
    result = simulate(profile, plan, hw, 10**6)
    assert result.ok, result.reason
    # the prefetches run one after another at 1 GB/s (1,000 ps a byte); the recomputes take no time
    assert result.iteration_us == (n * 1000 + 1_000_000) / 10**6
    assert result.recomputes == n and result.bytes_h2d == n
