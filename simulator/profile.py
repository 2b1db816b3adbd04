"""Profile: one training iteration as ops and tensors, in execution order.

Format ``swapplan-profile/1`` (JSON, gzipped JSON or YAML). Loading validates
everything and derives, once, the facts every planner and the simulator need:
producer, consumers, updaters, first and last use, the no-swap peak and the
ideal time. See docs/formats.md.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
import threading
from contextlib import contextmanager
from functools import cached_property
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Iterable

import networkx as nx
import yaml

from .errors import InputError
from .fields import Reader, is_id_list
from .files import YAML_SHARE, gzip_bytes, max_input_bytes, no_gc, read_document, write_atomic
from .units import MAX_BYTES, MAX_COUNT, MAX_US, us_to_ps

FORMAT = "swapplan-profile/1"
TENSOR_KINDS = ("weight", "activation", "gradient", "optimizer_state", "input", "other")
PERSISTENT_KINDS = frozenset({"weight", "optimizer_state", "input"})
PHASES = ("forward", "backward", "optimizer", "other")
SOURCE_KINDS = ("traced", "measured", "imported", "synthetic")

_TENSOR_FIELDS = {"id", "bytes", "kind", "name", "shape", "dtype"}
_OP_FIELDS = {"id", "name", "phase", "time_us", "inputs", "outputs", "updates",
              "workspace_bytes", "flops", "module"}
_TOP_FIELDS = {"format", "name", "source", "tensors", "ops"}
# Optional node identity for a runtime (``fx``, docs/runtime.md) and measured sparsity
# (``density``, R40): accepted by the field-by-field readers only, so the fast paths
# above stay as they are.
_FX_FIELD = "fx"
_DENSITY_FIELD = "density"
_VARIANTS_FIELD = "variants"
_RERUN_FIELD = "rerun_outputs"
_SPLIT_FIELD = "split"
SPLIT_AXES = ("batch", "rows", "vocabulary", "elements")
FX_REWRITES = ("inplace_accumulate", "foreach_split")
INPUT_ROLES = ("parameter", "buffer", "optimizer_state", "batch", "target")


@dataclass(frozen=True, slots=True)
class OpNode:
    """Where a runtime finds an op in the traced FX graph: the graph nodes it runs, in
    order, with their ATen overloads; ``slot``: the list element of a ``_foreach_*``
    kernel it runs (the tracer's per-parameter split); ``rewrite``: how the op differs
    from its nodes (``inplace_accumulate``: an out-of-place ``add`` run in place into
    its first argument; ``foreach_split``); ``random``: it draws from the RNG."""
    nodes: tuple[str, ...]
    overloads: tuple[str, ...]
    slot: int | None = None
    rewrite: str | None = None
    random: bool = False

    def to_dict(self) -> dict:
        data = {"nodes": list(self.nodes), "overloads": list(self.overloads)}
        if self.slot is not None:
            data["slot"] = self.slot
        if self.rewrite is not None:
            data["rewrite"] = self.rewrite
        if self.random:
            data["random"] = True
        return data


@dataclass(frozen=True, slots=True)
class TensorNode:
    """Where a runtime finds a tensor's storage in the traced FX graph: ``node`` and the
    position of the tensor among that node's tensor outputs (``output``, flattened in
    order), or, for a graph input, the placeholder and its ``role`` (INPUT_ROLES)."""
    node: str
    output: int | None = None
    role: str | None = None

    def to_dict(self) -> dict:
        data: dict = {"node": self.node}
        if self.output is not None:
            data["output"] = self.output
        if self.role is not None:
            data["role"] = self.role
        return data


@dataclass(frozen=True, slots=True)
class Tensor:
    """A swappable buffer (one storage): its size and what it is."""
    id: str
    bytes: int
    kind: str
    name: str | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    fx: TensorNode | None = None
    density: float | None = None     # fraction of non-zero elements (R40); None: not measured (1)

    @property
    def persistent(self) -> bool:
        """Weights, optimizer state and inputs exist before the first op and after the last."""
        return self.kind in PERSISTENT_KINDS

    def to_dict(self) -> dict:
        data = {"id": self.id, "bytes": self.bytes, "kind": self.kind}
        if self.name is not None:
            data["name"] = self.name
        if self.shape is not None:
            data["shape"] = list(self.shape)
        if self.dtype is not None:
            data["dtype"] = self.dtype
        if self.density is not None:
            data["density"] = self.density
        if self.fx is not None:
            data["fx"] = self.fx.to_dict()
        return data


@dataclass(frozen=True, slots=True)
class Variant:
    """Another way to run an op (R52): cuDNN's convolution algorithms trade time for
    workspace. A plan may choose it (``variants``: op id -> name)."""
    name: str
    time_us: float
    workspace_bytes: int = 0

    def to_dict(self) -> dict:
        return {"name": self.name, "time_us": float(self.time_us), "workspace_bytes": self.workspace_bytes}


@dataclass(frozen=True, slots=True)
class Split:
    """How an op may run in chunks (R54): over which axis (``SPLIT_AXES``: the batch, the
    rows of a cross-entropy, its vocabulary, or the elements of an elementwise op), at
    most how many chunks, and what each chunk costs beyond its share of the work (a
    kernel launch)."""
    over: str
    max_chunks: int = 64
    launch_us: float = 5.0

    def to_dict(self) -> dict:
        return {"over": self.over, "max_chunks": self.max_chunks, "launch_us": float(self.launch_us)}


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel (or fused group) of the iteration."""
    id: str
    name: str
    phase: str
    time_us: float
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    updates: tuple[str, ...] = ()
    workspace_bytes: int = 0
    flops: float | None = None
    module: str | None = None
    fx: OpNode | None = None
    variants: tuple[Variant, ...] = ()       # other algorithms a plan may choose (R52)
    rerun_outputs: tuple[str, ...] | None = None   # what a re-run makes (R15); None: every output
    split: Split | None = None               # it may run in chunks (R54); None: only whole

    def remade(self) -> tuple[str, ...]:
        """The outputs a re-run of the op makes (R15): ``rerun_outputs``, else every output
        (a kernel writes all of its outputs whichever one is wanted)."""
        return self.outputs if self.rerun_outputs is None else self.rerun_outputs

    def variant(self, name: str) -> Variant | None:
        for variant in self.variants:
            if variant.name == name:
                return variant
        return None

    def to_dict(self) -> dict:
        data = {"id": self.id, "name": self.name, "phase": self.phase,
                "time_us": float(self.time_us), "inputs": list(self.inputs),
                "outputs": list(self.outputs)}
        if self.updates:
            data["updates"] = list(self.updates)
        if self.workspace_bytes:
            data["workspace_bytes"] = self.workspace_bytes
        if self.flops is not None:
            data["flops"] = float(self.flops)
        if self.module is not None:
            data["module"] = self.module
        if self.variants:
            data["variants"] = [v.to_dict() for v in self.variants]
        if self.rerun_outputs is not None:
            data["rerun_outputs"] = list(self.rerun_outputs)
        if self.split is not None:
            data["split"] = self.split.to_dict()
        if self.fx is not None:
            data["fx"] = self.fx.to_dict()
        return data


