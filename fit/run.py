"""fit's search: each family's edge, found with traces and probes run on ``jobs`` local
processes (or a Dask cluster), every finished probe written at once.

Each family runs its own ``EdgeSearch``; a size is traced once for all of them (the
trace cache), and a size's probes are the family's planners there. A family fits at a
size when any of its planners' plans runs within the memory. The searches advance as
their probes finish, so the processes stay busy while families wait on different sizes.
With ``global_batch`` the micro-batches that reach it in the fewest accumulation steps
are probed after the edges (``summary.accumulation_candidates``).
"""
from __future__ import annotations

import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Callable

from simulator.errors import InputError

from .probe import Probe, run_probe
from .search import EdgeSearch, peak_next
from .store import FitStore
from .summary import accumulation_candidates, fastest, throughput
from .traces import TraceCache, TraceSpec, Traced, cache_key, environment_fingerprint, trace_job


@dataclass(frozen=True)
class FitRequest:
    """What to find: the model (``spec``), the GPU memory plans must fit, the families
    and their planners (in the order reported), and how the search runs."""
    spec: TraceSpec
    memory_bytes: int
    families: dict[str, tuple[str, ...]]
    seed: int = 0
    time_limit: float | None = None
    start: int = 1
    limit: int = 1 << 16
    global_batch: int | None = None
    allocator: str | None = None      # R55: hold what the caching allocator reserves to the memory


@dataclass
class FitState:
    """What the search knows: each family's search, the traces by step, and the probe
    rows by (step, planner)."""
    searches: dict[str, EdgeSearch]
    traces: dict[int, Traced] = field(default_factory=dict)
    rows: dict[tuple[int, str], dict] = field(default_factory=dict)
    ran: int = 0
    resumed: int = 0
    traced: int = 0
    interrupted: bool = False


