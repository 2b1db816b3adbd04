"""The executor follows a plan's placement (R50): every block at its planned offset,
mapped into the scaled region (executor/arena.py ``PlacedArena``), never moved; an
allocation whose range is held waits, and one that would wait forever fails the replay
naming the allocation and its holder. Plans without a placement keep first fit.

Replays here are short (an explicit time scale, a fraction of a second each).
"""
from __future__ import annotations

import dataclasses
import random
from fractions import Fraction

import pytest

from executor.api import replay
from executor.arena import ALIGN, PlacedArena, align
from executor.host import HostBackend
from executor.program import lower
from executor.work import scaled_bytes
from planner.core.api import make_plan
from planner.shared.placement import place
from planner.core.registry import RunOptions
from simulator.api import Simulator, simulate
from simulator.compile.lower import compile_program
from simulator.hardware import load_hardware
from simulator.model.allocation import allocation_keys
from simulator.plan import Placement, Plan, drop, offload, prefetch, recompute
from simulator.profile import profile_sha256
from tests.conftest import make_profile
from tracer.synthetic import synthesize

HW = load_hardware("a100-40gb-pcie4")
MB = 1_000_000


def quick(profile, plan, budget=None, wall_s=0.3, **kw):
    predicted = simulate(profile, plan, HW, budget)
    base = predicted.iteration_us if predicted.ok else profile.ideal_us
    return replay(profile, plan, HW, budget, time_scale=wall_s * 1e6 / base, **kw)


