"""Mixed-precision tracing (``--amp``) and transformers configs (``--hf-config``).

The byte counts of a mixed-precision profile are checked against real CPU runs of a
tiny Llama: an independent ``torch.autocast("cpu")`` training step with
``torch.optim.AdamW`` on fp32 master copies (dtype and bytes of every weight,
gradient, master and moment), and the traced step itself run for real under
torch.profiler (its memory at kernel boundaries). Then the optimizer's op structure
per parameter, which the ZeRO planners rely on, the shipped configs and profiles, and
the one-line errors for bad configs.
"""
from __future__ import annotations

import json
import math
import re

import pytest

torch = pytest.importorskip("torch", reason="tracing needs torch (the 'trace' extra)")
transformers = pytest.importorskip("transformers", reason="tracing HF models needs transformers")

from click.testing import CliRunner  # noqa: E402

from cli import app  # noqa: E402
from simulator.catalog import open_profile  # noqa: E402
from simulator.errors import InputError  # noqa: E402
from simulator.profile import load_profile  # noqa: E402
from tests.real_memory import measure_step  # noqa: E402
from tracer import models  # noqa: E402
from tracer.pytorch.trace import LOSS_SCALE, TrainStep, trace  # noqa: E402

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
        "max_position_embeddings": 128, "tie_word_embeddings": False}
BATCH, SEQ = 2, 32
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
NAME = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("configs") / "tiny-llama.json"
    path.write_text(json.dumps(TINY))
    return path


@pytest.fixture(scope="module")
def cpu_profiles(config):
    """Traced with the CPU's kernels and autocast lists: what a real CPU run executes."""
    return {amp: trace(hf_config=config, amp=amp, batch=BATCH, seq=SEQ, gpu_kernels=False)
            for amp in ("bf16", "fp16")}


@pytest.fixture(scope="module")
def gpu_profile(config):
    return trace(hf_config=config, amp="bf16", batch=BATCH, seq=SEQ)


def by_name(profile) -> dict:
    return {t.name: t for t in profile.tensors if t.name}


def trainable(profile) -> list:
    """The parameters: weights with a fp32 master copy (buffers have none)."""
    names = by_name(profile)
    return [t for t in profile.tensors if t.kind == "weight" and f"{t.name}.master" in names]


def check_optimizer_structure(profile, low: str, optimizer: str = "adamw") -> int:
    """Per parameter, three consecutive optimizer ops: ``optim::<optimizer>_foreach`` reads
    the low-precision gradient and updates the fp32 master and moments in place;
    ``optim::cast_master`` reads the master and makes ``<param>.new``;
    ``optim::copy_param`` reads it and updates the parameter. Returns the parameter
    count (elements)."""
    names = by_name(profile)
    moments = ("exp_avg", "exp_avg_sq") if optimizer == "adamw" else ("momentum_buffer",)
    params = trainable(profile)
    assert params
    elements = 0
    for w in params:
        n = w.name
        assert w.dtype == low and w.shape
        elements += math.prod(w.shape)
        master, new, grad = names[f"{n}.master"], names[f"{n}.new"], names[f"{n}.grad"]
        states = [names[f"{n}.{m}"] for m in moments]
        assert master.kind == "optimizer_state" and master.dtype == "fp32"
        assert master.bytes == 2 * w.bytes and master.shape == w.shape
        assert all(s.kind == "optimizer_state" and s.dtype == "fp32" and s.bytes == 2 * w.bytes
                   for s in states)
        assert grad.kind == "gradient" and grad.dtype == low and grad.bytes == w.bytes
        assert new.dtype == low and new.bytes == w.bytes and new.shape == w.shape

        (step,) = profile.updaters[master.id]
        (cast,) = profile.consumers[master.id]
        (copy,) = profile.updaters[w.id]
        assert (cast, copy) == (step + 1, step + 2), n
        step, cast, copy = (profile.ops[i] for i in (step, cast, copy))
        assert step.name == f"optim::{optimizer}_foreach" and step.phase == "optimizer"
        assert step.inputs == (grad.id,) and not step.outputs
        assert set(step.updates) == {master.id} | {s.id for s in states}
        assert cast.name == "optim::cast_master" and cast.phase == "optimizer"
        assert cast.inputs == (master.id,) and cast.outputs == (new.id,) and not cast.updates
        assert copy.name == "optim::copy_param" and copy.phase == "optimizer"
        assert copy.inputs == (new.id,) and copy.updates == (w.id,) and not copy.outputs
        assert profile.consumers[new.id] == (profile.op_index[copy.id],)
    optimizer_ops = [op for op in profile.ops if op.phase == "optimizer"]
    assert len(optimizer_ops) == 3 * len(params)
    return elements


