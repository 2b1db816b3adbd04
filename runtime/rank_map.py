"""What each tensor of a rank's profile (``shard.shard_profile``) is in the one-GPU graph
the runtime runs: the one-GPU tensor it stands for, and in which form.

Kernel ops keep their ids (and ``fx``) in a rank's profile; the positions of their
inputs, outputs and updates are kept with tensors substituted (a weight by its gathered
copy or its shard, a gradient by its shard). Comparing a rank op's lists position by
position with the one-GPU op of the same id maps every rank tensor to the tensor it
stands for. Its form:

- ``full``: the whole tensor (a weight, an activation, a full gradient, a gathered copy,
  whose storage may be padded to a multiple of the world: the value is its first
  elements in the tensor's shape);
- ``shard``: the rank's slice of the tensor flattened and padded with zeros to a
  multiple of the world, ``elements`` long (a ZeRO shard of a weight, of an optimizer
  state, of a gradient).

Per kernel op, ``subs`` lists where the graph must be fed another value than its own
node's (the tensor it stands for is another, or is a shard), and ``slices``, for an
optimizer op stepping shards (ZeRO-1/2), the full tensors it updates only the rank's
slice of (elementwise kernels: the slice is exact).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from simulator.errors import InputError
from simulator.profile import Profile

FULL, SHARD = "full", "shard"


@dataclass(frozen=True)
class RankTensor:
    tid: str            # the rank profile's tensor
    stands_for: str     # the one-GPU profile's tensor
    form: str           # FULL | SHARD
    elements: int       # elements of the rank tensor's storage (a shard's, or the full padded copy's)


@dataclass
class RankMap:
    world: int
    tensors: dict[str, RankTensor]
    subs: dict[str, list[tuple[str, str]]] = field(default_factory=dict)    # op -> (one-GPU tid, rank tid)
    slices: dict[str, list[str]] = field(default_factory=dict)              # op -> full rank tids it steps a slice of

    def numel(self, profile: Profile, tid: str) -> int:
        """Elements of the one-GPU tensor ``tid`` (from its shape; bytes / element size else)."""
        return _numel(profile.tensor_by_id[tid])


def _element_size(dtype: str | None) -> int:
    return {"fp16": 2, "bf16": 2, "float16": 2, "bfloat16": 2, "fp64": 8, "float64": 8, "int64": 8, "int8": 1,
            "uint8": 1, "bool": 1}.get(dtype or "fp32", 4)


def _numel(tensor) -> int:
    if tensor.shape is not None:
        n = 1
        for d in tensor.shape:
            n *= d
        return n
    return tensor.bytes // _element_size(tensor.dtype)


def rank_map(one_gpu: Profile, rank: Profile, world: int) -> RankMap:
    """Map ``rank`` (one rank of ``world``, sharded from ``one_gpu``) onto ``one_gpu``.
    InputError when a kernel op's lists do not line up or a tensor cannot be placed."""
    base_ops = {op.id: op for op in one_gpu.ops}
    stands: dict[str, str] = {}
    pairs: dict[str, list[tuple[str, str]]] = {}
    for op in rank.ops:
        if op.collective is not None:
            continue
        base = base_ops.get(op.id)
        if base is None:
            raise InputError(rank.origin, f"ops ({op.id})", "a kernel op of the rank that the one-GPU profile lacks")
        found = []
        for key in ("inputs", "outputs", "updates"):
            mine, theirs = getattr(op, key), getattr(base, key)
            if len(mine) != len(theirs):
                raise InputError(rank.origin, f"ops ({op.id}).{key}", "a different number of tensors than the "
                                                                      "one-GPU op of the same id")
            for r, u in zip(mine, theirs):
                if stands.setdefault(r, u) != u:
                    raise InputError(rank.origin, f"tensors ({r})", f"stands for both {stands[r]} and {u}")
                found.append((u, r))
        pairs[op.id] = found
    tensors: dict[str, RankTensor] = {}
    base_tensors = one_gpu.tensor_by_id
    for t in rank.tensors:
        u = stands.get(t.id, t.id if t.id in base_tensors else t.id.split("@", 1)[0])
        if u not in base_tensors:
            raise InputError(rank.origin, f"tensors ({t.id})", "stands for no tensor of the one-GPU profile")
        whole = base_tensors[u]
        elements = t.bytes // _element_size(whole.dtype)
        padded = -(-_numel(whole) // world) * world
        is_full = (t.bytes == whole.bytes and t.shape == whole.shape) or (t.bytes > whole.bytes and elements == padded)
        if not is_full and world > 1 and elements != padded // world:
            raise InputError(rank.origin, f"tensors ({t.id})", f"{t.bytes} bytes is neither {u} whole nor its "
                                                               f"shard over {world}")
        tensors[t.id] = RankTensor(t.id, u, FULL if is_full else SHARD, elements)
    out = RankMap(world, tensors)
    for op in rank.ops:
        if op.collective is not None:
            continue
        subs = [(u, r) for u, r in pairs[op.id] if r != u or tensors[r].form == SHARD]
        if subs:
            out.subs[op.id] = [(u, r) for u, r in dict.fromkeys(subs)]
        if op.phase == "optimizer" and any(tensors[r].form == SHARD for _, r in pairs[op.id]):
            full = [r for u, r in pairs[op.id] if tensors[r].form == FULL and r in op.updates + op.inputs
                    and base_tensors[u].kind in ("weight", "optimizer_state", "gradient")]
            if full:
                out.slices[op.id] = list(dict.fromkeys(full))
    return out
