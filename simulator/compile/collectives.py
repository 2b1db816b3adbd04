"""A rank's collectives in a plan's program (R56-R58), and which items of the three
streams wait for which (R27, R58).

A collective op (``Op.collective``) is an item of the compute sequence that runs on a
third stream, ``comm``: its flow crosses the interconnect (R57), it is issued once the
GPU item before it has started, and it waits, and is waited for, through data as the CPU
stream is (R27). ``comm_program`` fills a Program's fields for them;
``stream_deps`` is the one statement of the cross-stream waits for all three streams.
"""
from __future__ import annotations

from ..errors import InputError
from ..model.links import collective_route
from ..profile import Profile
from .compiled import CompiledProfile, Machine
from .sequence import Sequence

GPU, CPU, COMM = 0, 1, 2   # the streams an item runs on


def check_interconnect(compiled: CompiledProfile, machine: Machine, file: str) -> None:
    """R57: a rank's profile needs a machine whose ``interconnect`` holds its world;
    InputError naming the hardware file's field otherwise."""
    if not compiled.collectives:
        return
    world = max(c.world for c in compiled.collectives.values())
    link = machine.interconnect
    if link is None:
        raise InputError(file, "interconnect", f"profile {compiled.name!r} is one rank of {world} (it has "
                                               "collective ops, R56): the machine needs an interconnect section "
                                               "(R57; presets: a100-80gb-sxm-x8, h100-80gb-sxm-x8, "
                                               "h100-80gb-sxm-x8-2node, rtx4090-24gb-pcie4-x4)")
    if world > link.world:
        raise InputError(file, "interconnect.gpus", f"profile {compiled.name!r} is one rank of {world}; "
                                                    f"the machine has {link.world} GPUs")


def comm_items(profile: Profile, seq: Sequence) -> frozenset:
    """R56: the items that run a collective: the ops themselves (R15 refuses re-running one)."""
    ops = profile.ops
    return frozenset(k for k, (i, tid) in enumerate(zip(seq.op_index, seq.recomputed))
                     if tid is None and ops[i].collective is not None and k not in seq.codec)


def comm_work(profile: Profile, seq: Sequence, on_comm: frozenset, machine: Machine) -> dict:
    """R57: per collective item, (wire bytes this rank sends, latency ps of its ring
    steps, the links its flow crosses)."""
    work = {}
    for k in on_comm:
        collective = profile.ops[seq.op_index[k]].collective
        route = collective_route(machine.interconnect, collective.world)
        work[k] = (collective.wire_bytes(), route.latency_ps(collective.steps()), route.links)
    return work


def comm_capacity(compiled: CompiledProfile, machine: Machine) -> tuple[int, int]:
    """The capacities of the two collective links (R57) for this rank's world."""
    world = max(c.world for c in compiled.collectives.values())
    return collective_route(machine.interconnect, world).capacity


def issue_points(seq: Sequence, on_other: frozenset, on_comm: frozenset) -> dict[int, int]:
    """R58: per collective item, the GPU item before it in the sequence (-1: none), which
    must have started before the collective may: the host thread issues the collective
    after launching that kernel."""
    points, last_gpu = {}, -1
    for k in range(len(seq)):
        if k in on_comm:
            points[k] = last_gpu
        elif k not in on_other:
            last_gpu = k
    return points


def stream_deps(profile: Profile, seq: Sequence, stream_of: dict[int, int]) -> dict[int, tuple[int, ...]]:
    """R27, R58: for each item, per other stream, the latest earlier item of that stream
    that touches a tensor it touches, one of the two writing it (producing or updating).
    ``stream_of`` names the items off the GPU stream (CPU or COMM); each stream runs in
    order, so waiting for that one item of each covers all earlier ones."""
    ops = profile.ops
    touched: set[str] = set()
    for k in stream_of:
        op = ops[seq.op_index[k]]
        touched.update(op.inputs, op.outputs, op.updates)
    found: dict[int, dict[int, int]] = {}
    for tid in touched:
        items = set(seq.uses.get(tid, ()))
        made_by = profile.producer[tid]
        if made_by is not None:
            items.add(seq.op_item[ops[made_by].id])
        seen: list[tuple[int, bool, int]] = []
        for k in sorted(items):
            op = ops[seq.op_index[k]]
            writes = seq.recomputed[k] == tid or (seq.recomputed[k] is None and (tid in op.outputs or tid in op.updates))
            stream = stream_of.get(k, GPU)
            waited: set[int] = set()
            for j, earlier_writes, other in reversed(seen):
                if other != stream and other not in waited and (writes or earlier_writes):
                    waited.add(other)
                    mine = found.setdefault(k, {})
                    if j > mine.get(other, -1):
                        mine[other] = j
            seen.append((k, writes, stream))
    return {k: tuple(sorted(by_stream.values())) for k, by_stream in found.items()}
