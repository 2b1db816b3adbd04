"""The CUDA backend of the executor.

On a machine with CuPy and a GPU, the first tests replay planners' plans on the device
and check integrity, the budget and the prediction; elsewhere they skip, saying why.
The last tests run the backend's own logic (streams and watchers, check slots, pinned
buffers, the SSD bounce buffer, compaction) on a stand-in for CuPy that keeps "device"
memory in host memory and runs each kernel as numpy at once: they catch mistakes in
executor/cuda.py on any machine, though not in its CUDA C, nor any timing.
"""
from __future__ import annotations

import ctypes
import dataclasses
import sys
import threading
import time
import types

import numpy as np
import pytest

from executor.api import replay
from planner.core.api import make_plan
from simulator.hardware import load_hardware
from tracer.synthetic import synthesize

HW = load_hardware("a100-40gb-pcie4")


def _gpu():
    cupy = pytest.importorskip("cupy", reason="the cuda backend needs CuPy (pip install -e '.[cuda]') and a GPU")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:   # CuPy without a driver or a device
        pytest.skip(f"the cuda backend needs a CUDA GPU: {exc}")
    if count < 1:
        pytest.skip("the cuda backend needs a CUDA GPU: none found")
    return cupy


@pytest.mark.parametrize("planner, fraction", [("lms", 0.6), ("capuchin", 0.6), ("flashneuron", 0.6)])
def test_cuda_replays_planners_plans(planner, fraction):
    _gpu()
    profile = synthesize("cnn", layers=4)
    plan = make_plan(profile, HW, int(profile.peak_bytes * fraction), planner).plan
    report = replay(profile, plan, HW, backend="cuda")
    assert report["ok"], report["integrity"]
    assert report["peak_bytes"] <= report["budget_bytes"]
    assert report["link_bytes"] == report["predicted_link_bytes"]
    print(f"{planner}: measured {report['iteration_us']:.0f} us, predicted {report['predicted_us']:.0f} us, "
          f"error {report['relative_error'] * 100:+.1f}%")


def test_cuda_catches_a_drop_with_no_copy():
    _gpu()
    profile = synthesize("cnn", layers=4)
    plan = make_plan(profile, HW, int(profile.peak_bytes * 0.6), "capuchin").plan
    rec = next(a for a in plan.actions if a.kind == "recompute")
    broken = dataclasses.replace(plan, actions=tuple(a for a in plan.actions if a is not rec))
    report = replay(profile, broken, HW, backend="cuda")
    assert not report["ok"] and report["failure"]["tensor"] == rec.tensor


# ----------------------------------------------------------------------------- a stand-in for CuPy


