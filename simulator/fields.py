"""Typed reads of fields from parsed JSON/YAML, each failure a precise InputError.

Shared by the profile, hardware and plan loaders so every format reports bad
input the same way: the file, the field path, and what is wrong.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any

from .errors import InputError

_MISSING = object()
_FLOAT_MAX = sys.float_info.max


class Reader:
    """Reads fields of one mapping, naming ``file`` and ``where`` in every error."""

    def __init__(self, data: Any, file: str, where: str = ""):
        if not isinstance(data, dict):
            raise InputError(file, where or "top level", f"expected an object, got {_kind(data)}")
        self.data = data
        self.file = file
        self.where = where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str, problem: str) -> InputError:
        return InputError(self.file, self.path(key), problem)

    def reject_unknown(self, allowed: set[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise InputError(self.file, self.path(str(key)),
                                 f"unknown field (expected one of: {', '.join(sorted(allowed))})")

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise self.error(key, "missing required field")
        return default

    def string(self, key: str, default: Any = _MISSING, choices: tuple[str, ...] | None = None) -> str:
        value = self.get(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str) or not value:
            raise self.error(key, f"expected a non-empty string, got {_show(value)}")
        if choices is not None and value not in choices:
            raise self.error(key, f"{value!r} is not one of {', '.join(choices)}")
        return value

    def number(self, key: str, default: Any = _MISSING, minimum: float = 0.0,
               positive: bool = False) -> float:
        value = self.get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {_show(value)}")
        if isinstance(value, int) and not -_FLOAT_MAX <= value <= _FLOAT_MAX:  # no float holds it
            raise self.error(key, f"expected a finite number, got one of {value.bit_length()} bits")
        if not math.isfinite(value):
            raise self.error(key, f"expected a finite number, got {value}")
        if positive and value <= 0:
            raise self.error(key, f"must be > 0, got {value}")
        if value < minimum:
            raise self.error(key, f"must be >= {minimum:g}, got {value}")
        return float(value)

    def integer(self, key: str, default: Any = _MISSING, minimum: int = 0) -> int:
        value = self.get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected a whole number, got {_show(value)}")
        if value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {value}")
        return value

    def string_list(self, key: str, default: Any = _MISSING) -> list[str]:
        value = self.get(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of ids, got {_show(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise InputError(self.file, f"{self.path(key)}[{i}]",
                                 f"expected a non-empty string id, got {_show(item)}")
        return value

    def mapping(self, key: str, default: Any = _MISSING) -> "Reader":
        value = self.get(key, default)
        return Reader(value, self.file, self.path(key))


def is_id_list(value: Any) -> bool:
    """A list of non-empty strings (ids), checked without building errors: the loaders'
    fast path for well-formed entries."""
    if type(value) is not list:
        return False
    for item in value:
        if type(item) is not str or not item:
            return False
    return True


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else _kind(value)
    return text if len(text) <= 40 else text[:37] + "..."
