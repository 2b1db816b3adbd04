"""The one scheduler both backends run: a plan replayed as a runtime would run it.

It keeps the runtime's state (which tensor is where, at which version, what each stream
runs, the memory in use) and decides, as docs/simulation.md says, what starts when:

- one compute stream runs the compute sequence in order (R5); an item starts when the
  previous one has ended, the prefetches whose ``before`` is its op have ended, and its
  outputs and workspace can be placed (R6);
- four copy streams (``h2d``, ``d2h``, ``ssd_read``, ``ssd_write``) are FIFO queues, each
  running one copy at a time; a prefetch at the head of its queue starts once its
  source copy is written, no older GPU copy of its tensor remains and its bytes can be
  placed, and blocks the copies behind it while it waits (R12); a half-duplex machine
  has one copy engine (R17);
- when an item ends: its workspace goes, tensors whose last use it was go (or when their
  offload ends, R7), offloads whose window's last reader it was release their GPU copy
  (R11), then the copies and drops after its op are issued in plan order (R7, R14).

What the scheduler does not do is trust the plan. Every use checks that the tensor is on
the GPU and has been waited for (a prefetch is waited for by its ``before`` op), every
prefetch that its source tier holds a copy, every drop that no copy is still reading
the memory it frees; and the backend checks the data of every use and every copy
against the tensor's pattern (executor/pattern.py). The first problem stops the replay
with a ``ReplayFailure`` naming the op (or copy) and the tensor.

Events come from the backend's threads (a stream worker, or a CUDA event watcher): each
callback takes the scheduler's lock, updates the state and starts what can start, in
the order of R9 (the compute stream first, then the copy heads in enqueue order). So
nothing polls, and an item starts as soon as the event that lets it start is seen. A
pipelined backend (CUDA) may be given the next item while one runs, when nothing the
running one's end does can change whether or how the next starts (``_may_launch_early``):
the GPU then goes on without waiting a host round trip.

Time. Backends stamp every completion with the time it was *due*, or with the time its
work really finished when that is later: a kernel is due at its start plus its scaled
duration, a copy when its flow's credit reaches its last byte. What an event lets start
is stamped to start at that event's time (or when its stream was free, if later). The
threads really wait until those times, the copies and checks really run in between, and
the iteration's time is the last stamp; but a thread that the OS wakes a few
milliseconds late (on a loaded 2-core machine, every few items) does not push the rest
of the iteration back, as it would if every start were read off the clock after the
wake-up. Work that really takes longer than its due time (checks slower than the
kernel, a copy thread starved of CPU) is stamped when it finished, so it shows.

Memory is counted twice: the profile's bytes against the budget, exactly as the
simulator counts them (R2, R4), and the scaled bytes in the backend's region, placed by
a first-fit allocator (executor/arena.py). A block within the budget that finds no hole
makes room by moving blocks no running work uses (real copies, charged as the GPU would
take to copy them); if even that leaves no hole, it waits, like one over the budget. A
plan with a placement (R50) puts every block at its planned offset instead
(``PlacedArena``): nothing moves, and an allocation whose range is held waits for it.
"""
from __future__ import annotations

import threading
import time
from collections import deque

from simulator.model.links import STREAMS
from .arena import Arena, PlacedArena
from .pattern import Patterns
from .program import Copy, Drop, RuntimePlan
from .work import PS, Block, CopyWork, ItemWork, Measured, ReplayFailure, scaled_bytes

