"""Facts about a profile's structure that planners of several families use: its layers as
they run, every tensor's touches, what an op reads, and where a tensor's forward uses end
and its later uses begin.

They lived in the planners that needed them first (``vdnn``, ``uvm``); here no planner has
to import another for a fact about the profile. Plain functions over a Profile; nothing
here knows a planner. (``analysis.touches`` gives one tensor's touches; ``touch_map``
below gives every tensor's at once, in one pass over the ops.)
"""
from __future__ import annotations

from simulator.profile import Profile


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
