"""tracer.kineto.import_kineto: a real VGG13 trace, synthetic traces in both schemas, errors.

The real data is the VGG13 training iteration (batch 512, H100, PyTorch 2.1) from
sarchlab/triosim (MIT), gzipped in ``tests/data/triosim-vgg13-h100`` with its licence. The
synthetic traces are written here, small enough to check by hand:

One iteration (``T`` = the step's start; ops numbered as the profile keeps them)::

    o0 aten::linear  [T+10, T+110)  kernel 30 + memset 1   alloc A  4096 @T+30
    -- aten::view    [T+205, T+207) no GPU work: dropped
    o1 aten::relu    [T+120, T+200) kernel 10              alloc B  4096 @T+130,
                                                           temp  W  1024 @T+140..150
    o2 aten::sum     [T+210, T+260) kernel 5               alloc L   512 @T+220
    o3 SumBackward   [T+300, T+350) kernel 5               alloc G1 4096 @T+310, free L
    o4 ReluBackward  [T+360, T+420) kernel 10              alloc G2 4096 @T+370, free B, G1
    o5 AddmmBackward [T+430, T+500) kernel 20              alloc WG 8192 @T+440, free A, G2
    o6 aten::add_ in Optimizer.step#SGD.step, kernel 5     (WG is freed by the next
                                                           step's zero_grad, at T'+5)

GPU time 86 us. Lifetimes [producer, last op starting before the free]: A [0, 5],
B [1, 4], L [2, 3], G1 [3, 4], G2 [4, 5], WG [5, 6] (never freed in the step); W is
o1's workspace. Resident bytes per op: 4096, 9216, 8704, 12800, 16384, 16384, 8192, so
the no-swap peak is 16384 at o4. (The old schema has no Addr: frees pair with the last
open allocation of their size, other buffers but the same bytes, and the same peak.)
"""
from __future__ import annotations

import copy
import gzip
import itertools
import json
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.profile import canonical_json
from tests.conftest import VGG13_ET, VGG13_TRACE, read_json
from tracer.kineto import import_kineto, peak_fidelity

TRACE, ET = VGG13_TRACE, VGG13_ET      # gzipped: the importer reads .json.gz as .json


# ============================================================================ VGG13 (real)


@pytest.fixture(scope="module")
def vgg():
    return import_kineto(TRACE)


@pytest.fixture(scope="module")
def vgg_whole():
    return import_kineto(TRACE, split=False)


@pytest.fixture(scope="module")
def vgg_et():
    return import_kineto(TRACE, ET)


@pytest.fixture(scope="module")
def vgg_json():
    return read_json(TRACE)


def test_vgg_ops_kernels_and_time(vgg):
    # 161 top-level operators (optimizer foreach ops count, annotations do not); the 77
    # that launch GPU work are kept: 35 forward, 35 backward, 7 optimizer foreach ops.
    # 23 of them (9 convolutions, the loss, 3 AddmmBackward0 and 10 ConvolutionBackward0)
    # allocate or free between their kernels' launches: split into their 198 GPU events.
    gpu = vgg.source["gpu"]
    assert (gpu["kernels"], gpu["memsets"], gpu["memcpys"]) == (292, 33, 0)
    assert gpu["unattributed_in_trace"] == 0
    assert len(vgg.ops) == 77 - 23 + 198
    assert vgg.source["ops"] == {"top_level": 161, "kept": 77, "dropped_without_gpu_work": 84,
                                 "with_gpu_work": 77,
                                 "split": {"ops": 23, "into_kernel_ops": 198, "profile_ops": 252}}
    assert [sum(op.phase == p for op in vgg.ops) for p in ("forward", "backward", "optimizer")] \
        == [84, 161, 7]
    assert vgg.ops[2].name.startswith("aten::conv2d/void cudnn::ops::nchwToNhwcKernel<")
    assert sum(op.name.startswith("aten::conv2d/") for op in vgg.ops) == 57
    assert round(gpu["time_us"]) == 346370            # 346344 kernels + 26 memsets
    assert round(vgg.ideal_us) == 346370
    assert vgg.ops[0].name == "aten::conv2d" and vgg.ops[0].time_us == 10643.0
    assert vgg.source["device"] == "NVIDIA H100 80GB HBM3"
    assert vgg.source["kind"] == "measured" and vgg.source["iteration"] is None
    assert vgg.source["origin"][0]["repository"] == "https://github.com/sarchlab/triosim"
    assert vgg.source["origin"][0]["license"] == "MIT"


