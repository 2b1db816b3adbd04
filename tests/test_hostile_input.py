"""Careless and hostile input (issue 17): never exit 3, never hang, never clobber.

Every case runs the command line and checks three things: the exit status, that an
error is one short line, and that nothing in the folder changed but the output the
command was asked to write. Inputs are small; the large ones (a gzip bomb, an alias
bomb, a long plan) are built on the fly under a size cap. benchmarks/fuzz_cli.py runs
these shapes at full size, and random mutations of them, for longer.
"""
from __future__ import annotations

import copy
import gzip
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cli import app
from simulator.errors import InputError
from simulator.files import read_document, write_atomic
from simulator.hardware import preset_dir
from simulator.plan import load_plan
from tests.conftest import TWO_LAYER_OPS, TWO_LAYER_TENSORS, profile_dict
from tests.hostile import alias_bomb

ROOT = Path(__file__).resolve().parents[1]
LINE_CHARS = 400   # an error line is at most this long, whatever the input
HARDWARE = yaml.safe_load((preset_dir() / "a100-40gb-pcie4.yaml").read_text())


# ----------------------------------------------------------------------------- harness


def _snapshot(folder: Path) -> dict:
    """Every entry under ``folder``: kind, size, mtime, and a link's target."""
    out = {}
    for path in sorted(folder.rglob("*")):
        info = os.lstat(path)
        target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
        out[str(path.relative_to(folder))] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns, target)
    return out


def cli(folder: Path, *args, code: int, outputs: tuple = (), debug: bool = False, env: dict | None = None):
    """Run swapplan in-process from ``folder``; check the exit status, a one-line error
    (for exit 2) and that only ``outputs`` (names in ``folder``) changed."""
    before = _snapshot(folder)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        result = CliRunner().invoke(app, [str(a) for a in args], obj={"debug": debug}, env=env)
    finally:
        os.chdir(cwd)
    assert result.exit_code == code, (result.exit_code, result.output[-2000:])
    if code == 2 and not debug:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[:2000]
        assert len(lines[0]) <= LINE_CHARS, len(lines[0])
    after = _snapshot(folder)
    changed = {name for name in set(before) | set(after) if before.get(name) != after.get(name)}
    assert changed <= set(outputs), f"touched {sorted(changed - set(outputs))}"
    return result


def process(folder: Path, *args, code: int, timeout: float = 30, env: dict | None = None,
            stdin=subprocess.DEVNULL):
    """Run swapplan as a real process (for FIFOs, devices, --debug and torch-less runs)."""
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "import cli; cli.main()", *map(str, args)], cwd=folder,
                          capture_output=True, text=True, timeout=timeout, env=full_env, stdin=stdin)
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    if code == 2 and "--debug" not in args:
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and len(lines[0]) <= LINE_CHARS, done.stderr[:2000]
    return done, time.monotonic() - start


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def two_layer() -> dict:
    return profile_dict(TWO_LAYER_TENSORS, TWO_LAYER_OPS, "two-layer")


@pytest.fixture
def work(tmp_path):
    """A folder holding a good profile, hardware file and plan."""
    write_json(tmp_path / "p.json", two_layer())
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump(HARDWARE))
    write_json(tmp_path / "plan.json", {
        "format": "swapplan-plan/1", "profile": {"name": "two-layer"}, "hardware": "a100-40gb-pcie4",
        "budget_bytes": 400, "actions": [{"kind": "offload", "tensor": "a1", "to": "host", "after": "f2"},
                                         {"kind": "prefetch", "tensor": "a1", "from": "host", "after": "loss",
                                          "before": "b2"}]})
    return tmp_path


# ----------------------------------------------------------------------------- 1, 2: R23 everywhere


def _profile_with(change) -> dict:
    data = two_layer()
    change(data)
    return data


