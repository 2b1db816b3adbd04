"""The discrete-event simulation of one iteration: GPU compute, PCIe, host and SSD.

This is the reference statement of the rules (R1-R23 of docs/simulation.md) in Python:
``_Run`` runs a compiled program (simulator/compile/program.py) on a compiled profile
and machine (simulator/compile/compiled.py) with the resource parts of
simulator/run/resources.py; simulator/run/iteration.py's ``run_program`` starts it. The
C fast path (simulator/fast/explicit.py) must agree with it exactly; tests compare the
two. ``simulator.api`` is the entry (``simulate`` for one plan, ``Simulator`` to compile
a profile and a machine once and score many plans). The engine knows nothing of planners.

Plans in UVM mode (R30-R37: ``"memory": "uvm"``) have their own run with managed
memory as the memory policy (simulator/run/uvm.py's ``_UvmRun``, with
simulator/run/uvm_memory.py): two iterations, faults and evictions instead of explicit
copies. What both runs share (streams, links, enqueueing, the common figures, ``Blocked``)
is simulator/run/state.py's ``RunState``.

Time is integer picoseconds (R3). One compute stream runs the items of the compute
sequence in order (R5, R6); the streams ``h2d``, ``d2h``, ``ssd_read`` and ``ssd_write``
are FIFO queues that run one transfer at a time, whose flows share the links by
bandwidth (R17, R18). Time advances from instant to instant: at each instant every
completion (and the frees it causes) is applied first, then the compute head tries to
start, then the waiting transfers in enqueue order (R9).
"""
from __future__ import annotations

from ..compile.compiled import CompiledProfile, Machine
from ..compile.program import Drop, PlanInvalid, Program, Transfer
from ..model.allocation import allocation_keys
from ..result import Result, Span
from ..units import ps_to_us
from .arena import ArenaMemory
from .caching import CACHING_ALLOCATORS, CACHING_EXPANDABLE, CachingMemory
from .resources import Memory, Tiers
from .state import Blocked, RunState, _Infeasible


def allocation_lifetimes(compiled: CompiledProfile, program: Program, machine: Machine, budget: int):
    """R50: the run of a plan (explicit mode) under ``budget`` with every GPU allocation
    logged: (Result, [[key, owner, bytes, start ps, end ps or None (still held at the
    end)]]). Ranges come from an unbounded arena, so they never make anything wait: the
    times are those of the byte-counted run."""
    run = _Run(compiled, program, machine, budget, False, None, "first-fit", arena_bytes=2**62)
    result = run.run()
    return result, run.memory.log