def test_vgg_memory_lifetimes_cut_by_the_window(vgg, vgg_whole):
    memory = vgg.source["memory"]
    # 152 allocations freed in the window + 28 never freed (the new weight gradients
    # and two small buffers); 28 frees of buffers allocated before it (zero_grad).
    assert memory["allocations"] == 180 and memory["outlive_window"] == 28
    assert memory["frees_before_window"] == 28
    assert (memory["tensors"], memory["temporaries"]) == (177, 3)
    assert memory["trace_baseline_bytes"] == 3574329856
    assert memory["trace_peak_bytes"] == 39343881216
    # No ET: what was allocated before the window is one persistent tensor, less the
    # pre-window buffers the window frees (tested below).
    assert vgg.persistent_bytes == vgg.tensor_by_id["pre_window"].bytes == 3039695872
    assert vgg.peak_bytes - vgg.persistent_bytes == 36304185344
    # cuDNN's workspaces, allocated and freed inside one op (conv 2 forward, and the
    # largest, conv 2 backward): held from the kernel launched after their allocation
    # to the one launched before their free, internal tensors (kind other) of the op.
    conv2 = vgg.tensor_by_id["t2"]
    assert (conv2.bytes, conv2.kind, vgg.lifetime("t2")) == (13153485312, "other", (2, 6))
    assert [vgg.ops[k].name.split("/")[1][:30] for k in (2, 5, 6)] == [
        "void cudnn::ops::nchwToNhwcKer", "sm90_xmma_fprop_implicit_gemm_",
        "void cudnn::ops::nhwcToNchwKer"]
    assert all("t2" in vgg.ops[k].inputs for k in (3, 4, 5, 6))
    largest = vgg.tensor_by_id["t128"]
    assert (largest.bytes, largest.kind, vgg.lifetime("t128")) == (13157679616, "other", (215, 219))
    assert max(op.workspace_bytes for op in vgg.ops) == 1048576         # aten::linear
    # Unsplit, they are those ops' workspaces.
    assert vgg_whole.ops[2].workspace_bytes == 13153485312
    assert max(op.workspace_bytes for op in vgg_whole.ops) == 13157679616


def _window_peak(document) -> int:
    """The peak of the bytes the window itself allocated and still holds, at any moment:
    the [memory] events of cuda:0 in time order, an allocation counted until the free of
    its Addr, frees of buffers allocated before the window left out."""
    events = sorted((e for e in document["traceEvents"] if e.get("name") == "[memory]"
                     and e["args"].get("Device Type") == 1),
                    key=lambda e: e["ts"])
    live, held, peak = {}, 0, 0
    for event in events:
        addr, size = event["args"]["Addr"], event["args"]["Bytes"]
        if size > 0:
            live[addr] = size
            held += size
        elif addr in live:
            held -= live.pop(addr)
        peak = max(peak, held)
    return peak


def test_vgg_peak_agrees_with_the_trace(vgg, vgg_whole, vgg_json):
    # Trace side: `Total Allocated` is the caching allocator's running total of live
    # blocks. Its peak minus the total before the first event of the window (the
    # baseline: weights, Adam state, the batch, the last iteration's gradients and
    # whatever else was allocated earlier) is what this iteration added at its worst
    # moment, net of the pre-window buffers it had freed by then (zero_grad's 28
    # gradient frees, 0.53 GB).
    # Profile side, less its pre-window tensors: the window's allocations, each from the
    # op that allocates it to the last op that starts before its free, plus each op's
    # workspace (its temporaries' peak).
    # They differ by (a) the pre-window frees, which the trace nets out of its growth
    # while the allocations replacing them count in full (not a bug: the same buffers
    # of successive iterations), and, unsplit, (b) op granularity: within an op the
    # profile holds everything the op holds at any moment. Split at kernel launches, (b)
    # is gone. With the pre-window tensors the whole peaks agree
    # (test_vgg_pre_window_tensors).
    trace_side = vgg.source["memory"]["trace_peak_bytes"] - vgg.source["memory"][
        "trace_baseline_bytes"]
    assert trace_side == 35769551360
    in_window = vgg.peak_bytes - vgg.persistent_bytes        # pre_window_freed is gone by o133
    assert in_window == 36304185344
    assert in_window - trace_side == 534633984                # (a)
    assert vgg_whole.peak_bytes - vgg_whole.persistent_bytes - trace_side \
        == 534633984 + 2048                                   # (a) + (b)
    # Sharper: without (a), the in-window peak recomputed from the raw events is the
    # profile's (unsplit, 2 KB under it: a few small buffers freed inside an op).
    window_peak = _window_peak(vgg_json)
    assert in_window == window_peak


