"""``RankInterpreter``: one rank of a data-parallel step, following the rank's plan.

The rank's profile (``shard.shard_profile``) keeps the one-GPU graph's kernel ops and
adds collective ops (R56). Its kernel ops run the one-GPU graph's FX nodes, as
``PlannedInterpreter`` runs them (same events, pools, swaps, drops and recomputes), fed
at each op with the rank's tensors where the rank graph substitutes them
(runtime/rank_map.py): a weight's gathered copy (full size), a gradient's shard, a
weight's or an optimizer state's shard (the padded flat slice), or, for a ZeRO-1/2 step,
the rank's slice of a full weight. The optimizer's kernels are elementwise
(``_foreach_*``), so running them on flat slices computes exactly what they compute on
the slices of the whole tensors. Its collective ops are real ``torch.distributed`` calls
(runtime/collectives.py); gradients are summed over the ranks, then divided by the
world.

Values fed to a node replace the node's value in the graph's environment; the views and
``getitem`` nodes evaluated from it are forgotten, to be made again from the new value.
"""
from __future__ import annotations

from dataclasses import replace

from tracer.pytorch.node_identity import flat_tensors

from .interpreter import PlannedInterpreter, RuntimeFailure
from .rank_map import FULL, RankMap


def rank_bindings(bindings, rank_profile, rmap: RankMap):
    """The one-GPU bindings seen from the rank's profile: each rank tensor bound where
    the tensor it stands for is."""
    tensors = {tid: replace(bindings.tensors[rt.stands_for], tensor=tid) for tid, rt in rmap.tensors.items()}
    return replace(bindings, profile=rank_profile, tensors=tensors)


