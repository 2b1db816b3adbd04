"""The swapadvisor decoder in C (planner/search/swapadvisor/_fastdecode.c) against the Python
reference (Decoder.reference): the same Decoded (actions in the same order, schedule,
initial placements, swaps, recomputes, bytes over budget) and the same rank, on the
shipped GPT-2 and ResNet-50 profiles, small synthetic ones and random graphs, for the
search's own chromosomes and random ones with reordered schedules."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.swap_recompute.swapadvisor import decode
from planner.swap_recompute.swapadvisor.evaluate import Evaluator, Worker
from planner.swap_recompute.swapadvisor.schedule import Dag
from planner.swap_recompute.swapadvisor.search import Search
from simulator.catalog import open_profile
from simulator.fast import explicit as fastpath
from simulator.hardware import load_hardware
from tests.test_swapadvisor import MACHINES, graphs
from tracer.synthetic import synthesize

pytestmark = pytest.mark.skipif(not decode.available(), reason="the C decoder (planner/search/swapadvisor/_fastdecode.c) "
                                "is not built: no C compiler at install time")

HW = load_hardware("a100-40gb-pcie4")


def chromosomes(profile, budget: int, count: int, seed: int) -> list:
    """Half the search's first population and children of it (as bench_swapadvisor.py
    makes them), half random: uniform genes, some exactly 0 or 1, on schedules moved by
    up to 40 mutations."""
    rng = np.random.default_rng(seed)
    search = Search(profile, Evaluator(profile, HW, budget), rng, population=16, mutation_rate=0.1)
    people = search.first([])
    batch = [(p.order, p.genes) for p in people]
    while len(batch) < count // 2:
        people = search.next(people)
        batch += [(p.order, p.genes) for p in people[2:]]
    batch = batch[:count // 2]
    n, m = len(profile.ops), len(profile.tensors)
    while len(batch) < count:
        order = np.arange(n)
        for _ in range(int(rng.integers(0, 40))):
            order = search.dag.mutate(order, rng)
        genes = rng.random((2, m))
        genes[rng.random((2, m)) < 0.05] = 0.0
        genes[rng.random((2, m)) < 0.05] = 1.0
        batch.append((order, genes))
    return batch


def assert_same(worker: Worker, order: np.ndarray, genes: np.ndarray) -> None:
    """The C decoder's Decoded and rank are the reference's."""
    fast, slow = worker.decoder.decode(order, genes), worker.decoder.reference(order, genes)
    assert fast.actions == slow.actions
    assert (fast.schedule, list(fast.initial.items()), fast.swaps, fast.recomputes, fast.over_bytes) == \
        (slow.schedule, list(slow.initial.items()), slow.swaps, slow.recomputes, slow.over_bytes)
    expected = worker.simulator.score(worker.plan(slow), worker.budget).rank()
    assert worker.rank(order, genes) == expected


@pytest.mark.parametrize("name, fractions, count", [
    ("gpt2-b48-s1024", (0.5, 0.3), 80),
    ("resnet50-b1024-s224", (0.45, 0.3), 80),
])
def test_the_shipped_profiles_decode_alike(name, fractions, count):
    profile = open_profile(name)
    for i, fraction in enumerate(fractions):
        budget = int(profile.peak_bytes * fraction)
        worker = Worker(profile, HW, budget)
        assert worker.decoder.fast and worker.positions == fastpath.available()
        for order, genes in chromosomes(profile, budget, count, seed=i):
            assert_same(worker, order, genes)


@pytest.mark.parametrize("model, size", [
    ("transformer", dict(layers=2, batch=4, seq=256)),
    ("cnn", dict(layers=2, batch=4)),
    ("mlp", dict(layers=3, batch=8)),
])
def test_synthetic_profiles_decode_alike(model, size):
    profile = synthesize(model, **size)
    for i, fraction in enumerate((0.9, 0.6, 0.4, 0.2, 0.05)):
        budget = int(profile.peak_bytes * fraction)
        worker = Worker(profile, HW, budget)
        for order, genes in chromosomes(profile, budget, 40, seed=10 + i):
            assert_same(worker, order, genes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.integers(0, 2**32 - 1), st.floats(0.0, 1.0), MACHINES)
def test_random_graphs_decode_alike(profile, seed, squeeze, hw):
    # empty tensors, untouched weights, in-place updates of activations, workspaces
    rng = np.random.default_rng(seed)
    dag = Dag(profile)
    worker = Worker(profile, hw, int(profile.peak_bytes * squeeze))
    for _ in range(3):
        order = np.arange(len(profile.ops))
        for _ in range(int(rng.integers(0, 8))):
            order = dag.mutate(order, rng)
        assert_same(worker, order, rng.random((2, len(profile.tensors))))


def test_the_rank_without_the_packed_path_is_the_same():
    # the C decoder's Actions scored through Simulator.score, as when the C simulator is missing
    profile = synthesize("transformer", layers=2, batch=4, seq=256)
    budget = int(profile.peak_bytes * 0.4)
    worker = Worker(profile, HW, budget)
    batch = chromosomes(profile, budget, 12, seed=3)
    packed = [worker.rank(order, genes) for order, genes in batch]
    worker.positions = False
    assert [worker.rank(order, genes) for order, genes in batch] == packed


def test_the_python_decoder_is_the_fallback():
    profile = synthesize("mlp", layers=3, batch=8)
    worker = Worker(profile, HW, int(profile.peak_bytes * 0.3))
    slow = decode.Decoder(worker.decoder.problem, fast=False)
    order, genes = np.arange(len(profile.ops)), np.full((2, len(profile.tensors)), 0.5)
    assert not slow.fast and slow.decode(order, genes) == worker.decoder.decode(order, genes)


def test_bad_input_is_a_value_error():
    profile = synthesize("mlp", layers=3, batch=8)
    decoder = Worker(profile, HW, int(profile.peak_bytes * 0.3)).decoder
    n, m = len(profile.ops), len(profile.tensors)
    genes = np.full((2, m), 0.5)
    with pytest.raises(ValueError, match="repeats an op"):
        decoder.columns(np.zeros(n, dtype=np.int64), genes)
    with pytest.raises(ValueError, match="out of range"):
        decoder.columns(np.arange(n) + 1, genes)
    problem = decoder.problem
    with pytest.raises(ValueError, match="lengths"):
        decode._fastdecode.decode(problem.arrays, problem.persistent_bytes, problem.budget, np.arange(n),
                                  np.ones(m - 1), np.zeros(m, dtype=bool))
    with pytest.raises(ValueError, match="float64"):
        decode._fastdecode.decode(problem.arrays, problem.persistent_bytes, problem.budget, np.arange(n),
                                  np.ones(m, dtype=np.float32), np.zeros(m, dtype=bool))