def run_fit(request: FitRequest, out: str, jobs: int = 1, dask_address: str | None = None,
            say: Callable[[str], None] | None = None) -> FitState:
    """Find every family's edge; probes already in ``out`` (a rerun, a resumed run) are
    read, not run again. Ctrl-C stops with what finished written (``interrupted``)."""
    from simulator.hardware import load_hardware

    spec = request.spec
    hardware_name = load_hardware(spec.hardware).name
    store = FitStore(out)
    cache = TraceCache(out)
    fingerprint = environment_fingerprint(spec)
    state = FitState({family: EdgeSearch(request.start, request.limit) for family in request.families})
    pending: dict[Future, tuple] = {}
    started = time.monotonic()
    say = say or (lambda line: None)
    batch = spec.batch or 1

    def note(line: str) -> None:
        say(f"[{time.monotonic() - started:5.0f} s] {line}")

    def traced(units: int) -> Traced | None:
        found = state.traces.get(units)
        if found is None:
            found = cache.get(cache_key(spec, units, fingerprint), units)
            if found is not None:
                state.traces[units] = found
        return found

    def speeds(family: str) -> dict[int, float | None]:
        """Each step with every planner's row, and the family's best throughput there."""
        found = {}
        for units in {u for (u, _) in state.rows}:
            rows = [state.rows.get((units, p)) for p in request.families[family]]
            if all(rows):
                row = fastest(rows)
                found[units] = None if row is None else throughput(spec, units, row["iteration_us"], batch)
        return found

    def wants(family: str) -> list[int]:
        """The steps whose rows the family waits for: the edge's next, then the best
        throughput's, then the global batch's micro-batches."""
        step = state.searches[family].next()
        if step is None:
            step = peak_next(speeds(family))
        if step is not None:
            return [step]
        if request.global_batch is None:
            return []
        return accumulation_candidates(math.ceil(request.global_batch / spec.ranks), spec.step,
                                       state.searches[family].largest)

    def rows_at(family: str, units: int) -> list[dict] | None:
        """The family's rows at ``units``, submitting what is missing; None while any is."""
        trace = traced(units)
        if trace is None:
            if not any(job == ("trace", units) for job in pending.values()):
                pending[executor.submit(trace_job, spec, units, cache_key(spec, units, fingerprint), out)] = \
                    ("trace", units)
            return None
        if trace.error is not None:
            return []
        rows = []
        for planner in request.families[family]:
            row = state.rows.get((units, planner))
            if row is None:
                probe = Probe.make(units, spec.size(units), family, planner, trace, spec.hardware, hardware_name,
                                   request.memory_bytes, request.seed, request.time_limit, request.allocator)
                row = store.rows.get(probe.key)
                if row is not None:
                    state.rows[(units, planner)] = row
                    state.resumed += 1
                elif not any(job[0] == "probe" and job[1] == probe for job in pending.values()):
                    pending[executor.submit(run_probe, probe)] = ("probe", probe)
            if row is not None:
                rows.append(row)
        return rows if len(rows) == len(request.families[family]) else None

    seen: dict[str, set[int]] = {family: set() for family in request.families}

    def advance() -> None:
        moved = True
        while moved:
            moved = False
            for family, search in state.searches.items():
                for units in wants(family):
                    rows = rows_at(family, units)
                    if rows is None:
                        continue
                    if search.next() != units:   # the best throughput's probe: the next one is due
                        moved = moved or units not in seen[family]
                        seen[family].add(units)
                        continue
                    fits = any(row["fits"] for row in rows)
                    search.record(units, fits)
                    best = fastest(rows)
                    what = (f"fits ({best['planner']} {best['iteration_us'] / 1e3:.1f} ms)" if best else
                            "does not fit" if rows else f"cannot be traced: {state.traces[units].error}")
                    note(f"{family}: {spec.axis} {spec.size(units)} {what}")
                    moved = True

    def finished(future: Future, job: tuple) -> None:
        kind, what = job
        if kind == "trace":
            try:
                result = future.result()
            except BrokenProcessPool:
                raise
            except Exception as exc:      # a tracer bug at this size: not cached, the search goes on
                result = Traced(what, error=f"{type(exc).__name__}: {exc}")
            state.traces[what] = result
            state.traced += 1
            if result.error is None:
                note(f"traced {spec.axis} {spec.size(what)}: peak {result.peak_bytes / 2**30:.2f} GiB")
            return
        row, plan_text = future.result()
        state.rows[(what.units, what.planner)] = row
        store.add(row, plan_text)
        state.ran += 1

    executor = _executor(jobs, dask_address)
    try:
        advance()
        while pending:
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: _order(pending[f])):
                finished(future, pending.pop(future))
            advance()
    except KeyboardInterrupt:
        state.interrupted = True
        _stop(executor)
    except BrokenProcessPool:
        _stop(executor)
        raise InputError("<fit>", "--jobs", "a worker process died (out of memory?); rerun to resume, or use "
                                            "fewer --jobs") from None
    else:
        executor.shutdown(wait=True)
    return state


def _order(job: tuple):
    kind, what = job
    return (0, what, "") if kind == "trace" else (1, what.units, what.planner)


class _Inline:
    """An executor that runs each job when it is submitted (``--jobs 1``): the same loop,
    no processes."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def _executor(jobs: int, dask_address: str | None):
    if dask_address:
        try:
            from distributed import Client
        except ImportError:
            raise InputError("<argument>", "--dask", "needs the dask extra: pip install 'swapplan[dask]'") from None
        try:
            client = Client(dask_address, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError("<argument>", "--dask", f"cannot reach the scheduler at {dask_address!r}: {exc}") \
                from None
        return client.get_executor(pure=False)
    return _Inline() if jobs <= 1 else ProcessPoolExecutor(max_workers=jobs)


def _stop(executor) -> None:
    for process in list((getattr(executor, "_processes", None) or {}).values()):
        process.terminate()
    executor.shutdown(wait=False, cancel_futures=True)
