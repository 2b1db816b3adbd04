"""The discrete-event simulation of one iteration: GPU compute, PCIe, host and SSD.

This is the reference statement of the rules (R1-R23 of docs/simulation.md) in Python:
``run_program`` runs a compiled program (simulator/program.py) on a compiled profile and
machine (simulator/compiled.py) with the resource parts of simulator/resources.py.
The C fast path (simulator/fastpath.py) must agree with it exactly; tests compare the
two. ``simulator.api`` is the entry (``simulate`` for one plan, ``Simulator`` to compile a
profile and a machine once and score many plans). The engine knows nothing of planners.

Plans in UVM mode (R30-R37: ``"memory": "uvm"``) run on the same loop with managed
memory as the memory policy (``_UvmRun``, with simulator/uvm.py): two iterations, faults
and evictions instead of explicit copies.

Time is integer picoseconds (R3). One compute stream runs the items of the compute
sequence in order (R5, R6); the streams ``h2d``, ``d2h``, ``ssd_read`` and ``ssd_write``
are FIFO queues that run one transfer at a time, whose flows share the links by
bandwidth (R17, R18). Time advances from instant to instant: at each instant every
completion (and the frees it causes) is applied first, then the compute head tries to
start, then the waiting transfers in enqueue order (R9).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from .arena import ArenaMemory, allocation_keys
from .compiled import (D2H, H2D, LINKS, PCIE_DOWN, PCIE_UP, SSD_READ_LINK, SSD_WRITE, SSD_WRITE_LINK, STREAMS,
                       CompiledProfile, Machine)
from .errors import InputError
from .hardware import Hardware
from .plan import Plan
from .program import Drop, PlanInvalid, Program, Transfer
from .resources import Links, Memory, Stream, Tiers
from .result import Result, Span, Timeline
from .units import ps_to_us
from .uvm import UvmMemory, fault_schedule, fault_schedule_half


def resolve_budget(budget_bytes: int | None, plan: Plan, hardware: Hardware) -> int:
    """R2: an explicit budget, else the plan's, else the GPU's memory; never above the GPU's."""
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


# ----------------------------------------------------------------------------- infeasible


@dataclass
class Blocked:
    """Why a valid plan cannot go on (R10, R19): what waits, for how many bytes."""
    rule: str
    what: str                 # op | recompute | prefetch (waits for room) | stuck | start | capacity
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
    elif blocked.what == "prefetch":
        what = f"the prefetch of {blocked.tensor!r} waits for memory" + (f" (op {op!r} waits)" if op else "")
    else:
        what = f"the {blocked.after} of {blocked.tensor!r} cannot start" + (f" (op {op!r} waits)" if op else "")
    reason = f"{what}: needs {blocked.needed} bytes, {blocked.free} free; largest residents: {shown}"
    extra = {}
    if blocked.arena is not None:        # R50, R51
        extra = dict(blocked.arena)
        if "held_by" in extra:
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


# ----------------------------------------------------------------------------- the run


def run_program(compiled: CompiledProfile, program: Program, machine: Machine, budget: int,
                record: bool = False, names: list[tuple[str, str, str]] | None = None,
                allocator: str | None = None) -> Result:
    """Run a compiled program in simulated time and report the Result (valid plans only:
    validity was decided by the compile). ``names``: (op id, kernel, phase) per profile
    op, for the timeline when ``record``; ``allocator``: an online allocator model for a
    plan without a placement (R51)."""
    if program.uvm:
        return _run_uvm(compiled, program, machine, budget, record, names)
    return _Run(compiled, program, machine, budget, record, names, allocator).run()


def allocation_lifetimes(compiled: CompiledProfile, program: Program, machine: Machine, budget: int):
    """R50: the run of a plan (explicit mode) under ``budget`` with every GPU allocation
    logged: (Result, [[key, owner, bytes, start ps, end ps or None (still held at the
    end)]]). Ranges come from an unbounded arena, so they never make anything wait: the
    times are those of the byte-counted run."""
    run = _Run(compiled, program, machine, budget, False, None, "first-fit", arena_bytes=2**62)
    result = run.run()
    return result, run.memory.log