PROFILE_R23 = {
    "tensor 2^63 bytes": lambda d: d["tensors"][3].update(bytes=2**63),
    "tensor 1e20 bytes": lambda d: d["tensors"][3].update(bytes=1e20),
    "tensor 2^53 bytes": lambda d: d["tensors"][3].update(bytes=2**53),
    "op time 1e308 us": lambda d: d["ops"][0].update(time_us=1e308),
    "op time 1e9 us": lambda d: d["ops"][0].update(time_us=1e9),
    "workspace 2^60": lambda d: d["ops"][0].update(workspace_bytes=2**60),
    "op time 10^400 (no float holds it)": lambda d: d["ops"][0].update(time_us=10**400),
}


@pytest.mark.parametrize("case", PROFILE_R23)
@pytest.mark.parametrize("command", ["validate", "info", "simulate"])
def test_profile_past_r23_is_an_input_error(work, case, command):
    write_json(work / "bad.json", _profile_with(PROFILE_R23[case]))
    result = cli(work, command, "bad.json", code=2)
    assert "(R23)" in result.stderr or "finite number" in result.stderr


HARDWARE_R23 = {
    "gpu memory 2^70": lambda h: h["gpu"].update(memory=2**70),
    "gpu memory 8191 PiB": lambda h: h["gpu"].update(memory="8191PiB"),
    "host memory 10000 PiB": lambda h: h["host"].update(memory="10000PiB"),
    "ssd capacity 2^64": lambda h: h["ssd"].update(capacity=2**64),
    "pcie 5e-324 GB/s": lambda h: h["pcie"].update(h2d_gbps=5e-324),
    "pcie 1e-10 GB/s (0 bytes/s)": lambda h: h["pcie"].update(d2h_gbps=1e-10),
    "hbm 1e7 GB/s": lambda h: h["gpu"].update(hbm_gbps=1e7),
    "latency 1e308 us": lambda h: h["pcie"].update(latency_us=1e308),
    "pcie 10^4000 GB/s (no float holds it)": lambda h: h["pcie"].update(d2h_gbps=10**4000),
}


@pytest.mark.parametrize("case", HARDWARE_R23)
def test_hardware_past_r23_is_an_input_error(work, case):
    hardware = copy.deepcopy(HARDWARE)
    HARDWARE_R23[case](hardware)
    (work / "bad.yaml").write_text(yaml.safe_dump(hardware))
    result = cli(work, "simulate", "p.json", "--hardware", "bad.yaml", code=2)
    assert "(R23)" in result.stderr or "finite number" in result.stderr


def test_flops_no_float_holds(work):
    write_json(work / "bad.json", _profile_with(lambda d: d["ops"][0].update(flops=10**400)))
    assert "finite number" in cli(work, "info", "bad.json", code=2).stderr


@pytest.mark.parametrize("budget", ["1e308%", "1e400GiB", "100000PiB", "9" * 5000, "1" + "0" * 30 + "%"])
def test_budget_past_r23_is_an_input_error(work, budget):
    result = cli(work, "simulate", "p.json", "--budget", budget, code=2)
    assert "(R23)" in result.stderr


def test_plan_budget_past_r23_is_an_input_error(work):
    plan = json.loads((work / "plan.json").read_text())
    plan["budget_bytes"] = 2**62
    write_json(work / "big.json", plan)
    assert "(R23)" in cli(work, "validate", "p.json", "big.json", code=2).stderr


def test_three_huge_activations_same_answer_with_and_without_plot(work):
    tensors = {f"a{k}": (2**62, "activation") for k in range(3)}
    data = profile_dict(tensors, [("o", "forward", 1.0, [], list(tensors))])
    write_json(work / "huge.json", data)
    hardware = copy.deepcopy(HARDWARE)
    hardware["gpu"]["memory"] = "8191PiB"
    (work / "huge.yaml").write_text(yaml.safe_dump(hardware))
    cli(work, "simulate", "huge.json", "--hardware", "a100-40gb-pcie4", code=2)
    cli(work, "simulate", "huge.json", "--hardware", "a100-40gb-pcie4", "--plot", "m.png", code=2)
    cli(work, "simulate", "p.json", "--hardware", "huge.yaml", "--plot", "m.png", code=2)


