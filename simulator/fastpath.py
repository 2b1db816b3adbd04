"""The fast path: pack a profile and a plan into flat arrays for the C simulator.

``simulate_fast`` compiles and runs a plan in C (simulator/_fastsim.c: the same rules
as simulator/program.py and the reference run loop of simulator/engine.py). It returns
a Result for a plan that is valid and runs within its budget, or None when the C module
is not built or the plan is invalid or infeasible; the caller then runs the pure-Python
reference, which explains why. Tests check that both agree.
"""
from __future__ import annotations

from array import array

from .hardware import Hardware
from .plan import Plan
from .profile import Profile
from .program import link_speed
from .result import Result

try:
    from . import _fastsim
except ImportError:  # no C compiler at install time: the reference path is used
    _fastsim = None

_KIND = {"offload": 0, "prefetch": 1, "drop": 2, "recompute": 3}
_TIER = {"host": 0, "ssd": 1, None: 0}


def available() -> bool:
    """True when the C simulator was built."""
    return _fastsim is not None


class _PackedProfile:
    """A profile as the C code reads it, built once per profile."""

    def __init__(self, profile: Profile):
        tensors, ops = profile.tensors, profile.ops
        self.tensor_index = {t.id: i for i, t in enumerate(tensors)}
        self.op_index = {**profile.op_index, None: -1}
        index = self.tensor_index
        self.arrays = (
            array("q", [t.bytes for t in tensors]),
            bytes(t.persistent for t in tensors),
            array("i", [-1 if profile.producer[t.id] is None else profile.producer[t.id] for t in tensors]),
            array("d", [op.time_us for op in ops]),
            array("q", [op.workspace_bytes for op in ops]),
            *_csr([[index[t] for t in op.inputs] for op in ops]),
            *_csr([[index[t] for t in op.updates] for op in ops]),
            *_csr([[index[t] for t in dict.fromkeys(op.outputs)] for op in ops]),
        )
        self.profile_order = array("i", range(len(ops)))


def _csr(rows: list[list[int]]) -> tuple[array, array]:
    offsets, values = array("i", [0]), array("i")
    for row in rows:
        values.extend(row)
        offsets.append(len(values))
    return offsets, values


def _packed(profile: Profile) -> _PackedProfile:
    memo = profile.__dict__.get("_fast_pack")
    if memo is None:
        memo = profile.__dict__["_fast_pack"] = _PackedProfile(profile)
    return memo


def simulate_fast(profile: Profile, plan: Plan, hardware: Hardware, budget: int) -> Result | None:
    """Compile and run ``plan`` in C; None if unavailable or the plan is not both valid
    and feasible. Assumes ``check_plan`` passed."""
    if _fastsim is None:
        return None
    packed = _packed(profile)
    tindex, oindex = packed.tensor_index, packed.op_index
    actions = plan.actions
    order = (packed.profile_order if plan.schedule is None
             else array("i", [oindex[op_id] for op_id in plan.schedule]))
    initial = list(plan.initial.items())
    ssd = hardware.ssd
    links = [link_speed(hardware, kind, tier) for kind in ("offload", "prefetch") for tier in ("host", "ssd")]
    out = _fastsim.simulate(
        len(profile.ops), len(profile.tensors), len(actions), len(initial),
        ssd is not None, hardware.pcie.duplex == "half", budget, hardware.host.memory_bytes,
        ssd.capacity_bytes if ssd else 0,
        tuple(latency for latency, _ in links), tuple(rate for _, rate in links),
        *packed.arrays,
        bytes([_KIND[a.kind] for a in actions]),
        bytes([_TIER[a.to if a.kind == "offload" else a.source] for a in actions]),
        array("i", [tindex[a.tensor] for a in actions]),
        array("i", [oindex[a.after] for a in actions]),
        array("i", [oindex[a.before] for a in actions]),
        order,
        array("i", [tindex[t] for t, _ in initial]),
        bytes([_TIER[tier] for _, tier in initial]),
    )
    if out[0] != 0:
        return None
    (_, last_compute_end, last_transfer_end, compute_us, recompute_us, stall_data, stall_memory, peak_at, peak,
     b_h2d, b_d2h, b_sr, b_sw, u_h2d, u_d2h, u_sr, u_sw, host_peak, ssd_peak, n_transfers, n_recomputes,
     stalls) = out
    ops = profile.ops
    stall_by_op = {ops[op].id: {"data_us": data, "memory_us": memory} for op, data, memory in stalls}
    end = max(last_compute_end, last_transfer_end)
    ideal = profile.ideal_us
    return Result(
        budget_bytes=budget, iteration_us=end, ideal_us=ideal,
        overhead=end / ideal - 1.0 if ideal > 0 else 0.0,
        compute_us=compute_us, recompute_us=recompute_us, stall_us=stall_data + stall_memory,
        stall_data_us=stall_data, stall_memory_us=stall_memory, tail_us=max(0.0, end - last_compute_end),
        peak_bytes=peak, peak_at_us=peak_at, bytes_h2d=b_h2d, bytes_d2h=b_d2h, bytes_ssd_read=b_sr,
        bytes_ssd_write=b_sw,
        busy_us={"compute": compute_us, "h2d": u_h2d, "d2h": u_d2h, "ssd_read": u_sr, "ssd_write": u_sw},
        host_peak_bytes=host_peak, ssd_peak_bytes=ssd_peak, transfers=n_transfers,
        recomputes=n_recomputes, stall_by_op=stall_by_op)
