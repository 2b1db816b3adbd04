"""fit's output folder: ``results.json`` (the families' summary and every probe's row),
``plans/`` (the plan of every probe that fits), ``traces/`` (the trace cache) and the
report.

Probe rows are keyed by everything that decides them (``Probe.key``), so one folder can
hold several runs (other planners, another memory) and each rerun reads what it already
has; every write merges with the rows already in the file and replaces it atomically,
so a run killed at any point leaves a valid file with every finished probe.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from simulator.errors import InputError
from simulator.files import write_atomic

RESULTS = "results.json"


class FitStore:
    """The rows of every probe finished in ``out`` (``rows``: by key), and the summary."""

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        try:
            (self.out / "plans").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(str(out), "--out", f"cannot create the folder: {exc.strerror}") from None
        self.summary: dict = {}
        self.rows: dict[str, dict] = self._read()

    def _read(self) -> dict[str, dict]:
        path = self.out / RESULTS
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text())
            return {row["key"]: row for row in data["probes"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(str(path), "probes", f"cannot resume from it ({exc}); remove it or choose another "
                                                  "--out") from None

    def add(self, row: dict) -> None:
        self.rows[row["key"]] = row
        self.write()

    def write(self, summary: dict | None = None) -> None:
        """Write results.json: ``summary`` (or the last one) and every probe row, merged
        with rows another run wrote since this one read the file."""
        if summary is not None:
            self.summary = summary
        try:
            self.rows = {**self._read(), **self.rows}
        except InputError:
            pass            # damaged by hand since: this run's rows replace it
        probes = sorted(self.rows.values(), key=lambda r: (r["family"], r["planner"], r["size"], r["key"]))
        data = {**self.summary, "probes": probes}
        write_atomic(self.out / RESULTS, (json.dumps(data, indent=1, allow_nan=False) + "\n").encode())