@dataclass
class Profile:
    """A validated profile and the facts derived from it on construction.

    Construction validates (raising InputError naming ``origin``, the field and the
    problem) and fills the derived fields; op positions are indices into ``ops``.
    """
    name: str
    tensors: tuple[Tensor, ...]
    ops: tuple[Op, ...]
    source: dict = field(default_factory=dict)
    origin: str = field(default="<profile>", compare=False)

    # Derived on construction (see _derive).
    tensor_by_id: dict[str, Tensor] = field(init=False, repr=False, compare=False)
    op_index: dict[str, int] = field(init=False, repr=False, compare=False)
    producer: dict[str, int | None] = field(init=False, repr=False, compare=False)
    resident_bytes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    persistent_bytes: int = field(init=False, repr=False, compare=False)
    peak_bytes: int = field(init=False, compare=False)
    peak_op: str | None = field(init=False, compare=False)
    ideal_us: float = field(init=False, compare=False)
    ideal_ps: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.tensors = tuple(self.tensors)
        self.ops = tuple(self.ops)
        with no_gc():
            _derive(self)

    # Built on first use from the lists _derive keeps (a loader that only validates a
    # million-op profile need not build four more million-entry dicts).
    @cached_property
    def consumers(self) -> dict[str, tuple[int, ...]]:
        """Tensor id -> the ops that list it in inputs, in order."""
        ids, read = self._uses[0], self._uses[1]
        return dict(zip(ids, [() if users is None else tuple(users) for users in read]))

    @cached_property
    def updaters(self) -> dict[str, tuple[int, ...]]:
        """Tensor id -> the ops that list it in updates, in order."""
        ids, written = self._uses[0], self._uses[2]
        found: dict[str, tuple[int, ...]] = dict.fromkeys(ids, ())
        for k, users in written.items():
            found[ids[k]] = tuple(users)
        return found

    @cached_property
    def first_use(self) -> dict[str, int | None]:
        """Tensor id -> the first op that reads or updates it (None: none does)."""
        return dict(zip(self._uses[0], self._uses[3]))

    @cached_property
    def last_use(self) -> dict[str, int | None]:
        """Tensor id -> the last op that reads or updates it (None: none does)."""
        return dict(zip(self._uses[0], self._uses[4]))

    @cached_property
    def sha256(self) -> str:
        """Hex sha256 of the canonical JSON (``profile_sha256``), computed on first use."""
        return hashlib.sha256(canonical_json(self).encode("utf-8")).hexdigest()

    def rerun_extra_bytes(self, tensor_id: str) -> int:
        """R15: the bytes of the other outputs a recompute of ``tensor_id`` makes beside it
        (its producer's ``remade()`` outputs but itself): scratch held while it runs."""
        made_by = self.producer.get(tensor_id)
        if made_by is None:
            return 0
        tensors = self.tensor_by_id
        return sum(tensors[t].bytes for t in dict.fromkeys(self.ops[made_by].remade()) if t != tensor_id)

    def lifetime(self, tensor_id: str) -> tuple[int, int]:
        """First and last op position at which the tensor is resident without swapping.

        Persistent tensors span the whole iteration, ``(0, len(ops) - 1)``.
        """
        tensor = self.tensor_by_id[tensor_id]
        if tensor.persistent:
            return 0, max(len(self.ops) - 1, 0)
        start = self.producer[tensor_id]
        end = self.last_use[tensor_id]
        return start, max(start, end if end is not None else start)

    def to_dict(self) -> dict:
        """The canonical dict form (what is saved and hashed)."""
        return {"format": FORMAT, "name": self.name, "source": self.source,
                "tensors": [t.to_dict() for t in self.tensors],
                "ops": [o.to_dict() for o in self.ops]}


