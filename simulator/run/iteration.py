"""One iteration of a compiled program in the Python reference: ``run_program`` runs an
explicit-mode program on simulator/run/engine.py's loop, and a UVM program as R36's
two iterations (simulator/run/uvm.py). It is the one place that picks the run by mode;
simulator/api.py calls it where the C paths do not apply."""
from __future__ import annotations

from ..compile.compiled import CompiledProfile, Machine
from ..compile.program import Program
from ..result import Result
from .engine import _Run
from .uvm import _run_uvm


def run_program(compiled: CompiledProfile, program: Program, machine: Machine, budget: int,
                record: bool = False, names: list[tuple[str, str, str]] | None = None,
                allocator: str | None = None) -> Result:
    """Run a compiled program in simulated time and report the Result (valid plans only:
    validity was decided by the compile). ``names``: (op id, kernel, phase) per profile
    op, for the timeline when ``record``; ``allocator``: an online allocator model for a
    plan without a placement (R51), or PyTorch's caching allocator (R55)."""
    if program.uvm:
        return _run_uvm(compiled, program, machine, budget, record, names)
    return _Run(compiled, program, machine, budget, record, names, allocator).run()
