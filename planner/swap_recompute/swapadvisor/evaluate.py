"""Fitness: decode a chromosome and score its plan with the compile-once simulator, in
this process, a local process pool or on a Dask cluster.

A generation is scored as one batch, split into contiguous chunks and put back in
index order, and each score depends only on its chromosome, so the search sees the same
numbers whichever way it runs.
"""
from __future__ import annotations

import itertools
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from simulator.api import Simulator, fast_available
from simulator.errors import InputError
from simulator.plan import Plan

from .decode import Decoded, Decoder, Problem


class Worker:
    """One profile, machine and budget, compiled once (or the run's ``simulator``):
    chromosome -> rank."""

    def __init__(self, profile, hardware, budget_bytes: int, simulator: Simulator | None = None):
        self.profile, self.budget = profile, int(budget_bytes)
        self.decoder = Decoder(Problem(profile, hardware, budget_bytes))
        self.simulator = simulator or Simulator(profile, hardware)
        # both C paths built: decode to positions and score them with no Action objects
        self.positions = self.decoder.fast and fast_available()

    def plan(self, decoded: Decoded) -> Plan:
        return Plan(profile_name=self.profile.name, profile_sha256=self.simulator.compiled.sha256,
                    actions=tuple(decoded.actions), budget_bytes=self.budget,
                    schedule=None if decoded.schedule is None else tuple(decoded.schedule),
                    initial=dict(decoded.initial))

    def rank(self, order: np.ndarray, genes: np.ndarray) -> tuple:
        """``Score.rank()`` of the decoded plan: feasible by time, then by bytes over budget."""
        if self.positions:
            return self._rank_positions(order, genes)
        return self.simulator.score(self.plan(self.decoder.decode(order, genes)), self.budget).rank()

    def _rank_positions(self, order: np.ndarray, genes: np.ndarray) -> tuple:
        """``rank`` with the C decoder's columns packed straight for the C simulator (the
        same Score: the Plan is made only if the simulator needs it)."""
        columns = self.decoder.columns(order, genes)
        schedule = None if columns.identity else np.ascontiguousarray(order, dtype=np.int32)
        return self.simulator.score_positions(columns.kinds, columns.tensors, columns.afters, columns.befores,
                                              schedule, columns.initial, self.budget,
                                              lambda: self.plan(self.decoder.decoded(columns, order))).rank()

    def ranks(self, chunk: list) -> list[tuple]:
        return [self.rank(order, genes) for order, genes in chunk]


_worker: Worker | None = None          # a pool process's worker
_dask_workers: dict[str, Worker] = {}  # a Dask worker's, by problem key


def _start_worker(profile, hardware, budget_bytes: int) -> None:
    global _worker
    _worker = Worker(profile, hardware, budget_bytes)


def _pool_ranks(chunk: list) -> list[tuple]:
    return _worker.ranks(chunk)


def _dask_ranks(problem: tuple, key: str, chunk: list) -> list[tuple]:
    worker = _dask_workers.get(key)
    if worker is None:
        _dask_workers.clear()
        worker = _dask_workers[key] = Worker(*problem)
    return worker.ranks(chunk)


class Evaluator:
    """Ranks batches of chromosomes: here (jobs 1), in ``jobs`` local processes, or on the
    Dask scheduler at ``dask`` (an existing cluster; needs the dask extra)."""

    def __init__(self, profile, hardware, budget_bytes: int, jobs: int = 1, dask: str = "",
                 simulator: Simulator | None = None):
        self.local = Worker(profile, hardware, budget_bytes, simulator)
        self.jobs, self.pool, self.client = max(1, jobs), None, None
        problem = (profile, hardware, int(budget_bytes))
        if dask:
            try:
                from distributed import Client
            except ImportError:
                raise InputError("<argument>", "--param dask", "needs the dask extra: pip install 'swapplan[dask]'") \
                    from None
            try:
                self.client = Client(dask, timeout="10s")
            except (OSError, TimeoutError, ValueError) as exc:
                raise InputError("<argument>", "--param dask", f"cannot reach the scheduler at {dask!r}: {exc}") \
                    from None
            self.jobs = max(1, sum(self.client.nthreads().values()))
            self.problem = self.client.scatter(problem, broadcast=True, hash=False)
            self.key = f"swapadvisor-{os.getpid()}-{id(self)}"
        elif self.jobs > 1:
            self.pool = ProcessPoolExecutor(max_workers=self.jobs, initializer=_start_worker, initargs=problem)
        self._batches = itertools.count()

    def __call__(self, batch: list) -> list[tuple]:
        """The ranks of ``batch`` (pairs of order and genes), in order."""
        if not batch:
            return []
        if self.pool is None and self.client is None:
            return self.local.ranks(batch)
        size = -(-len(batch) // self.jobs)
        chunks = [batch[i:i + size] for i in range(0, len(batch), size)]
        if self.pool is not None:
            parts = list(self.pool.map(_pool_ranks, chunks))
        else:
            batch_no = next(self._batches)
            futures = [self.client.submit(_dask_ranks, self.problem, self.key, chunk, pure=False,
                                          key=f"{self.key}-{batch_no}-{i}") for i, chunk in enumerate(chunks)]
            parts = self.client.gather(futures)
        return [rank for part in parts for rank in part]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
        if self.client is not None:
            self.client.close()
            self.client = None