@pytest.mark.parametrize("command", [["validate"], ["info"], ["simulate"], ["plan", "--budget", "90%"]])
def test_lone_surrogate_is_an_input_error(work, command):
    text = json.dumps(two_layer()).replace('"a2"', '"\\ud800"')
    (work / "s.json").write_text(text)
    result = cli(work, command[0], "s.json", *command[1:], code=2)
    assert "surrogate" in result.stderr and "tensors[4].id" in result.stderr


def test_lone_surrogate_in_yaml(work):
    (work / "s.yaml").write_text(yaml.safe_dump(two_layer()).replace("two-layer", '"\\ud800"'))
    cli(work, "info", "s.yaml", code=2)     # libyaml refuses the escape; PyYAML's reader: our check


def test_valid_surrogate_pair_loads(work):
    text = json.dumps(two_layer()).replace('"a2"', '"\\ud83d\\ude00"')
    (work / "s.json").write_text(text)
    cli(work, "info", "s.json", code=0)


def test_json_output_is_strict_json(work):
    """Times and sizes at the edge of R23 still print finite numbers."""
    data = two_layer()
    for op in data["ops"]:
        op["time_us"] = 1e9 - 1
    data["tensors"][3]["bytes"] = 2**52
    write_json(work / "edge.json", data)
    hardware = copy.deepcopy(HARDWARE)
    hardware["gpu"]["memory"] = 2**53 - 1
    hardware["pcie"].update(h2d_gbps=1e-9, d2h_gbps=1e-9)   # 1 byte/s
    (work / "edge.yaml").write_text(yaml.safe_dump(hardware))
    result = cli(work, "simulate", "edge.json", "--hardware", "edge.yaml", "--json", code=0)

    def reject(token):
        raise AssertionError(f"{token} in --json output")
    data = json.loads(result.stdout, parse_constant=reject)
    assert data["iteration_us"] == 7 * (1e9 - 1)


def test_numel_2_62_in_an_execution_trace_is_refused(tmp_path):
    from tests.conftest import VGG13_ET as ET, VGG13_TRACE as TRACE, read_json
    et = read_json(ET)
    conv = next(n for n in et["nodes"] if n["name"] == "aten::cudnn_convolution")
    conv["inputs"][1][3] = 2**62
    write_json(tmp_path / "et.json", et)
    result = cli(tmp_path, "import", "kineto", TRACE, "--et", "et.json", "-o", "out.json", code=2)
    assert "(R23)" in result.stderr


# ----------------------------------------------------------------------------- 3: no hang, no blow-up


@pytest.mark.parametrize("levels", [7, 9])
@pytest.mark.parametrize("command", ["validate", "info", "simulate"])
def test_yaml_alias_bomb_is_refused_quickly(work, levels, command):
    (work / "bomb.yaml").write_text(alias_bomb(levels))
    start = time.monotonic()
    result = cli(work, command, "bomb.yaml", code=2)
    assert time.monotonic() - start < 5
    assert "alias" in result.stderr


def test_yaml_aliases_within_reason_load(work):
    text = yaml.safe_dump(two_layer()).replace("source:\n  kind: synthetic",
                                                "source:\n  a: &x [1, 2, 3]\n  b: *x\n  kind: synthetic")
    (work / "ok.yaml").write_text(text)
    cli(work, "info", "ok.yaml", code=0)


def test_recursive_yaml_alias(work):
    (work / "r.yaml").write_text("format: swapplan-profile/1\nname: r\nsource: &s {a: *s}\ntensors: []\nops: []\n")
    assert "recursive" in cli(work, "info", "r.yaml", code=2).stderr


def test_yaml_hardware_alias_bomb(work):
    bomb = alias_bomb(9).replace("format: swapplan-profile/1\nname: bomb\nsource:", "description: x\nextra:")
    (work / "hwbomb.yaml").write_text(bomb)
    assert "alias" in cli(work, "simulate", "p.json", "--hardware", "hwbomb.yaml", code=2).stderr


