"""The host backend: a faithful emulation of a GPU runtime on the CPU, in real time.

- GPU memory is one numpy buffer (the budget times the size scale, plus a word of
  rounding per tensor); the scheduler places every tensor at an offset in it.
- Host memory is one numpy buffer per tensor copied out; the SSD tier is a real
  temporary file, written with ``os.pwrite`` and read with ``os.preadv`` through a bounce
  buffer per SSD stream, at a slot per tensor (a re-offload reuses its slot).
- Each stream (``compute``, ``h2d``, ``d2h``, ``ssd_read``, ``ssd_write``) is a thread with a
  FIFO queue. Threads rather than one event loop with timed waits: the concurrency is
  then real (a kernel's wait, four copies and the checks overlap as the OS schedules
  them, and the scheduler reacts to completions as a runtime does to CUDA events),
  not a loop that decides the overlap itself; the numpy copies and checks, the file I/O
  and the waits release the GIL, so the threads do run side by side.
- A kernel is a timed wait: it checks the pattern of every tensor it reads or updates,
  writes the pattern of every tensor it produces or updates, and waits out the rest of
  its duration times the time scale, from its due start. The checks are part of its
  time: it ends at its due end, or at its start plus the CPU time of its checks and
  writes when that is later (an item whose checks outlast it is counted ``late``). CPU
  time, not wall time: a thread that the OS wakes late or runs on a core another
  process holds is the OS's delay, not the kernel's.
- A copy waits its latency (times the time scale), then moves its bytes in chunks,
  never more than one chunk ahead of the credit its flow has earned on the shared
  links (executor/links.py), so it ends when its last byte is due at the fair rate.
  Every chunk that lands is checked against the tensor's pattern.
"""
from __future__ import annotations

import os
import queue
import sys
import tempfile
import threading
import time

import numpy as np

from simulator.model.links import STREAMS

from .links import LinkBoard
from .pattern import Patterns, check_lower_copy
from .work import Block, CopyWork, ItemWork

CHUNK = 64 * 1024     # bytes a copy moves at a time (and may run ahead of its credit)


