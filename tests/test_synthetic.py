"""Synthetic profiles: valid, deterministic, shaped like real training, and shipped as built."""
from __future__ import annotations

import re

import pytest

from simulator.errors import InputError
from simulator.hardware import load_hardware
from simulator.profile import profile_bytes, profile_from_dict, profile_sha256
from tracer import make_profiles
from tracer.roofline import kernel_time_us
from tracer.synthetic import MODELS, cnn, mlp, synthesize, transformer

# Small but complete variants: every structure (projection skips, tied embedding,
# several stages and layers) appears, and each builds in milliseconds.
SMALL = {
    "mlp": {"layers": 3, "width": 256, "batch": 8},
    "cnn": {"layers": 4, "width": 8, "batch": 2, "seq": 16},
    "transformer": {"layers": 2, "width": 128, "batch": 2, "seq": 64},
}


@pytest.fixture(scope="module")
def defaults():
    """The default profile of each model."""
    return {model: synthesize(model) for model in MODELS}


def adam_ops(profile):
    return [op for op in profile.ops if op.phase == "optimizer"]


def tensors_of(profile, kind):
    return [t for t in profile.tensors if t.kind == kind]


# ----------------------------------------------------------------------------- validity


@pytest.mark.parametrize("model", MODELS)
def test_every_model_builds_and_round_trips_through_the_loader(model):
    profile = synthesize(model, **SMALL[model])
    again = profile_from_dict(profile.to_dict())
    assert profile_sha256(again) == profile_sha256(profile)
    assert again.peak_bytes == profile.peak_bytes


@pytest.mark.parametrize("model", MODELS)
def test_same_parameters_give_identical_profiles(model):
    assert profile_sha256(synthesize(model)) == profile_sha256(synthesize(model))


@pytest.mark.parametrize("model", MODELS)
def test_phases_run_forward_then_backward_then_optimizer(defaults, model):
    phases = "".join(op.phase[0] for op in defaults[model].ops)
    assert re.fullmatch(r"f+b+o+", phases)


@pytest.mark.parametrize("model", MODELS)
def test_ids_are_short_and_in_creation_order(defaults, model):
    profile = defaults[model]
    assert [t.id for t in profile.tensors] == [f"t{i}" for i in range(len(profile.tensors))]
    assert [op.id for op in profile.ops] == [f"o{i}" for i in range(len(profile.ops))]
    assert all(t.name and t.shape is not None and t.dtype for t in profile.tensors)
    assert all(op.module and op.flops is not None for op in profile.ops)


# ----------------------------------------------------------------------------- training structure


@pytest.mark.parametrize("model", MODELS)
def test_every_weight_has_exactly_one_adam_op_updating_it_and_its_moments(defaults, model):
    profile = defaults[model]
    by_name = {t.name: t.id for t in profile.tensors}
    for weight in tensors_of(profile, "weight"):
        ops = [op for op in adam_ops(profile) if weight.id in op.updates]
        assert len(ops) == 1, weight.name
        (op,) = ops
        assert op.name == "aten::_fused_adam_"
        assert op.updates == (weight.id, by_name[f"{weight.name}.exp_avg"],
                              by_name[f"{weight.name}.exp_avg_sq"])
        assert op.flops == 12 * weight.bytes // 4
        (grad,) = op.inputs
        assert profile.tensor_by_id[grad].kind == "gradient"
    # Two moments per weight, each the weight's size, and nothing else in the optimizer.
    states = tensors_of(profile, "optimizer_state")
    assert len(states) == 2 * len(tensors_of(profile, "weight"))
    assert sum(t.bytes for t in states) == 2 * sum(t.bytes for t in tensors_of(profile, "weight"))
    assert len(adam_ops(profile)) == len(tensors_of(profile, "weight"))


@pytest.mark.parametrize("model", MODELS)
def test_weight_gradients_live_until_their_adam_op(defaults, model):
    profile = defaults[model]
    for op in adam_ops(profile):
        (grad,) = op.inputs
        position = profile.op_index[op.id]
        assert profile.lifetime(grad) == (profile.producer[grad], position)
        assert profile.ops[profile.producer[grad]].phase == "backward"


@pytest.mark.parametrize("model", MODELS)
def test_backward_produces_only_gradients_and_forward_only_activations(defaults, model):
    profile = defaults[model]
    for op in profile.ops:
        kinds = {profile.tensor_by_id[t].kind for t in op.outputs}
        assert kinds <= {"forward": {"activation"}, "backward": {"gradient"},
                         "optimizer": set()}[op.phase], op.id


