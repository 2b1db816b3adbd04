"""Lower a captured step's FX graph to a profile's tensors and ops, timed by the roofline.

- One tensor per storage (``untyped_storage()`` identity of the fake values): views
  and in-place results are folded into their base storage. Kinds: parameters
  ``weight``; buffers (batch-norm running statistics, HF position ids) also
  ``weight`` (persistent model state, no optimizer op; named after the buffer);
  AdamW ``exp_avg`` / ``exp_avg_sq`` and SGD ``momentum_buffer`` ``optimizer_state``;
  the batch ``input``; new storages of the forward ``activation``, of the backward
  ``gradient``. Storages of 0 bytes are left out.
- Which graph nodes become profile ops: every ATen op that writes memory, i.e. that
  returns a new storage or writes one of its arguments (schema ``(a!)``). Folded
  away, with no op: view and alias ops (their outputs share an existing storage and
  they write nothing: ``view``, ``_unsafe_view``, ``t``, ``transpose``, ``expand``,
  ``slice``, ``split``, ``detach``, ``alias``, ...), ``getitem``, the profiler
  markers, and allocation-only ops (``empty``, ``empty_like``, ``empty_strided``,
  ``new_empty``, ``new_empty_strided``): their storage becomes an output of the first
  kernel that touches it (for instance the ``bernoulli_`` that fills a CPU dropout
  mask).
- In-place writes are ``updates`` (the optimizer, ``relu_``, ``add_`` of a residual,
  batch-norm running statistics, in-place gradient accumulation); a tensor written
  in place is not also listed in ``inputs``.
- Gradient accumulation follows the autograd engine of a real run: where a tensor
  feeds several ops, its gradient contributions are summed in place into the first
  one when the engine holds the last reference to it (it is no view and has no
  later use), else out of place (:func:`_accumulate_in_place`). make_fx itself always
  records the out-of-place ``add`` because the tracer holds extra references.
- The optimizer: each ``_foreach_*`` kernel is split per list element, and the
  slices of one parameter are merged into one op per parameter, in parameter order
  (``optim::adamw_foreach``: inputs its gradient, updates the weight, ``exp_avg``
  and ``exp_avg_sq``; ``optim::sgd_foreach``: the gradient, updates the weight and
  ``momentum_buffer``), so that a weight and its state need to be resident only for
  their own step, as a swapping runtime steps them. Its time is the parameter's
  share (by bytes) of each foreach kernel's roofline time (the total is the foreach
  kernels' time), its FLOPs 0. The foreach form's one temporary,
  ``sqrt(exp_avg_sq)`` for every parameter at once, is allocated only after the
  last kernel reading the gradients, which are then freed: its peak is persistent +
  max(all gradients, all temporaries) = persistent + all gradients, exactly what the
  per-parameter ops hold at the first optimizer op (every gradient is live there).
  So the temporary is folded away and adds no workspace (with ``runtime=True`` it is
  each op's workspace: a runtime stepping parameter by parameter holds one at a time).
- ``flops`` from ``torch.utils.flop_counter``'s registry (matmul, convolution,
  attention; 0 for every other op, whose time is memory-bound anyway); ``time_us``
  from :func:`tracer.roofline.kernel_time_us` with the dtype's peak, where the bytes
  moved are the distinct elements of every tensor argument read plus every tensor
  written (an embedding reads only the gathered rows).
- ``module``: the qualified name of the innermost ``nn.Module`` whose forward ran
  the op (forward hooks annotate the graph nodes); backward ops get the module of the
  forward op that created their autograd node (autograd node pre-hooks carry its
  sequence number into the graph, as AOTAutograd does); gradient accumulations the
  module of the backward op before them; optimizer ops the module owning the
  parameter. The root module is ``model``; a loss computed outside it is ``loss``.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

from simulator.hardware import Hardware
from simulator.profile import Op, OpNode, Tensor, TensorNode
from tracer.pytorch.capture import Capture
from tracer.pytorch.dtypes import dtype_name
from tracer.pytorch.node_identity import flat_tensors, is_random, node_values, overload_name, qualified, written_args
from tracer.pytorch.optim import state_names
from tracer.roofline import kernel_time_us
from tracer.pytorch.splittable import split_rule
from tracer.pytorch.step import LOSS_MODULE, ROOT_MODULE, TrainStep

_ALLOC_ONLY = ("empty.memory_format", "empty_like.default", "empty_strided.default",
               "new_empty.default", "new_empty_strided.default", "empty.names")
_GATHER = ("embedding.default",)


@dataclass(eq=False)
class _T:
    """A tensor (storage) while lowering."""
    index: int
    bytes: int
    kind: str
    name: str
    shape: tuple
    dtype: str
    pending: bool = False     # allocated by an allocation-only op, not yet produced
    dropped: bool = False     # folded away (optimizer temporary, in-place accumulation)
    node: str | None = None   # the graph node whose output (``output``) is the storage
    output: int | None = None
    role: str | None = None   # graph inputs: parameter, buffer, optimizer_state, batch, target


@dataclass
class _RawOp:
    """An op while lowering: tensors as _T, time not yet computed (foreach slices: shared)."""
    name: str
    phase: str
    module: str
    inputs: list
    outputs: list
    updates: list
    flops: float
    bytes_moved: float
    slot: int | None = None   # list position of a foreach slice / amp step's parameter
    kernel: int | None = None  # which foreach kernel a slice belongs to
    part: str = "step"         # which part of a parameter's optimizer step (_OPTIM_PARTS)
    time_us: float | None = None
    dense: tuple = ()          # accumulations: which inputs are whole, contiguous storages
    workspace: int = 0         # bytes of internal temporaries (merged optimizer ops)
    nodes: list = field(default_factory=list)      # graph node names it runs, in order
    overloads: list = field(default_factory=list)  # their ATen overloads
    rewrite: str | None = None  # see simulator.profile.OpNode
    random: bool = False        # draws from the RNG


@dataclass
class _Lowering:
    """The tensors (one per storage) and raw ops built so far."""
    hw: Hardware
    dtype: str
    tensors: list = field(default_factory=list)
    by_storage: dict = field(default_factory=dict)
    ops: list = field(default_factory=list)

    def new_tensor(self, storage, val, kind: str, name: str, pending: bool = False,
                   node=None, output: int | None = None, role: str | None = None) -> _T | None:
        nbytes = int(storage.nbytes())
        if nbytes == 0:
            return None
        t = _T(len(self.tensors), nbytes, kind, name, _storage_shape(val, nbytes),
               dtype_name(val.dtype), pending, node=None if node is None else node.name,
               output=output, role=role)
        self.tensors.append(t)
        self.by_storage[storage._cdata] = t
        return t

    def lookup(self, val) -> _T | None:
        return self.by_storage.get(val.untyped_storage()._cdata)


def _storage_shape(val, nbytes: int) -> tuple:
    """The tensor's shape when it spans its whole storage, else the flat element count."""
    if val.numel() * val.element_size() == nbytes:
        return tuple(int(d) for d in val.shape)
    return (nbytes // max(val.element_size(), 1),)


def _distinct_bytes(val) -> int:
    """Bytes of the distinct elements a (possibly broadcast) view touches."""
    count = 1
    for size, stride in zip(val.shape, val.stride()):
        if stride != 0:
            count *= int(size)
    return min(count * val.element_size(), int(val.untyped_storage().nbytes()))


def _flops(target, args, kwargs, out) -> float:
    from torch.utils.flop_counter import flop_registry
    formula = flop_registry.get(target.overloadpacket)
    if formula is None:
        return 0.0
    try:
        return float(formula(*args, **kwargs, out_val=out))
    except Exception:  # a formula that does not accept this overload's arguments
        return 0.0


def _op_name(target) -> str:
    packet = target.overloadpacket
    return f"{target.namespace}::{packet.__name__}"


@dataclass
class _Walk:
    """What the walk over the graph carries from one node to the next."""
    phase: str = "other"                                  # from the last ``phase:`` marker
    ignored: set = field(default_factory=set)             # storages of captured constants
    seq_module: dict = field(default_factory=dict)        # forward seq_nr -> its module
    last_backward_module: str = LOSS_MODULE               # module of the last op charged
    kernel_count: int = 0                                 # optimizer foreach kernels so far
    kernel_nodes: set = field(default_factory=set)        # graph nodes that became profile ops


@dataclass
class _OpValues:
    """The fake tensor values one op reads, returns and writes in place."""
    ins: list
    outs: list
    written: list


def lower(cap: Capture, hw: Hardware, dtype: str, optimizer: str,
          runtime: bool = False) -> tuple[list, list]:
    """Walk the graph in order and build the profile's tensors and ops (kernel times use
    the peak of ``dtype``, or of the amp dtype under amp). ``runtime``: add the node
    identity (``fx``) to every op and tensor, and count the per-parameter optimizer
    temporaries as workspace (see :func:`trace`)."""
    import torch
    gm = cap.graph_module
    low = _Lowering(hw, cap.step.amp or dtype)
    _add_graph_inputs(low, gm, cap.step, optimizer)
    record_enter = torch.ops.profiler._record_function_enter_new.default
    walk = _Walk()
    for node in gm.graph.nodes:
        role = _node_role(node, record_enter)
        if role == "constant":
            _ignore_constant(gm, node, walk.ignored)
        elif role == "marker":
            walk.phase = _phase_after(node.args[0], walk.phase)
        elif role == "op":
            _lower_op(low, walk, node)
    _accumulate_in_place(low)
    return _finish(low, cap.step, optimizer, runtime)


def _graph_input_roles(step: TrainStep, optimizer: str) -> list[tuple[str, str]]:
    """(kind, name) of every graph input, in the order the step takes its arguments."""
    return ([("weight", n) for n in step.param_names]
            + [("weight", n) for n in step.buffer_names]
            + [("optimizer_state", f"{p}.{s}") for s in state_names(optimizer, step.amp)
               for p in step.param_names]
            + [("input", f"batch.{n}") for n in step.input_names])


def input_roles(step: TrainStep) -> list[str]:
    """The role of every graph input (simulator.profile.INPUT_ROLES), in order: a batch
    tensor that only the loss reads (``labels``, a user model's ``target<i>``) is a
    ``target``."""
    states = len(state_names(step.optimizer, step.amp))
    return (["parameter"] * len(step.param_names) + ["buffer"] * len(step.buffer_names)
            + ["optimizer_state"] * (states * len(step.param_names))
            + ["target" if n == "labels" or n.startswith("target") else "batch" for n in step.input_names])


def _add_graph_inputs(low: _Lowering, gm, step: TrainStep, optimizer: str) -> None:
    """Register the placeholders' storages first, so that ops find them by their role."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    roles = _graph_input_roles(step, optimizer)
    if len(roles) != len(placeholders):
        raise RuntimeError(f"expected {len(roles)} graph inputs, found {len(placeholders)}")
    for (kind, name), role, node in zip(roles, input_roles(step), placeholders):
        val = node.meta["val"]
        low.new_tensor(val.untyped_storage(), val, kind, name, node=node, role=role)


def _node_role(node, record_enter) -> str | None:
    """Classify a node: "constant" (get_attr), "marker" (record_function), "op" (ATen), or None."""
    import torch
    if node.op == "get_attr":
        return "constant"
    if node.op != "call_function" or node.target is operator.getitem:
        return None
    if node.target is record_enter:
        return "marker"
    if not isinstance(node.target, torch._ops.OpOverload) or node.target.namespace == "profiler":
        return None
    return "op"


def _ignore_constant(gm, node, ignored: set) -> None:
    """Leave out a constant the trace captured (not swappable): remember its storage."""
    import torch
    val = getattr(gm, node.target, None)
    if isinstance(val, torch.Tensor):
        ignored.add(val.untyped_storage()._cdata)


def _phase_after(label, phase: str) -> str:
    """The phase after a ``record_function`` marker: its ``phase:`` label, else unchanged."""
    if isinstance(label, str) and label.startswith("phase:"):
        return label.split(":", 1)[1]
    return phase


def _module_of(walk: _Walk, meta: dict) -> str:
    """The module an op is charged to (module doc); a forward op also maps its seq_nr to it."""
    custom = meta.get("custom") or {}
    if walk.phase == "forward":
        module = custom.get("module") or LOSS_MODULE
        walk.seq_module.setdefault(meta.get("seq_nr", -1), module)
        walk.last_backward_module = module  # the backward seed belongs to the loss
        return module
    if walk.phase == "backward":
        if "grad_fn" in custom:  # inside an autograd node's backward
            return walk.seq_module.get(custom["grad_fn"], walk.last_backward_module)
        return walk.last_backward_module  # the backward seed, or a gradient accumulation
    return ROOT_MODULE


def _lower_op(low: _Lowering, walk: _Walk, node) -> None:
    """Route one ATen op: allocation-only ops, optimizer foreach kernels, other kernels."""
    target = node.target
    module = _module_of(walk, node.meta)
    args = node_values(node.args)
    kwargs = node_values(node.kwargs)
    out = node.meta.get("val")
    if overload_name(target) in _ALLOC_ONLY:
        _reserve_allocations(low, flat_tensors(out), walk.phase, node)
    elif target.overloadpacket.__name__.startswith("_foreach_") and walk.phase == "optimizer":
        walk.kernel_count += 1
        _lower_foreach(low, node, args, kwargs, out, walk.phase, walk.kernel_count)
    else:
        before = len(low.ops)
        _lower_kernel(low, walk, node, module, args, kwargs, out)
        custom = node.meta.get("custom") or {}
        if walk.phase == "optimizer" and "optim_slot" in custom:
            for raw in low.ops[before:]:  # a part of a mixed-precision step: merged in _finish
                raw.slot, raw.part = custom["optim_slot"], custom["optim_part"]


def _reserve_allocations(low: _Lowering, out_vals: list, phase: str, node) -> None:
    """Register an allocation-only op's storages as pending, for the first kernel to touch."""
    for k, val in enumerate(out_vals):
        storage = val.untyped_storage()
        if storage._cdata not in low.by_storage:
            low.new_tensor(storage, val, _kind_for(phase), "", pending=True, node=node, output=k)


def _lower_kernel(low: _Lowering, walk: _Walk, node, module: str, args, kwargs, out) -> None:
    """Append the raw op of a kernel that writes memory; a view or alias adds nothing."""
    target = node.target
    kind = _kind_for(walk.phase)
    stem = f"{module}.{target.overloadpacket.__name__}"
    vals = _OpValues(flat_tensors((args, kwargs)), flat_tensors(out),
                     written_args(target, args, kwargs))
    new_outputs = _new_outputs(low, vals.outs, walk.ignored, kind, stem, node)
    written = _tracked(low, vals.written, walk.ignored)
    if not new_outputs and not written:
        return  # a view or alias: no kernel
    reads = _tracked(low, vals.ins, walk.ignored)
    outputs = new_outputs + _claim_pending(reads + written, kind, stem)
    inputs, updates = _split_roles(reads, written, outputs)
    overload = overload_name(target)
    raw = _RawOp(_op_name(target), walk.phase, module, inputs, outputs, updates,
                 _flops(target, args, kwargs, out),
                 _bytes_moved(low, overload, vals, outputs, new_outputs),
                 nodes=[node.name], overloads=[qualified(target)], random=is_random(target))
    if _is_accumulation(node, walk.phase, overload, raw, vals):
        raw.dense = tuple(_whole(v, a, walk.kernel_nodes) for v, a in zip(vals.ins, node.args))
    low.ops.append(raw)
    walk.kernel_nodes.add(node)
    if walk.phase == "backward":
        walk.last_backward_module = module


def _new_outputs(low: _Lowering, out_vals: list, ignored: set, kind: str, stem: str, node) -> list:
    """New tensors for the storages an op returns that nothing made before (``stem[.k]``)."""
    new = []
    for k, val in enumerate(out_vals):
        storage = val.untyped_storage()
        if storage._cdata in ignored or storage._cdata in low.by_storage:
            continue
        suffix = f".{k}" if len(out_vals) > 1 else ""
        t = low.new_tensor(storage, val, kind, f"{stem}{suffix}", node=node, output=k)
        if t is not None:
            new.append(t)
    return new


def _tracked(low: _Lowering, vals, ignored: set) -> list:
    """The known tensors behind some values, each once and in order, constants left out."""
    return _dedup(low.lookup(v) for v in vals if v.untyped_storage()._cdata not in ignored)


def _claim_pending(tensors: list, kind: str, stem: str) -> list:
    """Make this kernel the producer of the pending storages it is the first to touch."""
    claimed = []
    for t in tensors:
        if t.pending:
            t.pending = False
            t.kind = kind
            t.name = t.name or stem
            claimed.append(t)
    return claimed


def _split_roles(reads: list, written: list, outputs: list) -> tuple[list, list]:
    """(inputs, updates): written but not produced is an update; read, neither, an input."""
    out_ids = {t.index for t in outputs}
    updates = [t for t in written if t.index not in out_ids]
    upd_ids = {t.index for t in updates}
    inputs = [t for t in reads if t.index not in out_ids and t.index not in upd_ids]
    return inputs, updates


def _bytes_moved(low: _Lowering, overload: str, vals: _OpValues, outputs: list,
                 new_outputs: list) -> int:
    """Bytes a kernel moves for the roofline: distinct elements read plus written (gather: rows)."""
    if overload in _GATHER:
        return (sum(_distinct_bytes(v) for v in vals.ins[1:])
                + 2 * sum(_distinct_bytes(v) for v in vals.outs))
    seen_ids = set()
    moved = 0
    for v in vals.ins:
        if id(v) not in seen_ids and low.lookup(v) not in outputs:
            seen_ids.add(id(v))
            moved += _distinct_bytes(v)
    moved += sum(_distinct_bytes(v) for v in vals.written)
    moved += sum(_distinct_bytes(v) for v in vals.outs if low.lookup(v) in new_outputs)
    return moved


def _is_accumulation(node, phase: str, overload: str, raw: _RawOp, vals: _OpValues) -> bool:
    """A backward ``add`` of two gradients outside any autograd node, for _accumulate_in_place."""
    custom = node.meta.get("custom") or {}
    return (phase == "backward" and "grad_fn" not in custom and overload == "add.Tensor"
            and len(raw.inputs) == 2 and len(raw.outputs) == 1 and len(vals.ins) == 2)


def _whole(val, arg, kernel_nodes: set) -> bool:
    """The very tensor a kernel returned (not a view of it: a view keeps its base, and so
    a second reference to the storage, alive), contiguous and spanning its storage: a
    gradient autograd may reuse in place when it holds the last reference to it."""
    source = arg.args[0] if getattr(arg, "target", None) is operator.getitem else arg
    return (source in kernel_nodes and val.is_contiguous()
            and val.numel() * val.element_size() == val.untyped_storage().nbytes())


def _accumulate_in_place(low: _Lowering) -> None:
    """Gradient accumulation as the autograd engine does it on a real run.

    The engine adds a new gradient contribution to the one it holds
    (``InputBuffer::accumulate``, ``old + new``): in place into the held gradient when
    it holds the last reference to it and its storage and it is a dense, contiguous,
    non-view tensor; else out of place. Under make_fx the fake tensors have extra
    references, so the trace always shows the out-of-place ``add``; here the
    references are read from the schedule (the held gradient's last use is the add,
    and it is no view) and such an add becomes ``aten::add_`` updating the held
    gradient, its output folded into that storage. (A gradient that arrives as a view,
    such as a tied weight's transposed gradient, is added out of place, as on a real
    run.)
    """
    last_use: dict[int, int] = {}
    for k, op in enumerate(low.ops):
        for t in op.inputs + op.updates:
            last_use[t.index] = k
    alias: dict[int, _T] = {}

    def resolve(items):
        return _dedup(alias.get(t.index, t) for t in items)

    for k, op in enumerate(low.ops):
        held = op.inputs[0] if op.dense else None
        op.inputs, op.updates = resolve(op.inputs), resolve(op.updates)
        if held is None or not op.dense[0] or last_use.get(held.index) != k:
            continue
        out = op.outputs[0]
        target = alias.get(held.index, held)
        if target.bytes != out.bytes or target.kind in ("weight", "optimizer_state", "input"):
            continue
        op.name, op.updates, op.outputs = "aten::add_", [target], []
        op.inputs = [t for t in op.inputs if t.index != target.index]
        op.rewrite = "inplace_accumulate"
        alias[out.index] = target
        out.dropped = True


def _kind_for(phase: str) -> str:
    """The kind of a storage a phase creates: forward activation, backward gradient."""
    return {"forward": "activation", "backward": "gradient"}.get(phase, "other")


def _dedup(items) -> list:
    """The tensors among items, each once, in first-seen order (None dropped)."""
    seen, out = set(), []
    for t in items:
        if t is not None and t.index not in seen:
            seen.add(t.index)
            out.append(t)
    return out


def _lower_foreach(low: _Lowering, node, args, kwargs, out, phase: str,
                   kernel: int) -> None:
    """Split one ``_foreach_*`` kernel into per-element slices (merged per parameter later)."""
    import torch
    target = node.target
    lists = [a for a in list(args) + list(kwargs.values())
             if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
    n = len(lists[0])
    written_ids = {id(v) for v in written_args(target, args, kwargs)}
    outs = out if isinstance(out, (list, tuple)) else []
    slices = []
    for i in range(n):
        reads = [lst[i] for lst in lists]
        new = []
        if i < len(outs) and isinstance(outs[i], torch.Tensor):
            val = outs[i]
            storage = val.untyped_storage()
            if storage._cdata not in low.by_storage:
                t = low.new_tensor(storage, val, "other",
                                   f"optimizer.{target.overloadpacket.__name__}.{i}", node=node, output=i)
                if t is not None:
                    new.append(t)
        written = _dedup(low.lookup(v) for v in reads if id(v) in written_ids)
        read_ts = _dedup(low.lookup(v) for v in reads)
        w_ids = {t.index for t in written}
        inputs = [t for t in read_ts if t.index not in w_ids]
        moved = sum(_distinct_bytes(v) for v in reads)
        moved += sum(_distinct_bytes(v) for v in reads if id(v) in written_ids)
        moved += sum(t.bytes for t in new)
        slices.append(_RawOp(_op_name(target), phase, "", inputs, new, written, 0.0, moved,
                             slot=i, kernel=kernel, nodes=[node.name], overloads=[qualified(target)],
                             random=is_random(target)))
    total = sum(s.bytes_moved for s in slices)
    time = kernel_time_us(low.hw, 0.0, total, low.dtype)
    for s in slices:
        s.time_us = time * (s.bytes_moved / total) if total else time / max(n, 1)
    low.ops.extend(slices)


_OPTIM_PARTS = ("step", "cast_master", "copy_param")


def _finish(low: _Lowering, step: TrainStep, optimizer: str, runtime: bool = False) -> tuple[list, list]:
    """Merge optimizer slices per parameter (and part), time the ops, number tensors and ops
    (with ``runtime``: their node identity, see :func:`trace`)."""
    main = [op for op in low.ops if op.slot is None]
    by_part: dict[tuple[int, str], list] = {}
    for op in low.ops:
        if op.slot is not None:
            by_part.setdefault((op.slot, op.part), []).append(op)
    merged = []
    for i, pname in enumerate(step.param_names):
        for part in _OPTIM_PARTS:
            group = by_part.get((i, part))
            if group:
                merged.append(_merge_part(low, group, part, pname, optimizer, runtime))

    ids = {}
    tensors = []
    for t in low.tensors:
        if t.dropped or t.pending:
            continue
        ids[t.index] = f"t{len(tensors)}"
        tensors.append(Tensor(id=ids[t.index], bytes=t.bytes, kind=t.kind, name=t.name or None,
                              shape=t.shape, dtype=t.dtype,
                              fx=TensorNode(t.node, t.output, t.role) if runtime else None))
    ops = []
    for raw in main + merged:
        ops.append(Op(id=f"o{len(ops)}", name=raw.name, phase=raw.phase, time_us=_time(low, raw),
                      inputs=tuple(ids[t.index] for t in raw.inputs if t.index in ids),
                      outputs=tuple(ids[t.index] for t in raw.outputs if t.index in ids),
                      updates=tuple(ids[t.index] for t in raw.updates if t.index in ids),
                      workspace_bytes=raw.workspace, flops=float(raw.flops), module=raw.module,
                      fx=_op_node(raw) if runtime else None, split=split_rule(raw.name)))
    return tensors, ops


def _op_node(raw: _RawOp) -> OpNode:
    """The node identity of a profile op (simulator.profile.OpNode)."""
    return OpNode(tuple(raw.nodes), tuple(raw.overloads), raw.slot if raw.kernel is not None else None,
                  raw.rewrite, raw.random)


def _time(low: _Lowering, raw: _RawOp) -> float:
    """An op's time: set already (optimizer ops, foreach slices) or from the roofline."""
    if raw.time_us is not None:
        return raw.time_us
    return kernel_time_us(low.hw, raw.flops, raw.bytes_moved, low.dtype)


def _merge_part(low: _Lowering, group: list, part: str, pname: str, optimizer: str,
                runtime: bool = False) -> _RawOp:
    """One profile op for one part of one parameter's optimizer step.

    ``step`` (``optim::<optimizer>_foreach``): reads the gradient, updates the weight (or,
    under amp, the master) and the state; what its kernels make is internal and dropped.
    For foreach slices that adds no workspace (module doc); the per-parameter kernels
    of a mixed-precision step hold their temporaries (the fp32 gradient, AdamW's
    denominator) as workspace, at most what they hold at once. ``cast_master``
    (``optim::cast_master``) makes ``<param>.new``; ``copy_param`` (``optim::copy_param``)
    reads it and updates the weight.

    ``runtime``: the foreach slices of one parameter are run as one per-parameter step
    (``fx.rewrite`` ``foreach_split``), which holds that parameter's temporaries (AdamW's
    ``sqrt(exp_avg_sq)``) while it runs: they become its workspace too.
    """
    produced = {t.index for op in group for t in op.outputs}
    inputs, updates, outputs = [], [], []
    for op in group:
        inputs += [t for t in op.inputs if t.index not in produced]
        updates += op.updates
        outputs += op.outputs
    updates = _dedup(t for t in updates if t.index not in produced)
    upd_ids = {t.index for t in updates}
    inputs = _dedup(t for t in inputs if t.index not in upd_ids)
    for t in inputs:
        if t.kind == "gradient":
            t.name = f"{pname}.grad"
    workspace = 0
    if part == "cast_master":
        for t in outputs:
            t.name = f"{pname}.new"
    else:
        for t in outputs:
            t.dropped = True
        if runtime or all(op.kernel is None for op in group):
            workspace = _temporaries_peak(group)
        outputs = []
    name = {"step": f"optim::{optimizer}_foreach", "cast_master": "optim::cast_master",
            "copy_param": "optim::copy_param"}[part]
    owner = pname.rpartition(".")[0] or ROOT_MODULE
    foreach = group[0].kernel is not None
    op = _RawOp(name, "optimizer", owner, inputs, outputs, updates, 0.0,
                sum(o.bytes_moved for o in group), workspace=workspace,
                slot=group[0].slot if foreach else None, kernel=group[0].kernel if foreach else None,
                nodes=[n for o in group for n in o.nodes], overloads=[v for o in group for v in o.overloads],
                rewrite="foreach_split" if foreach else None, random=any(o.random for o in group))
    op.time_us = round(sum(_time(low, o) for o in group), 3)
    return op


def _temporaries_peak(group: list) -> int:
    """The most bytes the tensors made inside a group of kernels hold at once, each held
    from the kernel that makes it to the last kernel of the group that touches it."""
    made = {t.index: t for op in group for t in op.outputs}
    last = {}
    for k, op in enumerate(group):
        for t in op.inputs + op.updates + op.outputs:
            if t.index in made:
                last[t.index] = k
    live = peak = 0
    for k, op in enumerate(group):
        live += sum(t.bytes for t in op.outputs)
        peak = max(peak, live)
        live -= sum(made[i].bytes for i, end in last.items() if end == k)
    return peak