def test_vgg_pre_window_tensors(vgg, vgg_whole):
    # Total Allocated before the window's first event, 3,574,329,856 B, split by when the
    # window frees those bytes: 532,585,472 B (the last iteration's gradients) before its
    # first op starts: held during no op, left out; 2,048,512 B during ops o0..o33: one
    # tensor from o0 to o33; the rest, never freed: one persistent tensor.
    memory = vgg.source["memory"]
    kept, freed = vgg.tensor_by_id["pre_window"], vgg.tensor_by_id["pre_window_freed"]
    assert (kept.kind, kept.persistent, kept.bytes) == ("input", True, 3039695872)
    assert (freed.kind, freed.persistent, freed.bytes) == ("other", False, 2048512)
    assert kept.bytes + freed.bytes + 532585472 == memory["trace_baseline_bytes"]
    assert vgg.lifetime("pre_window_freed") == (0, 82)
    assert vgg.ops[82].name.startswith("aten::cross_entropy_loss/")
    assert vgg.ops[0].outputs[0] == "pre_window_freed"
    assert not any("pre_window" in op.inputs + op.outputs + op.updates for op in vgg.ops)
    note = memory["pre_window_tensor"]
    assert note.startswith("pre_window: 3039695872 B allocated before the trace window")
    assert "pre_window_freed: 2048512 B" in note and "532585472 B" in note
    # The no-swap peak is the trace's peak Total Allocated (unsplit: up to op
    # granularity, 2 KB above).
    assert vgg.peak_bytes == memory["trace_peak_bytes"] == 39343881216
    assert vgg.peak_op == "o133"
    assert vgg.ops[133].name.startswith(
        "autograd::engine::evaluate_function: ConvolutionBackward0/")
    assert (vgg_whole.peak_bytes, vgg_whole.peak_op) == (39343883264, "o52")


def test_vgg_unsplit(vgg_whole):
    # split=False: the 77 top-level ops, as imported before kernel splitting
    assert len(vgg_whole.ops) == 77 and "split" not in vgg_whole.source["ops"]
    assert [sum(op.phase == p for op in vgg_whole.ops)
            for p in ("forward", "backward", "optimizer")] == [35, 35, 7]
    assert vgg_whole.ideal_us == 346370.0
    assert vgg_whole.lifetime("pre_window_freed") == (0, 33)


def test_vgg_peak_fidelity():
    split, whole = peak_fidelity(TRACE), peak_fidelity(TRACE, split=False)
    assert (split.trace_peak_bytes, split.imported_peak_bytes) == (39343881216, 39343881216)
    assert (whole.trace_peak_bytes, whole.imported_peak_bytes) == (39343881216, 39343883264)
    assert (split.ops, split.split_ops, whole.ops, whole.split_ops) == (252, 23, 77, 0)
    assert split.error == 0.0 and 0 < whole.error < 1e-7


def test_vgg_with_execution_trace(vgg, vgg_et):
    et = vgg_et.source["execution_trace"]
    assert et["schema"] == "1.0.1" and et["joined_by"] == "name and order"
    assert et["joined_ops"] == 77 and et["unbound_outputs"] == 0
    kinds = {}
    for tensor in vgg_et.tensors:
        if tensor.persistent:
            kinds[tensor.kind] = kinds.get(tensor.kind, 0) + 1
    # 26 parameters, their Adam exp_avg and exp_avg_sq, the batch and the labels
    assert kinds == {"weight": 26, "optimizer_state": 52, "input": 2}
    weights = sum(t.bytes for t in vgg_et.tensors if t.kind == "weight")
    assert weights == 532192256                      # 133,047,848 fp32, 512 B blocks
    batch = next(t for t in vgg_et.tensors if t.kind == "input" and t.bytes > 10**6)
    assert batch.shape == (512, 3, 224, 224) and batch.dtype == "fp32"
    # Same ops, times and lifetimes as without the ET (less its pre-window tensors, which
    # the ET's persistent tensors replace), plus the persistent tensors.
    assert "pre_window" not in vgg_et.tensor_by_id
    assert "pre_window_tensor" not in vgg_et.source["memory"]
    assert [(o.name, o.phase, o.time_us, o.outputs, o.workspace_bytes) for o in vgg_et.ops] \
        == [(o.name, o.phase, o.time_us,
             tuple(t for t in o.outputs if not t.startswith("pre_window")), o.workspace_bytes)
            for o in vgg.ops]
    assert vgg_et.peak_bytes - vgg_et.persistent_bytes \
        == vgg.peak_bytes - vgg.persistent_bytes
    assert vgg_et.persistent_bytes == et["persistent_bytes"] == 1904862208
    # Real dataflow: conv1 reads the batch and its weight and bias; relu_ updates the
    # conv output in place; the last Adam op updates all 26 weights.
    conv1, relu1 = vgg_et.ops[0], vgg_et.ops[1]
    assert [vgg_et.tensor_by_id[t].kind for t in conv1.inputs] == ["input", "weight", "weight"]
    assert relu1.updates == conv1.outputs and relu1.inputs == ()
    # Split ops: which of the op's kernels reads what the ET says the op reads is
    # unknown, so each of conv 2's 9 kernel ops reads its input, weight and bias, and
    # those after the first its own output and cuDNN workspace while they are allocated.
    conv2 = vgg_et.ops[2:11]
    assert all(op.name.startswith("aten::conv2d/") for op in conv2)
    assert all(op.inputs[:3] == conv2[0].inputs for op in conv2)
    assert [vgg_et.tensor_by_id[t].kind for t in conv2[0].inputs] == [
        "activation", "weight", "weight"]
    assert all(set(conv2[0].outputs) <= set(op.inputs) for op in conv2[1:5])
    last = vgg_et.ops[-1]
    assert last.name == "aten::_foreach_addcdiv_"
    assert sorted(vgg_et.tensor_by_id[t].kind for t in last.updates) == ["weight"] * 26


