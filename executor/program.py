"""What a runtime derives from a plan JSON before it runs: the compute sequence and,
for each step of it, the copies and drops it issues and the copies it waits for.

This is the runtime's own reading of the plan (docs/simulation.md R5-R15), not the
simulator's compile: it checks nothing about validity. A plan that breaks a rule is
run as written, and the scheduler (executor/scheduler.py) catches the break when it
happens: a use before arrival, a use of a tensor that is not on the GPU, a prefetch
from a tier that holds no copy, data that does not match. What it does reuse is the
profile's semantics: ``build_sequence`` (R5 the compute sequence, R8 last uses). The
executor (here and api.py's compiled machine) is the one reader outside the simulator
that imports the engine (simulator/compile): it replays the compiled program by design,
so that item k and a placement's allocation keys (R50) are the simulator's own.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field, replace

from simulator.compile.compiled import compile_machine, compile_profile
from simulator.compile.lower import compile_program
from simulator.compile.program import PlanInvalid
from simulator.compile.sequence import Sequence, build_sequence
from simulator.hardware import Hardware
from simulator.model.allocation import WORKSPACE, allocation_keys
from simulator.model.links import STREAMS
from simulator.plan import Plan
from simulator.profile import Profile


@dataclass(eq=False, slots=True)
class Copy:
    """One offload or prefetch of the plan, as the runtime issues it.

    ``issue_item``: the item after whose end it is enqueued (-1: the iteration start).
    ``before_item``: for a prefetch, the first item that waits for it (-1: the end of
    the iteration). ``last_reader``: for an offload, the last item of its window that
    reads the tensor (R11; -1: none), after whose end the GPU copy may go.
    """
    index: int
    action: int                   # place in plan.actions
    kind: str                     # offload | prefetch
    tensor: str
    nbytes: int                   # the profile's bytes (unscaled)
    tier: str                     # host | ssd
    stream: str                   # h2d | d2h | ssd_read | ssd_write
    links: tuple[int, ...]        # link numbers (simulator.compile.compiled.LINKS)
    latency_ps: int
    uses_engine: bool             # half duplex: needs the one copy engine
    after: str | None
    before: str | None = None
    issue_item: int = -1
    before_item: int = -1
    last_reader: int = -1
    key: str | None = None        # a prefetch's allocation key (R50), e.g. ``a#2``

    def describe(self) -> str:
        where = f"after {self.after}" if self.after is not None else "at the iteration start"
        if self.kind == "offload":
            return f"offload of {self.tensor} to {self.tier} {where}"
        before = f", before {self.before}" if self.before is not None else ", before the iteration end"
        return f"prefetch of {self.tensor} from {self.tier} {where}{before}"


@dataclass(eq=False, slots=True)
class Drop:
    action: int
    tensor: str
    after: str


@dataclass
class RuntimePlan:
    """The plan as the scheduler runs it: sparse maps from compute items."""
    profile: Profile
    plan: Plan
    seq: Sequence
    copies: list[Copy]
    at_start: list                                  # Copy | Drop, plan order
    after_item: dict[int, list] = field(default_factory=dict)   # item -> Copy | Drop, plan order
    waits: dict[int, list[Copy]] = field(default_factory=dict)  # item -> prefetches it waits for
    reads: list[tuple[str, ...]] = field(default_factory=list)  # item -> tensors it reads
    updates: list[tuple[str, ...]] = field(default_factory=list)  # item -> tensors it updates in place
    link_capacity: tuple[int, ...] = ()             # bytes/s per link (unscaled)
    half_duplex: bool = False
    host_bytes: int = 0
    ssd_bytes: int = 0
    has_ssd: bool = False
    # R50's allocation keys, the simulator's (see _allocation_keys)
    start_keys: dict[str, str] = field(default_factory=dict)         # persistent tensor on the GPU at start -> key
    alloc_keys: list[tuple[str, ...]] = field(default_factory=list)  # item -> a key per tensor of seq.allocs
    workspace_keys: list[str | None] = field(default_factory=list)   # item -> ``ws:<op>`` (None: no workspace)

    def allocations(self) -> list[tuple[str, str, int, str | None]]:
        """Every GPU allocation of the iteration, as (key, owner, profile bytes, op): owner
        is the tensor ('' for a workspace), op where it happens (None: the start)."""
        seq, nbytes = self.seq, self.profile.tensor_by_id
        out = [(key, tid, nbytes[tid].bytes, None) for tid, key in self.start_keys.items()]
        for k in range(len(seq)):
            out.extend((key, tid, nbytes[tid].bytes, seq.group[k])
                       for tid, key in zip(seq.allocs[k], self.alloc_keys[k]))
            if self.workspace_keys[k] is not None:
                out.append((self.workspace_keys[k], "", seq.workspace[k], seq.group[k]))
        out.extend((c.key, c.tensor, c.nbytes, c.after) for c in self.copies if c.kind == "prefetch")
        return out

    def item_name(self, k: int) -> str:
        tid = self.seq.recomputed[k]
        return f"op {self.seq.group[k]}" if tid is None else f"the recompute of {tid} before op {self.seq.group[k]}"


def lower(profile: Profile, plan: Plan, hardware: Hardware) -> RuntimePlan:
    """Read ``plan`` (structurally checked: ids known, SSD actions only with an SSD) into
    the maps the scheduler runs."""
    compiled = compile_profile(profile)
    machine = compile_machine(hardware)
    recomputes: dict[str, list[str]] = {}
    for action in plan.actions:
        if action.kind == "recompute":
            recomputes.setdefault(action.before, []).append(action.tensor)
    order = list(plan.schedule) if plan.schedule is not None else [op.id for op in profile.ops]
    seq = build_sequence(profile, compiled.op_ps, order, recomputes)
    ops = profile.ops
    reads, updates = [], []
    for k in range(len(seq)):
        op = ops[seq.op_index[k]]
        reads.append(tuple(dict.fromkeys(op.inputs)))
        updates.append(tuple(dict.fromkeys(op.updates)) if seq.recomputed[k] is None else ())
    runtime = RuntimePlan(profile=profile, plan=plan, seq=seq, copies=[], at_start=[], reads=reads,
                          updates=updates, link_capacity=machine.link_capacity, half_duplex=machine.half_duplex,
                          host_bytes=machine.host_bytes, ssd_bytes=machine.ssd_bytes, has_ssd=machine.has_ssd)
    tensors = profile.tensor_by_id
    for i, action in enumerate(plan.actions):
        if action.kind == "recompute":
            continue
        issue = -1 if action.after is None else seq.op_item[action.after]
        if action.kind == "drop":
            step = Drop(i, action.tensor, action.after)
        else:
            tier = action.to if action.kind == "offload" else action.source
            route = machine.route(action.kind, tier)
            step = Copy(len(runtime.copies), i, action.kind, action.tensor, tensors[action.tensor].bytes, tier,
                        STREAMS[route.stream], route.links, route.latency_ps, route.uses_engine, action.after,
                        action.before if action.kind == "prefetch" else None, issue)
            if action.kind == "prefetch" and action.before is not None:
                step.before_item = seq.group_start[action.before]
                runtime.waits.setdefault(step.before_item, []).append(step)
            runtime.copies.append(step)
        (runtime.at_start if issue < 0 else runtime.after_item.setdefault(issue, [])).append(step)
    _windows(runtime)
    _allocation_keys(runtime, compiled, machine)
    return runtime


def _allocation_keys(runtime: RuntimePlan, compiled, machine) -> None:
    """R50's keys, as the simulator counts them (``simulator.model.allocation.allocation_keys``, on
    the plan compiled without its placement): the executor runs the same compute
    sequence, so item k and a prefetch's plan action name the same allocations. A plan
    that breaks another rule has no keys (None): it is replayed to show where it fails,
    and a placement needs a valid plan."""
    seq, plan = runtime.seq, runtime.plan
    try:
        program = compile_program(runtime.profile, compiled, replace(plan, placement=None), machine)
    except PlanInvalid:
        runtime.alloc_keys = [(None,) * len(seq.allocs[k]) for k in range(len(seq))]
        runtime.workspace_keys = [None] * len(seq)
        return
    keys = allocation_keys(program, compiled)
    runtime.start_keys = {request.owner: request.key for request in keys.start}
    by_item = {k: {request.owner: request.key for request in requests} for k, requests in keys.items.items()}
    runtime.alloc_keys = [tuple(by_item.get(k, {}).get(tid) for tid in seq.allocs[k]) for k in range(len(seq))]
    runtime.workspace_keys = [by_item.get(k, {}).get(WORKSPACE) for k in range(len(seq))]
    by_action = {program.transfers[j].action: request.key for j, request in keys.transfers.items()}
    for copy in runtime.copies:
        if copy.kind == "prefetch":
            copy.key = by_action.get(copy.action)


def _windows(runtime: RuntimePlan) -> None:
    """R11: an offload's window runs from its ``after`` op to the next prefetch of the
    tensor (its ``after`` op included) or the next recompute (excluded); the GPU copy
    goes when the copy has ended and the last item of the window that reads it has."""
    seq = runtime.seq
    readers: dict[str, list[int]] = {}
    for k, names in enumerate(runtime.reads):
        for tid in names:
            readers.setdefault(tid, []).append(k)
    by_tensor: dict[str, list[Copy]] = {}
    for copy in runtime.copies:
        by_tensor.setdefault(copy.tensor, []).append(copy)
    for tid, copies in by_tensor.items():
        issued = sorted(copies, key=lambda c: (c.issue_item, c.action))
        recomputes = seq.recompute_items.get(tid, [])
        items = readers.get(tid, [])
        for n, copy in enumerate(issued):
            if copy.kind != "offload":
                continue
            end = len(seq) - 1
            following = next((c for c in issued[n + 1:] if c.kind == "prefetch"), None)
            if following is not None:
                end = following.issue_item
            r = bisect_right(recomputes, copy.issue_item)
            if r < len(recomputes):
                end = min(end, recomputes[r] - 1)
            lo, hi = bisect_right(items, copy.issue_item), bisect_right(items, end)
            copy.last_reader = items[hi - 1] if hi > lo else -1