# ----------------------------------------------------------------------------- derive


def _derive(profile: Profile) -> None:
    """Check references and order, then fill the derived fields of ``profile``.

    One pass over the ops, tensors addressed by position (lists, not dicts, until the
    end: a million-op profile spends its time in hashing otherwise); the first op that
    fails a check is checked again by ``_op_problem``, which names the field and the
    problem.
    """
    file = profile.origin
    if not getattr(_LOADER, "checked", False):
        _check_limits(profile)
    tensors, ops = profile.tensors, profile.ops
    ids = [t.id for t in tensors]
    index = dict(zip(ids, range(len(ids))))
    if len(index) != len(ids):
        seen: set[str] = set()
        for i, tid in enumerate(ids):
            if tid in seen:
                raise InputError(file, f"tensors[{i}].id", f"duplicate tensor id {tid!r}")
            seen.add(tid)
    n = len(ids)
    ready = [t.kind in PERSISTENT_KINDS for t in tensors]  # resident: persistent or produced so far
    made: list[int | None] = [None] * n                     # producer position
    read: list[list[int] | None] = [None] * n               # ops listing it in inputs, in order
    written: dict[int, list[int]] = {}                      # ops listing it in updates, in order
    locate = index.get

    op_ids = [op.id for op in ops]
    op_index: dict[str, int] = dict(zip(op_ids, range(len(op_ids))))
    duplicate_at = len(ops)   # the first op whose id an earlier op has (checked in order below)
    if len(op_index) != len(op_ids):
        seen_ops: set[str] = set()
        for i, oid in enumerate(op_ids):
            if oid in seen_ops:
                duplicate_at = i
                break
            seen_ops.add(oid)
    for i, op in enumerate(ops):
        if i == duplicate_at:
            raise InputError(file, f"ops[{i}].id", f"duplicate op id {op.id!r}")
        ok = True
        for tid in op.inputs:
            k = locate(tid)
            if k is None or not ready[k]:
                ok = False
                break
            users = read[k]
            if users is None:
                read[k] = [i]
            else:
                users.append(i)
        if ok and op.updates:
            for tid in op.updates:
                k = locate(tid)
                if k is None or not ready[k]:
                    ok = False
                    break
                written.setdefault(k, []).append(i)
            if ok and op.outputs and not set(op.updates).isdisjoint(op.outputs):
                ok = False
        if ok:
            for tid in op.outputs:
                k = locate(tid)
                if k is None or ready[k]:
                    ok = False
                    break
                ready[k] = True
                made[k] = i
        if not ok:
            before = {ids[k]: at for k, at in enumerate(made) if at is not None and at != i}
            raise _op_problem(profile, i, dict(zip(ids, tensors)), before)

    if not all(ready):
        k = ready.index(False)
        raise InputError(file, f"tensors[{k}] ({ids[k]})",
                         f"non-persistent tensor ({tensors[k].kind}) is never produced by any op")

    first: list[int | None] = [None if users is None else users[0] for users in read]
    last: list[int | None] = [None if users is None else users[-1] for users in read]
    for k, users in written.items():
        first[k] = users[0] if first[k] is None else min(first[k], users[0])
        last[k] = users[-1] if last[k] is None else max(last[k], users[-1])

    profile.tensor_by_id = dict(zip(ids, tensors))
    profile.op_index = op_index
    profile.producer = dict(zip(ids, made))
    profile._uses = (ids, read, written, first, last)   # for consumers, updaters, first_use, last_use
    floor = math.floor   # R3: the rounded op times, us_to_ps inlined (a million calls)
    profile.ideal_ps = sum(map(floor, [op.time_us * 1e6 + 0.5 for op in ops]))
    profile.ideal_us = profile.ideal_ps / 10**6
    _derive_peak(profile, made, last)