def test_vgg_gzip_copy_and_determinism(tmp_path, vgg):
    plain = tmp_path / "kineto_trace.json"
    plain.write_bytes(gzip.decompress(TRACE.read_bytes()))
    again = import_kineto(plain)
    assert canonical_json(again) == canonical_json(vgg).replace(".json.gz", ".json")
    assert canonical_json(import_kineto(TRACE)) == canonical_json(vgg)


def _et_1_1(document: dict) -> dict:
    """The same ET written in schema 1.1.0's layout: ctrl_deps, {values, shapes, types}
    blocks, and the scalar fields in an attrs list."""
    nodes = []
    for node in document["nodes"]:
        new = {"id": node["id"], "name": node["name"], "ctrl_deps": node["parent"]}
        for key in ("inputs", "outputs"):
            prefix = key[:-1]
            new[key] = {"values": node[key], "shapes": node[f"{prefix}_shapes"],
                        "types": node[f"{prefix}_types"], "strides": []}
        new["attrs"] = [{"name": k, "type": "uint64", "value": node[k]}
                        for k in ("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid",
                                  "op_schema")]
        nodes.append(new)
    return dict(document, schema="1.1.0-chakra.0.0.4", nodes=nodes)


def test_vgg_et_in_the_newer_schema(tmp_path, vgg_et):
    path = tmp_path / "et.json"
    path.write_text(json.dumps(_et_1_1(read_json(ET))))
    newer = import_kineto(TRACE, path)
    assert newer.source["execution_trace"]["schema"] == "1.1.0-chakra.0.0.4"
    assert newer.to_dict()["tensors"] == vgg_et.to_dict()["tensors"]
    assert newer.to_dict()["ops"] == vgg_et.to_dict()["ops"]


def test_vgg_join_by_record_function_id(tmp_path, vgg_et, vgg_json):
    # Newer traces carry `Record function id` on every operator = the ET's rf_id.
    # Here they are written in by order (each thread lists the same ops in both files).
    et = read_json(ET)
    nodes = sorted((n for n in et["nodes"] if not n["name"].startswith("[pytorch")),
                   key=lambda n: n["id"])
    trace = copy.deepcopy(vgg_json)
    spans = sorted((e for e in trace["traceEvents"] if e.get("cat") in ("cpu_op",
                    "user_annotation")), key=lambda e: (e["tid"] != 42741, e["ts"], -e["dur"]))
    by_thread = {1: [n for n in nodes if n["tid"] == 1], 2: [n for n in nodes if n["tid"] == 2]}
    paired = list(zip([s for s in spans if s["tid"] == 42741], by_thread[1])) + \
        list(zip([s for s in spans if s["tid"] != 42741], by_thread[2]))
    assert all(span["name"] == node["name"] for span, node in paired)
    for span, node in paired:
        span["args"]["Record function id"] = node["rf_id"]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    joined = import_kineto(path, ET)
    assert joined.source["execution_trace"]["joined_by"] == "rf_id"
    assert joined.to_dict()["ops"] == vgg_et.to_dict()["ops"]


# ============================================================================ synthetic


