"""Nothing lost (issue 49): shared output folders, checks before the work, one line always.

Each case once lost results silently or made a user wait for work bound to fail; each
now asserts the exit status, the one line, and that no result was lost:

- two ``compare --out`` runs with other planners into one folder keep every row (in
  sequence and at the same time); a run killed at any point leaves valid results;
- compare's set-up error is one line (no banner before it);
- an output that cannot be written fails before any planning or tracing (a probe file);
- ``variants`` refuses a name an op has already (unless ``--replace``) and a name that is
  not printable text;
- a plan for a profile of the same name but other contents says the contents differ;
- ``train`` out of memory at batch 1 does not advise a smaller batch;
- ``replay`` refuses absurd scales before the work, and says how long a long one takes.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import app
from compare.results_folder import LOCK_FILE, ResultsFolder, merge_rows
from simulator.errors import InputError
from simulator.files import check_output_folder, check_outputs
from simulator.plan import Plan, plan_json
from simulator.profile import profile_sha256, save_profile

ROOT = Path(__file__).resolve().parents[1]
PLANNERS = "none,lms"


from tests.test_careless_second_pass import one_line_error, run  # noqa: E402  (the same CLI helpers)


def rows_of(folder: Path) -> list[dict]:
    return json.loads((folder / "results.json").read_text())["rows"]


@pytest.fixture
def profile(tmp_path, two_layer):
    path = tmp_path / "p.json"
    save_profile(two_layer, path)
    return path


@pytest.fixture
def unwritable(tmp_path) -> Path:
    """A folder this process cannot create files in: read-only for a user; for root (who
    writes anywhere) /proc/self, which takes no new files."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here, and root writes any folder")
    yield Path("/proc/self")


# ----------------------------------------------------------------------------- 1: a folder keeps every row


def test_two_compares_with_other_planners_keep_every_row(profile, tmp_path):
    out = tmp_path / "d"
    first = run("compare", profile, "--planners", "lms", "--budgets", "90%,50%", "--jobs", 1, "--out", out)
    assert first.exit_code == 0, first.output
    second = run("compare", profile, "--planners", "none", "--budgets", "90%,50%", "--jobs", 1, "--out", out)
    assert second.exit_code == 0, second.output
    assert "(with 2 of other runs)" in second.stdout
    rows = rows_of(out)
    assert sorted((r["planner"], r["budget"]) for r in rows) == [("lms", "50%"), ("lms", "90%"), ("none", "50%"),
                                                                ("none", "90%")]
    assert len((out / "results.csv").read_text().splitlines()) == 5      # the header and four rows
    again = run("compare", profile, "--planners", "lms", "--budgets", "90%,50%", "--jobs", 1, "--out", out)
    assert again.exit_code == 0 and "0 cells run, 2 already done" in again.stdout, again.output
    assert len(rows_of(out)) == 4
    # the report covers every row in the folder, not only the last run's
    assert "lms" in (out / "report.html").read_text() and "none" in (out / "report.html").read_text()


def _save_rows(path: str, name: str, count: int) -> None:
    folder = ResultsFolder(path, ["name", "n"])
    folder.open()
    mine = []
    for k in range(count):
        mine.append({"key": f"{name}{k}", "name": name, "n": k})
        folder.save(mine)


def test_runs_into_one_folder_at_the_same_time_keep_every_row(tmp_path):
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_save_rows, args=(str(tmp_path), name, 25)) for name in "abcd"]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    rows = rows_of(tmp_path)
    assert sorted(row["key"] for row in rows) == sorted(f"{name}{k}" for name in "abcd" for k in range(25))
    for name in "abcd":    # each run's rows in its own order
        assert [row["n"] for row in rows if row["name"] == name] == list(range(25))


