"""Split ops (R54): a plan's ``splits`` ({op: k}) as the profile it runs.

An op split into k chunks becomes k ops ``<op>/1`` .. ``<op>/k`` in its place, each with
1/k of its time (plus its ``launch_us``), of its flops and of its workspace. A tensor is
*sliced* when its producer and every op that reads or updates it are split with the same
k, it is not 0-d (a reduction's single value) and, where shapes are known, it is cut along
the producer's split (its batch, or its rows, those of one of the producer's inputs; a
weight's gradient, summed over them, is not): it becomes k tensors ``<tensor>/1`` ..
``<tensor>/k`` (the bytes shared out, the first ones a byte larger when k does not divide
them), chunk j making and
reading slice j, so a slice is allocated when its chunk of the producer starts and freed
after its chunk of the last reader, as any tensor is (R6, R7). Every other tensor of a
split op is whole: an output is made by the first chunk and updated by the others (an
accumulation), an input is read by every chunk. Rewriting the profile is the rule: the
simulator, the C path, the executor and every planner then run the result unchanged.
"""
from __future__ import annotations

from dataclasses import replace

from ..errors import InputError
from ..profile import Op, Profile, Tensor

SEPARATOR = "/"
_STATE = ("weight", "optimizer_state")   # what a split op reads whole: not the data it is split along


def chunk_ids(splits: dict) -> set[str]:
    """The ids of every chunk op the splits make (``<op>/1`` .. ``<op>/k``)."""
    return {f"{op_id}{SEPARATOR}{j}" for op_id, k in splits.items() for j in range(1, k + 1)}


def check_splits(profile: Profile, splits: dict, file: str = "<plan>") -> None:
    """InputError naming ``splits.<op>`` for an unknown op, an op the profile does not mark
    splittable (R54), or a chunk count outside 2..its ``max_chunks``."""
    for op_id, k in splits.items():
        index = profile.op_index.get(op_id)
        if index is None:
            raise InputError(file, f"splits.{op_id}", f"unknown op {op_id!r}")
        op = profile.ops[index]
        if op.split is None:
            raise InputError(file, f"splits.{op_id}", f"op {op_id!r} ({op.name}) is not marked splittable in the "
                                                      "profile (R54)")
        if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= op.split.max_chunks:
            raise InputError(file, f"splits.{op_id}", f"expected a number of chunks from 2 to {op.split.max_chunks} "
                                                      f"(the op's max_chunks), got {k!r}")


def sliced_tensors(profile: Profile, splits: dict) -> dict[str, int]:
    """R54: tensor id -> k for the tensors the splits slice: made by an op split k ways, read
    by at least one op, read and updated only by ops split k ways (chunk j reading or
    updating slice j: an in-place ReLU), not persistent, not 0-d."""
    out = {}
    for op_id, k in splits.items():
        for tid in profile.ops[profile.op_index[op_id]].outputs:
            tensor = profile.tensor_by_id[tid]
            readers = profile.consumers.get(tid, ())
            if tensor.persistent or not readers or tensor.shape == ():
                continue   # a 0-d tensor (a loss, a count) is a reduction: each chunk adds to it whole
            if not _along_the_split(profile, profile.ops[profile.op_index[op_id]], tensor):
                continue   # a weight's gradient summed over the batch: each chunk adds to it whole
            if all(splits.get(profile.ops[q].id) == k for q in (*readers, *profile.updaters.get(tid, ()))):
                out[tid] = k
    return out


def _rows(shape: tuple[int, ...], over: str) -> int:
    """The extent a split ``over`` the batch (the first dimension) or the rows (every
    dimension but the last) cuts."""
    if over == "batch" or len(shape) < 2:
        return shape[0]
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    return rows


def _along_the_split(profile: Profile, op: Op, tensor: Tensor) -> bool:
    """Is an output cut along the op's split? For ``batch`` and ``rows`` splits, when
    shapes are known, its batch or rows match those of one of the op's inputs other than
    weights and optimizer state (a reduction over them, such as a weight's gradient, does
    not); ``elements`` splits, unknown shapes and ops without such inputs cut every output."""
    if op.split.over not in ("batch", "rows") or tensor.shape is None:
        return True
    tensors = profile.tensor_by_id
    data = [tensors[t].shape for t in op.inputs if tensors[t].kind not in _STATE and tensors[t].shape]
    return not data or _rows(tensor.shape, op.split.over) in {_rows(shape, op.split.over) for shape in data}


def split_profile(profile: Profile, splits: dict, file: str = "<plan>") -> Profile:
    """R54: the profile a plan with ``splits`` runs (the module docstring); ``profile`` itself
    when there are none. InputError as ``check_splits``, or when a chunk's id is taken."""
    if not splits:
        return profile
    check_splits(profile, splits, file)
    sliced = sliced_tensors(profile, splits)
    taken = set(profile.op_index) | set(profile.tensor_by_id)
    tensors: list[Tensor] = []
    for tensor in profile.tensors:
        k = sliced.get(tensor.id)
        if k is None:
            tensors.append(tensor)
            continue
        share, extra = divmod(tensor.bytes, k)
        for j in range(1, k + 1):
            tid = _chunk_id(tensor.id, j, taken, file)
            tensors.append(replace(tensor, id=tid, bytes=share + (1 if j <= extra else 0), shape=None, fx=None))
    ops: list[Op] = []
    for op in profile.ops:
        k = splits.get(op.id)
        if k is None:
            ops.append(op)   # it reads no sliced tensor: every reader of one is split
            continue
        ops.extend(_chunks(op, k, sliced, taken, file))
    return Profile(name=profile.name, tensors=tuple(tensors), ops=tuple(ops), source=profile.source,
                   origin=profile.origin)


def _chunks(op: Op, k: int, sliced: dict, taken: set, file: str) -> list[Op]:
    ws_share, ws_extra = divmod(op.workspace_bytes, k)
    chunks = []
    for j in range(1, k + 1):
        def part(tid: str) -> str:
            return f"{tid}{SEPARATOR}{j}" if tid in sliced else tid
        inputs = tuple(part(t) for t in op.inputs)
        if j == 1:
            outputs = tuple(part(t) for t in op.outputs)
            updates = tuple(part(t) for t in op.updates)
        else:   # a whole output is made by the first chunk and accumulated into by the rest
            outputs = tuple(part(t) for t in op.outputs if t in sliced)
            updates = tuple(dict.fromkeys((*(part(t) for t in op.updates),
                                           *(t for t in op.outputs if t not in sliced))))
        rerun = None if op.rerun_outputs is None else tuple(part(t) for t in op.rerun_outputs if part(t) in outputs)
        chunks.append(Op(id=_chunk_id(op.id, j, taken, file), name=op.name, phase=op.phase,
                         time_us=op.time_us / k + op.split.launch_us, inputs=inputs, outputs=outputs,
                         updates=updates, workspace_bytes=ws_share + (1 if j <= ws_extra else 0),
                         flops=None if op.flops is None else op.flops / k, module=op.module,
                         rerun_outputs=rerun))
    return chunks


def _chunk_id(base: str, j: int, taken: set, file: str) -> str:
    cid = f"{base}{SEPARATOR}{j}"
    if cid in taken:
        raise InputError(file, "splits", f"the chunk id {cid!r} is already an op or tensor of the profile (R54)")
    return cid