class _Builder:
    """Writes a small Kineto trace in the new (PyTorch 2.x) or old (1.8-era) schema."""

    def __init__(self, style: str):
        self.new = style == "new"
        self.events: list = []
        self.ids = itertools.count(1)
        self.total = 1_000_000                      # allocated before the trace
        self.pid, self.main = 1234, 1234
        self.autograd = 1240 if self.new else 1234  # old traces: backward on the main thread

    def span(self, name, ts, dur, tid=None, annotation=False, seq=None):
        cat = ("user_annotation" if annotation else "cpu_op") if self.new else "Operator"
        external = next(self.ids)
        args = {"External id" if self.new else "external id": external}
        if seq is not None:
            args["Sequence number"] = seq
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid,
                            "tid": tid or self.main, "ts": ts, "dur": dur, "args": args})
        return external

    def gpu(self, external, launch_ts, dur, tid=None, memset=False):
        correlation = next(self.ids) + 100000
        if self.new:                 # new: a launch event, linked by correlation
            self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                                "pid": self.pid, "tid": tid or self.main, "ts": launch_ts,
                                "dur": 2, "args": {"correlation": correlation}})
            cat = "gpu_memset" if memset else "kernel"
            tid_gpu, key = 7, "External id"
        else:                        # old: no launch events, linked by external id
            cat = "Memset" if memset else "Kernel"
            tid_gpu, key = "stream 7", "external id"
        self.events.append({"ph": "X", "cat": cat, "name": "Memset" if memset else "k",
                            "pid": 0, "tid": tid_gpu, "ts": launch_ts + 5, "dur": dur,
                            "args": {"device": 0, "stream": 7, "correlation": correlation,
                                     key: external}})

    def memory(self, ts, addr, size, tid=None):
        args = {"Device Type": 1, "Device Id": 0, "Bytes": size}
        if self.new:                 # Total Allocated: set by document(), in time order
            args.update({"Addr": addr, "Total Reserved": 1 << 30})
        self.events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": self.pid,
                            "tid": tid or self.main, "ts": ts, "args": args})

    def op(self, name, ts, dur, kernel_us, tid=None, seq=None):
        external = self.span(name, ts, dur, tid=tid, seq=seq)
        self.gpu(external, ts + 5, kernel_us, tid=tid)
        return external

    def iteration(self, step, T, previous_grad=False, complete=True):
        """One training step as in the module docstring (a cut-short one if not complete;
        no ProfilerStep span if ``step`` is None)."""
        if step is not None:
            self.span(f"ProfilerStep#{step}", T, 1000, annotation=True)
        if previous_grad:
            self.span("Optimizer.zero_grad#SGD.zero_grad", T + 2, 6, annotation=True)
            self.memory(T + 5, 0x7000, -8192)
        linear = self.span("aten::linear", T + 10, 100, seq=10)
        child = self.span("aten::addmm", T + 15, 85)
        self.gpu(child, T + 20, 30)
        self.gpu(child, T + 25, 1, memset=True)
        self.memory(T + 30, 0x1000, 4096)
        del linear
        if not complete:
            return
        self.op("aten::relu", T + 120, 80, 10, seq=11)
        self.memory(T + 130, 0x2000, 4096)
        self.memory(T + 140, 0x3000, 1024)
        self.memory(T + 150, 0x3000, -1024)
        self.span("aten::view", T + 205, 2)
        self.op("aten::sum", T + 210, 50, 5, seq=12)
        self.memory(T + 220, 0x4000, 512)
        grad = self.autograd
        self.op("autograd::engine::evaluate_function: SumBackward0", T + 300, 50, 5, grad, 12)
        self.memory(T + 310, 0x5000, 4096, grad)
        self.memory(T + 340, 0x4000, -512, grad)
        self.op("autograd::engine::evaluate_function: ReluBackward0", T + 360, 60, 10, grad, 11)
        self.memory(T + 370, 0x6000, 4096, grad)
        self.memory(T + 410, 0x2000, -4096, grad)
        self.memory(T + 415, 0x5000, -4096, grad)
        self.op("autograd::engine::evaluate_function: AddmmBackward0", T + 430, 70, 20, grad, 10)
        self.memory(T + 440, 0x7000, 8192, grad)
        self.memory(T + 490, 0x1000, -4096, grad)
        self.memory(T + 495, 0x6000, -4096, grad)
        self.span("Optimizer.step#SGD.step", T + 600, 100, annotation=True)
        self.op("aten::add_", T + 610, 40, 5)

    def document(self) -> dict:
        if self.new:
            total = self.total
            for event in sorted((e for e in self.events if e["name"] == "[memory]"),
                                key=lambda e: e["ts"]):
                total += event["args"]["Bytes"]
                event["args"]["Total Allocated"] = total
        data = {"traceEvents": self.events}
        if self.new:
            data.update(schemaVersion=1, deviceProperties=[{"id": 0, "name": "Test GPU"}])
        return data