def F(x: int, placement: Placement, size_scale: float) -> int:
    """The mapping into the scaled region, written out independently of PlacedArena."""
    s = Fraction(size_scale)
    rank = len({o for o in placement.offsets.values() if o < x})
    return align(-(-x * s.numerator // s.denominator)) + ALIGN * rank


def toy():
    """x -> f1 -> a -> f2 -> b, z (0 bytes; f2 has a 4,096-byte workspace) -> f3 -> c;
    f4 reads a, c, z and w; u updates w from d."""
    tensors = {"x": (MB, "input"), "w": (MB, "weight"), "a": (MB, "activation"), "b": (MB, "activation"),
               "z": (0, "activation"), "c": (MB, "activation"), "d": (MB, "activation")}
    ops = [("f1", "forward", 100.0, ["x", "w"], ["a"]),
           ("f2", "forward", 100.0, ["a"], ["b", "z"], None, 4096),
           ("f3", "forward", 100.0, ["b"], ["c"]),
           ("f4", "backward", 100.0, ["a", "c", "z", "w"], ["d"]),
           ("u", "optimizer", 50.0, ["d"], [], ["w"])]
    return make_profile(tensors, ops, "toy")


def toy_plan(profile, *actions, placement=None):
    return Plan(profile.name, tuple(actions), profile_sha256=profile_sha256(profile), placement=placement)


def swapping_plan(profile):
    """a swapped out after f2 and back before f4: a#1 (produced by f1), a#2 (prefetched)."""
    return toy_plan(profile, offload("a", "f2"), prefetch("a", "f3", "f4"))


def placed_toy(**overrides):
    """The toy, its swapping plan placed by greedy-size, with some offsets overridden."""
    profile = toy()
    plan, _ = place(profile, swapping_plan(profile), HW, None, "greedy-size")
    if overrides:
        offsets = dict(plan.placement.offsets, **overrides)
        plan = dataclasses.replace(plan, placement=Placement(plan.placement.arena_bytes, offsets))
    return profile, plan


def recording(monkeypatch):
    """Record (tensor or 'ws:op', region offset) of every block an item writes."""
    seen = []
    run_item = HostBackend.run_item

    def record(self, work):
        seen.extend((block.tensor, block.offset) for block in work.writes)
        if work.workspace is not None:
            seen.append((f"ws:{work.op}", work.workspace.offset))
        return run_item(self, work)

    monkeypatch.setattr(HostBackend, "run_item", record)
    return seen


# ----------------------------------------------------------------------------- following a placement


def test_a_placed_plan_replays_with_every_block_at_its_planned_offset(monkeypatch):
    profile, plan = placed_toy()
    placement = plan.placement
    assert {"a#1", "a#2", "ws:f2", "z#1", "w#1", "x#1"} <= set(placement.offsets)
    assert simulate(profile, plan, HW).ok
    seen = recording(monkeypatch)
    report = quick(profile, plan)
    assert report["ok"], report["integrity"]
    assert report["placement"] is True
    s = report["size_scale"]
    # the report: the placement's arena, and the region it maps to (one word per zero-byte key)
    assert report["arena_bytes"] == placement.arena_bytes == report["predicted_arena_bytes"]
    assert report["region_bytes"] == F(placement.arena_bytes, placement, s) + ALIGN * 1
    assert report["compactions"] == 0 and report["hole_waits"] == 0 and report["range_waits"] == 0
    assert report["peak_extent_bytes"] <= report["arena_bytes"]
    assert report["fragmentation"] == pytest.approx(report["predicted_fragmentation"])
    assert report["link_bytes"] == report["predicted_link_bytes"]
    # blocks at the planned offsets, mapped by F
    where = dict(seen)
    for tensor in ("b", "c", "d"):
        assert where[tensor] == F(placement.offsets[f"{tensor}#1"], placement, s)
    assert where["ws:f2"] == F(placement.offsets["ws:f2"], placement, s)
    assert where["z"] == F(placement.arena_bytes, placement, s)        # its own word past the mapped arena
    assert where["a"] == F(placement.offsets["a#1"], placement, s)     # produced; a#2 is the prefetch's
    assert where["w"] == F(placement.offsets["w#1"], placement, s)     # written by u at its start offset


def test_keys_are_counted_as_the_simulator_counts_them():
    profile = toy()
    plan = toy_plan(profile, offload("a", "f2"), prefetch("a", "f3", "f4"), offload("w", "f1"),
                    prefetch("w", "f3", "f4"), drop("b", "f2"), recompute("b", "f3"))
    for p in (plan, planned(synthesize("cnn", layers=2, batch=8), "capuchin", 0.7)):
        prof = profile if p is plan else synthesize("cnn", layers=2, batch=8)
        sim = Simulator(prof, HW)
        theirs = allocation_keys(compile_program(prof, sim.compiled, p, sim.machine), sim.compiled)
        theirs = sorted((r.key, r.owner if r.owner != "<workspace>" else "", r.size) for r in theirs.all())
        ours = sorted((key, owner, nbytes) for key, owner, nbytes, _ in lower(prof, p, HW).allocations())
        assert ours == theirs


def test_a_range_held_for_a_while_makes_the_allocation_wait():
    """a#2 (the prefetch issued after f2) planned on b's range: b is freed after f3, its
    last use, so the prefetch waits for it, then runs (f4 waits for the prefetch)."""
    profile = toy()
    offsets = {"x#1": 0, "w#1": MB, "a#1": 2 * MB, "b#1": 3 * MB, "z#1": 0, "ws:f2": 4 * MB,
               "a#2": 3 * MB, "c#1": 4 * MB, "d#1": 2 * MB}
    plan = toy_plan(profile, offload("a", "f1"), prefetch("a", "f2", "f4"), placement=Placement(5 * MB, offsets))
    assert simulate(profile, plan, HW).ok
    report = quick(profile, plan)
    assert report["ok"], report["integrity"]
    assert report["range_waits"] >= 1 and report["compactions"] == 0


def test_an_overlapping_placement_fails_naming_the_allocation_and_its_holder():
    """c planned on x's range (x, the input, stays all iteration): the simulator calls it
    infeasible; the replay runs (as it does any plan) and stops at f3, whose c#1 waits
    for a range that is never freed, naming it and its holder: nothing is corrupted."""
    offsets = placed_toy()[1].placement.offsets
    profile, plan = placed_toy(**{"c#1": offsets["x#1"]})
    predicted = simulate(profile, plan, HW)
    assert predicted.valid and not predicted.feasible
    report = quick(profile, plan)
    assert not report["ok"]
    failure = report["failure"]
    assert failure["kind"] == "memory" and failure["op"] == "f3" and failure["tensor"] == "c"
    assert "'c#1'" in failure["message"] and "held by 'x#1' (tensor x)" in failure["message"]
    assert report["predicted"]["feasible"] is False


def test_two_tensors_of_one_op_on_the_same_range():
    offsets = placed_toy()[1].placement.offsets
    profile, plan = placed_toy(**{"b#1": offsets["a#1"]})
    report = quick(profile, plan)
    assert not report["ok"] and report["failure"]["op"] == "f2"
    assert "'b#1'" in report["failure"]["message"] and "held by 'a#1'" in report["failure"]["message"]


def test_a_missing_key_and_a_range_past_the_arena_fail_before_the_start():
    profile, plan = placed_toy()
    offsets = dict(plan.placement.offsets)
    del offsets["ws:f2"]
    missing = dataclasses.replace(plan, placement=Placement(plan.placement.arena_bytes, offsets))
    assert not simulate(profile, missing, HW).valid
    failure = quick(profile, missing)["failure"]
    assert failure["kind"] == "placement" and "'ws:f2'" in failure["message"] and failure["op"] == "f2"
    arena = plan.placement.arena_bytes
    past = dataclasses.replace(plan, placement=Placement(arena, dict(plan.placement.offsets, **{"d#1": arena})))
    failure = quick(profile, past)["failure"]
    assert failure["kind"] == "placement" and "'d#1'" in failure["message"] and "passes" in failure["message"]


def test_an_arena_above_the_budget_fails_at_the_start():
    profile, plan = placed_toy()
    budget = plan.placement.arena_bytes - 1
    assert simulate(profile, plan, HW, budget).rule == "R50"
    failure = quick(profile, plan, budget)["failure"]
    assert failure["kind"] == "memory" and "larger than the budget" in failure["message"]


def test_a_persistent_tensor_that_ends_elsewhere_fails_at_the_end():
    profile = toy()
    plan = toy_plan(profile, offload("w", "f1"), prefetch("w", "f3", "f4"))
    plan, _ = place(profile, plan, HW, None, "greedy-size")
    offsets = dict(plan.placement.offsets)
    assert offsets["w#2"] == offsets["w#1"]     # place() keeps a persistent tensor where it started
    arena = plan.placement.arena_bytes
    offsets["w#2"] = arena                      # a fresh range past the old arena: free, but elsewhere
    size = next(t.bytes for t in profile.tensors if t.id == "w")
    plan = dataclasses.replace(plan, placement=Placement(arena + size, offsets))
    assert not simulate(profile, plan, HW).valid
    failure = quick(profile, plan)["failure"]
    assert failure["kind"] == "placement" and failure["tensor"] == "w" and "where it started" in failure["message"]


# ----------------------------------------------------------------------------- a planner's plan, placed


def planned(profile, planner, fraction):
    return make_plan(profile, HW, int(profile.peak_bytes * fraction), planner,
                     options=RunOptions(time_limit=10)).plan


def test_a_smartpool_placement_of_an_lms_plan_replays():
    profile = synthesize("cnn", layers=2, batch=32)
    budget = int(profile.peak_bytes * 0.8)
    plan = planned(profile, "lms", 0.8)
    assert any(a.kind == "prefetch" for a in plan.actions)
    placed, figures = place(profile, plan, HW, budget, "smartpool")
    report = quick(profile, placed, budget)
    assert report["ok"], report["integrity"]
    assert report["placement"] is True and report["compactions"] == 0
    assert report["arena_bytes"] == figures["arena_bytes"] == placed.placement.arena_bytes
    assert report["region_bytes"] >= F(figures["arena_bytes"], placed.placement, report["size_scale"])
    assert report["peak_bytes"] <= budget and report["link_bytes"] == report["predicted_link_bytes"]
    # the same plan without its placement: first fit, its fragmentation measured as before
    bare = quick(profile, plan, budget)
    assert bare["ok"] and bare["placement"] is False
    assert bare["arena_bytes"] == bare["region_bytes"] and bare["fragmentation"] >= 1.0
    assert bare["range_waits"] == 0 and bare["predicted_arena_bytes"] is None


# ----------------------------------------------------------------------------- the mapping


def test_the_mapping_gives_every_block_its_scaled_size_and_keeps_ranges_apart():
    rng = random.Random(5)
    for _ in range(300):
        scale = rng.choice([1.0, 0.5, 0.00408, 1e-6, rng.random(), 1 / 3, 0.1])
        sizes, offsets, at = {}, {}, 0
        for i in range(rng.randrange(1, 12)):       # disjoint blocks, some tiny or empty, some gaps
            at += rng.choice([0, 0, 3, 8, 1000])
            n = rng.choice([0, 1, 7, 8, 9, 511, 512, 513, rng.randrange(1, 10**7)])
            sizes[f"t{i}#1"], offsets[f"t{i}#1"] = n, (at if n else rng.choice([0, at]))
            at += n
        placement = Placement(at, offsets)
        arena = PlacedArena(placement, scale, [k for k, n in sizes.items() if n == 0])
        spans = []
        for key, n in sizes.items():
            size = scaled_bytes(n, scale)
            offset = arena.take(key, key, n, size)
            assert offset is not None and offset % ALIGN == 0
            assert offset + size <= arena.size
            if n:
                assert offset == F(offsets[key], placement, scale)
                assert F(offsets[key] + n, placement, scale) - offset >= size
            spans.append((offset, offset + size))
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))     # disjoint in the region
        assert arena.size == F(at, placement, scale) + ALIGN * sum(1 for n in sizes.values() if n == 0)


