"""The command line: outputs, --json fields, one-line errors and exit statuses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import app
from simulator.plan import offload, plan_json, prefetch, Plan
from simulator.profile import profile_sha256, save_profile

SWAPPLAN = [sys.executable, "-c", "import cli; cli.main()"]


def run(*args, debug=False):
    return CliRunner().invoke(app, list(args), obj={"debug": debug})


@pytest.fixture
def profile_file(two_layer, tmp_path):
    path = tmp_path / "two.json"
    save_profile(two_layer, path)
    return path


def test_info_text(profile_file):
    result = run("info", str(profile_file))
    assert result.exit_code == 0
    assert "two-layer" in result.output
    assert "450 B" in result.output and "at op b1" in result.output


def test_info_json_stable_fields(profile_file):
    result = run("info", str(profile_file), "--json")
    data = json.loads(result.output)
    assert data["name"] == "two-layer"
    assert (data["ops"], data["tensors"], data["peak_bytes"], data["peak_op"]) == (7, 9, 450, "b1")
    assert data["ideal_us"] == 80.0
    assert data["bytes_by_kind"]["weight"] == 200 and data["bytes_by_kind"]["gradient"] == 240
    assert data["largest_tensors"][0]["bytes"] == 100


def test_validate_profile_and_plan(two_layer, profile_file, tmp_path):
    plan = Plan(two_layer.name, (offload("a1", "f2"), prefetch("a1", "loss", "b2")),
                profile_sha256=profile_sha256(two_layer))
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan_json(plan))
    result = run("validate", str(profile_file), str(plan_path))
    assert result.exit_code == 0, result.output
    assert "ok: profile two-layer" in result.output and "2 actions" in result.output


def test_validate_bad_plan_exit_2(profile_file, tmp_path):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps({"format": "swapplan-plan/1", "profile": {"name": "x"},
                                     "actions": [{"kind": "drop", "tensor": "ghost", "after": "f1"}]}))
    result = run("validate", str(profile_file), str(plan_path))
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == \
        f"error: {plan_path}: actions[0] (drop ghost).tensor: unknown tensor 'ghost'"


def test_hardware_json():
    data = json.loads(run("hardware", "--json").output)
    names = [hw["name"] for hw in data]
    from simulator.hardware import preset_names
    assert "a100-40gb-pcie4" in names and "a100-40gb-32gb-pcie4" in names and names == preset_names()
    a100 = data[names.index("a100-40gb-pcie4")]
    assert a100["gpu"]["memory_bytes"] == 40 * 2**30 and a100["pcie"]["h2d_gbps"] == 24


def test_hardware_text_lists_every_preset():
    out = run("hardware").output
    for name in ("v100-16gb-pcie3", "h100-80gb-pcie5", "rtx4090-24gb-pcie4"):
        assert name in out


def test_missing_file_one_line_exit_2(tmp_path):
    result = run("info", str(tmp_path / "none.json"))
    assert result.exit_code == 2
    assert result.output == f"error: {tmp_path / 'none.json'}: no such file\n"


def test_unknown_profile_name_lists_shipped():
    result = run("info", "no-such-model")
    assert result.exit_code == 2 and "no shipped profile of that name" in result.output


def test_internal_errors_are_one_line(monkeypatch, profile_file):
    import simulator.catalog as catalog

    def boom(*a, **k):
        raise RuntimeError("kaput")
    monkeypatch.setattr(catalog, "profile_summary", boom)
    result = run("info", str(profile_file))
    assert result.exit_code == 3
    assert result.output.startswith("internal error: RuntimeError: kaput")


def _process(*args, cwd):
    env = dict(os.environ)
    return subprocess.run(SWAPPLAN + list(args), capture_output=True, text=True, cwd=cwd, env=env)


def test_real_process_bad_input_no_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "swapplan-profile/1", "name": "x", "tensors": [{"id": "a", "bytes": -1, "kind": "activation"}], "ops": []}')
    root = Path(__file__).resolve().parents[1]
    done = _process("info", str(bad), cwd=root)
    assert done.returncode == 2
    assert done.stderr == f"error: {bad}: tensors[0] (a).bytes: must be >= 0, got -1\n"
    assert "Traceback" not in done.stdout + done.stderr


def test_real_process_debug_anywhere_shows_traceback(tmp_path):
    root = Path(__file__).resolve().parents[1]
    done = _process("info", str(tmp_path / "none.json"), "--debug", cwd=root)
    assert done.returncode != 0 and "Traceback" in done.stderr and "InputError" in done.stderr


def test_usage_error_exit_2():
    assert run("synth", "rnn", "-o", "x.json").exit_code == 2


def test_synth_writes_a_valid_profile(tmp_path):
    out = tmp_path / "t.json.gz"
    result = run("synth", "transformer", "--layers", "2", "--width", "128", "--batch", "2", "--seq", "64", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out}: synth-transformer-l2-w128-b2-s64")
    data = json.loads(run("info", str(out), "--json").output)
    assert data["name"] == "synth-transformer-l2-w128-b2-s64" and data["ops_by_phase"]["optimizer"] > 0


def test_synth_bad_parameter_exit_2(tmp_path):
    result = run("synth", "mlp", "--layers", "0", "-o", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and result.output.startswith("error: <argument>: layers:")
    assert not (tmp_path / "x.json").exists()


def test_profiles_json_lists_shipped():
    rows = json.loads(run("profiles", "--json").output)
    names = {r["name"] for r in rows}
    assert {"synth-mlp-l16-w8192-b1024", "synth-cnn-l16-w128-b64-s224", "synth-transformer-l12-b16-s1024"} <= names
    for row in rows:
        assert set(row) >= {"name", "path", "ops", "peak_bytes", "ideal_us"}
        assert row["ops"] > 0 and row["peak_bytes"] > 0 and Path(row["path"]).is_file()


def test_shipped_profile_by_name():
    data = json.loads(run("info", "synth-mlp-l16-w8192-b1024", "--json").output)
    assert data["ops"] == 102


# ----------------------------------------------------------------------------- simulate

STABLE_RESULT_FIELDS = {"valid", "feasible", "rule", "op", "tensor", "reason", "iteration_us", "ideal_us",
                        "overhead", "stall_us", "stall_data_us", "stall_memory_us", "tail_us", "peak_bytes",
                        "bytes_h2d", "bytes_d2h", "bytes_ssd_read", "bytes_ssd_write"}


def _swap_plan_file(profile, tmp_path, actions):
    path = tmp_path / "plan.json"
    path.write_text(plan_json(Plan(profile.name, tuple(actions), profile_sha256=profile_sha256(profile))))
    return path


def test_simulate_without_plan_is_ideal(profile_file):
    result = run("simulate", str(profile_file), "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert STABLE_RESULT_FIELDS <= set(data)
    assert data["valid"] and data["feasible"] and data["iteration_us"] == data["ideal_us"] == 80.0
    assert data["peak_bytes"] == 450 and data["hardware"] == "a100-40gb-pcie4"


def test_simulate_infeasible_exit_1_still_prints_json(profile_file):
    result = run("simulate", str(profile_file), "--budget", "300", "--json")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["valid"] and not data["feasible"] and data["rule"] == "R10" and data["op"] == "b2"


def test_simulate_invalid_plan_exit_1(two_layer, profile_file, tmp_path):
    plan_path = _swap_plan_file(two_layer, tmp_path, [offload("a1", "f1"), prefetch("a1", "f1", "b2")])
    result = run("simulate", str(profile_file), str(plan_path))
    assert result.exit_code == 1
    assert "INVALID" in result.output and "R13" in result.output


def test_simulate_budget_percent_and_text_summary(two_layer, profile_file, tmp_path):
    plan_path = _swap_plan_file(two_layer, tmp_path, [offload("a1", "f2"), prefetch("a1", "loss", "b2")])
    result = run("simulate", str(profile_file), str(plan_path), "--budget", "100%")
    assert result.exit_code == 0, result.output
    assert "two-layer on a100-40gb-pcie4, budget 450 B: ok" in result.output
    assert "iteration" in result.output and "pcie_up 40 B (" in result.output and "pcie_down 40 B (" in result.output


def test_simulate_bad_budget_exit_2(profile_file):
    result = run("simulate", str(profile_file), "--budget", "lots")
    assert result.exit_code == 2 and result.output.startswith("error: <argument>: budget:")
    result = run("simulate", str(profile_file), "--budget", "1TiB")
    assert result.exit_code == 2 and "more than the GPU's memory" in result.output


def test_simulate_plan_for_another_profile_exit_2(two_layer, profile_file, tmp_path):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan_json(Plan("other", (), profile_sha256="0" * 64)))
    result = run("simulate", str(profile_file), str(plan_path))
    assert result.exit_code == 2 and "plan was made for another profile" in result.output


def test_simulate_writes_timeline_and_plot(two_layer, profile_file, tmp_path):
    plan_path = _swap_plan_file(two_layer, tmp_path, [offload("a1", "f2"), prefetch("a1", "loss", "b2")])
    trace, png = tmp_path / "t.json", tmp_path / "m.png"
    result = run("simulate", str(profile_file), str(plan_path), "--timeline", str(trace), "--plot", str(png))
    assert result.exit_code == 0, result.output
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert tracks == {"compute", "cpu", "h2d", "d2h", "ssd_read", "ssd_write"}
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"f1", "b2", "offload a1", "prefetch a1"} <= names
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"GPU memory (bytes)", "budget (bytes)", "pcie_up (GB/s)", "pcie_down (GB/s)"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- import

def test_import_kineto_writes_a_measured_profile(tmp_path):
    from tests.conftest import VGG13_ET, VGG13_TRACE
    out = tmp_path / "vgg13.json.gz"
    result = run("import", "kineto", str(VGG13_TRACE), "--et", str(VGG13_ET), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out}: kineto_trace, 252 ops")
    data = json.loads(run("info", str(out), "--json").output)
    assert data["source"]["timing"] == "measured" and data["bytes_by_kind"]["weight"] > 0


def test_import_kineto_bad_file_exit_2(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{}")
    result = run("import", "kineto", str(bad), "-o", str(tmp_path / "o.json"))
    assert result.exit_code == 2 and result.output.startswith(f"error: {bad}:")
    assert not (tmp_path / "o.json").exists()


# ----------------------------------------------------------------------------- plan, planners


def test_planners_lists_every_planner_with_parameters():
    data = json.loads(run("planners", "--json").output)
    names = {p["name"] for p in data}
    assert {"none", "vdnn", "lms", "capuchin", "flashneuron", "g10"} <= names
    vdnn = next(p for p in data if p["name"] == "vdnn")
    assert any(param["name"] == "mode" and param["choices"] for param in vdnn["params"])
    assert next(p for p in data if p["name"] == "g10")["moves_persistent"] is True
    assert "mode" in run("planners").output


def test_plan_writes_a_plan_that_simulates_as_predicted(tmp_path):
    out = tmp_path / "plan.json"
    result = run("plan", "synth-transformer-l12-b16-s1024", "--planner", "capuchin", "--budget", "60%",
                 "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["status"] == "heuristic" and summary["feasible"] and summary["actions"] > 0
    assert summary["planning_seconds"] >= 0
    # the planner report: its notes and the lower bound, which the plan cannot beat
    assert summary["notes"]["swaps"] + summary["notes"]["recomputes"] > 0 and summary["bound"] == "swap+recompute"
    assert summary["ideal_us"] <= summary["lower_bound_us"] <= summary["iteration_us"]
    assert summary["gap_to_bound"] == pytest.approx(summary["iteration_us"] / summary["lower_bound_us"] - 1)
    again = json.loads(run("simulate", "synth-transformer-l12-b16-s1024", str(out), "--json").output)
    assert again["iteration_us"] == summary["iteration_us"] and again["budget_bytes"] == summary["budget_bytes"]
    saved = json.loads(out.read_text())
    assert saved["predicted"]["iteration_us"] == summary["iteration_us"] and "seconds" not in saved["planner"]


def test_plan_is_byte_identical_across_runs(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        assert run("plan", "synth-cnn-l16-w128-b64-s224", "--planner", "g10", "--budget", "30%", "--seed", "7",
                   "-o", str(out)).exit_code == 0
    assert a.read_bytes() == b.read_bytes()


def test_plan_infeasible_exit_1_still_writes_plan(tmp_path):
    out = tmp_path / "plan.json"
    result = run("plan", "synth-transformer-l12-b16-s1024", "--planner", "none", "--budget", "60%", "-o", str(out))
    assert result.exit_code == 1 and "INFEASIBLE" in result.output
    assert json.loads(out.read_text())["planner"]["status"] == "infeasible"


def test_plan_bad_inputs_exit_2(tmp_path):
    cases = [
        (["--planner", "magic", "--budget", "90%"], "unknown planner 'magic'"),
        (["--planner", "vdnn", "--budget", "90%", "--param", "mode=fast"], "'fast' is not one of all, conv, dyn"),
        (["--planner", "vdnn", "--budget", "90%", "--param", "mode"], "expected key=value"),
        (["--planner", "lms", "--budget", "1MB"], "below the smallest budget planner 'lms' can meet"),
    ]
    for args, message in cases:
        result = run("plan", "synth-transformer-l12-b16-s1024", *args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.startswith("error: ") and message in result.output


# ----------------------------------------------------------------------------- trace


def test_trace_writes_a_profile(tmp_path):
    pytest.importorskip("torch", reason="tracing needs the trace extra (torch)")
    out = tmp_path / "g.json.gz"
    result = run("trace", "gpt2", "--batch", "1", "--seq", "32", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: gpt2-b1-s32" in result.output
    data = json.loads(run("info", str(out), "--json").output)
    assert data["source"]["kind"] == "traced" and data["ops_by_phase"]["backward"] > 0


def test_trace_unknown_model_exit_2(tmp_path):
    pytest.importorskip("torch", reason="tracing needs the trace extra (torch)")
    result = run("trace", "alexnet-9000", "-o", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "error: <argument>: model: unknown model 'alexnet-9000'" in result.output


def test_plan_caps_a_percentage_above_the_gpu_memory_with_a_note(profile_file, tmp_path):
    hw = tmp_path / "small.yaml"
    hw.write_text("name: small\ngpu: {memory: 400, fp32_tflops: 1, fp16_tflops: 1, hbm_gbps: 1}\n"
                  "pcie: {h2d_gbps: 1, d2h_gbps: 1}\nhost: {memory: 1GiB}\n")
    result = CliRunner().invoke(app, ["plan", str(profile_file), "--budget", "100%", "--hardware",
                                          str(hw), "--json"], obj={"debug": False})
    assert "planning for the GPU's memory" in result.stderr and "450 B" in result.stderr
    assert json.loads(result.stdout)["budget_bytes"] == 400
    result = run("plan", str(profile_file), "--budget", "450", "--hardware", str(hw))
    assert result.exit_code == 2 and "more than the GPU's memory" in result.output