def _write(tmp_path, document, name="trace.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def _one_step(style: str) -> dict:
    builder = _Builder(style)
    builder.iteration(None, 10_000)
    return builder.document()


def _steps(style: str = "new") -> dict:
    """Steps 3, 4, 5, then a step 6 cut short by the profiler's stop (no backward)."""
    builder = _Builder(style)
    for k, step in enumerate((3, 4, 5)):
        builder.iteration(step, 10_000 + 1000 * k, previous_grad=k > 0)
    builder.iteration(6, 13_000, previous_grad=True, complete=False)
    return builder.document()


@pytest.mark.parametrize("style", ["new", "old"])
def test_synthetic_one_iteration(tmp_path, style):
    profile = import_kineto(_write(tmp_path, _one_step(style)))
    assert [op.name.rsplit(" ", 1)[-1] for op in profile.ops] == [
        "aten::linear", "aten::relu", "aten::sum", "SumBackward0", "ReluBackward0",
        "AddmmBackward0", "aten::add_"]
    assert [op.phase for op in profile.ops] == ["forward"] * 3 + ["backward"] * 3 + ["optimizer"]
    assert [op.time_us for op in profile.ops] == [31.0, 10.0, 5.0, 5.0, 10.0, 20.0, 5.0]
    assert profile.ideal_us == 86.0
    assert profile.source["ops"]["top_level"] == 8          # aten::view is dropped
    assert (profile.source["gpu"]["kernels"], profile.source["gpu"]["memsets"]) == (7, 1)
    # The new schema has Total Allocated: the 1 MB allocated before the trace is a
    # persistent tensor; the old one has not, and no pre-window tensor.
    before = 1_000_000 if style == "new" else 0
    assert profile.persistent_bytes == before
    assert profile.peak_bytes == before + 16384 and profile.peak_op == "o4"
    assert profile.resident_bytes[:4] == tuple(before + b for b in (4096, 9216, 8704, 12800))
    window = [t for t in profile.tensors if t.id != "pre_window"]
    assert window[0].name == "aten::addmm"               # named by the innermost op
    assert {t.kind for t in window} == {"activation", "gradient"}
    if style == "new":
        assert profile.tensors[0].id == "pre_window" and profile.tensors[0].kind == "input"
        assert profile.peak_bytes == profile.source["memory"]["trace_peak_bytes"]
        assert profile.source["gpu"]["by"] == {"correlation": 8, "external_id": 0}
        assert profile.source["memory"]["paired_by"] == "Addr"
        assert profile.source["device"] == "Test GPU"
        assert profile.ops[1].workspace_bytes == 1024
        assert [profile.lifetime(t.id) for t in window] == [
            (0, 5), (1, 4), (2, 3), (3, 4), (4, 5), (5, 6)]
    else:
        assert "pre_window_tensor" not in profile.source["memory"]
        assert profile.source["gpu"]["by"] == {"correlation": 0, "external_id": 8}
        assert profile.source["memory"]["paired_by"].startswith("size")
        assert "trace_peak_bytes" not in profile.source["memory"]   # no Total Allocated


def test_work_outside_operators(tmp_path):
    builder = _Builder("new")
    builder.iteration(None, 10_000)
    # A kernel whose launch no operator encloses: counted, in no op's time.
    builder.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "pid": 1234, "tid": 1234, "ts": 10_270, "dur": 2,
                           "args": {"correlation": 9, "External id": 3}})
    builder.events.append({"ph": "X", "cat": "kernel", "name": "stray", "pid": 0, "tid": 7,
                           "ts": 10_275, "dur": 50, "args": {"device": 0, "correlation": 9,
                                                             "External id": 3}})
    # An allocation between operators: produced by the next kept op (SumBackward, o3).
    builder.memory(10_265, 0x9000, 512)
    builder.memory(10_600, 0x9000, -512)
    # An allocation inside an operator without kernels: the op is kept, with time 0.
    builder.memory(10_206, 0xA000, 512)
    builder.memory(10_207, 0xA000, -512)
    profile = import_kineto(_write(tmp_path, builder.document()))
    assert profile.source["gpu"]["unattributed_in_trace"] == 1 and profile.ideal_us == 86.0
    assert profile.source["memory"]["outside_operators"] == 1
    stray = next(t for t in profile.tensors if t.name == "(outside operators)")
    assert profile.lifetime(stray.id) == (4, 6)          # o4 = SumBackward0 now
    view = profile.ops[2]
    assert (view.name, view.time_us, view.workspace_bytes) == ("aten::view", 0.0, 512)


def test_synthetic_gzip_and_determinism(tmp_path):
    document = _one_step("new")
    plain = import_kineto(_write(tmp_path, document), name="tiny")
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(json.dumps(document).encode()))
    zipped = import_kineto(packed, name="tiny")
    assert zipped.name == plain.name == "tiny"
    assert zipped.to_dict()["ops"] == plain.to_dict()["ops"]
    assert canonical_json(import_kineto(_write(tmp_path, document), name="tiny")) \
        == canonical_json(plain)


@pytest.mark.parametrize("style", ["new", "old"])
def test_several_iterations(tmp_path, style):
    path = _write(tmp_path, _steps(style))
    last = import_kineto(path)
    # Step 6 has no backward pass (cut short): the last complete step is 5.
    assert last.source["iteration"] == 5 and last.source["window"] == "ProfilerStep#5"
    step4 = import_kineto(path, iteration=4)
    assert step4.source["iteration"] == 4
    assert len(step4.ops) == 7 and step4.ideal_us == 86.0
    # New schema: the 1 MB from before the trace is the pre-window tensor (the previous
    # WG, freed by zero_grad before the first op, is held during no op).
    assert step4.peak_bytes == (1_000_000 if style == "new" else 0) + 16384
    first = import_kineto(path, iteration=3)
    assert first.to_dict()["ops"] == step4.to_dict()["ops"]
    cut = import_kineto(path, iteration=6)                  # asked for: imported as it is
    assert [op.name for op in cut.ops] == ["aten::linear"]


