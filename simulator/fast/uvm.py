"""UVM mode's fast path: a compiled UVM program as flat arrays for simulator/fast/_fastuvm.c.

``run`` takes a UVM program compiled in Python (simulator/compile/uvm.py ``compile_uvm``:
its rules, the wording of a broken one, and the sequence's touches as flat arrays) and
runs the two iterations of R36 in C, which does what simulator/run/uvm.py's ``_UvmRun`` does with
simulator/run/uvm_memory.py's ``UvmMemory``, in the same order and with the same integer arithmetic. The Result is built
here exactly as ``_UvmRun._fill`` builds it, times converted with ``ps_to_us``.

The C code covers full-duplex PCIe with host backing: ``applies`` says so, and
simulator/api.py (the one place that picks a path) runs the Python reference elsewhere: SSD backing with its page cache
(R35), half-duplex PCIe, a caching allocator's pool (R38), and a run whose times would
pass 2^61 ps or whose byte counts could pass 2^61 (codecs need no case: compile_uvm
finds them invalid in UVM mode).
``counts`` says how often each way was taken.
"""
from __future__ import annotations

from array import array
from collections import Counter

from ..compile.compiled import CompiledProfile, Machine
from ..compile.program import Drop, Program
from ..model.links import LINKS, PCIE_DOWN, PCIE_UP
from ..result import Result
from ..run.state import Blocked, describe
from ..units import ps_to_us

try:
    from . import _fastuvm
except ImportError:  # no C compiler at install time: the reference runs every UVM plan
    _fastuvm = None

OK, INFEASIBLE, OVERFLOW, UNSUPPORTED = 0, 2, 3, 4
ABI = 2            # the argument and result layout below; _fastuvm.ABI must match
_LIMIT = 2**61     # bytes the C run may count (its sums stay in 64 bits)
_STUCK, _ALONE, _CAPACITY = range(3)              # what an infeasible run found blocked
_AFTER = ("offload", "prefetch", "wait")        # a stuck run's first waiting transfer, or none

counts: Counter = Counter()   # "c": runs done in C; "reference": runs left to the Python reference


def available() -> bool:
    """True when the C UVM run of this version was built."""
    return _fastuvm is not None and getattr(_fastuvm, "ABI", None) == ABI


def applies(program: Program, machine: Machine, budget: int) -> bool:
    """Whether the C run covers this UVM program: full-duplex PCIe, host backing, no
    caching allocator, and byte counts that stay below 2^61 (simulator/api.py asks)."""
    bound = program.seq.uvm.bound
    return not (machine.half_duplex or program.backing != "host" or machine.uvm.caching or budget > 2 * _LIMIT
                or bound * (len(program.seq) + len(program.transfers) + 4) >= _LIMIT)


def run(compiled: CompiledProfile, program: Program, machine: Machine, budget: int) -> Result | None:
    """``run_program`` of a compiled UVM program in C, where ``applies``; None when its
    times would pass 2^61 ps (the caller then runs the reference)."""
    out = _fastuvm.run(*pack(compiled, program, machine), budget)
    if out[0] not in (OK, INFEASIBLE):
        counts["reference"] += 1
        return None
    counts["c"] += 1
    return _result(compiled, machine, program, budget, out)


