"""Careless and hostile input, second pass (issue 33): each case once reproduced a
traceback, an exhaustion of memory or a false verdict, and is now a placement, one line
with exit status 2, or a refusal saying what to do instead.

- ``place`` of a ZeRO-Offload plan: prefetches issued when an op on the CPU ends had no
  allocation key (KeyError in the arena).
- a hardware ``uvm`` section with 1-byte blocks or pages: billions of blocks, out of
  memory; now bounded (2^24 blocks and fault batches of the profile's tensors).
- MemoryError anywhere, and ``train`` whose real steps run out of memory: exit 2, one line.
- ``replay`` / ``place`` of a UVM plan: a false "budget overrun"; now refused.
- ``replay --backend cuda`` without CuPy: seconds and gigabytes of work first; now at once.
"""
from __future__ import annotations

import importlib
import json
import resource
import subprocess
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import app
from planner.core.api import make_plan
from planner.shared.placement import place
from simulator.api import Simulator
from simulator.compile.lower import compile_program
from simulator.errors import InputError
from simulator.hardware import MAX_UVM_BLOCKS, check_uvm_scale, hardware_from_dict, uvm_scale
from simulator.model.allocation import allocation_keys
from simulator.plan import Plan, plan_json
from simulator.profile import profile_sha256, save_profile
from tests.test_zero import CPU, amp_step, hw as cpu_machine

ROOT = Path(__file__).resolve().parents[1]
SWAPPLAN = [sys.executable, "-c", "import cli; cli.main()"]


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args], obj={"debug": False})


def one_line_error(result, code: int = 2) -> str:
    """The one stderr line of a failed command, checked for its exit status and form."""
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


# ----------------------------------------------------------------------------- 1: place a ZeRO-Offload plan


def test_zero_offload_plan_places_with_the_prefetches_issued_after_cpu_ops():
    """zero-offload prefetches each new weight (n1, n2) when its cast on the CPU ends: the
    prefetch allocates on the GPU, the CPU op does not. Every prefetch has a key, the
    placement is exact (no allocator rounding: the arena is the live peak here) and the
    placed plan runs as the plan did."""
    profile, hardware = amp_step(), cpu_machine()
    planned = make_plan(profile, hardware, 10**6, "zero-offload").plan
    assert {(a.kind, a.tensor, a.after) for a in planned.actions} >= {("prefetch", "n1", "cast1"),
                                                                      ("prefetch", "n2", "cast2")}
    sim = Simulator(profile, hardware)
    program = compile_program(profile, sim.compiled, planned, sim.machine)
    keys = allocation_keys(program, sim.compiled)
    prefetches = [t.index for t in program.transfers if t.kind == "prefetch"]
    assert prefetches and all(j in keys.transfers for j in prefetches)

    placed, figures = place(profile, planned, hardware, 10**6)
    assert {"n1#1", "n2#1"} <= set(placed.placement.offsets)
    assert figures["arena_bytes"] == figures["peak_live_bytes"] == 450
    plain, with_offsets = sim.simulate(planned, 10**6), sim.simulate(placed, 10**6)
    assert with_offsets.ok and with_offsets.arena_bytes == 450
    assert with_offsets.iteration_us == plain.iteration_us


