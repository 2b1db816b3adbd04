"""The CUDA backend: the same scheduler on a real GPU, through CuPy (the ``cuda`` extra).

- GPU memory: one device allocation of the budget's size (times the size scale); every
  tensor and workspace is a block at an offset in it, placed by the scheduler's
  first-fit allocator, so the budget is a hard limit, as on the host backend.
- Host memory: one pinned (page-locked) buffer per tensor the plan moves to host,
  allocated before the clock starts, so that copies are asynchronous DMA.
- Streams: ``compute``, ``h2d`` and ``d2h`` are CUDA streams. An item is launched on the
  compute stream as: a ``stamp`` kernel (the GPU's global timer into a slot), a
  ``check`` kernel per tensor it reads or updates, a ``fill`` kernel per tensor it
  writes, then a one-thread busy-wait kernel that spins until the stamp plus the op's
  duration (times the time scale), so an item takes its profile time whatever its
  checks cost, unless they cost more. A host copy is one ``cudaMemcpyAsync`` on its
  stream, with a ``check`` kernel of the device side (after a prefetch, before an
  offload; the host side of an offload is checked on the CPU once it has landed).
  Events recorded around each piece of work give its start and end on the GPU's clock;
  one watcher thread per stream waits for them in order and reports to the scheduler.
- The SSD tier is a temporary file: an SSD copy runs on its own thread (``ssd_read``,
  ``ssd_write``) through a pinned bounce buffer, a chunk at a time: ``cudaMemcpyAsync``
  between the region and the bounce buffer on the stream's CUDA stream, then
  ``os.pwrite`` / ``os.preadv``. (GPUDirect Storage through kvikio would skip the bounce
  buffer; it is not used here.)
- Making room (compaction) copies blocks device to device on a stream of its own.

Nothing here paces copies or shares links: the GPU's own copy engines and PCIe do, and
that is what is measured against the prediction. The scales default to 1; others run
(kernels stretch, sizes shrink) but copies still move at the link's real speed.

CuPy is imported when the backend is made, never when swapplan starts: without CuPy or
without a GPU, ``--backend cuda`` is an input error (exit 2) saying which.
"""
from __future__ import annotations

import os
import queue
import tempfile
import threading
import time

import numpy as np

from simulator.errors import InputError
from simulator.model.links import STREAMS

from .pattern import K, Patterns, check_lower_copy
from .work import Block, CopyWork, ItemWork

BOUNCE = 8 * 2**20      # bytes of the pinned bounce buffer of each SSD stream
NONE = 2**64 - 1        # a check slot that found nothing

_SOURCE = r"""
#define K %dULL
extern "C" {
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t));
    return t;
}
__global__ void stamp(unsigned long long* slot) { *slot = now_ns(); }
__global__ void spin_until(const unsigned long long* slot, unsigned long long ns) {
    unsigned long long start = *slot;
    while (now_ns() - start < ns) { }
}
__global__ void fill(unsigned long long* p, unsigned long long n, unsigned long long first,
                     unsigned long long seed) {
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        p[i] = seed + (first + i) * K;
}
__global__ void check(const unsigned long long* p, unsigned long long n, unsigned long long first,
                      unsigned long long seed, unsigned long long* slot) {
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        if (p[i] != seed + (first + i) * K) atomicMin(slot, i);
}
__global__ void peek(const unsigned long long* p, unsigned long long* slot) {
    if (slot[0] != ~0ULL) slot[1] = p[slot[0]];
}
}
""" % int(K)


def require_cuda():
    """CuPy and a device, or InputError saying what is missing: cheap, so that ``replay``
    and ``swapplan replay --backend cuda`` ask it before reading or simulating anything."""
    try:
        import cupy
    except ImportError as exc:
        raise InputError("<argument>", "--backend", "the cuda backend needs CuPy: install the cuda extra "
                         f"(pip install -e '.[cuda]'), or use --backend host ({exc})") from None
    except Exception as exc:   # CuPy is there but cannot load its CUDA libraries
        raise InputError("<argument>", "--backend", f"the cuda backend needs a working CuPy: importing it failed "
                         f"({type(exc).__name__}: {exc}); or use --backend host") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:   # no driver, no device: CuPy raises its CUDARuntimeError
        raise InputError("<argument>", "--backend", f"the cuda backend needs a CUDA GPU: {exc}") from None
    if count < 1:
        raise InputError("<argument>", "--backend", "the cuda backend needs a CUDA GPU: none found")
    return cupy