# ----------------------------------------------------------------------------- real runs


def _real_autocast_step(amp: str):
    """One real training step as mixed-precision training runs it: the model in the low
    precision, the forward under ``torch.autocast("cpu")``, fp32 master copies stepped by
    ``torch.optim.AdamW`` from the (unscaled, fp32) gradients, copied back. fp16 scales
    the loss by LOSS_SCALE. Returns the model's parameters, the masters and the optimizer."""
    dtype = TORCH_DTYPE[amp]
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"},
                                      use_cache=False, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).to(dtype).train()
    params = dict(model.named_parameters())
    masters = {n: p.detach().float().clone() for n, p in params.items()}
    optimizer = torch.optim.AdamW(list(masters.values()))
    ids = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ))
    with torch.autocast("cpu", dtype=dtype):
        loss = model(input_ids=ids, labels=ids).loss
    scale = LOSS_SCALE if amp == "fp16" else 1.0
    (loss * scale).backward()
    for n, p in params.items():
        masters[n].grad = p.grad.float() / scale
    optimizer.step()
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(masters[n])
    assert torch.isfinite(loss)
    return params, masters, optimizer


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_bytes_per_parameter_match_a_real_autocast_step_with_fp32_masters(amp, cpu_profiles):
    profile = cpu_profiles[amp]
    params, masters, optimizer = _real_autocast_step(amp)
    names = by_name(profile)
    assert {t.name for t in trainable(profile)} == set(params)
    total = elements = 0
    for n, p in params.items():
        state = optimizer.state[masters[n]]
        real = {"": p, ".grad": p.grad, ".master": masters[n], ".exp_avg": state["exp_avg"],
                ".exp_avg_sq": state["exp_avg_sq"]}
        for suffix, tensor in real.items():
            ours = names[n + suffix]
            assert (ours.dtype, ours.bytes) == (NAME[tensor.dtype], tensor.nbytes), n + suffix
            total += ours.bytes
        elements += p.numel()
    assert p.dtype == p.grad.dtype == TORCH_DTYPE[amp]
    assert total == 16 * elements  # 2 weight + 2 gradient + 4 master + 4 + 4 moments


def _real_memory(config, amp: str):
    """The traced step run for real on the CPU: its memory above the persistent tensors,
    sampled at the end of each outermost ATen op, per phase (as in test_trace)."""
    dtype = TORCH_DTYPE[amp]
    workload = models.from_hf_config(config, batch=BATCH, seq=SEQ)
    workload.module.to(dtype)  # on meta: what the tracer does
    step = TrainStep(workload, "adamw", gpu_kernels=False, amp=amp)
    gen = torch.Generator().manual_seed(0)
    named, buffers = dict(workload.module.named_parameters()), dict(workload.module.named_buffers())
    params = [(torch.randn(named[n].shape, generator=gen) * 0.02).to(dtype).requires_grad_()
              for n in step.param_names]
    bufs = [torch.ones(buffers[n].shape, dtype=buffers[n].dtype) for n in step.buffer_names]
    states = [[p.detach().float() for p in params]] + [[torch.zeros(p.shape) for p in params]
                                                       for _ in range(2)]
    batch = [torch.randint(0, TINY["vocab_size"], s.shape, generator=gen)
             for s in workload.inputs.values()]
    return measure_step(step, params, bufs, states, batch)[1]


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_traced_memory_matches_the_mixed_precision_step_run_for_real(amp, config, cpu_profiles):
    """The whole step's peak, and the backward and optimizer phases (the per-parameter
    master steps with their fp32 temporaries), within 2% of a real CPU run of the same
    step. The forward is left out: HF's causal LM keeps its low-precision logits
    referenced while the loss runs on their fp32 copy, a Python reference the dataflow
    trace frees at its last use (B x S x vocab x 2 bytes earlier)."""
    profile = cpu_profiles[amp]
    boundary = _real_memory(config, amp)
    persistent = profile.persistent_bytes
    assert profile.peak_bytes - persistent == pytest.approx(max(boundary.values()), rel=0.02)
    for phase in ("backward", "optimizer"):
        ours = max(r for r, op in zip(profile.resident_bytes, profile.ops)
                   if op.phase == phase) - persistent
        assert ours == pytest.approx(boundary[phase], rel=0.02), (phase, ours, boundary)


