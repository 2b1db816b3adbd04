"""What every run of one iteration keeps and does the same way, whatever its memory
policy: the compute and CPU streams (R5, R6, R24), the copy streams and links (R1, R17,
R18), enqueueing in order (R9, R53), why a run stops (R10, R19: ``Blocked``) and the
Result's common figures. The explicit run (simulator/run/engine.py ``_Run``) and the UVM
run (simulator/run/uvm.py ``_UvmRun``) each build on it with their own memory and their
own loop; neither overrides the other.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..compile.compiled import CompiledProfile, Machine
from ..compile.program import Program, Transfer
from ..model.links import COMM_LINKS, LINKS, STREAMS
from ..result import Result, Span, Timeline
from ..units import ps_to_us
from .caching import describe_short
from .resources import Links, Stream


@dataclass
class Blocked:
    """Why a valid plan cannot go on (R10, R19): what waits, for how many bytes."""
    rule: str
    what: str                 # op | recompute | prefetch | collective (wait for room) | stuck | start | capacity
    item: int                 # the compute head (-1: none, or at start)
    tensor: str | None
    needed: int
    free: int
    residents: list[dict]
    tier: str | None = None   # capacity: the tier
    after: str | None = None  # capacity: the offload's after op; stuck / prefetch: the transfer's kind
    arena: dict | None = None  # R50, R51: the allocation that waits, and who holds its range (or fragmented)


def describe(blocked: Blocked, op: str | None) -> tuple[str | None, str, dict]:
    """(op, reason, blocked dict) of an infeasible result whose compute head is ``op``:
    the same text from the reference and the C path."""
    shown = ", ".join(f"{r['tensor']} ({r['bytes']} B)" for r in blocked.residents) or "none"
    if blocked.what == "capacity":
        op = blocked.after
        reason = (f"{blocked.tier} capacity exceeded: {blocked.needed} bytes needed, {blocked.free} available")
        return op, reason, {"tier": blocked.tier}
    if blocked.what == "arena":
        reason = (f"the placement's arena ({blocked.needed} bytes) is larger than the budget ({blocked.free} "
                  "bytes)")
        return None, reason, {"arena_bytes": blocked.needed, "budget_bytes": blocked.free}
    if blocked.what == "start":
        what = f"at start: persistent tensor {blocked.tensor!r} does not fit"
    elif blocked.what == "op":
        what = f"op {op!r} waits for memory"
    elif blocked.what == "alone":   # UVM mode (R32): not even evicting every unpinned block makes room
        what = f"op {op!r} alone does not fit, with every unpinned block evicted (R32)"
    elif blocked.what == "recompute":
        what = f"recompute of {blocked.tensor!r} before {op!r} waits for memory"
    elif blocked.what == "collective":   # R58: a collective waits for room for its outputs
        what = f"collective {blocked.after!r} waits for memory" + (f" (op {op!r} waits)" if op else "")
    elif blocked.what == "prefetch":
        what = f"the prefetch of {blocked.tensor!r} waits for memory" + (f" (op {op!r} waits)" if op else "")
    else:
        what = f"the {blocked.after} of {blocked.tensor!r} cannot start" + (f" (op {op!r} waits)" if op else "")
    reason = f"{what}: needs {blocked.needed} bytes, {blocked.free} free; largest residents: {shown}"
    extra = {}
    if blocked.arena is not None:        # R50, R51
        extra = dict(blocked.arena)
        if "reserved_bytes" in extra:      # R55: the caching allocator
            extra["fragmented"] = blocked.needed <= blocked.free
            reason += describe_short(extra, extra["fragmented"])
        elif "held_by" in extra:
            start, end = extra["range"]
            reason += f"; allocation {extra['allocation']!r} at [{start}, {end}) is held by {extra['held_by']!r}"
        elif blocked.needed <= blocked.free:
            reason += (f"; allocation {extra['allocation']!r} finds no free range (fragmented: enough bytes are "
                       "free, in pieces)")
        else:                              # short of bytes, not of a range
            extra.pop("fragmented", None)
    return op, reason, {"waiting": what, "needed_bytes": blocked.needed, "free_bytes": blocked.free,
                        "largest_residents": blocked.residents, **extra}


class _Infeasible(Exception):
    def __init__(self, blocked: Blocked):
        super().__init__(blocked.what)
        self.blocked = blocked


class RunState:
    """The run state both runs share, and their common steps."""

    def __init__(self, compiled: CompiledProfile, program: Program, machine: Machine, record: bool, names):
        self.compiled = compiled
        self.program = program
        self.seq = program.seq
        self.transfers = program.transfers
        self.now = 0
        n = len(program.transfers)
        self.enqueued_at = [-1] * n       # enqueue order (R1, R9)
        self.start = [-1] * n
        self.latency_until: dict[int, int] = {}   # transfer -> ps its latency ends, while it waits it
        self.ended = [False] * n
        self.enqueue_count = 0
        self.on_comm = program.on_comm     # R56: a rank's collectives, with their two links after LINKS
        self.link_names = LINKS + COMM_LINKS if program.on_comm else LINKS
        self.links = Links(machine.link_capacity + tuple(program.comm_capacity) if program.on_comm
                           else machine.link_capacity)
        self.link_bytes = [0] * len(self.link_names)
        self.streams = [Stream(name) for name in STREAMS]
        self.engine_holder: int | None = None   # half duplex: the transfer holding the copy engine
        self.pending_offloads: dict[str, int] = {}   # tensor -> offloads enqueued or copying (R7)
        self.dead_pending: set[str] = set()
        # the compute stream (GPU items only) and the CPU stream (R24)
        self.on_cpu = program.on_cpu
        self.done = bytearray(len(self.seq))
        self.head = self._next_gpu_item(0)
        self.cpu_items = sorted(program.on_cpu)
        self.cpu_pos = 0
        self.cpu_running_until: int | None = None
        self.cpu_busy_ps = 0
        self.last_cpu_end = 0
        self.comm_items = sorted(program.on_comm)   # the comm stream (R56-R58)
        self.comm_pos = 0
        self.comm_running: int | None = None        # the collective item on the interconnect
        self.comm_latency_until: int | None = None  # ps its ring steps' latency ends
        self.comm_started_at = 0
        self.comm_busy_ps = 0
        self.last_comm_end = 0
        self.running_until: int | None = None
        self.ready_at = 0                  # when the head's predecessor ended
        self.data_ready_at: int | None = None
        self.last_compute_end = 0
        self.last_transfer_end = 0
        self.compute_ps = 0
        self.recompute_ps = 0
        self.codec_ps = 0
        self.stall_data = 0
        self.stall_memory = 0
        self.stall_by_op: dict[str, list[int]] = {}
        # the timeline
        self.record = record
        self.names = names
        self.spans: list[Span] = []
        if record:
            self.links.samples = [(0, (0,) * len(self.link_names))]

    def _next_gpu_item(self, k: int) -> int:
        """The first item at or after k that runs on the GPU (not the CPU's, R24, nor a
        collective, R56)."""
        while k < len(self.seq) and (k in self.on_cpu or k in self.on_comm):
            k += 1
        return k

    def _group(self, transfer: Transfer) -> tuple:
        """The transfer and the members of the group it leads (R53)."""
        return (transfer,) + tuple(self.transfers[m] for m in transfer.members) if transfer.members else (transfer,)

    def _enqueue(self, transfer: Transfer) -> None:
        """R1: the transfer joins its stream's FIFO queue, in enqueue order."""
        self.enqueued_at[transfer.index] = self.enqueue_count
        self.enqueue_count += 1
        self.streams[transfer.route.stream].queue.append(transfer.index)
        for member in self._group(transfer):       # R53: a group queues as one transfer
            self.enqueued_at[member.index] = self.enqueued_at[transfer.index]
            if member.kind == "offload":
                self.pending_offloads[member.tensor] = self.pending_offloads.get(member.tensor, 0) + 1

    def _infeasible(self, result: Result, exc: _Infeasible) -> None:
        result.feasible = False
        result.rule = exc.blocked.rule
        result.tensor = exc.blocked.tensor
        item = exc.blocked.item
        result.op, result.reason, result.blocked = describe(exc.blocked, self.seq.group[item] if item >= 0 else None)

    def _fill_common(self, result: Result) -> None:
        """The figures every run reports the same way: times (the iteration ends with the last
        of compute, CPU ops and transfers, R22), stalls, streams and links."""
        end = max(self.last_compute_end, self.last_cpu_end, self.last_transfer_end, self.last_comm_end,
                  self.now if not result.ok else 0)
        machine_links = self.links.capacity
        result.iteration_us = ps_to_us(end)
        result.overhead = end / self.compiled.ideal_ps - 1.0 if self.compiled.ideal_ps > 0 else 0.0
        result.compute_us = ps_to_us(self.compute_ps)
        result.recompute_us = ps_to_us(self.recompute_ps)
        result.cpu_us = ps_to_us(self.cpu_busy_ps)
        result.codec_us = ps_to_us(self.codec_ps)
        result.lossy_tensors = list(self.program.lossy)
        result.stall_data_us = ps_to_us(self.stall_data)
        result.stall_memory_us = ps_to_us(self.stall_memory)
        result.stall_us = ps_to_us(self.stall_data + self.stall_memory)
        result.tail_us = ps_to_us(max(0, end - self.last_compute_end))
        streams = self.streams
        # R18: a link's bytes; an SSD copy counts on its PCIe direction and on the SSD
        result.bytes_h2d, result.bytes_d2h, result.bytes_ssd_read, result.bytes_ssd_write = self.link_bytes[:4]
        result.busy_us = {"compute": result.compute_us, **{s.name: ps_to_us(s.busy_ps) for s in streams}}
        if self.on_comm:
            result.busy_us["comm"] = ps_to_us(self.comm_busy_ps)
        result.link_bytes = dict(zip(self.link_names, self.link_bytes))
        result.link_utilisation = {name: (nbytes * 10**12 / (cap * end) if end else 0.0)
                                   for name, nbytes, cap in zip(self.link_names, self.link_bytes, machine_links)}
        result.progress = sum(self.done) / len(self.seq) if len(self.seq) else 1.0
        result.stall_by_op = {op: {"data_us": ps_to_us(d), "memory_us": ps_to_us(m)}
                              for op, (d, m, *_) in self.stall_by_op.items()}

    def _timeline(self, result: Result, memory_samples, budget: int) -> None:
        """The recorded timeline: spans, GPU memory over time, phases and link rates."""
        self.spans.sort(key=lambda s: (s.start_us, s.track))
        result.timeline = Timeline(
            spans=self.spans, memory=[(ps_to_us(t), b) for t, b in memory_samples], budget_bytes=budget,
            phases=_phases(self.spans),
            link_rates=[(ps_to_us(t), dict(zip(self.link_names, rates))) for t, rates in self.links.samples],
            link_capacity=dict(zip(self.link_names, self.links.capacity)))


def _phases(spans: list[Span]) -> list[tuple[str, float, float]]:
    """Contiguous runs of one phase on the compute track."""
    out: list[list] = []
    for span in spans:
        if span.track != "compute":
            continue
        phase = span.args.get("phase", "other")
        if out and out[-1][0] == phase:
            out[-1][2] = span.end_us
        else:
            out.append([phase, span.start_us, span.end_us])
    return [tuple(p) for p in out]
