"""The fast path: a compiled profile, machine and plan as flat arrays for the C simulator.

``simulate`` and ``score`` compile and run a plan in C (simulator/fast/_fastsim.c: the same
rules, in the same order, as simulator/compile/program.py and simulator/run/engine.py). The C code
reports valid, invalid (rule, op, tensor) and infeasible (what waits, bytes needed and
free, largest residents) runs itself; only the text of an invalid plan's reason comes
from the Python compile. Times come back as integer picoseconds and are converted here
exactly as the reference converts them. A run whose times would pass 2^63 ps comes back
as "overflow" and the caller uses the reference, which has arbitrary-precision integers.
"""
from __future__ import annotations

from array import array

from ..compile.compiled import CompiledProfile, Machine
from ..plan import Plan
from ..result import Result, Score
from ..run.state import Blocked, describe
from ..units import MAX_COUNT, ps_to_us

try:
    from . import _fastsim
except ImportError:  # no C compiler at install time: the reference path is used
    _fastsim = None

OK, INVALID, INFEASIBLE, OVERFLOW = 0, 1, 2, 3
ABI = 2          # the argument and result layout below; _fastsim.ABI must match
_TIER = {"host": 0, "ssd": 1}   # initial placements (actions are packed by _fastsim.pack_actions)
_WHAT = ("start", "op", "recompute", "prefetch", "stuck", "capacity")
_AFTER = ("offload", "prefetch", "wait")
UNBOUNDED = 2**62   # the budget of the run that measures how far over budget a plan goes


def available() -> bool:
    """True when the C simulator of this version was built."""
    return _fastsim is not None and getattr(_fastsim, "ABI", None) == ABI


def pack_plan(compiled: CompiledProfile, plan: Plan, has_ssd: bool = True) -> tuple:
    """The plan's actions, schedule and initial placements as arrays of positions.

    Raises KeyError or ValueError for anything ``check_plan`` rejects (an unknown id, a
    malformed action, an SSD action without an SSD); the caller then runs ``check_plan``
    to word the error. The C code checks the rest (a schedule that is not a permutation,
    a drop without ``after``, a recompute without ``before``)."""
    tindex, oindex = compiled.tensor_index, compiled.op_index
    kinds, tiers, tensors, afters, befores = _fastsim.pack_actions(plan.actions, tindex, oindex)
    initial = plan.initial
    init_tiers = bytes(_TIER[tier] for tier in initial.values())
    if not has_ssd and (1 in tiers or 1 in init_tiers):
        raise ValueError("an SSD action on a machine without an SSD")
    order = (compiled.profile_order if plan.schedule is None
             else array("i", map(oindex.__getitem__, plan.schedule)))
    return (
        kinds, tiers, _int32(tensors), _int32(afters), _int32(befores), order, int(plan.schedule is not None),
        array("i", map(tindex.__getitem__, initial)),
        init_tiers,
    )


def _int32(packed: bytes) -> array:
    column = array("i")
    column.frombytes(packed)
    return column


def _packed(compiled: CompiledProfile, plan: Plan, has_ssd: bool, check) -> tuple:
    """``pack_plan``, with ``check`` (check_plan) wording any error it finds."""
    if (plan.profile_sha256 and plan.profile_sha256 != compiled.sha256) or len(plan.actions) > MAX_COUNT:
        check()
    try:
        return pack_plan(compiled, plan, has_ssd)
    except (KeyError, ValueError, TypeError):
        check()
        raise


def _run(compiled: CompiledProfile, machine: Machine, packed: tuple, budget: int, check=None) -> tuple:
    """The C call on a packed plan. A ValueError from C (a structural problem packing
    leaves to it) is worded by ``check`` (check_plan) when given."""
    try:
        return _fastsim.run(compiled.arrays, machine.packed, packed, budget)
    except ValueError:
        if check is not None:
            check()
        raise


def simulate(compiled: CompiledProfile, machine: Machine, plan: Plan, budget: int) -> Result | None:
    """The full Result from C; None when the run overflows 64 bits (use the reference),
    the plan is invalid (the reference words its reason) or uses what C does not model
    (``Plan.reference_only``). Assumes ``check_plan`` passed."""
    if plan.reference_only:
        return None
    out = _run(compiled, machine, pack_plan(compiled, plan), budget)
    if out[0] in (OVERFLOW, INVALID):
        return None
    return _result(compiled, machine, out, budget)


