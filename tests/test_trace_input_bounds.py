"""Careless and hostile input to ``trace`` and ``variants`` (issue 33, second pass).

Every file they read is a regular file (a FIFO or a device is one line, exit 2, at
once); a transformers config is bounded before anything is built (layers, widths,
vocabulary, parameters, the step's bytes, the trace's memory); ``--density-seed`` is
checked against the seeds torch takes; a UTF-8 byte-order mark is accepted in a config
and a variants CSV; without torch, ``trace`` says which extra to install in one line.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from cli import app
from simulator.errors import InputError
from simulator.profile import load_profile
from tracer import hf_config

ROOT = Path(__file__).resolve().parents[1]
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="tracing needs torch (the 'trace' extra)")
TINY = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}
BOM = b"\xef\xbb\xbf"
EXTRA_LINE = ("error: trace needs the 'trace' extra (torch, transformers): pip install 'swapplan[trace]' "
              "(from a checkout: pip install -e '.[trace]')")


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args], obj={"debug": False})


def one_error(result, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output[-2000:])
    lines = [line for line in result.stderr.splitlines() if not line.startswith("tracing ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    return lines[0]


def process(folder: Path, *args, prelude: str = "", timeout: float = 30):
    """swapplan as a real process (a FIFO must not block it): (the one error line, seconds)."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", f"{prelude}import cli; cli.main()", *map(str, args)], cwd=folder,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    return lines[0], time.monotonic() - start


def write_config(folder: Path, name: str = "c.json", **change) -> Path:
    path = folder / name
    path.write_text(json.dumps({**TINY, **change}))
    return path


# ----------------------------------------------------------------------------- 1: regular files only


@pytest.mark.parametrize("option", ["--hf-config", "--density-file"])
def test_a_fifo_is_refused_at_once(tmp_path, option):
    os.mkfifo(tmp_path / "f.json")
    args = ["trace", "--hf-config", "f.json"] if option == "--hf-config" else \
        ["trace", "gpt2", "--density-file", "f.json"]
    line, seconds = process(tmp_path, *args, "-o", "o.json")
    assert line.startswith("error: f.json: ") and "is a FIFO (named pipe), expected a regular file" in line, line
    assert seconds < 20 and not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
@pytest.mark.parametrize("option", ["--hf-config", "--density-file"])
def test_a_character_device_is_refused(tmp_path, device, option):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    args = ["trace", "--hf-config", device] if option == "--hf-config" else ["trace", "gpt2", "--density-file", device]
    line = one_error(run(*args, "-o", tmp_path / "o.json"))
    assert line.startswith(f"error: {device}: ") and "is a character device, expected a regular file" in line


def test_a_folder_or_a_link_to_a_fifo_as_config(tmp_path):
    (tmp_path / "d.json").mkdir()
    assert "d.json: hf-config: is a directory" in one_error(run("trace", "--hf-config", tmp_path / "d.json",
                                                               "-o", tmp_path / "o.json"))
    os.mkfifo(tmp_path / "f")
    os.symlink("f", tmp_path / "l.json")
    line, _ = process(tmp_path, "trace", "--hf-config", "l.json", "-o", "o.json")
    assert "l.json: hf-config: is a FIFO" in line


def test_a_missing_config_names_the_shipped_ones(tmp_path):
    line = one_error(run("trace", "--hf-config", tmp_path / "none.json", "-o", tmp_path / "o.json"))
    assert "none.json: hf-config: no such file (shipped configs: llama2-13b, llama2-70b" in line


def test_variants_csv_fifo_and_device(tmp_path):
    os.mkfifo(tmp_path / "v.csv")
    line, seconds = process(tmp_path, "variants", "synth-transformer-l12-b16-s1024", "--from", "v.csv",
                            "-o", "o.json")
    assert "v.csv: is a FIFO (named pipe), expected a regular file" in line and seconds < 20
    line = one_error(run("variants", "synth-transformer-l12-b16-s1024", "--from", "/dev/zero",
                         "-o", tmp_path / "o.json"))
    assert "/dev/zero: is a character device, expected a regular file" in line


def test_kineto_hash_reads_regular_files_only(tmp_path):
    from tracer.kineto.assemble import text_sha256
    os.mkfifo(tmp_path / "f.json")
    assert text_sha256(tmp_path / "f.json") is None       # not blocked on, not read
    assert text_sha256("/dev/zero") is None
    (tmp_path / "t.json").write_text("{}")
    assert text_sha256(tmp_path / "t.json") == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


# ----------------------------------------------------------------------------- 2: bounds of a config