class HostBackend:
    name = "host"

    def __init__(self, link_capacity: tuple[int, ...], time_scale: float, patterns: Patterns,
                 arena_bytes: int, tmpdir: str | None = None):
        self.clock = time.perf_counter
        self.patterns = patterns
        self.time_scale = time_scale
        self.region = np.zeros(arena_bytes - arena_bytes % 8, dtype=np.uint8)
        self.words = self.region.view(np.uint64)
        self.host: dict[str, np.ndarray] = {}
        self.ssd_file = tempfile.TemporaryFile(prefix="swapplan-ssd-", dir=tmpdir)
        self.fd = self.ssd_file.fileno()
        self.ssd_slot: dict[str, int] = {}
        self.ssd_end = 0
        self.board = LinkBoard(link_capacity, time_scale, self.clock)
        self.aborted = threading.Event()
        self.queues = {name: queue.SimpleQueue() for name in ("compute", *STREAMS)}
        self.bounce = {name: np.empty(CHUNK, dtype=np.uint8) for name in ("ssd_read", "ssd_write")}
        self.threads: list[threading.Thread] = []
        self.scheduler = None
        self._switch = None

    # ------------------------------------------------------------------ placing (before the clock)

    def place(self, block: Block) -> None:
        self.patterns.fill(self._gpu(block), 0, block.seed)

    def place_copy(self, tid: str, tier: str, nbytes: int, seed: int) -> None:
        data = np.empty(nbytes // 8, dtype=np.uint64)
        self.patterns.fill(data, 0, seed)
        if tier == "host":
            self.host[tid] = data.view(np.uint8)
        else:
            os.pwrite(self.fd, data.view(np.uint8), self._slot(tid, nbytes))

    def move(self, moves: list[tuple[int, int, int]], way: str) -> None:
        """Make room: put blocks at new offsets, in the order given. ``apart``: no move
        overlaps another; ``down``: each block moves down, in address order (numpy's
        copy copes with a block that overlaps its own old place)."""
        region = self.region
        for old, new, size in moves:
            np.copyto(region[new:new + size], region[old:old + size])

    def release_tier(self, tid: str, tier: str) -> None:
        if tier == "host":
            self.host.pop(tid, None)

    def _slot(self, tid: str, nbytes: int) -> int:
        if tid not in self.ssd_slot:
            self.ssd_slot[tid] = self.ssd_end
            self.ssd_end += nbytes
        return self.ssd_slot[tid]

    def _gpu(self, block: Block) -> np.ndarray:
        first = block.offset // 8
        return self.words[first:first + block.nbytes // 8]

    # ------------------------------------------------------------------ checks after the clock

    def check_block(self, block: Block) -> str | None:
        return self.patterns.check(self._gpu(block), 0, block.seed)

    def check_copy(self, tid: str, tier: str, nbytes: int, seed: int) -> str | None:
        host = self.host.get(tid) if tier == "host" else False
        return check_lower_copy(self.patterns, host, self.fd, self.ssd_slot.get(tid, 0), nbytes, seed)

    # ------------------------------------------------------------------ streams

    def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)   # a thread woken from a wait gets the GIL within 0.2 ms
        self.threads = [threading.Thread(target=self._guarded, args=(self._compute_loop, "compute"),
                                         name="swapplan-compute", daemon=True)]
        self.threads += [threading.Thread(target=self._guarded, args=(self._copy_loop, name, name),
                                          name=f"swapplan-{name}", daemon=True) for name in STREAMS]
        for thread in self.threads:
            thread.start()

    def run_item(self, work: ItemWork) -> None:
        self.queues["compute"].put(work)

    def run_copy(self, work: CopyWork) -> None:
        self.queues[work.copy.stream].put(work)

    def abort(self) -> None:
        self.aborted.set()
        with self.board.cond:
            self.board.cond.notify_all()

    def stop(self) -> None:
        for q in self.queues.values():
            q.put(None)
        for thread in self.threads:
            thread.join(timeout=10)
        if self._switch is not None:
            sys.setswitchinterval(self._switch)
            self._switch = None

    def close(self) -> None:
        self.ssd_file.close()

    def _guarded(self, loop, name: str, *args) -> None:
        try:
            loop(*args)
        except BaseException as exc:   # a bug must stop the replay, not hang it
            self.scheduler.backend_failed(name, exc)

    def _compute_loop(self) -> None:
        q, clock, patterns = self.queues["compute"], self.clock, self.patterns
        while True:
            work = q.get()
            if work is None or self.aborted.is_set():
                return
            began = time.thread_time()
            error = None
            for block in work.reads:
                found = patterns.check(self._gpu(block), 0, block.seed)
                if found is not None:
                    error = (block.tensor, f"the data of {block.tensor} on the GPU is not what it should be: "
                                           f"found {found}")
                    break
            if error is None:
                for block in work.writes:
                    patterns.fill(self._gpu(block), 0, block.seed)
            worked = time.thread_time() - began
            due = work.start_at + work.duration_s
            if due > clock() and error is None:
                self.aborted.wait(due - clock())
            # a thread woken late, or one the OS ran on a busy core, is the OS's delay, not the
            # kernel's: the kernel's work is the CPU time of its checks and writes
            self.scheduler.item_done(work, work.start_at, max(due, work.start_at + worked), error,
                                     late=max(0.0, worked - work.duration_s))

    def _copy_loop(self, stream: str) -> None:
        q = self.queues[stream]
        while True:
            work = q.get()
            if work is None or self.aborted.is_set():
                return
            flowing = work.start_at + work.latency_s
            wait = flowing - self.clock()
            if wait > 0:
                self.aborted.wait(wait)
            end, error = self._paced(work, stream, flowing)
            self.scheduler.copy_done(work, work.start_at, end, error)

    def _paced(self, work: CopyWork, stream: str, flowing: float) -> tuple[float, str | None]:
        """Move the copy's bytes no faster than its flow's fair share allows (R17), from
        ``flowing`` (when its latency ended); returns when it was due to end (or, if the
        copying and checking took longer than that, ``flowing`` plus the time they took)
        and what the checks found."""
        copy, block = work.copy, work.block
        board, total, n = self.board, copy.nbytes, block.nbytes
        key = board.start(copy.links, total, flowing)
        done, error, working = 0, None, 0.0
        due = flowing
        try:
            while not self.aborted.is_set():
                credit = board.credit(key)
                allowed = n if credit >= total else min(n, int(credit / total * n) // 8 * 8 + CHUNK)
                if done < allowed:
                    upto = min(allowed, done + CHUNK)
                    began = time.thread_time()
                    error = self._move(work, stream, done, upto)
                    working += time.thread_time() - began
                    done = upto
                    if error is not None:
                        break
                    continue
                if credit >= total:
                    break
                # wait until the credit has caught up with what was moved (then move a chunk more)
                board.wait(key, min(total, total * done / n), self.aborted)
        finally:
            due = board.finish(key)
        return max(due, flowing + working), error

    def _move(self, work: CopyWork, stream: str, a: int, b: int) -> str | None:
        """Copy bytes [a, b) of the tensor and check what landed."""
        copy, block, patterns = work.copy, work.block, self.patterns
        gpu = self.region[block.offset + a:block.offset + b]
        first = a // 8
        if copy.kind == "prefetch":
            if copy.tier == "host":
                np.copyto(gpu, self.host[copy.tensor][a:b])
            else:
                bounce = self.bounce[stream][:b - a]
                got = os.preadv(self.fd, [bounce], self.ssd_slot[copy.tensor] + a)
                if got != b - a:
                    return f"a short SSD read ({got} of {b - a} bytes at byte {a})"
                np.copyto(gpu, bounce)
            landed = gpu
        elif copy.tier == "host":
            buffer = self.host.get(copy.tensor)
            if buffer is None or len(buffer) != block.nbytes:
                buffer = self.host[copy.tensor] = np.empty(block.nbytes, dtype=np.uint8)
            np.copyto(buffer[a:b], gpu)
            landed = buffer[a:b]
        else:
            bounce = self.bounce[stream][:b - a]
            np.copyto(bounce, gpu)
            landed = bounce
        found = patterns.check(landed.view(np.uint64), first, block.seed)
        if found is not None:
            version = patterns.known.get(block.seed, (copy.tensor, "?"))[1]
            return f"the data that {'arrived' if copy.kind == 'prefetch' else 'was written'} is not {copy.tensor} " \
                   f"version {version}: found {found}"
        if copy.kind == "offload" and copy.tier == "ssd":
            os.pwrite(self.fd, landed, self._slot(copy.tensor, block.nbytes) + a)
        return None
