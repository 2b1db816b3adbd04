"""No command writes over one of its inputs (issue 33): every writing option of every
command, pointed at each of the command's input files (the same path, a hard link, a
symbolic link either way), and two outputs pointed at one file, is refused before any
work: exit 2, one line naming both, the input byte-identical afterwards."""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from compare.sweep import compare_writes as _compare_writes
from simulator.errors import InputError
from simulator.files import check_output_folder, check_outputs, same_file
from simulator.hardware import preset_dir
from tests.conftest import run_cli_in as run

HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A small synth profile, a plan for it, a hardware file and the side inputs."""
    folder = tmp_path_factory.mktemp("inputs")
    shutil.copy(preset_dir() / "a100-40gb-pcie4.yaml", folder / "hw.yaml")
    assert run(folder, "synth", "mlp", "--layers", "2", "--width", "64", "--batch", "4",
               "-o", "p.json").exit_code == 0
    assert run(folder, "plan", "p.json", "-o", "plan.json").exit_code == 0
    (folder / "v.csv").write_text("op,name,time_us,workspace_bytes\no1,fast,1.0,0\n")
    (folder / "d.json").write_text("{}\n")
    (folder / "kineto.json").write_text("{}\n")
    (folder / "et.json").write_text("{}\n")
    (folder / "config.json").write_text("{}\n")
    return folder


@pytest.fixture
def work(base, tmp_path) -> Path:
    for path in base.iterdir():
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


# Every writing option of every command: (command line with OUT for the output, the option,
# the inputs it reads). The inputs are the names of files in ``base``.
SIM = ["simulate", "p.json", "plan.json", "--hardware", "hw.yaml"]
TRACE = ["trace", "--hf-config", "config.json", "--hardware", "hw.yaml", "--density-file", "d.json"]
KINETO = ["import", "kineto", "kineto.json", "--et", "et.json", "--density-file", "d.json"]
CASES = [
    (["synth", "mlp", "--layers", "2", "--hardware", "hw.yaml", "-o", "OUT"], "-o", ["hw.yaml"]),
    (SIM + ["--timeline", "OUT"], "--timeline", ["p.json", "plan.json", "hw.yaml"]),
    (SIM + ["--plot", "OUT"], "--plot", ["p.json", "plan.json", "hw.yaml"]),
    (["plan", "p.json", "--planner", "lms", "--budget", "90%", "--hardware", "hw.yaml", "-o", "OUT"], "-o",
     ["p.json", "hw.yaml"]),
    (["place", "p.json", "plan.json", "--hardware", "hw.yaml", "-o", "OUT"], "-o", ["p.json", "plan.json", "hw.yaml"]),
    (["variants", "p.json", "--from", "v.csv", "-o", "OUT"], "-o", ["p.json", "v.csv"]),
    (KINETO + ["-o", "OUT"], "-o", ["kineto.json", "et.json", "d.json"]),
    pytest.param(TRACE + ["-o", "OUT"], "-o", ["config.json", "hw.yaml", "d.json"],
                 marks=pytest.mark.skipif(not HAS_TORCH, reason="trace needs torch (the trace extra)")),
    pytest.param(TRACE + ["-o", "x.json", "--density-out", "OUT"], "--density-out", ["config.json", "hw.yaml", "d.json"],
                 marks=pytest.mark.skipif(not HAS_TORCH, reason="trace needs torch (the trace extra)")),
]
WHAT = {"p.json": "profile", "plan.json": "plan", "hw.yaml": "hardware file", "v.csv": "--from CSV",
        "kineto.json": "trace", "et.json": "--et trace", "d.json": "--density-file", "config.json": "--hf-config file"}


def _expand(args, out):
    return [out if a == "OUT" else a for a in args]


def _refused(result, output: str, option: str, what: str, source: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {output}: {option} would overwrite the input {what} {source} (the same file")
    assert lines[0].endswith("); write to another path"), lines[0]
    assert result.stdout == ""


def _inputs_intact(work: Path, base: Path) -> None:
    for path in base.iterdir():
        assert (work / path.name).read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize("args, option, inputs", CASES)
@pytest.mark.parametrize("link", ["same", "hard", "symlink", "input-symlink"])
def test_an_output_onto_an_input_is_refused(work, base, args, option, inputs, link):
    for source in inputs:
        before = set(os.listdir(work))
        if link == "same":
            output, given = source, source
        elif link == "hard":
            output, given = "out.link", source
            os.link(work / source, work / output)
        elif link == "symlink":   # the output is a symbolic link to the input
            output, given = "out.link", source
            os.symlink(source, work / output)
        else:                     # the input is given through a symbolic link; the output is its target
            output, given = source, "in.link"
            os.symlink(source, work / given)
        line = [output if a == "OUT" else given if a == source else a for a in args]
        result = run(work, *line)
        _refused(result, output, option, WHAT[source], given)
        how = {"same": "(the same file)", "hard": "(the same file, by a hard link)",
               "symlink": "(the same file, by a symbolic link)",
               "input-symlink": "(the same file, by a symbolic link)"}[link]
        assert how in result.stderr
        _inputs_intact(work, base)
        if link != "same":
            assert os.path.lexists(work / ("out.link" if link != "input-symlink" else "in.link"))
            os.unlink(work / ("out.link" if link != "input-symlink" else "in.link"))
        assert set(os.listdir(work)) == before      # nothing written


@pytest.mark.parametrize("args", [
    SIM + ["--timeline", "t.json", "--plot", "OUT"],
    pytest.param(TRACE + ["-o", "t.json", "--density-out", "OUT"],
                 marks=pytest.mark.skipif(not HAS_TORCH, reason="trace needs torch (the trace extra)")),
])
@pytest.mark.parametrize("spelling", ["t.json", "./t.json", "hard", "symlink"])
def test_two_outputs_onto_one_file_are_refused(work, base, args, spelling):
    output = spelling
    if spelling in ("hard", "symlink"):
        (work / "t.json").write_text("old")
        output = "t.link"
        (os.link if spelling == "hard" else os.symlink)(work / "t.json", work / output)
    result = run(work, *_expand(args, output))
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {output}: ")
    assert "t.json" in lines[0] and "name the same file" in lines[0] and "give each output its own path" in lines[0]
    _inputs_intact(work, base)
    if spelling in ("hard", "symlink"):
        assert (work / "t.json").read_text() == "old"
    else:
        assert not (work / "t.json").exists()


def test_outputs_apart_from_the_inputs_are_written(work, base):
    assert run(work, *SIM, "--timeline", "t.json", "--plot", "m.png").exit_code == 0
    assert run(work, "plan", "p.json", "--hardware", "hw.yaml", "-o", "q.json").exit_code == 0
    assert run(work, "place", "p.json", "plan.json", "-o", "placed.json").exit_code == 0
    assert all((work / name).stat().st_size > 0 for name in ("t.json", "m.png", "q.json", "placed.json"))
    # a preset given by name (no file of that name here) is no input file
    assert run(work, "plan", "p.json", "--hardware", "a100-40gb-pcie4", "-o", "a100-40gb-pcie4").exit_code == 0
    assert (work / "a100-40gb-pcie4").stat().st_size > 0
    _inputs_intact(work, base)


def test_a_shipped_profile_name_reads_a_file_outputs_may_not_replace(tmp_path):
    from simulator.catalog import resolve_profile, shipped_profile_paths
    shipped = shipped_profile_paths()[0]
    name = resolve_profile.__globals__["profile_stem"](shipped)
    with pytest.raises(InputError, match="would overwrite the input profile"):
        check_outputs([("-o", shipped)], [("profile", resolve_profile(name))])


# ----------------------------------------------------------------------------- compare --out


def test_compare_out_over_an_input_is_refused(work, base):
    out = work / "cmp"
    (out / "plans").mkdir(parents=True)
    shutil.copy(work / "p.json", out / "results.json")
    shutil.copy(work / "p.json", out / "plans" / "mine.json")
    os.link(work / "p.json", out / "report.html")
    os.symlink(work / "hw.yaml", out / "chart.png")
    os.symlink(out / "results.json", work / "link.json")
    shutil.copy(work / "p.json", work / "q.json")
    cases = [("cmp/results.json", [], "cmp/results.json", "(the same file)"),
             ("cmp/plans/mine.json", [], "cmp/plans/mine.json", "(the same file)"),
             ("link.json", [], "cmp/results.json", "(the same file, by a symbolic link)"),
             ("p.json", [], "cmp/report.html", "(the same file, by a hard link)"),
             ("q.json", ["--hardware", "hw.yaml"], "cmp/chart.png", "(the same file, by a symbolic link)")]
    for profile, extra, written, how in cases:
        snapshot = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        result = run(work, "compare", profile, *extra, "--planners", "none", "--budgets", "90%", "--out", "cmp",
                     "--jobs", "1")
        assert result.exit_code == 2, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        given = "hw.yaml" if extra else profile
        what = "hardware file" if extra else "profile"
        assert lines[0] == (f"error: {written}: --out cmp would overwrite the input {what} {given} {how}; "
                            "write to another folder"), lines[0]
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == snapshot
    _inputs_intact(work, base)


def test_compare_writes_only_its_own_names():
    assert all(_compare_writes(Path(p)) for p in ("results.csv", "results.json", "report.html", "a.png",
                                                  "plans/x.json"))
    assert not any(_compare_writes(Path(p)) for p in ("p.json", "hw.yaml", "sub/results.csv"))


def test_compare_keeps_an_input_in_its_folder_under_another_name(work):
    out = work / "cmp"
    out.mkdir()
    shutil.copy(work / "p.json", out / "p.json")
    before = (out / "p.json").read_bytes()
    check_output_folder(out, "--out", _compare_writes, [("profile", out / "p.json")], subfolders=("plans",))
    result = run(work, "compare", "cmp/p.json", "--planners", "none", "--budgets", "100%", "--out", "cmp",
                 "--jobs", "1", "--json")
    assert result.exit_code == 0, result.output
    assert (out / "p.json").read_bytes() == before and (out / "results.csv").exists()


# ----------------------------------------------------------------------------- the helper


def test_same_file(tmp_path):
    (tmp_path / "a").write_text("a")
    os.link(tmp_path / "a", tmp_path / "h")
    os.symlink("a", tmp_path / "s")
    assert same_file(tmp_path / "a", tmp_path / "a") == "the same file"
    assert same_file(tmp_path / "sub" / ".." / "a", tmp_path / "a") == "the same file"
    assert same_file(tmp_path / "h", tmp_path / "a") == "the same file, by a hard link"
    assert same_file(tmp_path / "s", tmp_path / "a") == "the same file, by a symbolic link"
    assert same_file(tmp_path / "a", tmp_path / "s") == "the same file, by a symbolic link"
    assert same_file(tmp_path / "new", tmp_path / "new") is None               # an input must exist
    assert same_file(tmp_path / "new", tmp_path / "." / "new", other_exists=False) == "the same file"
    assert same_file(tmp_path / "new", tmp_path / "other", other_exists=False) is None
    (tmp_path / "b").write_text("a")
    assert same_file(tmp_path / "b", tmp_path / "a") is None                   # equal bytes, another file


def test_check_outputs_skips_absent_options_and_non_files(tmp_path):
    (tmp_path / "p.json").write_text("{}")
    check_outputs([("-o", None), ("--plot", "")], [("profile", tmp_path / "p.json"), ("plan", None)])
    check_outputs([("-o", tmp_path / "q.json")], [("hardware file", "a100-40gb-pcie4"), ("profile", tmp_path)])
    with pytest.raises(InputError) as caught:
        check_outputs([("-o", tmp_path / "p.json")], [("profile", tmp_path / "p.json")])
    assert caught.value.line() == (f"{tmp_path / 'p.json'}: -o would overwrite the input profile "
                                   f"{tmp_path / 'p.json'} (the same file); write to another path")
