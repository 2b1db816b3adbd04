"""``swapplan compare``: rows, plans, charts and the report; resume, isolation of a failing
cell, Ctrl-C, and the same rows from one process, a local pool and a Dask cluster."""
from __future__ import annotations

import csv
import json
import multiprocessing
import os
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import app
from compare.cells import COLUMNS, run_cell
from compare.grid import grids
from compare.sweep import expand_cells, run_sweep
from planner.core.registry import REGISTRY, Draft, PlannerSpec
from simulator.catalog import open_profile
from simulator.errors import InputError

PROFILE = "synth-transformer-l12-b16-s1024"
HW = "a100-40gb-pcie4"
TIMING = ("planning_seconds",)


def _stable(rows):
    """Rows without what depends on the machine's speed."""
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    result = CliRunner().invoke(app, ["compare", PROFILE, "--planners", "none,lms,g10", "--budgets", "90%,50%,1GiB",
                                      "--hardware", HW, "--jobs", "1", "--out", str(out)])
    return out, result


def test_a_small_sweep_writes_rows_plans_a_chart_and_a_report(small_sweep):
    out, result = small_sweep
    assert result.exit_code == 0, result.output
    with open(out / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 9 and list(rows[0]) == list(COLUMNS)
    by = {(r["planner"], r["budget"]): r for r in rows}
    # nothing fits 90% without moving anything; g10 fits 50%, and its plan is on disk and loads
    assert by[("none", "90%")]["status"] == by[("none", "50%")]["status"] == "infeasible"
    assert by[("none", "90%")]["overhead"] == "" and "waits for memory" in by[("none", "90%")]["error"]
    assert by[("g10", "50%")]["status"] == "ok" and float(by[("g10", "50%")]["overhead"]) >= 0
    assert float(by[("g10", "50%")]["iteration_us"]) >= float(by[("g10", "50%")]["lower_bound_us"])
    plan = json.loads((out / by[("g10", "50%")]["plan_file"]).read_text())
    assert plan["planner"]["name"] == "g10" and plan["budget_bytes"] == int(by[("g10", "50%")]["budget_bytes"])
    assert by[("g10", "1GiB")]["status"] == "below-floor" and "below the smallest budget" in by[("g10", "1GiB")]["error"]
    # a PNG chart that reads back as an image, and a page holding the table and the chart
    png = out / f"{PROFILE}__{HW}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    assert matplotlib.image.imread(png).shape[0] > 100
    page = _parse(out / "report.html")
    assert page.images == 3 and "lower bound" in page.text and page.cells.count("below-floor") == 6
    assert "best" in page.classes
    # the printed table marks the best per budget
    assert "* best per budget" in result.output and "0.0% *" in result.output


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.cells, self.text, self.classes, self._in_td = 0, [], "", set(), False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            assert attrs["src"].startswith("data:image/png;base64,")
            self.images += 1
        self._in_td = tag == "td"
        if attrs.get("class"):
            self.classes.add(attrs["class"])

    def handle_data(self, data):
        self.text += data
        if self._in_td:
            self.cells.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    page.close()
    return page


def test_rerunning_skips_finished_cells_and_redoes_a_missing_one(small_sweep, tmp_path):
    out, _ = small_sweep
    copy = tmp_path / "again"
    import shutil
    shutil.copytree(out, copy)
    data = json.loads((copy / "results.json").read_text())
    before = data["rows"]
    data["rows"] = [r for r in before if not (r["planner"] == "lms" and r["budget"] == "90%")]
    (copy / "results.json").write_text(json.dumps(data))
    cells = expand_cells([PROFILE], [HW], ["none", "lms", "g10"], ["90%", "50%", "1GiB"])
    outcome = run_sweep(cells, copy)
    assert (outcome.ran, outcome.resumed) == (1, 8)
    assert _stable(outcome.rows) == _stable(before)


def _register(monkeypatch, name, func):
    monkeypatch.setitem(REGISTRY, name, PlannerSpec(name, func, "test planner", (), False, "", False))


def _raises(profile, hardware, budget, *, options):
    raise ZeroDivisionError("planner bug")


def _sleeps(profile, hardware, budget, *, options):
    time.sleep(30)
    return Draft()


def _dies(profile, hardware, budget, *, options):
    os._exit(9)


def test_a_crashing_or_hanging_planner_is_recorded_and_the_sweep_goes_on(monkeypatch, tmp_path):
    _register(monkeypatch, "raises", _raises)
    _register(monkeypatch, "sleeps", _sleeps)
    cells = expand_cells([PROFILE], [HW], ["raises", "sleeps", "lms"], ["90%"], time_limit=0.2)
    started = time.monotonic()
    outcome = run_sweep(cells, tmp_path)
    assert time.monotonic() - started < 10
    status = {r["planner"]: r for r in outcome.rows}
    assert status["raises"]["status"] == "error" and "ZeroDivisionError: planner bug" in status["raises"]["error"]
    assert status["sleeps"]["status"] == "timeout" and "time limit 0.2 s" in status["sleeps"]["error"]
    assert status["lms"]["status"] == "ok"
    assert [r["planner"] for r in outcome.failed] == ["raises"]


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork",
                    reason="the test planner reaches pool workers only when they are forked")