def _op_problem(profile: Profile, i: int, tensor_by_id: dict, made: dict) -> InputError:
    """The first problem of op ``i``, ``made`` holding what the ops before it produce:
    an unknown tensor (inputs, updates, outputs in turn), a tensor in both outputs and
    updates, a tensor read before it is produced, a persistent or twice-produced output."""
    file = profile.origin
    op = profile.ops[i]
    where = f"ops[{i}] ({op.id})"
    for key, ids in (("inputs", op.inputs), ("updates", op.updates), ("outputs", op.outputs)):
        for j, tid in enumerate(ids):
            if tid not in tensor_by_id:
                return InputError(file, f"{where}.{key}[{j}]", f"unknown tensor {tid!r}")
    both = set(op.outputs) & set(op.updates)
    if both:
        tid = sorted(both)[0]
        return InputError(file, f"{where}.updates", f"tensor {tid!r} is in both outputs and updates of one op")
    produced_later = None
    for key, ids in (("inputs", op.inputs), ("updates", op.updates)):
        for j, tid in enumerate(ids):
            if tensor_by_id[tid].persistent or tid in made:
                continue
            if produced_later is None:
                produced_later = _producers_by_id(profile)
            later = produced_later.get(tid)
            if later is not None and later != op.id:
                problem = (f"uses tensor {tid!r} before op {later!r} produces it "
                           "(ops must be in topological order)")
            elif later == op.id:
                problem = f"uses tensor {tid!r} that it produces itself (a cycle)"
            else:
                problem = f"uses tensor {tid!r}, which no op produces"
            return InputError(file, f"{where}.{key}[{j}]", problem)
    here: dict[str, int] = {}
    for j, tid in enumerate(op.outputs):
        tensor = tensor_by_id[tid]
        if tensor.persistent:
            return InputError(file, f"{where}.outputs[{j}]",
                              f"tensor {tid!r} is persistent ({tensor.kind}) and cannot be an "
                              "op output; an op that writes it lists it in updates")
        first = made.get(tid, here.get(tid))
        if first is not None:
            return InputError(file, f"{where}.outputs[{j}]",
                              f"tensor {tid!r} is produced twice (already by op {profile.ops[first].id!r})")
        here[tid] = i
    return InputError(file, where, "inconsistent op")  # not reached: the caller saw a problem


_LOADER = threading.local()   # .checked: the loader builds a Profile from entries it checked itself


@contextmanager
def _limits_checked():
    """R23 was checked entry by entry as the file was read: _derive need not check again."""
    _LOADER.checked = True
    try:
        yield
    finally:
        _LOADER.checked = False


def _check_limits(profile: Profile) -> None:
    """R23: sizes below 2^53 bytes, op times below 10^9 us, at most 10^7 ops and tensors
    (for profiles built in memory too, not only those read from files)."""
    file = profile.origin
    for key, items in (("tensors", profile.tensors), ("ops", profile.ops)):
        if len(items) > MAX_COUNT:
            raise InputError(file, key, f"{len(items)} entries; at most {MAX_COUNT} are supported (R23)")
    for i, tensor in enumerate(profile.tensors):
        _check_tensor_limits(tensor, i, file)
    for i, op in enumerate(profile.ops):
        _check_op_limits(op, i, file)


def _check_tensor_limits(tensor: Tensor, i: int, file: str) -> Tensor:
    size = tensor.bytes
    if (type(size) is not int and (isinstance(size, bool) or not isinstance(size, int))) \
            or not 0 <= size < MAX_BYTES:
        raise InputError(file, f"tensors[{i}] ({tensor.id}).bytes",
                         f"must be a whole number from 0 to 2^53 - 1, got {size!r} (R23)")
    return tensor


def _check_op_limits(op: Op, i: int, file: str) -> Op:
    time_us, ws = op.time_us, op.workspace_bytes
    if not ((type(time_us) is float or isinstance(time_us, (int, float))) and 0 <= time_us < MAX_US):
        raise InputError(file, f"ops[{i}] ({op.id}).time_us",
                         f"must be a number from 0 to below 10^9 us, got {time_us!r} (R23)")
    if (type(ws) is not int and (isinstance(ws, bool) or not isinstance(ws, int))) or not 0 <= ws < MAX_BYTES:
        raise InputError(file, f"ops[{i}] ({op.id}).workspace_bytes",
                         f"must be a whole number from 0 to 2^53 - 1, got {ws!r} (R23)")
    return op


def _producers_by_id(profile: Profile) -> dict[str, str]:
    """Map each tensor id to the id of the first op that lists it as an output."""
    found: dict[str, str] = {}
    for op in profile.ops:
        for tid in op.outputs:
            found.setdefault(tid, op.id)
    return found


