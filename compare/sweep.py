"""Run every cell of a comparison, locally or on a Dask cluster, resumably.

Rows and plans are written after every finished cell (atomically), so an interrupted
sweep keeps what it finished and a rerun with the same output folder runs only the rest.
Rows come out in cell order whatever the number of jobs or where the cells ran.
"""
from __future__ import annotations

import csv
import io
import json
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from simulator.errors import InputError
from simulator.files import write_atomic

from .cells import COLUMNS, ERROR, Cell, empty_row, run_cell

RESULTS_JSON, RESULTS_CSV, PLANS = "results.json", "results.csv", "plans"


def expand_cells(profiles: Iterable[str], hardware: Iterable[str | None], planners: Iterable[str],
                 budgets: Iterable[str], seed: int = 0, time_limit: float | None = None,
                 notes: list[str] | None = None) -> list[Cell]:
    """Every (profile, hardware, planner, budget), in that nesting order. Profiles,
    hardware, planners and budgets are checked here: bad input fails before any work.
    A hardware of None is the profile's own (as ``swapplan plan`` chooses it). Budgets
    that a machine caps to the same bytes are compared once, under the first of them;
    ``notes`` receives one line per profile and machine saying which were folded."""
    from planner.core.registry import get_planner
    from simulator.catalog import default_hardware, open_profile
    from simulator.hardware import load_hardware
    from simulator.units import format_bytes, planning_budget

    planners = list(dict.fromkeys(planners))
    for name in planners:
        get_planner(name)
    cells = []
    for spec in dict.fromkeys(profiles):
        profile = open_profile(spec)
        for hw_spec in dict.fromkeys(hardware):
            hw_spec = hw_spec or default_hardware(None, None, profile)
            machine = load_hardware(hw_spec)
            kept: dict[int, list[str]] = {}     # capped bytes -> the budgets that come to them
            chosen = []
            for budget in dict.fromkeys(budgets):
                budget_bytes, asked = planning_budget(budget, profile.peak_bytes, machine.gpu.memory_bytes,
                                                      "--budgets", cap_sizes=True)
                if asked is not None and budget_bytes in kept:
                    kept[budget_bytes].append(budget)
                    continue
                kept[budget_bytes] = [budget]
                chosen.append((budget, budget_bytes, asked is not None))
            for same in kept.values():
                if len(same) > 1 and notes is not None:
                    notes.append(f"{profile.name} on {machine.name}: budgets {', '.join(same)} are all more than the "
                                 f"GPU's {format_bytes(machine.gpu.memory_bytes)}: compared once, as {same[0]} "
                                 "(capped)")
            for planner in planners:
                for budget, budget_bytes, capped in chosen:
                    cells.append(Cell(str(spec), profile.name, profile.sha256, str(hw_spec), machine.name, planner,
                                      budget, budget_bytes, capped, seed, time_limit))
    return cells


@dataclass
class Outcome:
    """What a sweep did: every cell's row (in cell order), how many ran now and how many
    were already done, and whether it was interrupted."""
    rows: list[dict]
    ran: int = 0
    resumed: int = 0
    interrupted: bool = False
    failed: list[dict] = field(default_factory=list)


class ResultStore:
    """The output folder: ``results.json``, ``results.csv`` and ``plans/``."""

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        if self.out.exists() and not self.out.is_dir():
            raise InputError(str(out), "--out", "is not a folder")
        try:
            (self.out / PLANS).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(str(out), "--out", f"cannot create the folder: {exc.strerror}") from None

    def finished(self) -> dict[str, dict]:
        """Rows of an earlier run, by cell key (an unreadable file is an input error)."""
        path = self.out / RESULTS_JSON
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text())
            return {row["key"]: row for row in data["rows"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(str(path), "rows", f"cannot resume from it ({exc}); remove it or choose another "
                                                "--out") from None

    def save_plan(self, cell: Cell, text: str) -> None:
        write_atomic(self.out / PLANS / cell.plan_file, text.encode())

    def save_rows(self, rows: list[dict]) -> None:
        from .grid import annotate
        annotate(rows)   # family and the column's bound: they depend on the other rows
        write_atomic(self.out / RESULTS_JSON,
                     (json.dumps({"columns": list(COLUMNS), "rows": rows}, indent=1, allow_nan=False) + "\n").encode())
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in COLUMNS})
        write_atomic(self.out / RESULTS_CSV, buffer.getvalue().encode())


