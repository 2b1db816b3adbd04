"""Kineto import, step 3 (with ``--et``): read an Execution Trace, join it to the kept ops,
and derive dataflow and persistent tensors.

Part of ``tracer.kineto`` (see its docstring for what is modelled); private.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from simulator.errors import InputError

from .iteration import STEP_PATTERN, Iteration, TraceOp
from .memory import Alloc, within_window
from .read import Trace, event_key, int_or, is_int, show, span_order


_BLOCK = 512                  # the caching allocator's rounding
_SLACK = 1 << 20              # an unsplit cached block may exceed the request by < 1 MiB
_MIN_MATCHED = 0.9            # share of kept ops an ET must join
_MAX_SEQ_MISMATCH = 0.05      # share of joined pairs whose sequence numbers may differ


@dataclass(eq=False)
class _Node:
    id: int
    name: str
    parent: int | None
    tid: object
    seq: int
    rf: int
    refs: list               # _Ref, inputs then outputs, in argument order
    children: list = field(default_factory=list)


@dataclass
class _Ref:
    storage: int
    nbytes: int
    device: str
    output: bool
    mutable: bool
    shape: list | None
    dtype: str | None


@dataclass
class _Et:
    file: str
    schema: str
    pid: object
    nodes: dict              # id -> _Node (roots excluded)


_ET_ROOT = re.compile(r"^\[pytorch\|profiler\|execution_(trace|graph)\|(thread|process)\]$")
_DTYPES = {"float": "fp32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16",
           "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
           "unsigned char": "uint8", "bool": "bool"}


def read_et(document, file: str) -> _Et:
    """Parse an Execution Trace (schema 1.0.1, or 1.0.2+ with ctrl_deps and attrs)."""
    if not isinstance(document, dict):
        raise InputError(file, "", "expected a JSON object (a PyTorch Execution Trace)")
    nodes = document.get("nodes")
    if not isinstance(nodes, list):
        raise InputError(file, "nodes", "missing or not a list: not a PyTorch Execution Trace")
    schema = document.get("schema")
    et = _Et(file, schema if isinstance(schema, str) else "unknown", document.get("pid"), {})
    for i, raw in enumerate(nodes):
        node = _read_node(raw, file, i)
        if node is not None:
            et.nodes[node.id] = node
    if not et.nodes:
        raise InputError(file, "nodes", "no operator nodes")
    for node in et.nodes.values():
        parent = et.nodes.get(node.parent)
        if parent is not None:
            parent.children.append(node)
    for node in et.nodes.values():
        node.children.sort(key=lambda n: n.id)
    return et


def _read_node(raw, file: str, i: int) -> _Node | None:
    where = f"nodes[{i}]"
    if not isinstance(raw, dict):
        raise InputError(file, where, "expected an object")
    attrs = _node_attrs(raw, file, where)
    node_id, name = raw.get("id"), raw.get("name")
    if not is_int(node_id):
        raise InputError(file, f"{where}.id", f"expected an integer, got {show(node_id)}")
    if not isinstance(name, str):
        raise InputError(file, f"{where}.name", "expected a string")
    if _ET_ROOT.match(name):
        return None
    parent = raw.get("parent", raw.get("ctrl_deps"))
    schema = attrs.get("op_schema")
    mutable = _mutable_arguments(schema if isinstance(schema, str) else "")
    refs = []
    for output, key in ((False, "inputs"), (True, "outputs")):
        values, shapes, types = _arguments(raw, key, file, where)
        for position, value in enumerate(values):
            shape = shapes[position] if position < len(shapes) else None
            kind = types[position] if position < len(types) else None
            refs.extend(_tensor_refs(value, shape, kind, output,
                                     not output and position in mutable))
    return _Node(node_id, name, parent if is_int(parent) else None, attrs.get("tid"),
                 int_or(attrs.get("seq_id"), -1), int_or(attrs.get("rf_id"), 0), refs)


def _node_attrs(raw: dict, file: str, where: str) -> dict:
    """Scalar fields: top-level (1.0.1) or in an ``attrs`` list of {name, value} (1.0.2+)."""
    attrs = {k: raw.get(k) for k in ("tid", "seq_id", "rf_id", "op_schema") if k in raw}
    listed = raw.get("attrs")
    if listed is None:
        return attrs
    if not isinstance(listed, list):
        raise InputError(file, f"{where}.attrs", "expected a list")
    for entry in listed:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            attrs.setdefault(entry["name"], entry.get("value"))
    return attrs


def _arguments(raw: dict, key: str, file: str, where: str):
    """(values, shapes, types) of a node's inputs or outputs, either layout."""
    block = raw.get(key, [])
    if isinstance(block, dict):                     # 1.0.2+: {values, shapes, types}
        values, shapes, types = (block.get("values", []), block.get("shapes", []),
                                 block.get("types", []))
    else:                                           # 1.0.1: parallel lists
        prefix = key[:-1]                           # input / output
        values, shapes, types = (block, raw.get(f"{prefix}_shapes", []),
                                 raw.get(f"{prefix}_types", []))
    for part, value in (("", values), ("shapes", shapes), ("types", types)):
        if not isinstance(value, list):
            label = f"{where}.{key}" + (f".{part}" if part else "")
            raise InputError(file, label, "expected a list")
    return values, shapes, types