def test_place_command_on_a_zero_offload_plan(tmp_path):
    profile, hardware = amp_step(), cpu_machine()
    planned = make_plan(profile, hardware, 10**6, "zero-offload").plan
    save_profile(profile, tmp_path / "p.json")
    (tmp_path / "z.json").write_text(plan_json(planned))
    (tmp_path / "hw.json").write_text(json.dumps({     # tests/engine_helpers.py's machine, with a CPU
        "name": "test-machine", "gpu": {"memory": "1GiB", "fp32_tflops": 1, "fp16_tflops": 1, "hbm_gbps": 1},
        "pcie": {"h2d_gbps": 0.001, "d2h_gbps": 0.001, "duplex": "full", "latency_us": 0},
        "host": {"memory": "1GiB"}, "cpu": CPU,
        "ssd": {"read_gbps": 0.0005, "write_gbps": 0.0005, "latency_us": 0, "capacity": "1GiB", "path": "host"}}))
    result = run("place", tmp_path / "p.json", tmp_path / "z.json", "--hardware", tmp_path / "hw.json",
                 "--budget", "1000000B", "-o", tmp_path / "zp.json", "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["feasible"] and figures["arena_bytes"] == 450
    assert json.loads((tmp_path / "zp.json").read_text())["placement"]["arena_bytes"] == 450


# ----------------------------------------------------------------------------- 2: bounded UVM blocks and pages


HW_YAML = """name: tiny-block
gpu: {{memory: 40GiB, fp32_tflops: 19.5, fp16_tflops: 312, hbm_gbps: 1555}}
pcie: {{h2d_gbps: 24, d2h_gbps: 24, duplex: full, latency_us: 10}}
host: {{memory: 512GiB}}
uvm: {uvm}
"""


@pytest.fixture(scope="module")
def big_synth(tmp_path_factory):
    """The issue's profile: a 24-layer transformer, batch 8, seq 2048 (51 GB of tensors)."""
    path = tmp_path_factory.mktemp("synth") / "p.json"
    result = run("synth", "transformer", "--layers", 24, "--batch", 8, "--seq", 2048, "-o", path)
    assert result.exit_code == 0, result.output
    return path


@pytest.mark.parametrize("uvm, field", [
    ("{block: 1B}", "uvm.page"),                                          # a page larger than its block
    ("{block: 1B, fault_batch_blocks: 1}", "uvm.block"),                  # the first model: a page is a block
    ("{block: 1B, page: 1B, big_page: 1B}", "uvm.block"),
    ("{block: 1KiB, page: 1KiB, big_page: 1KiB}", "uvm.block"),           # 5 x 10^7 blocks
    ("{block: 1000000B, page: 1B, big_page: 1B, fault_batch_faults: 1, prefetch_threshold: 100}", "uvm.page"),
])
def test_tiny_uvm_blocks_or_pages_are_one_line_not_out_of_memory(big_synth, tmp_path, uvm, field):
    (tmp_path / "hw.yaml").write_text(HW_YAML.format(uvm=uvm))
    for args in (("plan", big_synth, "--planner", "uvm", "--budget", "60%", "-o", tmp_path / "u.json"),
                 ("plan", big_synth, "--planner", "deepum", "--budget", "60%", "-o", tmp_path / "d.json")):
        line = one_line_error(run(*args, "--hardware", tmp_path / "hw.yaml"))
        assert line.startswith(f"error: {tmp_path / 'hw.yaml'}: {field}: "), line


def test_the_issues_reproduction_under_ulimit(big_synth, tmp_path):
    """`ulimit -v 4000000` (about 4 GB of address space): one line, exit 2, in seconds."""
    (tmp_path / "hw.yaml").write_text(HW_YAML.format(uvm="{block: 1B, page: 1B, big_page: 1B}"))

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4_000_000 * 1024, 4_000_000 * 1024))

    done = subprocess.run(SWAPPLAN + ["plan", str(big_synth), "--planner", "uvm", "--budget", "60%", "--hardware",
                                      str(tmp_path / "hw.yaml"), "-o", str(tmp_path / "u.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "uvm.block" in done.stderr and "2^24" in done.stderr


def test_uvm_scale_counts_blocks_and_fault_batches():
    def uvm(**section):
        return hardware_from_dict({"name": "m", "gpu": {"memory": "1GiB", "fp32_tflops": 1, "fp16_tflops": 1,
                                                        "hbm_gbps": 1},
                                   "pcie": {"h2d_gbps": 1, "d2h_gbps": 1, "duplex": "full", "latency_us": 0},
                                   "host": {"memory": "1GiB"}, "uvm": section}).uvm
    # 2 MiB + 1 byte: two blocks; the driver's sizes: 512 pages a block, grown to 32 big
    # pages, one batch of 256 faults each
    assert uvm_scale(uvm(), [2 * 2**20 + 1]) == (2, 2)
    # no prefetching (threshold 100): pages do not grow, 512 faults are 2 batches of 256
    assert uvm_scale(uvm(prefetch_threshold=100), [2 * 2**20 + 1]) == (2, 3)
    assert uvm_scale(uvm(block=100, fault_batch_blocks=1), [250, 0, 100]) == (4, 4)
    assert uvm_scale(uvm(block=64, page=4, big_page=8, fault_batch_faults=5), [64, 20]) == (2, 2 + 1)


def test_the_bound_leaves_real_machines_and_the_hand_sized_tests_alone(big_synth):
    from simulator.catalog import open_profile
    from simulator.hardware import load_hardware
    profile = open_profile("llama2-70b-b1-s1024-amp-bf16")
    sizes = [t.bytes for t in profile.tensors]
    for preset in ("a100-40gb-pcie4", "h200-141gb-1.5tb-pcie5"):
        check_uvm_scale(load_hardware(preset), sizes)                  # 665k blocks of 2 MiB
    four_k = HW_YAML.format(uvm="{block: 4KiB, page: 4KiB, big_page: 4KiB}")
    import yaml
    machine = hardware_from_dict(yaml.safe_load(four_k), "four-k.yaml")
    synth = open_profile(str(big_synth))
    check_uvm_scale(machine, [t.bytes for t in synth.tensors])        # 12.5M blocks: allowed
    assert uvm_scale(machine.uvm, [t.bytes for t in synth.tensors])[0] <= MAX_UVM_BLOCKS
    with pytest.raises(InputError) as caught:
        check_uvm_scale(machine, sizes, profile.name)                 # 339M blocks of 4 KiB: not
    assert caught.value.where == "uvm.block" and "at least 131072 bytes" in str(caught.value)


# ----------------------------------------------------------------------------- 3: out of memory


def test_memory_error_anywhere_is_one_line_exit_2(tmp_path, two_layer, monkeypatch):
    save_profile(two_layer, tmp_path / "p.json")

    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 3.2 TiB for an array")

    monkeypatch.setattr("simulator.catalog.open_profile", exhausted)
    line = one_line_error(run("info", tmp_path / "p.json"))
    assert line.split(" ", 2)[2].startswith(         # the program's name, then the command
        "info: out of memory (Unable to allocate 3.2 TiB for an array): the input needs more than "), line
    assert "memory" in line.split(": the input needs more than ", 1)[1]


def test_other_exceptions_stay_internal_errors(tmp_path, two_layer, monkeypatch):
    save_profile(two_layer, tmp_path / "p.json")
    monkeypatch.setattr("simulator.catalog.open_profile", lambda *a, **k: 1 / 0)
    result = run("info", tmp_path / "p.json")
    assert result.exit_code == 3 and "internal error: ZeroDivisionError" in result.stderr


@pytest.mark.parametrize("exhaustion, code", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 1024000000 bytes. Error code 12 (Cannot allocate memory)"), 2),
    (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 4096 bytes."), 2),
    (MemoryError(), 2),
    (RuntimeError("a bug, not memory"), 3),
])
def test_train_out_of_memory_names_the_model_and_batch(monkeypatch, exhaustion, code):
    pytest.importorskip("torch", reason="train needs torch (the 'trace' extra)")
    train_module = importlib.import_module("runtime.train")   # the package's ``train`` is the function

    def step(*args, **kwargs):
        raise exhaustion

    monkeypatch.setattr(train_module, "reference_step", step)
    result = run("train", "runtime.small_models:mlp", "--batch", 4, "--planner", "lms", "--budget", "90%")
    if code == 3:
        assert result.exit_code == 3 and "internal error: RuntimeError: a bug, not memory" in result.stderr
        return
    line = one_line_error(result)
    assert line.startswith("error: <argument>: --batch: runtime.small_models:mlp at batch 4 ran out of memory in "
                           "its real CPU steps (")
    assert line.endswith("): try a smaller --batch (or --seq)") and "enforce fail" not in line


# ----------------------------------------------------------------------------- 4: UVM plans are not replayed


@pytest.fixture
def uvm_files(tmp_path, two_layer):
    save_profile(two_layer, tmp_path / "p.json")
    plan = Plan(two_layer.name, (), memory="uvm", profile_sha256=profile_sha256(two_layer))
    (tmp_path / "u.json").write_text(plan_json(plan))
    return tmp_path / "p.json", tmp_path / "u.json", plan, two_layer


def test_replay_and_place_refuse_a_uvm_plan(uvm_files, tmp_path):
    profile_path, plan_path, plan, profile = uvm_files
    line = one_line_error(run("replay", profile_path, plan_path))
    assert line.startswith(f"error: {plan_path}: memory: a UVM plan") and "`swapplan simulate` scores it" in line
    line = one_line_error(run("place", profile_path, plan_path, "-o", tmp_path / "placed.json"))
    assert "a UVM plan" in line and "no placement" in line and "simulate" in line
    assert not (tmp_path / "placed.json").exists()
    from executor.api import replay
    from tests.engine_helpers import machine
    with pytest.raises(InputError, match="is not replayed"):
        replay(profile, plan, machine())
    assert run("simulate", profile_path, plan_path).exit_code == 0     # what to do instead works


# ----------------------------------------------------------------------------- 5: --backend cuda checked first


def test_replay_cuda_without_cupy_says_so_before_any_work(monkeypatch, uvm_files):
    profile_path, plan_path, *_ = uvm_files
    monkeypatch.setitem(sys.modules, "cupy", None)          # import cupy -> ImportError

    def never(*args, **kwargs):
        raise AssertionError("read before the backend was checked")

    monkeypatch.setattr("simulator.catalog.open_profile", never)
    monkeypatch.setattr("cli_run.load_plan", never)
    line = one_line_error(run("replay", profile_path, plan_path, "--backend", "cuda"))
    assert line.startswith("error: <argument>: --backend: the cuda backend needs CuPy")


def test_replay_cuda_without_a_gpu_says_so_before_any_work(monkeypatch, uvm_files):
    profile_path, plan_path, *_ = uvm_files
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 0)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr("cli_run.load_plan", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read first")))
    line = one_line_error(run("replay", profile_path, plan_path, "--backend", "cuda"))
    assert line == "error: <argument>: --backend: the cuda backend needs a CUDA GPU: none found"
    from executor.api import replay
    _, _, plan, profile = uvm_files
    with pytest.raises(InputError, match="needs a CUDA GPU"):      # the library checks first too
        replay(profile, plan, None, backend="cuda")


def test_replay_refuses_a_time_scale_past_an_hour(tmp_path, two_layer):
    """A careless --time-scale (10^9: the 80 us step would take a day) is refused before
    the replay starts, not waited out."""
    save_profile(two_layer, tmp_path / "p.json")
    (tmp_path / "plan.json").write_text(plan_json(Plan(two_layer.name, (), profile_sha256=profile_sha256(two_layer))))
    line = one_line_error(run("replay", tmp_path / "p.json", tmp_path / "plan.json", "--time-scale", "1e9"))
    assert line.startswith("error: <argument>: --time-scale: 1e+09 stretches the ") and "(3600 s)" in line
