"""fit's pure parts: the edge search, the best-throughput search, the accumulation
candidates, a family's summary from rows, and the memory it plans for."""
from __future__ import annotations

import random

import pytest

from fit.api import fit_memory, make_spec
from fit.search import EdgeSearch, peak_next
from fit.summary import accumulation, accumulation_candidates, family_row
from fit.traces import TraceSpec, Traced
from simulator.errors import InputError
from simulator.hardware import load_hardware


def _edge(edge: int, start: int = 1, limit: int = 1 << 16) -> EdgeSearch:
    search = EdgeSearch(start, limit)
    while (step := search.next()) is not None:
        search.record(step, step <= edge)
    return search


@pytest.mark.parametrize("edge,start", [(0, 1), (1, 1), (13, 1), (14, 8), (3, 8), (1000, 7), (64, 64)])
def test_edge_search_ends_with_both_sides_tried(edge, start):
    search = _edge(edge, start)
    assert search.largest == edge
    assert search.tried[edge + 1] is False
    if edge:
        assert search.tried[edge] is True


def test_edge_search_is_exact_for_random_edges_and_logarithmic():
    rng = random.Random(7)
    for _ in range(500):
        edge, start = rng.randint(0, 5000), rng.randint(1, 100)
        search = _edge(edge, start)
        assert search.largest == edge and search.tried[edge + 1] is False
        assert len(search.tried) <= 2 * (edge.bit_length() + start.bit_length()) + 4


def test_edge_search_stops_at_its_limit():
    search = _edge(10_000, 1, limit=100)
    assert search.largest == 100 and search.at_limit and 101 not in search.tried


def test_edge_search_is_exact_where_fitting_is_not_monotone():
    # fits at 1-9 and 12-20 only: wherever it ends, the edge it reports fits and the next does not
    fits = lambda k: k <= 9 or 12 <= k <= 20   # noqa: E731
    search = EdgeSearch(1, 64)
    while (step := search.next()) is not None:
        search.record(step, fits(step))
    assert fits(search.largest) and not fits(search.largest + 1)
    assert search.tried[search.largest + 1] is False


def test_peak_search_finds_the_best_throughput_with_both_neighbours_tried():
    rng = random.Random(3)
    for _ in range(300):
        edge = rng.randint(1, 400)
        peak = rng.randint(1, edge)
        speed = lambda k: None if k > edge else 1000.0 - abs(k - peak)   # noqa: E731
        speeds = {k: speed(k) for k in _edge(edge).tried}
        while (step := peak_next(speeds)) is not None:
            assert step not in speeds
            speeds[step] = speed(step)
        best = max((k for k, s in speeds.items() if s is not None), key=lambda k: speeds[k])
        assert best == peak
        assert best == 1 or best - 1 in speeds
        assert best + 1 in speeds


def test_accumulation_candidates_use_the_fewest_steps_without_wasted_samples():
    # 512 samples with micro-batches of at most 14: 37 steps of 14 (518 >= 512), then 38 of 14, 39 of 14;
    # the smallest micro-batch reaching 512 in 37 steps is 14, in 38 is 14, in 39 is 14 -> [14]
    assert accumulation_candidates(512, 1, 14) == [14]
    # 48 samples with at most 20: 3 steps of 16, 4 of 12, 5 of 10
    assert accumulation_candidates(48, 1, 20) == [16, 12, 10]
    assert accumulation_candidates(48, 1, 0) == []


def _rows(sizes_ok: dict[int, float | None], planner="lms", family="swap"):
    rows = {}
    for units, time_us in sizes_ok.items():
        rows[(units, planner)] = {
            "planner": planner, "family": family, "fits": time_us is not None, "iteration_us": time_us,
            "peak_bytes": 100, "plan_file": f"plans/b{units}.json" if time_us else None,
            "wall": None if time_us else "memory", "wall_op": None if time_us else "o7",
            "over_bytes": None if time_us else 4096, "wall_text": None if time_us else "over"}
    return rows


