"""The compute sequence of a plan (R5) and the last use of every tensor on it (R8).

Item k of the sequence runs profile op ``op_index[k]``: either that op itself or, when
``recomputed[k]`` names a tensor, a recompute of it by its producer before op
``group[k]``. Plain parallel lists, built once per (schedule, recomputes). A plan with on-GPU codecs
(R41, R42) adds codec items: decodes first in an op's group, encodes right after the op;
``codec[k]`` says what such an item k does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..model.recompute import recompute_reads, recompute_scratch
from ..profile import Profile


@dataclass(frozen=True, slots=True)
class CodecItem:
    """An encode or decode kernel in the compute sequence (R41, R42): it allocates what
    ``allocs`` names (the encoded buffer, or the decoded tensor), runs ``time_ps``, and
    frees ``frees`` from GPU memory when it ends (never a host or SSD copy)."""
    kind: str                   # "encode" | "decode"
    tensor: str
    codec: str
    buffer: str                 # the GPU buffer holding the encoded copy
    allocs: tuple[str, ...]
    alloc_bytes: int
    time_ps: int
    frees: tuple[str, ...]
    action: int                 # the plan action it serves (an encode, decode, offload or prefetch)


@dataclass
class Sequence:
    """The compute sequence as parallel lists indexed by item, plus its uses (R8)."""
    op_index: list[int]
    recomputed: list[str | None]
    group: list[str]
    allocs: list[tuple[str, ...]]        # tensors allocated at start
    alloc_bytes: list[int]               # allocs + workspace
    workspace: list[int]                 # scratch held while the item runs: the op's workspace, and for a
                                         # recompute the other outputs its re-run makes (R15)
    time_ps: list[int]
    frees: list[tuple[str, ...]]         # non-persistent tensors whose last use it is (R7, R8)
    uses: dict[str, list[int]]           # tensor -> items that read or update it
    group_start: dict[str, int]          # op id -> first item of its group
    op_item: dict[str, int]              # op id -> its own item
    recompute_items: dict[str, list[int]]
    codec: dict[int, CodecItem] = field(default_factory=dict)   # item -> what a codec item does
    reads: dict[int, tuple[str, ...]] = field(default_factory=dict)   # recompute item -> what it reads (R60)
    uvm: object = None   # its UVM touches (simulator/compile/uvm.py ``UvmTouches``), made by the first UVM
                         # compile on it: the default sequence is shared by every plan without a schedule

    def __len__(self) -> int:
        return len(self.op_index)

    def name(self, k: int) -> str:
        """How messages name item k."""
        if self.codec and k in self.codec:
            item = self.codec[k]
            where = "after" if item.kind == "encode" else "before"
            return f"{item.kind} of {item.tensor} {where} {self.group[k]}"
        tid = self.recomputed[k]
        return self.group[k] if tid is None else f"recompute of {tid} before {self.group[k]}"


def build_sequence(profile: Profile, op_ps, order: list[str], recomputes: dict[str, list[str]],
                   decodes: dict[str, list[CodecItem]] | None = None,
                   encodes: dict[str, list[CodecItem]] | None = None,
                   workspace: dict[int, int] | None = None) -> Sequence:
    """R5 and R8: for each op of ``order``, its decodes (R41, R42), its recomputes (tensor
    ids, plan order; each holds its producer's workspace and the other outputs the re-run
    makes, R15), then the op and its encodes; each item allocates its outputs and its
    workspace together when it starts (R6). Every recomputed tensor must have a
    producer (checked by the caller). Codec items are not uses (R8): their tensor's
    last use stays that of the ops. ``op_ps`` and ``workspace`` (op position -> bytes)
    give the variants a plan chose (R52)."""
    tensors = profile.tensor_by_id
    seq = Sequence([], [], [], [], [], [], [], [], {}, {}, {}, {})
    decodes, encodes, workspace = decodes or {}, encodes or {}, workspace or {}
    position = {op_id: k for k, op_id in enumerate(order)} if profile.gather_twins else None
    for op_id in order:
        seq.group_start[op_id] = len(seq.op_index)
        index = profile.op_index[op_id]
        for item in decodes.get(op_id, ()):
            _append_codec(seq, index, op_id, item)
        for tid in recomputes.get(op_id, ()):
            producer = profile.producer[tid]
            op = profile.ops[producer]
            seq.recompute_items.setdefault(tid, []).append(len(seq.op_index))
            scratch = recompute_scratch(profile, tid, workspace.get(producer, op.workspace_bytes))
            _append(seq, producer, tid, op_id, (tid,), scratch, tensors[tid].bytes, op_ps[producer])
            reads = op.inputs
            if position is not None:     # R60: gathered copies as gathered last before op_id
                reads = recompute_reads(profile, producer, position[op_id], position)
                if reads != op.inputs:
                    seq.reads[len(seq.op_index) - 1] = reads
            for read in dict.fromkeys(reads):
                seq.uses.setdefault(read, []).append(len(seq.op_index) - 1)
        op = profile.ops[index]
        allocs = tuple(dict.fromkeys(op.outputs))
        seq.op_item[op_id] = len(seq.op_index)
        _append(seq, index, None, op_id, allocs, workspace.get(index, op.workspace_bytes),
                sum(tensors[t].bytes for t in allocs), op_ps[index])
        for read in op.inputs + op.updates:
            uses = seq.uses.setdefault(read, [])
            if not uses or uses[-1] != len(seq.op_index) - 1:
                uses.append(len(seq.op_index) - 1)
        for item in encodes.get(op_id, ()):
            _append_codec(seq, index, op_id, item)
    frees: dict[int, list[str]] = {}
    for tid, made_by in profile.producer.items():
        if made_by is not None:  # R8: the last item that uses it, else its producer
            uses = seq.uses.get(tid)
            frees.setdefault(uses[-1] if uses else seq.op_item[profile.ops[made_by].id], []).append(tid)
    seq.frees = [tuple(frees.get(k, ())) for k in range(len(seq.op_index))]
    return seq


def _append_codec(seq: Sequence, op_index: int, group: str, item: CodecItem) -> None:
    seq.codec[len(seq.op_index)] = item
    _append(seq, op_index, None, group, item.allocs, 0, item.alloc_bytes, item.time_ps)


def _append(seq: Sequence, op_index: int, recomputed, group, allocs, workspace, tensor_bytes, time_ps) -> None:
    seq.op_index.append(op_index)
    seq.recomputed.append(recomputed)
    seq.group.append(group)
    seq.allocs.append(allocs)
    seq.workspace.append(workspace)
    seq.alloc_bytes.append(tensor_bytes + workspace)
    seq.time_ps.append(time_ps)
