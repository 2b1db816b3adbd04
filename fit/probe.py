"""One probe of ``fit``: one planner at one size, planned and simulated within the memory,
and when it does not fit, the wall it hit.

A wall is what stops the plan, in the words a user acts on: ``memory`` (over the memory
by how many bytes, at which op), ``op-alone`` (one op's working set is over the memory
even with everything else moved off, and splitting it (R54) does not help), ``host-full``
or ``ssd-full`` (the tier that receives the offloads is full), ``time-limit``, ``trace``
(the model cannot be traced at that size), ``invalid`` or ``error`` (the planner's fault).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from compare.cells import BELOW_FLOOR, ERROR, INFEASIBLE, INVALID, OK, TIMEOUT, Cell, plan_cell

WALLS = ("memory", "op-alone", "host-full", "ssd-full", "time-limit", "trace", "invalid", "error", "limit")


@dataclass(frozen=True)
class Probe:
    """What to run: ``cell`` (compare's unit of work: a planner on a profile and machine
    within a budget, here the memory) on the profile traced at ``units`` steps (``size``
    in samples or tokens), for ``family``; ``allocator`` (R55: ``caching`` or
    ``caching-expandable``) holds what PyTorch's allocator reserves to the memory."""
    units: int
    size: int
    family: str
    cell: Cell
    allocator: str | None = None

    @classmethod
    def make(cls, units: int, size: int, family: str, planner: str, traced, hardware: str, hardware_name: str,
             memory_bytes: int, seed: int = 0, time_limit: float | None = None, allocator: str | None = None):
        """The probe of ``planner`` on ``traced`` (a ``traces.Traced``); the baseline runs no
        op in chunks (R54 is a technique)."""
        cell = Cell(traced.path, traced.name, traced.sha256, hardware, hardware_name, planner, f"{memory_bytes}B",
                    memory_bytes, False, seed, time_limit, split_ops=family != "baseline")
        return cls(units, size, family, cell, allocator)

    @property
    def planner(self) -> str:
        return self.cell.planner

    @property
    def memory_bytes(self) -> int:
        return self.cell.budget_bytes

    @property
    def key(self) -> str:
        """Identifies a finished probe across runs: same profile content, machine, planner,
        memory, seed, time limit and allocator model."""
        cell = self.cell
        text = json.dumps([cell.profile_sha256, cell.hardware_name, cell.planner, cell.budget_bytes, cell.seed,
                           cell.time_limit] + ([self.allocator] if self.allocator else []))
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    @property
    def plan_file(self) -> str:
        """The plan's file under the output folder."""
        name = f"{self.cell.profile_name}__{self.cell.planner}"
        return "plans/" + "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name) + ".json"


def run_probe(probe: Probe) -> tuple[dict, str | None]:
    """Plan and simulate one probe (a worker runs this): its row and the plan's JSON text
    (None when there is no plan that runs). Never raises for a planner's failure."""
    from simulator.plan import plan_json

    row, planned, detail = plan_cell(probe.cell)
    out = {"key": probe.key, "units": probe.units, "size": probe.size, "planner": probe.planner,
           "family": probe.family, "profile": probe.cell.profile_name, "sha256": probe.cell.profile_sha256,
           "memory_bytes": probe.memory_bytes, "status": row["status"], "fits": row["status"] == OK,
           "iteration_us": row["iteration_us"], "peak_bytes": row["peak_bytes"],
           "planning_seconds": row["planning_seconds"], "fallback": row["fallback"],
           "splits": None, "plan_file": None, "wall": None, "wall_op": None, "over_bytes": None,
           "wall_text": None, "reserved_bytes": None}
    result = planned.result if planned is not None else None
    if planned is not None:
        out["splits"] = planned.plan.planner.notes.get("splits") if planned.plan.planner.notes else None
    if row["status"] == OK and probe.allocator:    # R55: what the caching allocator reserves must fit too
        result = _reserved(probe, planned.plan)
        out["reserved_bytes"] = result.reserved_bytes
        if not result.ok:
            row = dict(row, status=INFEASIBLE if result.valid else INVALID, error=result.reason)
            out.update(status=row["status"], fits=False, iteration_us=None)
    if row["status"] == OK:
        out["plan_file"] = probe.plan_file
        return out, plan_json(planned.plan)
    out.update(wall_of(row, result, detail, probe))
    return out, None


def _reserved(probe: Probe, plan):
    """The plan simulated with the probe's allocator model (R55) within the memory."""
    from compare.cells import cell_hardware
    from simulator.api import simulate
    return simulate(planned_profile(probe), plan, cell_hardware(probe.cell.hardware), probe.memory_bytes,
                    allocator=probe.allocator)


def wall_of(row: dict, result, detail: dict, probe: Probe) -> dict:
    """``wall``, ``wall_op``, ``over_bytes`` and ``wall_text`` of a probe that does not fit
    (``result``: its simulated Result, None when there is no plan)."""
    status = row["status"]
    memory = probe.memory_bytes
    if status == BELOW_FLOOR:
        floor, op = detail.get("floor_bytes"), detail.get("op")
        over = None if floor is None else floor - memory
        text = (f"op {op} alone needs {floor} B with what must stay on the GPU, {over} B over the memory"
                + (" (split into chunks where it can be: R54)" if floor is not None else ""))
        return {"wall": "op-alone", "wall_op": op, "over_bytes": over, "wall_text": text}
    if status == TIMEOUT:
        return {"wall": "time-limit", "wall_text": row["error"]}
    if status == INFEASIBLE and result is not None:
        blocked = result.blocked or {}
        tier = blocked.get("tier")
        if tier is not None:
            return {"wall": f"{'ssd' if 'ssd' in tier else 'host'}-full", "wall_op": result.op,
                    "wall_text": result.reason}
        if probe.family == "baseline" and not probe.allocator:   # nothing moves: the no-swap peak says it all
            profile = planned_profile(probe)
            over = profile.peak_bytes - memory
            op = profile.peak_op
            return {"wall": "memory", "wall_op": op, "over_bytes": over,
                    "wall_text": f"the no-swap peak is {profile.peak_bytes} B at op {op}, {over} B over the memory"}
        needed, free = blocked.get("needed_bytes"), blocked.get("free_bytes")
        over = None if needed is None or free is None else needed - free
        if blocked.get("grow_bytes") is not None:     # R55: the segment it would reserve, on what is reserved
            over = blocked["reserved_bytes"] + blocked["grow_bytes"] - memory
        return {"wall": "memory", "wall_op": result.op, "over_bytes": over, "wall_text": result.reason}
    if status == INVALID:
        return {"wall": "invalid", "wall_op": result.op if result else None, "wall_text": row["error"]}
    assert status == ERROR or result is None, status
    return {"wall": "error", "wall_text": row["error"]}


def planned_profile(probe: Probe):
    """The probe's profile (as its cell loaded it: read once per worker)."""
    from compare.cells import cell_profile
    return cell_profile(probe.cell.profile, probe.cell.profile_sha256)
