"""The fast path: a compiled profile, machine and plan as flat arrays for the C simulator.

``simulate`` and ``score`` compile and run a plan in C (simulator/_fastsim.c: the same
rules, in the same order, as simulator/program.py and simulator/engine.py). The C code
reports valid, invalid (rule, op, tensor) and infeasible (what waits, bytes needed and
free, largest residents) runs itself; only the text of an invalid plan's reason comes
from the Python compile. Times come back as integer picoseconds and are converted here
exactly as the reference converts them. A run whose times would pass 2^63 ps comes back
as "overflow" and the caller uses the reference, which has arbitrary-precision integers.
"""
from __future__ import annotations

from array import array

from .compiled import CompiledProfile, Machine
from .engine import Blocked, describe
from .plan import Plan
from .result import Result
from .units import ps_to_us

try:
    from . import _fastsim
except ImportError:  # no C compiler at install time: the reference path is used
    _fastsim = None

OK, INVALID, INFEASIBLE, OVERFLOW = 0, 1, 2, 3
ABI = 2          # the argument and result layout below; _fastsim.ABI must match
_KIND = {"offload": 0, "prefetch": 1, "drop": 2, "recompute": 3}
_TIER = {"host": 0, "ssd": 1, None: 0}
_WHAT = ("start", "op", "recompute", "prefetch", "stuck", "capacity")
_AFTER = ("offload", "prefetch", "wait")
UNBOUNDED = 2**62   # the budget of the run that measures how far over budget a plan goes


def available() -> bool:
    """True when the C simulator of this version was built."""
    return _fastsim is not None and getattr(_fastsim, "ABI", None) == ABI


def pack_machine(machine: Machine) -> tuple:
    """(half duplex, host bytes, SSD bytes, link capacities, routes): each route is
    (stream, first link, second link or -1, latency ps, uses the copy engine), in the
    order prefetch host, offload host, prefetch SSD, offload SSD."""
    routes = []
    for kind, tier in (("prefetch", "host"), ("offload", "host"), ("prefetch", "ssd"), ("offload", "ssd")):
        route = machine.routes.get((kind, tier))
        if route is None:
            routes.append((0, 0, -1, 0, 0))
        else:
            links = route.links + (-1,)
            routes.append((route.stream, links[0], links[1], route.latency_ps, int(route.uses_engine)))
    return (int(machine.half_duplex), machine.host_bytes, machine.ssd_bytes, machine.link_capacity, tuple(routes))


def pack_plan(compiled: CompiledProfile, plan: Plan) -> tuple:
    """The plan's actions, schedule and initial placements as arrays of positions."""
    tindex, oindex = compiled.tensor_index, compiled.op_index
    actions = plan.actions
    initial = list(plan.initial.items())
    order = (array("i", range(len(oindex))) if plan.schedule is None
             else array("i", [oindex[op_id] for op_id in plan.schedule]))
    return (
        bytes([_KIND[a.kind] for a in actions]),
        bytes([_TIER[a.to if a.kind == "offload" else a.source] for a in actions]),
        array("i", [tindex[a.tensor] for a in actions]),
        array("i", [-1 if a.after is None else oindex[a.after] for a in actions]),
        array("i", [-1 if a.before is None else oindex[a.before] for a in actions]),
        order, int(plan.schedule is not None),
        array("i", [tindex[t] for t, _ in initial]),
        bytes([_TIER[tier] for _, tier in initial]),
    )


def _run(compiled: CompiledProfile, machine: Machine, plan: Plan, budget: int) -> tuple:
    return _fastsim.run(compiled.arrays, pack_machine(machine), pack_plan(compiled, plan), budget)


def simulate(compiled: CompiledProfile, machine: Machine, plan: Plan, budget: int) -> Result | None:
    """The full Result from C; None when the run overflows 64 bits (use the reference)
    or the plan is invalid (the reference words its reason). Assumes ``check_plan`` passed."""
    out = _run(compiled, machine, plan, budget)
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
        stall_memory_us=ps_to_us(stall_memory), tail_us=ps_to_us(max(0, end - last_compute_end)),
        peak_bytes=peak, peak_at_us=ps_to_us(peak_at),
        bytes_h2d=link_bytes[0], bytes_d2h=link_bytes[1], bytes_ssd_read=link_bytes[2],
        bytes_ssd_write=link_bytes[3],
        busy_us={"compute": ps_to_us(compute), "h2d": ps_to_us(stream_busy[0]), "d2h": ps_to_us(stream_busy[1]),
                 "ssd_read": ps_to_us(stream_busy[2]), "ssd_write": ps_to_us(stream_busy[3])},
        link_bytes=dict(zip(("pcie_down", "pcie_up", "ssd_read_link", "ssd_write_link"), link_bytes)),
        host_peak_bytes=host_peak, ssd_peak_bytes=ssd_peak, transfers=n_transfers, recomputes=n_recomputes,
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


def score(compiled: CompiledProfile, machine: Machine, plan: Plan, budget: int):
    """A Score from C alone; None when the run overflows 64 bits. An infeasible plan is
    run once more with no budget, to say how many bytes over budget it goes."""
    from .api import Score
    out = _run(compiled, machine, plan, budget)
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
    unbounded = _run(compiled, machine, plan, UNBOUNDED)
    if unbounded[0] == OVERFLOW:
        return None
    blocked = out[16]
    op, tensor = blocked[2], blocked[3]
    return Score(True, False, ps_to_us(end), overhead, peak, max(1, unbounded[7] - budget), progress,
                 f"R{blocked[0]}", ops[op] if op >= 0 else None, tensors[tensor] if tensor >= 0 else None)