def test_a_worker_that_dies_fails_only_its_cell(monkeypatch, tmp_path):
    _register(monkeypatch, "dies", _dies)
    cells = expand_cells([PROFILE], [HW], ["lms", "dies", "g10"], ["90%", "70%"])
    outcome = run_sweep(cells, tmp_path, jobs=2)
    status = {(r["planner"], r["budget"]): r["status"] for r in outcome.rows}
    assert status[("dies", "90%")] == status[("dies", "70%")] == "error"
    assert all(status[(p, b)] == "ok" for p in ("lms", "g10") for b in ("90%", "70%"))


def test_ctrl_c_keeps_finished_cells_and_a_rerun_finishes(tmp_path):
    cells = expand_cells([PROFILE], [HW], ["none", "lms"], ["90%", "70%", "50%"])

    def interrupt_after_two(done, total, row):
        if done == 2:
            raise KeyboardInterrupt

    first = run_sweep(cells, tmp_path, progress=interrupt_after_two)
    assert first.interrupted and len(first.rows) == 2
    assert len(json.loads((tmp_path / "results.json").read_text())["rows"]) == 2
    second = run_sweep(cells, tmp_path)
    assert not second.interrupted and (second.ran, second.resumed) == (4, 2) and len(second.rows) == 6


def test_rows_do_not_depend_on_jobs_or_on_dask(tmp_path):
    cells = expand_cells([PROFILE, "synth-mlp-l16-w8192-b1024"], [HW], ["lms", "g10", "capuchin"], ["90%", "60%"])
    one = run_sweep(cells, tmp_path / "one", jobs=1).rows
    pool = run_sweep(cells, tmp_path / "pool", jobs=2).rows
    assert _stable(one) == _stable(pool)
    distributed = pytest.importorskip("distributed", reason="the dask extra is not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        dask = run_sweep(cells, tmp_path / "dask", dask_address=cluster.scheduler_address).rows
    assert _stable(one) == _stable(dask)
    for name in ("one", "pool", "dask"):
        plans = sorted(p.name for p in (tmp_path / name / "plans").iterdir())
        assert plans == sorted(p.name for p in (tmp_path / "one" / "plans").iterdir())
        for plan in plans:
            assert (tmp_path / name / "plans" / plan).read_bytes() == (tmp_path / "one" / "plans" / plan).read_bytes()


def test_bad_input_fails_before_any_work(tmp_path):
    runner = CliRunner()
    for args, words in ((["--planners", "nope"], "unknown planner or family 'nope'"),
                        (["--budgets", "lots"], "--budgets"),
                        (["--hardware", "no-such-gpu"], "no-such-gpu")):
        result = runner.invoke(app, ["compare", PROFILE, "--out", str(tmp_path / "x"), *args])
        assert result.exit_code == 2 and words in result.output, result.output
    assert not (tmp_path / "x").exists()
    (tmp_path / "file").write_text("")
    result = runner.invoke(app, ["compare", PROFILE, "--planners", "none", "--out", str(tmp_path / "file")])
    assert result.exit_code == 2 and "is not a folder" in result.output
    with pytest.raises(InputError, match="cannot reach the scheduler"):
        run_sweep(expand_cells([PROFILE], [HW], ["none"], ["90%"]), tmp_path / "d", dask_address="tcp://127.0.0.1:9")


def test_json_output_is_the_rows_and_budgets_above_the_gpu_are_capped(tmp_path):
    result = CliRunner().invoke(app, ["compare", PROFILE, "--planners", "lms", "--budgets", "300%", "--hardware", HW,
                                      "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 1 and rows[0]["capped"] is True and rows[0]["budget_bytes"] == 40 * 2**30
    assert grids(rows)[0].best == {"300%": ["lms"]}


def test_run_cell_reports_link_bytes_and_the_bound():
    cell = expand_cells([PROFILE], [HW], ["g10"], ["50%"])[0]
    row, text = run_cell(cell)
    assert row["bytes_pcie_up"] > 0 and row["bytes_pcie_down"] > 0 and row["bound"]
    assert json.loads(text)["predicted"]["iteration_us"] == row["iteration_us"]


def test_budgets_that_come_to_the_same_bytes_are_planned_once(monkeypatch, tmp_path):
    # two percentages a machine caps to its memory are one cell (reported once, under the
    # first, with a note); the same bytes asked twice without a cap are planned once too
    calls = []

    def counted(profile, hardware, budget, *, options):
        calls.append(budget)
        return Draft()

    _register(monkeypatch, "counted", counted)
    notes = []
    cells = expand_cells([PROFILE], [HW], ["counted"], ["300%", "400%", "50%"], notes=notes)
    assert [c.budget for c in cells] == ["300%", "50%"] and len(notes) == 1 and "300%, 400%" in notes[0]
    outcome = run_sweep(cells, tmp_path)
    assert len(calls) == 2 and len(outcome.rows) == 2 and outcome.ran == 2
    assert [r["budget"] for r in outcome.rows if r["capped"]] == ["300%"]
    half = str(int(open_profile(PROFILE).peak_bytes * 50 / 100.0))   # the bytes 50% comes to
    twins = expand_cells([PROFILE], [HW], ["counted"], ["50%", half])
    calls.clear()
    outcome = run_sweep(twins, tmp_path / "twins")
    assert len(calls) == 1 and len(outcome.rows) == 2
    first, second = outcome.rows
    assert {k: v for k, v in first.items() if k not in ("budget", "plan_file", "key")} == \
        {k: v for k, v in second.items() if k not in ("budget", "plan_file", "key")}
