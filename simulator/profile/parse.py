"""Reading a profile document (parsed JSON or YAML): every field checked, with one line
naming the file, the field and the problem; the common entries take a fast path."""
from __future__ import annotations

import math
import sys

from ..errors import InputError
from ..fields import Reader, is_id_list
from ..files import no_gc
from ..units import MAX_BYTES, MAX_COUNT, MAX_US
from .facts import Profile, check_op_limits, check_tensor_limits, limits_checked
from .records import (COLLECTIVE_KINDS, FORMAT, FX_REWRITES, INPUT_ROLES, PHASES, SPLIT_AXES, TENSOR_KINDS,
                      Collective, Op, OpNode, Split, Tensor, TensorNode, Variant)

_TENSOR_FIELDS = {"id", "bytes", "kind", "name", "shape", "dtype"}
_OP_FIELDS = {"id", "name", "phase", "time_us", "inputs", "outputs", "updates",
              "workspace_bytes", "flops", "module"}
_TOP_FIELDS = {"format", "name", "source", "tensors", "ops"}
# Optional node identity for a runtime (``fx``, docs/runtime.md) and measured sparsity
# (``density``, R40): accepted by the field-by-field readers only, so the fast paths
# of _tensors_from_list and _ops_from_list stay as they are.
_FX_FIELD = "fx"
_DENSITY_FIELD = "density"
_VARIANTS_FIELD = "variants"
_RERUN_FIELD = "rerun_outputs"
_SPLIT_FIELD = "split"
_COLLECTIVE_FIELD = "collective"


def profile_from_dict(data, file: str = "<profile>") -> Profile:
    """Validate parsed JSON/YAML and build a Profile.

    Raises InputError naming ``file``, the field and the problem for: a wrong format
    tag, missing or unknown fields, wrong types, negative or non-finite sizes and
    times, bad kinds or phases, duplicate ids, unknown tensor ids, a tensor produced
    twice or used before it is produced, a persistent tensor as an output, a tensor in
    both outputs and updates of one op, and more than 10^7 tensors or ops (R23).
    """
    return profile_from_document(data, file, consume=False)


def profile_from_document(data, file: str, consume: bool) -> Profile:
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
        with limits_checked():
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
        append(tensor if tensor is not None else check_tensor_limits(_tensor_from_dict(item, file, i), i, file))
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
        append(op if op is not None else check_op_limits(_op_from_dict(item, file, i), i, file))
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
    r.reject_unknown(_OP_FIELDS | {_FX_FIELD, _VARIANTS_FIELD, _RERUN_FIELD, _SPLIT_FIELD, _COLLECTIVE_FIELD})
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
        collective=_collective(r),
    )


def _collective(r: Reader) -> Collective | None:
    """The optional ``collective`` of an op (R56): {kind, world (1 to 65536), bytes}."""
    if _COLLECTIVE_FIELD not in r.data:
        return None
    c = r.mapping(_COLLECTIVE_FIELD)
    c.reject_unknown({"kind", "world", "bytes"})
    kind = c.string("kind", choices=COLLECTIVE_KINDS)
    world = c.integer("world")
    if not 1 <= world <= 65536:
        raise c.error("world", f"must be from 1 to 65536, got {world}")
    size = c.integer("bytes")
    if not 0 <= size < MAX_BYTES:
        raise c.error("bytes", f"must be from 0 to below 2^53, got {size}")
    return Collective(kind, world, size)


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