@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_skips_and_residuals_accumulate_gradients_in_place(defaults, model):
    profile = defaults[model]
    adds = [op for op in profile.ops if op.name == "aten::add_"]
    # cnn default: 8 blocks, one add_ each (the skip's second consumer);
    # transformer: 2 residuals per layer plus the tied embedding = 2 * 12 + 1.
    assert len(adds) == {"cnn": 8, "transformer": 25}[model]
    for op in adds:
        (partial,), (total,) = op.inputs, op.updates
        assert op.phase == "backward" and not op.outputs
        assert profile.tensor_by_id[partial].kind == "gradient"
        assert profile.tensor_by_id[total].kind == "gradient"
        # The accumulated gradient already existed; the partial is made just before.
        assert profile.producer[total] < profile.producer[partial] < profile.op_index[op.id]


def test_mlp_has_no_gradient_accumulation(defaults):
    assert not any(op.updates for op in defaults["mlp"].ops if op.phase != "optimizer")


def test_loss_backward_seeds_the_backward_pass(defaults):
    profile = defaults["transformer"]
    loss_fwd = next(op for op in profile.ops if op.name == "aten::cross_entropy_loss")
    first_bwd = next(op for op in profile.ops if op.phase == "backward")
    (loss,) = loss_fwd.outputs
    assert profile.tensor_by_id[loss].bytes == 4
    assert first_bwd.module == "loss" and loss in first_bwd.inputs
    assert profile.tensor_by_id[first_bwd.outputs[0]].name == "lm_head.out.grad"


def test_transformer_saves_what_attention_backward_reads(defaults):
    # Default: B=8, S=512, width 768 -> 12 heads; logsumexp 8*12*512*4 bytes.
    profile = defaults["transformer"]
    tokens = next(t for t in profile.tensors if t.name == "batch.tokens")
    assert tokens.kind == "input" and tokens.bytes == 8 * 512 * 8
    lse = next(t for t in profile.tensors if t.name == "layer3.attn.logsumexp")
    assert lse.bytes == 8 * 12 * 512 * 4
    backward = next(op for op in profile.ops if op.module == "layer3.attn" and op.phase == "backward")
    names = {profile.tensor_by_id[t].name for t in backward.inputs}
    assert names == {"layer3.attn.out.grad", "layer3.qkv.out", "layer3.attn.out",
                     "layer3.attn.logsumexp"}


def test_convolutions_get_a_cudnn_workspace_of_their_input_capped_at_256_mib():
    # batch 128: the stem output is 128 * 64 * 112 * 112 * 4 B = 392 MiB, over the cap.
    profile = cnn(batch=128)
    convs = [op for op in profile.ops if op.name == "aten::cudnn_convolution"]
    for op in convs:
        x = profile.tensor_by_id[op.inputs[0]]
        assert op.workspace_bytes == min(x.bytes, 256 * 2**20), op.module
    assert max(op.workspace_bytes for op in convs) == 256 * 2**20
    backward = [op for op in profile.ops if op.name == "aten::convolution_backward"]
    assert len(backward) == len(convs) and all(op.workspace_bytes > 0 for op in backward)


# ----------------------------------------------------------------------------- realism


@pytest.mark.parametrize("params", [{}, {"batch": 16, "seq": 1024},
                                    {"layers": 24, "width": 1024, "batch": 4, "seq": 2048}])