def pack(compiled: CompiledProfile, program: Program, machine: Machine) -> tuple:
    """The arguments of ``_fastuvm.run`` but the budget: the sequence's arrays (made by
    the compile), the program's, the tensors' and the machine's."""
    arrays = program.seq.uvm.arrays     # the sequence's arrays (simulator/compile/uvm.py)
    uvm = machine.uvm
    down = machine.link_capacity[PCIE_DOWN]
    rate, bulk = uvm.paging_rates(down)
    packed_machine = (uvm.block, uvm.fault_latency_ps, uvm.batch_blocks, machine.link_capacity[PCIE_DOWN],
                      machine.link_capacity[PCIE_UP], machine.route("prefetch", "host").latency_ps,
                      machine.route("offload", "host").latency_ps, machine.host_bytes,
                      uvm.page if uvm.page else uvm.block, max(1, uvm.big_page // uvm.page) if uvm.page else 1,
                      uvm.batch_faults if uvm.page else max(1, uvm.batch_blocks), uvm.threshold if uvm.page else 100,
                      rate, uvm.kernel_fault_ps, uvm.first_touch_ps, bulk, uvm.fault_ramp)
    tensors = (compiled.arrays[0], compiled.arrays[1], compiled.arrays[15])
    return arrays, _program(program, compiled), tensors, packed_machine


def _program(program: Program, compiled: CompiledProfile) -> tuple:
    """The plan's part: per transfer (prefetch or offload, tensor, source offload, last
    reader of its window), (item, transfer) pairs of the waits (R6) and releases (R11),
    (item, code) pairs of the actions after each item and the start actions' codes (a
    transfer's index, or ~tensor for a drop), and per tensor the ``initial`` and
    read-mostly flags."""
    index = compiled.tensor_index
    transfers = program.transfers

    def pairs(sparse: dict, code) -> tuple[array, array]:
        items, values = array("i"), array("i")
        for k, entries in sparse.items():
            for entry in entries:
                items.append(k)
                values.append(code(entry))
        return items, values

    def action(entry) -> int:
        return ~index[entry.tensor] if type(entry) is Drop else entry.index

    def transfer(entry) -> int:
        return entry.index

    initial, read_mostly = bytearray(len(index)), bytearray(len(index))
    for tid in program.initial_copies:
        initial[index[tid]] = 1
    for tid in program.read_mostly:
        read_mostly[index[tid]] = 1
    return (bytes(x.kind == "prefetch" for x in transfers), array("i", [index[x.tensor] for x in transfers]),
            array("i", [x.source for x in transfers]), array("i", [x.last_reader for x in transfers]),
            *pairs(program.waits, transfer), *pairs(program.releases, transfer), *pairs(program.actions, action),
            array("i", map(action, program.start_actions)), bytes(initial), bytes(read_mostly))


def _result(compiled: CompiledProfile, machine: Machine, program: Program, budget: int, out: tuple) -> Result:
    """The Result as ``_UvmRun.run`` and ``_UvmRun._fill`` make it from the run's numbers."""
    (status, now, last_compute_end, last_transfer_end, compute, stall_data, stall_memory, stall_fault, peak, peak_at,
     busy_h2d, busy_d2h, bytes_down, bytes_up, host_peak, faults, fault_bytes, evictions, writeback_bytes, done,
     stalls, blocked) = out
    seq = program.seq
    result = Result(budget_bytes=budget, ideal_us=ps_to_us(compiled.ideal_ps), transfers=len(program.transfers),
                    recomputes=0)
    if status == INFEASIBLE:
        _infeasible(result, compiled, seq, blocked)
    end = max(last_compute_end, 0, last_transfer_end, now if not result.ok else 0)
    ideal = compiled.ideal_ps
    link_bytes = [bytes_down, bytes_up, 0, 0]
    result.iteration_us = ps_to_us(end)
    result.overhead = end / ideal - 1.0 if ideal > 0 else 0.0
    result.compute_us = ps_to_us(compute)
    result.recompute_us = ps_to_us(0)
    result.cpu_us = ps_to_us(0)
    result.stall_data_us = ps_to_us(stall_data)
    result.stall_memory_us = ps_to_us(stall_memory)
    result.stall_us = ps_to_us(stall_data + stall_memory + stall_fault)
    result.stall_fault_us = ps_to_us(stall_fault)
    result.tail_us = ps_to_us(max(0, end - last_compute_end))
    result.peak_bytes, result.peak_at_us = peak, ps_to_us(peak_at)
    result.bytes_h2d, result.bytes_d2h, result.bytes_ssd_read, result.bytes_ssd_write = link_bytes
    result.busy_us = {"compute": result.compute_us, "h2d": ps_to_us(busy_h2d), "d2h": ps_to_us(busy_d2h),
                      "ssd_read": ps_to_us(0), "ssd_write": ps_to_us(0)}
    result.link_bytes = dict(zip(LINKS, link_bytes))
    result.link_utilisation = {name: (nbytes * 10**12 / (cap * end) if end else 0.0)
                               for name, nbytes, cap in zip(LINKS, link_bytes, machine.link_capacity)}
    result.progress = done / len(seq) if len(seq) else 1.0
    result.host_peak_bytes, result.ssd_peak_bytes = host_peak, 0
    result.faults, result.fault_bytes = faults, fault_bytes
    result.evictions, result.writeback_bytes = evictions, writeback_bytes
    result.stall_by_op = {seq.group[k]: {"data_us": ps_to_us(d), "memory_us": ps_to_us(m), "fault_us": ps_to_us(f)}
                          for k, d, m, f in stalls}
    return result


def _infeasible(result: Result, compiled: CompiledProfile, seq, blocked: tuple) -> None:
    """``_Run._infeasible`` of what C found blocked: R10 (stuck, or an item that alone does
    not fit) or R19 (the backing tier's capacity)."""
    what, item, tensor, needed, free, after, residents = blocked
    ids = compiled.tensor_ids
    largest = [{"tensor": ids[t], "bytes": nbytes} for t, nbytes in residents]
    if what == _STUCK:
        info = Blocked("R10", "stuck", item, ids[tensor] if tensor >= 0 else None, needed, free, largest,
                       after=_AFTER[after])
    elif what == _ALONE:
        info = Blocked("R10", "alone", item, None, needed, free, largest)
    else:
        info = Blocked("R19", "capacity", -1, None, needed, free, [], "host", seq.group[item] if item >= 0 else None)
    result.feasible = False
    result.rule = info.rule
    result.tensor = info.tensor
    result.op, result.reason, result.blocked = describe(info, seq.group[info.item] if info.item >= 0 else None)
