"""tracer.kineto: top-level ops that ran several kernels with memory events between their
launches are split into one op per kernel (a torch.compile'd region is one such op).

The traces are written by tracer/kineto/sample.py (``KinetoWriter``; ``compiled_step_trace``
is one training step shaped like a compiled model).
"""
from __future__ import annotations

import gzip
import json

import pytest

from simulator.errors import InputError
from simulator.profile import canonical_json, profile_from_dict
from tracer.kineto import import_kineto, peak_fidelity
from tracer.kineto.sample import KinetoWriter, compiled_step_trace, trace_peak_bytes

MiB = 1 << 20


@pytest.fixture(scope="module")
def compiled_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("compiled") / "compiled.json"
    path.write_text(json.dumps(compiled_step_trace()))
    return path


@pytest.fixture(scope="module")
def split(compiled_path):
    return import_kineto(compiled_path)


@pytest.fixture(scope="module")
def whole(compiled_path):
    return import_kineto(compiled_path, split=False)


def test_the_compiled_ops_are_split_into_their_kernels(split, whole):
    assert [op.name for op in whole.ops] == ["CompiledFunction", "CompiledFunctionBackward",
                                             "aten::_foreach_add_"]
    # 24 + 8 kernels forward, 48 + 16 backward; the optimizer's one kernel stays whole
    assert len(split.ops) == 32 + 64 + 1
    assert split.source["ops"] == {"top_level": 3, "kept": 3, "dropped_without_gpu_work": 0,
                                   "with_gpu_work": 3,
                                   "split": {"ops": 2, "into_kernel_ops": 96, "profile_ops": 97}}
    assert "split" not in whole.source["ops"]
    forward, backward = split.ops[:32], split.ops[32:96]
    assert forward[0].name == "CompiledFunction/triton_poi_fused_convolution_relu_0"
    assert forward[3].name == "CompiledFunction/triton_red_fused_native_batch_norm_2"
    assert all(op.name.startswith("CompiledFunctionBackward/triton_") for op in backward)
    assert {op.phase for op in forward} == {"forward"}
    assert {op.phase for op in backward} == {"backward"}
    assert split.ops[-1].name == "aten::_foreach_add_"
    # Each piece takes its own kernel's time; the op's time is their sum.
    assert [op.time_us for op in backward[:2] + backward[-2:]] == [30.0, 31.0, 77.0, 20.0]
    assert sum(op.time_us for op in backward) == whole.ops[1].time_us
    assert split.ideal_us == whole.ideal_us


def test_the_no_swap_peak_is_the_traces_own(compiled_path, split, whole):
    trace_peak = trace_peak_bytes(json.loads(compiled_path.read_text()))
    assert split.source["memory"]["trace_peak_bytes"] == trace_peak
    assert abs(split.peak_bytes - trace_peak) <= 0.01 * trace_peak
    assert split.peak_bytes == trace_peak                  # exactly, on this trace
    # Unsplit, the activations the backward frees and the weight gradients it allocates
    # are alive at once.
    assert whole.peak_bytes > 1.25 * trace_peak


def test_peak_fidelity(compiled_path, split):
    fidelity = peak_fidelity(compiled_path)
    assert fidelity.trace_peak_bytes == split.source["memory"]["trace_peak_bytes"]
    assert fidelity.imported_peak_bytes == split.peak_bytes
    assert (fidelity.ops, fidelity.split_ops, fidelity.error) == (97, 2, 0.0)
    unsplit = peak_fidelity(compiled_path, split=False)
    assert unsplit.split_ops == 0 and unsplit.error > 0.25
    assert unsplit.trace_peak_bytes == fidelity.trace_peak_bytes


def test_the_split_profile_validates_and_is_deterministic(tmp_path, compiled_path, split):
    again = profile_from_dict(json.loads(canonical_json(split)), "again")
    assert canonical_json(again) == canonical_json(split)
    assert canonical_json(import_kineto(compiled_path)) == canonical_json(split)
    packed = tmp_path / "compiled.json.gz"
    packed.write_bytes(gzip.compress(compiled_path.read_bytes()))
    zipped = canonical_json(import_kineto(packed, name="compiled"))
    assert zipped.replace("compiled.json.gz", "compiled.json") == canonical_json(split)


def _small() -> dict:
    """One op, three kernels, by hand (times are CPU-side)::

        110 alloc A 1000 | 120 launch k0 | 125 free P (from the op before)
        130 alloc B 2000 | 140 launch k1 | 150 alloc C 500, 155 free C
        156 alloc D 300  | 157 free E (from before) | 160 launch k2 | 170 free A, 175 free B
    """
    trace = KinetoWriter(before=0)
    trace.span("aten::before", 10, 50)
    trace.kernel("k_before", 20, 5)
    p = trace.alloc(30, 4000)
    e = trace.alloc(31, 700)
    trace.span("fused", 100, 100)
    a = trace.alloc(110, 1000)
    trace.kernel("k0", 120, 1)
    trace.memory(125, p, -4000)
    b = trace.alloc(130, 2000)
    trace.kernel("k1", 140, 2)
    c = trace.alloc(150, 500)
    trace.memory(155, c, -500)
    trace.alloc(156, 300)
    trace.memory(157, e, -700)
    trace.kernel("k2", 160, 3)
    trace.memory(170, a, -1000)
    trace.memory(175, b, -2000)
    trace.span("aten::after", 300, 50)
    trace.kernel("k_after", 310, 4)
    return trace.document()