def test_transformer_flops_match_six_params_tokens_plus_attention(params):
    profile = transformer(**params)
    src = profile.source
    params_count = sum(t.bytes // 4 for t in tensors_of(profile, "weight"))
    tokens = src["batch"] * src["seq"]
    expected = (6 * params_count * tokens
                + 12 * src["layers"] * src["batch"] * src["seq"] ** 2 * src["width"])
    actual = sum(op.flops for op in profile.ops if op.phase in ("forward", "backward"))
    assert actual == pytest.approx(expected, rel=0.10)


@pytest.mark.parametrize("model", MODELS)
def test_peak_grows_with_batch(model):
    small, large = (synthesize(model, **{**SMALL[model], "batch": b}) for b in (2, 4))
    assert large.peak_bytes > small.peak_bytes


def test_activations_dominate_the_default_transformer_peak(defaults):
    profile = defaults["transformer"]
    at = profile.op_index[profile.peak_op]
    live_activations = sum(t.bytes for t in tensors_of(profile, "activation")
                           if profile.lifetime(t.id)[0] <= at <= profile.lifetime(t.id)[1])
    model_state = sum(t.bytes for t in profile.tensors if t.kind in ("weight", "optimizer_state"))
    assert live_activations > model_state


@pytest.mark.parametrize("model", MODELS)
def test_kernel_times_are_the_roofline_of_their_flops_and_bytes(defaults, model):
    profile = defaults[model]
    hw = load_hardware("a100-40gb-pcie4")
    for op in profile.ops:
        moved = sum(profile.tensor_by_id[t].bytes for t in op.inputs + op.outputs + op.updates)
        assert op.time_us == kernel_time_us(hw, op.flops, moved, "fp32"), op.id


def test_half_precision_halves_tensors_and_speeds_up_matmuls():
    full = transformer(**SMALL["transformer"])
    half = transformer(**SMALL["transformer"], dtype="bf16")
    assert half.name.endswith("-bf16") and half.source["dtype"] == "bf16"
    weight_bytes = [sum(t.bytes for t in tensors_of(p, "weight")) for p in (full, half)]
    assert weight_bytes[1] * 2 == weight_bytes[0]
    assert half.ideal_us < full.ideal_us


# ----------------------------------------------------------------------------- names and parameters


def test_names_encode_the_parameters():
    assert synthesize("transformer").name == "synth-transformer-l12-b8-s512"
    assert synthesize("transformer", width=1024).name == "synth-transformer-l12-w1024-b8-s512"
    assert synthesize("mlp", seq=99).name == "synth-mlp-l8-b256"  # seq is ignored by the mlp
    assert cnn(layers=2, width=8, batch=2, side=16).name == "synth-cnn-l2-w8-b2-s16"
    assert mlp(layers=1, width=64, batch=2, hardware="h100-80gb-pcie5").name == \
        "synth-mlp-l1-w64-b2-h100-80gb-pcie5"


def test_source_records_how_the_profile_was_made():
    profile = synthesize("cnn", **SMALL["cnn"])
    assert profile.source == {
        "kind": "synthetic", "timing": "roofline:a100-40gb-pcie4",
        "from": "swapplan synth cnn --layers 4 --width 8 --batch 2 --seq 16 "
                "--dtype fp32 --hardware a100-40gb-pcie4",
        "batch": 2, "model": "cnn", "layers": 4, "width": 8, "seq": 16, "dtype": "fp32"}


@pytest.mark.parametrize("model, params, field", [
    ("resnet", {}, "model"),
    ("mlp", {"layers": 0}, "layers"),
    ("cnn", {"width": -8}, "width"),
    ("transformer", {"batch": 0}, "batch"),
    ("transformer", {"seq": 0}, "seq"),
    ("cnn", {"seq": 2.5}, "seq"),
    ("mlp", {"layers": True}, "layers"),
    ("transformer", {"width": 100}, "width"),
    ("mlp", {"dtype": "fp8"}, "dtype"),
    ("mlp", {"dtype": "bf16", "hardware": "v100-16gb-pcie3"}, "dtype"),
    ("mlp", {"hardware": "no-such-gpu"}, "hardware"),
])
def test_bad_parameters_raise_input_error_naming_the_parameter(model, params, field):
    with pytest.raises(InputError) as caught:
        synthesize(model, **params)
    assert caught.value.file == "<argument>"
    assert caught.value.where == field


# ----------------------------------------------------------------------------- shipped profiles


def test_shipped_profiles_have_the_documented_names():
    names = [p.name for p in make_profiles.synthetic_profiles()]
    assert names == ["synth-mlp-l16-w8192-b1024", "synth-cnn-l16-w128-b64-s224",
                     "synth-transformer-l12-b16-s1024"] == list(make_profiles.SYNTHETIC_NAMES)


def test_shipped_profiles_equal_a_fresh_regeneration_byte_for_byte():
    for profile in make_profiles.synthetic_profiles():
        path = make_profiles.shipped_path(profile.name, ".json")
        assert path.is_file(), f"{path} is missing: run python -m tracer.make_profiles"
        assert path.read_bytes() == profile_bytes(profile), f"{path} is stale"
        assert len(profile.ops) <= 3000
        assert 2**30 <= profile.peak_bytes <= 100 * 2**30


def test_make_profiles_check_fails_on_a_stale_file(tmp_path, capsys):
    assert make_profiles.main(["--only", "synthetic", "--out", str(tmp_path)]) == 0
    assert make_profiles.main(["--only", "synthetic", "--check", "--out", str(tmp_path)]) == 0
    stale = tmp_path / "synth-mlp-l16-w8192-b1024.json"
    stale.write_bytes(stale.read_bytes().replace(b'"ops":[', b'"ops":[ ', 1))
    assert make_profiles.main(["--only", "synthetic", "--check", "--out", str(tmp_path)]) == 1
    assert "DIFFERS" in capsys.readouterr().out