# ----------------------------------------------------------------------------- structure


def test_optimizer_ops_per_parameter_and_16_bytes_per_parameter(gpu_profile):
    profile = gpu_profile
    elements = check_optimizer_structure(profile, "bf16")
    assert re.fullmatch(r"f+b+o+", "".join(op.phase[0] for op in profile.ops))
    names = by_name(profile)
    params = trainable(profile)
    persistent = sum(t.bytes for t in params) + sum(
        t.bytes for t in profile.tensors if t.kind == "optimizer_state")
    grads = sum(names[f"{t.name}.grad"].bytes for t in params)
    assert (persistent, grads) == (14 * elements, 2 * elements)
    # every gradient is live at the first optimizer op: the peak holds all 16 bytes
    assert profile.peak_bytes >= 16 * elements
    assert profile.source["amp"] == "bf16" and profile.source["master_weights"] == "fp32"
    assert profile.source["hf_config"].endswith("tiny-llama.json")
    assert profile.name == "tiny-llama-b2-s32-amp-bf16"
    assert "--amp bf16" in profile.source["from"] and "--hf-config" in profile.source["from"]
    # matmuls and attention in bf16 (CUDA's autocast lists)
    attention = [op for op in profile.ops if op.name == "aten::_scaled_dot_product_flash_attention"]
    assert len(attention) == TINY["num_hidden_layers"]
    assert all(profile.tensor_by_id[op.outputs[0]].dtype == "bf16" for op in attention)


def test_fp16_scales_the_loss_and_unscales_in_each_step(cpu_profiles):
    fp16, bf16 = cpu_profiles["fp16"], cpu_profiles["bf16"]
    check_optimizer_structure(fp16, "fp16")
    forward = [op for op in fp16.ops if op.phase == "forward"]
    assert forward[-1].name == "aten::mul" and forward[-1].module == "loss"
    assert len(fp16.ops) == len(bf16.ops) + 2  # loss x scale, and its backward
    steps = {op.module + op.name: op.time_us for op in bf16.ops if op.name == "optim::adamw_foreach"}
    for op in fp16.ops:
        if op.name == "optim::adamw_foreach":  # one more kernel: the unscale
            assert op.time_us > steps[op.module + op.name]
    # only two scalars of bookkeeping beyond bf16: no per-parameter bytes
    assert fp16.persistent_bytes == bf16.persistent_bytes


def test_amp_sgd_keeps_a_master_and_a_momentum(config):
    profile = trace(hf_config=config, amp="bf16", optimizer="sgd", batch=BATCH, seq=SEQ)
    elements = check_optimizer_structure(profile, "bf16", optimizer="sgd")
    states = sum(t.bytes for t in profile.tensors if t.kind == "optimizer_state")
    assert states == 8 * elements  # 2 weight + 2 gradient + 4 master + 4 momentum = 12


def test_without_amp_nothing_changes(config):
    profile = trace(hf_config=config, batch=BATCH, seq=SEQ)
    assert "amp" not in profile.source and "master_weights" not in profile.source
    assert not any(t.name and t.name.endswith((".master", ".new")) for t in profile.tensors)
    ops = [op for op in profile.ops if op.phase == "optimizer"]
    assert {op.name for op in ops} == {"optim::adamw_foreach"}
    assert all(any(profile.tensor_by_id[t].kind == "weight" for t in op.updates) for op in ops)
    assert {t.dtype for t in profile.tensors if t.kind in ("weight", "optimizer_state")} == {"fp32"}


@pytest.mark.parametrize("kwargs, field", [
    ({"amp": "fp8"}, "amp"),
    ({"amp": "bf16", "dtype": "bf16"}, "amp"),
    ({"amp": "bf16", "hardware": "v100-32gb-pcie3"}, "amp"),  # Volta has no bf16
    ({"model": "gpt2"}, "hf-config"),                          # a model and a config
])
def test_option_errors_are_one_line(kwargs, field, config):
    with pytest.raises(InputError) as info:
        trace(kwargs.pop("model", None), hf_config=config, **kwargs)
    assert info.value.file == "<argument>" and info.value.where == field
    assert "\n" not in str(info.value)
    with pytest.raises(InputError) as info:
        trace()
    assert info.value.where == "model"


