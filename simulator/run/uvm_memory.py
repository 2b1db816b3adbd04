"""Unified memory in time (R30-R38 of docs/simulation.md): plans with ``"memory": "uvm"``.

In UVM mode the GPU is a cache of managed memory, as with cudaMallocManaged: a tensor
that is not on the GPU when an item needs it faults in, a full GPU evicts, and the
plan's actions are migration hints. The event loop is simulator/run/uvm.py's (``_UvmRun``
drives the same compute stream, the same FIFO streams ``h2d`` and ``d2h``, the same link
capacities) and the static rules are simulator/compile/uvm.py's (``compile_uvm``); this
module holds the memory that differs from the explicit mode:

- ``UvmMemory``: the memory policy: tensors cut into blocks, residency as runs of
  blocks that arrived together (each with its arrival stamp), eviction by arrival
  order skipping pinned tensors, the committed-byte ledger that decides room, and the
  backing tier's (host's) use, and R38's caching allocator (freed blocks cached in a
  pool that new outputs reuse: ``free_tensor``, ``reuse``, ``reuse_backing``);
- ``fault_schedule``: when the fault batches of one item (or the flow of one prefetch)
  can run, given the write-backs that make their room.

Why fault batches are not events. A fault batch runs on ``h2d`` and a write-back on
``d2h``, each stream one transfer at a time, and in UVM mode nothing else crosses
``pcie_down`` or ``pcie_up`` while they run (hints queue on the same two streams), so no
flow ever shares a link: a batch takes its latency plus ceil(bytes x 10^12 / rate) ps,
with the rate the link's capacity (what the engine's max-min sharing gives a lone flow)
or the slower paging rate ``fault_gbps`` (R31). Nor does anything
else take GPU memory while an item's batches run (the compute stream waits for them,
and ``h2d``, the only other stream that allocates, is theirs). So the whole train of an
item's write-backs and batches is computed when the item's room is decided, with the
recurrence ``end_i = max(end_(i-1), room_i) + duration_i``, instead of one event per
2 MiB block: tens of thousands of blocks per iteration of a large model.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from functools import lru_cache
from heapq import heappop, heappush
from itertools import accumulate, count

from ..compile.compiled import CompiledProfile, Machine
from ..model.links import PCIE_DOWN, PCIE_UP, SSD_READ_LINK, SSD_WRITE_LINK

PS_PER_S = 10**12


class PageCache:
    """R35: with SSD backing, host memory is a page cache of whole blocks in front of a
    file on the SSD, least recently arrived first out. A block that migrates to the GPU
    leaves it (it is on the GPU or in the backing tier, never both); a block written
    back arrives in it, after the cache has written its least recently arrived block to
    the SSD when it is full (on ``ssd_write``, one at a time, at the SSD's write speed
    after its latency). Everything not on the GPU nor in the cache is in the file."""

    def __init__(self, capacity: int, machine: Machine):
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self.blocks: OrderedDict = OrderedDict()     # (tensor, block) -> bytes, in arrival order
        self.of: dict[int, set] = {}
        self.ssd_free = 0                            # ps: the SSD's write stream is busy until then
        self.write_rate = machine.link_capacity[SSD_WRITE_LINK]
        self.latency = machine.uvm.ssd_latency_ps
        self.written = self.write_busy = 0

    def take(self, t: int, b: int) -> bool:
        """Block b of t migrates to the GPU: True when it came from the cache (a hit)."""
        size = self.blocks.pop((t, b), None)
        if size is None:
            return False
        self.used -= size
        self.of[t].discard(b)
        return True

    def insert(self, t: int, b: int, size: int, now: int) -> int:
        """Block b of t arrives (a write-back); returns when its room in the cache is
        there (now, unless blocks had to be written to the SSD first)."""
        ready = now
        while self.blocks and self.used + size > self.capacity:
            (vt, vb), vsize = self.blocks.popitem(last=False)
            self.of[vt].discard(vb)
            self.used -= vsize
            ready = self._write(vsize, now)
        if size > self.capacity:           # no room at all: it goes through to the SSD
            return self._write(size, now)
        self.blocks[(t, b)] = size
        self.of.setdefault(t, set()).add(b)
        self.used += size
        self.peak = max(self.peak, self.used)
        return ready

    def _write(self, size: int, now: int) -> int:
        busy = self.latency + -(-size * PS_PER_S // self.write_rate)
        self.ssd_free = max(self.ssd_free, now) + busy
        self.written += size
        self.write_busy += busy
        return self.ssd_free

    def drop_tensor(self, t: int) -> None:
        """A dead tensor's cached blocks go (R7)."""
        for b in self.of.pop(t, ()):
            self.used -= self.blocks.pop((t, b))