def _is_tensor(value) -> bool:
    """A tensor argument: (tensor id, storage id, offset, elements, element size, device)."""
    return (isinstance(value, list) and len(value) == 6 and isinstance(value[5], str)
            and all(is_int(v) for v in value[:5]))


def _tensor_refs(value, shape, kind, output: bool, mutable: bool, depth: int = 0):
    """The tensors in one argument (a tensor, or nested lists of them)."""
    if depth > 8 or not isinstance(value, list):
        return []
    if _is_tensor(value):
        _, storage, offset, count, size, device = value
        dtypes = re.findall(r"Tensor\(([^)]*)\)", kind) if isinstance(kind, str) else []
        dims = shape if isinstance(shape, list) and all(is_int(d) and d >= 0
                                                        for d in shape) else None
        return [_Ref(storage, max(0, (offset + count) * size), device, output, mutable,
                     dims, _DTYPES.get(dtypes[0]) if dtypes else None)]
    refs = []
    for k, item in enumerate(value):
        sub_shape = shape[k] if isinstance(shape, list) and k < len(shape) else None
        refs.extend(_tensor_refs(item, sub_shape, kind, output, mutable, depth + 1))
    return refs


def _mutable_arguments(schema: str) -> set:
    """Positions of the arguments a schema marks as written, ``Tensor(a!)``."""
    open_ = schema.find("(")
    close = schema.rfind(") ->") if ") ->" in schema else schema.rfind(")")
    if open_ < 0 or close <= open_:
        return set()
    parts, depth, current = [], 0, []
    for ch in schema[open_ + 1:close]:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    arguments = [p for p in parts if p and p != "*"]
    return {k for k, arg in enumerate(arguments) if "!" in arg.rsplit(" ", 1)[0]}


# ---------------------------------------------------------------------------- join


def _join(iteration: Iteration, et: _Et, trace: Trace):
    """Map spans to ET nodes, ``id(span) -> (span, node)``, and say how; check that the
    files are of the same run and iteration."""
    if is_int(et.pid):
        pids = {s.thread[0] for s in trace.spans if not s.annotation}
        if event_key(et.pid) not in pids and all(isinstance(p, int) for p in pids):
            raise InputError(et.file, "pid", f"the ET is of process {et.pid}, the trace of "
                             f"{', '.join(str(p) for p in sorted(pids))}: not the same run")
    spans = [s for s in trace.spans if within_window(s.start, iteration.window)
             and not STEP_PATTERN.match(s.name)]
    pairs, how = _join_by_rf_id(spans, et), "rf_id"
    if not pairs:
        pairs, how = _join_by_order(spans, et), "name and order"
    kept = [op for op in iteration.ops if id(op.span) in pairs]
    if len(kept) < _MIN_MATCHED * len(iteration.ops):
        raise InputError(et.file, "nodes", f"does not match the trace: only {len(kept)} of "
                         f"{len(iteration.ops)} GPU operators found (same run and iteration?)")
    compared = differ = 0
    for span, node in pairs.values():
        seq = int_or(span.args.get("Sequence number"), -1)
        if seq >= 0 and node.seq >= 0:
            compared += 1
            differ += seq != node.seq
    if compared and differ > _MAX_SEQ_MISMATCH * compared:
        raise InputError(et.file, "nodes", f"does not match the trace: {differ} of {compared} "
                         "joined operators have other sequence numbers (another iteration?)")
    return pairs, how