def run_sweep(cells: list[Cell], out: str | os.PathLike, jobs: int = 1, dask_address: str | None = None,
              progress: Callable[[int, int, dict], None] | None = None) -> Outcome:
    """Run the cells not already finished in ``out``; write rows and plans as they finish.

    ``jobs`` > 1 runs cells in that many local processes; ``dask_address`` on a Dask
    cluster instead (its workers must be able to open the same profile files). Ctrl-C
    stops the sweep with every finished cell written (``interrupted``).
    """
    store = ResultStore(out)
    earlier = store.finished()
    rows: dict[str, dict] = {}
    for cell in cells:
        if cell.key in earlier:
            rows[cell.key] = earlier[cell.key]
    # budgets that come to the same bytes (two percentages capped at the GPU's memory)
    # are planned once; the other cells get the same row and plan under their own names
    twins: dict[str, list[Cell]] = {}
    todo = []
    for cell in cells:
        if cell.key not in rows:
            same = twins.setdefault(cell.work_key, [])
            if not same:
                todo.append(cell)
            same.append(cell)
    outcome = Outcome(rows=[], resumed=len(rows))

    def ordered() -> list[dict]:
        return [rows[c.key] for c in cells if c.key in rows]

    def finish(cell: Cell, row: dict, plan_text: str | None) -> None:
        for twin in twins[cell.work_key]:
            if plan_text is not None:
                store.save_plan(twin, plan_text)
            rows[twin.key] = dict(row, key=twin.key, budget=twin.budget,
                                  plan_file=None if row.get("plan_file") is None else "plans/" + twin.plan_file)
            outcome.ran += 1
        store.save_rows(ordered())
        if progress is not None:
            progress(len(rows), len(cells), rows[cell.key])

    store.save_rows(ordered())
    if progress is not None:
        progress(len(rows), len(cells), {})
    try:
        if dask_address:
            _run_dask(todo, dask_address, finish)
        elif jobs > 1 and len(todo) > 1:
            _run_pool(todo, jobs, finish)
        else:
            for cell in todo:
                finish(cell, *run_cell(cell))
    except KeyboardInterrupt:
        outcome.interrupted = True
    outcome.rows = ordered()
    outcome.failed = [row for row in outcome.rows if row["status"] == ERROR]
    return outcome


def _run_pool(cells: list[Cell], jobs: int, finish) -> None:
    """Local processes. A worker that dies (a crash in native code) breaks the pool and
    every cell in it; those cells then run one at a time, so that only a cell that kills
    its own worker is recorded as an error."""
    broken = _pool_round(cells, jobs, finish)
    pool = None
    for cell in broken:
        pool = pool or ProcessPoolExecutor(max_workers=1)
        try:
            finish(cell, *pool.submit(run_cell, cell).result())
        except BrokenProcessPool:
            row = empty_row(cell)
            row.update(status=ERROR, error="its worker process died (a crash in native code?)")
            finish(cell, row, None)
            pool.shutdown(wait=False)
            pool = None
    if pool is not None:
        pool.shutdown()


def _pool_round(cells: list[Cell], jobs: int, finish) -> list[Cell]:
    """Run the cells in a pool of ``jobs`` processes; returns those a broken pool lost."""
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(cells)))
    futures = {pool.submit(run_cell, cell): k for k, cell in enumerate(cells)}
    broken = []
    try:
        waiting = set(futures)
        while waiting:
            done, waiting = wait(waiting, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=futures.get):
                try:
                    outcome = future.result()
                except BrokenProcessPool:
                    broken.append(futures[future])
                    continue
                finish(cells[futures[future]], *outcome)
    except KeyboardInterrupt:
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [cells[k] for k in sorted(broken)]


def _run_dask(cells: list[Cell], address: str, finish) -> None:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise InputError("<argument>", "--dask", "needs the dask extra: pip install 'swapplan[dask]'") from None
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError("<argument>", "--dask", f"cannot reach the scheduler at {address!r}: {exc}") from None
    try:
        futures = {client.submit(run_cell, cell, pure=False, key=f"swapplan-{i}-{cell.plan_file}"): cell
                   for i, cell in enumerate(cells)}
        for future in as_completed(futures):
            cell = futures[future]
            try:
                finish(cell, *future.result())
            except Exception as exc:  # the worker died or the task was lost
                row = empty_row(cell)
                row.update(status=ERROR, error=f"on the Dask cluster: {type(exc).__name__}: {exc}")
                finish(cell, row, None)
    finally:
        client.close()