def test_two_compares_at_the_same_time_keep_every_row(profile, tmp_path):
    out = tmp_path / "e"
    command = [sys.executable, "-c", "import cli; cli.main()", "compare", str(profile), "--budgets", "90%,50%",
               "--jobs", "1", "--out", str(out)]
    runs = [subprocess.Popen(command + ["--planners", planner], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for planner in ("lms", "none")]
    for process in runs:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    assert sorted((r["planner"], r["budget"]) for r in rows_of(out)) == [("lms", "50%"), ("lms", "90%"),
                                                                        ("none", "50%"), ("none", "90%")]


def test_a_folder_locked_too_long_is_refused_with_one_line_naming_the_holder(tmp_path):
    holder = ResultsFolder(tmp_path, ["n"])
    holder.open()
    other = ResultsFolder(tmp_path, ["n"], wait_s=0.2)
    with holder.locked():
        with pytest.raises(InputError) as caught:
            other.save([{"key": "k", "n": 1}])
    line = caught.value.line()
    assert f"is in use by process {os.getpid()} (" in line and "\n" not in line
    assert "wait for it to end or choose another folder" in line
    other.save([{"key": "k", "n": 1}])     # free again
    assert rows_of(tmp_path) == [{"key": "k", "n": 1}]


KILLED = """
import sys
from compare.results_folder import ResultsFolder
folder = ResultsFolder(sys.argv[1], ["n", "pad"])
folder.open()
mine = []
for k in range(100000):
    mine.append({"key": str(k), "n": k, "pad": "x" * 200})
    folder.save(mine)
    print(k + 1, flush=True)
"""


def test_a_run_killed_at_any_point_leaves_valid_results_with_every_saved_row(tmp_path):
    for attempt in range(4):
        out = tmp_path / f"k{attempt}"
        process = subprocess.Popen([sys.executable, "-c", KILLED, str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                                   text=True)
        saved = 0
        deadline = time.monotonic() + 0.3 + 0.15 * attempt
        while time.monotonic() < deadline or saved == 0:
            line = process.stdout.readline()
            if not line:
                break
            saved = int(line)
        process.send_signal(signal.SIGKILL)
        process.wait()
        rows = rows_of(out)                      # valid JSON
        assert len(rows) >= saved and [row["n"] for row in rows] == list(range(len(rows)))
        csv_lines = (out / "results.csv").read_text().splitlines()
        assert csv_lines[0] == "n,pad" and len(csv_lines) - 1 in (len(rows), len(rows) - 1)
        # the next run merges with what the killed one left, and tidies its temporary files
        folder = ResultsFolder(out, ["n", "pad"])
        assert len(folder.open()) == len(rows)
        folder.save([{"key": "new", "n": -1, "pad": ""}])
        assert len(rows_of(out)) == len(rows) + 1
        assert not [name for name in os.listdir(out) if name.endswith(".tmp")]


def test_merge_keeps_other_rows_and_each_runs_order():
    existing = [{"key": k} for k in ("x1", "a2", "x2")]
    mine = [{"key": "a1"}, {"key": "a2", "new": True}, {"key": "a3"}]
    assert [r["key"] for r in merge_rows(existing, mine)] == ["x1", "a1", "a2", "a3", "x2"]
    assert merge_rows(existing, mine)[2] == {"key": "a2", "new": True}
    assert [r["key"] for r in merge_rows([], mine)] == ["a1", "a2", "a3"]
    assert [r["key"] for r in merge_rows(existing, [{"key": "b"}])] == ["x1", "a2", "x2", "b"]


def test_a_results_file_of_another_kind_or_unreadable_is_one_line(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"kind": "fit", "columns": [], "rows": []}))
    with pytest.raises(InputError, match="holds results of 'fit', not 'compare'"):
        ResultsFolder(tmp_path, ["n"], kind="compare").check()
    (tmp_path / "results.json").write_text("{")
    with pytest.raises(InputError, match="cannot merge with it"):
        ResultsFolder(tmp_path, ["n"]).check()


# ----------------------------------------------------------------------------- 2: one line, always


def test_compare_out_under_a_file_is_one_line_and_no_banner(profile, tmp_path):
    (tmp_path / "f").write_text("")
    result = run("compare", profile, "--planners", "lms", "--budgets", "90%", "--out", tmp_path / "f" / "x")
    line = one_line_error(result)
    assert "is a file, not a folder" in line and "compare:" not in result.stderr
    assert result.stdout == ""


def test_compare_into_a_folder_it_cannot_write_is_one_line(profile, unwritable):
    out = unwritable / "cmp"
    result = run("compare", profile, "--planners", "lms", "--budgets", "90%", "--out", out)
    assert "cannot write in folder" in one_line_error(result)
    assert not out.exists()