class _Run(RunState):
    """One iteration of an explicit-mode plan: byte-counted GPU memory (or an arena, R50,
    R51), host and SSD tiers, and the loop that drives it to the end (``run``)."""

    def __init__(self, compiled: CompiledProfile, program: Program, machine: Machine, budget: int,
                 record: bool, names, allocator: str | None = None, arena_bytes: int | None = None):
        super().__init__(compiled, program, machine, record, names)
        nbytes = compiled.tensor_bytes if not program.buffer_bytes else {**compiled.tensor_bytes,
                                                                          **program.buffer_bytes}
        if allocator in CACHING_ALLOCATORS and program.placement is None:   # R55: PyTorch's caching allocator
            keys = program.keys if program.keys is not None else allocation_keys(program, compiled)
            self.memory = CachingMemory(budget, nbytes, keys, expandable=allocator == CACHING_EXPANDABLE)
        elif program.placement is not None or allocator is not None:   # R50, R51: address ranges
            keys = program.keys if program.keys is not None else allocation_keys(program, compiled)
            if program.placement is not None:
                allocator, arena_bytes = None, program.placement.arena_bytes
            self.memory = ArenaMemory(budget, nbytes, keys, arena_bytes or budget, program.placement, allocator)
        else:
            self.memory = Memory(budget, nbytes)          # with the encoded buffers of codecs (R41, R42)
        self.tiers = Tiers({"host": machine.host_bytes, "ssd": machine.ssd_bytes}, compiled.tensor_bytes)
        if record:
            self.memory.samples = [(0, 0)]

    # ------------------------------------------------------------------ completions

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

    def _comm_end(self) -> None:
        """R56: a collective ends as a GPU op does (R7: last-use frees, then the actions
        after it), with no workspace."""
        k, now = self.comm_running, self.now
        self.comm_running = None
        self.comm_pos += 1
        self.comm_busy_ps += now - self.comm_started_at
        self.last_comm_end = now
        if self.record:
            op_id, kernel, phase = self.names[self.seq.op_index[k]]
            wire = self.program.comm[k][0]
            self.spans.append(Span("comm", op_id, ps_to_us(self.comm_started_at), ps_to_us(now),
                                   {"op": op_id, "kernel": kernel, "phase": phase, "kind": "collective",
                                    "bytes": wire}))
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
                self._release_copy(transfer)   # R11: the last reader of its window, after the copy
        for action in self.program.actions.get(k, ()):
            if isinstance(action, Drop):
                self.memory.free(action.tensor, now)   # R14: at once
            else:
                self._enqueue(action)

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
                return  # R6: a prefetch before its op has not ended
            if self.program.deps and not self._deps_done(k):
                return  # R27: an item of the CPU stream it depends on has not ended
            if recomputed is not None and recomputed in self.memory.resident:
                return  # R15: the older copy is still being copied out (a data stall)
            self.data_ready_at = self.now
        if not self.memory.fits_item(k, seq.alloc_bytes[k]):
            return  # R6: its outputs and workspace cannot be allocated yet
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
        """R27, R58: the items of the other streams it waits for have ended."""
        done = self.done
        return all(done[j] for j in self.program.deps.get(k, ()))

    def _try_comm(self) -> None:
        """R58: the comm stream's next collective starts when the previous one ended, the
        GPU item before it in the sequence has started, the items of the other streams it
        depends on and the prefetches before it have ended, and its outputs fit; it waits
        its ring steps' latency, then its wire bytes flow over its links (R57)."""
        if self.comm_running is not None or self.comm_pos >= len(self.comm_items):
            return
        k = self.comm_items[self.comm_pos]
        issuer = self.program.issue_after[k]
        if issuer >= 0 and not (self.done[issuer] or (issuer == self.head and self.running_until is not None)):
            return
        if self.program.deps and not self._deps_done(k):
            return
        if any(not self.ended[w.index] for w in self.program.waits.get(k, ())):
            return
        seq, now = self.seq, self.now
        if not self.memory.fits_item(k, seq.alloc_bytes[k]):
            return
        self.memory.allocate(seq.allocs[k], 0, now)
        wire, latency, links = self.program.comm[k]
        self.comm_running, self.comm_started_at = k, now
        for link in links:
            self.link_bytes[link] += wire
        if latency:
            self.comm_latency_until = now + latency
        else:
            self.links.start(-1 - k, links, wire, now)

    def _try_cpu(self) -> None:
        """R24, R27: the CPU stream's next item starts when the previous one ended, the items
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
        if self.comm_latency_until is not None:
            times.append(self.comm_latency_until)
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
        if self.comm_latency_until == now:      # R57: the ring's latency ends, its bytes flow
            self.comm_latency_until = None
            k = self.comm_running
            wire, _, links = self.program.comm[k]
            self.links.start(-1 - k, links, wire, now)
        ending = self.links.ending_at(now)
        if ending:
            self.links.finish(ending, now)
            for j in sorted((j for j in ending if j >= 0), key=self.enqueued_at.__getitem__):
                self._transfer_end(j)
            if any(j < 0 for j in ending):      # a collective's flow (keyed -1 - item)
                self._comm_end()

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
        self._try_comm()
        self._try_cpu()
        self._try_transfers()
        while True:
            instant = self._next_instant()
            if instant is None:
                break
            self.now = instant
            self._complete()
            self._try_compute()
            self._try_comm()
            self._try_cpu()
            self._try_transfers()
        if (self.head < len(self.seq) or self.cpu_pos < len(self.cpu_items) or self.comm_pos < len(self.comm_items)
                or any(s.queue for s in self.streams)):
            raise _Infeasible(self._stuck())

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
        asks_again = arena is not None or isinstance(memory, CachingMemory)   # R50, R51, R55: say which allocation
        if k < len(seq) and self.data_ready_at is not None:   # the item itself waits for memory
            recomputed = seq.recomputed[k]
            if asks_again:
                memory.fits_item(k, seq.alloc_bytes[k])     # which of its allocations waits, and for whom
                arena = memory.blocked
            return Blocked("R10", "op" if recomputed is None else "recompute", k, recomputed,
                           seq.alloc_bytes[k], free, memory.largest(), arena=arena)
        item = k if k < len(seq) else -1
        if self.comm_running is None and self.comm_pos < len(self.comm_items):   # R58: a collective waits
            c = self.comm_items[self.comm_pos]
            issuer = self.program.issue_after[c]
            if (issuer < 0 or self.done[issuer]) and self._deps_done(c) \
                    and not self.memory.fits_item(c, seq.alloc_bytes[c]):
                return Blocked("R10", "collective", item, None, seq.alloc_bytes[c], free, memory.largest(),
                               after=seq.group[c], arena=getattr(memory, "blocked", None))
        heads = sorted((s.queue[0] for s in self.streams if s.queue), key=self.enqueued_at.__getitem__)
        for j in heads:
            transfer = self.transfers[j]
            if (transfer.kind == "prefetch" and (transfer.source < 0 or self.ended[transfer.source])
                    and transfer.tensor not in memory.resident):   # it waits for room, nothing else
                size = memory.nbytes[transfer.buffer or transfer.tensor]
                if asks_again:
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
        self._fill_common(result)
        result.peak_bytes = self.memory.peak
        result.peak_at_us = ps_to_us(self.memory.peak_at)
        if isinstance(self.memory, ArenaMemory):      # R50, R51
            result.arena_bytes = self.memory.arena_bytes
            extent = self.memory.ranges.extent
            result.fragmentation = extent / self.memory.peak if self.memory.peak else 1.0
        if isinstance(self.memory, CachingMemory):    # R55
            result.reserved_bytes = self.memory.reserved_peak
        result.host_peak_bytes = self.tiers.peak["host"]
        result.ssd_peak_bytes = self.tiers.peak["ssd"]
        if self.record:
            self._timeline(result, self.memory.samples, self.memory.budget)


def invalid_result(exc: PlanInvalid, budget: int, compiled: CompiledProfile) -> Result:
    """The result of a plan that breaks a rule."""
    return Result(valid=False, feasible=False, rule=exc.rule, op=exc.op, tensor=exc.tensor, reason=exc.reason,
                  budget_bytes=budget, ideal_us=ps_to_us(compiled.ideal_ps), progress=0.0)