class RankInterpreter(PlannedInterpreter):
    """``PlannedInterpreter`` for one rank's profile. ``one_gpu``: the bindings of the
    one-GPU profile it was sharded from; ``rmap``: runtime.rank_map.rank_map of the two.
    Set ``comm`` (a runtime.collectives.Communicator) before running."""

    def __init__(self, one_gpu, rank_profile, rmap: RankMap, plan=None, hardware=None, budget_bytes=None):
        self.one_gpu = one_gpu
        self.rmap = rmap
        self.comm = None
        super().__init__(rank_bindings(one_gpu, rank_profile, rmap), plan, hardware, budget_bytes)
        self.lazy_users = _lazy_users(one_gpu.graph_module, self.kernel_nodes)
        self.comm_buffer_peak = 0
        self.staging_peak = 0
        self._targets: dict = {}

    def expected_collectives(self) -> list:
        """(op id, kind, payload bytes) of the rank's collectives in the order its
        compute sequence issues them."""
        seq, ops = self.rplan.seq, self.profile.ops
        return [(ops[i].id, ops[i].collective.kind, ops[i].collective.bytes)
                for i, r in zip(seq.op_index, seq.recomputed) if r is None and ops[i].collective is not None]

    # ------------------------------------------------------------------ values

    def _begin(self, values) -> None:
        super()._begin(values)
        self.typed = {tid: self.env[self.bindings.tensors[tid].node] for tid in self.persistent_ids}
        self.staged = []

    def _typed_value(self, tid: str):
        """The tensor (dtype and shape) over ``tid``'s storage."""
        if tid in self.typed:
            return self.typed[tid]
        b = self.bindings.tensors[tid]
        if b.node not in self.env:
            raise RuntimeFailure(f"tensor {tid} is needed before graph node {b.node.name} made it")
        return flat_tensors(self.env[b.node])[b.output or 0]

    def _flat(self, tid: str):
        """``tid`` as a flat tensor of its rank storage's elements (a shard, or a full
        tensor's elements)."""
        value = self._typed_value(tid)
        return value.reshape(-1) if value.is_contiguous() else value.contiguous().reshape(-1)

    def _padded_slice(self, tid: str):
        """The rank's slice of full tensor ``tid``, padded with zeros: (slice, view of the
        tensor it came from or None when it is a staging copy, valid elements)."""
        import torch
        whole = self._typed_value(tid).reshape(-1)
        n = whole.numel()
        shard = -(-n // self.rmap.world)
        start = self.comm.rank * shard
        valid = max(0, min(shard, n - start))
        if valid == shard:
            return whole[start:start + shard], None, valid
        staging = torch.zeros(shard, dtype=whole.dtype)
        staging[:valid] = whole[start:start + valid]
        return staging, whole[start:start + valid], valid

    def _feed(self, tid_one_gpu: str, value) -> None:
        """Give the graph ``value`` where one-GPU tensor ``tid_one_gpu`` is, and forget
        the views made from what was there."""
        b = self.one_gpu.tensors[tid_one_gpu]
        node, env = b.node, self.env
        current = env.get(node)
        if node.op == "placeholder" or b.output is None:
            if current is value:
                return
            env[node] = value
        else:
            if current is None:
                raise RuntimeFailure(f"graph node {node.name} (of {tid_one_gpu}) has not run")
            leaves = flat_tensors(current)
            if leaves[b.output] is value:
                return
            env[node] = _replace_leaf(current, b.output, value)
        for user in self.lazy_users.get(node, ()):
            env.pop(user, None)

    def _shard_targets(self, op_id: str) -> list:
        """(graph node, rank tid, slice?) for the shards and slices an optimizer op is fed:
        the nodes its kernels take (their element ``slot`` of foreach lists) whose value
        is the one-GPU tensor's storage (the tensor itself or a view of it, such as a
        bias gradient's reshape), so that the flat shard replaces it whole."""
        if op_id in self._targets:
            return self._targets[op_id]
        rmap, binding = self.rmap, self.one_gpu.ops[op_id]
        wanted = {}
        sliced = rmap.slices.get(op_id, ())
        pairs = [(u, r) for u, r in rmap.subs.get(op_id, ()) if rmap.tensors[r].form != FULL]
        for u, r in [*pairs, *((rmap.tensors[r].stands_for, r) for r in sliced)]:
            b = self.one_gpu.tensors[u]
            wanted[_fake_storage(b.node, b.output)] = (r, r in sliced)
        found = []
        for node in binding.nodes:
            for arg in _arg_nodes(node, binding.slot):
                hit = wanted.get(_fake_storage(arg, 0))
                if hit is not None and all(arg is not f[0] for f in found):
                    found.append((arg, *hit))
        self._targets[op_id] = found
        return found

    def _put(self, node, value) -> None:
        if self.env.get(node) is not value:
            self.env[node] = value
            for user in self.lazy_users.get(node, ()):
                self.env.pop(user, None)

    def _reread(self, op, k: int) -> dict[str, str]:
        """R60: the gathered copies a re-run (item ``k``) reads instead of its op's."""
        reads = self.rplan.seq.reads.get(k)
        return {} if reads is None else {x: y for x, y in zip(op.inputs, reads) if x != y}

    def _before_op(self, op, k: int) -> None:
        rmap, twin = self.rmap, self._reread(op, k)
        for u, r in rmap.subs.get(op.id, ()):
            if rmap.tensors[r].form == FULL and r not in rmap.slices.get(op.id, ()):
                self._feed(u, self._typed_value(twin.get(r, r)))
        for node, r, sliced in self._shard_targets(op.id):
            if not sliced:
                self._put(node, self._flat(r))
                continue
            piece, back, valid = self._padded_slice(r)
            if back is not None:
                self.staged.append((piece, back, valid))
                self.known.add(piece.untyped_storage()._cdata)
                self.staging_peak = max(self.staging_peak, piece.nbytes)
            self._put(node, piece)

    def _after_op(self, op, k: int) -> None:
        for piece, back, valid in self.staged:
            back.copy_(piece[:valid])
        self.staged = []
        for node, r, sliced in self._shard_targets(op.id):   # the graph sees the whole tensors again
            self.env.pop(node, None)
            for user in self.lazy_users.get(node, ()):
                self.env.pop(user, None)
        twin = self._reread(op, k)
        for u, r in self.rmap.subs.get(op.id, ()):
            b = self.one_gpu.tensors[u]
            if b.node.op == "placeholder" and self.rmap.tensors[r].form == FULL:
                self._feed(u, self._typed_value(twin.get(r, r)))

    # ------------------------------------------------------------------ collectives

    def _new_output(self, tid: str, where: str):
        """A collective's output: a fresh storage of the rank profile's bytes, counted in
        the pool; the flat tensor over it (a full copy's value: its first elements in the
        tensor's shape)."""
        import torch
        rt = self.rmap.tensors[tid]
        b = self.one_gpu.tensors[rt.stands_for]
        fake = flat_tensors(b.node.meta.get("val"))[b.output or 0]
        flat = torch.zeros(rt.elements, dtype=fake.dtype)
        storage = flat.untyped_storage()
        self.storages[tid] = storage
        self.known.add(storage._cdata)
        if storage.nbytes() != self.profile.tensor_by_id[tid].bytes:
            self.mismatches.append(tid)
        self._gpu_add(tid, storage.nbytes(), where)
        if rt.form == FULL:
            self.typed[tid] = flat[:fake.numel()].view(tuple(fake.shape))
        else:
            self.typed[tid] = flat
        return flat

    def _run_collective(self, op, name: str) -> None:
        """R56: the collective as a real torch.distributed call, logged."""
        import torch
        if self.comm is None:
            raise RuntimeFailure(f"{name} is a collective and this rank has no communicator")
        kind, world = op.collective.kind, self.rmap.world
        if kind == "all_gather":
            if op.outputs:          # ZeRO-3: shards in, a full copy of each out
                sends = [self._flat(t) for t in op.inputs]
                outs = [self._new_output(t, name) for t in op.outputs]
            else:                   # ZeRO-1/2: the rank's slices of the full weights, updated in place
                parts = [self._padded_slice(t) for t in op.updates]
                sends = [p[0] for p in parts]
                outs = [self._flat(t) for t in op.updates]
            sizes = [s.numel() for s in sends]
            send = torch.cat([s.reshape(-1).view(torch.uint8) for s in sends])
            got = self.comm.all_gather(op.id, send).view(world, -1)
            self.comm_buffer_peak = max(self.comm_buffer_peak, send.nbytes + got.nbytes)
            at = 0
            for s, size, out in zip(sends, sizes, outs):
                width = size * s.element_size()
                whole = got[:, at:at + width].reshape(-1).view(s.dtype)
                out.copy_(whole[:out.numel()])
                at += width
        elif kind == "reduce_scatter":
            fulls = [self._flat(t) for t in op.inputs]
            _one_dtype(fulls, name)
            shards = [-(-f.numel() // world) for f in fulls]
            total = sum(shards)
            full = torch.zeros(world, total, dtype=fulls[0].dtype)
            at = 0
            for f, s in zip(fulls, shards):
                padded = torch.zeros(s * world, dtype=f.dtype)
                padded[:f.numel()] = f
                full[:, at:at + s] = padded.view(world, s)
                at += s
            mine = self.comm.reduce_scatter(op.id, full.view(-1))
            self.comm_buffer_peak = max(self.comm_buffer_peak, full.nbytes + mine.nbytes)
            mine.div_(world)
            outs = [self._new_output(t, name) for t in op.outputs]
            at = 0
            for out, s in zip(outs, shards):
                out.copy_(mine[at:at + s])
                at += s
        elif kind == "all_reduce":
            grads = [self._flat(t) for t in op.updates]
            _one_dtype(grads, name)
            buffer = torch.cat(grads)
            self.comm.all_reduce(op.id, buffer)
            self.comm_buffer_peak = max(self.comm_buffer_peak, buffer.nbytes)
            buffer.div_(world)
            at = 0
            for t, g in zip(op.updates, grads):
                typed = self._typed_value(t)
                typed.copy_(buffer[at:at + g.numel()].view(typed.shape))
                at += g.numel()
        else:
            raise RuntimeFailure(f"{name}: unknown collective {kind!r}")


def _fake_storage(node, output):
    """The storage identity of a node's (traced, fake) value: which tensor it is a view of."""
    vals = flat_tensors(node.meta.get("val"))
    index = output or 0
    return vals[index].untyped_storage()._cdata if index < len(vals) else None


def _arg_nodes(node, slot):
    """The graph nodes ``node`` takes as arguments (of foreach lists, element ``slot``)."""
    from torch.fx import Node
    for a in (*node.args, *node.kwargs.values()):
        if isinstance(a, (list, tuple)):
            items = [a[slot]] if slot is not None and len(a) > slot else list(a)
            for x in items:
                if isinstance(x, Node):
                    yield x
        elif isinstance(a, Node):
            yield a


def _one_dtype(tensors, name: str) -> None:
    if len({t.dtype for t in tensors}) > 1:
        raise RuntimeFailure(f"{name} reduces tensors of several dtypes in one buffer")


def _replace_leaf(value, index: int, new):
    """``value`` (a tensor, or lists, tuples, dicts of them) with its ``index``-th tensor
    leaf (flat_tensors' order) replaced by ``new``."""
    import torch
    count = [0]

    def walk(obj):
        if isinstance(obj, torch.Tensor):
            i = count[0]
            count[0] += 1
            return new if i == index else obj
        if isinstance(obj, (list, tuple)):
            return type(obj)(walk(x) for x in obj)
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        return obj
    return walk(value)


def _lazy_users(gm, kernel_nodes) -> dict:
    """Per node, the nodes evaluated from it on demand (views, getitem: call_function
    nodes that run no op), through chains of them."""
    out: dict = {}
    lazy = {n for n in gm.graph.nodes if n.op == "call_function" and n not in kernel_nodes}
    for node in reversed(list(gm.graph.nodes)):
        found = set()
        for user in node.users:
            if user in lazy:
                found.add(user)
                found |= out.get(user, set())
        out[node] = found
    return out
