"""The compute sequence of a plan (R5) and the last use of every tensor on it (R8).

Item k of the sequence runs profile op ``op_index[k]``: either that op itself or, when
``recomputed[k]`` names a tensor, a recompute of it by its producer before op
``group[k]``. Plain parallel lists, built once per (schedule, recomputes).
"""
from __future__ import annotations

from dataclasses import dataclass

from .profile import Profile


@dataclass
class Sequence:
    """The compute sequence as parallel lists indexed by item, plus its uses (R8)."""
    op_index: list[int]
    recomputed: list[str | None]
    group: list[str]
    allocs: list[tuple[str, ...]]        # tensors allocated at start
    alloc_bytes: list[int]               # allocs + workspace
    workspace: list[int]
    time_ps: list[int]
    frees: list[tuple[str, ...]]         # non-persistent tensors whose last use it is (R7, R8)
    uses: dict[str, list[int]]           # tensor -> items that read or update it
    group_start: dict[str, int]          # op id -> first item of its group
    op_item: dict[str, int]              # op id -> its own item
    recompute_items: dict[str, list[int]]

    def __len__(self) -> int:
        return len(self.op_index)

    def name(self, k: int) -> str:
        """How messages name item k."""
        tid = self.recomputed[k]
        return self.group[k] if tid is None else f"recompute of {tid} before {self.group[k]}"


def build_sequence(profile: Profile, op_ps, order: list[str], recomputes: dict[str, list[str]]) -> Sequence:
    """R5 and R8: for each op of ``order``, its recomputes (tensor ids, plan order), then
    the op. Every recomputed tensor must have a producer (checked by the caller)."""
    tensors = profile.tensor_by_id
    seq = Sequence([], [], [], [], [], [], [], [], {}, {}, {}, {})
    for op_id in order:
        seq.group_start[op_id] = len(seq.op_index)
        for tid in recomputes.get(op_id, ()):
            producer = profile.producer[tid]
            op = profile.ops[producer]
            seq.recompute_items.setdefault(tid, []).append(len(seq.op_index))
            _append(seq, producer, tid, op_id, (tid,), op.workspace_bytes, tensors[tid].bytes, op_ps[producer])
            for read in dict.fromkeys(op.inputs):
                seq.uses.setdefault(read, []).append(len(seq.op_index) - 1)
        index = profile.op_index[op_id]
        op = profile.ops[index]
        allocs = tuple(dict.fromkeys(op.outputs))
        seq.op_item[op_id] = len(seq.op_index)
        _append(seq, index, None, op_id, allocs, op.workspace_bytes,
                sum(tensors[t].bytes for t in allocs), op_ps[index])
        for read in op.inputs + op.updates:
            uses = seq.uses.setdefault(read, [])
            if not uses or uses[-1] != len(seq.op_index) - 1:
                uses.append(len(seq.op_index) - 1)
    frees: dict[int, list[str]] = {}
    for tid, made_by in profile.producer.items():
        if made_by is not None:  # R8: the last item that uses it, else its producer
            uses = seq.uses.get(tid)
            frees.setdefault(uses[-1] if uses else seq.op_item[profile.ops[made_by].id], []).append(tid)
    seq.frees = [tuple(frees.get(k, ())) for k in range(len(seq.op_index))]
    return seq


def _append(seq: Sequence, op_index: int, recomputed, group, allocs, workspace, tensor_bytes, time_ps) -> None:
    seq.op_index.append(op_index)
    seq.recomputed.append(recomputed)
    seq.group.append(group)
    seq.allocs.append(allocs)
    seq.workspace.append(workspace)
    seq.alloc_bytes.append(tensor_bytes + workspace)
    seq.time_ps.append(time_ps)
