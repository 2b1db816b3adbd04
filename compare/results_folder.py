"""A results folder that keeps everything: rows keyed by cell, whatever run wrote them.

A command that writes result rows into a folder (``compare --out``, and any other that
writes ``results.json`` / ``results.csv``) keeps them through this class, so that:

- rows are merged with those already in the folder by their ``"key"`` field: a second
  run with other planners or budgets adds its rows, a rerun of the same cell replaces
  its row, and no run drops another run's rows;
- two runs into one folder at the same time merge safely: every save takes the
  folder's lock (``.swapplan.lock``, an advisory ``flock`` the kernel drops when its
  process dies, SIGKILL included), re-reads ``results.json``, merges and replaces the
  files atomically; a lock held for longer than ``wait_s`` is refused with one line
  naming the holder's process and command;
- a run killed at any point leaves both files valid (each is a temporary file renamed
  into place) with every row saved before it: ``results.json`` first, then
  ``results.csv``, so the JSON file, which resumes read, is never behind the CSV.

Usage (the whole API)::

    folder = ResultsFolder("out", COLUMNS, kind="compare", option="--out",
                           prepare=annotate, subfolders=("plans",))
    folder.check(inputs=[("profile", "p.json")])   # before any work; creates nothing
    earlier = folder.open()          # creates the folder; {key: row} already there
    folder.write("plans/a.json", data)   # any other file, atomically
    merged = folder.save(rows)       # this run's rows (each with "key"), in its order
    with folder.locked():            # files derived from every row, e.g. a report
        write_report(folder.rows(), folder.path)

``rows`` passed to ``save`` are dicts holding at least ``"key"`` (a string unique per
cell) and the ``columns``; other fields are kept in ``results.json``. ``prepare``
(optional) is called on the merged row list before each write (compare fills the
columns that depend on the other rows). ``kind`` names what wrote the folder: a
``results.json`` of another kind is refused rather than merged.
"""
from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from simulator.errors import InputError
from simulator.files import check_output_folder, write_atomic

RESULTS_JSON, RESULTS_CSV, LOCK_FILE = "results.json", "results.csv", ".swapplan.lock"
LOCK_WAIT_S = 120.0     # a save waits this long for another run's save (or report) to end
_POLL_S = 0.05