def _join_by_rf_id(spans: list, et: _Et) -> dict:
    by_rf = {n.rf: n for n in et.nodes.values() if n.rf > 0}
    pairs = {}
    for span in spans:
        rf = int_or(span.args.get("Record function id"), 0)
        if rf > 0 and rf in by_rf and by_rf[rf].name == span.name:
            pairs[id(span)] = (span, by_rf[rf])
    return pairs


def _join_by_order(spans: list, et: _Et) -> dict:
    """Align each Kineto thread with the ET thread whose names match it best."""
    kineto: dict = {}
    for span in sorted(spans, key=span_order):
        kineto.setdefault(span.thread, []).append(span)
    threads: dict = {}
    for node in sorted(et.nodes.values(), key=lambda n: n.id):
        threads.setdefault(event_key(node.tid), []).append(node)
    scored = []
    for kt, kspans in kineto.items():
        for et_tid, nodes in threads.items():
            blocks = _blocks([s.name for s in kspans], [n.name for n in nodes])
            scored.append((-sum(b.size for b in blocks), str(kt), str(et_tid), kt, et_tid, blocks))
    scored.sort(key=lambda row: row[:3])
    pairs, used_k, used_e = {}, set(), set()
    for score, _, _, kt, et_tid, blocks in scored:
        if score == 0 or kt in used_k or et_tid in used_e:
            continue
        used_k.add(kt)
        used_e.add(et_tid)
        for block in blocks:
            for j in range(block.size):
                span = kineto[kt][block.a + j]
                pairs[id(span)] = (span, threads[et_tid][block.b + j])
    return pairs


def _blocks(a: list, b: list):
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [block for block in matcher.get_matching_blocks() if block.size]


# ---------------------------------------------------------------------------- dataflow


@dataclass
class Flow:
    """The ET's dataflow: per op, what it reads and updates, in first-touch order."""
    reads: dict              # op index -> {key: Alloc or persistent record}
    updates: dict            # op index -> {key: Alloc or persistent record}
    persistent: list         # records: id, storage, bytes, kind, shape, dtype, ...
    stats: dict


def dataflow(iteration: Iteration, et: _Et, trace: Trace) -> Flow:
    """Which tensors each op reads and updates, and the persistent tensors, from the ET."""
    pairs, how = _join(iteration, et, trace)
    ops = iteration.ops
    device = iteration.device
    by_addr = _allocations_by_address(iteration.allocations)
    binding: dict = {}                                     # storage -> Alloc
    persistent: dict = {}                                  # storage -> info
    reads: dict = {}
    updates: dict = {}
    claimed: set = set()
    stats = {"schema": et.schema, "joined_by": how, "joined_ops": 0, "reads": 0, "updates": 0,
             "bound_storages": 0, "unbound_outputs": 0}
    for k, op in enumerate(ops):
        joined = pairs.get(id(op.span))
        if joined is None:
            continue
        stats["joined_ops"] += 1
        for storage, touch in _touched(joined[1], device).items():
            if _bind(op, storage, touch, binding, claimed):
                stats["bound_storages"] += 1
                continue
            target = _resolve(storage, binding, by_addr, k)
            if target is None:
                if storage in binding or touch["first_output"]:
                    stats["unbound_outputs"] += touch["first_output"]
                    continue
                target = _persistent(persistent, storage, touch)
                target["phases"].add(op.phase)
                if touch["mutable"]:
                    target["updated_in"].add(op.phase)
                key = ("p", storage)
            elif target.producer >= k or target.temporary:
                continue                   # its own output, or a temporary
            else:
                key = ("t", id(target))
            bucket = updates if touch["mutable"] else reads
            bucket.setdefault(k, {}).setdefault(key, target)
    infos = _classify(persistent)
    stats["persistent_tensors"] = len(infos)
    stats["persistent_bytes"] = sum(p["bytes"] for p in infos)
    stats["reads"] = sum(len(v) for v in reads.values())
    stats["updates"] = sum(len(v) for v in updates.values())
    return Flow(reads, updates, infos, stats)


