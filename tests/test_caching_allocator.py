"""R55: PyTorch's CUDA caching allocator as the simulator's GPU memory.

Every case is a tiny profile whose reserved bytes are worked out by hand (in MiB, 2^20
bytes): 512-byte rounding, the small pool (requests up to 1 MiB, 2 MiB segments) and the
large pool (20 MiB segments under 10 MiB, else rounded up to 2 MiB), splitting (512 B
left in the small pool, more than 1 MiB in the large), merging within a segment only,
releasing free segments when a new one does not fit, and expandable segments (one per
pool, mapped in 2 MiB / 20 MiB pages).
"""
from __future__ import annotations

import json

import pytest

from simulator import api
from simulator.api import Simulator
from simulator.errors import InputError
from simulator.plan import Plan, offload, prefetch
from simulator.run.caching import CachingAllocator, round_size, segment_bytes
from tests.conftest import make_profile, profile_dict, run_cli_in
from tests.engine_helpers import machine

MiB = 1 << 20


def chain(*sizes, name="chain", workspace=None):
    """o1 makes t1, o{i} reads t{i-1} and makes t{i}, and a last op reads the last: each
    tensor lives while the next one is made."""
    tensors = {f"t{i}": (size, "activation") for i, size in enumerate(sizes, 1)}
    ops = [("o1", "forward", 10.0, [], ["t1"], None, workspace)]
    ops += [(f"o{i}", "forward", 10.0, [f"t{i - 1}"], [f"t{i}"]) for i in range(2, len(sizes) + 1)]
    ops.append(("end", "forward", 10.0, [f"t{len(sizes)}"], []))
    return make_profile(tensors, ops, name)


def run(profile, budget=1 << 30, allocator="caching", plan=None, hw=None):
    return Simulator(profile, hw or machine()).simulate(plan or Plan(profile.name), budget, allocator=allocator)


# ----------------------------------------------------------------------------- rounding and pools


def test_sizes_round_up_to_512_bytes():
    assert [round_size(n) for n in (0, 1, 512, 513, MiB + 1)] == [512, 512, 512, 1024, MiB + 512]
    # two 1-byte tensors: 512 B blocks of one 2 MiB small segment (the rest, 2 MiB - 1 KiB, stays free)
    r = run(chain(1, 1))
    assert r.ok and r.peak_bytes == 2 and r.reserved_bytes == 2 * MiB


@pytest.mark.parametrize("nbytes, reserved", [
    (MiB, 2 * MiB),                      # 1 MiB: the largest small request, a 2 MiB small segment
    (MiB + 1, 20 * MiB),                 # rounded to 1 MiB + 512: large, under 10 MiB: a 20 MiB segment
    (10 * MiB - 512, 20 * MiB),          # still under 10 MiB
    (10 * MiB, 10 * MiB),                # from 10 MiB: its own size rounded up to 2 MiB
    (11 * MiB, 12 * MiB),
    (21 * MiB + 1, 22 * MiB),
])
def test_pool_and_segment_size(nbytes, reserved):
    assert segment_bytes(round_size(nbytes)) == reserved
    r = run(chain(nbytes))
    assert r.ok and r.peak_bytes == nbytes and r.reserved_bytes == reserved


def test_the_pools_do_not_share_segments():
    # t1 (5 MiB) reserves a 20 MiB large segment with 15 MiB free after it; t2 (4 KiB) is a
    # small request: the large pool's free block is not for it, it reserves a 2 MiB segment
    r = run(chain(5 * MiB, 4096))
    assert r.ok and r.reserved_bytes == 22 * MiB


# ----------------------------------------------------------------------------- splitting


def test_small_pool_splits_while_512_bytes_remain():
    # o1 makes a (1 MiB - 512), b (1 MiB) and c, in that order, and o2 reads them: a and b
    # take 2 MiB - 512 of the first small segment and 512 B remain (split off, >= 512): a c
    # of 512 B fits there, one of 513 B (1 KiB) reserves a second segment
    def three(c_bytes):
        return make_profile({"a": (MiB - 512, "activation"), "b": (MiB, "activation"),
                             "c": (c_bytes, "activation")},
                            [("o1", "forward", 10.0, [], ["a", "b", "c"]),
                             ("o2", "forward", 10.0, ["a", "b", "c"], [])], "three")
    fits = run(three(512))
    assert fits.ok and fits.reserved_bytes == 2 * MiB
    spills = run(three(513))
    assert spills.ok and spills.reserved_bytes == 4 * MiB


