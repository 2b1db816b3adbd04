"""Profile: a validated iteration and the facts derived from it once, on construction:
producer, consumers, updaters, first and last use, lifetimes, the no-swap resident bytes
and peak, the ideal time and the canonical text its sha256 names. Construction checks the
references and order of the ops, and R23's limits for a profile built in memory."""
from __future__ import annotations

import hashlib
import json
import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate

from ..errors import InputError
from ..files import no_gc
from ..units import MAX_BYTES, MAX_COUNT, MAX_US
from .records import FORMAT, PERSISTENT_KINDS, Op, Tensor


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
    def gather_twins(self) -> dict[str, tuple[tuple[int, str], ...]]:
        """R60: each output of an all-gather (R56) that another all-gather of the same
        inputs makes again -> every such output at its place, as (op position, tensor id)
        in op order: copies of the same values (a unit's parameters gathered for its
        forward, then for its backward)."""
        groups: dict[tuple, list[int]] = {}
        for i, op in enumerate(self.ops):
            if op.collective is not None and op.collective.kind == "all_gather" and op.outputs:
                groups.setdefault((op.inputs, len(op.outputs)), []).append(i)
        twins: dict[str, tuple[tuple[int, str], ...]] = {}
        for positions in groups.values():
            if len(positions) > 1:
                for j in range(len(self.ops[positions[0]].outputs)):
                    chain = tuple((i, self.ops[i].outputs[j]) for i in positions)
                    for _, tid in chain:
                        twins[tid] = chain
        return twins

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


def canonical_json(profile: Profile) -> str:
    """The canonical text: sorted keys, no spaces; what ``profile_sha256`` hashes."""
    return json.dumps(profile.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def profile_sha256(profile: Profile) -> str:
    """Hex sha256 of the canonical JSON; plans name the profile they were made for by it.

    Computed once per Profile object (profiles are not changed after construction).
    """
    return profile.sha256


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

    for i, op in enumerate(ops):
        if op.collective is not None:
            _check_collective(file, i, op)

    profile.tensor_by_id = dict(zip(ids, tensors))
    profile.op_index = op_index
    profile.producer = dict(zip(ids, made))
    profile._uses = (ids, read, written, first, last)   # for consumers, updaters, first_use, last_use
    floor = math.floor   # R3: the rounded op times, us_to_ps inlined (a million calls)
    profile.ideal_ps = sum(map(floor, [op.time_us * 1e6 + 0.5 for op in ops]))
    profile.ideal_us = profile.ideal_ps / 10**6
    _derive_peak(profile, made, last)


def _check_collective(file: str, i: int, op: Op) -> None:
    """R56: a collective op moves data on the interconnect and runs no kernel: no
    workspace, no variants, no split, a time of 0 (its time is the interconnect's, R57),
    and something to read or write."""
    where = f"ops[{i}] ({op.id})"
    if op.workspace_bytes:
        raise InputError(file, f"{where}.workspace_bytes", "a collective op has no workspace")
    if op.variants or op.split is not None:
        raise InputError(file, f"{where}.{'variants' if op.variants else 'split'}",
                         "a collective op has no variants and is not split")
    if op.time_us:
        raise InputError(file, f"{where}.time_us",
                         f"a collective op's time is the interconnect's (R57): give 0, got {op.time_us}")
    if op.collective.kind == "all_reduce" and (op.outputs or not op.updates):
        raise InputError(file, f"{where}.collective.kind",
                         "an all_reduce updates its buffers in place: updates, no outputs")
    if op.collective.kind != "all_reduce" and not (op.inputs or op.updates) and not op.outputs:
        raise InputError(file, f"{where}.collective.kind", f"a {op.collective.kind} reads and makes nothing")


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
def limits_checked():
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
        check_tensor_limits(tensor, i, file)
    for i, op in enumerate(profile.ops):
        check_op_limits(op, i, file)


def check_tensor_limits(tensor: Tensor, i: int, file: str) -> Tensor:
    size = tensor.bytes
    if (type(size) is not int and (isinstance(size, bool) or not isinstance(size, int))) \
            or not 0 <= size < MAX_BYTES:
        raise InputError(file, f"tensors[{i}] ({tensor.id}).bytes",
                         f"must be a whole number from 0 to 2^53 - 1, got {size!r} (R23)")
    return tensor


def check_op_limits(op: Op, i: int, file: str) -> Op:
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
