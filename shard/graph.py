"""The rank's graph under construction: the one-GPU profile's tensors and ops, some
resized or renamed per op, with new tensors and collective ops put before or after the
ops they follow. ``build`` makes the Profile (which validates it)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from simulator.profile import Collective, Op, Profile, Tensor

from .padding import padded_bytes, shard_bytes, shard_elements

# the PyTorch operators a rank runs them as (torch.distributed's functional collectives)
OP_NAMES = {"all_gather": "c10d::all_gather_into_tensor", "reduce_scatter": "c10d::reduce_scatter_tensor",
            "all_reduce": "c10d::allreduce_"}


class RankGraph:
    def __init__(self, profile: Profile, world: int):
        self.profile = profile
        self.world = world
        self.tensors: dict[str, Tensor] = {t.id: t for t in profile.tensors}
        self._op_ids = {op.id for op in profile.ops}
        self._before: dict[int, list[Op]] = defaultdict(list)
        self._after: dict[int, list[Op]] = defaultdict(list)
        self._renames: dict[int, dict[str, str]] = defaultdict(dict)
        self._edits: dict[int, dict] = {}
        self.padding = 0          # bytes of padding added to the payloads of the sharded tensors

    # ----------------------------------------------------------------- tensors
    def fresh_tensor_id(self, base: str) -> str:
        return _fresh(base, self.tensors)

    def shard(self, tid: str, *, payload: bool = True) -> Tensor:
        """Make ``tid`` one rank's slice: padded bytes / world, a flat shape. ``payload``:
        its padding counts in ``padding`` (a tensor the collectives move in slices)."""
        tensor = self.profile.tensor_by_id[tid]
        if payload:
            self.padding += padded_bytes(tensor, self.world) - tensor.bytes
        sliced = replace(tensor, bytes=shard_bytes(tensor, self.world),
                         shape=(shard_elements(tensor, self.world),))
        self.tensors[tid] = sliced
        return sliced

    def add_tensor(self, base: str, like: Tensor, *, kind: str, size: int, name: str, whole_shape: bool) -> str:
        tid = self.fresh_tensor_id(base)
        shape = like.shape if whole_shape else None
        self.tensors[tid] = Tensor(id=tid, bytes=size, kind=kind, name=name, shape=shape, dtype=like.dtype,
                                   density=like.density)
        return tid

    def shard_of(self, tid: str, kind: str = "gradient") -> str:
        """A new tensor holding one rank's slice of ``tid`` (a reduce-scatter's output)."""
        tensor = self.profile.tensor_by_id[tid]
        self.padding += padded_bytes(tensor, self.world) - tensor.bytes
        new = self.fresh_tensor_id(f"{tid}@shard")
        self.tensors[new] = Tensor(id=new, bytes=shard_bytes(tensor, self.world), kind=kind,
                                   name=f"{tensor.name or tid} (shard)",
                                   shape=(shard_elements(tensor, self.world),), dtype=tensor.dtype)
        return new

    # ----------------------------------------------------------------- ops
    def rename(self, op_index: int, old: str, new: str) -> None:
        """Op ``op_index`` reads or writes ``new`` where the profile says ``old``."""
        self._renames[op_index][old] = new

    def rename_after(self, at: int, renames: dict[str, str]) -> None:
        """Ops after op ``at`` read and write the new tensors in place of the old."""
        for old, new in renames.items():
            for i in {*self.profile.consumers.get(old, ()), *self.profile.updaters.get(old, ())}:
                if i > at:
                    self.rename(i, old, new)

    def edit(self, op_index: int, **fields) -> None:
        self._edits.setdefault(op_index, {}).update(fields)

    def collective(self, base: str, kind: str, size: int, *, phase: str, module: str | None,
                   inputs=(), outputs=(), updates=()) -> Op:
        op_id = _fresh(base, self._op_ids)
        self._op_ids.add(op_id)
        return Op(id=op_id, name=OP_NAMES[kind], phase=phase, time_us=0.0, inputs=tuple(inputs),
                  outputs=tuple(outputs), updates=tuple(updates), module=module,
                  collective=Collective(kind, self.world, size))

    def before(self, op_index: int, op: Op) -> None:
        """Put ``op`` just before op ``op_index`` (after what is put after the op before it)."""
        self._before[op_index].append(op)

    def after(self, op_index: int, op: Op) -> None:
        """Put ``op`` just after op ``op_index``."""
        self._after[op_index].append(op)

    # ----------------------------------------------------------------- result
    def build(self, name: str, source: dict) -> Profile:
        ops = []
        for i, op in enumerate(self.profile.ops):
            ops.extend(self._before.get(i, ()))
            ops.append(self._op(i, op))
            ops.extend(self._after.get(i, ()))
        return Profile(name=name, tensors=tuple(self.tensors.values()), ops=tuple(ops), source=source,
                       origin=self.profile.origin)

    def _op(self, i: int, op: Op) -> Op:
        renames, edits = self._renames.get(i), self._edits.get(i)
        if not renames and not edits:
            return op
        fields = dict(edits or {})
        if renames:
            fields.update(inputs=tuple(renames.get(t, t) for t in op.inputs),
                          outputs=tuple(renames.get(t, t) for t in op.outputs),
                          updates=tuple(renames.get(t, t) for t in op.updates))
            if op.rerun_outputs is not None:
                fields["rerun_outputs"] = tuple(renames.get(t, t) for t in op.rerun_outputs)
        return replace(op, **fields)


def _fresh(base: str, taken) -> str:
    if base not in taken:
        return base
    k = 2
    while f"{base}~{k}" in taken:
        k += 1
    return f"{base}~{k}"