def _derive_peak(profile: Profile, made: list, last: list) -> None:
    """The no-swap resident bytes at each op, and its maximum (with the op).

    During op i the GPU holds every persistent tensor, every non-persistent tensor
    whose lifetime [producer, last use] contains i, and op i's workspace. ``made`` and
    ``last`` are the producer and last use of each tensor, by position.
    """
    ops = profile.ops
    n = len(ops)
    persistent = 0
    delta = [0] * (n + 1)
    for tensor, start, end in zip(profile.tensors, made, last):
        if start is None:  # persistent
            persistent += tensor.bytes
            continue
        if end is None or end < start:
            end = start
        delta[start] += tensor.bytes
        delta[end + 1] -= tensor.bytes
    resident = [persistent + live + op.workspace_bytes for live, op in zip(accumulate(delta), ops)]
    profile.persistent_bytes = persistent
    profile.resident_bytes = tuple(resident)
    if resident:
        peak_at = max(range(n), key=resident.__getitem__)
        profile.peak_bytes = resident[peak_at]
        profile.peak_op = ops[peak_at].id
    else:
        profile.peak_bytes = persistent
        profile.peak_op = None


# ----------------------------------------------------------------------------- order


def order_violation(profile: Profile, order: Iterable[str]) -> tuple[str, str | None, str] | None:
    """Check an op order (a permutation of op ids) against the profile's dependencies.

    The order must contain every op once, run each op after the producers of what it
    reads or updates, and keep every in-place update of a tensor in the profile's order
    relative to the other ops touching that tensor (rule R21).

    Returns None when the order is valid, else ``(op_id, tensor_id or None, problem)``.
    """
    order = list(order)
    problem = schedule_problem(profile, order)
    if problem is not None:
        return None, None, problem
    position = {op_id: k for k, op_id in enumerate(order)}
    ops = profile.ops
    for op_id in order:
        op = ops[profile.op_index[op_id]]
        for tid in op.inputs + op.updates:
            made_by = profile.producer[tid]
            if made_by is not None and position[ops[made_by].id] > position[op_id]:
                return op_id, tid, (f"op {op_id!r} runs before op {ops[made_by].id!r}, "
                                    f"which produces tensor {tid!r}")
    for before, after, tid in update_order_pairs(profile):
        a, b = ops[before].id, ops[after].id
        if position[a] > position[b]:
            updater = b if after in profile.updaters[tid] else a
            return updater, tid, (f"in-place update of {tid!r} by op {updater!r} is reordered "
                                  f"against op {(a if updater == b else b)!r}, which touches it (R21)")
    return None


def schedule_problem(profile: Profile, order) -> str | None:
    """Why ``order`` is not a permutation of the profile's op ids (an unknown, repeated or
    missing op), or None."""
    seen: set[str] = set()
    for op_id in order:
        if op_id not in profile.op_index:
            return f"unknown op {op_id!r}"
        if op_id in seen:
            return f"op {op_id!r} appears twice"
        seen.add(op_id)
    if len(seen) != len(profile.ops):
        missing = next(op.id for op in profile.ops if op.id not in seen)
        return f"op {missing!r} is missing from the schedule"
    return None


def dataflow_graph(profile: Profile) -> nx.DiGraph:
    """The ops as a networkx DiGraph: an edge producer -> user per tensor, and edges
    that keep in-place updates ordered against the other ops touching the tensor.

    Nodes carry ``name``, ``phase``, ``time_us``; edges carry ``tensors`` (a list).
    """
    graph = nx.DiGraph()
    for op in profile.ops:
        graph.add_node(op.id, name=op.name, phase=op.phase, time_us=op.time_us)

    def link(a: int, b: int, tid: str) -> None:
        u, v = profile.ops[a].id, profile.ops[b].id
        if graph.has_edge(u, v):
            graph[u][v]["tensors"].append(tid)
        else:
            graph.add_edge(u, v, tensors=[tid])

    for tid, made_by in profile.producer.items():
        if made_by is None:
            continue
        for user in sorted(set(profile.consumers[tid]) | set(profile.updaters[tid])):
            link(made_by, user, tid)
    for before, after, tid in update_order_pairs(profile):
        link(before, after, tid)
    return graph


def update_order_pairs(profile: Profile):
    """Yield ``(before, after, tensor)`` op positions that in-place updates pin (R21).

    For each updater u of t: every op touching t since the previous updater runs before
    u, and every op touching t up to the next updater runs after u; transitivity then
    orders every toucher against every update.
    """
    for tid, updates in profile.updaters.items():
        if not updates:
            continue
        update_set = set(updates)
        touching = sorted(set(profile.consumers[tid]) | update_set)
        for k, u in enumerate(touching):
            if u not in update_set:
                continue
            j = k - 1
            while j >= 0:
                yield touching[j], u, tid
                if touching[j] in update_set:
                    break
                j -= 1
            j = k + 1
            while j < len(touching) and touching[j] not in update_set:
                yield u, touching[j], tid
                j += 1


# ----------------------------------------------------------------------------- parse