class Run:
    """Blocks ``first`` to ``last - 1`` of tensor ``t`` (its position in the profile),
    resident since the same instant; ``clean`` when their backing copy is valid (R34),
    so that evicting them is a discard; ``cached`` when t is dead and the blocks stay in a
    caching allocator's pool (R38)."""
    __slots__ = ("t", "first", "last", "clean", "alive", "stamp", "cached")

    def __init__(self, t: int, first: int, last: int, clean: bool, stamp: int = 0):
        self.t, self.first, self.last, self.clean, self.alive, self.stamp = t, first, last, clean, True, stamp
        self.cached = False


class UvmMemory:
    """GPU memory as a cache of managed memory (R30-R34), and the backing tier's use.

    Residency is kept per tensor as runs of blocks that arrived together; a heap orders
    the runs by (arrival stamp, tensor position, first block; then the order they were
    pushed, which only separates a dead run from a live one), so the victim of R32 is
    the lowest block of the first run in the heap whose tensor is not pinned. A stamp is
    the absolute time of the arrival (iteration 2 continues iteration 1's clock, R36).

    ``ledger`` is the GPU memory committed: resident blocks, workspaces of running
    items, and room that an item or a prefetch has been given when its room was
    decided; evicted blocks leave it when they are handed over as room (the part of the
    last write-back's block that the requester does not need comes back when that
    write-back ends, as a credit). Room is decided against ``budget - ledger``; the peak
    reported is the ledger's (R4, as UVM mode reads it: docs/simulation.md).
    """

    def __init__(self, compiled: CompiledProfile, machine: Machine, budget: int, read_mostly: frozenset,
                 host_capacity: int, backing: str = "host"):
        self.block = block = machine.uvm.block
        ids = compiled.tensor_ids
        self.ids = ids
        self.index = compiled.tensor_index
        sizes = [compiled.tensor_bytes[t] for t in ids]
        self.nbytes = sizes
        self.nblocks = [-(-n // block) for n in sizes]
        self.tail = [n - (b - 1) * block if b else 0 for n, b in zip(sizes, self.nblocks)]
        self.runs: list[list[Run]] = [[] for _ in ids]
        self.resident = [0] * len(ids)
        self.resident_total = 0
        self.recycled = 0          # R31: bytes of GPU pages freed by dead tensors and workspace, not yet reused
        self.pins = [0] * len(ids)
        self.pinned: set[int] = set()
        self.heap: list = []                # (stamp, tensor, first block, push count, run): R32's order
        self.order = count()
        self.budget = budget
        self.ledger = 0
        self.credits: list = []            # (time, bytes) coming back to the ledger
        self.peak = 0
        self.peak_at = 0
        self.samples: list | None = None
        self.read_mostly = bytearray(len(ids))
        for tid in read_mostly:
            self.read_mostly[self.index[tid]] = 1
        self.host = 0
        self.host_peak = 0
        self.host_capacity = host_capacity
        self.epoch = 0                     # stamps: epoch + now (R36's second iteration goes on counting)
        self.reset_counts()
        up, down = machine.link_capacity[PCIE_UP], machine.link_capacity[PCIE_DOWN]
        self.up, self.down = up, down
        self.fault_ps = machine.uvm.fault_latency_ps
        self.batch_blocks = machine.uvm.batch_blocks     # the legacy model's (page = block), else 0
        uvm = machine.uvm
        self.page = uvm.page if uvm.page else block
        self.big_pages = max(1, (uvm.big_page if uvm.big_page else self.page) // self.page)
        self.batch_faults = uvm.batch_faults if uvm.page else max(1, uvm.batch_blocks)
        self.threshold = uvm.threshold if uvm.page else 100
        self.fault_down, self.fault_bulk = uvm.paging_rates(down)   # R31: the paging rates, within and past the ramp
        self.fault_ramp = uvm.fault_ramp
        self.kernel_fault_ps = uvm.kernel_fault_ps
        self.block_batch: list[int] = []             # fault_blocks: per block faulted, its last batch
        self._wb_full = -(-block * PS_PER_S // up)
        self._in_full = self.fault_ps + -(-block * PS_PER_S // down)
        self.cache: PageCache | None = None          # R35: SSD backing
        self.written_blocks: list = []               # with a cache: (tensor, first, count) evict() wrote back
        if backing == "ssd":
            size = machine.uvm.host_cache if machine.uvm.host_cache is not None else machine.host_bytes
            self.cache = PageCache(size, machine)
            self.ssd_in = min(down, machine.link_capacity[SSD_READ_LINK])
            self.ssd_read_latency = machine.uvm.ssd_latency_ps
        # R38: a caching allocator's pool (host backing only): the cached runs of dead
        # tensors (also in ``heap``, for eviction), their GPU bytes (counted in
        # ``resident_total`` and the ledger), and the pool's bytes in the backing tier.
        # The pool's memory that an output reuses from the backing tier faults in as the
        # pseudo-tensor ``pool_index`` (its size set per item in nblocks and tail).
        self.caching = bool(machine.uvm.caching) and backing == "host"
        self.cached_heap: list = []
        self.cached_total = 0
        self.pool_host = 0
        self.pool_index = len(ids)
        self.nblocks.append(0)
        self.tail.append(0)

    def reset_counts(self) -> None:
        """The R37 counters (and R35's), for one iteration."""
        self.faults = self.fault_bytes = self.evictions = self.writeback_bytes = 0
        self.ssd_read_bytes = 0
        cache = getattr(self, "cache", None)
        if cache is not None:
            cache.written = cache.write_busy = cache.ssd_free = 0
            cache.peak = cache.used

    # ------------------------------------------------------------------ runs

    def run_bytes(self, run: Run) -> int:
        n = (run.last - run.first) * self.block
        if run.last == self.nblocks[run.t]:
            n -= self.block - self.tail[run.t]
        return n

    def range_bytes(self, t: int, first: int, last: int) -> int:
        n = (last - first) * self.block
        if last == self.nblocks[t]:
            n -= self.block - self.tail[t]
        return n

    def add_run(self, t: int, first: int, last: int, stamp: int, clean: bool) -> int:
        run = Run(t, first, last, clean, stamp)
        self.runs[t].append(run)
        heappush(self.heap, (stamp, t, first, next(self.order), run))
        nbytes = self.range_bytes(t, first, last)
        self.resident[t] += nbytes
        self.resident_total += nbytes
        return nbytes

    def add_outputs(self, tensors, stamp: int) -> None:
        """First touch (R31): an item's outputs become resident whole, with no backing copy."""
        heap, runs, nbytes, nblocks, resident = self.heap, self.runs, self.nbytes, self.nblocks, self.resident
        total = 0
        for t in tensors:
            if nblocks[t]:
                run = Run(t, 0, nblocks[t], False, stamp)
                runs[t].append(run)
                heappush(heap, (stamp, t, 0, next(self.order), run))
                resident[t] += nbytes[t]
                total += nbytes[t]
        self.resident_total += total

    def missing(self, t: int) -> list[tuple[int, int]]:
        """The block ranges of tensor t that are not on the GPU, in block order."""
        runs = self.runs[t]
        if not runs:
            return [(0, self.nblocks[t])] if self.nblocks[t] else []
        out, at = [], 0
        for run in sorted(runs, key=lambda r: r.first):
            if run.first > at:
                out.append((at, run.first))
            at = run.last
        if at < self.nblocks[t]:
            out.append((at, self.nblocks[t]))
        return out

    def pin(self, ts) -> None:
        for t in ts:
            self.pins[t] += 1
            self.pinned.add(t)

    def unpin(self, ts) -> None:
        for t in ts:
            self.pins[t] -= 1
            if not self.pins[t]:
                self.pinned.discard(t)

    def evictable(self) -> int:
        """Resident bytes that R32 may evict now (those of unpinned tensors)."""
        return self.resident_total - sum(self.resident[t] for t in self.pinned)

    def evict(self, deficit: int) -> tuple[list[int], list[int], int]:
        """R32: evict unpinned blocks in arrival order until ``deficit`` bytes are found
        (the caller checked ``evictable``). Returns the sizes of the blocks to write
        back, in order, the places in that list of blocks that are not full (a tensor's
        last block), and the bytes discarded (blocks with a valid backing copy)."""
        heap, block, pins = self.heap, self.block, self.pins
        got = discarded = 0
        writes: list[int] = []
        odd: list[int] = []
        stash = []
        while got < deficit:
            entry = heap[0]
            run = entry[4]
            if not run.alive:
                heappop(heap)
                continue
            t = run.t
            cached = run.cached
            if pins[t] and not cached:
                stash.append(heappop(heap))
                continue
            k, taken, whole = self._take(heap, run, deficit - got)
            if whole and not cached:
                self.runs[t].remove(run)
            if run.clean:
                discarded += taken
            else:
                if run.first + k == self.nblocks[t] and self.tail[t] != block:
                    writes.extend([block] * (k - 1))
                    odd.append(len(writes))
                    writes.append(self.tail[t])
                else:
                    writes.extend([block] * k)
                self.host += taken
                if self.cache is not None:
                    self.written_blocks.append((t, run.first, k))
            run.first += k
            if cached:                 # R38: the pool's memory, now in the backing tier
                self.cached_total -= taken
                self.pool_host += taken
            else:
                self.resident[t] -= taken
            self.resident_total -= taken
            self.evictions += k
            got += taken
        for entry in stash:
            heappush(heap, entry)
        self.writeback_bytes += got - discarded
        if self.host > self.host_peak:
            self.host_peak = self.host
        return writes, odd, discarded, got - discarded

    def _take(self, heap: list, run, wanted: int) -> tuple[int, int, bool]:
        """R32's step of eviction and of R38's reuse: from ``run``, at the top of ``heap``,
        the whole run if its bytes are at most ``wanted`` (or the blocks that cover
        ``wanted`` are all of them: it then leaves the heap), else those blocks, which are
        full ones below its last. Returns (blocks, bytes, whole)."""
        count = run.last - run.first
        whole = self.run_bytes(run)
        k = count if whole <= wanted else -(-wanted // self.block)
        if k == count:
            heappop(heap)
            run.alive = False
            return k, whole, True
        return k, k * self.block, False

    def reuse(self, need: int) -> tuple[int, int]:
        """R38: an item's outputs (``need`` bytes) take the pool's cached blocks on the GPU,
        least recently migrated first (R32's order), whole blocks, the last one possibly
        in part (its unused rest is freed). Returns (bytes taken, bytes of the outputs
        they hold); the ledger is the caller's. A clean block's backing copy goes."""
        heap = self.cached_heap
        got = 0
        while got < need and self.cached_total:
            run = heap[0][4]
            if not run.alive:
                heappop(heap)
                continue
            k, taken, _ = self._take(heap, run, need - got)
            run.first += k
            if run.clean:
                self.host -= taken
            self.cached_total -= taken
            self.resident_total -= taken
            got += taken
        return got, min(got, need)

    def reuse_backing(self, need: int) -> int:
        """R38: the outputs' bytes still without room take the pool's memory in the
        backing tier, up to ``need``; returns the bytes taken, which fault in (set as the
        pseudo-tensor ``pool_index``'s blocks)."""
        e = min(need, self.pool_host)
        if e:
            self.pool_host -= e
            self.host -= e
        n = -(-e // self.block)
        self.nblocks[self.pool_index] = n
        self.tail[self.pool_index] = e - (n - 1) * self.block if n else 0
        return e

    def drop_blocks(self, t: int, blocks: list[int]) -> int:
        """The blocks ``blocks`` (sorted) of t leave the GPU (an oversubscribed item evicted
        them, R32); returns their resident bytes. A run they cut in two goes on as two
        runs with its stamp. The ledger is the caller's."""
        gone = 0
        kept: list[Run] = []
        for run in self.runs[t]:
            lo, hi = bisect_left(blocks, run.first), bisect_left(blocks, run.last)
            if lo == hi:
                kept.append(run)
                continue
            pieces, at = [], run.first
            for b in blocks[lo:hi]:
                if b > at:
                    pieces.append((at, b))
                at = b + 1
            if at < run.last:
                pieces.append((at, run.last))
            gone += self.run_bytes(run)
            if not pieces:
                run.alive = False
                continue
            run.first, run.last = pieces[0]
            kept.append(run)
            for first, last in pieces[1:]:
                extra = Run(t, first, last, run.clean, run.stamp)
                kept.append(extra)
                heappush(self.heap, (run.stamp, t, first, next(self.order), extra))
            gone -= sum(self.range_bytes(t, first, last) for first, last in pieces)
        self.runs[t] = kept
        self.resident[t] -= gone
        self.resident_total -= gone
        return gone

    def free_tensor(self, t: int, now: int) -> None:
        """R7 in UVM mode: a dead tensor's blocks go at once, GPU and backing alike; with
        a caching allocator (R38) they stay in its pool instead: the resident ones cached
        on the GPU, the rest the pool's bytes in the backing tier."""
        resident = self.resident[t]
        if self.caching:
            for run in self.runs[t]:
                run.cached = True
                heappush(self.cached_heap, (run.stamp, t, run.first, next(self.order), run))
            self.runs[t] = []
            self.cached_total += resident
            self.pool_host += self.nbytes[t] - resident
            self.resident[t] = 0
            return
        clean = 0
        for run in self.runs[t]:
            run.alive = False
            if run.clean:
                clean += self.run_bytes(run)
        self.runs[t] = []
        if self.cache is not None:
            self.cache.drop_tensor(t)
        self.host -= self.nbytes[t] - resident + clean
        self.resident[t] = 0
        self.resident_total -= resident
        self.recycled += resident      # R31: GPU pages a new output takes with no first touch
        self.commit(-resident, now)

    def release_clean(self, t: int, now: int) -> None:
        """An offload's release (R11, R33): t's blocks with a valid backing copy leave the
        GPU (blocks faulted back in since, with no backing copy, stay)."""
        kept, gone = [], 0
        for run in self.runs[t]:
            if run.clean:
                run.alive = False
                gone += self.run_bytes(run)
            else:
                kept.append(run)
        self.runs[t] = kept
        self.resident[t] -= gone
        self.resident_total -= gone
        self.commit(-gone, now)

    def dirty(self, t: int) -> None:
        """R16: an update makes t's backing copy stale: its resident blocks need write-back."""
        for run in self.runs[t]:
            if run.clean:
                run.clean = False
                self.host -= self.run_bytes(run)

    def dirty_runs(self, t: int) -> list[Run]:
        """t's resident runs with no valid backing copy (what an offload hint copies)."""
        return [run for run in self.runs[t] if not run.clean]

    # ------------------------------------------------------------------ the ledger

    def commit(self, delta: int, now: int) -> None:
        self.ledger += delta
        if self.ledger > self.peak:
            self.peak, self.peak_at = self.ledger, now
        if self.samples is not None:
            if self.samples and self.samples[-1][0] == now:
                self.samples[-1] = (now, self.ledger)
            else:
                self.samples.append((now, self.ledger))

    def take_credits(self, now: int) -> None:
        while self.credits and self.credits[0][0] <= now:
            self.commit(-heappop(self.credits)[1], now)

    def host_add(self, nbytes: int) -> None:
        self.host += nbytes
        if self.host > self.host_peak:
            self.host_peak = self.host

    def largest(self, n: int = 5) -> list[dict]:
        top = sorted((i for i, r in enumerate(self.resident) if r), key=lambda i: (-self.resident[i], self.ids[i]))[:n]
        return [{"tensor": self.ids[i], "bytes": self.resident[i]} for i in top]

    # ------------------------------------------------------------------ room

    def make_room(self, need: int, now: int):
        """R31, R32: room for ``need`` bytes, decided at ``now``: the bytes free, then
        evictions (discards at once, write-backs on ``d2h``). Returns (bytes usable at
        once, the sizes of the blocks to write back in order, their durations in ps,
        the bytes of the last write-back's block the requester does not need, and the
        write-backs' total bytes and time) or None when even evicting every unpinned
        block would not do. The caller schedules the write-backs and, when the
        requester does not need all of the last block, credits that part back at the
        last write-back's end (``credit``)."""
        free = self.budget - self.ledger
        if need <= free:
            self.commit(need, now)
            return free, (), (), 0, 0, 0
        deficit = need - free
        if self.evictable() < deficit:
            return None
        writes, odd, discarded, wb_total = self.evict(deficit)
        ready = free + discarded
        leftover = busy = 0
        durations: list[int] = []
        if writes:
            full = self._wb_full
            durations = [full] * len(writes)
            busy = full * (len(writes) - len(odd))
            for i in odd:
                durations[i] = -(-writes[i] * PS_PER_S // self.up)
                busy += durations[i]
            leftover = ready + wb_total - need
        # the ledger: the requester's room in, the evicted blocks out (handed over as room)
        self.commit(need - discarded - wb_total + leftover, now)
        return ready, writes, durations, leftover, wb_total, busy

    def credit(self, at: int, nbytes: int) -> None:
        """``nbytes`` leave the ledger at ``at`` (a write-back's end)."""
        heappush(self.credits, (at, nbytes))

    def fault_blocks(self, ranges: list[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
        """The fault batches of block ranges (tensor, first, last), in order (R31):
        their sizes and durations (fault latency + flow over ``pcie_down``)."""
        block, g = self.block, self.batch_blocks
        full = self._in_full
        sizes: list[int] = []
        durations: list[int] = []
        if self.cache is not None:
            return self._fault_blocks_cached(ranges)
        if g == 1:
            for t, first, last in ranges:
                if last == self.nblocks[t] and self.tail[t] != block:
                    sizes.extend([block] * (last - first - 1))
                    durations.extend([full] * (last - first - 1))
                    sizes.append(self.tail[t])
                    durations.append(self.fault_ps + -(-self.tail[t] * PS_PER_S // self.down))
                else:
                    sizes.extend([block] * (last - first))
                    durations.extend([full] * (last - first))
            return sizes, durations
        sizes = self._batches(ranges)[0]
        return sizes, batch_durations(sizes, self.fault_ps, self.fault_down, self.kernel_fault_ps, self.fault_bulk,
                                      self.fault_ramp)

    def _batches(self, ranges) -> tuple[list[int], list[list[int]]]:
        """R31: the fault batches of the blocks of ``ranges`` (tensor, first, last), which
        the item touches in this order (``batch_train``); keeps per block its last batch
        (when it has arrived) in ``block_batch``."""
        nblocks, tail, block = self.nblocks, self.tail, self.block
        sizes, parts = batch_train([tail[t] if b == nblocks[t] - 1 else block
                                    for t, first, last in ranges for b in range(first, last)],
                                   self.page, self.big_pages, self.batch_faults, self.threshold)
        self.block_batch = [mine[-1] for mine in parts]
        return sizes, parts

    def _fault_blocks_cached(self, ranges) -> tuple[list[int], list[int]]:
        """R35: a batch whose blocks are all in the page cache moves over ``pcie_down``
        alone; otherwise it is one flow over ``ssd_read_link`` and ``pcie_down`` with
        the SSD's latency added. The blocks leave the cache for the GPU."""
        cache = self.cache
        sizes, parts = self._batches(ranges)
        hit = [True] * len(sizes)
        i = 0
        for t, first, last in ranges:
            for b in range(first, last):
                if not cache.take(t, b):
                    for j in parts[i]:
                        hit[j] = False
                i += 1
        durations = []
        done = 0
        for size, all_cached in zip(sizes, hit):
            done += size
            if all_cached:
                durations.append(self.fault_ps + paging_ps(done - size, size, self.fault_down, self.fault_bulk,
                                                           self.fault_ramp))
            else:
                self.ssd_read_bytes += size
                durations.append(self.fault_ps + self.ssd_read_latency + -(-size * PS_PER_S // self.ssd_in))
        if durations:
            durations[0] += self.kernel_fault_ps
        return sizes, durations

    def writeback_ends(self, base: int, now: int, writes, durations) -> list[int]:
        """When each write-back of ``writes`` ends, back to back on ``d2h`` from ``base``;
        with SSD backing (R35) each waits for its room in the page cache."""
        if self.cache is None:
            return list(accumulate(durations, initial=base))[1:]
        ends, end, i = [], base, 0
        for t, first, count in self.written_blocks:
            for b in range(first, first + count):
                ready = self.cache.insert(t, b, writes[i], now)
                end = (end if end > ready else ready) + durations[i]
                ends.append(end)
                i += 1
        self.written_blocks = []
        return ends

    def fault_totals(self, ranges: list[tuple[int, int, int]]) -> tuple[int, int]:
        """(batches, total duration in ps) of the fault batches of ``ranges`` (R31) with
        one block a batch (``fault_batch_blocks`` = 1; ``fault_blocks`` otherwise)."""
        block, full = self.block, self._in_full
        count = total = 0
        for t, first, last in ranges:
            n = last - first
            count += n
            if last == self.nblocks[t] and self.tail[t] != block:
                total += (n - 1) * full + self.fault_ps + -(-self.tail[t] * PS_PER_S // self.down)
            else:
                total += n * full
        return count, total


def batch_durations(sizes, latency_ps: int, rate: int, kernel_fault_ps: int = 0, bulk: int = 0,
                    ramp: int = 0) -> list[int]:
    """R31: each fault batch's duration, its latency and its bytes at the paging rate
    (``rate`` bytes/s: the link's, or the slower ``fault_gbps``; past the item's first
    ``ramp`` bytes at ``bulk`` when given, ``paging_ps``); the item's first batch also
    pays ``kernel_fault_ps``, once per item that migrates pages."""
    durations = []
    done = 0
    for size in sizes:
        durations.append(latency_ps + paging_ps(done, size, rate, bulk, ramp))
        done += size
    if durations:
        durations[0] += kernel_fault_ps
    return durations


def paging_ps(done: int, size: int, rate: int, bulk: int = 0, ramp: int = 0) -> int:
    """R31: the copy time of a fault batch of ``size`` bytes after ``done`` bytes of the
    same item's train: the bytes within the first ``ramp`` at ``rate``, the rest at
    ``bulk`` (0: all at ``rate``), each part rounded up to a whole picosecond."""
    if not bulk:
        return -(-size * PS_PER_S // rate)
    slow = max(0, min(size, ramp - done))
    return -(-slow * PS_PER_S // rate) + -(-(size - slow) * PS_PER_S // bulk)


def first_touch_ps(nbytes: int, page: int, batch_faults: int, per_batch_ps: int) -> int:
    """R31: the time an item's first-touch faults take (``nbytes`` of new outputs and
    workspace, zero-filled on the GPU, nothing copied): one fault per ``page``, serviced
    ``batch_faults`` to a batch, ``per_batch_ps`` each. They run while the kernel
    computes: the item is delayed by what exceeds its compute time (``touch_delay_ps``)."""
    if nbytes <= 0 or not per_batch_ps:
        return 0
    return -(-(-(-nbytes // page)) // batch_faults) * per_batch_ps


def touch_delay_ps(touch: int, compute: int) -> int:
    """R31: first-touch faults overlap the kernel's own work; what is left over delays it."""
    return touch - compute if touch > compute else 0


def batch_train(blocks, page: int, big: int, faults: int, threshold: int) -> tuple[list[int], list[list[int]]]:
    """R31: the fault batches of ``blocks`` (each block's bytes, in the order the item
    touches them, every page once, none on the GPU): per batch the bytes it migrates, and
    per block the batches that migrate part of it. Each block is walked by ``block_train``."""
    sizes: list[int] = []
    parts: list[list[int]] = []
    r = 0
    for size in blocks:
        steps, r = block_train(-(-size // page), big, faults, threshold, r)
        at = 0
        mine: list[int] = []
        for new, end in steps:
            nbytes = min(end * page, size) - min(at * page, size)
            if new:
                sizes.append(nbytes)
            else:
                sizes[-1] += nbytes
            if not mine or mine[-1] != len(sizes) - 1:
                mine.append(len(sizes) - 1)
            at = end
        parts.append(mine)
    return sizes, parts


@lru_cache(maxsize=65536)
def block_train(pages: int, big: int, faults: int, threshold: int, room: int) -> tuple[tuple, int]:
    """R31: how the driver brings in a VA block of ``pages`` pages that is not on the GPU
    and that a kernel touches in address order, every page once. ``room`` faults are
    left in the batch being gathered (0: the next fault opens a batch of ``faults``).

    Each step is one batch's share of the block: the next ``n = min(room, pages left)``
    pages fault (pages already migrated do not); the faulted pages grow to their big
    pages (``big`` pages each), and with the pages already resident they make the
    prefetcher's bitmap; the tree over the block's pages (levels of 1, 2, 4, ... pages,
    aligned, the top one 2^ceil(log2 pages) clipped to the block) is walked up from the
    last faulted page, and every node whose bitmap count ``c`` of its ``s`` pages has
    ``c * 100 > s * threshold`` is migrated whole; the largest such node wins. What
    migrates is always a prefix of the block (the first pages resident, the rest not).
    Returns ((opens a new batch, pages resident after it), ...) and the room left."""
    at, steps = 0, []
    levels = (pages - 1).bit_length() + 1
    while at < pages:
        new = room == 0
        if new:
            room = faults
        n = min(room, pages - at)
        room -= n
        touched = at + n
        bitmap = min(-(-touched // big) * big, pages)
        last, end = touched - 1, touched
        for level in range(levels):
            lo = (last >> level) << level
            hi = min(lo + (1 << level), pages)
            count = min(hi, bitmap) - lo
            if count > 0 and count * 100 > (hi - lo) * threshold and hi > end:
                end = hi
        steps.append((new, end))
        at = end
    return tuple(steps), room


def fault_schedule(now: int, h2d_free: int, ready: int, writes, ends, alloc: int, durations, sizes) -> tuple[int, int]:
    """R31: when an item's outputs and workspace (``alloc`` bytes) get their room, and
    when its last fault batch ends. Batch i (``sizes[i]`` bytes, ``durations[i]`` ps
    with the fault latency) starts once the previous batch ended (the first once
    ``h2d`` is free) and once its room is there: the bytes usable at once (``ready``)
    and the write-backs ended so far (``writes``, ending at ``ends``) cover ``alloc``
    plus batches 1..i. Returns (room time of the outputs, end of the last batch).

    The recurrence ``end_i = max(end_(i-1), room_i) + d_i`` unrolls to
    ``end_n = D_n + max(base, max_i (room_i - D_(i-1)))`` with D the running sum of the
    durations; long trains are computed that way with numpy, short ones in a loop."""
    covered = list(accumulate(writes, initial=ready))[1:] if writes else []
    alloc_room = now if alloc <= ready else ends[bisect_left(covered, alloc)]
    end = h2d_free if h2d_free > now else now
    if not sizes:
        return alloc_room, end
    if len(sizes) >= _VECTOR and writes and ends[-1] + sum(durations) < _INT64_SAFE:
        return alloc_room, _schedule_vector(now, end, ready, covered, ends, alloc, durations, sizes)
    need, room = alloc, alloc_room
    for size, duration in zip(sizes, durations):
        need += size
        if need > ready:
            room = ends[bisect_left(covered, need)]
        end = (end if end > room else room) + duration
    return alloc_room, end


_VECTOR = 96             # trains at least this long are computed with numpy
_INT64_SAFE = 2**62


def _schedule_vector(now: int, base: int, ready: int, covered, ends, alloc: int, durations, sizes) -> int:
    """The end of the last batch of ``fault_schedule``, in closed form (exact integers)."""
    import numpy as np

    need = np.cumsum(np.asarray(sizes, dtype=np.int64)) + alloc
    index = np.searchsorted(np.asarray(covered, dtype=np.int64), need, side="left")
    ends_array = np.asarray(ends, dtype=np.int64)
    room = np.where(need <= ready, now, ends_array[np.minimum(index, len(ends) - 1)])
    d = np.asarray(durations, dtype=np.int64)
    total = np.cumsum(d)
    latest = int((room - (total - d)).max())
    return int(total[-1]) + max(base, latest)


def fault_schedule_half(now: int, start: int, ready: int, writes, wb_durations, alloc: int, durations,
                        sizes) -> tuple[int, int, list[int]]:
    """``fault_schedule`` on a half-duplex machine: one copy engine, free from ``start``,
    runs the write-backs and the batches one at a time, each need's write-backs before
    its batch. Returns (room time of the outputs, end of the last transfer, the
    write-backs' end times)."""
    t, avail, j, need = start, ready, 0, alloc
    ends: list[int] = []
    while avail < need:
        t += wb_durations[j]
        ends.append(t)
        avail += writes[j]
        j += 1
    alloc_room = t if j else now
    for size, duration in zip(sizes, durations):
        need += size
        while avail < need:
            t += wb_durations[j]
            ends.append(t)
            avail += writes[j]
            j += 1
        t += duration
    for duration in wb_durations[j:]:
        t += duration
        ends.append(t)
    return alloc_room, t, ends


def fresh_bytes(mem, alloc: int) -> int:
    """R31: of ``alloc`` bytes of an item's new outputs and workspace, those that first
    touch fresh pages: pages freed by dead tensors and workspace (``recycled``) are mapped
    on the GPU already and are taken first, as far as they are still free; takes them."""
    reuse = max(0, min(mem.recycled, alloc, mem.budget - mem.ledger))
    mem.recycled -= reuse
    return alloc - reuse