# ----------------------------------------------------------------------------- 3: outputs checked before the work


def test_plan_into_a_folder_it_cannot_write_fails_before_planning(profile, unwritable, monkeypatch):
    import planner.core.api

    def never(*args, **kwargs):
        raise AssertionError("planned before checking the output")

    monkeypatch.setattr(planner.core.api, "make_plan", never)
    started = time.monotonic()
    line = one_line_error(run("plan", profile, "--planner", "autotm", "--budget", "50%", "-o", unwritable / "a.json"))
    assert time.monotonic() - started < 2
    assert line.startswith(f"error: {unwritable / 'a.json'}: cannot write in folder '{unwritable}': ")


def test_every_output_check_probes_its_folder(tmp_path, unwritable):
    before = set(os.listdir(tmp_path))
    check_outputs([("-o", tmp_path / "a.json"), ("--plot", tmp_path / "b.png")])
    assert set(os.listdir(tmp_path)) == before             # the probe file is gone
    with pytest.raises(InputError, match="cannot write in folder"):
        check_outputs([("-o", tmp_path / "a.json"), ("--timeline", unwritable / "t.json")])
    check_output_folder(tmp_path / "new" / "deeper", "--out", lambda relative: False)
    assert not (tmp_path / "new").exists()                 # checked, nothing created


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_trace_into_proc_fails_before_the_trace_with_the_right_message(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="trace needs torch (the 'trace' extra)")
    import tracer.pytorch.trace

    monkeypatch.setattr(tracer.pytorch.trace, "trace", lambda *a, **k: pytest.fail("traced before the check"))
    line = one_line_error(run("trace", "gpt2", "-o", "/proc/self/x.json"))
    assert line == ("error: /proc/self/x.json: cannot write in folder '/proc/self': it takes no new files (a special "
                    "file system?)")


def test_trace_density_batch_above_the_batch_is_refused_before_the_trace(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="trace needs torch (the 'trace' extra)")
    import tracer.pytorch.trace

    monkeypatch.setattr(tracer.pytorch.trace, "capture", lambda *a, **k: pytest.fail("traced before the check"))
    line = one_line_error(run("trace", "runtime.small_models:mlp", "--batch", 4, "--density", "--density-batch", 8,
                              "-o", tmp_path / "o.json"))
    assert line == ("error: <argument>: density-batch: 8 is more than the traced batch (4): give at most 4")
    assert not (tmp_path / "o.json").exists()


# ----------------------------------------------------------------------------- 4: variants


def _variants(profile, tmp_path, content, *extra, source="v.csv", out="m.json"):
    (tmp_path / source).write_text(content)
    return run("variants", profile, "--from", tmp_path / source, "-o", tmp_path / out, *extra)


def test_variants_refuses_an_existing_name_unless_replace(profile, tmp_path):
    first = _variants(profile, tmp_path, "f1,fast,5,0\n", out="m1.json")     # no header: values in order
    assert first.exit_code == 0 and "1 variants added" in first.stdout, first.output
    line = one_line_error(_variants(tmp_path / "m1.json", tmp_path, "f1,fast,9,0\n", out="m2.json"))
    assert "line 1.name: op 'f1' of profile 'two-layer' has a variant 'fast' already: give --replace" in line
    assert not (tmp_path / "m2.json").exists()
    replaced = _variants(tmp_path / "m1.json", tmp_path, "op,name,time_us,workspace_bytes\nf1,fast,9,0\n",
                         "--replace", out="m2.json")
    assert replaced.exit_code == 0 and "0 variants added, 1 replaced" in replaced.stdout, replaced.output
    ops = json.loads((tmp_path / "m2.json").read_text())["ops"]
    assert [v["time_us"] for v in ops[0]["variants"]] == [9.0]


@pytest.mark.parametrize("name", ["a\x00b", "tab\there", "bell\x07"])
def test_variants_refuses_a_name_that_is_not_printable(profile, tmp_path, name):
    line = one_line_error(_variants(profile, tmp_path, f"op,name,time_us,workspace_bytes\nf1,{name},5,0\n"))
    assert "line 2.name: must be printable text, got " in line and "\x00" not in line
    assert not (tmp_path / "m.json").exists()


