"""Measured op variants (R52) from a CSV into a profile: ``swapplan variants``.

The CSV has one row per variant: the op's id, the variant's name (printable text,
unique per op, not ``default``), its time and workspace, under a header
``op,name,time_us,workspace_bytes`` or, without one, in that order. A name the op has
already is an error unless ``replace`` is given: merging measurements twice must not
silently swap one for the other.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import replace

from ..errors import InputError
from ..files import read_bytes
from ..profile import Profile, Variant
from ..units import MAX_BYTES, MAX_US

COLUMNS = ("op", "name", "time_us", "workspace_bytes")


def read_variants(path: str) -> list[tuple[int, str, str, float, int]]:
    """(line, op, name, time_us, workspace_bytes) rows; InputError naming the file, the
    line and the column for a bad row."""
    try:   # utf-8-sig: a byte-order mark, as spreadsheets save a CSV, is not part of the header
        text = read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(path, "top level", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return _rows(path, reader)
    except csv.Error as exc:   # a field over the csv module's limit, an unclosed quote at the end
        raise InputError(path, f"line {reader.line_num}", f"not a valid CSV: {exc}") from None


def _rows(path: str, reader) -> list[tuple[int, str, str, float, int]]:
    header = next(reader, None)
    first: list[list[str]] = []
    if header is None or [h.strip() for h in header] != list(COLUMNS):
        if not _is_data(header):
            raise InputError(path, "line 1", f"expected the header {','.join(COLUMNS)} (or a first row of "
                                             f"values in that order), got {','.join(header or [])!r}")
        first = [header]    # no header: the first line is a variant
    rows = []
    for line, row in enumerate(_chain(first, reader), start=2 - len(first)):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(COLUMNS):
            raise InputError(path, f"line {line}", f"expected {len(COLUMNS)} columns, got {len(row)}")
        op, name, time_text, workspace_text = (cell.strip() for cell in row)
        if not op or not name:
            raise InputError(path, f"line {line}", "op and name must not be empty")
        if not name.isprintable():
            raise InputError(path, f"line {line}.name", f"must be printable text, got {ascii(name[:40])}")
        try:
            time_us = float(time_text)
        except ValueError:
            raise InputError(path, f"line {line}.time_us", f"expected a number, got {time_text!r}") from None
        if not (math.isfinite(time_us) and 0 <= time_us < MAX_US):
            raise InputError(path, f"line {line}.time_us", f"must be from 0 to below 10^9 us, got {time_text}")
        try:
            workspace = int(workspace_text or "0")
        except ValueError:
            raise InputError(path, f"line {line}.workspace_bytes",
                             f"expected a whole number of bytes, got {workspace_text!r}") from None
        if not 0 <= workspace < MAX_BYTES:
            raise InputError(path, f"line {line}.workspace_bytes", f"must be from 0 to 2^53 - 1, got {workspace}")
        rows.append((line, op, name, time_us, workspace))
    return rows


def _is_data(row) -> bool:
    """Whether a first CSV row is a variant rather than a header: four cells, a time."""
    if not row or len(row) != len(COLUMNS):
        return False
    try:
        float(row[2])
    except ValueError:
        return False
    return True


def _chain(first, reader):
    yield from first
    yield from reader


def merge_variants(profile: Profile, rows, path: str, replace_existing: bool = False) -> Profile:
    """The profile with the rows' variants added to their ops; InputError for an unknown
    op, a reserved or repeated name, and a name the op has already unless
    ``replace_existing`` (``--replace``): then the row replaces that variant."""
    added: dict[str, dict[str, Variant]] = {}
    for line, op_id, name, time_us, workspace in rows:
        if op_id not in profile.op_index:
            raise InputError(path, f"line {line}.op", f"unknown op {op_id!r} in profile {profile.name!r}")
        if name == "default":
            raise InputError(path, f"line {line}.name", "'default' is reserved: it is the op itself")
        mine = added.setdefault(op_id, {})
        if name in mine:
            raise InputError(path, f"line {line}.name", f"op {op_id!r} has variant {name!r} twice")
        if not replace_existing and profile.ops[profile.op_index[op_id]].variant(name) is not None:
            raise InputError(path, f"line {line}.name", f"op {op_id!r} of profile {profile.name!r} has a variant "
                                                        f"{name!r} already: give --replace to replace it, or "
                                                        "another name")
        mine[name] = Variant(name, time_us, workspace)
    ops = []
    for op in profile.ops:
        mine = added.get(op.id)
        if not mine:
            ops.append(op)
            continue
        kept = [v for v in op.variants if v.name not in mine]
        ops.append(replace(op, variants=tuple(kept) + tuple(mine.values())))
    return Profile(name=profile.name, tensors=profile.tensors, ops=tuple(ops), source=profile.source,
                   origin=profile.origin)
