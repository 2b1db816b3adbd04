"""docs/simulation.md's rule table ("Where each rule lives") stays true: every rule the
document defines has a row, every row is a defined rule, and every function, C function
and test a row names exists."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "simulation.md").read_text(encoding="utf-8")
TABLE = DOC.split("## Where each rule lives", 1)[1] if "## Where each rule lives" in DOC else ""


def defined_rules() -> set[str]:
    """Rules the document states: ``- **R<n>**`` items."""
    return set(re.findall(r"\*\*(R\d+)\*\*", DOC.split("## Where each rule lives", 1)[0]))


def rows() -> dict[str, list[list[str]]]:
    """Rule -> its cells, each cell the names in backquotes."""
    found = {}
    for line in TABLE.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.fullmatch(r"R\d+", cells[0]):
            found[cells[0]] = [re.findall(r"`([^`]+)`", c) for c in cells[1:]]
    return found


def resolves(dotted: str) -> bool:
    """A module attribute path (``package.module.Class.method``) names something."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def c_function_exists(spec: str) -> bool:
    path, name = spec.split(":")
    text = (ROOT / path).read_text(encoding="utf-8")
    return re.search(rf"^[A-Za-z_][\w\s\*]*\b{re.escape(name)}\s*\([^;]*?\)\s*\{{", text, re.M) is not None


def test_exists_and_every_rule_has_a_row():
    table = rows()
    assert table, "docs/simulation.md has no rule table"
    assert defined_rules() - set(table) == set(), "rules without a row"
    assert set(table) - defined_rules() == set(), "rows for rules the document does not define"


def test_every_named_function_and_test_exists():
    missing = []
    for rule, (python, c, executor, runtime, tests) in rows().items():
        assert python or c, f"{rule}: no implementation named"
        for name in python + executor + runtime:
            if not resolves(name):
                missing.append(f"{rule}: {name}")
        for spec in c:
            if not c_function_exists(spec):
                missing.append(f"{rule}: {spec}")
        for spec in tests:
            path, name = spec.split("::")
            if not re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(encoding="utf-8"), re.M):
                missing.append(f"{rule}: {spec}")
    assert not missing, missing


def test_the_checks_would_catch_a_stale_row():
    assert not resolves("simulator.run.engine._Run.no_such_method")
    assert not resolves("simulator.no_such_module.f")
    assert resolves("simulator.compile.sequence.build_sequence")
    assert c_function_exists("simulator/fast/_fastsim.c:try_compute")
    assert not c_function_exists("simulator/fast/_fastsim.c:no_such_function")