class _Run:
    """The run state of one simulation; ``run`` drives it to the end of the iteration."""

    def __init__(self, compiled: CompiledProfile, program: Program, machine: Machine, budget: int,
                 record: bool, names, allocator: str | None = None, arena_bytes: int | None = None):
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
        nbytes = compiled.tensor_bytes if not program.buffer_bytes else {**compiled.tensor_bytes,
                                                                          **program.buffer_bytes}
        if program.placement is not None or allocator is not None:   # R50, R51: address ranges
            keys = program.keys if program.keys is not None else allocation_keys(program, compiled)
            if program.placement is not None:
                allocator, arena_bytes = None, program.placement.arena_bytes
            self.memory = ArenaMemory(budget, nbytes, keys, arena_bytes or budget, program.placement, allocator)
        else:
            self.memory = Memory(budget, nbytes)          # with the encoded buffers of codecs (R41, R42)
        self.tiers = Tiers({"host": machine.host_bytes, "ssd": machine.ssd_bytes}, compiled.tensor_bytes)
        self.links = Links(machine.link_capacity)
        self.link_bytes = [0] * len(LINKS)
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
            self.memory.samples = [(0, 0)]
            self.links.samples = [(0, (0,) * len(LINKS))]

    # ------------------------------------------------------------------ completions

    def _next_gpu_item(self, k: int) -> int:
        """The first item at or after k that runs on the GPU."""
        while k < len(self.seq) and k in self.on_cpu:
            k += 1
        return k

    def _item_end(self) -> None:
        """R7: workspace, last-use frees, offload releases, then the actions after the op."""
        k, seq, now = self.head, self.seq, self.now
        self.running_until = None
        self.head = self._next_gpu_item(k + 1)
        self.ready_at = self.last_compute_end = now
        self.data_ready_at = None
        self.memory.release(seq.workspace[k], now)
        self._finish_item(k)

    def _cpu_end(self) -> None:
        """R28: a CPU item ends as a GPU op does, with no workspace."""
        k = self.cpu_items[self.cpu_pos]
        self.cpu_pos += 1
        self.cpu_running_until = None
        self.last_cpu_end = self.now
        self._finish_item(k)

    def _finish_item(self, k: int) -> None:
        """R7 for item k of either stream: frees, releases, then the actions after it."""
        seq, now = self.seq, self.now
        self.done[k] = 1
        if seq.codec and k in seq.codec:         # R41, R42: what an encode or decode frees on the GPU
            for tid in seq.codec[k].frees:
                self.memory.free(tid, now)
        for tid in seq.frees[k]:
            if self.pending_offloads.get(tid):
                self.dead_pending.add(tid)
            else:
                self.memory.free(tid, now)
                self.tiers.release(tid)
        for transfer in self.program.releases.get(k, ()):
            if self.ended[transfer.index]:
                self._release_copy(transfer)
        for action in self.program.actions.get(k, ()):
            if isinstance(action, Drop):
                self.memory.free(action.tensor, now)   # R14: at once
            else:
                self._enqueue(action)

    def _group(self, transfer: Transfer) -> tuple:
        """The transfer and the members of the group it leads (R53)."""
        return (transfer,) + tuple(self.transfers[m] for m in transfer.members) if transfer.members else (transfer,)

    def _enqueue(self, transfer: Transfer) -> None:
        self.enqueued_at[transfer.index] = self.enqueue_count
        self.enqueue_count += 1
        self.streams[transfer.route.stream].queue.append(transfer.index)
        for member in self._group(transfer):       # R53: a group queues as one transfer
            self.enqueued_at[member.index] = self.enqueued_at[transfer.index]
            if member.kind == "offload":
                self.pending_offloads[member.tensor] = self.pending_offloads.get(member.tensor, 0) + 1

    def _transfer_end(self, j: int) -> None:
        transfer, now = self.transfers[j], self.now
        self.last_transfer_end = max(self.last_transfer_end, now)
        stream = self.streams[transfer.route.stream]
        stream.running = None
        stream.busy_ps += now - self.start[j]
        if self.engine_holder == j:
            self.engine_holder = None
        group = self._group(transfer)
        if self.record:
            args = {"tensor": transfer.tensor, "bytes": transfer.total, "tier": transfer.tier, "kind": transfer.kind}
            name = f"{transfer.kind} {transfer.tensor}"
            if transfer.members:
                args["members"] = [member.tensor for member in group]
                name = f"{transfer.kind} group {self.program.group_names[j]} ({len(group)} tensors)"
            self.spans.append(Span(stream.name, name, ps_to_us(self.start[j]), ps_to_us(now), args))
        for member in group:
            self._copy_done(member)

    def _copy_done(self, transfer: Transfer) -> None:
        """One copy has ended (alone, or as a member of its group, R53)."""
        now = self.now
        self.ended[transfer.index] = True
        if transfer.kind == "store" and (transfer.last_reader < 0 or self.done[transfer.last_reader]):
            self._release_copy(transfer)          # R26: the host copy goes once its readers ended
        if transfer.kind == "offload":
            tid = transfer.tensor
            self.pending_offloads[tid] -= 1
            if transfer.last_reader < 0 or self.done[transfer.last_reader]:   # R11: its last reader ended
                self.memory.free(tid, now)
            if transfer.buffer is not None:
                self.memory.free(transfer.buffer, now)   # R41: the encoded buffer it copied
            if tid in self.dead_pending and not self.pending_offloads[tid]:
                self.dead_pending.discard(tid)     # R7: freed now that its offload ended
                self.memory.free(tid, now)
                self.tiers.release(tid)

    def _release_copy(self, transfer: Transfer) -> None:
        """The copy an offload (GPU) or a store (host) leaves behind is freed."""
        if transfer.kind == "store":
            self.tiers.release_tier(transfer.tensor, "host")
        else:
            self.memory.free(transfer.tensor, self.now)

    # ------------------------------------------------------------------ starts

    def _try_compute(self) -> None:
        seq, k = self.seq, self.head
        if self.running_until is not None or k >= len(seq):
            return
        recomputed = seq.recomputed[k]
        if self.data_ready_at is None:
            if any(not self.ended[w.index] for w in self.program.waits.get(k, ())):
                return
            if self.program.deps and not self._deps_done(k):
                return  # R27: an item of the CPU stream it depends on has not ended
            if recomputed is not None and recomputed in self.memory.resident:
                return  # R15: the older copy is still being copied out (a data stall)
            self.data_ready_at = self.now
        if not self.memory.fits_item(k, seq.alloc_bytes[k]):
            return
        now = self.now
        data_wait, memory_wait = self.data_ready_at - self.ready_at, now - self.data_ready_at
        if data_wait or memory_wait:
            self.stall_data += data_wait
            self.stall_memory += memory_wait
            entry = self.stall_by_op.setdefault(seq.group[k], [0, 0])
            entry[0] += data_wait
            entry[1] += memory_wait
        self.memory.allocate(seq.allocs[k], seq.workspace[k], now)
        time_ps = seq.time_ps[k]
        self.running_until = now + time_ps
        self.compute_ps += time_ps
        codec = seq.codec.get(k) if seq.codec else None
        if recomputed is not None:
            self.recompute_ps += time_ps
        elif codec is not None:
            self.codec_ps += time_ps
        if self.record:
            op_id, kernel, phase = self.names[seq.op_index[k]]
            if codec is not None:
                name, kind, kernel = f"{codec.kind} {codec.tensor}", codec.kind, codec.codec
            else:
                name = op_id if recomputed is None else f"recompute {recomputed}"
                kind = "op" if recomputed is None else "recompute"
            self.spans.append(Span("compute", name, ps_to_us(now), ps_to_us(now + time_ps),
                                   {"op": op_id, "kernel": kernel, "phase": phase, "kind": kind}))

    def _deps_done(self, k: int) -> bool:
        dep = self.program.deps.get(k)
        return dep is None or bool(self.done[dep])

    def _try_cpu(self) -> None:
        """R27: the CPU stream's next item starts when the previous one ended, the items
        of the GPU stream it depends on ended, and the transfers that wrote its host
        copies ended; its outputs take host memory (R19)."""
        if self.cpu_running_until is not None or self.cpu_pos >= len(self.cpu_items):
            return
        k = self.cpu_items[self.cpu_pos]
        if not self._deps_done(k) or any(not self.ended[w.index] for w in self.program.host_waits.get(k, ())):
            return
        for tid in self.seq.allocs[k]:
            if not self.tiers.take(tid, "host"):
                raise _Infeasible(Blocked("R19", "capacity", k, tid, self.tiers.used["host"],
                                          self.tiers.capacity["host"], [], "host", self.seq.group[k]))
        time_ps = self.program.cpu_ps[k]
        self.cpu_running_until = self.now + time_ps
        self.cpu_busy_ps += time_ps
        if self.record:
            op_id, kernel, phase = self.names[self.seq.op_index[k]]
            self.spans.append(Span("cpu", op_id, ps_to_us(self.now), ps_to_us(self.now + time_ps),
                                   {"op": op_id, "kernel": kernel, "phase": phase, "kind": "cpu op"}))

    def _can_start(self, transfer: Transfer) -> bool:
        """R12, R17: a head starts when the copy engine (half duplex) is free and, for a
        prefetch, its source copy is written, no older GPU copy remains and it fits."""
        if transfer.route.uses_engine and self.engine_holder is not None:
            return False
        if transfer.source_item >= 0 and not self.done[transfer.source_item]:
            return False   # R27: the CPU op writing its host source has not ended
        if transfer.kind in ("load", "store"):
            return transfer.source < 0 or self.ended[transfer.source]
        if transfer.kind == "prefetch":
            group = self._group(transfer)       # R53: every member's source, and room for them all
            for member in group:
                if (member.source >= 0 and not self.ended[member.source]) or member.tensor in self.memory.resident \
                        or (member.source_item >= 0 and not self.done[member.source_item]):
                    return False
            return self.memory.fits_prefetch([m.index for m in group],
                                             sum(self.memory.nbytes[m.buffer or m.tensor] for m in group))
        return True

    def _try_transfers(self) -> None:
        heads = [s.queue[0] for s in self.streams if s.queue and s.running is None]
        for j in sorted(heads, key=self.enqueued_at.__getitem__):
            transfer = self.transfers[j]
            if self._can_start(transfer):
                self._start_transfer(transfer)

    def _start_transfer(self, transfer: Transfer) -> None:
        j, now = transfer.index, self.now
        group = self._group(transfer)
        if transfer.kind == "prefetch":   # R41: a compute codec's encoded buffer; R53: every member's
            self.memory.allocate(tuple(member.buffer or member.tensor for member in group), 0, now)
        else:
            tier = "host" if transfer.kind == "load" else transfer.tier
            for member in group:
                if not self.tiers.take(member.tensor, tier, member.nbytes):   # R19
                    raise _Infeasible(Blocked("R19", "capacity", -1, member.tensor, self.tiers.used[tier],
                                              self.tiers.capacity[tier], [], tier, transfer.after_op))
        stream = self.streams[transfer.route.stream]
        stream.queue.popleft()
        stream.running = j
        for link in transfer.route.links:
            self.link_bytes[link] += transfer.total
        if transfer.route.uses_engine:
            self.engine_holder = j
        for member in group:
            self.start[member.index] = now
        if transfer.route.latency_ps:
            self.latency_until[j] = now + transfer.route.latency_ps
        else:
            self.links.start(j, transfer.route.links, transfer.total, now)

    # ------------------------------------------------------------------ the loop

    def _next_instant(self) -> int | None:
        times = list(self.latency_until.values())
        if self.running_until is not None:
            times.append(self.running_until)
        if self.cpu_running_until is not None:
            times.append(self.cpu_running_until)
        flow_end = self.links.next_end()
        if flow_end is not None:
            times.append(flow_end)
        return min(times, default=None)

    def _complete(self) -> None:
        """Every completion at ``now`` (R9): the compute item, latencies, then flows."""
        now = self.now
        if self.running_until == now:
            self._item_end()
        if self.cpu_running_until == now:
            self._cpu_end()
        for j in [j for j, at in self.latency_until.items() if at == now]:
            del self.latency_until[j]
            transfer = self.transfers[j]
            self.links.start(j, transfer.route.links, transfer.total, now)
        ending = self.links.ending_at(now)
        if ending:
            self.links.finish(ending, now)
            for j in sorted(ending, key=self.enqueued_at.__getitem__):
                self._transfer_end(j)

    def run(self) -> Result:
        compiled, program = self.compiled, self.program
        result = Result(budget_bytes=self.memory.budget, ideal_us=ps_to_us(compiled.ideal_ps),
                        transfers=len(program.transfers),
                        recomputes=sum(1 for tid in self.seq.recomputed if tid is not None))
        try:
            self._place_at_start()
            self._loop()
        except _Infeasible as exc:
            self._infeasible(result, exc)
        self._fill(result)
        return result

    def _loop(self) -> None:
        """The iteration from its start actions to its end (R9), or _Infeasible."""
        for action in self.program.start_actions:
            self._enqueue(action)
        self._try_compute()
        self._try_cpu()
        self._try_transfers()
        while True:
            instant = self._next_instant()
            if instant is None:
                break
            self.now = instant
            self._complete()
            self._try_compute()
            self._try_cpu()
            self._try_transfers()
        if (self.head < len(self.seq) or self.cpu_pos < len(self.cpu_items)
                or any(s.queue for s in self.streams)):
            raise _Infeasible(self._stuck())

    def _infeasible(self, result: Result, exc: _Infeasible) -> None:
        result.feasible = False
        result.rule = exc.blocked.rule
        result.tensor = exc.blocked.tensor
        item = exc.blocked.item
        result.op, result.reason, result.blocked = describe(exc.blocked, self.seq.group[item] if item >= 0 else None)

    def _place_at_start(self) -> None:
        """R10, R19: persistent tensors on the GPU in profile order; initial copies take
        their tier's space from time 0."""
        initial = self.program.initial_copies
        memory = self.memory
        placement = self.program.placement
        if placement is not None and placement.arena_bytes > memory.budget:   # R50: the arena is in the budget
            raise _Infeasible(Blocked("R50", "arena", -1, None, placement.arena_bytes, memory.budget, []))
        for tid in self.compiled.persistent_ids:
            if tid in initial:
                continue
            if not memory.fits_start(tid, memory.nbytes[tid]):
                raise _Infeasible(Blocked("R10", "start", -1, tid, memory.nbytes[tid], memory.budget - memory.used,
                                          memory.largest(), arena=getattr(memory, "blocked", None)))
            memory.allocate((tid,), 0, 0)
        for tid, tier in initial.items():
            if not self.tiers.take(tid, tier):
                raise _Infeasible(Blocked("R19", "capacity", -1, tid, self.tiers.used[tier],
                                          self.tiers.capacity[tier], [], tier, None))

    def _stuck(self) -> Blocked:
        """R10: nothing runs, nothing is pending, and work remains: say what waits."""
        seq, k, memory = self.seq, self.head, self.memory
        free = memory.budget - memory.used
        arena = getattr(memory, "blocked", None)
        if k < len(seq) and self.data_ready_at is not None:   # the item itself waits for memory
            recomputed = seq.recomputed[k]
            if arena is not None:
                memory.fits_item(k, seq.alloc_bytes[k])     # which of its allocations waits, and for whom
                arena = memory.blocked
            return Blocked("R10", "op" if recomputed is None else "recompute", k, recomputed,
                           seq.alloc_bytes[k], free, memory.largest(), arena=arena)
        heads = sorted((s.queue[0] for s in self.streams if s.queue), key=self.enqueued_at.__getitem__)
        item = k if k < len(seq) else -1
        for j in heads:
            transfer = self.transfers[j]
            if (transfer.kind == "prefetch" and (transfer.source < 0 or self.ended[transfer.source])
                    and transfer.tensor not in memory.resident):   # it waits for room, nothing else
                size = memory.nbytes[transfer.buffer or transfer.tensor]
                if arena is not None:
                    memory.fits_prefetch([j], size)
                return Blocked("R10", "prefetch", item, transfer.tensor, size, free, memory.largest(),
                               arena=getattr(memory, "blocked", None))
        if heads:
            transfer = self.transfers[heads[0]]
            return Blocked("R10", "stuck", item, transfer.tensor, transfer.nbytes, free, memory.largest(),
                           after=transfer.kind)
        pending = [w for w in self.program.waits.get(k, ()) if not self.ended[w.index]]
        tensor = pending[0].tensor if pending else seq.recomputed[k]
        return Blocked("R10", "stuck", item, tensor, 0, free, memory.largest(), after="wait")

    def _fill(self, result: Result) -> None:
        end = max(self.last_compute_end, self.last_cpu_end, self.last_transfer_end, self.now if not result.ok else 0)
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
        result.peak_bytes = self.memory.peak
        result.peak_at_us = ps_to_us(self.memory.peak_at)
        if isinstance(self.memory, ArenaMemory):      # R50, R51
            result.arena_bytes = self.memory.arena_bytes
            extent = self.memory.ranges.extent
            result.fragmentation = extent / self.memory.peak if self.memory.peak else 1.0
        streams = self.streams
        # R18: a link's bytes; an SSD copy counts on its PCIe direction and on the SSD
        result.bytes_h2d, result.bytes_d2h, result.bytes_ssd_read, result.bytes_ssd_write = self.link_bytes
        result.busy_us = {"compute": result.compute_us, **{s.name: ps_to_us(s.busy_ps) for s in streams}}
        result.link_bytes = dict(zip(LINKS, self.link_bytes))
        result.link_utilisation = {name: (nbytes * 10**12 / (cap * end) if end else 0.0)
                                   for name, nbytes, cap in zip(LINKS, self.link_bytes, machine_links)}
        result.progress = sum(self.done) / len(self.seq) if len(self.seq) else 1.0
        result.host_peak_bytes = self.tiers.peak["host"]
        result.ssd_peak_bytes = self.tiers.peak["ssd"]
        result.stall_by_op = {op: {"data_us": ps_to_us(d), "memory_us": ps_to_us(m)}
                              for op, (d, m, *_) in self.stall_by_op.items()}
        if self.record:
            self.spans.sort(key=lambda s: (s.start_us, s.track))
            result.timeline = Timeline(
                spans=self.spans, memory=[(ps_to_us(t), b) for t, b in self.memory.samples],
                budget_bytes=self.memory.budget, phases=_phases(self.spans),
                link_rates=[(ps_to_us(t), dict(zip(LINKS, rates))) for t, rates in self.links.samples],
                link_capacity=dict(zip(LINKS, machine_links)))


