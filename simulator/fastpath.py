"""The fast path: pack a compiled Program into flat arrays for the C run loop.

``run_fast`` returns a Result for a run that succeeds, or None when the C module is not
built or the run is invalid or infeasible; the caller then runs the pure-Python
reference (engine._Run), which explains why. Both follow the same rules in the same
order, and tests check that they agree.
"""
from __future__ import annotations

from array import array

from .hardware import Hardware
from .profile import Profile
from .program import Drop, Program, Sequence
from .result import Result

try:
    from . import _fastsim
except ImportError:  # no C compiler at install time: the reference path is used
    _fastsim = None

_QUEUE_BIT = {"h2d": 1, "d2h": 2, "ssd_read": 4, "ssd_write": 8}
_MASK = {queues: sum(_QUEUE_BIT[q] for q in queues)
         for queues in (("h2d",), ("d2h",), ("h2d", "ssd_read"), ("d2h", "ssd_write"))}
_TIER = {"host": 0, "ssd": 1}


def available() -> bool:
    """True when the C run loop was built."""
    return _fastsim is not None


def _tensor_index(profile: Profile) -> tuple[dict[str, int], array]:
    memo = profile.__dict__.get("_fast_tensors")
    if memo is None:
        memo = ({t.id: i for i, t in enumerate(profile.tensors)}, array("q", [t.bytes for t in profile.tensors]))
        profile.__dict__["_fast_tensors"] = memo
    return memo


def _csr(rows, index=None) -> tuple[array, array]:
    offsets, values = array("i", [0]), array("i")
    for row in rows:
        values.extend(row if index is None else [index[x] for x in row])
        offsets.append(len(values))
    return offsets, values


def _pairs(sparse: dict[int, list], code) -> tuple[array, array]:
    """(item, value) pairs of a sparse item -> list map; C groups them by item."""
    items, values = array("i"), array("i")
    for k, entries in sparse.items():
        for entry in entries:
            items.append(k)
            values.append(code(entry))
    return items, values


def _pack_sequence(seq: Sequence, index: dict[str, int]) -> tuple:
    memo = seq.__dict__.get("_fast_pack")
    if memo is None:
        memo = (array("q", seq.alloc_bytes), array("q", seq.workspace), array("d", seq.time_us),
                array("i", [-1 if t is None else index[t] for t in seq.recomputed]),
                *_csr(seq.allocs, index), *_csr(seq.frees, index))
        seq.__dict__["_fast_pack"] = memo
    return memo


def run_fast(profile: Profile, program: Program, hardware: Hardware, budget: int) -> Result | None:
    """Run ``program`` in C; None if unavailable or the run is not both valid and feasible."""
    if _fastsim is None:
        return None
    index, tensor_bytes = _tensor_index(profile)
    seq = program.seq
    n = len(seq)
    transfers = program.transfers
    position = {id(t): j for j, t in enumerate(transfers)}
    drops: list[Drop] = []

    def action_code(action) -> int:
        if isinstance(action, Drop):
            drops.append(action)
            return -len(drops)
        return position[id(action)]

    alloc_bytes, workspace, time_us, recomputed, alloc_off, alloc_idx, free_off, free_idx = _pack_sequence(seq, index)
    wait_item, wait_idx = _pairs(program.waits, lambda t: position[id(t)])
    rel_item, rel_idx = _pairs(program.releases, lambda t: position[id(t)])
    act_item, act_code = _pairs(program.actions, action_code)
    start_codes = array("i", [position[id(t)] for t in program.start_actions])
    drop_off, drop_idx = _csr([[position[id(t)] for t in d.offloads] for d in drops])
    ts = transfers  # one comprehension per array: faster here than appending field by field
    t_kind = array("b", [t.kind == "prefetch" for t in ts])
    t_tensor = array("i", [index[t.tensor] for t in ts])
    t_source = array("i", [-1 if t.source is None else position[id(t.source)] for t in ts])
    t_last_reader = array("i", [t.last_reader for t in ts])
    t_mask = array("b", [_MASK[t.queues] for t in ts])
    t_tier = array("b", [_TIER[t.tier] for t in ts])
    t_bytes = array("q", [t.nbytes for t in ts])
    t_duration = array("d", [t.duration_us for t in ts])
    copies = list(program.initial_copies.items())
    ssd = hardware.ssd
    out = _fastsim.run(
        n, len(transfers), len(tensor_bytes), len(drops), budget, hardware.host.memory_bytes,
        ssd.capacity_bytes if ssd else 0, 1 if hardware.pcie.duplex == "half" else 0,
        tensor_bytes, alloc_bytes, workspace, time_us, recomputed, alloc_off, alloc_idx, free_off, free_idx,
        wait_item, wait_idx, rel_item, rel_idx, act_item, act_code,
        t_kind, t_tensor, t_source, t_last_reader, t_mask, t_tier, t_bytes, t_duration,
        array("i", [index[d.tensor] for d in drops]), drop_off, drop_idx, start_codes,
        array("i", [index[t] for t in program.initial_gpu]),
        array("i", [index[t] for t, _ in copies]), array("b", [_TIER[tier] for _, tier in copies]),
    )
    (status, _now, last_compute_end, last_transfer_end, compute_us, recompute_us, stall_data, stall_memory,
     peak_at, peak, b_h2d, b_d2h, b_sr, b_sw, u_h2d, u_d2h, u_sr, u_sw, host_peak, ssd_peak, stalls) = out
    if status != 0:
        return None
    stall_by_op: dict[str, dict] = {}
    per_item = array("d")
    per_item.frombytes(stalls)
    for k in range(n):
        data_wait, memory_wait = per_item[2 * k], per_item[2 * k + 1]
        if data_wait > 0 or memory_wait > 0:
            entry = stall_by_op.setdefault(seq.group[k], {"data_us": 0.0, "memory_us": 0.0})
            entry["data_us"] += data_wait
            entry["memory_us"] += memory_wait
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
        host_peak_bytes=host_peak, ssd_peak_bytes=ssd_peak, transfers=len(transfers),
        recomputes=sum(1 for t in seq.recomputed if t is not None), stall_by_op=stall_by_op)
