"""Reading and writing the files swapplan uses: JSON, gzipped JSON, YAML.

Reads turn every failure into an InputError naming the file; writes are atomic
(a temporary file renamed into place), so nothing is ever left half-written.
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError


def read_document(path: str | os.PathLike, formats: tuple[str, ...] = ("json", "yaml")) -> Any:
    """Read a JSON, gzipped JSON or YAML file (chosen by its name) into Python data.

    Raises InputError naming the file for a missing file, bad gzip, bad encoding
    or a syntax error (with its line where the parser gives one).
    """
    path = Path(path)
    name = str(path)
    lower = path.name.lower()
    try:
        if lower.endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                raw = handle.read()
            lower = lower[:-3]
        else:
            raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(name, "", "no such file") from None
    except IsADirectoryError:
        raise InputError(name, "", "is a directory, expected a file") from None
    except (OSError, EOFError) as exc:  # includes gzip.BadGzipFile
        raise InputError(name, "", f"cannot read: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(name, f"byte {exc.start}", "not valid UTF-8 text") from None
    is_yaml = lower.endswith((".yaml", ".yml"))
    if is_yaml and "yaml" in formats:
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark is not None else "yaml"
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise InputError(name, where, f"invalid YAML: {problem}") from None
        except (ValueError, OverflowError, RecursionError) as exc:
            raise InputError(name, "yaml", f"invalid YAML: {exc}") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InputError(name, f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(name, "json", f"invalid JSON: {exc}") from None


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not allowed")


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder.

    Raises InputError naming the file when the folder is missing or not writable.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except FileNotFoundError:
        raise InputError(str(path), "", f"folder {str(folder)!r} does not exist") from None
    except OSError as exc:
        raise InputError(str(path), "", f"cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        os.replace(temp, path)
    except BaseException as exc:
        try:
            os.unlink(temp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise InputError(str(path), "", f"cannot write: {exc.strerror or exc}") from None
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def gzip_bytes(data: bytes) -> bytes:
    """Gzip with a zero timestamp, so the same data always gives the same bytes."""
    return gzip.compress(data, compresslevel=9, mtime=0)
