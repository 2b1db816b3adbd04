"""Sizes and budgets as people write them: ``123``, ``8GiB``, ``512MB``, ``1.5TB``, ``60%``.

KB/MB/GB/TB are decimal (1000**n), KiB/MiB/GiB/TiB binary (1024**n) (rule R3).
Bytes are always integers; a size with a fraction rounds to the nearest byte.

Inside the engine time is an integer number of picoseconds and bandwidth an integer
number of bytes per second (R3); ``us_to_ps`` and ``gbps_to_bytes_per_s`` are the one
place those conversions are made. The R23 limits live here too.
"""
from __future__ import annotations

import math
import re

from .errors import InputError

# R23: inputs the engine accepts. Sizes below 2^53 bytes, times below 10^9 us,
# bandwidths in (0, 10^6] GB/s and at most 10^7 ops, tensors or actions.
MAX_BYTES = 2**53
MAX_US = 1e9
MAX_GBPS = 1e6
MAX_COUNT = 10**7
PS_PER_US = 10**6


def us_to_ps(us: float) -> int:
    """A time in microseconds as integer picoseconds: floor(us * 10^6 + 0.5) in doubles (R3)."""
    return int(math.floor(us * 1e6 + 0.5))


def gbps_to_bytes_per_s(gbps: float) -> int:
    """A bandwidth in GB/s as integer bytes per second: floor(GB/s * 10^9 + 0.5) in doubles (R3)."""
    return int(math.floor(gbps * 1e9 + 0.5))


def ps_to_us(ps: int) -> float:
    """Integer picoseconds back to microseconds (correctly rounded)."""
    return ps / PS_PER_US

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]*)\s*$")


def parse_size(text, where: str = "size", file: str = "<argument>") -> int:
    """Parse a byte count such as ``123``, ``8GiB``, ``512MB`` or ``1.5TB``.

    Returns an int (a fraction of a byte rounds to the nearest byte, halves up). Raises
    InputError on anything else, including negative values, unknown units and sizes of
    2^53 bytes or more (R23).
    """
    if isinstance(text, bool):
        raise InputError(file, where, f"expected a size, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise InputError(file, where, f"size must not be negative, got {text}")
        return _below_limit(text, text, where, file)
    if isinstance(text, float):
        if not math.isfinite(text) or text < 0:
            raise InputError(file, where, f"size must be a finite number >= 0, got {text}")
        return _below_limit(text, text, where, file)
    if not isinstance(text, str):
        raise InputError(file, where, f"expected a size such as 8GiB, got {text!r}")
    match = _SIZE.match(text)
    if not match:
        raise InputError(file, where, f"cannot read {text!r} as a size (examples: 123, 512MB, 8GiB, 1.5TB)")
    number, exponent, unit = match.groups()
    factor = _UNITS.get(unit.upper())
    if factor is None:
        raise InputError(file, where, f"unknown unit {unit!r} in {text!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    # float() of the whole literal never raises: 1e400 is inf, 1e-400 is 0.0.
    value = float(f"{number}e{exponent or 0}") * factor
    return _below_limit(value, text, where, file)


def _below_limit(value, shown, where: str, file: str) -> int:
    """``value`` rounded to whole bytes, or InputError when it is 2^53 bytes or more (R23)."""
    if not value < MAX_BYTES:  # also catches inf
        raise InputError(file, where, f"size {shown!r} is too large: at most 2^53 - 1 bytes (R23)")
    return value if isinstance(value, int) else int(math.floor(value + 0.5))


def parse_budget(text, peak_bytes: int, where: str = "budget", file: str = "<argument>") -> int:
    """Parse a budget: a size, or a percentage of the no-swap peak (``60%``).

    Either way below 2^53 bytes (R23); InputError otherwise.
    """
    if isinstance(text, str) and text.strip().endswith("%"):
        number = text.strip()[:-1].strip()
        try:
            percent = float(number)
        except ValueError:
            raise InputError(file, where, f"cannot read {text!r} as a percentage") from None
        if not math.isfinite(percent) or percent <= 0:
            raise InputError(file, where, f"percentage must be > 0, got {text!r}")
        value = peak_bytes * percent / 100.0
        if not value < MAX_BYTES:
            raise InputError(file, where, f"{text!r} of the peak is too large: at most 2^53 - 1 bytes (R23)")
        return int(value)
    return parse_size(text, where, file)


def planning_budget(text, peak_bytes: int, gpu_bytes: int, where: str = "budget",
                    cap_sizes: bool = False) -> tuple[int, int | None]:
    """The budget a planner plans for, and the bytes asked for when they were capped
    (else None): ``parse_budget`` (an int is bytes already), with a percentage of the peak
    that asks for more than the GPU's memory (``gpu_bytes``) capped at it. A size above it
    is left as asked (R2 refuses it), unless ``cap_sizes`` (compare: one list of budgets
    runs on several machines). The one place `plan`, `train` and `compare` read a budget."""
    wanted = text if isinstance(text, int) else parse_budget(text, peak_bytes, where)
    percentage = isinstance(text, str) and text.strip().endswith("%")
    if wanted > gpu_bytes and (percentage or cap_sizes):
        return gpu_bytes, wanted
    return wanted, None


def format_bytes(n: int | float) -> str:
    """A short binary-unit rendering: ``1.50 GiB``; exact bytes below 1 KiB."""
    n = float(n)
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{int(n)} B"


def format_us(us: float) -> str:
    """A short time rendering from microseconds: ``812.0 us``, ``12.34 ms``, ``1.234 s``."""
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"
