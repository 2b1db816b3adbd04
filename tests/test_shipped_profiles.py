"""The shipped profiles: all load, real models sit in the regime where swapping matters,
and they regenerate byte for byte (checked here for the quick ones; `make profiles
--check` checks all)."""
from __future__ import annotations

import gzip

import pytest

from simulator.catalog import open_profile, shipped_profiles_summary
from simulator.profile import profile_bytes
from tests.conftest import VGG13_ET, VGG13_TRACE, gunzip_to
from tracer import make_profiles

GIB40 = 40 * 2**30


def test_at_least_eight_traced_real_models_and_the_measured_one_ship():
    kinds = {row["name"]: row["source"] for row in shipped_profiles_summary()}
    traced = [name for name, kind in kinds.items() if kind == "traced"]
    assert len(traced) >= 8
    assert kinds.get(make_profiles.VGG13_NAME) == "measured"
    assert {"gpt2-b48-s1024", "bert-large-b80-s512", "resnet152-b512-s224", "llama-1b-b12-s2048"} <= set(traced)


def test_traced_profiles_peak_between_one_and_three_times_a_40gib_gpu():
    """The swapping benchmarks: between one and three A100s' worth. The mixed-precision LLM
    profiles (for ZeRO, far past any one GPU) are checked by their own test below."""
    for row in shipped_profiles_summary():
        if row["source"] == "traced" and "-amp-" not in row["name"]:
            assert GIB40 <= row["peak_bytes"] <= 3 * GIB40, row["name"]


def test_llm_profiles_cost_sixteen_bytes_a_parameter():
    """13B and 70B, traced with --amp: weights, grads, master and Adam moments."""
    for name, params in (("llama2-13b-b1-s1024-amp-fp16", 13.0e9), ("llama2-70b-b1-s1024-amp-bf16", 69.0e9)):
        profile = open_profile(name)
        weights = sum(t.bytes for t in profile.tensors if t.kind == "weight")
        state = sum(t.bytes for t in profile.tensors if t.kind == "optimizer_state")
        assert weights == pytest.approx(2 * params, rel=0.01), name
        assert state == pytest.approx(12 * params, rel=0.01), name


def test_traced_profiles_are_timed_on_the_a100_roofline_and_labelled():
    profile = open_profile("gpt2-b48-s1024")
    assert profile.source["timing"] == "roofline:a100-40gb-pcie4" and profile.source["batch"] == 48
    kinds = {t.kind for t in profile.tensors}
    assert kinds == {"weight", "optimizer_state", "activation", "gradient", "input"}
    assert any(op.updates for op in profile.ops if op.phase == "optimizer")
    assert sum(op.flops or 0 for op in profile.ops) > 0


def _shipped_bytes(recipe) -> bytes:
    data = make_profiles.shipped_path(recipe.name, recipe.suffix).read_bytes()
    return gzip.decompress(data) if recipe.suffix.endswith(".gz") else data


@pytest.mark.parametrize("name", ["vgg16-b1024-s224", make_profiles.VGG13_NAME])
def test_shipped_file_equals_a_fresh_regeneration(name, tmp_path, monkeypatch):
    if name == make_profiles.VGG13_NAME:
        # the trace as it ships in tests/data, gunzipped under the names the profile records
        gunzip_to(tmp_path, VGG13_TRACE, VGG13_ET)
        monkeypatch.setattr(make_profiles, "VGG13_TRACE", tmp_path)
    recipe = next(r for r in make_profiles.recipes() if r.name == name)
    missing = recipe.available()
    if missing:
        pytest.skip(missing)
    assert _shipped_bytes(recipe) == profile_bytes(recipe.build())
