"""Real peaks against simulated ones: plan a small model with many planners at several
budgets, run each plan the simulator accepts for one real step (the ``train`` path:
``PlannedInterpreter`` on the bound FX graph), and compare the real pool's peak with the
budget and with the simulator's peak.

A real run must never exceed a budget the simulator accepts, and its peak should be the
simulated one within 1% of the budget or 64 KiB (docs/runtime.md); ``tests/test_train_sweep.py``
and ``benchmarks/fidelity.py`` run this sweep.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from simulator.errors import InputError, SwapplanError
from simulator.hardware import Hardware

TOLERANCE_SHARE = 0.01          # of the budget
TOLERANCE_BYTES = 64 * 1024     # whichever is larger


@dataclass(frozen=True)
class PeakRun:
    """One (model, planner, budget) of the sweep. ``status``: ``ran`` (the plan ran),
    ``refused`` (the simulator finds the plan invalid or infeasible), ``not followed``
    (the runtime refuses to follow it: ops on the CPU, codecs, managed memory, a schedule
    that reorders random ops) or ``no plan`` (the planner cannot plan this budget)."""
    model: str
    planner: str
    share: float
    budget_bytes: int
    status: str
    real_peak_bytes: int | None = None
    simulated_peak_bytes: int | None = None
    bit_equal: bool | None = None
    recomputes: int = 0
    note: str = ""

    @property
    def tolerance_bytes(self) -> int:
        return max(int(TOLERANCE_SHARE * self.budget_bytes), TOLERANCE_BYTES)

    @property
    def ok(self) -> bool:
        """A run that ran: bit-equal, within the budget, and the simulated peak within
        tolerance. Anything that did not run is not a failure of the simulator."""
        if self.status != "ran":
            return True
        return (bool(self.bit_equal) and self.real_peak_bytes <= self.budget_bytes
                and abs(self.real_peak_bytes - self.simulated_peak_bytes) <= self.tolerance_bytes)


def peak_sweep(model: str, planner_names: Iterable[str], shares: Iterable[float], hardware: Hardware,
               time_limit: float = 2.0, progress: Callable[[str], None] | None = None) -> list[PeakRun]:
    """Trace ``model`` (a ``module:callable`` or registered name) for the runtime once,
    then for each planner and share of its no-swap peak: plan, and run the plan for one
    real step if the simulator accepts it and the runtime follows it. One intra-op thread
    (bit-equality needs the same count in every run)."""
    import torch

    from planner.core.api import make_plan
    from planner.core.registry import RunOptions
    from tracer.pytorch.trace import trace

    from .bindings import bind, initial_values
    from .interpreter import PlannedInterpreter, reference_step
    from .train import _differences

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        profile = trace(model, runtime=True, hardware=hardware)
        bindings = bind(model, profile)
        values = initial_values(bindings, seed=0)
        reference = values.clone()
        torch.manual_seed(0)
        loss = reference_step(bindings, reference)
        rows = []
        for name in planner_names:
            for share in shares:
                budget = int(profile.peak_bytes * share)
                row = dict(model=model, planner=name, share=share, budget_bytes=budget)
                if progress:
                    progress(f"{model}: {name} at {share:.0%}")
                try:
                    planned = make_plan(profile, hardware, budget, name, {}, 0,
                                        RunOptions(seed=0, time_limit=time_limit, threads=1))
                except SwapplanError as exc:
                    rows.append(PeakRun(**row, status="no plan", note=str(exc)))
                    continue
                plan, result = planned.plan, planned.result
                recomputes = sum(a.kind == "recompute" for a in plan.actions)
                if not result.ok:
                    rows.append(PeakRun(**row, status="refused", recomputes=recomputes,
                                        simulated_peak_bytes=result.peak_bytes, note=f"{result.rule}: {result.reason}"))
                    continue
                try:     # the runtime's own refusal: ops on the CPU, codecs, managed memory, ...
                    interpreter = PlannedInterpreter(bindings, plan, hardware, budget)
                except InputError as exc:
                    rows.append(PeakRun(**row, status="not followed", simulated_peak_bytes=result.peak_bytes,
                                        recomputes=recomputes, note=str(exc)))
                    continue
                mine = values.clone()
                torch.manual_seed(0)
                report = interpreter.run(mine, 1)[0]
                differences = _differences(bindings, reference, mine, [loss], [report.loss])
                rows.append(PeakRun(**row, status="ran", real_peak_bytes=report.peak_bytes,
                                    simulated_peak_bytes=interpreter.result.peak_bytes,
                                    bit_equal=not differences, recomputes=recomputes,
                                    note=", ".join(differences[:3])))
        return rows
    finally:
        torch.set_num_threads(before)


def peak_table(rows: list[PeakRun]) -> str:
    """The sweep as a Markdown table: model, planner, budget, real and simulated peaks."""
    lines = ["| model | planner | budget | status | real peak | simulated peak | real - simulated | ok |",
             "|---|---|---:|---|---:|---:|---:|---|"]
    for r in rows:
        real = f"{r.real_peak_bytes:,}" if r.real_peak_bytes is not None else ""
        sim = f"{r.simulated_peak_bytes:,}" if r.simulated_peak_bytes is not None else ""
        diff = f"{r.real_peak_bytes - r.simulated_peak_bytes:+,}" if r.status == "ran" else ""
        lines.append(f"| {r.model.split(':')[-1]} | {r.planner} | {r.share:.0%} ({r.budget_bytes:,}) | {r.status} "
                     f"| {real} | {sim} | {diff} | {'yes' if r.ok else 'NO'} |")
    return "\n".join(lines)