# ----------------------------------------------------------------------------- --hf-config


def run(*args):
    return CliRunner().invoke(app, list(args), obj={"debug": False})


def test_cli_traces_a_config_file_with_amp(config, tmp_path):
    out = tmp_path / "t.json.gz"
    result = run("trace", "--hf-config", str(config), "--amp", "fp16", "--seq", "16",
                 "--hardware", "v100-32gb-pcie3", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: tiny-llama-b1-s16-amp-fp16-v100-32gb-pcie3" in result.stdout
    profile = load_profile(out)
    check_optimizer_structure(profile, "fp16")
    assert profile.source["timing"] == "roofline:v100-32gb-pcie3" and profile.source["seq"] == 16


def _field(data: dict) -> dict:
    return {**TINY, **data}


@pytest.mark.parametrize("content, where", [
    (None, "hf-config: no such file"),
    ('{"model_type": "llama",', "line 1: not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ({"hidden_size": 64}, "model_type: missing"),
    (_field({"model_type": "no-such-model"}), "model_type: transformers"),
    ({"model_type": "t5"}, "model_type: 't5' is not a causal LM"),
    (_field({"hidden_size": "big"}), "hidden_size: expected a whole number >= 1, got 'big'"),
    (_field({"num_hidden_layers": 0}), "num_hidden_layers: expected a whole number >= 1"),
    (_field({"hidden_size": 65}), "hidden_size: 65 is not a multiple of num_attention_heads"),
    (_field({"num_key_value_heads": 3}), "num_key_value_heads: 3 does not divide"),
    (_field({"hidden_act": "nope"}), "hidden_act: unknown activation 'nope'"),
    (_field({"rms_norm_eps": None}), "rms_norm_eps: transformers rejects the config"),
])
def test_bad_configs_are_one_line_errors_naming_file_and_field(content, where, tmp_path):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    result = run("trace", "--hf-config", str(path), "-o", str(tmp_path / "out.json"))
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert errors == [result.stderr.splitlines()[-1]], result.stderr
    assert errors[0].startswith(f"error: {path}: {where}"), errors[0]
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr


def test_a_sequence_beyond_the_config_limit_is_refused(config):
    with pytest.raises(InputError) as info:
        trace(hf_config=config, seq=TINY["max_position_embeddings"] + 1)
    assert (info.value.file, info.value.where) == ("<argument>", "seq")
    assert str(config) in info.value.problem
    # the default sequence (1024) is capped at the config's limit
    assert models.from_hf_config(config).seq == TINY["max_position_embeddings"]


# ----------------------------------------------------------------------------- shipped


# Published parameter counts of the models the shipped configs describe.
SHIPPED = {"llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320,
           "llama2-70b": 68_976_648_192, "mistral-7b": 7_241_732_096,
           "llama3.1-8b": 8_030_261_248}


def test_shipped_configs_build_the_published_models():
    assert [p.stem for p in models.shipped_configs()] == sorted(SHIPPED)
    for path in models.shipped_configs():
        workload = models.from_hf_config(path.stem)  # a shipped config by name
        assert models.parameter_count(workload.module) == SHIPPED[path.stem], path.name
        assert (workload.batch, workload.seq) == (1, 1024)


@pytest.mark.parametrize("name, config, amp, hardware", [
    ("llama2-13b-b1-s1024-amp-fp16", "llama2-13b", "fp16", "v100-32gb-pcie3"),
    ("llama2-70b-b1-s1024-amp-bf16", "llama2-70b", "bf16", "h200-141gb-1.5tb-pcie5"),
])
def test_shipped_mixed_precision_profiles(name, config, amp, hardware):
    profile = open_profile(name)
    assert profile.source["amp"] == amp and profile.source["timing"] == f"roofline:{hardware}"
    assert profile.source["hf_config"] == f"tracer/configs/{config}.json"
    elements = check_optimizer_structure(profile, amp)
    assert elements == SHIPPED[config]
    persistent = sum(t.bytes for t in trainable(profile)) + sum(
        t.bytes for t in profile.tensors if t.kind == "optimizer_state")
    assert persistent == 14 * elements
    assert 16 * elements <= profile.peak_bytes <= 16.2 * elements
