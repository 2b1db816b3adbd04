"""R31 at a kernel's scale (issue 52): one kernel, hand-computed, per case of G10's
measurements (its inputs fault; its outputs are first touches; both), on the engine (the
C path and the Python reference agree) and through benchmarks/uvm_kernels.py's replay.

The machine: PCIe 1 byte per microsecond each way, no PCIe latency; managed memory of
64-byte blocks, 4-byte pages, 8-byte big pages, 16 faults a batch (a whole block), a
5 us batch latency; demand paging copies at 0.5 byte/us (``fault_gbps`` 0.0005, below
the link), an item that migrates pages pays 100 us once, and a batch of first-touch
faults 25 us, which run while the kernel computes: an item is delayed by what exceeds
its compute time. Every kernel runs 10 us.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simulator.compile.compiled import compile_machine
from simulator.hardware import hardware_from_dict
from simulator.plan import drop
from tests.conftest import make_profile
from tests.test_fastuvm import same
from tests.test_uvm import uvm_plan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from uvm_kernels import Kernel, predict  # noqa: E402


def machine(**uvm):
    return hardware_from_dict({
        "name": "uvm-kernel-test", "gpu": {"memory": "1GiB", "fp32_tflops": 1, "fp16_tflops": 1, "hbm_gbps": 1},
        "pcie": {"h2d_gbps": 0.001, "d2h_gbps": 0.001, "duplex": "full", "latency_us": 0},
        "host": {"memory": "1GiB"},
        "uvm": {"block": 64, "page": 4, "big_page": 8, "fault_batch_faults": 16, "fault_latency_us": 5,
                "fault_gbps": 0.0005, "kernel_fault_us": 100, "first_touch_us": 25, **uvm}})


def kernel(reads: dict, makes: dict, workspace: int = 0):
    """One kernel k1 reading ``reads`` (weights in host memory, dropped after it so that
    every iteration faults them again, R36) and making ``makes``."""
    tensors = {**{t: (n, "weight") for t, n in reads.items()}, **{t: (n, "activation") for t, n in makes.items()}}
    p = make_profile(tensors, [("k1", "forward", 10.0, list(reads), list(makes), None, workspace)], "kernel")
    plan = uvm_plan(p, *(drop(t, after="k1") for t in reads), initial={t: "host" for t in reads},
                    read_mostly=tuple(reads))
    return same(p, plan, machine(), 10_000)


def test_all_inputs_fault():
    # w: 128 B, two blocks of 16 pages; each block is one batch of 16 faults (the whole
    # block, 64 B): 5 + 64 / 0.5 = 133 us each, the first also pays the item's 100 us:
    # 133 + 133 + 100 = 366 us; k1 runs 366-376.
    r = kernel({"w": 128}, {})
    assert r.iteration_us == pytest.approx(376.0)
    assert (r.faults, r.fault_bytes) == (2, 128)
    assert r.stall_fault_us == pytest.approx(366.0)


def test_outputs_are_first_touches_where_no_freed_page_is_free():
    # y: 100 B, 25 pages. In the steady iteration (R36) it takes the pages the last
    # iteration's y freed (R31: mapped already): no first touch, k1 runs 0-10. With room
    # for 60 B only beside a 40 B weight that stays (budget 100 B, w resident), the last
    # iteration freed y's 100 B but only 60 are free: 40 B = 10 pages first-touched, one
    # batch of 25 us, beside k1's 10 us of compute: k1 ends at 25, 15 us late.
    r = kernel({}, {"y": 100})
    assert r.iteration_us == pytest.approx(10.0) and r.stall_fault_us == 0.0
    p = make_profile({"w": (40, "weight"), "y": (100, "activation")},
                     [("k1", "forward", 10.0, ["w"], ["y"], None, 0)], "kernel")
    from tests.test_fastuvm import same as run_both
    r = run_both(p, uvm_plan(p), machine(), 140)
    assert r.iteration_us == pytest.approx(10.0)       # 140 B: everything fits, all reused
    assert fresh_first_touch(machine(), free=60, recycled=100, alloc=100) == (40, 25.0)
    assert (r.faults, r.fault_bytes) == (0, 0)
    from simulator.run.uvm_memory import touch_delay_ps
    assert touch_delay_ps(25_000_000, 10_000_000) == 15_000_000
    assert touch_delay_ps(25_000_000, 40_000_000) == 0       # a longer kernel hides them


def fresh_first_touch(hardware, free: int, recycled: int, alloc: int) -> tuple[int, float]:
    """(fresh bytes, first-touch us) of ``alloc`` bytes with ``free`` bytes free, of which
    ``recycled`` were freed by dead tensors (R31's fresh_bytes and first_touch_ps)."""
    from types import SimpleNamespace

    from simulator.run.uvm_memory import first_touch_ps, fresh_bytes
    uvm = compile_machine(hardware).uvm
    mem = SimpleNamespace(recycled=recycled, budget=free, ledger=0)
    fresh = fresh_bytes(mem, alloc)
    return fresh, first_touch_ps(fresh, uvm.page, uvm.batch_faults, uvm.first_touch_ps) / 10**6


def test_a_mix():
    # w (64 B, one block) faults in one batch: 5 + 128 + 100 = 233 us; y (40 B) and the
    # 8 B workspace (12 pages) take the pages the last iteration's y and workspace freed:
    # no first touch. 233 us, k1 runs 233-243. Cold (nothing freed yet), the 48 B would be
    # 12 pages of first touch, one batch of 25 us, as G10's kernels measured alone pay.
    r = kernel({"w": 64}, {"y": 40}, workspace=8)
    assert r.iteration_us == pytest.approx(243.0)
    assert (r.faults, r.fault_bytes) == (1, 64)
    assert r.stall_fault_us == pytest.approx(233.0)
    assert fresh_first_touch(machine(), free=10_000, recycled=0, alloc=48) == (48, 25.0)


def test_a_long_train_pages_faster_past_the_ramp():
    # fault_bulk_gbps 0.001 (1 B/us) past the item's first 32 B (fault_ramp): w's first
    # block's batch copies 32 B at 0.5 B/us and 32 B at 1 B/us, 5 + 64 + 32 = 101 us (+ the
    # item's 100 us); the second block's, all past the ramp, 5 + 64 = 69 us: 270 us, k1
    # runs 270-280. Without the bulk rate: 2 x 133 + 100 = 366 us (test_all_inputs_fault).
    fast = machine(fault_bulk_gbps=0.001, fault_ramp=32)
    tensors = {"w": (128, "weight")}
    p = make_profile(tensors, [("k1", "forward", 10.0, ["w"], [], None, 0)], "kernel")
    plan = uvm_plan(p, drop("w", after="k1"), initial={"w": "host"}, read_mostly=("w",))
    r = same(p, plan, fast, 10_000)
    assert r.iteration_us == pytest.approx(280.0)
    assert r.stall_fault_us == pytest.approx(270.0)
    from simulator.run.uvm_memory import paging_ps
    assert paging_ps(0, 64, 500_000, 1_000_000, 32) == 96 * 10**6      # 32 B slow + 32 B bulk, in ps
    assert paging_ps(64, 64, 500_000, 1_000_000, 32) == 64 * 10**6


def test_the_kernel_replay_charges_what_the_engine_does():
    # benchmarks/uvm_kernels.py's two states of the mix: with its input in host memory
    # (PF) 233 + (25 - 10) = 248 us, with it resident (InputPF) what the first touch takes
    # beyond the kernel's 10 us, 15 us: the input part 233 us, the output part 15 us (ms).
    k = Kernel("mix", resident=0.01, input_pf=0.017, pf=0.25, inputs=[64], host_out=[], new_out=48)
    assert predict(k, compile_machine(machine())) == pytest.approx((0.233, 0.015))
    # a kernel of 30 us hides its 25 us of first touches
    k = Kernel("long", resident=0.03, input_pf=0.03, pf=0.25, inputs=[64], host_out=[], new_out=48)
    assert predict(k, compile_machine(machine())) == pytest.approx((0.233, 0.0))
    # an output the profiler wrote from the CPU migrates like an input, in both states
    k = Kernel("host", resident=0.01, input_pf=0.25, pf=0.5, inputs=[64], host_out=[64], new_out=0)
    # InputPF: one batch of the output, 133 + 100 = 233 us; PF: two batches, 133 x 2 + 100
    assert predict(k, compile_machine(machine())) == pytest.approx((0.133, 0.233))


def test_the_script_refuses_a_missing_tree(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "uvm_kernels.py"), str(tmp_path / "none")],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "not a G10 tree" in run.stderr
    (tmp_path / "g10" / "results").mkdir(parents=True)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "uvm_kernels.py"), str(tmp_path / "g10")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "kernels.config: no such file" in run.stderr
