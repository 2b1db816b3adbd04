"""What the compression planners share (cdma, gist, cswap): finding a machine's codecs,
asking whether a codec may encode a tensor (R40), and putting a codec on another plan's
swaps, tensor by tensor, where a rule says it pays (R41)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from simulator.errors import InputError
from simulator.hardware import Codec, Hardware
from simulator.model.codecs import codec_problem, compressed_bytes
from simulator.model.links import link_speed
from simulator.plan import Action
from simulator.profile import Profile


def pick_codec(hardware: Hardware, name: str, planner: str, *, where: str | None = None,
               formats: tuple[str, ...] = ()) -> Codec | None:
    """The codec ``name`` of the machine, or with ``auto`` the first whose place and format
    match (None when the machine has none). InputError for an unknown name, or one that
    runs in the wrong place."""
    if name == "auto":
        for codec in hardware.codecs:
            if (where is None or codec.where == where) and (not formats or codec.format in formats):
                return codec
        return None
    codec = hardware.codec(name)
    if codec is None:
        known = ", ".join(c.name for c in hardware.codecs) or "none"
        raise InputError("<argument>", f"--param {planner}.codec",
                         f"hardware {hardware.name!r} has no codec {name!r} (its codecs: {known})")
    if where is not None and codec.where != where:
        raise InputError("<argument>", f"--param {planner}.codec",
                         f"codec {name!r} runs on {codec.where}; planner {planner!r} needs a {where} codec")
    return codec


def later_ops(profile: Profile, tid: str, position: int) -> list:
    """The ops after profile position ``position`` that read or update ``tid``."""
    uses = set(profile.consumers[tid]) | set(profile.updaters[tid])
    return [profile.ops[u] for u in sorted(uses) if u > position]


def may_encode(profile: Profile, tid: str, codec: Codec, position: int, allow_lossy: bool) -> bool:
    """R40: may ``codec`` encode ``tid`` right after profile op ``position``?"""
    tensor = profile.tensor_by_id[tid]
    return codec_problem(profile, tensor, codec, later_ops(profile, tid, position), allow_lossy) is None


def swap_seconds(profile: Profile, hardware: Hardware, actions: list[Action], tid: str,
                 codec: Codec | None) -> float:
    """The time, in us, ``tid``'s offloads and prefetches take on uncontended links, and
    with a compute codec its encode and decode kernels (R41's costs; latencies left out,
    they are the same either way)."""
    tensor = profile.tensor_by_id[tid]
    size = tensor.bytes if codec is None else compressed_bytes(tensor, codec)
    total = 0.0
    for action in actions:
        if action.tensor != tid or action.kind not in ("offload", "prefetch"):
            continue
        tier = action.to if action.kind == "offload" else action.source
        total += size / link_speed(hardware, action.kind, tier)[1]
        if codec is not None and codec.where == "compute":
            gbps = codec.encode_gbps if action.kind == "offload" else codec.decode_gbps
            total += tensor.bytes / (gbps * 1e3)
    return total


def compressible(profile: Profile, actions: list[Action], codec: Codec, tid: str, allow_lossy: bool) -> bool:
    """Can every offload and prefetch of ``tid`` carry ``codec`` (the prefetches read the
    copies the offloads wrote, R41)? Not for persistent tensors (their first copy may
    be an uncompressed initial one), tensors moved between SSD and host memory (loads
    and stores move plain copies), or, for a compute codec, an offload at the iteration
    start or a prefetch due at its end (its kernel runs after or before an op)."""
    tensor = profile.tensor_by_id[tid]
    if tensor.persistent or tensor.bytes == 0:
        return False
    index = profile.op_index
    mine = [a for a in actions if a.tensor == tid]
    if any(a.kind in ("load", "store", "encode", "decode") for a in mine):
        return False
    offloads = [a for a in mine if a.kind == "offload"]
    if not offloads:
        return False
    for action in mine:
        if codec.where == "compute" and ((action.kind == "offload" and action.after is None)
                                         or (action.kind == "prefetch" and action.before is None)):
            return False
    return all(may_encode(profile, tid, codec, -1 if a.after is None else index[a.after], allow_lossy)
               for a in offloads)


def with_codecs(actions: list[Action], chosen: dict[str, Codec]) -> list[Action]:
    """The actions, each offload and prefetch of a tensor in ``chosen`` carrying its codec."""
    return [replace(a, codec=chosen[a.tensor].name) if a.tensor in chosen and a.kind in ("offload", "prefetch")
            else a for a in actions]


def compress_where(profile: Profile, actions: list[Action], candidates: list[Codec], allow_lossy: bool,
                   pays: Callable[[str, Codec], float | None]) -> dict[str, Codec]:
    """Per swapped tensor, the candidate codec it may carry with the best ``pays`` figure
    (None or <= 0: it does not pay), by the order tensors are first moved."""
    chosen: dict[str, Codec] = {}
    seen: set[str] = set()
    for action in actions:
        tid = action.tensor
        if action.kind != "offload" or tid in seen:
            continue
        seen.add(tid)
        best, best_gain = None, 0.0
        for codec in candidates:
            if not compressible(profile, actions, codec, tid, allow_lossy):
                continue
            gain = pays(tid, codec)
            if gain is not None and gain > best_gain:
                best, best_gain = codec, gain
        if best is not None:
            chosen[tid] = best
    return chosen


def swap_codecs(hardware: Hardware, allow_lossy: bool) -> list[Codec]:
    """The machine's GPU codecs a swap may be compressed with (binarize serves Gist's
    stashed maps, not swaps; lossy ones only when allowed)."""
    return [c for c in hardware.codecs if c.where == "compute" and c.format != "binarize"
            and (allow_lossy or not c.lossy)]


def where_it_pays(profile: Profile, hardware: Hardware, actions: list[Action], candidates: list[Codec],
                  allow_lossy: bool) -> dict[str, Codec]:
    """CSWAP's rule: per swapped tensor, the candidate codec for which encode + the
    compressed copies + decode take least time, when less than the plain copies."""
    def saves(tid: str, codec: Codec) -> float:
        return swap_seconds(profile, hardware, actions, tid, None) - swap_seconds(profile, hardware, actions, tid,
                                                                                  codec)
    return compress_where(profile, actions, candidates, allow_lossy, saves)