def profile_from_dict(data, file: str = "<profile>") -> Profile:
    """Validate parsed JSON/YAML and build a Profile.

    Raises InputError naming ``file``, the field and the problem for: a wrong format
    tag, missing or unknown fields, wrong types, negative or non-finite sizes and
    times, bad kinds or phases, duplicate ids, unknown tensor ids, a tensor produced
    twice or used before it is produced, a persistent tensor as an output, a tensor in
    both outputs and updates of one op, and more than 10^7 tensors or ops (R23).
    """
    return _profile_from_document(data, file, consume=False)


def _profile_from_document(data, file: str, consume: bool) -> Profile:
    """``profile_from_dict``; with ``consume`` the entries of ``data``'s lists are
    released as they are read (a large file's parsed form need not outlive its objects)."""
    top = Reader(data, file)
    fmt = top.get("format")
    if fmt != FORMAT:
        raise top.error("format", f"expected {FORMAT!r}, got {fmt!r}")
    top.reject_unknown(_TOP_FIELDS)
    name = top.string("name")
    source = top.get("source", {})
    if not isinstance(source, dict):
        raise top.error("source", "expected an object")
    _check_plain_json(source, file, "source")

    raw_tensors = top.get("tensors")
    if not isinstance(raw_tensors, list):
        raise top.error("tensors", "expected a list")
    raw_ops = top.get("ops")
    if not isinstance(raw_ops, list):
        raise top.error("ops", "expected a list")
    for key, items in (("tensors", raw_tensors), ("ops", raw_ops)):  # R23, before any work
        if len(items) > MAX_COUNT:
            raise InputError(file, key, f"{len(items)} entries; at most {MAX_COUNT} are supported (R23)")
    with no_gc(freeze=consume):
        tensors = _tensors_from_list(raw_tensors, file, consume)
        ops = _ops_from_list(raw_ops, file, consume)
        with _limits_checked():
            return Profile(name=name, tensors=tuple(tensors), ops=tuple(ops), source=source, origin=file)


_FLOAT_MAX = sys.float_info.max
_KIND_SET = frozenset(TENSOR_KINDS)
_PHASE_SET = frozenset(PHASES)
_TENSOR_KEYS = frozenset(_TENSOR_FIELDS)
_OP_KEYS = frozenset(_OP_FIELDS)
_NO_IDS: list = []


def _tensors_from_list(raw: list, file: str, consume: bool) -> list[Tensor]:
    """Tensors from their parsed entries. The common, well-formed entry is checked inline;
    any other goes through ``_tensor_from_dict``, which names the problem (or accepts
    the rarer valid forms, such as ``bytes: 8.0``)."""
    out = []
    append = out.append
    for i, item in enumerate(raw):
        tensor = None
        if type(item) is dict and item.keys() <= _TENSOR_KEYS:
            tid, size, kind = item.get("id"), item.get("bytes"), item.get("kind")
            name, shape, dtype = item.get("name"), item.get("shape"), item.get("dtype")
            if (type(tid) is str and tid and type(size) is int and 0 <= size < MAX_BYTES
                    and type(kind) is str and kind in _KIND_SET
                    and (name is None or (type(name) is str and name))
                    and (dtype is None or (type(dtype) is str and dtype))):
                if shape is None:
                    tensor = Tensor(tid, size, kind, name, None, dtype)
                elif type(shape) is list:
                    for dim in shape:
                        if type(dim) is not int or dim < 0:
                            break
                    else:
                        tensor = Tensor(tid, size, kind, name, tuple(shape), dtype)
        append(tensor if tensor is not None else _check_tensor_limits(_tensor_from_dict(item, file, i), i, file))
        if consume:
            raw[i] = None
    return out


def _ops_from_list(raw: list, file: str, consume: bool) -> list[Op]:
    """Ops from their parsed entries: the well-formed entry inline, any other through
    ``_op_from_dict`` (see ``_tensors_from_list``)."""
    out = []
    append = out.append
    inf = math.inf
    for i, item in enumerate(raw):
        op = None
        if type(item) is dict and item.keys() <= _OP_KEYS:
            oid, name, phase, time_us = item.get("id"), item.get("name"), item.get("phase"), item.get("time_us")
            inputs, outputs = item.get("inputs", _NO_IDS), item.get("outputs", _NO_IDS)
            updates, ws = item.get("updates", _NO_IDS), item.get("workspace_bytes", 0)
            flops, module = item.get("flops"), item.get("module")
            if (type(oid) is str and oid and type(name) is str and name and type(phase) is str and phase in _PHASE_SET
                    and (type(time_us) is float or type(time_us) is int) and 0 <= time_us < MAX_US
                    and type(ws) is int and 0 <= ws < MAX_BYTES
                    and (flops is None or ((type(flops) is float or type(flops) is int) and 0 <= flops < inf
                                           and (type(flops) is float or flops <= _FLOAT_MAX)))
                    and (module is None or (type(module) is str and module))
                    and is_id_list(inputs) and is_id_list(outputs) and (updates is _NO_IDS or is_id_list(updates))):
                op = Op(oid, name, phase, float(time_us), tuple(inputs), tuple(outputs), tuple(updates),
                        ws, None if flops is None else float(flops), module)
        append(op if op is not None else _check_op_limits(_op_from_dict(item, file, i), i, file))
        if consume:
            raw[i] = None
    return out


