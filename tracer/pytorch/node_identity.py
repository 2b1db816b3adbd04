"""Node identity: how a profile op or tensor names its place in the traced FX graph.

The tracer writes it (:mod:`tracer.pytorch.lowering` with ``runtime=True``) and the runtime and
the density measurement read it back; both sides use the definitions here, so that
"the k-th tensor output of a node" or "an op that writes its argument" mean the same.

With ``runtime=True`` every op and tensor gets ``fx`` (simulator.profile.OpNode / TensorNode;
docs/runtime.md): an op's graph node names and ATen overloads (several for a merged
optimizer op, with the foreach ``slot`` it runs), its ``rewrite`` (``inplace_accumulate``
for an accumulation made in place by the lowering, ``foreach_split``) and whether it is ``random``
(tagged ``nondeterministic_seeded``); a tensor's node and position among that node's
tensor outputs (an allocation-only node for a storage a later kernel fills), or for a
graph input its placeholder and role (parameter, buffer, optimizer_state, batch,
target). ``source`` gets ``fx: 1``. Without it nothing changes.
"""
from __future__ import annotations

FX_VERSION = 1  # source["fx"] of profiles traced with runtime=True (docs/runtime.md)


def flat_tensors(obj, out: list | None = None) -> list:
    """The tensors in a node's value (a tensor, or lists, tuples and dicts of them),
    flattened in order, appended to ``out`` when given: the index a tensor's
    ``fx.output`` counts, and the tracer's walk over an op's arguments."""
    import torch
    out = [] if out is None else out
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            flat_tensors(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            flat_tensors(item, out)
    return out


def node_values(node_args):
    """Replace graph nodes by their fake values."""
    from torch.fx import Node
    from torch.utils._pytree import tree_map
    return tree_map(lambda a: a.meta.get("val") if isinstance(a, Node) else a, node_args)


# Ops that write arguments their schema does not mark ``(a!)``: batch norm in training
# updates the running statistics (arguments 3 and 4; argument 5 is ``training``).
_UNMARKED_WRITES = {"native_batch_norm": (3, 4), "cudnn_batch_norm": (3, 4),
                    "miopen_batch_norm": (3, 4)}


def written_args(target, args, kwargs) -> list:
    """The argument values the op writes in place: its schema's ``(a!)`` arguments, and
    batch norm's running statistics in training."""
    written = []
    unmarked = _UNMARKED_WRITES.get(target.overloadpacket.__name__)
    if unmarked and len(args) > 5 and args[5]:
        flat_tensors([args[i] for i in unmarked], written)
    for i, arg in enumerate(target._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if arg.kwarg_only or i >= len(args):
            value = kwargs.get(arg.name)
        else:
            value = args[i]
        flat_tensors(value, written)
    return written


def qualified(target) -> str:
    """``namespace::packet.overload`` (e.g. ``aten::add.Tensor``): exactly which kernel."""
    return f"{target.namespace}::{overload_name(target)}"


def is_random(target) -> bool:
    """An op that draws from the RNG (tagged ``nondeterministic_seeded``: dropout,
    bernoulli, rand*, the attention kernels with dropout)."""
    import torch
    return torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())


def overload_name(target) -> str:
    """``packet.overload`` (e.g. ``add.Tensor``), the key of the lowering's op tables."""
    return f"{target.overloadpacket.__name__}.{target._overloadname}"
