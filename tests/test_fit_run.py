"""fit end to end on a small model: each family's edge is a real edge (the plan at the
largest batch trains for real within the memory, bit-equal, and the next batch's plan is
refused), a rerun reads everything from its folder, and bad input is one line."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("torch", reason="fit traces models: needs the trace extra (make test installs it)")

from cli import app  # noqa: E402
from fit.api import families_of, fit, make_spec  # noqa: E402
from fit.run import FitRequest  # noqa: E402

MODEL = "runtime.small_models:blocks"
MEMORY = 4 * 2**20


def _request(memory=MEMORY, planners=("none", "lms", "chen"), start=16):
    spec = make_spec(MODEL, None, "a100-40gb-pcie4", "batch", None, None, None, "fp32", None, "adamw", False)
    return FitRequest(spec, memory, families_of(list(planners)), start=start, limit=4096)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """Three families to their edges (about half a minute): its tests are `make test-slow`'s."""
    out = tmp_path_factory.mktemp("fit")
    summary, state = fit(_request(), str(out), jobs=1)
    return out, summary, state


@pytest.fixture(scope="module")
def small_fitted(tmp_path_factory):
    """Two families in a 1 MiB memory from batch 1 (a few seconds): `make test`'s fit."""
    out = tmp_path_factory.mktemp("small-fit")
    summary, state = fit(_request(2**20, ("none", "chen"), start=1), str(out), jobs=1)
    return out, summary, state


def _family(summary, name):
    return next(row for row in summary["families"] if row["family"] == name)


@pytest.mark.slow
def test_the_summary_has_every_family_and_field(fitted):
    out, summary, _ = fitted
    assert summary["memory_bytes"] == MEMORY
    assert [row["family"] for row in summary["families"]] == ["baseline", "swap", "recompute"]
    for row in summary["families"]:
        assert row["max"] >= 1 and row["iteration_us"] > 0 and row["throughput"] > 0
        assert row["wall"] == "memory" and row["next_size"] == row["max"] + 1 and row["next_over_bytes"] > 0
        assert (out / row["plan_file"]).is_file()
    written = json.loads((out / "results.json").read_text())
    assert [r["max"] for r in written["families"]] == [r["max"] for r in summary["families"]]
    # the techniques reach further than the framework alone
    assert _family(summary, "swap")["max"] > _family(summary, "baseline")["max"]
    assert _family(summary, "recompute")["max"] > _family(summary, "baseline")["max"]


@pytest.mark.slow
def test_each_edge_was_tried_on_both_sides(fitted):
    _, summary, _ = fitted
    for row in summary["families"]:
        fits = {p["size"]: p["fits"] for p in row["points"]}
        assert fits[row["max"]] is True and fits[row["max"] + 1] is False


@pytest.mark.parametrize("family", ["swap", "recompute"])
@pytest.mark.slow
def test_the_largest_batch_trains_for_real_within_the_memory_and_the_next_is_refused(fitted, family):
    from runtime.interpreter import PlanRefused
    from runtime.train import train

    _, summary, _ = fitted
    row = _family(summary, family)
    report = train(MODEL, planner=row["planner"], budget=MEMORY, batch=row["max"])
    assert report["bit_equal"], report["differences"]
    assert report["peak_bytes"] <= MEMORY
    with pytest.raises(PlanRefused):
        train(MODEL, planner=row["planner"], budget=MEMORY, batch=row["max"] + 1)


@pytest.mark.slow
def test_a_rerun_reads_every_trace_and_probe_from_the_folder(fitted):
    out, summary, _ = fitted
    again, state = fit(_request(), str(out), jobs=1)
    assert state.ran == 0 and state.traced == 0 and state.resumed > 0
    assert [r["max"] for r in again["families"]] == [r["max"] for r in summary["families"]]
    assert again["families"] == summary["families"]