def _tensor_from_dict(item, file: str, i: int) -> Tensor:
    r = Reader(item, file, f"tensors[{i}]")
    tid = r.string("id")
    r.where = f"tensors[{i}] ({tid})"
    r.reject_unknown(_TENSOR_FIELDS | {_FX_FIELD, _DENSITY_FIELD})
    shape = r.get("shape", None)
    if shape is not None:
        if not isinstance(shape, list) or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
            raise r.error("shape", "expected a list of whole numbers >= 0")
        shape = tuple(shape)
    return Tensor(id=tid, bytes=r.integer("bytes"), kind=r.string("kind", choices=TENSOR_KINDS),
                  name=r.string("name", default=None), shape=shape,
                  dtype=r.string("dtype", default=None), fx=_tensor_node(r), density=_density(r))


def _density(r: Reader) -> float | None:
    """The optional ``density`` (R40): a fraction of non-zero elements, 0 to 1."""
    value = r.get(_DENSITY_FIELD, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise r.error(_DENSITY_FIELD, f"expected a fraction of non-zero elements from 0 to 1, got {value!r}")
    return float(value)


def _op_from_dict(item, file: str, i: int) -> Op:
    r = Reader(item, file, f"ops[{i}]")
    oid = r.string("id")
    r.where = f"ops[{i}] ({oid})"
    r.reject_unknown(_OP_FIELDS | {_FX_FIELD, _VARIANTS_FIELD, _RERUN_FIELD, _SPLIT_FIELD})
    flops = r.get("flops", None)
    outputs = tuple(r.string_list("outputs", default=[]))
    return Op(
        id=oid,
        name=r.string("name"),
        phase=r.string("phase", choices=PHASES),
        time_us=r.number("time_us"),
        inputs=tuple(r.string_list("inputs", default=[])),
        outputs=outputs,
        updates=tuple(r.string_list("updates", default=[])),
        workspace_bytes=r.integer("workspace_bytes", default=0),
        flops=None if flops is None else r.number("flops"),
        module=r.string("module", default=None),
        fx=_op_node(r),
        variants=_variants(r),
        rerun_outputs=_rerun_outputs(r, outputs),
        split=_split(r),
    )


def _split(r: Reader) -> Split | None:
    """The optional ``split`` of an op (R54): {over, max_chunks (2 to 4096, default 64),
    launch_us (default 5)}."""
    if _SPLIT_FIELD not in r.data:
        return None
    s = r.mapping(_SPLIT_FIELD)
    s.reject_unknown({"over", "max_chunks", "launch_us"})
    over = s.string("over", choices=SPLIT_AXES)
    most = s.integer("max_chunks", default=64)
    if not 2 <= most <= 4096:
        raise s.error("max_chunks", f"must be from 2 to 4096, got {most}")
    launch = s.number("launch_us", default=5.0)
    if not launch < MAX_US:
        raise s.error("launch_us", f"must be below 10^9 us, got {launch}")
    return Split(over, most, float(launch))


def _rerun_outputs(r: Reader, outputs: tuple[str, ...]) -> tuple[str, ...] | None:
    """The optional ``rerun_outputs`` of an op (R15): the outputs a re-run makes, each an
    output of the op, listed once (absent: every output)."""
    if _RERUN_FIELD not in r.data:
        return None
    remade = r.string_list(_RERUN_FIELD)
    for i, tid in enumerate(remade):
        if tid not in outputs:
            raise r.error(f"{_RERUN_FIELD}[{i}]", f"{tid!r} is not an output of the op")
        if tid in remade[:i]:
            raise r.error(f"{_RERUN_FIELD}[{i}]", f"{tid!r} is listed twice")
    return tuple(remade)


def _variants(r: Reader) -> tuple[Variant, ...]:
    """The optional ``variants`` of an op (R52): a list of {name, time_us, workspace_bytes},
    names unique and none called "default"."""
    if _VARIANTS_FIELD not in r.data:
        return ()
    items = r.get(_VARIANTS_FIELD)
    if not isinstance(items, list):
        raise r.error(_VARIANTS_FIELD, "expected a list of {name, time_us, workspace_bytes}")
    out, seen = [], set()
    for i, item in enumerate(items):
        v = Reader(item, r.file, r.path(f"{_VARIANTS_FIELD}[{i}]"))
        v.reject_unknown({"name", "time_us", "workspace_bytes"})
        name = v.string("name")
        if name in seen or name == "default":
            raise v.error("name", f"{name!r} is {'used twice' if name in seen else 'reserved (the op itself)'}")
        seen.add(name)
        time_us = v.number("time_us")
        workspace = v.integer("workspace_bytes", default=0)
        if not time_us < MAX_US:
            raise v.error("time_us", f"must be below 10^9 us, got {time_us} (R23)")
        if not workspace < MAX_BYTES:
            raise v.error("workspace_bytes", f"must be below 2^53, got {workspace} (R23)")
        out.append(Variant(name, time_us, workspace))
    return tuple(out)


def _tensor_node(r: Reader) -> TensorNode | None:
    """The optional ``fx`` of a tensor entry (TensorNode)."""
    if _FX_FIELD not in r.data:
        return None
    fx = r.mapping(_FX_FIELD)
    fx.reject_unknown({"node", "output", "role"})
    output = fx.get("output", None)
    if output is not None:
        output = fx.integer("output")
    return TensorNode(fx.string("node"), output, fx.string("role", default=None, choices=INPUT_ROLES))


def _op_node(r: Reader) -> OpNode | None:
    """The optional ``fx`` of an op entry (OpNode)."""
    if _FX_FIELD not in r.data:
        return None
    fx = r.mapping(_FX_FIELD)
    fx.reject_unknown({"nodes", "overloads", "slot", "rewrite", "random"})
    nodes, overloads = fx.string_list("nodes"), fx.string_list("overloads")
    if not nodes or len(nodes) != len(overloads):
        raise fx.error("overloads", f"expected one overload per node ({len(nodes)} nodes), got {len(overloads)}")
    slot = fx.get("slot", None)
    if slot is not None:
        slot = fx.integer("slot")
    random = fx.get("random", False)
    if not isinstance(random, bool):
        raise fx.error("random", f"expected true or false, got {random!r}")
    return OpNode(tuple(nodes), tuple(overloads), slot, fx.string("rewrite", default=None, choices=FX_REWRITES),
                  random)


def _check_plain_json(value, file: str, where: str, depth: int = 0) -> None:
    """Free-form fields must hold plain JSON (YAML can produce dates, sets, ...)."""
    if depth > 32:
        raise InputError(file, where, "nested too deeply")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InputError(file, where, f"keys must be strings, got {key!r}")
            _check_plain_json(item, file, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        for k, item in enumerate(value):
            _check_plain_json(item, file, f"{where}[{k}]", depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(file, where, "numbers must be finite")
    elif value is not None and not isinstance(value, (str, int, bool)):
        raise InputError(file, where, f"expected plain JSON data, got {type(value).__name__}")


# ----------------------------------------------------------------------------- files


def load_profile(path: str | Path) -> Profile:
    """Load and validate a profile from ``.json``, ``.json.gz`` or ``.yaml``.

    Raises InputError naming the file, field and problem.
    """
    return _profile_from_document(read_document(path), str(path), consume=True)


def canonical_json(profile: Profile) -> str:
    """The canonical text: sorted keys, no spaces; what ``profile_sha256`` hashes."""
    return json.dumps(profile.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def profile_sha256(profile: Profile) -> str:
    """Hex sha256 of the canonical JSON; plans name the profile they were made for by it.

    Computed once per Profile object (profiles are not changed after construction).
    """
    return profile.sha256


def profile_bytes(profile: Profile) -> bytes:
    """The saved JSON text: canonical entries, one tensor or op per line (diff-friendly)."""
    data = profile.to_dict()

    def line(value) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    head = (f'{{"format":{line(FORMAT)},"name":{line(data["name"])},'
            f'"source":{line(data["source"])},\n')
    tensors = ",\n".join(line(t) for t in data["tensors"])
    ops = ",\n".join(line(o) for o in data["ops"])
    return f'{head}"tensors":[\n{tensors}\n],\n"ops":[\n{ops}\n]}}\n'.encode("utf-8")


def save_profile(profile: Profile, path: str | Path) -> None:
    """Save as JSON (``.json``), gzipped JSON (``.json.gz``, reproducible) or YAML (``.yaml``).

    The write is atomic. Raises InputError if the file cannot be written, or for YAML
    larger than a YAML file may be read (``files.YAML_SHARE``).
    """
    lower = str(path).lower()
    if lower.endswith((".yaml", ".yml")):
        payload = yaml.safe_dump(profile.to_dict(), sort_keys=True).encode("utf-8")
        limit = max_input_bytes() // YAML_SHARE
        if len(payload) > limit:  # it could not be read back: YAML is for hand-written files
            raise InputError(str(path), "", f"as YAML this profile is {len(payload)} bytes, more than a YAML "
                                            f"file may be ({limit}); write .json or .json.gz")
    elif lower.endswith(".gz"):
        payload = gzip_bytes(profile_bytes(profile))
    else:
        payload = profile_bytes(profile)
    write_atomic(path, payload)
