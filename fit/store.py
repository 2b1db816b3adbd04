"""fit's output folder: ``results.json`` (the families' summary and every probe's row),
``results.csv`` (the probes), ``plans/`` (the plan of every probe that fits),
``traces/`` (the trace cache) and the report.

Probe rows are keyed by everything that decides them (``Probe.key``), so one folder can
hold several runs (other planners, another memory) and each rerun reads what it already
has. The folder is a ``compare.results_folder.ResultsFolder``: every save merges with the
rows already there under the folder's lock and replaces the files atomically, so runs at
the same time keep each other's rows and a run killed at any point leaves valid files
with every finished probe.
"""
from __future__ import annotations

import os
from pathlib import Path

from compare.results_folder import ResultsFolder

# the probe columns of results.csv (results.json keeps every field)
PROBE_COLUMNS = ("key", "family", "planner", "size", "units", "status", "fits", "iteration_us", "peak_bytes",
                 "reserved_bytes", "memory_bytes", "wall", "wall_op", "over_bytes", "planning_seconds", "profile",
                 "sha256", "plan_file", "wall_text")
SUBFOLDERS = ("plans", "traces")


def fit_folder(out: str | os.PathLike) -> ResultsFolder:
    """The results folder of a fit run (``check`` it before the work, ``open`` it to start)."""
    return ResultsFolder(out, PROBE_COLUMNS, kind="fit", option="--out", subfolders=SUBFOLDERS)


def fit_writes(relative: Path) -> bool:
    """Whether fit writes the file at this path inside its folder, besides the results files."""
    parts = relative.parts
    if len(parts) == 1:
        return parts[0] in ("report.html", "fit.png")
    return len(parts) >= 2 and parts[0] in SUBFOLDERS


class FitStore:
    """The rows of every probe finished in ``out`` (``rows``: by key), saved as they come."""

    def __init__(self, out: str | os.PathLike):
        self.folder = fit_folder(out)
        self.out = self.folder.path
        self.rows: dict[str, dict] = self.folder.open()

    def add(self, row: dict, plan_text: str | None = None) -> None:
        """Save one probe's row (and its plan first, so a saved row's plan is there)."""
        if plan_text is not None:
            self.folder.write(row["plan_file"], plan_text.encode())
        self.rows[row["key"]] = row
        self.folder.save([row])

    def write(self, summary: dict) -> None:
        """Save the summary beside the rows."""
        self.folder.save([], header=summary)
