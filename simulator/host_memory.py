"""How much memory this process may still take, and which limit says so.

A command about to allocate a large buffer (``replay``'s emulated GPU region, for one)
checks the size it estimated from the profile here first, so that a size this process
cannot hold is one line at once rather than seconds of work and gigabytes before a
MemoryError. The limits read are the machine's available memory (``MemAvailable``),
the process's address-space and data limits (``ulimit -v``, ``ulimit -d``) less what it
holds already, and its control group's memory limit less what the group uses; the
smallest is the headroom, named, because "the machine's memory" is the wrong advice
when a process limit is what is short.
"""
from __future__ import annotations

import resource

from .errors import InputError


def _read_int(path: str, field: str | None = None, scale: int = 1) -> int | None:
    """An integer from a /proc or /sys file (the value of ``field:`` when given)."""
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                if field is None:
                    word = line.split()[0]
                    return None if word == "max" else int(word) * scale
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * scale
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    return None


def _cgroup_headroom() -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), or None."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as handle:
            line = next((line for line in handle if line.startswith("0::")), None)
    except (OSError, UnicodeDecodeError):
        return None
    if line is None:
        return None
    base = "/sys/fs/cgroup" + line[3:].strip().rstrip("/")
    limit, used = _read_int(base + "/memory.max"), _read_int(base + "/memory.current")
    return None if limit is None or used is None else max(0, limit - used)


def _rlimit_headroom(which: int, status_field: str) -> int | None:
    """The soft limit ``which`` less this process's ``status_field`` (/proc/self/status)."""
    try:
        soft, _ = resource.getrlimit(which)
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    used = _read_int("/proc/self/status", status_field, 1024) or 0
    return max(0, soft - used)


def memory_headroom() -> tuple[int, str] | None:
    """(bytes this process may still allocate, the limit that sets it), the smallest of
    the limits this system tells; None where it tells none."""
    found = []
    available = _read_int("/proc/meminfo", "MemAvailable", 1024)
    if available is not None:
        found.append((available, "this machine's available memory"))
    address = _rlimit_headroom(resource.RLIMIT_AS, "VmSize")
    if address is not None:
        found.append((address, "this process's address-space limit (ulimit -v)"))
    data = _rlimit_headroom(resource.RLIMIT_DATA, "VmData")
    if data is not None:
        found.append((data, "this process's data-size limit (ulimit -d)"))
    group = _cgroup_headroom()
    if group is not None:
        found.append((group, "its control group's memory limit"))
    return min(found) if found else None


def check_memory(need: int, what: str, file: str, field: str, advice: str) -> None:
    """InputError ``file: field: <what> needs about N of memory and <limit> leaves M:
    <advice>`` when ``need`` bytes are more than ``memory_headroom()``."""
    from .units import format_bytes
    headroom = memory_headroom()
    if headroom is None or need <= headroom[0]:
        return
    left, limit = headroom
    raise InputError(file, field, f"{what} needs about {format_bytes(need)} of memory and {limit} leaves "
                                  f"{format_bytes(left)}: {advice}")

