"""The entries of a profile: the format's constants and its frozen records (Tensor, Op,
their Variant and Split, and the node identity a runtime follows, TensorNode and OpNode),
each with the dict form it is saved in."""
from __future__ import annotations

from dataclasses import dataclass

FORMAT = "swapplan-profile/1"
TENSOR_KINDS = ("weight", "activation", "gradient", "optimizer_state", "input", "other")
PERSISTENT_KINDS = frozenset({"weight", "optimizer_state", "input"})
PHASES = ("forward", "backward", "optimizer", "other")
SOURCE_KINDS = ("traced", "measured", "imported", "synthetic")
SPLIT_AXES = ("batch", "rows", "vocabulary", "elements")
FX_REWRITES = ("inplace_accumulate", "foreach_split")
INPUT_ROLES = ("parameter", "buffer", "optimizer_state", "batch", "target")
COLLECTIVE_KINDS = ("all_gather", "reduce_scatter", "all_reduce")   # R56


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
class Collective:
    """What a collective op of one data-parallel rank does (R56-R59): its ``kind``
    (``COLLECTIVE_KINDS``), the ranks in its group (``world``) and the full, unsharded
    payload in bytes: an all-gather's output, a reduce-scatter's input, an all-reduce's
    buffer. Its time is the interconnect's (R57), not the op's ``time_us``."""
    kind: str
    world: int
    bytes: int

    def wire_bytes(self) -> int:
        """Bytes this rank sends in a ring (R57): (world - 1) / world of the payload for an
        all-gather or a reduce-scatter, twice that for an all-reduce."""
        sent = self.bytes * (self.world - 1) // self.world
        return 2 * sent if self.kind == "all_reduce" else sent

    def steps(self) -> int:
        """Ring steps, each paying the interconnect's latency once (R57)."""
        return (2 if self.kind == "all_reduce" else 1) * (self.world - 1)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "world": self.world, "bytes": self.bytes}


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
    collective: Collective | None = None     # a collective on the interconnect (R56); None: a kernel

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
        if self.collective is not None:
            data["collective"] = self.collective.to_dict()
        if self.fx is not None:
            data["fx"] = self.fx.to_dict()
        return data