def test_memory_events_are_placed_by_launch(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(_small()))
    profile = import_kineto(path)
    assert [op.name for op in profile.ops] == ["aten::before", "fused/k0", "fused/k1",
                                               "fused/k2", "aten::after"]
    t = {tensor.bytes: tensor.id for tensor in profile.tensors}
    # P is freed after k0's launch: held to k0; E, freed before k2's launch, to k1;
    # A from k0 (allocated before its launch) to k2 (freed after k2's launch); B from k1;
    # D, allocated before k2 and never freed, to the end.
    assert profile.lifetime(t[4000]) == (0, 1)
    assert profile.lifetime(t[700]) == (0, 2)
    assert profile.lifetime(t[1000]) == (1, 3)
    assert profile.lifetime(t[2000]) == (2, 3)
    assert profile.lifetime(t[300]) == (3, 4)
    # C lives between k1's launch and k2's, at no launch: not a tensor. k2 holds the
    # 3300 B live at its launch (A, B, D), and as workspace what the trace held beyond
    # that since k1's launch: 900 B (when C was allocated, E was still held and D not yet).
    assert 500 not in t
    assert [op.workspace_bytes for op in profile.ops] == [0, 0, 0, 900, 0]
    assert profile.resident_bytes == (4700, 5700, 3700, 4200, 300)
    assert profile.peak_bytes == profile.source["memory"]["trace_peak_bytes"] == 5700
    whole = import_kineto(path, split=False)
    assert len(whole.ops) == 3 and whole.peak_bytes == 8000 + 500     # P, E, A, B, D + C


def test_ops_without_memory_events_between_launches_stay_whole(tmp_path):
    trace = KinetoWriter(before=0)
    trace.span("aten::conv2d", 100, 100)
    out = trace.alloc(105, 1000)
    trace.kernel("k0", 110, 1)
    trace.kernel("k1", 120, 2)               # nothing between the launches
    trace.memory(150, out, -1000)
    trace.span("aten::add", 300, 10)
    trace.kernel("k2", 305, 1)
    path = tmp_path / "whole.json"
    path.write_text(json.dumps(trace.document()))
    profile = import_kineto(path)
    assert [op.name for op in profile.ops] == ["aten::conv2d", "aten::add"]
    assert "split" not in profile.source["ops"]
    assert canonical_json(profile) == canonical_json(import_kineto(path, split=False))


def test_ops_whose_launches_are_unknown_stay_whole(tmp_path):
    # Kernels linked to their op by External id only (no cuda_runtime launch events):
    # their order against the memory events is unknown.
    document = _small()
    launches = {e["args"]["correlation"]: e for e in document["traceEvents"]
                if e.get("cat") == "cuda_runtime"}
    external = {e["ts"]: e["args"]["External id"] for e in document["traceEvents"]
                if e.get("cat") == "cpu_op"}
    document["traceEvents"] = [e for e in document["traceEvents"] if e.get("cat") != "cuda_runtime"]
    for event in document["traceEvents"]:
        if event.get("cat") == "kernel":
            ts = launches[event["args"]["correlation"]]["ts"]
            event["args"]["External id"] = external[max(s for s in external if s <= ts)]
    path = tmp_path / "external.json"
    path.write_text(json.dumps(document))
    profile = import_kineto(path)
    assert [op.name for op in profile.ops] == ["aten::before", "fused", "aten::after"]


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_split_must_be_a_bool(compiled_path, bad):
    with pytest.raises(InputError) as info:
        import_kineto(compiled_path, split=bad)
    assert info.value.file == "<argument>" and info.value.where == "split"
    assert "\n" not in str(info.value)


def test_the_shipped_sample_trace_is_the_one_the_sample_writer_makes_and_imports(tmp_path):
    # README's `swapplan import kineto tracer/kineto/samples/compiled-step.kineto.json` line: the file
    # in the repo is exactly what tracer/kineto/sample.py writes, and it imports at its trace peak
    from pathlib import Path

    from click.testing import CliRunner

    from cli import app
    shipped = Path(__file__).resolve().parents[1] / "tracer" / "kineto" / "samples" / "compiled-step.kineto.json"
    assert json.loads(shipped.read_text()) == json.loads(json.dumps(compiled_step_trace()))
    result = CliRunner().invoke(app, ["import", "kineto", str(shipped), "-o", str(tmp_path / "m.json")])
    assert result.exit_code == 0, result.output
    assert "peak 390.00 MiB" in result.output