@pytest.mark.parametrize("change, where, words", [
    ({"num_hidden_layers": 10**9}, "num_hidden_layers", "1,000,000,000 layers, more than the 1024 a trace takes"),
    ({"num_hidden_layers": 10_000}, "num_hidden_layers", "10,000 layers, more than the 1024"),
    ({"num_hidden_layers": 10**4000}, "num_hidden_layers", "1.00e+4000 layers"),
    ({"model_type": "gpt2", "n_layer": 10**9}, "n_layer", "1,000,000,000 layers, more than the 1024"),
    ({"hidden_size": 2**21, "num_attention_heads": 2**11, "num_key_value_heads": 2**11}, "hidden_size",
     "2,097,152 is more than 1,048,576 (2^20)"),
    ({"intermediate_size": 2**30}, "intermediate_size", "1,073,741,824 is more than 1,048,576 (2^20)"),
    ({"vocab_size": 10**12}, "vocab_size", "1,000,000,000,000 tokens, more than 16,777,216 (2^24)"),
])
def test_a_config_asking_too_much_is_refused_before_torch(tmp_path, change, where, words):
    path = write_config(tmp_path, **change)
    start = time.monotonic()
    line = one_error(run("trace", "--hf-config", path, "-o", tmp_path / "o.json"))
    assert line.startswith(f"error: {path}: {where}: {words}"), line
    assert time.monotonic() - start < 5 and not (tmp_path / "o.json").exists()


def test_too_many_parameters(tmp_path):
    path = write_config(tmp_path, hidden_size=2**20, intermediate_size=2**20, num_attention_heads=2**10,
                        num_key_value_heads=2**10, num_hidden_layers=1000)
    line = one_error(run("trace", "--hf-config", path, "-o", tmp_path / "o.json"))
    assert line.startswith(f"error: {path}: about 6.60e+15 parameters (from its sizes), more than "
                           "10,000,000,000,000 (10^13)"), line


def test_a_step_past_what_a_profile_holds_names_batch_and_seq(tmp_path):
    path = write_config(tmp_path, max_position_embeddings=10**13)
    line = one_error(run("trace", "--hf-config", path, "--batch", 10**5, "--seq", 10**12, "-o", tmp_path / "o.json"))
    assert line.startswith(f"error: <argument>: batch, seq: the training step of {path} at batch 100000, "
                           "seq 1000000000000 needs about"), line
    assert "more than the 8 PiB (2^53 bytes) a profile holds" in line


def test_the_trace_memory_is_checked_against_what_is_available(tmp_path):
    data = {**TINY, "num_hidden_layers": 100}
    with pytest.raises(InputError) as info:
        hf_config.check_bounds("c.json", data, memory=1 << 30)
    assert (info.value.file, info.value.where) == ("c.json", "num_hidden_layers")
    assert "100 layers: the trace needs about 1.3 GiB of memory (512 MiB + 8 MiB per layer) and 1.0 GiB are " \
           "available here" in info.value.problem
    hf_config.check_bounds("c.json", data, memory=2 << 30)   # fits


def test_bounds_read_a_transformers_config_object_too():
    config = SimpleNamespace(num_hidden_layers=2000, hidden_size=64, vocab_size=100)
    with pytest.raises(InputError) as info:
        hf_config.check_bounds("c.json", config, memory=1 << 40)
    assert info.value.where == "num_hidden_layers"
    with pytest.raises(InputError, match="10,000,000,000,000 \\(10\\^13\\), the most a trace takes"):
        hf_config.check_parameters("c.json", 10**13 + 1)
    hf_config.check_parameters("c.json", 10**13)


def test_shipped_configs_are_within_bounds_and_the_estimate_is_a_lower_bound():
    published = {"llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320,
                 "llama2-70b": 68_976_648_192, "mistral-7b": 7_241_732_096, "llama3.1-8b": 8_030_261_248}
    for path in hf_config.shipped_configs():
        data = hf_config.read_config(path)
        hf_config.check_bounds(str(path), data, batch=1, seq=1024, memory=1 << 40)
        estimate = hf_config.estimated_parameters(data)
        assert 0.6 * published[path.stem] <= estimate <= published[path.stem], path.stem   # a lower bound


@needs_torch
def test_parameters_are_counted_after_the_build(tmp_path, monkeypatch):
    from tracer import models
    monkeypatch.setattr(hf_config, "MAX_PARAMETERS", 1000)
    monkeypatch.setattr(hf_config, "estimated_parameters", lambda source: 0)   # the count after the build decides
    with pytest.raises(InputError) as info:
        models.from_hf_config(write_config(tmp_path))
    assert info.value.file == str(tmp_path / "c.json") and info.value.problem.endswith(
        "parameters, more than 1,000 (10^13), the most a trace takes")
    assert "about" not in info.value.problem


@needs_torch
def test_a_traced_step_past_the_format_names_the_config(tmp_path):
    from tracer.pytorch.trace import trace
    with pytest.raises(InputError) as info:   # within the byte bound, but an op of 10^16 us
        trace(hf_config=write_config(tmp_path, max_position_embeddings=10**12), seq=10**11)
    assert (info.value.file, info.value.where) == ("<argument>", "hf-config")
    assert "does not fit a profile" in info.value.problem and "(R23)" in info.value.problem


@needs_torch
def test_density_refuses_weights_the_machine_cannot_hold_before_the_trace(tmp_path, monkeypatch):
    from tracer import density
    from tracer.pytorch.trace import trace
    monkeypatch.setattr(density, "_available_memory", lambda: 1000)
    with pytest.raises(InputError) as info:
        trace(hf_config=write_config(tmp_path), seq=16, density=True)
    assert (info.value.file, info.value.where) == ("<argument>", "density")
    assert "holds at least its fp32 weights" in info.value.problem and "--density-file" in info.value.problem


