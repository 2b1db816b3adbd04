"""Codecs (R40-R42): compressed sizes, compressed transfers, on-GPU encode and decode,
the invalid cases, the hardware section, and the cdma / gist / cswap planners.

The toy: p (1 us) makes a (1,000,000 fp32 elements, 4,000,000 B, density 0.25); x runs
1,000 us; c (1 us) reads a. PCIe moves 10 GB/s each way (10,000 B/us), no latency. The
zvc size of a is ceil(10^6 / 8) + 250,000 x 4 = 1,125,000 B; the compute codec encodes
at 100 GB/s (40 us for a) and decodes at 200 GB/s (20 us).
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner.core.api import make_plan
from planner.shared.compression import swap_seconds
from simulator.api import Simulator
from simulator.errors import InputError
from simulator.hardware import Codec, hardware_from_dict, load_hardware
from simulator.model.codecs import compressed_bytes, zvc_ratio
from simulator.plan import Plan, decode, encode, load_plan, offload, plan_from_dict, plan_json, prefetch
from simulator.profile import Profile, Tensor, profile_from_dict, profile_sha256
from tests.conftest import profile_dict

HW = {"name": "codec-toy", "gpu": {"memory": "1GiB", "fp32_tflops": 19.5, "fp16_tflops": 312, "hbm_gbps": 1555},
      "pcie": {"h2d_gbps": 10, "d2h_gbps": 10, "duplex": "full", "latency_us": 0}, "host": {"memory": "1GiB"},
      "codecs": {"zvc": {"format": "zvc", "where": "dma"},
                 "zvc-gpu": {"format": "zvc", "where": "compute", "encode_gbps": 100, "decode_gbps": 200},
                 "half": {"format": "fp16", "where": "compute", "encode_gbps": 100, "decode_gbps": 200},
                 "bits": {"format": "binarize", "where": "compute", "encode_gbps": 100, "decode_gbps": 200}}}


def toy(density=0.25, c_name="c") -> Profile:
    data = profile_dict({"a": (4_000_000, "activation"), "z": (1, "activation"), "y": (1, "activation")},
                        [("p", "forward", 1.0, [], ["a"]), ("x", "forward", 1000.0, [], ["z"]),
                         ("c", "backward", 1.0, ["a"], ["y"])], "codec-toy")
    for tensor in data["tensors"]:
        if tensor["id"] == "a":
            tensor.update(dtype="fp32", density=density)
    data["ops"][2]["name"] = c_name
    return profile_from_dict(data)


def run(profile, *actions, allow_lossy=False, hw=None):
    hardware = hw or hardware_from_dict(HW)
    return Simulator(profile, hardware).simulate(Plan(profile.name, tuple(actions), allow_lossy=allow_lossy))


# ----------------------------------------------------------------------------- R40 sizes


def test_compressed_sizes_by_format():
    a = Tensor("a", 4_000_000, "activation", dtype="fp32", density=0.25)
    sizes = {fmt: compressed_bytes(a, Codec("k", fmt, "compute", 1, 1)) for fmt in ("zvc", "fp16", "int8", "binarize")}
    assert sizes == {"zvc": 125_000 + 1_000_000, "fp16": 2_000_000, "int8": 1_000_000, "binarize": 125_000}
    # bf16 tensors have 2-byte elements; a density of None counts as 1; odd counts round up
    b = Tensor("b", 2 * 1001, "activation", dtype="bf16")
    assert compressed_bytes(b, Codec("k", "zvc", "dma")) == 126 + 1001 * 2
    assert compressed_bytes(b, Codec("k", "binarize", "compute", 1, 1)) == 126
    assert zvc_ratio(0.25) == pytest.approx(4 / 1.125)


# ----------------------------------------------------------------------------- R41, R42 timing


def test_plain_and_dma_compressed_swap():
    plain = run(toy(), offload("a", "p"), prefetch("a", "x", "c"))
    assert (plain.iteration_us, plain.bytes_d2h, plain.bytes_h2d) == (1402.0, 4_000_000, 4_000_000)
    dma = run(toy(), offload("a", "p", codec="zvc"), prefetch("a", "x", "c", codec="zvc"))
    # 1,125,000 B at 10,000 B/us = 112.5 us each way; c starts at 1001 + 112.5
    assert (dma.iteration_us, dma.bytes_d2h, dma.bytes_h2d) == (1114.5, 1_125_000, 1_125_000)
    assert dma.codec_us == 0.0 and dma.peak_bytes == plain.peak_bytes == 4_000_001
    assert dma.host_peak_bytes == 1_125_000            # the host holds the compressed copy


def test_compute_codec_swap_runs_encode_and_decode_kernels():
    r = run(toy(), offload("a", "p", codec="zvc-gpu"), prefetch("a", "x", "c", codec="zvc-gpu"))
    # p 0-1; encode 1-41 (a + its 1,125,000 B buffer); offload of the buffer 41-153.5, which
    # then frees both (R11: a follows its offload); x 41-1041 makes z at 41 (the peak: a, the
    # buffer and z); prefetch into a new buffer 1041-1153.5; decode 1153.5-1173.5; c to 1174.5
    assert r.ok and r.iteration_us == 1174.5
    assert r.codec_us == 60.0 and r.compute_us == 1062.0
    assert r.peak_bytes == 5_125_001 and r.peak_at_us == 41.0
    assert (r.bytes_d2h, r.bytes_h2d) == (1_125_000, 1_125_000)


def test_gist_encode_decode_pair():
    r = run(toy(), encode("a", "p", "zvc-gpu"), decode("a", "c", "zvc-gpu"))
    # p 0-1, encode 1-41, x 41-1041, decode 1041-1061, c 1061-1062; a and its encoding coexist
    # during the encode and the decode: 5,125,000 B; between them only the encoding
    assert (r.iteration_us, r.peak_bytes, r.codec_us) == (1062.0, 5_125_000, 60.0)
    assert (r.bytes_d2h, r.bytes_h2d, r.transfers) == (0, 0, 0)
    sim = Simulator(toy(), hardware_from_dict(HW))
    timeline = sim.simulate(Plan("codec-toy", (encode("a", "p", "zvc-gpu"), decode("a", "c", "zvc-gpu"))),
                            record=True).timeline
    kinds = [(s.name, s.start_us, s.end_us) for s in timeline.spans if s.args.get("kind") in ("encode", "decode")]
    assert kinds == [("encode a", 1.0, 41.0), ("decode a", 1041.0, 1061.0)]
    memory = dict(timeline.memory)
    assert memory[41.0] == 1_125_000 + 1        # a freed at the encode's end; z is made by x at 41


def test_lossy_codec_needs_allow_lossy_and_is_listed():
    invalid = run(toy(), encode("a", "p", "half"), decode("a", "c", "half"))
    assert not invalid.valid and invalid.rule == "R40" and "allow_lossy" in invalid.reason
    ok = run(toy(), encode("a", "p", "half"), decode("a", "c", "half"), allow_lossy=True)
    assert ok.ok and ok.lossy_tensors == ["a"] and ok.peak_bytes == 6_000_000


# ----------------------------------------------------------------------------- invalid plans


def test_binarize_needs_only_relu_backward_uses():
    bad = run(toy(), encode("a", "p", "bits"), decode("a", "c", "bits"))
    assert not bad.valid and bad.rule == "R40" and "threshold_backward" in bad.reason
    good = run(toy(c_name="aten::threshold_backward"), encode("a", "p", "bits"), decode("a", "c", "bits"))
    assert good.ok and good.peak_bytes == 4_000_000 + 125_000


@pytest.mark.parametrize("actions, rule, words", [
    ((offload("a", "p", codec="zvc"), prefetch("a", "x", "c")), "R41", "written by codec 'zvc'"),
    ((offload("a", "p"), prefetch("a", "x", "c", codec="zvc")), "R41", "uncompressed"),
    ((offload("a", "p", codec="zvc"), prefetch("a", "x", "c", codec="zvc-gpu")), "R41", "codec 'zvc'"),
    ((encode("a", "p", "zvc"), decode("a", "c", "zvc")), "R42", "dma codec"),
    ((encode("a", "p", "zvc-gpu"),), "R42", "encoded on the GPU"),
    ((decode("a", "c", "zvc-gpu"),), "R42", "not encoded"),
    ((encode("a", "p", "zvc-gpu"), decode("a", "c", "bits")), "R42", "not encoded by it"),
    ((encode("a", "x", "zvc-gpu"), decode("a", "c", "zvc-gpu"), offload("a", "p")), "R42", "being offloaded"),
])
def test_invalid_codec_plans(actions, rule, words):
    r = run(toy(), *actions)
    assert not r.valid and r.rule == rule and words in r.reason, r.reason


def test_codec_that_does_not_shrink_is_invalid():
    r = run(toy(density=1.0), offload("a", "p", codec="zvc"), prefetch("a", "x", "c", codec="zvc"))
    assert not r.valid and r.rule == "R40" and "does not shrink" in r.reason


def test_unknown_codec_is_an_input_error():
    with pytest.raises(InputError, match=r"codec.*unknown codec 'lz4'"):
        run(toy(), offload("a", "p", codec="lz4"), prefetch("a", "x", "c", codec="lz4"))


def test_uvm_plans_take_no_codecs():
    profile = toy()
    plan = Plan(profile.name, (offload("a", "p", codec="zvc"),), memory="uvm")
    r = Simulator(profile, hardware_from_dict(HW)).simulate(plan)
    assert not r.valid and r.rule == "R33"


# ----------------------------------------------------------------------------- formats


def test_plan_round_trip_keeps_codecs(tmp_path):
    profile = toy()
    plan = Plan(profile.name, (encode("a", "p", "half"), decode("a", "c", "half"),
                               offload("a", "p", codec="zvc")), profile_sha256=profile_sha256(profile),
                allow_lossy=True)
    path = tmp_path / "p.json"
    path.write_text(plan_json(plan))
    again = load_plan(path)
    assert again.actions == plan.actions and again.allow_lossy
    with pytest.raises(InputError, match=r"actions\[0\]"):
        plan_from_dict({"format": "swapplan-plan/1", "profile": {"name": "t"},
                        "actions": [{"kind": "encode", "tensor": "a", "after": "p"}]})


def test_hardware_codecs_section():
    hw = hardware_from_dict(HW)
    assert hw.codec("zvc-gpu") == Codec("zvc-gpu", "zvc", "compute", 100.0, 200.0)
    assert hardware_from_dict({**HW, "codecs": hw.to_dict()["codecs"]}).codecs == hw.codecs
    for codecs, words in [({"k": {"format": "lz4", "where": "dma"}}, "codecs.k.format"),
                          ({"k": {"format": "zvc", "where": "compute"}}, "encode_gbps"),
                          ({"k": {"format": "zvc", "where": "dma", "encode_gbps": 5}}, "no throughput"),
                          ({"k": {"format": "binarize", "where": "dma"}}, "where must be compute"),
                          ({"k": {"format": "zvc", "where": "compute", "encode_gbps": 0, "decode_gbps": 1}},
                           "must be > 0")]:
        with pytest.raises(InputError, match=words):
            hardware_from_dict({**HW, "codecs": codecs})
    for preset in ("a100-40gb-pcie4", "v100-32gb-pcie3", "h100-80gb-pcie5"):
        formats = {(c.format, c.where) for c in load_hardware(preset).codecs}
        assert {("zvc", "dma"), ("zvc", "compute"), ("fp16", "compute"), ("binarize", "compute")} <= formats


def test_profile_density_is_checked():
    data = profile_dict({"a": (8, "activation")}, [("p", "forward", 1.0, [], ["a"])], "d")
    data["tensors"][0]["density"] = 1.5
    with pytest.raises(InputError, match=r"tensors\[0\] \(a\)\.density"):
        profile_from_dict(data)
    data["tensors"][0]["density"] = 0.5
    assert profile_from_dict(data).tensors[0].density == 0.5


# ----------------------------------------------------------------------------- planners


def sparse_chain(density: float) -> Profile:
    """A ReLU-like chain of 8 layers of 2 MB activations, each kept for its backward."""
    layers = 8
    tensors = {f"a{i}": (2_000_000, "activation") for i in range(layers)}
    tensors.update({f"g{i}": (2_000_000, "gradient") for i in range(layers + 1)})
    ops = [(f"f{i}", "forward", 200.0, [f"a{i - 1}"] if i else [], [f"a{i}"]) for i in range(layers)]
    ops.append(("loss", "forward", 10.0, [f"a{layers - 1}"], [f"g{layers}"]))
    for i in reversed(range(layers)):
        ops.append((f"b{i}", "backward", 200.0, [f"g{i + 1}", f"a{i}"], [f"g{i}"]))
    data = profile_dict(tensors, ops, f"sparse-chain-{density}")
    for tensor in data["tensors"]:
        if tensor["id"].startswith("a"):
            tensor.update(dtype="fp32", density=density)
    return profile_from_dict(data)


def slow_link(hw_name="codec-toy-slow"):
    data = {**HW, "name": hw_name, "pcie": {"h2d_gbps": 2, "d2h_gbps": 2, "duplex": "full", "latency_us": 5}}
    return hardware_from_dict(data)


def test_cdma_compresses_vdnn_swaps_and_is_faster():
    profile, hw = sparse_chain(0.2), slow_link()
    budget = int(profile.peak_bytes * 0.6)
    vdnn = make_plan(profile, hw, budget, "vdnn")
    cdma = make_plan(profile, hw, budget, "cdma")
    assert cdma.result.ok and cdma.plan.planner.notes["compressed_tensors"] > 0
    assert {a.kind for a in vdnn.plan.actions} == {a.kind for a in cdma.plan.actions}
    assert cdma.result.bytes_d2h < vdnn.result.bytes_d2h * 0.3
    assert cdma.result.iteration_us <= vdnn.result.iteration_us
    assert cdma.plan.planner.bound == "none (codecs)"


def test_cdma_needs_a_dma_codec():
    data = {**HW, "codecs": {"zvc-gpu": HW["codecs"]["zvc-gpu"]}}
    with pytest.raises(InputError, match="no dma codec"):
        make_plan(sparse_chain(0.2), hardware_from_dict(data), 30_000_000, "cdma")


def test_cswap_compresses_only_where_it_pays():
    profile = sparse_chain(0.1)
    fast_codec = {**HW, "name": "fast-codec", "pcie": {"h2d_gbps": 2, "d2h_gbps": 2, "duplex": "full"}}
    slow_codec = {**fast_codec, "name": "slow-codec",
                  "codecs": {"zvc-gpu": {"format": "zvc", "where": "compute", "encode_gbps": 0.5,
                                         "decode_gbps": 0.5}}}
    budget = int(profile.peak_bytes * 0.6)
    fast = make_plan(profile, hardware_from_dict(fast_codec), budget, "cswap", {"base": "vdnn"})
    slow = make_plan(profile, hardware_from_dict(slow_codec), budget, "cswap", {"base": "vdnn"})
    assert fast.result.ok and fast.plan.planner.notes["compressed_tensors"] > 0
    assert fast.plan.planner.notes["codecs"] == ["zvc-gpu"]      # the dma codec is not a GPU kernel
    assert slow.plan.planner.notes["compressed_tensors"] == 0      # 4 us/KB of kernels never pays
    tid = next(a.tensor for a in fast.plan.actions if a.codec)
    actions = list(fast.plan.actions)
    hw = hardware_from_dict(fast_codec)
    assert swap_seconds(profile, hw, actions, tid, hw.codec("zvc-gpu")) < swap_seconds(profile, hw, actions, tid, None)
    with pytest.raises(InputError, match="cannot be cswap's base"):
        make_plan(profile, hw, budget, "cswap", {"base": "gist"})


def test_gist_encodes_sparse_and_binarizable_maps():
    profile = sparse_chain(0.2)
    hw = hardware_from_dict(HW)
    gist = make_plan(profile, hw, profile.peak_bytes, "gist")
    notes = gist.plan.planner.notes
    assert gist.result.ok and notes["encoded"]["sparse"] > 0 and notes["footprint_reduction"] > 1.0
    assert {a.kind for a in gist.plan.actions} == {"encode", "decode"}
    dense = make_plan(sparse_chain(1.0), hw, profile.peak_bytes, "gist")
    assert dense.plan.actions == () and dense.plan.planner.notes["encoded"]["sparse"] == 0
    lossy = make_plan(sparse_chain(1.0), hw, profile.peak_bytes, "gist", {"allow_lossy": True})
    assert lossy.plan.allow_lossy and lossy.plan.planner.notes["encoded"]["precision"] > 0
    assert lossy.result.ok and lossy.result.lossy_tensors