@pytest.mark.parametrize("args,words", [
    (["no-such-model", "--memory", "1GiB"], "unknown model"),
    ([MODEL, "--memory", "100GiB"], "more than the GPU"),
    ([MODEL, "--axis", "seq", "--global-batch", "64"], "--global-batch"),
    ([MODEL, "--step", "64"], "--step"),
    ([MODEL, "--reserve", "40GiB"], "leaves no memory"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, tmp_path):
    result = CliRunner().invoke(app, ["fit", *args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], result.output
    assert not (tmp_path / "o").exists()


def test_an_output_folder_under_a_file_fails_before_any_trace(tmp_path):
    (tmp_path / "f").write_text("x")
    result = CliRunner().invoke(app, ["fit", MODEL, "--memory", "4MiB", "--out", str(tmp_path / "f" / "x")])
    assert result.exit_code == 2 and "error:" in result.output and "fit:" not in result.output


def test_the_report_shows_every_family_its_wall_and_the_chart(small_fitted, tmp_path):
    """On the small fit (the report's rows and chart do not depend on the fit's size)."""
    from fit.report import write_report

    _, summary, _ = small_fitted
    page = write_report(summary, tmp_path)
    text = page.read_text()
    assert text.count("<tr>") == 1 + len(summary["families"])
    for row in summary["families"]:
        assert f"<td>{row['family']}</td><td>{row['max']}</td>" in text
        assert row["plan_file"] in text
    assert "data:image/png;base64," in text and (tmp_path / "fit.png").stat().st_size > 10_000


@pytest.mark.slow
def test_a_real_browser_renders_the_report(fitted, tmp_path):
    import shutil
    import subprocess

    from fit.report import write_report

    browsers = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    browser = next((shutil.which(name) for name in browsers if shutil.which(name)), None)
    if browser is None:
        pytest.skip(f"no headless browser on this machine (looked for {', '.join(browsers)})")
    page = write_report(fitted[1], tmp_path)
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p'}",
                    "--window-size=1000,1200", f"--screenshot={shot}", page.resolve().as_uri()],
                   capture_output=True, timeout=120, check=False)
    import numpy as np
    from PIL import Image
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=int)
    assert float((pixels.sum(axis=2) < 600).mean()) > 0.01, "the page looks blank"


def test_ctrl_c_keeps_finished_probes_and_a_rerun_resumes(tmp_path):
    from fit.run import run_fit

    heard = []

    def say(line):
        heard.append(line)
        if sum("fits" in h or "does not fit" in h for h in heard) == 3:
            raise KeyboardInterrupt

    small = _request(2**20, ("none", "chen"), start=1)
    state = run_fit(small, str(tmp_path), jobs=1, say=say)
    assert state.interrupted and state.ran >= 3
    kept = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(kept) == state.ran
    again = run_fit(small, str(tmp_path), jobs=1)
    assert not again.interrupted and again.resumed == state.ran
    assert again.traced < len({k for k, _ in again.rows})      # the traces made before were read back


@pytest.mark.slow
def test_a_probe_held_to_what_the_caching_allocator_reserves(fitted):
    from fit.probe import Probe, run_probe
    from fit.traces import Traced

    out, summary, _ = fitted
    edge = next(r for r in json.loads((out / "results.json").read_text())["rows"]
                if r["family"] == "recompute" and r["size"] == _family(summary, "recompute")["max"])
    path = next((out / "traces").glob("*.json.gz"))      # any cached trace: find the edge's by its digest
    for candidate in (out / "traces").glob("*.meta.json"):
        if json.loads(candidate.read_text())["sha256"] == edge["sha256"]:
            path = candidate.with_name(candidate.name.replace(".meta.json", ".json.gz"))
    traced = Traced(1, str(path), edge["sha256"], edge["profile"])
    probe = Probe.make(1, edge["size"], "recompute", "chen", traced, "a100-40gb-pcie4", "a100-40gb-pcie4", MEMORY,
                       allocator="caching")
    row, plan_text = run_probe(probe)
    assert row["reserved_bytes"] is not None and row["reserved_bytes"] >= edge["peak_bytes"]
    assert row["key"] != edge["key"]           # another question, another row
    if row["fits"]:
        assert row["reserved_bytes"] <= MEMORY and plan_text is not None
    else:
        assert row["wall"] == "memory" and row["over_bytes"] > 0 and "caching allocator" in row["wall_text"]


def test_a_fit_over_ranks_holds_each_rank_to_the_memory(tmp_path):
    """--world 4 --strategy zero3: each size is one rank's, sharded before it is planned; the
    baseline's edge is where the rank's own no-swap peak passes the memory, and throughput
    counts every rank's samples (issue 51)."""
    from dataclasses import replace

    from shard import shard_profile
    from simulator.hardware import load_hardware
    from tracer.pytorch.trace import trace

    request = _request(2**20, ("none",), start=1)
    spec = replace(request.spec, hardware="rtx4090-24gb-pcie4-x4", strategy="zero3", world=4)
    summary, _ = fit(replace(request, spec=spec), str(tmp_path), jobs=1)
    row = _family(summary, "baseline")
    assert (summary["strategy"], summary["world"]) == ("zero3", 4)
    assert row["throughput"] == pytest.approx(4 * row["max"] / (row["iteration_us"] / 1e6))
    hw = load_hardware("rtx4090-24gb-pcie4-x4")

    def rank_peak(batch):
        return shard_profile(trace(MODEL, batch=batch, hardware=hw), "zero3", 4).peak_bytes

    assert rank_peak(row["max"]) <= 2**20 < rank_peak(row["max"] + 1)


def test_world_needs_a_strategy_and_a_machine_that_has_the_gpus(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["fit", MODEL, "--world", "4", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--world 4 needs a strategy" in result.output
    result = runner.invoke(app, ["fit", MODEL, "--world", "4", "--strategy", "zero3", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "4 ranks, but a100-40gb-pcie4 has no interconnect section" in result.output
