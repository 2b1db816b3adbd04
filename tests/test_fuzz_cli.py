"""A CI-sized run of benchmarks/fuzz_cli.py: the quick selection of its fixed cases
(every command, every plan kind, the hostile inputs of issues 17 and 33) and a few
seeded random mutations, each a real ``swapplan`` process. Any finding fails: an exit
status other than 0, 1 or 2, a traceback without --debug, an error of more than one
line, a hang, a blow-up, or a file touched that is not an output.

The long run is ``.venv/bin/python benchmarks/fuzz_cli.py --seconds 600 [--full]``.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = 1
RANDOM_CASES = 6


def _harness():
    spec = importlib.util.spec_from_file_location("fuzz_cli", ROOT / "benchmarks" / "fuzz_cli.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_cli", module)
    spec.loader.exec_module(module)
    return module


# slow (real processes, ~15 s idle): tests/test_hostile_input.py and test_trace_input_bounds.py
# check the fixed cases one by one; the random mutations run in `make test-slow`
@pytest.mark.slow
@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="needs FIFOs (POSIX)")
def test_quick_fuzz_run_finds_nothing(tmp_path, capsys):
    fuzz = _harness()
    code = fuzz.main(["--quick", "--seed", str(SEED), "--cases", str(RANDOM_CASES), "--seconds", "45",
                      "--jobs", "2", "--timeout", "30", "--keep", str(tmp_path / "failures")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "fixed cases: " in out and f"random cases: {RANDOM_CASES} run" in out, out


def test_the_quick_selection_covers_every_command_and_the_issue_33_cases():
    fuzz = _harness()
    quick = fuzz.fixed_cases(quick=True)
    commands = {case.args[0] for case in quick}
    assert {"trace", "variants", "place", "compare", "replay", "simulate", "info"} <= commands
    names = " | ".join(case.name for case in quick)
    for words in ("trace --hf-config fifo", "trace --hf-config /dev/zero", "trace --density-file fifo",
                  "10^9 layers", "trace --density-seed -1", "trace without torch", "byte-order mark",
                  "simulate uvm plan", "simulate codec plan", "simulate cpu plan", "place cpu plan",
                  "replay uvm plan", "hardware uvm=", "hardware codecs=", "hardware cpu="):
        assert words in names, words
    assert not any(case.slow for case in quick)   # no torch run in the CI-sized selection
