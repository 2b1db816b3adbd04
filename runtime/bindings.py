"""``bind(model_spec, profile)``: the traced step's FX graph, to be run for real, tied to a
profile op by op and tensor by tensor.

The profile must carry node identity (``fx``: traced with ``trace(..., runtime=True)``,
``swapplan trace --runtime``). ``bind`` traces the model again exactly as the profile's
``source`` says (same make_fx call on fake tensors, same options), lowers the graph again
and checks that the result hashes to the profile's sha256: the graph in hand is the one
the profile describes, node names included. The bindings then map

- every profile op to the graph nodes it runs (``fx.nodes``), with its ``slot`` (a
  per-parameter slice of a ``_foreach_*`` kernel), ``rewrite`` and ``random`` marks;
- every tensor to the node output that holds its storage (``fx.node``, ``fx.output``),
  or to the placeholder and role of a graph input;
- every graph node to the op that runs it (views, ``getitem``, allocations and markers
  run no op: a runtime evaluates them when a kernel needs them).

Real values for a run come from :func:`initial_values`: the model's own initialisation
(a registered model built on the CPU; a user model as its callable builds it), seeded,
and a synthetic batch from the same seed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.errors import InputError
from simulator.hardware import load_hardware
from simulator.profile import Profile
from tracer.pytorch.node_identity import FX_VERSION, flat_tensors
from tracer.pytorch.values import Values, seeded_values

FX_FIELD_HINT = "trace it with runtime=True (swapplan trace --runtime)"


@dataclass
class OpBinding:
    """One profile op in the graph: the nodes it runs, in order."""
    op: str
    nodes: tuple                  # torch.fx.Node
    slot: int | None = None       # element of the foreach lists it runs (foreach_split)
    rewrite: str | None = None    # inplace_accumulate | foreach_split | None
    random: bool = False


@dataclass
class TensorBinding:
    """Where a tensor's storage is: ``node``'s tensor output ``output`` (outputs
    flattened in order), or the placeholder ``node`` of a graph input with its ``role``."""
    tensor: str
    node: Any                     # torch.fx.Node
    output: int | None = None
    role: str | None = None


@dataclass
class Bindings:
    """A profile bound to the graph it was traced from (see the module doc)."""
    profile: Profile
    model: str
    graph_module: Any
    capture: Any                  # tracer.pytorch.capture.Capture (fake values, the TrainStep)
    ops: dict[str, OpBinding]
    tensors: dict[str, TensorBinding]
    op_of_node: dict[str, str]    # node name -> op id (kernel nodes only)
    placeholders: list            # graph inputs, in order (params, buffers, states, batch)
    output_tensor: str | None     # the tensor holding the returned loss
    output_producer: str | None   # the op that makes it
    hardware: str
    options: dict = field(default_factory=dict)

    @property
    def kernel_nodes(self) -> set:
        return {n for b in self.ops.values() for n in b.nodes}


def _source_options(profile: Profile) -> dict:
    """The trace options a profile's ``source`` records; InputError when it has no node
    identity or was not traced."""
    source = profile.source or {}
    if source.get("kind") != "traced" or "fx" not in source:
        raise InputError(profile.origin, "source.fx",
                         f"profile {profile.name!r} has no node identity for a runtime; {FX_FIELD_HINT}")
    if source.get("fx") != FX_VERSION:
        raise InputError(profile.origin, "source.fx", f"unknown node identity version {source.get('fx')!r} "
                                                      f"(this swapplan reads version {FX_VERSION})")
    if source.get("hf_config"):
        raise InputError(profile.origin, "source.hf_config",
                         "the runtime binds registered models and module:callable, not --hf-config profiles")
    timing = str(source.get("timing", ""))
    return {"batch": source.get("batch"), "seq": source.get("seq"), "dtype": source.get("dtype", "fp32"),
            "optimizer": source.get("optimizer", "adamw"), "gpu_kernels": source.get("kernels", "gpu") == "gpu",
            "amp": source.get("amp"), "model": source.get("model"),
            "hardware": timing.split(":", 1)[1] if timing.startswith("roofline:") else "a100-40gb-pcie4"}


def bind(model_spec: str, profile: Profile) -> Bindings:
    """Trace ``model_spec`` again with the options of ``profile.source``, check that it
    lowers to exactly ``profile`` (same sha256), and return the bindings.

    Raises InputError for a profile without node identity, a model that traces to
    another profile, or a graph with an op that has no CPU kernel (and no emulation in
    :mod:`tracer.pytorch.cpu_kernels`).
    """
    from tracer import models
    from tracer.pytorch import cpu_kernels
    from tracer.pytorch.capture import capture
    from tracer.pytorch.lowering import lower

    opts = _source_options(profile)
    if opts["model"] is not None and opts["model"] != model_spec:
        raise InputError(profile.origin, "source.model",
                         f"profile {profile.name!r} was traced from {opts['model']!r}, not {model_spec!r}")
    hw = load_hardware(opts["hardware"])
    try:
        workload = models.build(model_spec, batch=opts["batch"], seq=opts["seq"])
        cap = capture(workload, dtype=opts["dtype"], optimizer=opts["optimizer"],
                      gpu_kernels=opts["gpu_kernels"], amp=opts["amp"])
        tensors, ops = lower(cap, hw, opts["dtype"], opts["optimizer"], runtime=True)
    except InputError:
        raise
    except Exception as exc:
        raise InputError("<argument>", "model", f"{model_spec} failed to trace: {models._one_line(exc)}") from None
    again = Profile(name=profile.name, tensors=tuple(tensors), ops=tuple(ops), source=profile.source,
                    origin=f"<trace {model_spec}>")
    if again.sha256 != profile.sha256:
        raise InputError(profile.origin, "sha256", f"{model_spec} traced now is not this profile "
                                                   f"({_first_difference(profile, again)})")
    gm = cap.graph_module
    nodes = {n.name: n for n in gm.graph.nodes}
    missing = cpu_kernels.missing(gm)
    if missing:
        raise InputError(profile.origin, "ops", f"{', '.join(missing)} has no CPU kernel: this profile cannot "
                                                "run here (trace it with the CPU's kernels: --cpu-kernels)")
    op_bindings, op_of_node = {}, {}
    for op in profile.ops:
        fx = op.fx
        bound = tuple(nodes[name] for name in fx.nodes)
        op_bindings[op.id] = OpBinding(op.id, bound, fx.slot, fx.rewrite, fx.random)
        if fx.slot is None:
            for node in bound:
                op_of_node[node.name] = op.id
        else:
            for node in bound:
                op_of_node.setdefault(node.name, "optimizer")
    tensor_bindings = {t.id: TensorBinding(t.id, nodes[t.fx.node], t.fx.output, t.fx.role) for t in profile.tensors}
    output_tensor = _output_tensor(gm, profile, tensor_bindings)
    producer = None
    if output_tensor is not None and profile.producer.get(output_tensor) is not None:
        producer = profile.ops[profile.producer[output_tensor]].id
    return Bindings(profile=profile, model=model_spec, graph_module=gm, capture=cap, ops=op_bindings,
                    tensors=tensor_bindings, op_of_node=op_of_node,
                    placeholders=[n for n in gm.graph.nodes if n.op == "placeholder"],
                    output_tensor=output_tensor, output_producer=producer, hardware=opts["hardware"],
                    options=opts)


def _first_difference(want: Profile, got: Profile) -> str:
    """Where two profiles first differ, in a few words."""
    if want.name != got.name or want.source != got.source:
        return "name or source differ"
    for key, a_items, b_items in (("tensors", want.tensors, got.tensors), ("ops", want.ops, got.ops)):
        if len(a_items) != len(b_items):
            return f"{len(a_items)} {key} in the profile, {len(b_items)} traced"
        for i, (a, b) in enumerate(zip(a_items, b_items)):
            if a.to_dict() != b.to_dict():
                return f"first at {key}[{i}] ({a.id})"
    return "they differ"


def _output_tensor(gm, profile: Profile, tensors: dict[str, TensorBinding]) -> str | None:
    """The tensor whose storage holds the graph's first output (the loss)."""
    by_storage = {}
    for tid, b in tensors.items():
        vals = flat_tensors(b.node.meta.get("val"))
        index = 0 if b.output is None else b.output
        if index < len(vals):
            by_storage[vals[index].untyped_storage()._cdata] = tid
    output = next(n for n in gm.graph.nodes if n.op == "output")
    import torch.fx
    leaves = flat_tensors(torch.fx.node.map_arg(output.args, lambda n: n.meta.get("val")))
    if not leaves:
        return None
    return by_storage.get(leaves[0].untyped_storage()._cdata)


# ----------------------------------------------------------------------------- values


def initial_values(bindings: Bindings, seed: int = 0) -> Values:
    """Real, seeded values for the graph's inputs: the model's own initialisation (a
    registered model built on the CPU; a user model as its callable builds it, a meta
    one materialised with each module's ``reset_parameters``), AdamW / SGD state as a
    fresh optimizer has it (zeros; under amp, fp32 master copies first), and a synthetic
    batch (floating: standard normal; indices: uniform below the model's vocabulary or
    class count, 0 or 1 when the model does not say; bool: true)."""
    import torch

    from tracer import models

    opts = bindings.options
    torch.manual_seed(seed)
    workload = models.build(bindings.model, batch=opts["batch"], seq=opts["seq"], device="cpu")
    return seeded_values(bindings.capture, workload, optimizer=opts["optimizer"], amp=opts["amp"],
                         dtype=opts["dtype"], seed=seed)