def test_large_pool_splits_only_past_1_mib():
    # 10.5 MiB reserves a 12 MiB segment; 1.5 MiB remain (> 1 MiB): split off, and the next
    # request of 1.25 MiB (large) takes it: 12 MiB reserved
    split = run(chain(10 * MiB + MiB // 2, MiB + MiB // 4))
    assert split.ok and split.reserved_bytes == 12 * MiB
    # 11 MiB reserves 12 MiB too, but 1 MiB remains (not > 1 MiB): 11 MiB holds the whole
    # block, and 1.25 MiB reserves a 20 MiB segment: 32 MiB
    whole = run(chain(11 * MiB, MiB + MiB // 4))
    assert whole.ok and whole.reserved_bytes == 32 * MiB


# ----------------------------------------------------------------------------- caching and merging


def test_a_freed_block_stays_reserved_and_merges_with_its_free_neighbours():
    # o1 makes a and b (4 MiB each) in one 20 MiB segment: a [0, 4), b [4, 8), free [8, 20);
    # o2 reads both and makes c (1 MiB: a small segment, 2 MiB); after o2, a and b are freed
    # and merge with [8, 20) into one free 20 MiB block, which o3's d (18 MiB) takes:
    # 22 MiB reserved, where d alone in a new segment would make 40
    profile = make_profile({"a": (4 * MiB, "activation"), "b": (4 * MiB, "activation"),
                            "c": (MiB, "activation"), "d": (18 * MiB, "activation")},
                           [("o1", "forward", 10.0, [], ["a", "b"]), ("o2", "forward", 10.0, ["a", "b"], ["c"]),
                            ("o3", "forward", 10.0, ["c"], ["d"]), ("o4", "forward", 10.0, ["d"], [])], "merge")
    r = run(profile)
    assert r.ok and r.reserved_bytes == 22 * MiB and r.peak_bytes == 19 * MiB


def test_a_workspace_is_a_request_and_its_block_is_cached_after_its_op():
    # o1's 6 MiB workspace reserves a 20 MiB large segment, t1 (1 MiB) a 2 MiB small one;
    # when o1 ends the workspace's block is free (cached), and t2 (8 MiB) takes it: 22 MiB
    r = run(chain(MiB, 8 * MiB, workspace=6 * MiB))
    assert r.ok and r.reserved_bytes == 22 * MiB and r.peak_bytes == 9 * MiB


# ----------------------------------------------------------------------------- the budget


def release_profile():
    # o1 makes p (10 MiB: a 10 MiB segment) and t (20 MiB: a 20 MiB segment); o2 reads both
    # (t's last use: its segment is free, still reserved); o3 reads p and makes r (22 MiB)
    return make_profile({"p": (10 * MiB, "activation"), "t": (20 * MiB, "activation"),
                         "r": (22 * MiB, "activation")},
                        [("o1", "forward", 10.0, [], ["p", "t"]), ("o2", "forward", 10.0, ["p", "t"], []),
                         ("o3", "forward", 10.0, ["p"], ["r"]), ("o4", "forward", 10.0, ["r", "p"], [])],
                        "release")


def test_free_segments_are_released_when_a_new_one_would_pass_the_budget():
    # at o3: no free block holds 22 MiB (t's is 20); 30 + 22 = 52 MiB > 32: t's free segment
    # is released (reserved 10), and 10 + 22 = 32 fits. Peak reserved 32 MiB
    r = run(release_profile(), 32 * MiB)
    assert r.ok and r.reserved_bytes == 32 * MiB and r.peak_bytes == 32 * MiB
    assert r.stall_memory_us == 0 and r.iteration_us == 40.0
    # with room for both, nothing is released: 30 + 22 = 52 MiB reserved
    assert run(release_profile(), 64 * MiB).reserved_bytes == 52 * MiB


def fragmenting_profile():
    # o1 makes p (4 MiB); o2 reads p and makes r (36 MiB); o3 reads both
    return make_profile({"p": (4 * MiB, "activation"), "r": (36 * MiB, "activation")},
                        [("o1", "forward", 10.0, [], ["p"]), ("o2", "forward", 10.0, ["p"], ["r"]),
                         ("o3", "forward", 10.0, ["p", "r"], [])], "fragmenting")


def test_no_merging_across_segments_makes_a_run_infeasible_that_bytes_say_fits():
    profile = fragmenting_profile()
    budget = 40 * MiB
    counted = Simulator(profile, machine()).simulate(Plan(profile.name), budget)
    assert counted.ok and counted.peak_bytes == 40 * MiB and counted.reserved_bytes is None
    # caching: p takes [0, 4) of a 20 MiB segment (16 MiB free after it); r finds no free
    # block of 36 MiB, a 36 MiB segment would make 56 MiB, and the only segment holds p
    # (nothing to release): o2 waits for ever
    r = run(profile, budget)
    assert r.valid and not r.feasible and r.rule == "R10" and r.op == "o2"
    assert r.reserved_bytes == 20 * MiB and r.peak_bytes == 4 * MiB
    assert r.blocked["reserved_bytes"] == 20 * MiB and r.blocked["live_bytes"] == 4 * MiB
    assert r.blocked["grow_bytes"] == 36 * MiB and r.blocked["fragmented"] is True
    assert "reserved 20971520 bytes, live 4194304 bytes, cached free 16777216 bytes" in r.reason
    assert "a new segment (37748736 bytes) would pass the budget" in r.reason
    assert "fragmentation: the live bytes and the request fit the budget" in r.reason


def test_expandable_segments_grow_into_the_free_tail():
    # caching-expandable: p maps one 20 MiB page of the large pool's segment (16 MiB free
    # after it); r takes those 16 MiB and one more page: 40 MiB reserved, and it runs
    r = run(fragmenting_profile(), 40 * MiB, allocator="caching-expandable")
    assert r.ok and r.reserved_bytes == 40 * MiB and r.peak_bytes == 40 * MiB
    # its pages are the unit: 20 MiB pages for the large pool, 2 MiB for the small
    assert run(chain(MiB + 1), allocator="caching-expandable").reserved_bytes == 20 * MiB
    assert run(chain(4096, 4096), allocator="caching-expandable").reserved_bytes == 2 * MiB


def test_expandable_segments_unmap_free_pages_when_short():
    # o1 makes p (30 MiB), o2 reads it (p is freed when o2 ends), o3 makes s (1 MiB, small).
    # caching: p reserves a 30 MiB segment, s a 2 MiB small one: 32 MiB, within 40.
    # caching-expandable: p maps two 20 MiB pages (40 MiB); freed, they stay mapped; s needs a
    # 2 MiB small page: 42 > 40, so the large pool's free pages are unmapped (0 reserved) and
    # s maps its page: 2 MiB now, 40 MiB at the peak
    profile = make_profile({"p": (30 * MiB, "activation"), "s": (MiB, "activation")},
                           [("o1", "forward", 10.0, [], ["p"]), ("o2", "forward", 10.0, ["p"], []),
                            ("o3", "forward", 10.0, [], ["s"]), ("o4", "forward", 10.0, ["s"], [])], "unmap")
    assert run(profile, 40 * MiB).reserved_bytes == 32 * MiB
    r = run(profile, 40 * MiB, allocator="caching-expandable")
    assert r.ok and r.reserved_bytes == 40 * MiB and r.peak_bytes == 30 * MiB


def test_short_of_live_bytes_is_not_called_fragmentation():
    # budget 30 MiB: p (4) and r (36) cannot be live together in any allocator
    r = run(fragmenting_profile(), 30 * MiB)
    assert not r.feasible and r.blocked["fragmented"] is False and "fragmentation" not in r.reason


def test_an_allocation_waits_for_a_segment_to_free():
    # PCIe moves 1 MiB/us each way. o1 makes x (11 MiB: a 12 MiB segment, held whole: 1 MiB
    # left is not > 1 MiB), offloaded after o1 and prefetched after o2 for o3; o2 makes y
    # (11 MiB, never read: freed when o2 ends). Budget 23 MiB.
    profile = make_profile({"x": (11 * MiB, "activation"), "y": (11 * MiB, "activation")},
                           [("o1", "forward", 10.0, [], ["x"]), ("o2", "forward", 10.0, [], ["y"]),
                            ("o3", "forward", 10.0, ["x"], [])], "wait")
    hw = machine(h2d=1048.576, d2h=1048.576)
    plan = Plan(profile.name, (offload("x", "o1"), prefetch("x", "o2", "o3")))
    # counting bytes, 11 + 11 <= 23: o2 runs 10-20; the offload runs 10-21, the prefetch
    # 21-32 (after its source is written), o3 32-42
    counted = Simulator(profile, hw).simulate(plan, 23 * MiB)
    assert counted.ok and counted.iteration_us == 42.0 and counted.stall_memory_us == 0
    # caching: at 10, y needs a new 12 MiB segment, 12 + 12 = 24 > 23, and x holds the only
    # one: o2 waits until x's offload ends at 21 and frees x's block; y takes it (o2 21-31,
    # 11 us of memory stall); y is freed at 31 and the prefetch takes the same block (31-42);
    # o3 42-52. Never more than one 12 MiB segment
    r = run(profile, 23 * MiB, plan=plan, hw=hw)
    assert r.ok and r.iteration_us == 52.0 and r.stall_memory_us == 11.0
    assert r.reserved_bytes == 12 * MiB and r.peak_bytes == 11 * MiB


# ----------------------------------------------------------------------------- the API and the CLI


def test_api_simulate_takes_the_allocator_and_refuses_unknown_names():
    profile = chain(1)
    r = api.simulate(profile, Plan(profile.name), machine(), None, allocator="caching")
    assert r.ok and r.reserved_bytes == 2 * MiB
    assert api.simulate(profile, Plan(profile.name), machine()).reserved_bytes is None
    assert run(profile, allocator="first-fit").reserved_bytes is None
    with pytest.raises(InputError, match="allocator"):
        api.simulate(profile, Plan(profile.name), machine(), None, allocator="cached")


def test_allocator_undoes_a_try():
    allocator = CachingAllocator(64 * MiB)
    assert allocator.malloc("a", 5 * MiB) and allocator.reserved == 20 * MiB
    allocator.begin()
    assert allocator.malloc("b", 30 * MiB) and allocator.reserved == 50 * MiB
    allocator.rollback()
    assert allocator.reserved == 20 * MiB and allocator.peak == 20 * MiB and set(allocator.held) == {"a"}
    allocator.free("a")
    assert allocator.cached_bytes() == 20 * MiB and allocator.free_blocks["large"] == [(20 * MiB, 0, 0)]


def test_cli_prints_reserved_beside_live(tmp_path):
    data = profile_dict({"p": (4 * MiB, "activation"), "r": (36 * MiB, "activation")},
                        [("o1", "forward", 10.0, [], ["p"]), ("o2", "forward", 10.0, ["p"], ["r"]),
                         ("o3", "forward", 10.0, ["p", "r"], [])], "fragmenting")
    (tmp_path / "p.json").write_text(json.dumps(data))
    out = run_cli_in(tmp_path, "simulate", "p.json", "--budget", "40MiB", "--allocator", "caching-expandable")
    assert out.exit_code == 0, out.output
    assert "peak       40.00 MiB" in out.output and "reserved   40.00 MiB" in out.output
    out = run_cli_in(tmp_path, "simulate", "p.json", "--budget", "64MiB", "--allocator", "caching", "--json")
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["reserved_bytes"] == 56 * MiB and result["peak_bytes"] == 40 * MiB
    stuck = run_cli_in(tmp_path, "simulate", "p.json", "--budget", "40MiB", "--allocator", "caching")
    assert stuck.exit_code == 1 and "INFEASIBLE" in stuck.output and "20.00 MiB reserved" in stuck.output
    assert "reserved 20.00 MiB, live 4.00 MiB, cached free 16.00 MiB" in stuck.output
    assert "a new segment (36.00 MiB) would pass the budget" in stuck.output
    plain = run_cli_in(tmp_path, "simulate", "p.json", "--budget", "40MiB", "--json")
    assert json.loads(plain.stdout)["reserved_bytes"] is None


def test_random_requests_keep_the_blocks_whole_and_a_rollback_exact():
    """Blocks tile their segments, no two free blocks (or two unmapped ranges) touch, the
    reserved bytes are the mapped blocks' and never pass the budget, and a rollback gives
    back exactly the state before the try."""
    import random

    def state(allocator):
        return (allocator.reserved, allocator.peak, {o: (s.order, at) for o, (s, at) in allocator.held.items()},
                {pool: list(index) for pool, index in allocator.free_blocks.items()},
                {order: dict(s.blocks) for order, s in allocator.segments.items()})

    for seed in range(40):
        rng = random.Random(seed)
        allocator = CachingAllocator(rng.choice([64, 128]) * MiB, expandable=seed % 2 == 1)
        live, made = [], 0
        for _ in range(120):
            if live and rng.random() < 0.45:
                allocator.free(live.pop(rng.randrange(len(live))))
            else:
                before, owners = state(allocator), []
                allocator.begin()
                for _ in range(rng.randint(1, 3)):
                    made += 1
                    size = rng.choice([rng.randint(0, 4096), rng.randint(1, MiB), rng.randint(MiB, 12 * MiB),
                                       rng.randint(10 * MiB, 40 * MiB)])
                    if not allocator.malloc(f"o{made}", size):
                        owners = None
                        break
                    owners.append(f"o{made}")
                if owners is not None and rng.random() < 0.8:
                    allocator.commit()
                    live += owners
                else:
                    allocator.rollback()
                    assert state(allocator) == before
            mapped = 0
            for segment in allocator.segments.values():
                at, last = 0, "start"
                for start in sorted(segment.blocks):
                    size, kind = segment.blocks[start]
                    assert start == at and segment.ends[start + size] == start
                    assert not (kind is None and last is None) and not (kind == last == "<unmapped>")
                    mapped += size if kind != "<unmapped>" else 0
                    at, last = start + size, kind
                assert at == segment.size
            assert mapped == allocator.reserved <= allocator.budget and allocator.peak >= allocator.reserved
