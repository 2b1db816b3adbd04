"""Issue 33's newcomer path: what a first-time user reads (reasons with profile names and
sizes, one wording per bound kind, planners by family, compare's quick default and
budgets a machine caps folded once)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from cli import app
from cli_text import named_reason
from compare.sweep import expand_cells
from planner.shared.bound import bound_words
from planner.core.registry import FAMILIES, QUICK, get_planner, planners
from simulator.catalog import open_profile


def run(*args):
    return CliRunner().invoke(app, list(args), obj={"debug": False})


def test_an_infeasible_reason_names_ops_and_tensors_with_sizes(tmp_path):
    profile = tmp_path / "p.json"
    assert run("synth", "transformer", "-o", str(profile)).exit_code == 0
    result = run("simulate", str(profile), "--budget", "60%")
    assert result.exit_code == 1
    line = next(line for line in result.output.splitlines() if line.strip().startswith("R10"))
    # 'o92' -> aten::addmm in layer9.qkv [o92]; t2 (154389504 B) -> embed.wte.weight [t2] (147.24 MiB)
    assert "[o" in line and " in layer" in line and "MiB" in line and " B)" not in line
    assert "embed.wte.weight [t2] (147.24 MiB)" in line
    # scripts keep the simulator's own wording
    data = json.loads(run("simulate", str(profile), "--budget", "60%", "--json").output)
    assert "t2 (154389504 B)" in data["reason"]


def test_named_reason_leaves_unknown_ids_and_small_counts_alone():
    profile = open_profile("synth-mlp-l16-w8192-b1024")
    tid, op = profile.tensors[0], profile.ops[0]
    text = named_reason(f"op {op.id!r} waits: needs 2048 bytes, 12 free; largest residents: {tid.id} (3 B), "
                        "'nope'", profile)
    assert f"{op.name}" in text and f"[{op.id}]" in text and "2.00 KiB" in text and "12 free" in text
    assert f"{tid.name} [{tid.id}] (3 B)" in text and "'nope'" in text


def test_one_wording_per_bound_kind():
    assert bound_words("swap") == "plans that swap"
    assert bound_words("swap+recompute") == "plans that swap or recompute"
    assert bound_words("swap+recompute+persistent") == \
        "plans that swap, recompute or move weights and optimizer state"
    assert "ideal" in bound_words("uvm (the ideal)") and bound_words("none (codecs)").startswith("no bound")


def test_plan_and_simulate_print_the_same_bound_for_the_same_plan(tmp_path):
    profile, plan = tmp_path / "p.json", tmp_path / "plan.json"
    assert run("synth", "transformer", "-o", str(profile)).exit_code == 0
    planned = run("plan", str(profile), "--planner", "capuchin", "--budget", "60%", "-o", str(plan))
    simulated = run("simulate", str(profile), str(plan))
    bound_of = lambda out: next(line for line in out.splitlines() if line.strip().startswith("bound"))  # noqa: E731
    assert bound_of(planned.output) == bound_of(simulated.output)
    assert "plans that swap or recompute" in bound_of(planned.output)


def test_planners_are_listed_by_family_with_a_place_to_start():
    result = run("planners")
    assert result.exit_code == 0 and result.output.startswith("start here: capuchin")
    titles = [line[3:] for line in result.output.splitlines() if line.startswith("## ")]
    assert titles == [title for family, title in FAMILIES.items() if any(s.family == family for s in planners())]
    assert {s.family for s in planners()} <= set(FAMILIES)
    assert get_planner("g10").family == "swap" and get_planner("capuchin").family == "swap + recompute"
    assert get_planner("chen").family == "recompute" and get_planner("uvm").family == "unified memory"
    assert [s.name for s in planners() if s.searches] == ["autotm", "best", "checkmate", "deeptm", "joint", "swapadvisor",
                                                          "tmof"]
    assert all(get_planner(name) for name in QUICK)


def test_budgets_a_machine_caps_are_compared_once_with_one_note():
    notes: list[str] = []
    cells = expand_cells(["resnet50-b1024-s224"], ["a100-40gb-pcie4"], ["none", "lms"], ["90%", "70%", "50%", "20GiB"],
                         notes=notes)
    budgets = [c.budget for c in cells if c.planner == "none"]
    assert budgets == ["90%", "20GiB"] and all(c.capped for c in cells if c.budget == "90%")
    assert len(notes) == 1 and "90%, 70%, 50%" in notes[0] and "compared once" in notes[0]


def test_a_profile_saved_with_a_byte_order_mark_reads_and_compare_refuses_a_file_as_its_folder(tmp_path):
    profile = tmp_path / "p.json"
    assert run("synth", "mlp", "--layers", "2", "-o", str(profile)).exit_code == 0
    marked = tmp_path / "bom.json"
    marked.write_bytes(b"\xef\xbb\xbf" + profile.read_bytes())
    assert json.loads(run("info", str(marked), "--json").output)["name"] == \
        json.loads(run("info", str(profile), "--json").output)["name"]
    result = CliRunner().invoke(app, ["compare", str(profile), "--planners", "lms", "--budgets", "90%", "--out",
                                      str(profile)], obj={"debug": False})
    assert result.exit_code == 2 and result.stderr.strip().count("\n") == 0 and "is not a folder" in result.stderr
    assert result.stdout == ""