def invalid_result(exc: PlanInvalid, budget: int, compiled: CompiledProfile) -> Result:
    """The result of a plan that breaks a rule."""
    return Result(valid=False, feasible=False, rule=exc.rule, op=exc.op, tensor=exc.tensor, reason=exc.reason,
                  budget_bytes=budget, ideal_us=ps_to_us(compiled.ideal_ps), progress=0.0)


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


# ----------------------------------------------------------------------------- UVM mode


def _run_uvm(compiled: CompiledProfile, program: Program, machine: Machine, budget: int, record: bool,
             names) -> Result:
    """R36: two back-to-back iterations; the result is the second's. The first starts
    with the persistent tensors on the GPU block by block in profile order (those
    ``initial`` does not place in the backing tier) until the budget is full; the second
    with the residency, and the order of arrival, that the first ended with."""
    first = _UvmRun(compiled, program, machine, budget, False, names, None)
    result = first.run(place=True)
    if not result.ok:
        return result
    memory = first.mem
    memory.take_credits(first.now)
    memory.epoch += first.now + 1          # every stamp of iteration 2 comes after iteration 1's
    memory.reset_counts()
    memory.peak, memory.peak_at, memory.host_peak = memory.ledger, 0, memory.host
    return _UvmRun(compiled, program, machine, budget, record, names, memory).run(place=False)


