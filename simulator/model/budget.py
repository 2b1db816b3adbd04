"""The budget a plan runs under (R2): a static rule, read before anything runs.

An explicit budget, else the plan's, else the GPU's memory; never above the GPU's
memory, except in UVM mode, where managed memory may be oversubscribed.
"""
from __future__ import annotations

from ..errors import InputError
from ..hardware import Hardware


def resolve_budget(budget_bytes: int | None, plan, hardware: Hardware) -> int:
    """R2: an explicit budget, else the plan's (a ``simulator.plan.Plan``), else the GPU's
    memory; never above the GPU's."""
    budget = budget_bytes if budget_bytes is not None else plan.budget_bytes
    if budget is None:
        return hardware.gpu.memory_bytes
    if plan.memory == "uvm" and budget >= 0:
        return budget   # UVM mode: the budget may pass the GPU's memory (docs/simulation.md, "R2 in UVM mode")
    return check_budget(budget, hardware)


def check_budget(budget: int, hardware: Hardware) -> int:
    """A budget is a byte count from 0 up to the GPU's memory (R2); InputError otherwise."""
    if budget > hardware.gpu.memory_bytes:
        raise InputError("<argument>", "budget",
                         f"{budget} bytes is more than the GPU's memory ({hardware.gpu.memory_bytes} bytes "
                         f"on {hardware.name}) (R2)")
    if budget < 0:
        raise InputError("<argument>", "budget", "must not be negative")
    return budget