class Scheduler:
    """Runs one iteration of ``runtime`` on ``backend``; see the module docstring."""

    def __init__(self, runtime: RuntimePlan, backend, budget: int, time_scale: float, size_scale: float,
                 arena_bytes: int, patterns: Patterns, hbm_gbps: float = 1000.0,
                 placed: PlacedArena | None = None):
        self.rt = runtime
        self.seq = runtime.seq
        self.backend = backend
        self.budget = budget
        self.time_scale = time_scale
        self.size_scale = size_scale
        self.hbm_bytes_per_s = hbm_gbps * 1e9
        self.patterns = patterns
        self.placed = placed is not None     # R50: blocks at the plan's offsets, never moved
        self.arena = placed if placed is not None else Arena(arena_bytes)
        profile = runtime.profile
        self.nbytes = {t.id: t.bytes for t in profile.tensors}
        self.persistent = [t.id for t in profile.tensors if t.persistent]
        self.lock = threading.RLock()
        self.done = threading.Event()
        self.failure: ReplayFailure | None = None
        self.measured = Measured()
        self.t0 = 0.0
        self.event_at = 0.0          # when the event being handled was due (see "Time" above)
        # tensors
        self.block: dict[str, Block] = {}
        self.version: dict[str, int] = {}
        self.history: dict[str, str] = {}
        self.awaiting: dict[str, Copy] = {}          # prefetch issued, not yet waited for (R13)
        self.window: dict[str, Copy] = {}            # offload whose window is open (R11)
        self.pending_offloads: dict[str, int] = {}   # offloads queued or copying
        self.dead_pending: set[str] = set()
        self.writing: dict[tuple[str, str], int] = {}       # (tensor, tier) -> offloads writing it
        self.copy_version: dict[tuple[str, str], int] = {}  # (tensor, tier) -> version its copy holds
        self.tier_held: set[tuple[str, str]] = set()
        self.tier_used = {"host": 0, "ssd": 0}
        self.used = 0
        # compute
        self.head = 0                                 # the next item to launch
        self.in_flight: deque[ItemWork] = deque()     # items launched and not yet seen to end
        self.items_ended = 0
        self.pipelined = bool(getattr(backend, "pipelined", False))
        self.compute_free_at = 0.0
        self.stream_free_at = {name: 0.0 for name in STREAMS}
        self.engine_free_at = 0.0
        self.data_ready = False
        self.releases: dict[int, list[Copy]] = {}
        for copy in runtime.copies:
            if copy.kind == "offload" and copy.last_reader >= 0:
                self.releases.setdefault(copy.last_reader, []).append(copy)
        # copies
        n = len(runtime.copies)
        self.enqueued = [-1] * n
        self.ended = [False] * n
        self.offload_version = [0] * n
        self.enqueue_count = 0
        self.queues = {name: deque() for name in STREAMS}
        self.running: dict[str, Copy | None] = {name: None for name in STREAMS}
        self.started_at: dict[int, float] = {}
        self.running_copies: dict[str, CopyWork] = {}   # stream -> the copy it runs
        self.engine_holder: Copy | None = None

    # ------------------------------------------------------------------ set-up and run

    def scaled(self, nbytes: int) -> int:
        return scaled_bytes(nbytes, self.size_scale)

    def place_start(self) -> None:
        """Before the clock starts (R10, R19): persistent tensors on the GPU in profile
        order, filled with their pattern; ``initial`` copies written to their tier."""
        initial = self.rt.plan.initial
        if self.placed:
            self._check_placement()
        for tid in self.persistent:
            self.version[tid] = 0
            if tid in initial:
                tier = initial[tid]
                self._take_tier(tid, tier, None)
                self.copy_version[(tid, tier)] = 0
                self.backend.place_copy(tid, tier, self.scaled(self.nbytes[tid]), self.patterns.seed(tid, 0))
                self.history[tid] = f"starts in {tier} (initial)"
                continue
            if self.used + self.nbytes[tid] > self.budget:
                raise ReplayFailure("memory", None, tid, f"at start: persistent tensor {tid} "
                                    f"({self.nbytes[tid]} bytes) does not fit (budget overrun): "
                                    f"{self.budget - self.used} bytes of the {self.budget}-byte budget are free")
            block = self._place(tid, self.nbytes[tid], 0, self.rt.start_keys.get(tid))
            if block is None:
                raise ReplayFailure("memory", None, tid, f"at start: persistent tensor {tid} finds no hole in the "
                                    "GPU region" + self._range_note(self.rt.start_keys.get(tid)))
            self.backend.place(block)
            self.history[tid] = "on the GPU from the start"
        self.measured.peak_bytes = self.used

    def run(self, timeout_s: float) -> None:
        """Run the iteration; raises ReplayFailure when the replay fails."""
        self.backend.start(self)
        try:
            self._run(timeout_s)
        except BaseException:
            self.backend.abort()
            raise
        finally:
            self.backend.stop()
        if self.failure is not None:
            raise self.failure
        self._check_end()

    def _run(self, timeout_s: float) -> None:
        with self.lock:
            self.t0 = self.event_at = self.compute_free_at = self.backend.clock()
            self.stream_free_at = {name: self.t0 for name in STREAMS}
            self.engine_free_at = self.t0
            try:
                for step in self.rt.at_start:
                    self._issue(step)
            except ReplayFailure as failure:
                self._fail(failure.kind, failure.op, failure.tensor, failure.message)
            self._pump()
        finished = self.done.wait(timeout_s)
        self.measured.wall_s = self.backend.clock() - self.t0
        with self.lock:
            if not finished and self.failure is None:
                self._fail("timeout", None, None, f"the replay did not finish in {timeout_s:.0f} s of real time "
                           f"(item {self.head} of {len(self.seq)}: {self._head_name()})")

    def _head_name(self) -> str:
        return self.rt.item_name(self.head) if self.head < len(self.seq) else "compute done"

    # ------------------------------------------------------------------ memory

    def _check_placement(self) -> None:
        """R50, before the clock starts: every allocation of the iteration has an offset,
        its range lies inside the arena, and the arena fits the budget (a runtime lays out
        the whole arena before it runs). Offsets for no allocation are ignored."""
        placement = self.rt.plan.placement
        offsets = placement.offsets
        for key, owner, nbytes, op in self.rt.allocations():
            what = f"{owner}'s" if owner else "the workspace's"
            if key is None:   # executor/program.py: a plan that breaks a rule has no keys
                raise ReplayFailure("placement", op, owner or None, "the plan breaks a simulation rule, so its "
                                    "allocations have no keys to place (`swapplan simulate` says which)")
            if key not in offsets:
                raise ReplayFailure("placement", op, owner or None, f"the placement has no offset for allocation "
                                    f"{key!r} ({what} {nbytes} bytes)")
            if offsets[key] + nbytes > placement.arena_bytes:
                raise ReplayFailure("placement", op, owner or None, f"allocation {key!r} at [{offsets[key]}, "
                                    f"{offsets[key] + nbytes}) passes the placement's arena of "
                                    f"{placement.arena_bytes} bytes")
        if placement.arena_bytes > self.budget:
            raise ReplayFailure("memory", None, None, f"at start: the placement's arena ({placement.arena_bytes} "
                                f"bytes) is larger than the budget ({self.budget} bytes) (R50)")

    def _range_note(self, key: str | None) -> str:
        """Why allocation ``key`` waits for its planned range (R50), or ''."""
        info = self.arena.blocked.get(key) if self.placed and key is not None else None
        if info is None:
            return ""
        start, end = info["range"]
        owner = info["owner"]
        who = f"tensor {owner}" if owner else "a workspace"
        return f"; allocation {key!r} at [{start}, {end}) of the placement is held by {info['held_by']!r} ({who})"

    def _place(self, tid: str, nbytes: int, version: int, key: str | None = None) -> Block | None:
        """Take ``nbytes`` of the budget and a block of the region for ``tid`` (at the
        offset of allocation ``key`` when the plan has a placement); None (and nothing
        taken) when no hole is large enough, or the range is held. The caller checked
        the budget."""
        size = self.scaled(nbytes)
        offset = self._allocate(size, key, tid, nbytes)
        if offset is None:
            return None
        block = Block(tid, offset, size, self.patterns.seed(tid, version))
        self.block[tid] = block
        self.used += nbytes
        return block

    def _allocate(self, size: int, key: str | None = None, owner: str = "", nbytes: int = 0) -> int | None:
        """First fit; when the region has the room but no hole, compact it and try again.
        With a placement: the planned offset of ``key`` (``nbytes`` of the profile), or
        None while its range is held; never a compaction."""
        if self.placed:
            offset = self.arena.take(key, owner, nbytes, size)
            if offset is None:
                self.measured.range_waits += 1
            return offset
        offset = self.arena.allocate(size)
        if offset is None and self.arena.free_bytes >= size:
            self._compact(size)
            offset = self.arena.allocate(size)
        if offset is None:
            self.measured.hole_waits += 1
        return offset

    def _compact(self, need: int) -> None:
        """Make a hole of ``need`` bytes by moving blocks no running kernel or copy uses
        (real copies: their CPU time delays what starts next)."""
        pinned = {work.block.offset for work in self.running_copies.values()}
        for work in self.in_flight:
            pinned.update(block.offset for block in work.reads + work.writes)
            if work.workspace is not None:
                pinned.add(work.workspace.offset)
        way = "apart"
        moves = self.arena.make_room(need, pinned)
        if moves is None:
            way, moves = "down", self.arena.slide(need, pinned)
        if not moves:
            return
        at = {block.offset: block for block in self.block.values()}
        started = time.thread_time()
        self.backend.move(moves, way)
        for old, new, _ in moves:
            at[old].offset = new
        moved = sum(size for _, _, size in moves)
        # the copies take what a device-to-device copy of the profile's bytes takes (each
        # byte read and written at the GPU's memory rate), or their CPU time if longer;
        # deciding where blocks go is the host's work, done while the GPU waits anyway
        gpu_s = 2 * moved / self.size_scale / self.hbm_bytes_per_s * self.time_scale
        spent = max(gpu_s, time.thread_time() - started)
        m = self.measured
        m.compactions += 1
        m.compacted_bytes += moved
        m.compaction_s += spent
        self.event_at += spent      # what starts after a compaction starts after it

    def _note_peak(self) -> None:
        if self.used > self.measured.peak_bytes:
            self.measured.peak_bytes = self.used
            self.measured.peak_at_s = self.event_at - self.t0

    def _free_gpu(self, tid: str, why: str) -> None:
        block = self.block.pop(tid, None)
        if block is not None:
            self.arena.free(block.offset)
            self.used -= self.nbytes[tid]
        self.history[tid] = why

    def _take_tier(self, tid: str, tier: str, copy: Copy | None) -> None:
        """R19: a copy holds its tier's space from its offload's start until the tensor is
        dead; exceeding a capacity fails the replay."""
        if (tid, tier) in self.tier_held:
            return
        self.tier_held.add((tid, tier))
        self.tier_used[tier] += self.nbytes[tid]
        attr = "host_peak_bytes" if tier == "host" else "ssd_peak_bytes"
        setattr(self.measured, attr, max(getattr(self.measured, attr), self.tier_used[tier]))
        capacity = self.rt.host_bytes if tier == "host" else self.rt.ssd_bytes
        if self.tier_used[tier] > capacity:
            where = copy.describe() if copy is not None else f"the initial copy of {tid}"
            raise ReplayFailure("capacity", copy.after if copy else None, tid,
                                f"{where}: {tier} capacity exceeded ({self.tier_used[tier]} bytes needed, "
                                f"{capacity} available)")

    def _release_tiers(self, tid: str) -> None:
        for tier in ("host", "ssd"):
            if (tid, tier) in self.tier_held:
                self.tier_held.discard((tid, tier))
                self.tier_used[tier] -= self.nbytes[tid]
                self.copy_version.pop((tid, tier), None)
                self.backend.release_tier(tid, tier)

    # ------------------------------------------------------------------ failing

    def _fail(self, kind: str, op: str | None, tensor: str | None, message: str) -> None:
        if self.failure is None:
            self.failure = ReplayFailure(kind, op, tensor, message)
            self.backend.abort()
            self.done.set()

    # ------------------------------------------------------------------ issuing (R7, R11, R12, R14)

    def _issue(self, step) -> None:
        tid = step.tensor
        if isinstance(step, Drop):
            self._drop(step)
        elif step.kind == "offload":
            block = self.block.get(tid)
            if block is None or tid in self.awaiting:
                raise ReplayFailure("residency", step.after, tid, f"{step.describe()}: {tid} is not on the GPU "
                                    f"({self._where(tid)})")
            if tid in self.window:
                raise ReplayFailure("order", step.after, tid, f"{step.describe()}: {tid} is already being "
                                    f"offloaded ({self.window[tid].describe()}, window still open)")
            self.window[tid] = step
            self.pending_offloads[tid] = self.pending_offloads.get(tid, 0) + 1
            self.writing[(tid, step.tier)] = self.writing.get((tid, step.tier), 0) + 1
            self._enqueue(step)
        else:
            self.window.pop(tid, None)
            if tid in self.awaiting:
                raise ReplayFailure("order", step.after, tid, f"{step.describe()}: {tid} is already incoming "
                                    f"({self.awaiting[tid].describe()})")
            if tid in self.block and not self.pending_offloads.get(tid):
                raise ReplayFailure("order", step.after, tid, f"{step.describe()}: {tid} is already on the GPU "
                                    "and nothing is copying it out")
            self.awaiting[tid] = step
            self._enqueue(step)

    def _drop(self, step: Drop) -> None:
        tid = step.tensor
        what = f"drop of {tid} after {step.after}"
        if tid in self.awaiting:
            raise ReplayFailure("order", step.after, tid, f"{what}: its {self.awaiting[tid].describe()} has not "
                                "been waited for")
        if tid not in self.block:
            raise ReplayFailure("residency", step.after, tid, f"{what}: {tid} is not on the GPU "
                                f"({self._where(tid)})")
        if self.pending_offloads.get(tid):
            raise ReplayFailure("order", step.after, tid, f"{what}: its {self.window[tid].describe()} is still "
                                "copying from the memory the drop would free")
        self.window.pop(tid, None)
        copies = [tier for tier in ("host", "ssd") if self.copy_version.get((tid, tier)) == self.version[tid]]
        self._free_gpu(tid, f"dropped after {step.after}" + (f", a copy in {' and '.join(copies)}" if copies
                                                            else " with no copy off the GPU"))

    def _enqueue(self, copy: Copy) -> None:
        self.enqueued[copy.index] = self.enqueue_count
        self.enqueue_count += 1
        self.queues[copy.stream].append(copy)

    def _where(self, tid: str) -> str:
        return self.history.get(tid, "not produced yet")

    # ------------------------------------------------------------------ starting (R6, R9, R12)

    def _pump(self) -> None:
        """Start what can start: the compute head, then the copy heads in enqueue order;
        then finish, or fail when nothing runs and work remains (R10)."""
        if self.failure is not None:
            return
        try:
            self._try_compute()
            self._try_copies()
        except ReplayFailure as failure:
            self._fail(failure.kind, failure.op, failure.tensor, failure.message)
            return
        if self.in_flight or any(self.running.values()):
            return
        if self.head >= len(self.seq) and not any(self.queues.values()):
            self.done.set()
            return
        self._fail(*self._stuck())

    def _try_compute(self) -> None:
        k, seq, rt = self.head, self.seq, self.rt
        if k >= len(seq):
            return
        early = bool(self.in_flight)
        if early and not self._may_launch_early(k):
            return
        name = rt.item_name(k)
        if not self.data_ready:
            for copy in rt.waits.get(k, ()):
                if not self.ended[copy.index]:
                    if self.enqueued[copy.index] < 0 and copy.issue_item >= k:
                        raise ReplayFailure("order", seq.group[k], copy.tensor,
                                            f"{name} waits for the {copy.describe()}, which is issued only "
                                            f"after {copy.after} ends: it would wait forever")
                    return
            recomputed = seq.recomputed[k]
            if recomputed is not None and recomputed in self.block:
                if self.pending_offloads.get(recomputed):
                    return   # R15: the older GPU copy is still being copied out
                raise ReplayFailure("order", seq.group[k], recomputed, f"{name}: {recomputed} is still on the GPU")
            self.data_ready = True
            for copy in rt.waits.get(k, ()):
                if self.awaiting.get(copy.tensor) is copy:
                    del self.awaiting[copy.tensor]     # waited for: usable from here on (R13)
            self._check_uses(k, name)
        alloc_bytes = seq.alloc_bytes[k]
        if self.used + alloc_bytes + (self._queued_prefetch_bytes() if early else 0) > self.budget:
            return
        placed: list[Block] = []
        self._check_uses(k, name)
        for tid, key in zip(seq.allocs[k], rt.alloc_keys[k]):
            block = self._place(tid, self.nbytes[tid], 0, key)   # produced (or recomputed) data is version 0
            if block is None:
                for done in placed:
                    self._free_gpu(done.tensor, self.history.get(done.tensor, ""))
                return
            placed.append(block)
        workspace = None
        if seq.workspace[k]:
            offset = self._allocate(self.scaled(seq.workspace[k]), rt.workspace_keys[k], "", seq.workspace[k])
            if offset is None:
                for done in placed:
                    self._free_gpu(done.tensor, self.history.get(done.tensor, ""))
                return
            workspace = Block("", offset, self.scaled(seq.workspace[k]), 0)
            self.used += seq.workspace[k]
        work = self._launch(k, name, placed, workspace)
        if early:       # counted when the item before it ends, as R6 has it start then
            self.used -= alloc_bytes
            work.deferred = alloc_bytes
        else:
            self._note_peak()
            self._try_compute()          # a pipelined backend may take the next one now

    def _may_launch_early(self, k: int) -> bool:
        """A pipelined backend (CUDA) may launch item k while k - 1 runs, so that the GPU
        goes on from one to the next without waiting for the host to see k - 1 end, when
        nothing k - 1's end does can change whether or how k starts: k waits for no
        copy still running, the actions after k - 1 touch nothing k uses, and k's
        memory fits beside everything k - 1 holds and every queued prefetch (so no
        prefetch waits that would not under R6 and R12)."""
        if not self.pipelined or len(self.in_flight) != 1:
            return False
        seq, rt = self.seq, self.rt
        if any(not self.ended[copy.index] for copy in rt.waits.get(k, ())):
            return False
        if seq.recomputed[k] is not None and seq.recomputed[k] in self.block:
            return False
        used = set(rt.reads[k]) | set(rt.updates[k]) | set(seq.allocs[k])
        return not any(step.tensor in used for step in rt.after_item.get(self.in_flight[0].item, ()))

    def _queued_prefetch_bytes(self) -> int:
        return sum(copy.nbytes for q in self.queues.values() for copy in q if copy.kind == "prefetch")

    def _check_uses(self, k: int, name: str) -> None:
        """R13 and R11, at the moment the item would start: every tensor it reads or
        updates is on the GPU and waited for; none it updates is being offloaded."""
        op = self.seq.group[k]
        for verb, names in (("reads", self.rt.reads[k]), ("updates", self.rt.updates[k])):
            for tid in names:
                incoming = self.awaiting.get(tid)
                if incoming is not None:
                    if self.ended[incoming.index]:
                        state = "has landed, but nothing waited for it"
                    elif self.enqueued[incoming.index] >= 0 and incoming in (self.running.get(incoming.stream),):
                        state = "is still copying"
                    else:
                        state = "has not started"
                    raise ReplayFailure("arrival", op, tid, f"{name} {verb} {tid} before it arrived: its "
                                        f"{incoming.describe()} {state} (use before arrival)")
                if tid not in self.block:
                    raise ReplayFailure("residency", op, tid, f"{name} {verb} {tid}, which is not on the GPU "
                                        f"({self._where(tid)})")
                if verb == "updates" and tid in self.window:
                    raise ReplayFailure("order", op, tid, f"{name} updates {tid} inside the window of its "
                                        f"{self.window[tid].describe()} (R11)")

    def _launch(self, k: int, name: str, placed: list[Block], workspace: Block | None) -> ItemWork:
        seq, rt, patterns = self.seq, self.rt, self.patterns
        op = seq.group[k]
        reads = [self._current(tid) for tid in rt.reads[k]]
        writes = list(placed)
        for block in placed:
            self.history[block.tensor] = f"produced by {name}"
            if seq.recomputed[k] is None:
                self.version[block.tensor] = 0
        for tid in rt.updates[k]:
            reads.append(self._current(tid))
            self.version[tid] = self.version.get(tid, 0) + 1      # R16: tier copies are now stale
            block = self.block[tid]
            block.seed = patterns.seed(tid, self.version[tid])
            writes.append(Block(tid, block.offset, block.nbytes, block.seed))
        duration = seq.time_ps[k] * PS * self.time_scale
        work = ItemWork(k, name, op, duration, reads, writes, workspace, max(self.event_at, self.compute_free_at))
        self.in_flight.append(work)
        self.head = k + 1
        self.data_ready = False
        self.backend.run_item(work)
        return work

    def _current(self, tid: str) -> Block:
        block = self.block[tid]
        block.seed = self.patterns.seed(tid, self.version.get(tid, 0))
        return Block(tid, block.offset, block.nbytes, block.seed)

    def _try_copies(self) -> None:
        heads = [q[0] for name, q in self.queues.items() if q and self.running[name] is None]
        for copy in sorted(heads, key=lambda c: self.enqueued[c.index]):
            if copy.uses_engine and self.engine_holder is not None:
                continue
            tid = copy.tensor
            if copy.kind == "prefetch":
                if self.writing.get((tid, copy.tier)):
                    continue                          # its source copy is still being written
                if (tid, copy.tier) not in self.copy_version:
                    raise ReplayFailure("residency", copy.after, tid, f"{copy.describe()}: {copy.tier} holds no "
                                        f"copy of {tid} ({self._where(tid)})")
                if tid in self.block:
                    continue                          # an older GPU copy remains
                if self.used + copy.nbytes > self.budget:
                    continue
                block = self._place(tid, copy.nbytes, self.version[tid], copy.key)
                if block is None:
                    continue
                self._note_peak()
                self.history[tid] = f"prefetched from {copy.tier} after {copy.after}"
            else:
                self._take_tier(tid, copy.tier, copy)
                self.offload_version[copy.index] = self.version[tid]
                block = self._current(tid)
            self.queues[copy.stream].popleft()
            self.running[copy.stream] = copy
            if copy.uses_engine:
                self.engine_holder = copy
            for link in copy.links:
                self.measured.link_bytes[link] += copy.nbytes
            start_at = max(self.event_at, self.stream_free_at[copy.stream])
            if copy.uses_engine:
                start_at = max(start_at, self.engine_free_at)
            self.started_at[copy.index] = start_at
            work = CopyWork(copy, Block(tid, block.offset, block.nbytes, block.seed),
                            copy.latency_ps * PS * self.time_scale, self.time_scale, start_at)
            self.running_copies[copy.stream] = work
            self.backend.run_copy(work)

    # ------------------------------------------------------------------ completions (R7, R11)

    def item_done(self, work: ItemWork, start: float, end: float, error: tuple[str, str] | None,
                  late: float = 0.0) -> None:
        """Called by the backend when an item has ended: ``error`` is (tensor, what its
        checks found); ``late`` how many seconds its checks and writes outlasted its
        scaled time."""
        with self.lock:
            if self.failure is not None:
                return
            if error is not None:
                self._fail("integrity", work.op, error[0], f"{work.name}: {error[1]}")
                return
            m, seq, k = self.measured, self.seq, work.item
            m.compute_busy_s += end - start
            m.stall_s += max(0.0, start - self.compute_free_at)
            if late > 0:
                m.late_items += 1
                m.late_s += late
            self.event_at = self.compute_free_at = end
            m.last_compute_end = max(m.last_compute_end, end - self.t0)
            self.in_flight.popleft()
            self.items_ended = k + 1
            if work.workspace is not None:
                self.arena.free(work.workspace.offset)
                self.used -= seq.workspace[k]
            for tid in seq.frees[k]:
                if self.pending_offloads.get(tid):
                    self.dead_pending.add(tid)
                else:
                    self._free_gpu(tid, f"freed after its last use ({work.name})")
                    self._release_tiers(tid)
            for copy in self.releases.get(k, ()):
                if self.ended[copy.index] and copy.tensor in self.block:   # (a prefetch waits for it to go)
                    self._free_gpu(copy.tensor, f"offloaded to {copy.tier} after {copy.after}")
            try:
                for step in self.rt.after_item.get(k, ()):
                    self._issue(step)
            except ReplayFailure as failure:
                self._fail(failure.kind, failure.op, failure.tensor, failure.message)
                return
            if self.in_flight and self.in_flight[0].deferred:    # launched early: it starts now (R6)
                self.used += self.in_flight[0].deferred
                self.in_flight[0].deferred = 0
                self._note_peak()
            self._pump()

    def copy_done(self, work: CopyWork, start: float, end: float, error: str | None) -> None:
        """Called by the backend when a copy has ended (``error``: what its checks of the
        data found)."""
        with self.lock:
            if self.failure is not None:
                return
            copy = work.copy
            if error is not None:
                self._fail("integrity", copy.after, copy.tensor, f"{copy.describe()}: {error}")
                return
            m, tid = self.measured, copy.tensor
            self.ended[copy.index] = True
            self.running[copy.stream] = None
            self.running_copies.pop(copy.stream, None)
            self.event_at = self.stream_free_at[copy.stream] = end
            if self.engine_holder is copy:
                self.engine_holder = None
                self.engine_free_at = end
            m.stream_busy_s[copy.stream] += end - self.started_at[copy.index]
            m.last_copy_end = max(m.last_copy_end, end - self.t0)
            if copy.kind == "offload":
                self.pending_offloads[tid] -= 1
                self.writing[(tid, copy.tier)] -= 1
                if (tid, copy.tier) in self.tier_held:
                    self.copy_version[(tid, copy.tier)] = self.offload_version[copy.index]
                if copy.last_reader < self.items_ended and tid in self.block:
                    self._free_gpu(tid, f"offloaded to {copy.tier} after {copy.after}")
                if tid in self.dead_pending and not self.pending_offloads[tid]:
                    self.dead_pending.discard(tid)   # R7: dead, freed now that its offload ended
                    self._free_gpu(tid, "freed after its last use, once its offload ended")
                    self._release_tiers(tid)
            self._pump()

    def backend_failed(self, where: str, exc: BaseException) -> None:
        """A backend thread hit an unexpected error: stop the replay rather than hang."""
        with self.lock:
            self._fail("backend", None, None, f"the {where} thread failed: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ the end

    def _stuck(self) -> tuple[str, str | None, str | None, str]:
        """R10: nothing runs and work remains: what waits, for what."""
        k, seq = self.head, self.seq
        free = self.budget - self.used
        residents = sorted(self.block, key=lambda t: (-self.nbytes[t], t))[:5]
        shown = ", ".join(f"{t} ({self.nbytes[t]} B)" for t in residents) or "none"
        region = "" if self.placed else (f"; the region has {self.arena.free_bytes} bytes free, its largest "
                                         f"hole {self.arena.largest_hole()}")
        if k < len(seq) and self.data_ready:
            need = seq.alloc_bytes[k]
            tensor = seq.recomputed[k] or (seq.allocs[k][0] if seq.allocs[k] else None)
            note = ""
            if self.used + need > self.budget:
                what = "budget overrun"
            elif self.placed:
                what = "its planned range is held"
                for tid, key in [*zip(seq.allocs[k], self.rt.alloc_keys[k]), (None, self.rt.workspace_keys[k])]:
                    note = self._range_note(key)
                    if note:
                        tensor = tid or tensor
                        break
            else:
                what = "no hole large enough"
            return ("memory", seq.group[k], tensor,
                    f"{self.rt.item_name(k)} waits for memory ({what}): needs {need} bytes, {free} of the "
                    f"{self.budget}-byte budget free, and nothing running will free more{region}{note}; largest "
                    f"residents: {shown}")
        heads = sorted((q[0] for q in self.queues.values() if q), key=lambda c: self.enqueued[c.index])
        op = seq.group[k] if k < len(seq) else None
        for copy in heads:
            if copy.kind == "prefetch":
                if copy.tensor in self.block:
                    reason = "an older GPU copy of it remains and nothing will release it"
                elif self.used + copy.nbytes > self.budget:
                    reason = f"budget overrun: needs {copy.nbytes} bytes, {free} free"
                elif self.placed:
                    reason = f"its planned range is held{self._range_note(copy.key)}"
                else:
                    reason = f"no hole large enough for {copy.nbytes} bytes{region}"
                return ("memory", op or copy.after, copy.tensor,
                        f"the {copy.describe()} cannot start ({reason}); " +
                        (f"{self.rt.item_name(k)} waits" if op else "compute is done") + f"; largest residents: {shown}")
        if heads:
            copy = heads[0]
            return ("order", op or copy.after, copy.tensor, f"the {copy.describe()} cannot start")
        pending = [c for c in self.rt.waits.get(k, ()) if not self.ended[c.index]]
        if pending:
            return ("order", op, pending[0].tensor, f"{self.rt.item_name(k)} waits for the "
                    f"{pending[0].describe()}, which was never issued")
        return ("order", op, seq.recomputed[k] if k < len(seq) else None,
                f"{self.rt.item_name(k) if k < len(seq) else 'the iteration'} cannot go on")

    def _check_end(self) -> None:
        """R20 and the data at the end (after the clock stopped): persistent tensors where
        they started, at their last version, with the right bytes."""
        initial = self.rt.plan.initial
        for tid in self.persistent:
            version = self.version[tid]
            seed = self.patterns.seed(tid, version)
            if tid in initial:
                tier = initial[tid]
                if tid in self.block:
                    raise ReplayFailure("residency", None, tid, f"end of iteration: {tid} started in {tier} but "
                                        "is still on the GPU")
                have = self.copy_version.get((tid, tier))
                if have != version:
                    state = "none" if have is None else f"version {have}, stale"
                    raise ReplayFailure("residency", None, tid, f"end of iteration: {tid} started in {tier} but its "
                                        f"copy there is not at version {version} ({state})")
                problem = self.backend.check_copy(tid, tier, self.scaled(self.nbytes[tid]), seed)
            else:
                if tid not in self.block:
                    raise ReplayFailure("residency", None, tid, f"end of iteration: {tid} started on the GPU but "
                                        f"is not on it ({self._where(tid)})")
                block = self.block[tid]
                if self.placed:
                    offsets = self.rt.plan.placement.offsets
                    start, last = offsets[self.rt.start_keys[tid]], offsets[self.arena.key_at(block.offset)]
                    if last != start:
                        raise ReplayFailure("placement", None, tid, f"end of iteration: persistent tensor {tid} is "
                                            f"at offset {last} of the placement, not at {start} where it started: "
                                            "the next iteration would not find it there (R50)")
                problem = self.backend.check_block(Block(tid, block.offset, block.nbytes, seed))
            if problem is not None:
                raise ReplayFailure("integrity", None, tid, f"end of iteration: {tid} should be version "
                                    f"{version}, found {problem}")
    def summary(self) -> dict:
        """Measured figures in the profile's units (us, bytes)."""
        return self.measured.summary(self.arena, self.placed, self.time_scale)