def _touched(node: _Node, device) -> dict:
    """The CUDA storages a node's subtree touches, in first-touch order, with how."""
    touched: dict = {}
    stack, order, seen = [node], [], set()
    while stack:                                       # pre-order, children by id
        current = stack.pop()
        if id(current) in seen:                        # a malformed ET may loop
            continue
        seen.add(id(current))
        order.append(current)
        stack.extend(reversed(current.children))
    for current in order:
        for ref in current.refs:
            if ref.nbytes <= 0 or not _on_device(ref.device, device):
                continue
            entry = touched.get(ref.storage)
            if entry is None:
                entry = touched[ref.storage] = {"first_output": ref.output, "mutable": False,
                                                "nbytes": 0, "shape": ref.shape,
                                                "dtype": ref.dtype}
            entry["mutable"] |= ref.mutable
            if ref.nbytes > entry["nbytes"]:
                entry.update(nbytes=ref.nbytes, shape=ref.shape, dtype=ref.dtype)
    return touched


def _on_device(device: str, index) -> bool:
    if not device.startswith("cuda"):
        return False
    _, _, number = device.partition(":")
    return index is None or not number.isdigit() or int(number) == index


def _bind(op: TraceOp, storage, touch: dict, binding: dict, claimed: set) -> bool:
    """A storage first met as an output claims the op's next allocation that fits it."""
    if not touch["first_output"]:
        return False
    for alloc in op.allocations:
        if id(alloc) not in claimed and _fits(alloc.event.bytes, touch["nbytes"]):
            claimed.add(id(alloc))
            binding[storage] = alloc
            if alloc.shape is None:
                alloc.shape, alloc.dtype = touch["shape"], touch["dtype"]
            return True
    return False


def _fits(block: int, request: int) -> bool:
    rounded = -(-request // _BLOCK) * _BLOCK
    return request <= block <= rounded + _SLACK


def _allocations_by_address(allocations: list) -> dict:
    by_addr: dict = {}
    for alloc in allocations:
        if alloc.event.addr is not None:
            by_addr.setdefault(alloc.event.addr, []).append(alloc)
    return by_addr


def _resolve(storage, binding: dict, by_addr: dict, k: int):
    """The allocation a bound storage refers to during op k: the bound one if it is
    live then, else the one live at its address (ids of schema 1.0.1 follow addresses)."""
    alloc = binding.get(storage)
    if alloc is None:
        return None
    if _live_at(alloc, k):
        return alloc
    if alloc.event.addr is not None:
        for other in by_addr.get(alloc.event.addr, []):
            if _live_at(other, k):
                return other
    return None


def _live_at(alloc: Alloc, k: int) -> bool:
    return alloc.producer is not None and alloc.producer <= k <= alloc.last


def _persistent(persistent: dict, storage, touch: dict) -> dict:
    """The record of a storage used but never created in the window."""
    info = persistent.get(storage)
    if info is None:
        info = persistent[storage] = {"storage": storage, "bytes": 0, "phases": set(),
                                      "updated_in": set(), "shape": touch["shape"],
                                      "dtype": touch["dtype"], "order": len(persistent)}
    rounded = -(-touch["nbytes"] // _BLOCK) * _BLOCK
    if rounded > info["bytes"]:
        info.update(bytes=rounded, shape=touch["shape"], dtype=touch["dtype"])
    return info


def _classify(persistent: dict) -> list:
    """weight / optimizer_state / input, from where a persistent storage is used."""
    infos = []
    for info in sorted(persistent.values(), key=lambda p: p["order"]):
        if "optimizer" in info["updated_in"] and "forward" in info["phases"]:
            kind = "weight"
        elif info["phases"] == {"optimizer"}:
            kind = "optimizer_state"
        else:
            kind = "input"
        info["kind"] = kind
        info["id"] = f"p{len(infos)}"
        infos.append(info)
    return infos
