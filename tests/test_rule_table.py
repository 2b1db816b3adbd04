"""docs/simulation.md's rule table ("Where each rule lives") is complete by construction:
every rule the document defines has a row and every row is a defined rule; every
function, C function and test a row names exists and still mentions its rule; and every
place the code enforces a rule is on that rule's row, found by scanning the code for
``PlanInvalid("Rn"``, ``invalid("Rn"`` and ``# Rn:`` comments (Python) and ``/* Rn``
comments (C): in simulator/ (the Python column, simulator/fast/*.c the C one), executor/,
runtime/ and planner/ (the models column). A marker inside a function belongs to it, a
C comment just above a function to that function; markers on declarations (a field, a
constant, a struct member) are not enforcement and are not scanned."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "simulation.md").read_text(encoding="utf-8")
TABLE = DOC.split("## Where each rule lives", 1)[1] if "## Where each rule lives" in DOC else ""
COLUMNS = ("python", "c", "executor", "runtime", "models", "tests")
# where the code lives -> the column its enforcement places go to
PYTHON_TREES = {"simulator": "python", "executor": "executor", "runtime": "runtime", "planner": "models"}
C_FILES = {"simulator/fast": "c", "planner": "models"}
PY_MARK = re.compile(r'(?:PlanInvalid|invalid)\("(R\d+)"|#\s*(R\d+(?:(?:,\s*|\s+and\s+)R\d+)*):')
C_MARK = re.compile(r"/\*\s*(R\d+(?:(?:,\s*|\s+and\s+)R\d+)*)")


def defined_rules() -> set[str]:
    """Rules the document states: ``- **R<n>**`` items."""
    return set(re.findall(r"\*\*(R\d+)\*\*", DOC.split("## Where each rule lives", 1)[0]))


def rows() -> dict[str, dict[str, list[str]]]:
    """Rule -> column -> the names in backquotes of that cell."""
    found = {}
    for line in TABLE.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(COLUMNS) + 1 and re.fullmatch(r"R\d+", cells[0]):
            found[cells[0]] = {column: re.findall(r"`([^`]+)`", cell) for column, cell in zip(COLUMNS, cells[1:])}
    return found


def mentions(text: str, rule: str) -> bool:
    return re.search(rf"\b{rule}(?!\d)", text) is not None


def resolve(dotted: str):
    """What a module attribute path (``package.module.Class.method``) names, or None."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return None
            obj = getattr(obj, name)
        return obj
    return None


def resolves(dotted: str) -> bool:
    return resolve(dotted) is not None