class _ItemTouch:
    """What item k of a sequence touches, as tensor positions: what it pins (R31), what
    it may fault (inputs, then updates, in order), what it allocates, what it updates."""
    __slots__ = ("pins", "reads", "outputs", "updates")

    def __init__(self, pins, reads, outputs, updates):
        self.pins, self.reads, self.outputs, self.updates = pins, reads, outputs, updates


def _touches(seq, compiled: CompiledProfile) -> list[_ItemTouch]:
    """Per item, once per sequence (kept on it): the tensors it touches (R31)."""
    found = getattr(seq, "_uvm_touch", None)
    if found is not None:
        return found
    arrays = compiled.arrays
    in_off, in_val, up_off, up_val = arrays[5], arrays[6], arrays[7], arrays[8]
    index = compiled.tensor_index
    out = []
    for k, op in enumerate(seq.op_index):
        updates = tuple(dict.fromkeys(up_val[up_off[op]:up_off[op + 1]]))
        reads = tuple(dict.fromkeys(tuple(in_val[in_off[op]:in_off[op + 1]]) + updates))
        outputs = tuple(index[t] for t in seq.allocs[k])
        out.append(_ItemTouch(tuple(dict.fromkeys(reads + outputs)), reads, outputs, updates))
    seq._uvm_touch = out
    return out