class _Device(np.ndarray):
    """A "device" array: host memory whose ``.data.ptr`` is its address."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


def _words(ptr, n):
    return np.ctypeslib.as_array(ctypes.cast(int(ptr), ctypes.POINTER(ctypes.c_uint64)), shape=(int(n),))


def _fake_cupy(K, copy_bytes_per_s):
    """CuPy as far as executor/cuda.py uses it. Each stream is a thread that runs what is
    queued on it in order: kernels as numpy (the busy-wait as a sleep until its stamp
    plus its time), copies as memmove followed by a sleep of their bytes over
    ``copy_bytes_per_s``, events as time stamps; so work overlaps across streams as on
    a GPU, and ``synchronize`` waits for it."""
    K = int(K)
    local = threading.local()
    kept = []
    streams = {}

    def empty(shape, dtype):
        return np.empty(shape, dtype).view(_Device)

    def zeros(shape, dtype):
        return np.zeros(shape, dtype).view(_Device)

    class Memory:
        def __init__(self, size):
            self.buffer = np.zeros(size, np.uint8)
            self.ptr = self.buffer.ctypes.data

    class Stream:
        def __init__(self, non_blocking=False):
            self.ptr = id(self)
            self.work = __import__("queue").SimpleQueue()
            streams[self.ptr] = self
            threading.Thread(target=self._run, daemon=True).start()

        def _run(self):
            while True:
                self.work.get()()

        def put(self, job):
            self.work.put(job)

        def __enter__(self):
            local.stream = self
            return self

        def __exit__(self, *exc):
            local.stream = None

        def synchronize(self):
            done = threading.Event()
            self.put(done.set)
            done.wait()

    class Event:
        def __init__(self):
            self.at, self.done = 0.0, threading.Event()

        def record(self, stream=None):
            def mark():
                self.at = time.perf_counter()
                self.done.set()
            stream.put(mark)

        def synchronize(self):
            self.done.wait()

    def stamp(slot):
        _words(slot, 1)[0] = time.perf_counter_ns()

    def spin_until(slot, ns):
        left = (int(_words(slot, 1)[0]) + int(ns) - time.perf_counter_ns()) / 1e9
        if left > 0:
            time.sleep(left)

    def fill(p, n, first, seed):
        i = np.arange(int(first), int(first) + int(n), dtype=np.uint64)
        _words(p, n)[:] = np.uint64(seed) + i * np.uint64(K)

    def check(p, n, first, seed, slot):
        i = np.arange(int(first), int(first) + int(n), dtype=np.uint64)
        bad = np.flatnonzero(_words(p, n) != np.uint64(seed) + i * np.uint64(K))
        if len(bad):
            out = _words(slot, 2)
            out[0] = min(int(out[0]), int(bad[0]))

    def peek(p, slot):
        out = _words(slot, 2)
        if int(out[0]) != 2**64 - 1:
            out[1] = _words(p, int(out[0]) + 1)[int(out[0])]

    kernels = {"stamp": stamp, "spin_until": spin_until, "fill": fill, "check": check, "peek": peek}

    def launch(name):
        def call(grid, block, args):
            stream = getattr(local, "stream", None)
            job = lambda: kernels[name](*args)   # noqa: E731
            stream.put(job) if stream is not None else job()
        return call

    class RawModule:
        def __init__(self, code):
            assert "globaltimer" in code and "atomicMin" in code
            self.code = code

        def get_function(self, name):
            return launch(name)

    def memcpy_async(dst, src, size, kind, stream):
        def job():
            ctypes.memmove(int(dst), int(src), int(size))
            if kind != 3:    # device to device: at the GPU's memory speed, nothing to wait
                time.sleep(int(size) / copy_bytes_per_s)
        streams[stream].put(job)

    def alloc_pinned_memory(size):
        buffer = np.zeros(size, np.uint8)
        kept.append(buffer)
        return buffer

    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, memcpyHostToDevice=1, memcpyDeviceToHost=2,
                                    memcpyDeviceToDevice=3, memcpyAsync=memcpy_async,
                                    memGetInfo=lambda: (0, 0))

    class OutOfMemoryError(Exception):
        pass

    def synchronize_all():
        for stream in list(streams.values()):
            stream.synchronize()

    cuda = types.SimpleNamespace(
        runtime=runtime, Memory=Memory, Stream=Stream, Event=Event, alloc_pinned_memory=alloc_pinned_memory,
        get_elapsed_time=lambda a, b: (b.at - a.at) * 1e3,
        Device=lambda i=0: types.SimpleNamespace(use=lambda: None, synchronize=synchronize_all),
        memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError))
    return types.SimpleNamespace(cuda=cuda, RawModule=RawModule, empty=empty, zeros=zeros, uint64=np.uint64)


SIZE = 0.001     # the stand-in's runs: sizes x0.001, so its copies move at 24 GB/s x0.001


@pytest.fixture
def fake_cupy(monkeypatch):
    from executor.pattern import K
    fake = _fake_cupy(K, 24e9 * SIZE)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


@pytest.mark.parametrize("planner", ["lms", "capuchin", "flashneuron"])
def test_cuda_backend_logic_on_a_stand_in(fake_cupy, planner):
    profile = synthesize("cnn", layers=2, batch=32)
    plan = make_plan(profile, HW, int(profile.peak_bytes * 0.6), planner).plan
    report = replay(profile, plan, HW, backend="cuda", size_scale=SIZE)
    assert report["ok"], report["integrity"]
    assert report["backend"] == "cuda" and report["time_scale"] == 1.0
    assert report["link_bytes"] == report["predicted_link_bytes"]


def test_cuda_backend_checks_on_a_stand_in(fake_cupy, monkeypatch):
    """The device-side checks find a corrupted host copy, and name it."""
    import executor.cuda as cuda

    original = cuda.CudaBackend.run_copy
    hit = []

    def corrupting(self, work):
        if work.copy.kind == "prefetch" and work.copy.tier == "host" and not hit:
            hit.append(work.copy.tensor)
            self.host[work.copy.tensor][0] ^= 1
        original(self, work)

    monkeypatch.setattr(cuda.CudaBackend, "run_copy", corrupting)
    profile = synthesize("cnn", layers=2, batch=32)
    plan = make_plan(profile, HW, int(profile.peak_bytes * 0.6), "lms").plan
    report = replay(profile, plan, HW, backend="cuda", size_scale=SIZE)
    assert not report["ok"] and report["failure"]["tensor"] == hit[0]
    assert "unrecognised data at byte 0" in report["failure"]["message"]
