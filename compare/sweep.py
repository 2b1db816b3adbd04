"""Run every cell of a comparison, locally or on a Dask cluster, resumably.

Rows and plans are written after every finished cell (atomically), so an interrupted
or killed sweep keeps what it finished and a rerun with the same output folder runs only
the rest. The folder keeps other runs' rows too (compare.results_folder: merged by cell
key, under a lock). Rows come out in cell order whatever the number of jobs or where the
cells ran.
"""
from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from simulator.errors import InputError

from .cells import COLUMNS, ERROR, Cell, empty_row, run_cell
from .results_folder import RESULTS_CSV, RESULTS_JSON, ResultsFolder

PLANS = "plans"


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
    """What a sweep did: its cells' rows (in cell order), how many ran now and how many
    were already done, whether it was interrupted, and every row now in the folder (this
    sweep's and those other runs left there, in the folder's order)."""
    rows: list[dict]
    ran: int = 0
    resumed: int = 0
    interrupted: bool = False
    failed: list[dict] = field(default_factory=list)
    folder_rows: list[dict] = field(default_factory=list)


def compare_folder(out: str | os.PathLike | ResultsFolder) -> ResultsFolder:
    """The results folder of ``compare --out``: its rows merged with the folder's by cell
    key (compare.results_folder), ``plans/`` beside them, and the columns that depend on
    the other rows filled on every save (``grid.annotate``)."""
    if isinstance(out, ResultsFolder):
        return out
    from .grid import annotate
    return ResultsFolder(out, COLUMNS, kind="compare", option="--out", prepare=annotate, subfolders=(PLANS,))


def compare_writes(relative: Path) -> bool:
    """Whether compare --out writes the file at this path inside its folder besides the
    results files and the lock: report.html, the charts (*.png) and plans/*."""
    parts = relative.parts
    if len(parts) == 1:
        return parts[0] in (RESULTS_CSV, RESULTS_JSON, "report.html") or parts[0].lower().endswith(".png")
    return len(parts) >= 2 and parts[0] == PLANS


def run_sweep(cells: list[Cell], out: str | os.PathLike | ResultsFolder, jobs: int = 1,
              dask_address: str | None = None, progress: Callable[[int, int, dict], None] | None = None,
              started: Callable[[], None] | None = None) -> Outcome:
    """Run the cells not already finished in ``out``; write rows and plans as they finish.

    Rows are merged with those the folder holds (``compare_folder``): other runs' rows
    are kept, into the same folder at the same time too. ``jobs`` > 1 runs cells in that
    many local processes; ``dask_address`` on a Dask cluster instead (its workers must be
    able to open the same profile files). ``started`` is called once set-up succeeded
    (the folder opened, the cluster reached), before any cell runs: a banner printed
    there never precedes a set-up error. Ctrl-C stops the sweep with every finished cell
    written (``interrupted``).
    """
    store = compare_folder(out)
    client = _dask_client(dask_address) if dask_address else None
    try:
        earlier = store.open()
    except BaseException:
        if client is not None:
            client.close()
        raise
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
                store.write(Path(PLANS) / twin.plan_file, plan_text.encode())
            rows[twin.key] = dict(row, key=twin.key, budget=twin.budget,
                                  plan_file=None if row.get("plan_file") is None else "plans/" + twin.plan_file)
            outcome.ran += 1
        store.save(ordered())
        if progress is not None:
            progress(len(rows), len(cells), rows[cell.key])

    try:
        if started is not None:
            started()
        store.save(ordered())
        if progress is not None:
            progress(len(rows), len(cells), {})
        if client is not None:
            _run_dask(todo, client, finish)
        elif jobs > 1 and len(todo) > 1:
            _run_pool(todo, jobs, finish)
        else:
            for cell in todo:
                finish(cell, *run_cell(cell))
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        if client is not None:
            client.close()
    outcome.rows = ordered()
    outcome.failed = [row for row in outcome.rows if row["status"] == ERROR]
    outcome.folder_rows = store.rows()
    return outcome


def write_folder_report(out: str | os.PathLike | ResultsFolder) -> Path | None:
    """The charts and report.html of every row in the folder (other runs' too), written
    under the folder's lock so that the last run to finish leaves the report of all
    rows; None when the folder holds no rows."""
    from .report import write_report
    store = compare_folder(out)
    with store.locked():
        rows = store.rows()
        return write_report(rows, store.path) if rows else None


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


def _dask_client(address: str):
    """A client of the Dask scheduler at ``address`` (InputError when the extra is
    missing or the scheduler cannot be reached)."""
    try:
        from distributed import Client
    except ImportError:
        raise InputError("<argument>", "--dask", "needs the dask extra: pip install 'swapplan[dask]'") from None
    try:
        return Client(address, timeout="10s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError("<argument>", "--dask", f"cannot reach the scheduler at {address!r}: {exc}") from None


def _run_dask(cells: list[Cell], client, finish) -> None:
    from distributed import as_completed
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