# ----------------------------------------------------------------------------- 3: --density-seed


@pytest.mark.parametrize("seed", ["-1", str(2**64), str(2**70), "1e3"])
def test_an_out_of_range_density_seed_names_the_option(tmp_path, seed):
    line = one_error(run("trace", "--hf-config", write_config(tmp_path), "--density", "--density-seed", seed,
                         "-o", tmp_path / "o.json"))
    assert "--density-seed" in line and "hf-config" not in line and "c.json" not in line, line
    if seed != "1e3":
        assert "0<=x<=18446744073709551615" in line, line


@needs_torch
@pytest.mark.parametrize("seed", [-1, 2**64, 2**70, 1.5, True])
def test_the_library_checks_the_seed_before_tracing(tmp_path, seed):
    from tracer.pytorch.trace import trace
    with pytest.raises(InputError) as info:
        trace(hf_config=write_config(tmp_path), density=True, density_seed=seed)
    assert (info.value.file, info.value.where) == ("<argument>", "density-seed")
    assert "from 0 to 18446744073709551615" in info.value.problem


@needs_torch
def test_the_largest_seed_measures(tmp_path):
    from tracer.pytorch.trace import trace
    profile = trace("tests.test_density:relu_mlp", batch=4, density=True, density_batch=4,
                    density_seed=2**64 - 1)
    assert profile.source["density"]["seed"] == 2**64 - 1
    assert all(t.density is not None for t in profile.tensors)


# ----------------------------------------------------------------------------- 4: byte-order marks


def test_a_config_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(BOM + json.dumps(TINY).encode())
    assert hf_config.read_config(path) == TINY
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(InputError, match="not valid UTF-8"):
        hf_config.read_config(path)


def _op(profile="synth-transformer-l12-b16-s1024") -> str:
    from simulator import catalog
    return catalog.open_profile(profile).ops[3].id


def test_a_variants_csv_with_a_byte_order_mark_and_crlf_is_merged(tmp_path):
    op = _op()
    (tmp_path / "v.csv").write_bytes(BOM + f"op,name,time_us,workspace_bytes\r\n{op},fast,1.5,64\r\n".encode())
    result = run("variants", "synth-transformer-l12-b16-s1024", "--from", tmp_path / "v.csv",
                 "-o", tmp_path / "o.json")
    assert result.exit_code == 0, result.output
    merged = load_profile(tmp_path / "o.json")
    assert [v.name for v in merged.ops[merged.op_index[op]].variants] == ["fast"]


@pytest.mark.parametrize("content, words", [
    ("op,name,time_us,workspace_bytes\n{op},\"" + "x" * 200_000 + "\",1,1\n", "line 2: not a valid CSV: field larger"),
    ("op,name,time_us,workspace_bytes\n{op},a\rb,1,1\n", "line 2: expected 4 columns, got 2"),
    ("op,name,time_us,workspace_bytes\n{op},a,1e400,1\n", "line 2.time_us: must be from 0"),
    ("op,name,time_us,workspace_bytes\n{op},a,1," + "9" * 5000 + "\n", "line 2.workspace_bytes: expected a whole"),
])
def test_a_malformed_variants_csv_is_one_line(tmp_path, content, words):
    (tmp_path / "v.csv").write_text(content.replace("{op}", _op()))
    line = one_error(run("variants", "synth-transformer-l12-b16-s1024", "--from", tmp_path / "v.csv",
                         "-o", tmp_path / "o.json"))
    assert words in line, line


# ----------------------------------------------------------------------------- 5: without the trace extra


@pytest.mark.parametrize("args", [["trace", "gpt2", "-o", "o.json"], ["trace", "--list"]])
def test_trace_without_torch_is_one_clean_line(tmp_path, monkeypatch, args):
    monkeypatch.setitem(sys.modules, "torch", None)   # `import torch` fails, find_spec raises ValueError
    monkeypatch.chdir(tmp_path)
    assert one_error(run(*args)) == EXTRA_LINE


def test_train_without_torch_names_train(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    line = one_error(run("train", "gpt2", "--planner", "lms", "--budget", "80%"))
    assert line == EXTRA_LINE.replace("error: trace ", "error: train ")


def test_trace_without_torch_in_a_real_process(tmp_path):
    line, _ = process(tmp_path, "trace", "gpt2", "-o", "o.json", prelude="import sys; sys.modules['torch'] = None; ")
    assert line == EXTRA_LINE


@needs_torch
def test_trace_without_transformers_is_one_clean_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    line = one_error(run("trace", "--hf-config", write_config(tmp_path), "--seq", "16", "-o", tmp_path / "o.json"))
    assert line.startswith("error: trace of ") and "needs the 'trace' extra (torch, transformers): pip install " \
                                                   "'swapplan[trace]'" in line and "transformers is not installed" in line
