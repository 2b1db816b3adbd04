"""Facts about a profile that planners of several families use: when each op starts on
an ideal timeline, each tensor's touches and idle gaps between them, the bytes held at each
op, an op's working set and its fastest variant, the smallest budget any plan can meet
(explicit or in UVM mode), and the profile's structure: its layers as they run, what an op
reads, and where a tensor's forward uses end and its later uses begin.

Plain functions over a Profile (NetworkX style); nothing here knows a planner, and no
planner has to import another for a fact about the profile. (``touches`` gives one
tensor's touches; ``touch_map`` gives every tensor's at once, in one pass over the ops.)
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from simulator.profile import Profile


def op_start_us(profile: Profile) -> tuple[float, ...]:
    """Start time of each op when nothing stalls (the ideal timeline); one extra entry
    at the end holds the ideal iteration time (as the compiled profile's ``op_starts_us``)."""
    return (0.0, *accumulate(op.time_us for op in profile.ops))


def touches(profile: Profile, tid: str) -> list[int]:
    """Op positions that produce, read or update the tensor, in order."""
    found = set(profile.consumers[tid]) | set(profile.updaters[tid])
    if profile.producer[tid] is not None:
        found.add(profile.producer[tid])
    return sorted(found)


def held_per_op(n: int, spans) -> np.ndarray:
    """Bytes held at each of ``n`` op positions by ``spans`` ((lo, hi, bytes): held at
    positions lo .. hi-1, hi <= n)."""
    held = np.zeros(n + 1, dtype=np.int64)
    for lo, hi, nbytes in spans:
        held[lo] += nbytes
        held[hi] -= nbytes
    return np.cumsum(held[:n])


@dataclass(frozen=True)
class Gap:
    """An idle interval of a tensor: after op position ``after`` it is not touched again
    until op position ``before`` (``after < before - 1``)."""
    tensor: str
    nbytes: int
    after: int
    before: int
    start_us: float   # ideal end of op ``after``
    end_us: float     # ideal start of op ``before``

    @property
    def length_us(self) -> float:
        return self.end_us - self.start_us


def idle_gaps(profile: Profile, tid: str, starts: tuple[float, ...] | None = None) -> list[Gap]:
    """The tensor's gaps between consecutive touches that contain at least one other op.

    Only gaps inside the iteration; a persistent tensor's gap across the iteration
    boundary (last touch to first touch of the next iteration) is not included.
    """
    starts = starts if starts is not None else op_start_us(profile)
    nbytes = profile.tensor_by_id[tid].bytes
    points = touches(profile, tid)
    return [Gap(tid, nbytes, a, b, starts[a + 1], starts[b])
            for a, b in zip(points, points[1:]) if b - a >= 2]


def working_set(profile: Profile, position: int, include_persistent: bool = True, variants: bool = False) -> int:
    """Bytes an op needs on the GPU while it runs: its inputs, outputs, in-place updates
    and workspace (persistent tensors only if ``include_persistent``; the smallest
    workspace of its algorithms with ``variants``, R52)."""
    op = profile.ops[position]
    tensors = profile.tensor_by_id
    ids = set(op.inputs) | set(op.outputs) | set(op.updates)
    workspace = least_workspace(op) if variants else op.workspace_bytes
    return workspace + sum(tensors[t].bytes for t in ids if include_persistent or not tensors[t].persistent)


def least_workspace(op) -> int:
    """The smallest workspace among an op's default algorithm and its variants (R52)."""
    return min((op.workspace_bytes, *(v.workspace_bytes for v in op.variants)))


def fastest_time_us(op) -> float:
    """The shortest time among an op's default algorithm and its variants (R52)."""
    return min((op.time_us, *(v.time_us for v in op.variants)))


def budget_floor(profile: Profile, moves_persistent: bool, cpu_phases: tuple[str, ...] = (),
                 variants: bool = False) -> tuple[int, str | None]:
    """The smallest budget any plan of this kind can meet, and the op that sets it.

    A planner that keeps weights and optimizer state on the GPU needs them all plus the
    largest working set of non-persistent tensors of a single op; one that may move them
    needs only the largest single-op working set. Ops of ``cpu_phases`` (a planner that
    runs them on the host CPU) need no GPU memory. A planner that chooses op variants
    (``variants``) needs each op's smallest workspace only.
    """
    base = 0 if moves_persistent else profile.persistent_bytes
    best, where = base, None
    for i, op in enumerate(profile.ops):
        if op.phase in cpu_phases:
            continue
        need = base + working_set(profile, i, include_persistent=moves_persistent, variants=variants)
        if need > best:
            best, where = need, op.id
    return best, where


def uvm_floor(profile: Profile, block: int, batch_blocks: int = 1) -> tuple[int, str | None]:
    """The smallest budget a plan in UVM mode can run at, and the op that sets it: an
    item needs its outputs and workspace on the GPU, and room for one fault batch of
    what it reads (R32 as docs/simulation.md extends it: its inputs stream through, so
    none of them has to stay whole); nothing else has to stay."""
    tensors = profile.tensor_by_id
    best, where = 0, None
    for op in profile.ops:
        outputs = sum(tensors[t].bytes for t in dict.fromkeys(op.outputs))
        reads = [tensors[t].bytes for t in dict.fromkeys(op.inputs + op.updates)]
        need = max(op.workspace_bytes + outputs, min(max(reads, default=0), block * batch_blocks))
        if need > best:
            best, where = need, op.id
    return best, where


# ----------------------------------------------------------------------------- structure
def layer_segments(profile: Profile) -> list[tuple[int, int]]:
    """The profile's ops cut into layers as they run: maximal runs of consecutive ops
    with the same ``module`` and phase (an op without a module is a layer of its own).
    (first, last) op positions, in order."""
    out: list[tuple[int, int]] = []
    key_of = None
    for i, op in enumerate(profile.ops):
        key = None if op.module is None else (op.module, op.phase)
        if out and key is not None and key == key_of:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
        key_of = key
    return out


def touch_map(profile: Profile) -> dict[str, list[int]]:
    """Per tensor, the op positions that make, read or update it, in order (tensors no op
    touches are absent)."""
    found: dict[str, list[int]] = {}
    for i, op in enumerate(profile.ops):
        for tid in dict.fromkeys(op.outputs + op.inputs + op.updates):
            found.setdefault(tid, []).append(i)
    return found


def read_ops(profile: Profile, i: int) -> list[str]:
    """The tensors op i reads or updates (what it may fault on in UVM mode, R31), in order."""
    op = profile.ops[i]
    return list(dict.fromkeys(op.inputs + op.updates))


def forward_backward_split(profile: Profile, tid: str) -> tuple[int, int] | None:
    """(last forward use, first backward use) of a tensor, or None when it has no use
    outside the forward phase or a forward use comes after a backward one."""
    uses = sorted(set(profile.consumers[tid]) | set(profile.updaters[tid]))
    forward = [u for u in uses if profile.ops[u].phase == "forward"]
    later = [u for u in uses if profile.ops[u].phase != "forward"]
    if not later:
        return None
    last_forward = max(forward) if forward else profile.producer[tid]
    if last_forward >= min(later):
        return None
    return last_forward, min(later)


def forward_maps(profile: Profile):
    """(tensor, last forward use, first later use) of every non-empty tensor a forward op
    makes that is used again after the forward pass (``forward_backward_split``), in
    profile order: what layer-wise policies (vdnn's kind: gtbm, layrub) move."""
    for tensor in profile.tensors:
        made = profile.producer[tensor.id]
        if tensor.persistent or tensor.bytes == 0 or made is None or profile.ops[made].phase != "forward":
            continue
        split = forward_backward_split(profile, tensor.id)
        if split is not None:
            yield tensor.id, split[0], split[1]