@pytest.mark.parametrize("role", ["profile", "plan", "hardware", "plan's hardware"])
def test_fifo_is_refused_not_waited_on(work, role):
    os.mkfifo(work / "fifo.json")
    args = {"profile": ["info", "fifo.json"], "plan": ["simulate", "p.json", "fifo.json"],
            "hardware": ["simulate", "p.json", "--hardware", "fifo.json"],
            "plan's hardware": ["simulate", "p.json", "plan2.json"]}[role]
    plan = json.loads((work / "plan.json").read_text())
    plan["hardware"] = "fifo.json"
    write_json(work / "plan2.json", plan)
    done, seconds = process(work, *args, code=2, timeout=20)
    assert "FIFO" in done.stderr and seconds < 15


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/stdin", "/dev/null"])
def test_devices_are_refused(work, path):
    if not os.path.exists(path):
        pytest.skip(f"no {path}")
    done, _ = process(work, "info", path, code=2, timeout=20, stdin=subprocess.PIPE)
    assert "expected a regular file" in done.stderr


def test_plan_naming_dev_stdin_as_hardware(work):
    plan = json.loads((work / "plan.json").read_text())
    plan["hardware"] = "/dev/stdin"
    write_json(work / "plan2.json", plan)
    done, _ = process(work, "simulate", "p.json", "plan2.json", code=2, timeout=20, stdin=subprocess.PIPE)
    assert "/dev/stdin" in done.stderr


def test_a_folder_as_input(work):
    (work / "d.json").mkdir()
    assert "is a directory" in cli(work, "info", "d.json", code=2).stderr


def test_gzip_bomb_stops_at_the_limit(work):
    """4 MiB of spaces in 4 KiB of gzip, read under a 1 MiB limit."""
    (work / "bomb.json.gz").write_bytes(gzip.compress(b" " * (4 * 2**20) + b"{}", 9))
    result = cli(work, "info", "bomb.json.gz", code=2, env={"SWAPPLAN_MAX_INPUT_BYTES": "1MiB"})
    assert "once gunzipped" in result.stderr and "SWAPPLAN_MAX_INPUT_BYTES" in result.stderr


def test_raw_file_over_the_limit(work):
    (work / "big.json").write_bytes(b" " * (2 * 2**20) + b"{}")
    result = cli(work, "validate", "big.json", code=2, env={"SWAPPLAN_MAX_INPUT_BYTES": "1MiB"})
    assert "input size limit" in result.stderr
    cli(work, "validate", "p.json", code=0, env={"SWAPPLAN_MAX_INPUT_BYTES": "1MiB"})


def test_bad_limit_variable(work):
    result = cli(work, "info", "p.json", code=2, env={"SWAPPLAN_MAX_INPUT_BYTES": "lots"})
    assert "SWAPPLAN_MAX_INPUT_BYTES" in result.stderr


def test_yaml_over_its_own_limit_points_to_json(work):
    (work / "big.yaml").write_text("# " + "x" * (2 * 2**20) + "\n")
    result = cli(work, "info", "big.yaml", code=2, env={"SWAPPLAN_MAX_INPUT_BYTES": "32MiB"})
    assert "hand-written" in result.stderr and ".json" in result.stderr


def test_counts_past_r23_are_refused_before_any_work(work, monkeypatch):
    import simulator.profile.parse
    monkeypatch.setattr(simulator.profile.parse, "MAX_COUNT", 5)
    result = cli(work, "validate", "p.json", code=2)
    assert "tensors: 9 entries; at most 5" in result.stderr


def test_synth_past_r23_is_refused_at_once(work):
    start = time.monotonic()
    result = cli(work, "synth", "mlp", "--layers", "10000000", "-o", "m.json", code=2)
    assert time.monotonic() - start < 2 and "(R23)" in result.stderr


def test_a_long_plan_loads_fast(work):
    """20,000 actions through the inline schema check (jsonschema took ~0.14 ms each)."""
    plan = json.loads((work / "plan.json").read_text())
    plan["actions"] = [copy.deepcopy(action) for _ in range(10_000) for action in plan["actions"]]
    write_json(work / "long.json", plan)
    start = time.monotonic()
    assert len(load_plan(work / "long.json").actions) == 20_000
    assert time.monotonic() - start < 2
    plan["actions"][15_000]["to"] = "tape"
    write_json(work / "long.json", plan)
    with pytest.raises(InputError, match=r"actions\[15000\]\.to: .tape. is not one of host, ssd"):
        load_plan(work / "long.json")