class _UvmRun(_Run):
    """One iteration of a UVM plan (R30-R37): the engine's loop, compute stream and
    streams, with managed memory (simulator/uvm.py's UvmMemory) as the memory policy.

    A compute item that could start (R6) pins what it touches and has its room decided
    at once (``_decide``): the blocks it faults, the evictions that make room, and when
    its write-backs (``d2h``) and fault batches (``h2d``) run, computed as a train (see
    simulator/uvm.py); it starts when the last batch has ended. Hints (offload and
    prefetch) are transfers on the same streams, queued behind the trains."""

    def __init__(self, compiled: CompiledProfile, program: Program, machine: Machine, budget: int, record: bool,
                 names, memory: UvmMemory | None):
        super().__init__(compiled, program, machine, budget, record, names)
        if memory is None:
            # R19, R35: the backing tier is host memory, or with SSD backing the file on the SSD (host memory
            # then holds only the page cache, which fits in it)
            capacity = machine.ssd_bytes if program.backing == "ssd" else machine.host_bytes
            memory = UvmMemory(compiled, machine, budget, program.read_mostly, capacity, program.backing)
        self.mem = memory
        memory.samples = [(0, memory.ledger)] if record else None
        self.touch = _touches(self.seq, compiled)
        self.half = machine.half_duplex
        self.h2d_free = 0                  # ps: the stream is held (a fault train, a hint) until then
        self.d2h_free = 0
        # the hint running on h2d and on d2h: (transfer, end, latency + flow, bytes, the runs an offload copies)
        self.slot: list = [None, None]
        self.t_of = [memory.index[transfer.tensor] for transfer in self.transfers]
        self.down_rate, self.up_rate = machine.link_capacity[PCIE_DOWN], machine.link_capacity[PCIE_UP]
        self.decided_at: int | None = None   # the head item's room was decided then ...
        self.fault_start: int | None = None  # ... and it starts then
        self.stall_fault = 0
        self.head_pinned = False
        self.n_items = len(self.seq)
        self.instant_ends = False            # a hint ended as it started: compute and transfers try again

    # ------------------------------------------------------------------ the run

    def run(self, place: bool = True) -> Result:
        result = Result(budget_bytes=self.mem.budget, ideal_us=ps_to_us(self.compiled.ideal_ps),
                        transfers=len(self.program.transfers), recomputes=0)
        try:
            if place:
                self._place_at_start()
            self._check_host()
            self._loop()
        except _Infeasible as exc:
            self._infeasible(result, exc)
        self._fill(result)
        return result

    def _place_at_start(self) -> None:
        """R36: persistent tensors on the GPU block by block in profile order until the
        budget is full, except those ``initial`` places in the backing tier (the rest in
        the backing tier). Read-mostly ones keep their backing copy (R34)."""
        mem, initial = self.mem, self.program.initial_copies
        full = False
        for tid in self.compiled.persistent_ids:
            t = mem.index[tid]
            nbytes = mem.nbytes[t]
            rm = mem.read_mostly[t]
            if tid in initial or full or not nbytes:
                mem.host_add(nbytes)
                continue
            free = mem.budget - mem.ledger
            count = mem.nblocks[t] if nbytes <= free else min(free // mem.block, mem.nblocks[t] - 1)
            placed = mem.add_run(t, 0, count, 0, bool(rm)) if count else 0
            full = count < mem.nblocks[t]
            mem.commit(placed, 0)
            mem.host_add(nbytes - placed + (placed if rm else 0))

    def _check_host(self) -> None:
        """R19, R35, R37: the backing tier's capacity (host memory, or the SSD with SSD backing)."""
        mem = self.mem
        if mem.host > mem.host_capacity:
            raise _Infeasible(Blocked("R19", "capacity", -1, None, mem.host, mem.host_capacity, [],
                                      "host" if mem.cache is None else "ssd",
                                      self.seq.group[self.head] if self.head < len(self.seq) else None))

    # ------------------------------------------------------------------ compute

    def _try_compute(self) -> None:
        k = self.head
        if self.running_until is not None or k >= self.n_items:
            return
        now = self.now
        if self.data_ready_at is None:
            waits = self.program.waits.get(k)
            if waits and any(not self.ended[w.index] for w in waits):
                return
            self.data_ready_at = now
        if self.fault_start is None and not self._decide(k):
            return
        if now < self.fault_start:
            return
        data_wait = self.data_ready_at - self.ready_at
        memory_wait = self.decided_at - self.data_ready_at
        fault_wait = now - self.decided_at
        if data_wait or memory_wait or fault_wait:
            self.stall_data += data_wait
            self.stall_memory += memory_wait
            self.stall_fault += fault_wait
            entry = self.stall_by_op.setdefault(self.seq.group[k], [0, 0, 0])
            entry[0] += data_wait
            entry[1] += memory_wait
            entry[2] += fault_wait
        time_ps = self.seq.time_ps[k]
        self.running_until = now + time_ps
        self.compute_ps += time_ps
        if self.record:
            op_id, kernel, phase = self.names[self.seq.op_index[k]]
            self.spans.append(Span("compute", op_id, ps_to_us(now), ps_to_us(now + time_ps),
                                   {"op": op_id, "kernel": kernel, "phase": phase, "kind": "op"}))

    def _decide(self, k: int) -> bool:
        """R31, R32: item k pins what it touches, allocates its outputs and workspace and
        faults what it reads or updates that is not on the GPU; room comes from free
        bytes, else from evictions. Schedules the train; False when it must wait (blocks
        it would evict are pinned by a transfer in progress)."""
        mem, now, touch = self.mem, self.now, self.touch[k]
        if not self.head_pinned:
            pins, pinned = mem.pins, mem.pinned
            for t in touch.pins:
                pins[t] += 1
                pinned.add(t)
            self.head_pinned = True
            self.pool_alloc, self.pool_fault = self.seq.alloc_bytes[k], 0
            if mem.caching and touch.outputs:      # R38: the outputs take the pool first, once
                out = sum(mem.nbytes[t] for t in touch.outputs)
                taken, held = mem.reuse(out)
                mem.commit(held - taken, now)
                self.pool_fault = mem.reuse_backing(out - held)
                self.pool_alloc -= held + self.pool_fault
        ranges = []
        fault_bytes = 0
        resident, nbytes = mem.resident, mem.nbytes
        for t in touch.reads:
            if resident[t] != nbytes[t]:
                for first, last in mem.missing(t):
                    ranges.append((t, first, last))
                    fault_bytes += mem.range_bytes(t, first, last)
        alloc = self.pool_alloc
        if self.pool_fault:          # R38: reused pool memory in the backing tier faults in, after the reads
            ranges.append((mem.pool_index, 0, mem.nblocks[mem.pool_index]))
            fault_bytes += self.pool_fault
        if not ranges and alloc <= mem.budget - mem.ledger:    # the common case: nothing to fault or evict
            mem.commit(alloc, now)
            if touch.outputs:
                mem.add_outputs(touch.outputs, mem.epoch + now)
            for t in touch.updates:
                if mem.runs[t]:
                    mem.dirty(t)
            self.decided_at = self.fault_start = now
            return True
        room = mem.make_room(alloc + fault_bytes, now)
        if room is None:
            if self.slot[0] is not None or self.slot[1] is not None or mem.credits:
                return False       # a transfer in progress pins blocks, or bytes are on their way out
            self._decide_oversubscribed(k, ranges, alloc, fault_bytes)
            return True
        ready, writes, wb_durations, leftover, wb_bytes, wb_busy = room
        start_at = now
        if ranges:
            name = self.seq.group[k]
            if not writes and mem.batch_blocks == 1 and not self.half and mem.cache is None:   # nothing waits
                batches, busy = mem.fault_totals(ranges)
                start_at = self.h2d_free = (self.h2d_free if self.h2d_free > now else now) + busy
                self._train(H2D, fault_bytes, batches, busy, start_at, name)
            else:
                start_at, batches = self._schedule(ready, writes, wb_durations, leftover, wb_bytes, wb_busy, alloc,
                                                   ranges, fault_bytes, name)
            mem.faults += batches
            mem.fault_bytes += fault_bytes
        elif writes:
            start_at = self._schedule(ready, writes, wb_durations, leftover, wb_bytes, wb_busy, alloc, (), 0,
                                      self.seq.group[k])[0]
        stamp = mem.epoch + now
        read_mostly = mem.read_mostly
        if touch.outputs:
            mem.add_outputs(touch.outputs, stamp)
        moved_off_host = 0
        for t, first, last in ranges:
            if t == mem.pool_index:      # R38: the pool's memory, now the outputs' (host counted at reuse)
                continue
            moved = mem.add_run(t, first, last, stamp, bool(read_mostly[t]))
            if not read_mostly[t]:
                moved_off_host += moved
        for t in touch.updates:
            mem.dirty(t)          # R16: at its start (nothing else runs before it does)
        if writes:
            self._check_host()
        mem.host -= moved_off_host
        self.decided_at, self.fault_start = now, start_at
        return True

    def _decide_oversubscribed(self, k: int, ranges, alloc: int, fault_bytes: int) -> None:
        """R32 as swapplan extends it: an item whose outputs, workspace and faulted
        blocks cannot be on the GPU together, even with every unpinned block evicted,
        runs as a kernel larger than GPU memory does under UVM: it streams through its
        inputs. Every unpinned block is evicted first; further room comes from the
        item's own input blocks in the order it touches them (inputs, then updated
        tensors, each in block order), each once it is on the GPU, written back (dropped
        when clean). Its fault batches take room in order, then its outputs and
        workspace; the blocks so evicted end in the backing tier. Infeasible (R10) only
        when a batch or the outputs and workspace cannot get room even so."""
        mem, now, touch = self.mem, self.now, self.touch[k]
        room_total = mem.budget - mem.ledger + mem.evictable()
        sizes, durations = mem.fault_blocks(ranges) if ranges else ([], [])
        own_resident = sum(mem.resident[t] for t in touch.reads)
        if max(alloc, max(sizes, default=0)) > room_total + own_resident:
            raise _Infeasible(Blocked("R10", "alone", k, None, alloc, room_total + own_resident, mem.largest()))
        ready, writes, wb_durations, leftover, wb_bytes, wb_busy = mem.make_room(room_total, now)
        for t in touch.updates:
            mem.dirty(t)
        updated = set(touch.updates)
        batch_of: dict[tuple[int, int], int] = {}    # the batch that completes each faulted block (R31)
        g, i = mem.batch_blocks, 0
        for t, first, last in ranges:
            for b in range(first, last):
                batch_of[(t, b)] = i // g if g else mem.block_batch[i]
                i += 1
        # the item's own blocks it may evict: those on the GPU before it (they arrived
        # earlier), then those it faults, each in the order it touches them:
        # (tensor, block, bytes, clean, the batch that brings it or -1)
        before, faulted = [], []
        for t in touch.reads:
            clean_blocks = {b for run in mem.runs[t] if run.clean for b in range(run.first, run.last)}
            rm = bool(mem.read_mostly[t]) and t not in updated
            last = mem.nblocks[t] - 1
            for b in range(last + 1):
                arrival = batch_of.get((t, b), -1)
                size = mem.tail[t] if b == last else mem.block
                if arrival < 0:
                    before.append((t, b, size, b in clean_blocks, -1))
                else:
                    faulted.append((t, b, size, rm, arrival))
        own = before + faulted
        base = max(now, self.d2h_free)
        ends = mem.writeback_ends(base, now, writes, wb_durations) if writes else []
        cursor = ends[-1] if ends else base
        cache = mem.cache
        up = self.links.capacity[PCIE_UP]
        state = {"covered": ready, "other": 0, "own": 0, "room": now, "cursor": cursor, "written": 0, "busy": 0}
        batch_end: list[int] = []

        def take(before_batch: int) -> None:
            """The next source of room: an evicted block of another tensor, else one of the item's own."""
            if state["other"] < len(writes):
                j = state["other"]
                state["covered"] += writes[j]
                state["room"] = max(state["room"], ends[j])
                state["other"] = j + 1
                return
            if state["own"] >= len(own):
                raise _Infeasible(Blocked("R10", "alone", k, None, alloc, room_total + own_resident, mem.largest()))
            t, b, nbytes, clean, arrival = own[state["own"]]
            if arrival >= before_batch:
                raise _Infeasible(Blocked("R10", "alone", k, None, alloc, room_total + own_resident, mem.largest()))
            arrived = now if arrival < 0 else batch_end[arrival]
            if clean:
                state["room"] = max(state["room"], arrived)
            else:
                busy = -(-nbytes * 10**12 // up)
                if cache is not None:       # R35: into the page cache
                    arrived = max(arrived, cache.insert(t, b, nbytes, now))
                state["cursor"] = max(state["cursor"], arrived) + busy
                state["written"] += nbytes
                state["busy"] += busy
                state["room"] = max(state["room"], state["cursor"])
            state["covered"] += nbytes
            state["own"] += 1

        need, end = 0, (self.h2d_free if self.h2d_free > now else now)
        for index, (size, duration) in enumerate(zip(sizes, durations)):
            need += size
            while state["covered"] < need:
                take(index)
            end = max(end, state["room"]) + duration
            batch_end.append(end)
        need += alloc
        while state["covered"] < need:
            take(len(sizes))
        start_at = max(state["room"], end)
        taken, written, cursor = state["own"], state["written"], state["cursor"]
        if sizes:
            self.h2d_free = end
            self._train(H2D, fault_bytes, len(sizes), sum(durations), end, self.seq.group[k])
            mem.faults += len(sizes)
            mem.fault_bytes += fault_bytes
        if writes:
            self._train(D2H, wb_bytes, len(writes), wb_busy, ends[-1], self.seq.group[k])
        if written:
            self._train(D2H, written, taken, state["busy"], cursor, self.seq.group[k] + " (its own blocks)")
        self.d2h_free = max(self.d2h_free, cursor)
        mem.evictions += taken
        mem.writeback_bytes += written
        # residency: outputs and faulted blocks arrive, then the item's own evicted blocks leave
        stamp = mem.epoch + now
        if touch.outputs:
            mem.add_outputs(touch.outputs, stamp)
        moved_off_host = 0
        for t, first, last in ranges:
            if t == mem.pool_index:      # R38: the pool's memory, now the outputs'
                continue
            moved = mem.add_run(t, first, last, stamp, bool(mem.read_mostly[t]) and t not in updated)
            if not mem.read_mostly[t]:
                moved_off_host += moved
        evicted: dict[int, list[int]] = {}
        for t, b, _, _, _ in own[:taken]:
            evicted.setdefault(t, []).append(b)
        gone = sum(mem.drop_blocks(t, sorted(blocks)) for t, blocks in evicted.items())
        mem.host += written - moved_off_host
        mem.host_peak = max(mem.host_peak, mem.host)
        self._check_host()
        mem.commit(alloc + fault_bytes - gone - room_total, now)   # what the item keeps, less the room it was given
        self.decided_at, self.fault_start = now, start_at

    def _schedule(self, ready: int, writes, wb_durations, leftover: int, wb_bytes: int, wb_busy: int, alloc: int,
                  ranges, fault_bytes: int, name: str) -> tuple[int, int]:
        """The train of an item whose batches may wait for write-backs (R31, R32), or that
        runs on a half-duplex machine: schedules it on ``d2h`` and ``h2d``; returns when
        the item can start, and its number of fault batches."""
        mem, now = self.mem, self.now
        sizes, durations = mem.fault_blocks(ranges) if ranges else ((), ())
        if self.half:
            start = max(now, self.h2d_free, self.d2h_free)
            if writes:
                mem.writeback_ends(start, now, writes, wb_durations)   # R35: the page cache takes them
            alloc_room, end, ends = fault_schedule_half(now, start, ready, writes, wb_durations, alloc,
                                                        durations, sizes)
            if writes or sizes:
                self.h2d_free = self.d2h_free = end
        else:
            ends = mem.writeback_ends(max(now, self.d2h_free), now, writes, wb_durations) if writes else ()
            alloc_room, end = fault_schedule(now, self.h2d_free, ready, writes, ends, alloc, durations, sizes)
            if writes:
                self.d2h_free = ends[-1]
            if sizes:
                self.h2d_free = end
        if writes:
            if leftover:
                mem.credit(ends[-1], leftover)
            self._train(D2H, wb_bytes, len(writes), wb_busy, ends[-1], name)
        if sizes:
            busy = mem.fault_totals(ranges)[1] if mem.batch_blocks == 1 else sum(durations)
            self._train(H2D, fault_bytes, len(sizes), busy, end, name)
            return max(alloc_room, end), len(sizes)
        return alloc_room, 0

    def _train(self, stream: int, nbytes: int, blocks: int, busy: int, end: int, whose: str) -> None:
        """Account a train of write-backs or fault batches (R31, R32) on its stream;
        ``whose``: the op (or ``prefetch t``) it makes room for or faults for."""
        self.streams[stream].busy_ps += busy
        self.link_bytes[PCIE_DOWN if stream == H2D else PCIE_UP] += nbytes
        if end > self.last_transfer_end:
            self.last_transfer_end = end
        if self.record:
            name = f"faults of {whose}" if stream == H2D else f"write-back for {whose}"
            self.spans.append(Span(STREAMS[stream], name, ps_to_us(end - busy), ps_to_us(end),
                                   {"kind": "faults" if stream == H2D else "write-back", "blocks": blocks,
                                    "bytes": nbytes}))

    def _item_end(self) -> None:
        k, now = self.head, self.now
        self.running_until = None
        self.head = self._next_gpu_item(k + 1)
        self.ready_at = self.last_compute_end = now
        self.data_ready_at = self.decided_at = self.fault_start = None
        mem = self.mem
        workspace = self.seq.workspace[k]
        if workspace:
            mem.commit(-workspace, now)
        pins, pinned = mem.pins, mem.pinned
        for t in self.touch[k].pins:
            pins[t] -= 1
            if not pins[t]:
                pinned.discard(t)
        self.head_pinned = False
        self._finish_item(k)

    def _finish_item(self, k: int) -> None:
        """R7 in UVM mode: last-use frees (blocks on the GPU and in the backing tier),
        offload releases, then the actions after the op."""
        seq, now, mem = self.seq, self.now, self.mem
        self.done[k] = 1
        for tid in seq.frees[k]:
            if self.pending_offloads.get(tid):
                self.dead_pending.add(tid)
            else:
                mem.free_tensor(mem.index[tid], now)
        for transfer in self.program.releases.get(k, ()):
            if self.ended[transfer.index]:
                mem.release_clean(mem.index[transfer.tensor], now)
        for action in self.program.actions.get(k, ()):
            if isinstance(action, Drop):
                mem.release_clean(mem.index[action.tensor], now)   # R33: read-mostly, never updated: all clean
            else:
                self._enqueue(action)

    # ------------------------------------------------------------------ hints

    def _can_start(self, transfer: Transfer) -> bool:
        now = self.now
        if self.half and (self.engine_holder is not None or now < self.h2d_free or now < self.d2h_free):
            return False
        if now < (self.h2d_free if transfer.route.stream == H2D else self.d2h_free):
            return False
        return not (transfer.kind == "prefetch" and transfer.source >= 0 and not self.ended[transfer.source])

    def _start_transfer(self, transfer: Transfer) -> None:
        """R33: a prefetch migrates t's blocks that are not on the GPU (evicting for
        room, no fault latency); an offload copies t's blocks that have no valid backing
        copy. Either pins t while it runs, and holds its stream (``slot``) until it ends."""
        j, now, mem = transfer.index, self.now, self.mem
        t = self.t_of[j]
        number = transfer.route.stream
        stream = self.streams[number]
        stream.queue.popleft()
        stream.running = j
        self.start[j] = now
        end = now
        moved = busy = 0
        runs = None
        latency = transfer.route.latency_ps
        if transfer.kind == "prefetch":
            resident = mem.resident[t]
            if resident == mem.nbytes[t]:
                ranges = ()
            elif not mem.runs[t]:
                ranges = [(t, 0, mem.nblocks[t])]
                moved = mem.nbytes[t]
            else:
                ranges = [(t, first, last) for first, last in mem.missing(t)]
                moved = mem.nbytes[t] - resident
            room = mem.make_room(moved, now) if moved else None
            if room is None:
                moved = 0          # nothing to move, or no room even evicting everything unpinned: skipped
            else:
                ready, writes, wb_durations, leftover, wb_bytes, wb_busy = room
                if not writes:
                    room_at = now
                elif self.half:
                    base = max(now, self.d2h_free)
                    mem.writeback_ends(base, now, writes, wb_durations)
                    room_at, _, ends = fault_schedule_half(now, base, ready, writes, wb_durations, moved, (), ())
                else:
                    ends = mem.writeback_ends(max(now, self.d2h_free), now, writes, wb_durations)
                    room_at, _ = fault_schedule(now, now, ready, writes, ends, moved, (), ())
                if writes:
                    self.d2h_free = ends[-1]
                    if leftover:
                        mem.credit(ends[-1], leftover)
                    self._train(D2H, wb_bytes, len(writes), wb_busy, ends[-1], f"prefetch {transfer.tensor}")
                rate = self.down_rate
                if mem.cache is not None:           # R35: all from the page cache, or through the SSD
                    hits = [mem.cache.take(t, b) for _, first, last in ranges for b in range(first, last)]
                    if not all(hits):
                        rate, latency = mem.ssd_in, latency + mem.ssd_read_latency
                        mem.ssd_read_bytes += moved
                busy = latency + -(-moved * 10**12 // rate)
                end = room_at + busy
                stamp = mem.epoch + now
                clean = bool(mem.read_mostly[t])
                for _, first, last in ranges:
                    mem.add_run(t, first, last, stamp, clean)
                if not clean:
                    mem.host -= moved
                self.link_bytes[PCIE_DOWN] += moved
        else:
            runs = mem.dirty_runs(t)
            moved = mem.resident[t] if len(runs) == len(mem.runs[t]) else sum(mem.run_bytes(run) for run in runs)
            if moved:
                busy = latency + -(-moved * 10**12 // self.up_rate)
                ready = now
                if mem.cache is not None:           # R35: the blocks land in the page cache
                    for run in runs:
                        for b in range(run.first, run.last):
                            size = mem.tail[t] if b == mem.nblocks[t] - 1 else mem.block
                            ready = max(ready, mem.cache.insert(t, b, size, now))
                end = ready + busy
                mem.host_add(moved)
                self._check_host()
                self.link_bytes[PCIE_UP] += moved
        if moved:
            pins = mem.pins
            pins[t] += 1
            mem.pinned.add(t)
            if self.half:
                self.engine_holder = j
        slot = (j, end, busy, moved, runs)
        if end == now:
            self._transfer_end(slot)     # moves nothing: it ends as it starts (R9: then compute, then transfers)
            self.instant_ends = True
        else:
            self.slot[number] = slot

    def _transfer_end(self, slot: tuple) -> None:
        j, now, busy, moved, runs = slot
        transfer, mem = self.transfers[j], self.mem
        t = self.t_of[j]
        self.ended[j] = True
        if now > self.last_transfer_end:
            self.last_transfer_end = now
        number = transfer.route.stream
        stream = self.streams[number]
        stream.running = None
        self.slot[number] = None
        stream.busy_ps += busy
        if self.engine_holder == j:
            self.engine_holder = None
        if moved:
            mem.pins[t] -= 1
            if not mem.pins[t]:
                mem.pinned.discard(t)
        if self.record:
            self.spans.append(Span(stream.name, f"{transfer.kind} {transfer.tensor}", ps_to_us(now - busy),
                                   ps_to_us(now), {"tensor": transfer.tensor, "bytes": moved,
                                                   "tier": transfer.tier, "kind": transfer.kind}))
        if runs is not None:      # an offload
            for run in runs:
                if run.alive and not run.clean:
                    run.clean = True   # its backing copy is written (R33): evicting it is a discard now
            tid = transfer.tensor
            self.pending_offloads[tid] -= 1
            if tid in self.dead_pending and not self.pending_offloads[tid]:
                self.dead_pending.discard(tid)
                mem.free_tensor(t, now)
            elif transfer.last_reader < 0 or self.done[transfer.last_reader]:
                mem.release_clean(t, now)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        """_Run._loop (R9) with the UVM run's events: the compute item's end, the start
        of an item whose fault train was scheduled, hint transfers' ends, credits back to
        the ledger (a write-back's end), and the streams' trains ending when a hint waits
        on them."""
        for action in self.program.start_actions:
            self._enqueue(action)
        mem, streams, slot = self.mem, self.streams, self.slot
        h2d, d2h = streams[H2D], streams[D2H]
        self._try_compute()
        if h2d.queue or d2h.queue:
            self._try_transfers()
            while self.instant_ends:
                self.instant_ends = False
                self._try_compute()
                self._try_transfers()
        while True:
            now = self.now
            instant = self.running_until
            start = self.fault_start
            if start is not None and start > now and (instant is None or start < instant):
                instant = start
            down, up = slot
            if down is not None and (instant is None or down[1] < instant):
                instant = down[1]
            if up is not None and (instant is None or up[1] < instant):
                instant = up[1]
            if mem.credits and (instant is None or mem.credits[0][0] < instant):
                instant = mem.credits[0][0]
            if h2d.queue and self.h2d_free > now and (instant is None or self.h2d_free < instant):
                instant = self.h2d_free
            if d2h.queue and self.d2h_free > now and (instant is None or self.d2h_free < instant):
                instant = self.d2h_free
            if instant is None:
                break
            self.now = now = instant
            if mem.credits and mem.credits[0][0] <= now:
                mem.take_credits(now)
            if self.running_until == now:
                self._item_end()
            if down is not None and down[1] == now:
                if up is not None and up[1] == now and self.enqueued_at[up[0]] < self.enqueued_at[down[0]]:
                    self._transfer_end(up)
                    up = None
                self._transfer_end(down)
            if up is not None and up[1] == now:
                self._transfer_end(up)
            if self.running_until is None:
                self._try_compute()
            if (h2d.queue and h2d.running is None) or (d2h.queue and d2h.running is None):
                self._try_transfers()
                while self.instant_ends:
                    self.instant_ends = False
                    self._try_compute()
                    self._try_transfers()
        if self.head < self.n_items or any(s.queue for s in streams):
            raise _Infeasible(self._stuck())

    def _try_transfers(self) -> None:
        """R9: the heads of ``h2d`` and ``d2h`` (the only streams of UVM mode) try to
        start, in the order they were enqueued."""
        h2d, d2h = self.streams[H2D], self.streams[D2H]
        first = h2d.queue[0] if h2d.queue and h2d.running is None else None
        second = d2h.queue[0] if d2h.queue and d2h.running is None else None
        if first is None:
            first, second = second, None
        elif second is not None and self.enqueued_at[second] < self.enqueued_at[first]:
            first, second = second, first
        for j in (first, second):
            if j is not None:
                transfer = self.transfers[j]
                if self._can_start(transfer):
                    self._start_transfer(transfer)

    def _stuck(self) -> Blocked:
        mem = self.mem
        k = self.head
        item = k if k < len(self.seq) else -1
        heads = sorted((s.queue[0] for s in self.streams if s.queue), key=self.enqueued_at.__getitem__)
        tensor = self.transfers[heads[0]].tensor if heads else None
        return Blocked("R10", "stuck", item, tensor, 0, mem.budget - mem.ledger, mem.largest(),
                       after=self.transfers[heads[0]].kind if heads else "wait")

    def _fill(self, result: Result) -> None:
        mem = self.mem
        cache = mem.cache
        if cache is not None:   # R35: the SSD's side of faults and of the page cache's write-outs
            self.link_bytes[SSD_READ_LINK] += mem.ssd_read_bytes
            self.link_bytes[SSD_WRITE_LINK] += cache.written
            self.streams[SSD_WRITE].busy_ps += cache.write_busy
            self.last_transfer_end = max(self.last_transfer_end, cache.ssd_free)
        super()._fill(result)
        result.recomputes = 0
        result.stall_us = ps_to_us(self.stall_data + self.stall_memory + self.stall_fault)
        result.stall_fault_us = ps_to_us(self.stall_fault)
        result.peak_bytes, result.peak_at_us = mem.peak, ps_to_us(mem.peak_at)
        result.host_peak_bytes, result.ssd_peak_bytes = mem.host_peak, 0
        if cache is not None:   # R35: host memory holds the page cache; the file holds the backing tier
            result.host_peak_bytes, result.ssd_peak_bytes = cache.peak, mem.host_peak
        result.faults, result.fault_bytes = mem.faults, mem.fault_bytes
        result.evictions, result.writeback_bytes = mem.evictions, mem.writeback_bytes
        result.stall_by_op = {op: {"data_us": ps_to_us(d), "memory_us": ps_to_us(m), "fault_us": ps_to_us(f)}
                              for op, (d, m, f) in self.stall_by_op.items()}
        if self.record and result.timeline is not None:
            result.timeline.memory = [(ps_to_us(t), b) for t, b in mem.samples]