class CudaBackend:
    name = "cuda"
    pipelined = True      # the scheduler may launch the next item before this one is seen to end

    def __init__(self, link_capacity, time_scale: float, patterns: Patterns, arena_bytes: int,
                 tmpdir: str | None = None, host_tensors: dict[str, int] | None = None, checks: int = 1 << 16,
                 items: int = 1 << 16):
        cp = self.cp = require_cuda()
        rt = cp.cuda.runtime
        self.H2D, self.D2H, self.D2D = rt.memcpyHostToDevice, rt.memcpyDeviceToHost, rt.memcpyDeviceToDevice
        self.clock = time.perf_counter
        self.patterns = patterns
        self.time_scale = time_scale
        self.device = cp.cuda.Device(0)
        self.device.use()
        module = cp.RawModule(code=_SOURCE)
        self.k_stamp, self.k_spin, self.k_fill, self.k_check, self.k_peek = (
            module.get_function(name) for name in ("stamp", "spin_until", "fill", "check", "peek"))
        try:
            self.region_mem = cp.cuda.Memory(max(8, arena_bytes - arena_bytes % 8))   # the budget's pool
        except cp.cuda.memory.OutOfMemoryError:
            free, total = cp.cuda.runtime.memGetInfo()
            raise InputError("<argument>", "--budget", f"the GPU region of {arena_bytes} bytes does not fit: "
                             f"{free} of the GPU's {total} bytes are free") from None
        self.base = self.region_mem.ptr
        self.streams = {name: cp.cuda.Stream(non_blocking=True) for name in ("compute", *STREAMS, "move")}
        # check slots (index of the first bad word, the word found there) and item stamps
        self.slots = cp.empty((checks, 2), dtype=cp.uint64)
        self.slots[:, 0] = NONE
        self.slots[:, 1] = 0
        self.slot_next = 0
        self.slot_host = self._pinned(checks * 16).view(np.uint64).reshape(checks, 2)
        self.slots_ptr, self.slot_host_ptr = self.slots.data.ptr, self.slot_host.ctypes.data
        self.stamps = cp.zeros(items + 1, dtype=cp.uint64)
        self.host: dict[str, np.ndarray] = {}
        self.host_ptr: dict[str, int] = {}
        for tid, nbytes in (host_tensors or {}).items():
            self._host_buffer(tid, nbytes)
        self.bounce = {name: self._pinned(BOUNCE) for name in ("ssd_read", "ssd_write")}
        self.bounce_ptr = {name: self.bounce[name].ctypes.data for name in self.bounce}
        self.ssd_file = tempfile.TemporaryFile(prefix="swapplan-ssd-", dir=tmpdir)
        self.fd = self.ssd_file.fileno()
        self.ssd_slot: dict[str, int] = {}
        self.ssd_end = 0
        self.aborted = threading.Event()
        self.watch = {name: queue.SimpleQueue() for name in ("compute", "h2d", "d2h")}
        self.ssd_queues = {name: queue.SimpleQueue() for name in ("ssd_read", "ssd_write")}
        self.threads: list[threading.Thread] = []
        self.scheduler = None
        self.base_event = None
        self.base_host = 0.0
        self.lock = threading.Lock()    # slot numbers and launches from several threads

    # ------------------------------------------------------------------ memory

    def _pinned(self, nbytes: int) -> np.ndarray:
        """Page-locked host memory as a numpy array (which keeps the memory alive)."""
        memory = self.cp.cuda.alloc_pinned_memory(max(8, nbytes))
        return np.frombuffer(memory, dtype=np.uint8, count=max(8, nbytes))

    def _host_buffer(self, tid: str, nbytes: int) -> np.ndarray:
        buffer = self.host.get(tid)
        if buffer is None or len(buffer) < nbytes:
            buffer = self.host[tid] = self._pinned(nbytes)
            self.host_ptr[tid] = buffer.ctypes.data
        return buffer

    def _ptr(self, block: Block, offset: int = 0) -> int:
        return self.base + block.offset + offset

    def _slot(self) -> int:
        with self.lock:
            slot = self.slot_next
            self.slot_next += 1
        if slot >= len(self.slot_host):
            raise RuntimeError("the cuda backend ran out of check slots")
        return slot

    def _launch_check(self, block: Block, first: int = 0, words: int | None = None) -> int:
        """A check kernel on the current stream; returns its slot."""
        slot = self._slot()
        np_u64 = np.uint64
        n = block.nbytes // 8 if words is None else words
        grid = (min(1024, max(1, -(-n // 256))),)
        at = np_u64(self.slots_ptr + 16 * slot)
        self.k_check(grid, (256,), (np_u64(self._ptr(block, 8 * first)), np_u64(n), np_u64(first),
                                    np_u64(block.seed), at))
        self.k_peek((1,), (1,), (np_u64(self._ptr(block, 8 * first)), at))
        return slot

    def _launch_fill(self, block: Block) -> None:
        n = block.nbytes // 8
        grid = (min(1024, max(1, -(-n // 256))),)
        self.k_fill(grid, (256,), (np.uint64(self._ptr(block)), np.uint64(n), np.uint64(0), np.uint64(block.seed)))

    def _fetch_slots(self, slots: list[int], stream) -> None:
        """Copy the slots' results to their pinned mirror, on ``stream``."""
        for slot in slots:
            self.cp.cuda.runtime.memcpyAsync(self.slot_host_ptr + 16 * slot, self.slots_ptr + 16 * slot, 16,
                                             self.D2H, stream.ptr)

    def _found(self, slot: int, block: Block, first: int = 0) -> str | None:
        bad, word = (int(x) for x in self.slot_host[slot])
        if bad == NONE:
            return None
        seed = (word - int(self.patterns.ramp[first + bad])) % 2**64 if first + bad < len(self.patterns.ramp) else -1
        found = self.patterns.known.get(seed)
        what = f"{found[0]} version {found[1]}" if found else "unrecognised data"
        return f"{what} at byte {8 * (first + bad)}"

    # ------------------------------------------------------------------ placing (before the clock)

    def place(self, block: Block) -> None:
        with self.streams["compute"]:
            self._launch_fill(block)

    def place_copy(self, tid: str, tier: str, nbytes: int, seed: int) -> None:
        data = np.empty(nbytes // 8, dtype=np.uint64)
        self.patterns.fill(data, 0, seed)
        if tier == "host":
            np.copyto(self._host_buffer(tid, nbytes)[:nbytes], data.view(np.uint8))
        else:
            os.pwrite(self.fd, data.view(np.uint8), self._ssd(tid, nbytes))

    def _ssd(self, tid: str, nbytes: int) -> int:
        if tid not in self.ssd_slot:
            self.ssd_slot[tid] = self.ssd_end
            self.ssd_end += nbytes
        return self.ssd_slot[tid]

    def release_tier(self, tid: str, tier: str) -> None:
        pass      # pinned buffers and file slots are kept: allocating pinned memory stalls the device

    def move(self, moves: list[tuple[int, int, int]], way: str) -> None:
        """Make room, device to device on the move stream, in the order given (blocks no
        running work uses; ``apart``: no move overlaps another; ``down``: each block
        moves down, in address order). A block that overlaps its own old place is
        copied forward in pieces no longer than the distance it moves."""
        stream = self.streams["move"]
        memcpy = self.cp.cuda.runtime.memcpyAsync
        for old, new, size in moves:
            piece = size if old - new >= size or way == "apart" else max(8, old - new)
            for a in range(0, size, piece):
                memcpy(self.base + new + a, self.base + old + a, min(piece, size - a), self.D2D, stream.ptr)
        stream.synchronize()

    # ------------------------------------------------------------------ checks after the clock

    def check_block(self, block: Block) -> str | None:
        stream = self.streams["compute"]
        with stream:
            slot = self._launch_check(block)
            self._fetch_slots([slot], stream)
        stream.synchronize()
        return self._found(slot, block)

    def check_copy(self, tid: str, tier: str, nbytes: int, seed: int) -> str | None:
        host = self.host.get(tid) if tier == "host" else False
        return check_lower_copy(self.patterns, host, self.fd, self.ssd_slot.get(tid, 0), nbytes, seed)

    # ------------------------------------------------------------------ streams

    def start(self, scheduler) -> None:
        self.scheduler = scheduler
        for stream in self.streams.values():
            stream.synchronize()
        self.base_event = self.cp.cuda.Event()
        self.base_event.record(self.streams["compute"])
        self.base_event.synchronize()
        self.base_host = self.clock()
        self.threads = [threading.Thread(target=self._guarded, args=(self._watch, name), name=f"swapplan-cuda-{name}",
                                         daemon=True) for name in self.watch]
        self.threads += [threading.Thread(target=self._guarded, args=(self._ssd_loop, name),
                                          name=f"swapplan-cuda-{name}", daemon=True) for name in self.ssd_queues]
        for thread in self.threads:
            thread.start()

    def _guarded(self, loop, name: str) -> None:
        try:
            loop(name)
        except BaseException as exc:   # a CUDA error or a bug must stop the replay, not hang it
            self.scheduler.backend_failed(name, exc)

    def _gpu_time(self, event) -> float:
        """An event's time on the host clock: the base event's host time plus the GPU time
        between them."""
        return self.base_host + self.cp.cuda.get_elapsed_time(self.base_event, event) / 1e3

    def run_item(self, work: ItemWork) -> None:
        cp = self.cp
        stream = self.streams["compute"]
        started, ended, done = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event()
        stamp = np.uint64(self.stamps.data.ptr + 8 * work.item)
        slots = []
        with stream:
            started.record(stream)
            self.k_stamp((1,), (1,), (stamp,))
            for block in work.reads:
                slots.append((self._launch_check(block), block))
            for block in work.writes:
                self._launch_fill(block)
            self.k_spin((1,), (1,), (stamp, np.uint64(int(work.duration_s * 1e9))))
            ended.record(stream)
            self._fetch_slots([slot for slot, _ in slots], stream)
            done.record(stream)
        self.watch["compute"].put(("item", work, started, ended, done, slots))

    def run_copy(self, work: CopyWork) -> None:
        copy = work.copy
        if copy.tier == "ssd":
            self.ssd_queues[copy.stream].put(work)
            return
        cp = self.cp
        stream = self.streams[copy.stream]
        block = work.block
        started, ended, done = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event()
        with stream:
            started.record(stream)
            if copy.kind == "prefetch":
                cp.cuda.runtime.memcpyAsync(self._ptr(block), self.host_ptr[copy.tensor], block.nbytes,
                                            self.H2D, stream.ptr)
                ended.record(stream)
                slot = self._launch_check(block)
            else:
                slot = self._launch_check(block)
                host = self._host_buffer(copy.tensor, block.nbytes)
                cp.cuda.runtime.memcpyAsync(host.ctypes.data, self._ptr(block), block.nbytes, self.D2H, stream.ptr)
                ended.record(stream)
            self._fetch_slots([slot], stream)
            done.record(stream)
        self.watch[copy.stream].put(("copy", work, started, ended, done, [(slot, block)]))

    def _watch(self, name: str) -> None:
        """Wait for each piece of work of a stream in order and report it."""
        q = self.watch[name]
        while True:
            entry = q.get()
            if entry is None or self.aborted.is_set():
                return
            kind, work, started, ended, done, slots = entry
            done.synchronize()
            start, end = self._gpu_time(started), self._gpu_time(ended)
            if kind == "item":
                error = None
                for slot, block in slots:
                    found = self._found(slot, block)
                    if found is not None:
                        error = (block.tensor, f"the data of {block.tensor} on the GPU is not what it should be: "
                                               f"found {found}")
                        break
                self.scheduler.item_done(work, start, end, error,
                                         late=max(0.0, end - start - work.duration_s - 2e-6))
            else:
                copy, block = work.copy, work.block
                found = self._found(slots[0][0], block)
                if found is None and copy.kind == "offload":
                    found = self.patterns.check(self.host[copy.tensor][:block.nbytes].view(np.uint64), 0, block.seed)
                error = None
                if found is not None:
                    version = self.patterns.known.get(block.seed, (copy.tensor, "?"))[1]
                    error = (f"the data that {'arrived' if copy.kind == 'prefetch' else 'was written'} is not "
                             f"{copy.tensor} version {version}: found {found}")
                self.scheduler.copy_done(work, start, end, error)

    def _ssd_loop(self, name: str) -> None:
        """SSD copies through the stream's pinned bounce buffer, a chunk at a time."""
        q, stream = self.ssd_queues[name], self.streams[name]
        memcpy = self.cp.cuda.runtime.memcpyAsync
        bounce, bounce_ptr = self.bounce[name], self.bounce_ptr[name]
        while True:
            work = q.get()
            if work is None or self.aborted.is_set():
                return
            copy, block = work.copy, work.block
            start = self.clock()
            error = None
            place = self._ssd(copy.tensor, block.nbytes)
            for a in range(0, block.nbytes, BOUNCE):
                n = min(BOUNCE, block.nbytes - a)
                if copy.kind == "offload":
                    memcpy(bounce_ptr, self._ptr(block, a), n, self.D2H, stream.ptr)
                    stream.synchronize()
                    found = self.patterns.check(bounce[:n].view(np.uint64), a // 8, block.seed)
                    if found is not None:
                        error = f"the data that was written is not {copy.tensor}: found {found}"
                        break
                    os.pwrite(self.fd, bounce[:n], place + a)
                else:
                    got = os.preadv(self.fd, [bounce[:n]], place + a)
                    if got != n:
                        error = f"a short SSD read ({got} of {n} bytes at byte {a})"
                        break
                    memcpy(self._ptr(block, a), bounce_ptr, n, self.H2D, stream.ptr)
                    stream.synchronize()
            if error is None and copy.kind == "prefetch":
                with stream:
                    slot = self._launch_check(block)
                    self._fetch_slots([slot], stream)
                stream.synchronize()
                found = self._found(slot, block)
                if found is not None:
                    version = self.patterns.known.get(block.seed, (copy.tensor, "?"))[1]
                    error = f"the data that arrived is not {copy.tensor} version {version}: found {found}"
            self.scheduler.copy_done(work, start, self.clock(), error)

    def abort(self) -> None:
        self.aborted.set()

    def stop(self) -> None:
        for q in (*self.watch.values(), *self.ssd_queues.values()):
            q.put(None)
        for thread in self.threads:
            thread.join(timeout=30)
        self.device.synchronize()

    def close(self) -> None:
        self.ssd_file.close()
