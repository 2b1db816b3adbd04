"""UVM mode in time (R30-R38 of docs/simulation.md): ``_UvmRun``, one iteration of a UVM
plan with managed memory (simulator/run/uvm_memory.py's UvmMemory) as the memory policy,
on the run state both runs share (simulator/run/state.py ``RunState``: streams, links,
enqueueing, the common figures) with its own loop, and ``_run_uvm``, R36's two
back-to-back iterations. The static rules are simulator/compile/uvm.py's.
"""
from __future__ import annotations

from ..compile.compiled import CompiledProfile, Machine
from ..compile.program import Drop, Program, Transfer
from ..model.links import D2H, H2D, PCIE_DOWN, PCIE_UP, SSD_READ_LINK, SSD_WRITE, SSD_WRITE_LINK, STREAMS
from ..result import Result, Span
from ..units import ps_to_us
from .state import Blocked, RunState, _Infeasible
from .uvm_memory import UvmMemory, fault_schedule, fault_schedule_half, first_touch_ps, fresh_bytes, touch_delay_ps


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


class _UvmRun(RunState):
    """One iteration of a UVM plan (R30-R37): the shared compute stream and copy streams,
    with managed memory (simulator/run/uvm_memory.py's UvmMemory) as the memory policy.

    A compute item that could start (R6) pins what it touches and has its room decided
    at once (``_decide``): the blocks it faults, the evictions that make room, and when
    its write-backs (``d2h``) and fault batches (``h2d``) run, computed as a train (see
    simulator/run/uvm_memory.py); it starts when the last batch has ended. Hints (offload and
    prefetch) are transfers on the same streams, queued behind the trains."""

    def __init__(self, compiled: CompiledProfile, program: Program, machine: Machine, budget: int, record: bool,
                 names, memory: UvmMemory | None):
        super().__init__(compiled, program, machine, record, names)
        if memory is None:
            # R19, R35: the backing tier is host memory, or with SSD backing the file on the SSD (host memory
            # then holds only the page cache, which fits in it)
            capacity = machine.ssd_bytes if program.backing == "ssd" else machine.host_bytes
            memory = UvmMemory(compiled, machine, budget, program.read_mostly, capacity, program.backing)
        self.mem = memory
        memory.samples = [(0, memory.ledger)] if record else None
        self.touch = self.seq.uvm.items   # R31, made by the compile (simulator/compile/uvm.py)
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
        self.touch_batch_ps = machine.uvm.first_touch_ps   # R31: a batch of first-touch faults
        self.first_touch = 0                               # the head item's first-touch time
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
        time_ps = self.seq.time_ps[k]
        touch = touch_delay_ps(self.first_touch, time_ps)   # R31: first touches beyond the kernel's time
        fault_wait = now - self.decided_at + touch
        now += touch
        if data_wait or memory_wait or fault_wait:
            self.stall_data += data_wait
            self.stall_memory += memory_wait
            self.stall_fault += fault_wait
            entry = self.stall_by_op.setdefault(self.seq.group[k], [0, 0, 0])
            entry[0] += data_wait
            entry[1] += memory_wait
            entry[2] += fault_wait
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
            fresh = self.pool_alloc if mem.caching else fresh_bytes(mem, self.pool_alloc)   # R31, R38
            self.first_touch = first_touch_ps(fresh, mem.page, mem.batch_faults, self.touch_batch_ps)
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
            if not mem.caching:
                mem.recycled += workspace      # R31: its pages stay mapped for the next item
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
        self._fill_common(result)
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
        if self.record:
            self._timeline(result, mem.samples, mem.budget)
