"""Points of the simulation rules (docs) an independent implementation found silent (issue 36), each
pinned by a hand-computed case: R40's element count and rounding, R41 with R12, R41's
missing ops, R53 and compute codecs, R50's zero-byte allocations."""
from __future__ import annotations

import pytest

from simulator.api import simulate
from simulator.errors import InputError
from simulator.hardware import hardware_from_dict
from simulator.plan import Plan, offload, plan_from_dict, prefetch
from simulator.profile import profile_from_dict

HW = hardware_from_dict({
    "name": "tiny-hw", "gpu": {"memory": "1GiB", "fp32_tflops": 19.5, "fp16_tflops": 312, "hbm_gbps": 1555},
    "pcie": {"h2d_gbps": 1, "d2h_gbps": 1, "duplex": "full", "latency_us": 0}, "host": {"memory": "1GiB"},
    "codecs": {"zvc-dma": {"format": "zvc", "where": "dma"},
               "zvc-gpu": {"format": "zvc", "where": "compute", "encode_gbps": 100, "decode_gbps": 200}}})


def profile(a_bytes=4000, density=0.25, dtype=None, b=True):
    """p makes a (and b), x runs 10 us, c reads them."""
    a = {"id": "a", "bytes": a_bytes, "kind": "activation", "density": density}
    if dtype:
        a["dtype"] = dtype
    tensors = [a, {"id": "z", "bytes": 1, "kind": "activation"}, {"id": "y", "bytes": 1, "kind": "activation"}]
    outs, ins = ["a"], ["a"]
    if b:
        tensors.append({"id": "b", "bytes": 4000, "kind": "activation", "density": 0.25})
        outs, ins = ["a", "b"], ["a", "b"]
    return profile_from_dict({
        "format": "swapplan-profile/1", "name": "pts", "tensors": tensors,
        "ops": [{"id": "p", "name": "p", "phase": "forward", "time_us": 1, "inputs": [], "outputs": outs},
                {"id": "x", "name": "x", "phase": "forward", "time_us": 10, "inputs": [], "outputs": ["z"]},
                {"id": "c", "name": "c", "phase": "backward", "time_us": 1, "inputs": ins, "outputs": ["y"]}]})


def swap(*extra, codec="zvc-dma", tensor="a"):
    return Plan("pts", (offload(tensor, "p", "host", codec), prefetch(tensor, "x", "c", "host", codec), *extra))


def test_r40_rounds_halves_up_and_counts_whole_elements():
    # 4004 bytes of fp32: 1,001 elements; density 0.5: 500.5 -> floor(500.5 + 0.5) = 501 kept.
    # zvc: ceil(1001 / 8) = 126 mask bytes + 501 x 4 = 2,130 bytes each way at 1 GB/s: 2.13 us.
    p = profile(4004, 0.5, b=False)
    r = simulate(p, swap(), HW)
    assert r.ok and r.bytes_d2h == 2130 and r.bytes_h2d == 2130
    # 4003 bytes: still 1,000 whole elements (the remainder is no element): 125 + 500 x 4 = 2,125
    r = simulate(profile(4003, 0.5, b=False), swap(), HW)
    assert r.ok and r.bytes_d2h == 2125
    # an unknown dtype counts 4 bytes an element, as fp32; int8 counts 1: 4004 elements,
    # 501 + 2002 x 1 = 2,503 bytes
    assert simulate(profile(4004, 0.5, dtype="nf4", b=False), swap(), HW).bytes_d2h == 2130
    assert simulate(profile(4004, 0.5, dtype="int8", b=False), swap(), HW).bytes_d2h == 2503


def test_r41_a_prefetch_after_the_compute_codec_offloads_op_finds_the_tensor_resident():
    p = profile(b=False)
    plan = Plan("pts", (offload("a", "p", "host", "zvc-gpu"), prefetch("a", "p", "c", "host", "zvc-gpu")))
    r = simulate(p, plan, HW)
    assert not r.valid and r.rule == "R12" and "resident" in r.reason


def test_r41_missing_ops_invalid_plan_or_input_error():
    p = profile(b=False)
    r = simulate(p, Plan("pts", (offload("a", None, "host", "zvc-gpu"),
                                 prefetch("a", "x", "c", "host", "zvc-gpu"))), HW)
    assert not r.valid and r.rule == "R41" and "after" in r.reason
    r = simulate(p, Plan("pts", (offload("a", "p", "host", "zvc-gpu"),
                                 prefetch("a", "x", None, "host", "zvc-gpu"))), HW)
    assert not r.valid and r.rule == "R41" and "before" in r.reason
    with pytest.raises(InputError, match="after"):
        plan_from_dict({"format": "swapplan-plan/1", "profile": {"name": "pts"}, "actions": [
            {"kind": "encode", "tensor": "a", "after": None, "codec": "zvc-gpu"},
            {"kind": "decode", "tensor": "a", "before": "c", "codec": "zvc-gpu"}]})


def test_r53_compute_codec_prefetches_do_not_group_and_the_reason_says_why():
    p = profile()
    base = [offload("a", "p", "host", "zvc-gpu"), offload("b", "p", "host", "zvc-gpu")]
    grouped = [prefetch(t, "x", "c", "host", "zvc-gpu") for t in ("a", "b")]
    from dataclasses import replace
    grouped = [replace(a, group="h") for a in grouped]
    r = simulate(p, Plan("pts", (*base, *grouped)), HW)
    assert not r.valid and r.rule == "R53"
    assert "codec" in r.reason and "kind, tier or before" not in r.reason
    ungrouped = simulate(p, Plan("pts", (*base, *[replace(a, group=None) for a in grouped])), HW)
    assert ungrouped.ok and ungrouped.iteration_us == pytest.approx(14.35)
    # dma-codec prefetches group as any others: one flow of the summed compressed bytes
    dma = [replace(a, codec="zvc-dma", group="h") for a in grouped]
    r = simulate(p, Plan("pts", (offload("a", "p", "host", "zvc-dma"), offload("b", "p", "host", "zvc-dma"),
                                 *dma)), HW)
    assert r.ok


def _placed(offsets):
    p = profile_from_dict({
        "format": "swapplan-profile/1", "name": "zero", "tensors": [
            {"id": "a", "bytes": 0, "kind": "activation"}, {"id": "y", "bytes": 8, "kind": "activation"}],
        "ops": [{"id": "p", "name": "p", "phase": "forward", "time_us": 1, "inputs": [], "outputs": ["a"]},
                {"id": "c", "name": "c", "phase": "backward", "time_us": 1, "inputs": ["a"], "outputs": ["y"]}]})
    plan = plan_from_dict({"format": "swapplan-plan/1", "profile": {"name": "zero"}, "actions": [],
                           "placement": {"arena_bytes": 64, "offsets": offsets}})
    return simulate(p, plan, HW)


def test_r50_a_zero_byte_tensor_keeps_its_key_a_zero_byte_workspace_has_none():
    # a (0 B) is still allocation a#1 at its offset; y#1 takes [8, 16). 2 us, peak 8 B.
    r = _placed({"a#1": 0, "y#1": 8})
    assert r.ok and r.iteration_us == pytest.approx(2.0) and r.peak_bytes == 8
    missing = _placed({"y#1": 8})
    assert not missing.valid and missing.rule == "R50" and "a#1" in missing.reason
    extra = _placed({"a#1": 0, "y#1": 8, "ws:p": 16})    # p has no workspace: no allocation
    assert not extra.valid and extra.rule == "R50" and "ws:p" in extra.reason