def test_a_first_row_that_is_neither_header_nor_values_is_the_header_error(profile, tmp_path):
    line = one_line_error(_variants(profile, tmp_path, "op,name,time,workspace\nf1,a,1,0\n"))
    assert "line 1: expected the header op,name,time_us,workspace_bytes (or a first row of values" in line


# ----------------------------------------------------------------------------- 5: messages that say what is wrong


def test_a_plan_for_a_profile_of_the_same_name_says_the_contents_differ(tmp_path, two_layer_dict):
    from simulator.profile import profile_from_dict
    before = profile_from_dict(two_layer_dict)
    plan = tmp_path / "plan.json"
    plan.write_text(plan_json(Plan(before.name, (), profile_sha256=profile_sha256(before))))
    two_layer_dict["ops"][0]["time_us"] = 11.0          # traced again: the same name, other contents
    after = profile_from_dict(two_layer_dict)
    save_profile(after, tmp_path / "p.json")
    line = one_line_error(run("simulate", tmp_path / "p.json", plan))
    old, new = profile_sha256(before)[:12], profile_sha256(after)[:12]
    assert "another profile of the same name 'two-layer': the contents differ" in line
    assert f"sha256 {old}... in the plan, {new}... of this profile" in line


def test_train_out_of_memory_advises_a_smaller_batch_only_where_there_is_one():
    from runtime.train import out_of_memory_problem
    assert out_of_memory_problem("m", 4, None, "x").endswith("try a smaller --batch (or --seq)")
    at_one = out_of_memory_problem("m", 1, 512, "x")
    assert "--batch" not in at_one and at_one.endswith("try a smaller --seq")
    smallest = out_of_memory_problem("m", 1, None, "x")
    assert "smaller" not in smallest and smallest.endswith("run it on a machine with more memory")


def test_the_docs_give_compares_planners_default_as_the_code_does():
    option = next(p for p in app.commands["compare"].params if p.name == "planner_list")
    text = (ROOT / "docs" / "cli.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `--planners a,b,...`"))
    assert f"default `{option.default}`" in row


# ----------------------------------------------------------------------------- 6: replay's scales


@pytest.fixture
def replay_files(tmp_path, two_layer):
    save_profile(two_layer, tmp_path / "p.json")
    (tmp_path / "plan.json").write_text(plan_json(Plan(two_layer.name, (), profile_sha256=profile_sha256(two_layer),
                                                       budget_bytes=10**6)))
    return tmp_path / "p.json", tmp_path / "plan.json"


def test_replay_refuses_a_time_scale_too_small_to_time(replay_files):
    line = one_line_error(run("replay", *replay_files, "--time-scale", "1e-9"))
    assert re.search(r"--time-scale: 1e-09 squeezes the [0-9.]+ us iteration into .* less than the 10 ms a replay "
                     r"can time: give at least [0-9.e+]+ \(auto aims at 3 s\)", line), line


def test_replay_size_scale_beyond_a_process_limit_is_refused_before_the_work(replay_files, monkeypatch):
    import executor.api
    import simulator.host_memory

    monkeypatch.setattr(simulator.host_memory, "memory_headroom",
                        lambda: (1000, "this process's address-space limit (ulimit -v)"))
    monkeypatch.setattr(executor.api, "simulate", lambda *a, **k: pytest.fail("simulated before the check"))
    line = one_line_error(run("replay", *replay_files, "--size-scale", "1"))
    assert "--size-scale: the replay at --size-scale 1" in line
    assert "this process's address-space limit (ulimit -v) leaves 1000 B: give a smaller --size-scale" in line


def test_a_long_replay_says_how_long_before_it_starts():
    from executor.api import check_duration
    said = []
    check_duration(1_080_000, 1000, True, said.append)           # a 1.08 s iteration x 1000
    assert said == ["this replay takes about 18 min of real time (--time-scale 1000 x the 1.08 s iteration); "
                    "Ctrl-C stops it, a smaller --time-scale shortens it"]
    said.clear()
    check_duration(1_080_000, 10, True, said.append)
    assert said == []


def test_the_lock_file_is_one_of_the_folders_own_files(tmp_path):
    folder = ResultsFolder(tmp_path, ["n"])
    assert folder.writes(Path(LOCK_FILE)) and folder.writes(Path("results.json"))
    assert not folder.writes(Path("p.json"))