def test_a_held_range_names_its_holder_until_it_is_freed():
    placement = Placement(300, {"a#1": 0, "b#1": 100, "c#1": 50, "ws:f": 250})
    arena = PlacedArena(placement, 0.5)
    a = arena.take("a#1", "a", 100, 56)
    b = arena.take("b#1", "b", 100, 56)
    assert (a, b) == (0, 72)          # map(100) = align(50) + 8 x 2 offsets below (0, 50)
    assert arena.take("c#1", "c", 100, 56) is None            # [50, 150) overlaps both
    assert arena.blocked["c#1"] == {"allocation": "c#1", "range": [50, 150], "held_by": "b#1", "owner": "b"}
    arena.free(b)
    assert arena.take("c#1", "c", 100, 56) is None and arena.blocked["c#1"]["held_by"] == "a#1"
    arena.free(a)
    assert arena.take("c#1", "c", 100, 56) == 40 and "c#1" not in arena.blocked
    assert arena.take("ws:f", "", 50, 32) is not None
    assert arena.live == 150 and arena.peak_live == 200 and arena.peak_extent == 300


def test_a_planner_that_places_its_plan_is_followed():
    """vDNN++ plans carry their own placement (planner/swap/vdnn_plus.py)."""
    profile = synthesize("cnn", layers=2, batch=8)
    budget = int(profile.peak_bytes * 0.6)
    plan = planned(profile, "vdnn++", 0.6)
    assert plan.placement is not None
    report = quick(profile, plan, budget)
    assert report["ok"], report["integrity"]
    assert report["placement"] is True and report["compactions"] == 0
    assert report["arena_bytes"] == plan.placement.arena_bytes == report["predicted_arena_bytes"]