def test_family_row_reports_the_edge_its_wall_and_the_best_throughput():
    spec = TraceSpec("gpt2", None, "a100-40gb-pcie4")
    search = EdgeSearch(1, 100)
    times = {1: 100_000.0, 2: 150_000.0, 4: 400_000.0, 3: 290_000.0, 5: None}
    for units, time_us in times.items():
        search.record(units, time_us is not None)
    row = family_row("swap", ("lms",), search, spec, _rows(times), {}, batch=1)
    assert row["max"] == 4 and row["planner"] == "lms" and row["iteration_us"] == 400_000.0
    assert row["throughput"] == pytest.approx(10.0)          # 4 samples in 0.4 s
    assert row["wall"] == "memory" and row["next_size"] == 5 and row["next_over_bytes"] == 4096
    assert row["best_size"] == 2 and row["best_throughput"] == pytest.approx(2 / 0.15)
    assert row["plan_file"] == "plans/b4.json"
    assert [p["size"] for p in row["points"]] == [1, 2, 3, 4, 5]


def test_family_row_on_the_seq_axis_counts_tokens():
    spec = TraceSpec("gpt2", None, "a100-40gb-pcie4", axis="seq", step=128, batch=2)
    search = EdgeSearch(1, 8)
    times = {1: 1000.0, 2: None}
    for units, time_us in times.items():
        search.record(units, time_us is not None)
    row = family_row("swap", ("lms",), search, spec, _rows(times), {}, batch=2)
    assert row["max"] == 128 and row["unit"] == "tokens/s"
    assert row["throughput"] == pytest.approx(2 * 128 / 1e-3)
    assert row["next_size"] == 256


def test_family_row_names_a_trace_wall():
    spec = TraceSpec("gpt2", None, "a100-40gb-pcie4", axis="seq", step=128, batch=1)
    search = EdgeSearch(1, 100)
    search.record(1, True)
    search.record(2, False)
    traces = {2: Traced(2, error="gpt2 takes a sequence length of at most 1024, got 256")}
    row = family_row("swap", ("lms",), search, spec, _rows({1: 10.0}), traces, batch=1)
    assert row["wall"] == "trace" and "at most 1024" in row["wall_text"]


def test_accumulation_takes_the_optimizer_off_the_repeated_steps():
    spec = TraceSpec("gpt2", None, "a100-40gb-pcie4")
    rows = _rows({16: 1000.0, 12: 700.0, 10: 650.0})
    traces = {units: Traced(units, optimizer_us=100.0) for units in (16, 12, 10)}
    best = accumulation("swap", ("lms",), 48, spec, 20, rows, traces)
    # 3 x 16: 3 x 1000 - 2 x 100 = 2800; 4 x 12: 2800 - 300 = 2500; 5 x 10: 3250 - 400 = 2850
    assert (best["micro_batch"], best["accumulation_steps"], best["step_us"]) == (12, 4, 2500.0)


def test_fit_memory_defaults_to_the_gpu_less_the_reserve_and_checks_its_input():
    hw = load_hardware("rtx4090-24gb-pcie4")
    assert fit_memory(hw, None, None) == 24 * 2**30 - 2**30
    assert fit_memory(hw, None, "2GiB") == 22 * 2**30
    assert fit_memory(hw, "20GiB", None) == 20 * 2**30
    with pytest.raises(InputError, match="more than the GPU"):
        fit_memory(hw, "30GiB", None)
    with pytest.raises(InputError, match="no memory"):
        fit_memory(hw, None, "24GiB")
    with pytest.raises(InputError, match="--reserve"):
        fit_memory(hw, "20GiB", "1GiB")


def test_spec_steps_and_fixed_sizes():
    batch_axis = make_spec("gpt2", None, "a100-40gb-pcie4", "batch", None, None, 512, "fp32", None, "adamw", False)
    assert batch_axis.at(3) == (3, 512)
    seq_axis = make_spec("gpt2", None, "a100-40gb-pcie4", "seq", None, None, None, "fp32", None, "adamw", False)
    assert seq_axis.at(3) == (1, 384)
    with pytest.raises(InputError, match="MODEL or --hf-config"):
        make_spec(None, None, "a100-40gb-pcie4", "batch", None, None, None, "fp32", None, "adamw", False)
