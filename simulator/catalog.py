"""What ships with swapplan (profiles) and summaries of a profile for people and scripts."""
from __future__ import annotations

import heapq
import importlib.resources
import re
from collections import Counter
from pathlib import Path

from .errors import InputError
from .profile import COLLECTIVE_KINDS, PHASES, TENSOR_KINDS, Profile, load_profile

_SUFFIXES = (".json", ".json.gz", ".yaml", ".yml")


def profile_dir() -> Path:
    """The folder of shipped profiles."""
    return Path(str(importlib.resources.files("profiles")))


def shipped_profile_paths() -> list[Path]:
    """Shipped profile files, sorted by name."""
    return sorted(p for p in profile_dir().iterdir()
                  if p.is_file() and p.name.lower().endswith(_SUFFIXES))


def profile_stem(path: str | Path) -> str:
    """A profile file's name without its format suffix (``gpt2.json.gz`` -> ``gpt2``)."""
    name = Path(path).name
    for suffix in _SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def resolve_profile(spec: str | Path) -> Path:
    """A profile argument: an existing file, or the name of a shipped profile.

    Raises InputError when it is neither.
    """
    path = Path(spec)
    if path.exists() or path.name.lower().endswith(_SUFFIXES):
        return path
    for candidate in shipped_profile_paths():
        if profile_stem(candidate) == str(spec):
            return candidate
    names = ", ".join(profile_stem(p) for p in shipped_profile_paths()) or "none"
    raise InputError(str(spec), "", f"no such file, and no shipped profile of that name (shipped: {names})")


def open_profile(spec: str | Path) -> Profile:
    """Load a profile given as a path or a shipped profile name."""
    return load_profile(resolve_profile(spec))


DEFAULT_HARDWARE = "a100-40gb-pcie4"


def default_hardware(explicit: str | None, plan=None, profile: Profile | None = None) -> str:
    """Which hardware to use (see ``choose_hardware``): a preset name or a file."""
    return choose_hardware(explicit, plan, profile)[0]


def choose_hardware(explicit: str | None, plan=None, profile: Profile | None = None) -> tuple[str, str | None]:
    """Which hardware to use, and a note for the user when it was not given:
    the explicit one; the plan's; the profile's roofline preset (``source.timing =
    roofline:<preset>``); the preset whose GPU matches the one a measured profile names
    (``source.device``, e.g. ``NVIDIA H100 80GB HBM3``); else a100-40gb-pcie4.

    The note (None when nothing needs saying) names the device and the choice made.
    """
    if explicit:
        return explicit, None
    if plan is not None and plan.hardware:
        return plan.hardware, None
    source = (profile.source or {}) if profile is not None else {}
    timing = str(source.get("timing", ""))
    if timing.startswith("roofline:"):
        return timing.split(":", 1)[1], None
    device = source.get("device")
    if isinstance(device, str) and device.strip():
        match = preset_for_device(device)
        if match is not None:
            return match, (f"hardware {match}: the preset matching the profile's GPU ({device}); "
                           "--hardware chooses another")
        return DEFAULT_HARDWARE, (f"the profile's GPU ({device}) matches no preset; simulated on "
                                  f"{DEFAULT_HARDWARE}; --hardware chooses another")
    return DEFAULT_HARDWARE, None


def preset_for_device(device: str) -> str | None:
    """The one GPU among the presets whose family (A100, H100, V100, 4090, ...) is named in
    ``device`` and, when ``device`` names a memory size (``80GB``), has that much memory;
    else None. Of several presets of that GPU (the RTX 4090 alone and in LoHan's 256 GB
    workstation), the plain one: the shortest name. A trace is one GPU's: the multi-GPU
    machines (an ``interconnect``) are not among the choices."""
    from .hardware import load_presets

    tokens = set(re.findall(r"[A-Z0-9]+", device.upper()))
    sizes = {t for t in tokens if re.fullmatch(r"\d+GB", t)}
    found = []
    for preset in load_presets():
        if preset.interconnect is not None:
            continue
        family = [t for t in re.findall(r"[A-Z0-9]+", preset.gpu.model.upper()) if re.fullmatch(r"[A-Z]?\d{3,4}", t)]
        if not family or family[0] not in tokens:
            continue
        if sizes and f"{preset.gpu.memory_bytes // 2**30}GB" not in sizes:
            continue
        found.append((preset.gpu.model, len(preset.name), preset.name))
    return min(found)[2] if len({model for model, _, _ in found}) == 1 else None


def collectives_by_kind(profile: Profile) -> dict[str, dict[str, int]]:
    """Per collective kind (R56): its ops, their payload bytes and the bytes this rank
    sends (``Collective.wire_bytes``)."""
    found = {kind: {"ops": 0, "bytes": 0, "wire_bytes": 0} for kind in COLLECTIVE_KINDS}
    for op in profile.ops:
        if op.collective is not None:
            row = found[op.collective.kind]
            row["ops"] += 1
            row["bytes"] += op.collective.bytes
            row["wire_bytes"] += op.collective.wire_bytes()
    return found


def profile_summary(profile: Profile, largest: int = 10) -> dict:
    """The stable ``info --json`` fields of a profile (sizes in bytes, times in us)."""
    bytes_by_kind = {kind: 0 for kind in TENSOR_KINDS}
    count_by_kind = {kind: 0 for kind in TENSOR_KINDS}
    for tensor in profile.tensors:
        bytes_by_kind[tensor.kind] += tensor.bytes
        count_by_kind[tensor.kind] += 1
    phases = Counter(op.phase for op in profile.ops)
    time_by_phase = {phase: 0.0 for phase in PHASES}
    for op in profile.ops:
        time_by_phase[op.phase] += op.time_us
    peak_op = profile.ops[profile.op_index[profile.peak_op]] if profile.peak_op else None
    top = heapq.nsmallest(largest, profile.tensors, key=lambda t: (-t.bytes, t.id))
    collectives = collectives_by_kind(profile)
    shard = profile.source.get("shard")
    return {
        "name": profile.name,
        "file": profile.origin,
        "source": profile.source,
        "ops": len(profile.ops),
        "tensors": len(profile.tensors),
        "ops_by_phase": {phase: phases.get(phase, 0) for phase in PHASES},
        "time_us_by_phase": time_by_phase,
        "bytes_by_kind": bytes_by_kind,
        "tensors_by_kind": count_by_kind,
        "persistent_bytes": profile.persistent_bytes,
        "peak_bytes": profile.peak_bytes,
        "peak_op": profile.peak_op,
        "peak_op_name": peak_op.name if peak_op else None,
        "peak_op_phase": peak_op.phase if peak_op else None,
        "ideal_us": profile.ideal_us,
        "largest_tensors": [{"id": t.id, "bytes": t.bytes, "kind": t.kind, "name": t.name}
                            for t in top],
        "shard": shard if isinstance(shard, dict) else None,   # one data-parallel rank: how it was made
        "collective_ops": sum(row["ops"] for row in collectives.values()),
        "collectives_by_kind": collectives,
    }


def shipped_profiles_summary() -> list[dict]:
    """``profiles --json``: name, path, ops, peak_bytes, ideal_us of each shipped profile."""
    rows = []
    for path in shipped_profile_paths():
        profile = load_profile(path)
        rows.append({"name": profile.name, "path": str(path), "ops": len(profile.ops),
                     "tensors": len(profile.tensors), "peak_bytes": profile.peak_bytes,
                     "ideal_us": profile.ideal_us, "source": profile.source.get("kind")})
    return rows