class ResultsFolder:
    """``results.json``, ``results.csv`` and any other files of a folder of result rows
    (module doc: the API, merging, the lock and what a killed run leaves)."""

    def __init__(self, path: str | os.PathLike, columns: Iterable[str], *, kind: str | None = None,
                 option: str = "--out", prepare: Callable[[list[dict]], object] | None = None,
                 subfolders: tuple[str, ...] = (), wait_s: float = LOCK_WAIT_S):
        self.path = Path(path)
        self.columns = list(columns)
        self.kind = kind
        self.option = option
        self.prepare = prepare
        self.subfolders = tuple(subfolders)
        self.wait_s = wait_s
        self._lock_handle = None
        self._depth = 0

    # ------------------------------------------------------------------ before the work

    def writes(self, relative: Path, extra: Callable[[Path], bool] | None = None) -> bool:
        """Whether this folder's files include ``relative`` (a path inside it): the two
        results files, the lock, and what ``extra`` says (the command's other files)."""
        if len(relative.parts) == 1 and relative.parts[0] in (RESULTS_JSON, RESULTS_CSV, LOCK_FILE):
            return True
        return bool(extra and extra(relative))

    def check(self, inputs=(), writes: Callable[[Path], bool] | None = None) -> None:
        """Before any work, creating nothing: the folder is a folder (or can be created)
        and files can be written in it and its existing subfolders, no input is a file
        this folder writes (``writes``: the command's files besides the results files),
        and an existing ``results.json`` can be merged with. InputError otherwise."""
        check_output_folder(self.path, self.option, lambda relative: self.writes(relative, writes),
                            inputs=inputs, subfolders=self.subfolders)
        if (self.path / RESULTS_JSON).exists():
            self._read()

    def open(self) -> dict[str, dict]:
        """Create the folder and its subfolders; the rows already there, by key."""
        try:
            for sub in ("", *self.subfolders):
                (self.path / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(str(self.path), self.option, f"cannot create the folder: {exc.strerror}") from None
        with self.locked():
            return {row["key"]: row for row in self._read()}

    # ------------------------------------------------------------------ during the work

    def rows(self) -> list[dict]:
        """Every row in ``results.json`` now, in its order."""
        with self.locked():
            return self._read()

    def write(self, relative: str | os.PathLike, data: bytes) -> None:
        """Write a file inside the folder (``plans/x.json``) atomically."""
        write_atomic(self.path / relative, data)

    def save(self, rows: Iterable[dict], header: dict | None = None) -> list[dict]:
        """Merge ``rows`` (this run's, in its order) into the folder's and write both
        files; returns the merged rows. A row replaces the row of its key; a new key goes
        where this run's order puts it among the rows it already has there (so that one
        run writes its rows in its own order whatever order they finished in), else at
        the end. ``header``: top-level fields of ``results.json`` beside the rows (fit's
        summary), replacing those there; None keeps the file's."""
        rows = list(rows)
        with self.locked():
            merged = merge_rows(self._read(), rows)
            if self.prepare is not None:
                self.prepare(merged)
            self._write(merged, self._header() if header is None else header)
            return merged

    def _header(self) -> dict:
        """The top-level fields of ``results.json`` besides kind, columns and rows."""
        try:
            data = json.loads((self.path / RESULTS_JSON).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if k not in ("kind", "columns", "rows")} if isinstance(data, dict) else {}

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's lock (re-entrant in one process): no other run saves until
        it is released. InputError naming the holder after ``wait_s``."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        handle = self._acquire()
        self._depth = 1
        try:
            yield
        finally:
            self._depth = 0
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    # ------------------------------------------------------------------ inside

    def _acquire(self):
        path = self.path / LOCK_FILE
        try:
            handle = open(path, "a+", encoding="utf-8")
        except OSError as exc:
            raise InputError(str(path), self.option, f"cannot open the folder's lock: {exc.strerror}") from None
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    handle.close()
                    raise InputError(str(path), self.option, f"cannot lock the folder: {exc.strerror}") from None
            if time.monotonic() >= deadline:
                handle.seek(0)
                holder = handle.read(300).strip() or "another process"
                handle.close()
                raise InputError(str(self.path), self.option,
                                 f"is in use by {holder} (its lock {LOCK_FILE} held for more than {self.wait_s:g} s): "
                                 "wait for it to end or choose another folder")
            time.sleep(_POLL_S)
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} ({_command()})\n")
        handle.flush()
        self._remove_stale_temporaries()
        return handle

    def _remove_stale_temporaries(self) -> None:
        """Temporary files of results files that a killed run left (under the lock no
        other run is writing one)."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return
        for name in names:
            if name.endswith(".tmp") and name.startswith((f".{RESULTS_JSON}.", f".{RESULTS_CSV}.")):
                try:
                    os.unlink(self.path / name)
                except OSError:
                    pass

    def _read(self) -> list[dict]:
        path = self.path / RESULTS_JSON
        if not path.exists():
            return []
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            rows = data["rows"]
            if not isinstance(rows, list) or not all(isinstance(row, dict) and isinstance(row["key"], str)
                                                     for row in rows):
                raise TypeError("rows must be a list of objects with a string key")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(str(path), "rows", f"cannot merge with it ({exc}); remove it or choose another "
                                                f"{self.option}") from None
        if self.kind is not None and data.get("kind", self.kind) != self.kind:
            raise InputError(str(path), "kind", f"holds results of {data.get('kind')!r}, not {self.kind!r}: "
                                                f"choose another {self.option}")
        return rows

    def _write(self, rows: list[dict], header: dict | None = None) -> None:
        document = {**(header or {}), "columns": self.columns, "rows": rows}
        if self.kind is not None:
            document = {"kind": self.kind, **document}
        write_atomic(self.path / RESULTS_JSON, (json.dumps(document, indent=1, allow_nan=False) + "\n").encode())
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in self.columns})
        write_atomic(self.path / RESULTS_CSV, buffer.getvalue().encode())


def merge_rows(existing: list[dict], mine: list[dict]) -> list[dict]:
    """``existing`` with ``mine`` merged in by ``"key"`` (``ResultsFolder.save``): a row of
    mine replaces the row of its key in place; a new one goes just before the next of
    my rows that is already there, else just after the last such one before it, else at
    the end. Linear in the rows."""
    mine_by_key = {row["key"]: row for row in mine}
    present = {row["key"] for row in existing}
    before: dict[str, list[dict]] = {}     # an existing key -> my new rows to put just before it
    after: dict[str, list[dict]] = {}      # ... or just after it
    tail: list[dict] = []
    waiting: list[dict] = []               # new rows waiting for the next present row of mine
    last_present = None
    for row in mine:
        if row["key"] in present:
            if waiting:
                before.setdefault(row["key"], []).extend(waiting)
                waiting = []
            last_present = row["key"]
        else:
            waiting.append(row)
    if waiting:
        (after.setdefault(last_present, []) if last_present is not None else tail).extend(waiting)
    merged = []
    for row in existing:
        key = row["key"]
        merged.extend(before.get(key, ()))
        merged.append(mine_by_key.get(key, row))
        merged.extend(after.get(key, ()))
    merged.extend(tail)
    return merged


def _command() -> str:
    """This process's command line, shortened, for the lock's holder line."""
    words = [Path(sys.argv[0]).name if sys.argv else "python", *sys.argv[1:]]
    text = " ".join(words).replace("\n", " ")
    return text if len(text) <= 160 else text[:157] + "..."