# ----------------------------------------------------------------------------- 4: never clobber


def _plan_args():
    return ["simulate", "p.json", "plan.json", "--hardware", "a100-40gb-pcie4"]


@pytest.mark.parametrize("option", ["--timeline", "--plot"])
def test_symlink_output_is_kept(work, option):
    (work / "target.txt").write_text("keep")
    os.symlink("target.txt", work / "link.json")
    result = cli(work, *_plan_args(), option, "link.json", code=2)
    assert "symbolic link" in result.stderr
    assert (work / "link.json").is_symlink() and (work / "target.txt").read_text() == "keep"


@pytest.mark.parametrize("make", ["fifo", "folder"])
def test_fifo_or_folder_output_is_refused(work, make):
    if make == "fifo":
        os.mkfifo(work / "out.json")
    else:
        (work / "out.json").mkdir()
    cli(work, *_plan_args(), "--timeline", "out.json", code=2)


@pytest.mark.parametrize("device", ["/dev/full", "/dev/null"])
def test_device_output_is_refused(work, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    mode = os.stat(device).st_mode
    assert "character device" in cli(work, *_plan_args(), "--timeline", device, code=2).stderr
    assert os.stat(device).st_mode == mode


@pytest.mark.parametrize("command", [
    ["synth", "mlp", "--layers", "1", "--width", "8", "--batch", "1", "-o"],
    ["plan", "p.json", "--budget", "90%", "-o"],
    ["simulate", "p.json", "--plot"],
])
def test_every_output_option_checks_first(work, command):
    (work / "t.txt").write_text("keep")
    os.symlink("t.txt", work / "l.json")
    cli(work, *command, "l.json", code=2)
    assert (work / "t.txt").read_text() == "keep"


def test_missing_output_folder(work):
    assert "does not exist" in cli(work, *_plan_args(), "--timeline", "no/t.json", code=2).stderr


def test_outputs_written_only_where_named(work):
    (work / "t.json").write_text("old")
    os.chmod(work / "t.json", 0o640)
    cli(work, *_plan_args(), "--budget", "1GiB", "--timeline", "t.json", code=0, outputs=("t.json",))
    assert json.loads((work / "t.json").read_text())["traceEvents"]
    assert stat.S_IMODE(os.stat(work / "t.json").st_mode) == 0o640       # kept its mode
    cli(work, "plan", "p.json", "--budget", "100%", "-o", "new.json", code=0, outputs=("new.json",))


def test_write_atomic_leaves_nothing_on_failure(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(InputError):
        write_atomic(tmp_path / "d", b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


# ----------------------------------------------------------------------------- 5: one line, always


@pytest.mark.parametrize("args", [["simulate"], ["info", "--top", "-1", "x"], ["info", "--top", "9" * 5000, "x"],
                                  ["nosuch"], ["simulate", "p.json", "--nosuch"], ["import", "kineto"],
                                  ["synth", "rnn", "-o", "x.json"]])
def test_usage_errors_are_one_line(work, args):
    result = cli(work, *args, code=2)
    assert "--help" in result.stderr


def test_long_dangling_id_is_shortened(work):
    data = two_layer()
    data["ops"][0]["inputs"][0] = "x" * 1_000_000
    write_json(work / "long.json", data)
    result = cli(work, "validate", "long.json", code=2)
    assert "(1000002 characters)" in result.stderr


def test_debug_keeps_exit_2_and_shows_the_traceback(work):
    done, _ = process(work, "info", "none.json", "--debug", code=2)
    assert "Traceback" in done.stderr and done.stderr.splitlines()[-1].startswith("error: none.json")
    done, _ = process(work, "--debug", "simulate", "p.json", "--budget", "1e400GiB", code=2)
    assert "Traceback" in done.stderr


def test_debug_is_in_the_help(work):
    assert "--debug" in cli(work, "--help", code=0).stdout


# ----------------------------------------------------------------------------- 6: nonsense parameters


def test_empty_import_name(work):
    from tests.test_import_kineto import _one_step
    write_json(work / "trace.json", _one_step("new"))
    for name in ("", "   "):
        cli(work, "import", "kineto", "trace.json", "--name", name, "-o", "out.json", code=2)


def _string_correlations(document: dict, convert) -> dict:
    for event in document["traceEvents"]:
        args = event.get("args")
        if isinstance(args, dict) and "correlation" in args and event.get("cat") == "kernel":
            args["correlation"] = convert(args["correlation"])
    return document


def test_string_correlation_ids(work):
    from tests.test_import_kineto import _one_step
    write_json(work / "trace.json", _string_correlations(_one_step("new"), str))
    result = cli(work, "import", "kineto", "trace.json", "-o", "out.json", code=0, outputs=("out.json",))
    assert result.stdout.startswith("wrote out.json: trace, 7 ops")            # the trace's name
    assert "match no operator" not in result.stderr
    write_json(work / "trace.json", _string_correlations(_one_step("new"), lambda c: f"c{c}"))
    assert "correlation" in cli(work, "import", "kineto", "trace.json", "-o", "out.json", code=2).stderr


def test_unattributed_gpu_events_are_reported(work):
    from tests.test_import_kineto import _one_step
    document = _one_step("new")
    for event in document["traceEvents"]:
        if event.get("cat") == "kernel":
            event["args"].pop("correlation", None)
            event["args"].pop("External id", None)
            break
    write_json(work / "trace.json", document)
    result = cli(work, "import", "kineto", "trace.json", "-o", "out.json", code=0, outputs=("out.json",))
    assert "note: 1 GPU events" in result.stderr


# ----------------------------------------------------------------------------- 8: first-time users


def test_plan_budget_larger_than_the_gpu_says_where_it_came_from(work):
    plan = json.loads((work / "plan.json").read_text())
    plan["budget_bytes"] = 40 * 2**30
    write_json(work / "plan.json", plan)
    result = cli(work, "simulate", "p.json", "plan.json", "--hardware", "v100-16gb-pcie3", code=2)
    assert "plan.json: budget_bytes" in result.stderr and "--budget" in result.stderr
    cli(work, "simulate", "p.json", "plan.json", "--hardware", "v100-16gb-pcie3", "--budget", "1GiB", code=0)


def test_trace_without_torch_names_the_extra(work):
    blocked = "import sys; sys.modules['torch'] = None; import cli; cli.main()"
    for args in (["trace", "--list"], ["trace", "gpt2", "-o", "g.json"]):
        done = subprocess.run([sys.executable, "-c", blocked, *args], cwd=work, capture_output=True, text=True,
                              timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert done.returncode == 2, done.stderr
        assert "pip install -e '.[trace]'" in done.stderr and len(done.stderr.splitlines()) == 1


def test_measured_profile_defaults_to_its_gpu(work):
    data = two_layer()
    data["source"] = {"kind": "measured", "device": "NVIDIA H100 80GB HBM3"}
    write_json(work / "m.json", data)
    result = cli(work, "simulate", "m.json", code=0)
    assert result.stdout.startswith("two-layer on h100-80gb-pcie5")
    assert "note: hardware h100-80gb-pcie5" in result.stderr
    data["source"]["device"] = "Some Accelerator 9000"
    write_json(work / "m.json", data)
    result = cli(work, "simulate", "m.json", code=0)
    assert "matches no preset" in result.stderr and result.stdout.startswith("two-layer on a100-40gb-pcie4")


def test_synth_help_shows_defaults(work):
    text = cli(work, "synth", "--help", code=0).stdout
    assert "transformer 12" in text and "mlp 4096" in text


def test_read_document_of_every_shipped_file_is_unchanged():
    """The new reader (regular files, caps, libyaml) reads the presets as before."""
    for path in preset_dir().glob("*.yaml"):
        assert read_document(path) == yaml.safe_load(path.read_text())