def test_lifetimes_cut_by_the_window(tmp_path):
    path = _write(tmp_path, _steps("new"))
    # Step 3 is the first: nothing from before it is freed in it. Each step's weight
    # gradient WG outlives it (freed by the next step's zero_grad), and in steps 4 and 5
    # that zero_grad frees the previous WG, allocated before the window.
    first = import_kineto(path, iteration=3).source["memory"]
    assert (first["frees_before_window"], first["outlive_window"]) == (0, 1)
    middle = import_kineto(path, iteration=4)
    memory = middle.source["memory"]
    assert (memory["frees_before_window"], memory["outlive_window"]) == (1, 1)
    wg = middle.tensors[-1]
    assert wg.bytes == 8192 and middle.lifetime(wg.id) == (5, 6)   # to the last op
    # The allocator's view of step 4: 1 MB + one WG before it; the peak is 8192 above
    # that, as the free of the old WG at the start offsets the new one.
    assert memory["trace_baseline_bytes"] == 1_000_000 + 8192
    assert memory["trace_peak_minus_baseline_bytes"] == 8192


def test_pre_window_tensors(tmp_path):
    # Step 4 of _steps, but the previous step's WG (8192 B, allocated before the window)
    # is freed while o2 runs instead of before o0: it is held from o0 to o2.
    builder = _Builder("new")
    builder.iteration(3, 10_000)
    builder.iteration(4, 11_000)
    builder.memory(11_230, 0x7000, -8192)              # inside aten::sum (o2)
    builder.iteration(5, 12_000, previous_grad=True)
    profile = import_kineto(_write(tmp_path, builder.document()), iteration=4)
    memory = profile.source["memory"]
    assert memory["trace_baseline_bytes"] == 1_000_000 + 8192
    kept, freed = profile.tensors[0], profile.tensors[1]
    assert (kept.id, kept.kind, kept.bytes) == ("pre_window", "input", 1_000_000)
    assert (freed.id, freed.kind, freed.bytes) == ("pre_window_freed", "other", 8192)
    assert profile.lifetime("pre_window_freed") == (0, 2)
    assert profile.persistent_bytes == 1_000_000
    assert profile.resident_bytes == tuple(1_000_000 + b for b in (
        4096 + 8192, 9216 + 8192, 8704 + 8192, 12800, 16384, 16384, 8192))
    # The peak (o1, with the old WG still held) is the trace's peak Total Allocated.
    assert profile.peak_op == "o1" and profile.peak_bytes == 1_017_408
    assert profile.peak_bytes == memory["trace_peak_bytes"]
    assert memory["pre_window_tensor"] == (
        "pre_window: 1000000 B allocated before the trace window and not freed in it "
        "(weights, optimizer state, the batch, ...; no ET to tell them apart), one "
        "persistent tensor of kind input, used by no op; pre_window_freed: 8192 B "
        "allocated before the window and freed in it, held from o0 to o2")
    # Step 5's zero_grad frees its WG before o0: left out; step 3 frees nothing old.
    step5 = import_kineto(_write(tmp_path, builder.document()), iteration=5)
    assert [t.id for t in step5.tensors[:2]] == ["pre_window", "t0"]
    assert "8192 B allocated before the window and freed before its first op: left out" \
        in step5.source["memory"]["pre_window_tensor"]
    assert step5.peak_bytes == step5.source["memory"]["trace_peak_bytes"] == 1_016_384
    step3 = import_kineto(_write(tmp_path, builder.document()), iteration=3)
    assert step3.persistent_bytes == 1_000_000 and step3.peak_bytes == 1_016_384


def test_no_pre_window_tensor_without_allocations_before(tmp_path):
    builder = _Builder("new")
    builder.total = 0
    builder.iteration(None, 10_000)
    profile = import_kineto(_write(tmp_path, builder.document()))
    assert profile.source["memory"]["trace_baseline_bytes"] == 0
    assert profile.persistent_bytes == 0 and profile.peak_bytes == 16384
    assert "pre_window_tensor" not in profile.source["memory"]


# ============================================================================ errors