def python_source(dotted: str) -> str:
    """The source of what ``dotted`` names (a property's getter's), or ''."""
    obj = resolve(dotted)
    obj = getattr(obj, "fget", obj)
    try:
        return inspect.getsource(obj)
    except (TypeError, OSError):
        return ""


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def c_functions(path: str) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of each function of a C file; the first line is
    that of its comment when one sits just above it."""
    text = (ROOT / path).read_text(encoding="utf-8")
    code = re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"', _blank, text, flags=re.S)
    lines, raw = code.splitlines(), text.splitlines()
    found, depth, header, start = [], 0, [], 0
    for i, line in enumerate(lines, 1):
        if depth == 0:
            header.append(line)
        for ch in line:
            if ch == "{":
                if depth == 0:
                    start, head = i, " ".join(header).split("{")[0]
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    name = re.search(r"(\w+)\s*\(", head)
                    if name and "=" not in head.split("(")[0]:
                        first = start - len([h for h in header if h.strip()]) + 1
                        while first > 1 and raw[first - 2].lstrip().startswith(("/*", "*")):
                            first -= 1     # the comment above it
                        found.append((first, i, name.group(1)))
                    header = []
        if depth == 0 and (line.rstrip().endswith((";", "}")) or line.lstrip().startswith("#")):
            header = []
    return found


def c_function(spec: str) -> str:
    """The text of a C function named ``file:function`` (with its comment), or ''."""
    path, name = spec.split(":")
    raw = (ROOT / path).read_text(encoding="utf-8").splitlines()
    for first, last, found in c_functions(path):
        if found == name:
            return "\n".join(raw[first - 1:last])
    return ""


def c_function_exists(spec: str) -> bool:
    return c_function(spec) != ""


def python_places() -> list[tuple[str, str, str, str]]:
    """(rule, column, function, file:line) of every enforcement marker inside a function."""
    places = []
    for tree, column in PYTHON_TREES.items():
        for path in sorted((ROOT / tree).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            spans = []

            def walk(node, prefix: str) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        name = f"{prefix}.{child.name}"
                        spans.append((child.lineno, child.end_lineno, name, isinstance(child, ast.ClassDef)))
                        if isinstance(child, ast.ClassDef):
                            walk(child, name)     # a function's inner functions are its own body

            walk(ast.parse(text), module)
            for number, line in enumerate(text.splitlines(), 1):
                for match in PY_MARK.finditer(line):
                    inner = [s for s in spans if s[0] <= number <= s[1]]
                    if not inner or max(inner)[3]:
                        continue        # a declaration: a module constant or a class field
                    for rule in re.findall(r"R\d+", match.group(1) or match.group(2)):
                        places.append((rule, column, max(inner)[2], f"{path.relative_to(ROOT)}:{number}"))
    return places


def c_places() -> list[tuple[str, str, str, str]]:
    """(rule, column, file:function, file:line) of every ``/* Rn`` comment in or just above a
    C function."""
    places = []
    for tree, column in C_FILES.items():
        for path in sorted((ROOT / tree).rglob("*.c")):
            rel = str(path.relative_to(ROOT))
            functions = c_functions(rel)
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for match in C_MARK.finditer(line):
                    owner = [name for first, last, name in functions if first <= number <= last]
                    if owner:
                        for rule in re.findall(r"R\d+", match.group(1)):
                            places.append((rule, column, f"{rel}:{owner[0]}", f"{rel}:{number}"))
    return places


def test_exists_and_every_rule_has_a_row():
    table = rows()
    assert table, "docs/simulation.md has no rule table"
    assert defined_rules() - set(table) == set(), "rules without a row"
    assert set(table) - defined_rules() == set(), "rows for rules the document does not define"


def test_every_named_function_and_test_exists():
    missing = []
    for rule, cells in rows().items():
        assert cells["python"] or cells["c"], f"{rule}: no implementation named"
        for column in ("python", "executor", "runtime", "models"):
            for name in cells[column]:
                if ":" in name:
                    if not c_function_exists(name):
                        missing.append(f"{rule}: {name}")
                elif not resolves(name):
                    missing.append(f"{rule}: {name}")
        for spec in cells["c"]:
            if not c_function_exists(spec):
                missing.append(f"{rule}: {spec}")
        for spec in cells["tests"]:
            path, name = spec.split("::")
            if not re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(encoding="utf-8"), re.M):
                missing.append(f"{rule}: {spec}")
    assert not missing, missing


def test_every_named_function_still_mentions_its_rule():
    """A function a row names says its rule (a check, a comment or its docstring): one
    that no longer does no longer enforces it, and the row is stale."""
    stale = []
    for rule, cells in rows().items():
        for column in ("python", "c", "executor", "runtime", "models"):
            for name in cells[column]:
                text = c_function(name) if ":" in name else python_source(name)
                if text and not mentions(text, rule):
                    stale.append(f"{rule}: {name}")
    assert not stale, stale


def test_every_place_that_enforces_a_rule_is_on_its_row():
    table = rows()
    off = [f"{where}: {rule} in {name} is not on {rule}'s row ({column})"
           for rule, column, name, where in python_places() + c_places()
           if name not in table.get(rule, {}).get(column, ())]
    assert not off, off


def test_the_checks_would_catch_a_stale_row():
    assert not resolves("simulator.run.engine._Run.no_such_method")
    assert not resolves("simulator.no_such_module.f")
    assert resolves("simulator.compile.sequence.build_sequence")
    assert c_function_exists("simulator/fast/_fastsim.c:try_compute")
    assert not c_function_exists("simulator/fast/_fastsim.c:no_such_function")
    assert mentions(c_function("simulator/fast/_fastsim.c:try_compute"), "R15")
    assert not mentions("R150 and R1x", "R15") and mentions("(R15)", "R15")


def test_the_scan_finds_the_checks():
    places = {(rule, column, name) for rule, column, name, _ in python_places() + c_places()}
    assert ("R15", "python", "simulator.compile.program._Compiler.check_recompute") in places
    assert ("R15", "c", "simulator/fast/_fastsim.c:walk_item") in places
    assert ("R12", "c", "simulator/fast/_fastsim.c:can_start") in places   # the comment above it
    assert not any(name.endswith("compiled.CompiledProfile") for _, _, name in places)   # a field