def _result(compiled: CompiledProfile, machine: Machine, out: tuple, budget: int) -> Result:
    (status, end, last_compute_end, compute, recompute, stall_data, stall_memory, peak, peak_at,
     stream_busy, link_bytes, host_peak, ssd_peak, n_transfers, n_recomputes, stalls,
     blocked, progress) = out
    ops, tensors = compiled.op_ids, compiled.tensor_ids
    ideal = compiled.ideal_ps
    capacity = machine.link_capacity
    result = Result(
        budget_bytes=budget, iteration_us=ps_to_us(end), ideal_us=ps_to_us(ideal),
        overhead=end / ideal - 1.0 if ideal > 0 else 0.0,
        compute_us=ps_to_us(compute), recompute_us=ps_to_us(recompute),
        stall_us=ps_to_us(stall_data + stall_memory), stall_data_us=ps_to_us(stall_data),
        stall_memory_us=ps_to_us(stall_memory), stall_fault_us=0.0, tail_us=ps_to_us(max(0, end - last_compute_end)),
        peak_bytes=peak, peak_at_us=ps_to_us(peak_at),
        bytes_h2d=link_bytes[0], bytes_d2h=link_bytes[1], bytes_ssd_read=link_bytes[2],
        bytes_ssd_write=link_bytes[3],
        busy_us={"compute": ps_to_us(compute), "h2d": ps_to_us(stream_busy[0]), "d2h": ps_to_us(stream_busy[1]),
                 "ssd_read": ps_to_us(stream_busy[2]), "ssd_write": ps_to_us(stream_busy[3])},
        link_bytes=dict(zip(("pcie_down", "pcie_up", "ssd_read_link", "ssd_write_link"), link_bytes)),
        host_peak_bytes=host_peak, ssd_peak_bytes=ssd_peak, transfers=n_transfers, recomputes=n_recomputes,
        faults=0, fault_bytes=0, evictions=0, writeback_bytes=0,   # UVM plans take fast/uvm.py's path
        stall_by_op={ops[op]: {"data_us": ps_to_us(d), "memory_us": ps_to_us(m)} for op, d, m in stalls},
        progress=progress)
    result.link_utilisation = {name: (nbytes * 10**12 / (cap * end) if end else 0.0)
                               for name, nbytes, cap in zip(result.link_bytes, link_bytes, capacity)}
    if status == INFEASIBLE:
        rule, what, op, tensor, needed, free, residents, tier, after, kind = blocked
        info = Blocked(f"R{rule}", _WHAT[what], -1, tensors[tensor] if tensor >= 0 else None, needed, free,
                       [{"tensor": tensors[t], "bytes": compiled.tensor_bytes[tensors[t]]} for t in residents],
                       ("host", "ssd")[tier] if tier >= 0 else None,
                       (ops[after] if after >= 0 else None) if what == 5 else _AFTER[kind] if kind >= 0 else None)
        result.feasible = False
        result.rule, result.tensor = info.rule, info.tensor
        result.op, result.reason, result.blocked = describe(info, ops[op] if op >= 0 else None)
    return result


def pack_positions(compiled: CompiledProfile, kinds: bytes, tensors: bytes, afters: bytes, befores: bytes,
                   schedule, initial: bytes) -> tuple:
    """``pack_plan``'s tuple for a plan given in positions, every tier host memory:
    ``kinds`` one byte per action in _fastsim's codes (0 offload, 1 prefetch, 2 drop,
    3 recompute); ``tensors``, ``afters`` and ``befores`` (op positions, -1: none) and
    ``initial`` (tensor positions) int32 bytes; ``schedule`` an int32 array of op
    positions, or None for the profile's order. What a search that decodes straight to
    positions (swapadvisor) scores without making Action objects."""
    order = compiled.profile_order if schedule is None else schedule
    return (kinds, bytes(len(kinds)), memoryview(tensors).cast("i"), memoryview(afters).cast("i"),
            memoryview(befores).cast("i"), order, int(schedule is not None), memoryview(initial).cast("i"),
            bytes(len(initial) // 4))


def score(compiled: CompiledProfile, machine: Machine, plan: Plan, budget: int, check):
    """A Score from C alone; None when the run overflows 64 bits. An infeasible plan is
    run once more with no budget, to say how many bytes over budget it goes. ``check``
    is check_plan for this plan: it runs only to word an error packing or C found. None
    too for a plan C does not model (``Plan.reference_only``)."""
    if plan.reference_only:
        return None
    return score_packed(compiled, machine, _packed(compiled, plan, machine.has_ssd, check), budget, check)


def score_packed(compiled: CompiledProfile, machine: Machine, packed: tuple, budget: int, check):
    """``score`` of a plan packed already (``pack_plan`` or ``pack_positions``)."""
    out = _run(compiled, machine, packed, budget, check)
    status = out[0]
    if status == OVERFLOW:
        return None
    ops, tensors = compiled.op_ids, compiled.tensor_ids
    if status == INVALID:
        _, rule, op, tensor = out
        return Score(False, False, 0.0, 0.0, 0, 0, 0.0, f"R{rule}", ops[op] if op >= 0 else None,
                     tensors[tensor] if tensor >= 0 else None)
    end, peak, progress = out[1], out[7], out[17]
    ideal = compiled.ideal_ps
    overhead = end / ideal - 1.0 if ideal > 0 else 0.0
    if status == OK:
        return Score(True, True, ps_to_us(end), overhead, peak)
    unbounded = _run(compiled, machine, packed, UNBOUNDED)
    if unbounded[0] == OVERFLOW:
        return None
    blocked = out[16]
    op, tensor = blocked[2], blocked[3]
    return Score(True, False, ps_to_us(end), overhead, peak, max(1, unbounded[7] - budget), progress,
                 f"R{blocked[0]}", ops[op] if op >= 0 else None, tensors[tensor] if tensor >= 0 else None)