def _error(*args, **kwargs) -> InputError:
    with pytest.raises(InputError) as info:
        import_kineto(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message == info.value.line()
    return info.value


def _document_with(transform) -> dict:
    document = _one_step("new")
    transform(document["traceEvents"])
    return document


@pytest.mark.parametrize("content, where, words", [
    ("{oops", "line 1 column 2", "invalid JSON"),
    ('{"schemaVersion": 1}', "traceEvents", "not a PyTorch profiler"),
    ('{"traceEvents": 3}', "traceEvents", "expected a list"),
    ('"text"', "", "expected a JSON object"),
    ('[1]', "traceEvents[0]", "expected an object"),
    ('{"traceEvents": []}', "traceEvents", "no CPU operators"),
])
def test_errors_in_the_file(tmp_path, content, where, words):
    path = tmp_path / "bad.json"
    path.write_text(content)
    error = _error(path)
    assert error.file == str(path) and error.where == where and words in error.problem


def test_errors_reading(tmp_path):
    assert _error(tmp_path / "missing.json").problem == "no such file"
    fake = tmp_path / "fake.json.gz"
    fake.write_text("not gzip")
    assert "cannot read" in _error(fake).problem


def test_a_trace_without_memory_events_is_refused(tmp_path):
    # a trace recorded without profile_memory=True (as the public ones of trace-analysis tools often are)
    document = _document_with(lambda ev: ev.__setitem__(slice(None), [e for e in ev if e["name"] != "[memory]"]))
    error = _error(_write(tmp_path, document))
    assert error.where == "traceEvents" and "profile_memory=True" in error.problem and "no tensors" in error.problem


@pytest.mark.parametrize("transform, where, words", [
    (lambda ev: [e for e in ev if e.get("cat") == "cpu_op" and e.__setitem__("ts", "soon")],
     "traceEvents[0].ts", "expected a number"),
    (lambda ev: [e for e in ev if e.get("cat") == "kernel" and e.__setitem__("dur", -1)],
     ".dur", "negative duration"),
    (lambda ev: [e for e in ev if e["name"] == "[memory]" and e["args"].__setitem__("Bytes", 1.5)],
     ".args.Bytes", "expected an integer"),
    (lambda ev: [e for e in ev if e["name"] == "[memory]" and e.__setitem__("args", 7)],
     ".args", "expected an object"),
    (lambda ev: [e.__setitem__("cat", "gpu_user_annotation") for e in ev
                 if e.get("cat") == "kernel"],
     "traceEvents", "no GPU kernels"),
    (lambda ev: [e.__setitem__("cat", "python_function") for e in ev if e.get("cat") == "cpu_op"],
     "traceEvents", "no CPU operators"),
])
def test_errors_in_events(tmp_path, transform, where, words):
    error = _error(_write(tmp_path, _document_with(transform)))
    assert error.where.endswith(where) and words in error.problem


def test_errors_in_iterations(tmp_path):
    path = _write(tmp_path, _steps("new"))
    error = _error(path, iteration=9)
    assert error.where == "iteration" and "no ProfilerStep#9" in error.problem
    assert "3, 4, 5, 6" in error.problem
    stepless = _write(tmp_path, _one_step("new"), "one.json")
    assert "no ProfilerStep#N spans" in _error(stepless, iteration=1).problem
    for bad in (-1, "4", True, 2.0):
        assert _error(path, iteration=bad).file == "<argument>"
    assert _error(path, name="").where == "name"
    # A step with only CPU work, asked for by number
    builder = _Builder("new")
    builder.iteration(1, 10_000)
    builder.span("ProfilerStep#2", 11_000, 1000, annotation=True)
    builder.span("aten::view", 11_010, 5)
    error = _error(_write(tmp_path, builder.document(), "cpu.json"), iteration=2)
    assert error.where == "ProfilerStep#2" and "no GPU kernels" in error.problem


@pytest.mark.parametrize("content, where", [
    ("[]", ""),
    ("{}", "nodes"),
    ('{"nodes": 5}', "nodes"),
    ('{"nodes": []}', "nodes"),
    ('{"nodes": [3]}', "nodes[0]"),
    ('{"nodes": [{"id": "a", "name": "x"}]}', "nodes[0].id"),
    ('{"nodes": [{"id": 3, "name": "x", "inputs": 4}]}', "nodes[0].inputs"),
    ('{"nodes": [{"id": 3, "name": "x", "inputs": {"values": 4}}]}', "nodes[0].inputs"),
    ('{"nodes": [{"id": 3, "name": "x", "attrs": 4}]}', "nodes[0].attrs"),
    ("{not json", "line 1 column 2"),
])
def test_errors_in_the_execution_trace(tmp_path, content, where):
    et = tmp_path / "et.json"
    et.write_text(content)
    error = _error(_write(tmp_path, _one_step("new")), et)
    assert error.file == str(et) and error.where == where


def test_errors_execution_trace_does_not_match(tmp_path):
    et = read_json(ET)
    other_process = _write(tmp_path, dict(et, pid=7), "pid.json")
    assert "not the same run" in _error(TRACE, other_process).problem
    shifted = copy.deepcopy(et)
    for node in shifted["nodes"]:
        if node["seq_id"] >= 0:
            node["seq_id"] += 1000                      # as if of a later iteration
    error = _error(TRACE, _write(tmp_path, shifted, "seq.json"))
    assert "sequence numbers" in error.problem
    unrelated = {"schema": "1.0.1", "pid": 42741, "nodes": [
        {"id": 1, "name": "aten::nothing", "parent": 0, "tid": 1, "seq_id": -1, "rf_id": 1,
         "inputs": [], "input_shapes": [], "input_types": [], "outputs": [],
         "output_shapes": [], "output_types": [], "op_schema": ""}]}
    error = _error(TRACE, _write(tmp_path, unrelated, "other.json"))
    assert error.where == "nodes" and "only 0 of 77" in error.problem
    # and a synthetic trace with the VGG13 ET: another process
    assert "not the same run" in _error(_write(tmp_path, _one_step("new")), ET).problem
