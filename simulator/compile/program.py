"""Compile a plan against a profile into the flat program the engine runs.

Compiling decides everything that does not depend on timing (docs/simulation.md: "validity
is decided from the plan alone, never from timing"): the schedule (R21), the compute
sequence (R5), last uses (R8), offload windows (R11), and every rule about residency
(R11-R16, R20). A broken rule raises ``PlanInvalid`` naming the rule, the op and the
tensor. The program it returns is static: the engine keeps its run state apart.

The walk keeps, for each tensor, where the plan has put it:

    UNBORN   not produced yet (non-persistent)
    GPU      resident, readable and writable
    LEAVING  offloaded, its window open: readable, not writable (R11)
    AWAY     not on the GPU (dropped, or started off the GPU)
    INCOMING a prefetch is issued; usable from its ``before`` op on (R12, R13)
    ENCODED  kept encoded on the GPU (R42) until its decode
    DEAD     freed after its last use

Ops a plan places on the CPU (``cpu_ops``, R24-R29) run on a second stream and use host
copies: the walk also keeps which copies are valid per tier, and who wrote the host copy
(a transfer, or a CPU item), which the reader waits for. Codecs (R40-R42) add encode and
decode items to the compute sequence (``codec_items``) and compressed sizes to transfers;
the walk keeps which codec wrote each off-GPU copy.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from ..errors import InputError
from ..model.allocation import allocation_keys, placement_problem
from ..model.codecs import codec_problem, codec_ps, compressed_bytes
from ..model.links import Route
from ..model.recompute import counted_updates, recompute_problem
from ..plan import Action, Plan
from ..profile import Profile, order_violation
from ..units import us_to_ps
from .collectives import COMM, CPU, comm_capacity, comm_items, comm_work, issue_points, stream_deps
from .compiled import CompiledProfile, Machine
from .sequence import CodecItem, Sequence, build_sequence

UNBORN, GPU, LEAVING, AWAY, INCOMING, DEAD = "unborn", "gpu", "leaving", "away", "incoming", "dead"
ENCODED = "encoded"


class PlanInvalid(Exception):
    """A plan that breaks a simulation rule (the result is ``valid: false``)."""

    def __init__(self, rule: str, op: str | None, tensor: str | None, reason: str):
        self.rule, self.op, self.tensor, self.reason = rule, op, tensor, reason
        super().__init__(f"{rule}: {reason}")


@dataclass(eq=False, slots=True)
class Transfer:
    """One offload or prefetch as the plan fixes it; ``index`` is its place in
    ``Program.transfers`` (the engine keeps its run state by that index)."""
    index: int
    action: int                      # index in plan.actions
    kind: str                        # "offload" | "prefetch"
    tensor: str
    nbytes: int
    tier: str                        # "host" | "ssd"
    route: Route
    source: int = -1                 # prefetch: the offload that wrote its source copy (-1: initial)
    last_reader: int = -1            # offload: last item in its window that reads the tensor
    before_item: int = -1            # prefetch: first item that waits for it (-1: none)
    after_op: str | None = None
    source_item: int = -1            # prefetch or store: the CPU item that wrote its host source (R27)
    buffer: str | None = None        # compute codec (R41): the encoded GPU buffer it moves instead of the tensor
    members: tuple = ()              # R53: the other transfers of its group, when it leads one
    total: int = 0                   # bytes its flow moves: its own, or its group's when it leads one

    def __post_init__(self):
        self.total = self.nbytes


@dataclass(eq=False, slots=True)
class Drop:
    """A drop action: frees the GPU copy when its ``after`` op ends (R14)."""
    action: int
    tensor: str


@dataclass
class Program:
    """Everything the engine needs, decided from the plan alone. ``waits``, ``releases``
    and ``actions`` are sparse: item -> list."""
    seq: Sequence
    waits: dict[int, list[Transfer]]     # prefetches item k waits for (R6)
    releases: dict[int, list[Transfer]]  # offloads whose window's last reader is item k (R11)
    actions: dict[int, list]             # Transfer | Drop enqueued when item k ends (R7)
    start_actions: list                  # actions with after = null, in plan order
    transfers: list[Transfer]
    initial_copies: dict[str, str]       # tensor -> tier, from plan.initial
    on_cpu: frozenset = frozenset()      # items that run on the CPU stream (R24)
    cpu_ps: dict = None                  # CPU item -> its time in ps (R25)
    deps: dict = None                    # item -> the latest item of each other stream it waits for (R27, R58)
    host_waits: dict = None              # CPU item -> transfers that wrote its host copies (R26)
    uvm: bool = False                    # managed memory (R30-R37): simulator/compile/uvm.py compiled it
    read_mostly: frozenset = frozenset()  # UVM: tensor ids advised read-mostly (R34)
    backing: str = "host"                # UVM: the tier behind managed memory (R35)
    buffer_bytes: dict = None            # codecs (R41, R42): encoded GPU buffer id -> bytes
    placement: object = None             # R50: the plan's Placement, checked against ``keys``
    keys: object = None                  # R50, R51: every GPU allocation's key (simulator/model/allocation.py)
    group_names: dict = None             # R53: a group's lead transfer -> the group id
    lossy: tuple = ()                    # tensors a lossy codec encodes (R40)
    on_comm: frozenset = frozenset()     # items that run a collective on the comm stream (R56)
    comm: dict = None                    # collective item -> (wire bytes, latency ps, links) (R57)
    issue_after: dict = None             # collective item -> the GPU item that must have started (R58)
    comm_capacity: tuple = ()            # the interconnect's and the network's bytes/s (R57)


def compute_sequence(profile: Profile, compiled: CompiledProfile, plan: Plan, machine: Machine | None = None) -> Sequence:
    """The plan's compute sequence: the compiled default one when the plan neither
    reorders ops, recomputes nor runs codecs on the GPU."""
    recomputes: dict[str, list[str]] = {}
    for action in plan.actions:
        if action.kind == "recompute":
            recomputes.setdefault(action.before, []).append(action.tensor)
    decodes, encodes = codec_items(profile, plan, machine) if machine is not None and plan.uses_codecs else ({}, {})
    if plan.schedule is None and not recomputes and not decodes and not encodes and not plan.variants:
        return compiled.default_sequence
    order = list(plan.schedule) if plan.schedule is not None else [op.id for op in profile.ops]
    op_ps, workspace = compiled.op_ps, None
    if plan.variants:                 # R52: the chosen variants' times and workspaces
        op_ps, workspace = list(op_ps), {}
        for op_id, name in plan.variants.items():
            index = profile.op_index[op_id]
            variant = profile.ops[index].variant(name)
            op_ps[index] = us_to_ps(variant.time_us)
            workspace[index] = variant.workspace_bytes
    return build_sequence(profile, op_ps, order, recomputes, decodes, encodes, workspace)


def buffer_id(tensor: str, codec: str) -> str:
    """The id of a tensor's encoded GPU buffer (R41, R42) in memory and messages."""
    return f"codec:{codec}:{tensor}"


def codec_items(profile: Profile, plan: Plan, machine: Machine):
    """R41, R42: the encode items after each op and the decode items before each op, in
    plan order: those of encode and decode actions, and those of offloads and prefetches
    with a compute codec. Raises PlanInvalid for a codec used where it cannot run."""
    decodes: dict[str, list[CodecItem]] = {}
    encodes: dict[str, list[CodecItem]] = {}
    tensors = profile.tensor_by_id
    for i, action in enumerate(plan.actions):
        if action.codec is None:
            continue
        codec = machine.codecs[action.codec]
        tid = action.tensor
        tensor = tensors[tid]
        buffer = buffer_id(tid, codec.name)
        size = compressed_bytes(tensor, codec)
        op = action.before if action.kind in ("decode", "prefetch") else action.after
        if action.kind in ("encode", "decode") and codec.where == "dma":
            raise PlanInvalid("R42", op, tid, f"{action.kind} of {tid!r} with codec {codec.name!r}: a dma codec "
                                              "runs in the copy engine and cannot keep a tensor encoded on the GPU")
        if codec.where == "dma":
            continue
        if op is None:
            where = "after an op" if action.kind == "offload" else "before an op"
            raise PlanInvalid("R41", None, tid, f"{action.kind} of {tid!r} with compute codec {codec.name!r} "
                                                f"needs its kernel to run {where}: give the {action.kind}'s "
                                                f"{'after' if action.kind == 'offload' else 'before'}")
        if action.kind in ("encode", "offload"):
            frees = (tid,) if action.kind == "encode" else ()
            item = CodecItem("encode", tid, codec.name, buffer, (buffer,), size,
                             codec_ps(tensor.bytes, codec.encode_gbps), frees, i)
            encodes.setdefault(op, []).append(item)
        else:
            item = CodecItem("decode", tid, codec.name, buffer, (tid,), tensor.bytes,
                             codec_ps(tensor.bytes, codec.decode_gbps), (buffer,), i)
            decodes.setdefault(op, []).append(item)
    return decodes, encodes


def check_plan_rules(profile: Profile, plan: Plan) -> None:
    """The rules checked before the walk, in this order: the schedule (R21), initial
    placements of non-persistent tensors (R20), recomputes of persistent tensors (R15)."""
    if plan.schedule is not None:
        problem = order_violation(profile, plan.schedule)
        if problem is not None:
            raise PlanInvalid("R21", problem[0], problem[1], problem[2])
    tensors = profile.tensor_by_id
    for tid in plan.initial:
        if not tensors[tid].persistent:
            raise PlanInvalid("R20", None, tid, f"only persistent tensors can start off the GPU; {tid!r} is "
                                                f"{tensors[tid].kind}")
    for action in plan.actions:
        if action.kind == "recompute" and tensors[action.tensor].persistent:
            raise PlanInvalid("R15", action.before, action.tensor, recompute_problem(profile, action.tensor))


def compile_explicit(profile: Profile, compiled: CompiledProfile, plan: Plan, machine: Machine) -> Program:
    """Build the program of an explicit-mode plan and check every rule decidable from it.

    Only the tensors the plan names can leave the GPU, so the walk visits only the
    items that touch them (their uses, producer and last use), the recomputes, and the
    ops that have actions after them or prefetches before them: its cost grows with
    the plan, not the profile. Raises PlanInvalid (rule, op, tensor, reason). Assumes
    ``check_plan`` passed (ids are known, SSD actions have an SSD) and, for a plan with
    codecs, ``check_codec_names`` (simulator/compile/lower.py's ``compile_program`` runs
    both checks in order and picks this or UVM mode's compile).
    """
    check_plan_rules(profile, plan)
    program = _Compiler(profile, compiled, plan, machine).compile()
    if plan.uses_groups:
        group_transfers(program, plan)
    if plan.uses_codecs:
        program.buffer_bytes = {item.buffer: item.alloc_bytes for item in program.seq.codec.values()
                                if item.kind == "encode"}
        for transfer in program.transfers:
            if transfer.buffer is not None:
                program.buffer_bytes[transfer.buffer] = transfer.nbytes
        codecs = machine.codecs
        program.lossy = tuple(sorted({a.tensor for a in plan.actions if a.codec and codecs[a.codec].lossy}))
    if plan.placement is not None:
        program.placement = plan.placement
        program.keys = allocation_keys(program, compiled)
        problem = placement_problem(program.keys, plan.placement, frozenset(compiled.persistent_ids))
        if problem is not None:
            key, reason = problem
            raise PlanInvalid("R50", None, key.rsplit("#", 1)[0] if "#" in key else None, reason)
    if plan.cpu_ops:
        program.cpu_ps = cpu_times(profile, program.seq, program.on_cpu, machine)
    if compiled.collectives:          # R56-R58: a rank's collectives on the comm stream
        program.on_comm = comm_items(profile, program.seq)
        program.comm = comm_work(profile, program.seq, program.on_comm, machine)
        program.issue_after = issue_points(program.seq, program.on_cpu, program.on_comm)
        program.comm_capacity = comm_capacity(compiled, machine)
    if plan.cpu_ops or compiled.collectives:
        stream_of = {**dict.fromkeys(program.on_cpu, CPU), **dict.fromkeys(program.on_comm, COMM)}
        program.deps = stream_deps(profile, program.seq, stream_of)
    return program


def group_transfers(program: Program, plan: Plan) -> None:
    """R53: the transfers of one group (the same ``group`` id) become one: the first, in
    plan order, leads (its flow moves every member's bytes after one latency) and the
    others leave the queues (each member's copy completes when the lead's ends). They
    must be of one kind, issued after the same item, with the same ``before`` (for
    prefetches) and tier, and none may move a compute codec's buffer; raises PlanInvalid
    otherwise."""
    sinks = [(-1, program.start_actions)] + sorted(program.actions.items())
    where: dict[str, int] = {}
    program.group_names = {}
    for k, sink in sinks:
        leads: dict[str, Transfer] = {}
        kept = []
        for item in sink:
            group = plan.actions[item.action].group if isinstance(item, Transfer) else None
            if group is None:
                kept.append(item)
                continue
            if group in where and where[group] != k:
                raise PlanInvalid("R53", item.after_op, item.tensor,
                                  f"{item.kind} of {item.tensor!r} in group {group!r} is issued after another op "
                                  "(or encode) than the group's first member: a group is one transfer")
            if item.buffer is not None:     # a compute codec's transfer (R41)
                codec = plan.actions[item.action].codec
                raise PlanInvalid("R53", item.after_op, item.tensor,
                                  f"{item.kind} of {item.tensor!r} with compute codec {codec!r} cannot join group "
                                  f"{group!r}: it is issued around its own encode or decode kernel (R41), so it "
                                  "is not one transfer with the others")
            where[group] = k
            lead = leads.get(group)
            if lead is None:
                leads[group] = item
                kept.append(item)
                continue
            if (item.kind, item.tier, item.before_item) != (lead.kind, lead.tier, lead.before_item):
                raise PlanInvalid("R53", item.after_op, item.tensor,
                                  f"{item.kind} of {item.tensor!r} differs from {lead.kind} of {lead.tensor!r} "
                                  f"in group {group!r} (kind, tier or before): a group is one transfer")
            lead.members += (item.index,)
            lead.total += item.nbytes
        sink[:] = kept
        for group, lead in leads.items():
            program.group_names[lead.index] = group


def check_codec_names(plan: Plan, machine: Machine) -> None:
    """Every codec a plan names is one the hardware file defines (else an input error,
    as an SSD action on a machine without an SSD is)."""
    for i, action in enumerate(plan.actions):
        if action.codec is not None and action.codec not in machine.codecs:
            known = ", ".join(sorted(machine.codecs)) or "none"
            raise InputError(plan.origin, f"actions[{i}] ({action.label()}).codec",
                             f"unknown codec {action.codec!r} (hardware {machine.name!r} defines: {known})")


def cpu_time_us(op, tensors: dict, cpu: tuple) -> float:
    """R25: a CPU op's time, launch + roofline: FLOPs at ``tflops`` or bytes (inputs and
    outputs once, updated tensors twice: read and written) at ``mem_gbps``."""
    tflops, gbps, launch_us = cpu
    moved = sum(tensors[t].bytes for t in dict.fromkeys(op.inputs + op.outputs))
    moved += 2 * sum(tensors[t].bytes for t in dict.fromkeys(op.updates))
    return launch_us + max((op.flops or 0.0) / (tflops * 1e6), moved / (gbps * 1e3))


def cpu_times(profile: Profile, seq: Sequence, on_cpu: frozenset, machine: Machine) -> dict[int, int]:
    tensors = profile.tensor_by_id
    return {k: us_to_ps(cpu_time_us(profile.ops[seq.op_index[k]], tensors, machine.cpu)) for k in on_cpu}


class _Compiler:
    """One static walk of a plan over its compute sequence (see the module docstring)."""

    def __init__(self, profile: Profile, compiled: CompiledProfile, plan: Plan, machine: Machine):
        self.profile = profile
        self.compiled = compiled
        self.plan = plan
        self.machine = machine
        self.seq = compute_sequence(profile, compiled, plan, machine)
        self.tensors = profile.tensor_by_id
        self.planned = set(plan.initial) | {a.tensor for a in plan.actions}
        self.cpu_items = frozenset(self.seq.op_item[op_id] for op_id in plan.cpu_ops)
        for op_id in plan.cpu_ops:
            op = profile.ops[profile.op_index[op_id]]
            if op.collective is not None:
                raise PlanInvalid("R56", op_id, None, f"op {op_id!r} is a {op.collective.kind} (a collective runs on "
                                                      "the GPU's interconnect): it cannot run on the CPU")
            self.planned.update(op.inputs, op.outputs, op.updates)
        self.host_item_writer: dict[str, int] = {}      # tensor -> CPU item that wrote its host copy
        self.host_waits: dict[int, list[Transfer]] = {}
        self.state: dict[str, str] = {}
        self.copies: dict[str, dict[str, bool]] = {}
        for tid in self.planned:
            self.state[tid] = GPU if self.tensors[tid].persistent else UNBORN
            self.copies[tid] = {}
        for tid, tier in plan.initial.items():
            self.state[tid] = AWAY
            self.copies[tid][tier] = True
        self.open_offload: dict[str, Transfer] = {}    # tensor -> offload whose window is open
        self.last_offload_to: dict[tuple[str, str], Transfer] = {}
        self.incoming: dict[str, int] = {}              # tensor -> its prefetch's before item (-1: end)
        self.incoming_at: dict[int, list[str]] = {}
        self.updated_at: dict[str, list[int]] = {}
        self.copy_codec: dict[tuple[str, str], str | None] = {}   # (tensor, tier) -> the codec of that copy
        self.encoded: dict[str, str] = {}                         # tensor -> the codec keeping it encoded
        self.codec_item_of: dict[int, int] | None = None          # plan action -> its codec item
        self.transfers: list[Transfer] = []
        self.waits: dict[int, list[Transfer]] = {}
        self.actions: dict[int, list] = {}
        self.start_actions: list = []

    # ------------------------------------------------------------------ helpers

    def invalid(self, rule: str, k: int | None, tid: str | None, reason: str) -> PlanInvalid:
        op = self.seq.group[k] if k is not None and k >= 0 else None
        return PlanInvalid(rule, op, tid, reason)

    def waiting_item(self, op_id: str) -> int:
        """The item a prefetch before ``op_id`` makes wait: the first of the op's group that
        is not a decode (R41, R42: decodes wait for their own prefetches only)."""
        k = self.seq.group_start[op_id]
        while k in self.seq.codec:
            k += 1
        return k

    def decode_item(self, action_index: int) -> int:
        """The decode item of a prefetch with a compute codec (R41)."""
        if self.codec_item_of is None:
            self.codec_item_of = {item.action: k for k, item in self.seq.codec.items()}
        return self.codec_item_of[action_index]

    def has_use_from(self, tid: str, k: int) -> bool:
        uses = self.seq.uses.get(tid, [])
        return bisect_left(uses, k) < len(uses)

    def next_reference(self, tid: str, k: int) -> tuple[int | None, bool]:
        """The next item after k that uses tid, and whether a recompute of tid comes first."""
        uses = self.seq.uses.get(tid, [])
        j = bisect_left(uses, k + 1)
        next_use = uses[j] if j < len(uses) else None
        recs = self.seq.recompute_items.get(tid, [])
        r = bisect_left(recs, k + 1)
        next_rec = recs[r] if r < len(recs) else None
        return next_use, next_rec is not None and (next_use is None or next_rec <= next_use)

    def close_window(self, tid: str) -> None:
        self.open_offload.pop(tid, None)
        if self.state[tid] == LEAVING:
            self.state[tid] = AWAY

    def interesting_items(self, actions_after: dict) -> list[int]:
        """Items where a planned tensor's state can change or must be checked."""
        seq, profile = self.seq, self.profile
        found: set[int] = set()
        for tid in self.planned:
            found.update(seq.uses.get(tid, ()))
            made_by = profile.producer[tid]
            if made_by is not None:
                found.add(seq.op_item[profile.ops[made_by].id])
        for tid, ks in seq.recompute_items.items():
            found.update(ks)
            for x in profile.ops[profile.producer[tid]].inputs if profile.producer[tid] is not None else ():
                found.update(seq.uses.get(x, ()))   # R15: an update in place of what the re-run reads
        for op_id in actions_after:
            if op_id is not None:
                found.add(seq.op_item[op_id])
        for action in self.plan.actions:
            if action.kind == "prefetch" and action.before is not None:
                found.add(self.waiting_item(action.before))
        found.update(seq.codec)
        return sorted(found)

    # ------------------------------------------------------------------ the walk

    def compile(self) -> Program:
        seq, profile, plan = self.seq, self.profile, self.plan
        actions_after: dict[str | None, list[tuple[int, Action]]] = {}
        codec_actions = {item.action for item in seq.codec.values() if item.kind == "encode"}   # issued there
        for i, action in enumerate(plan.actions):
            if action.kind not in ("recompute", "decode", "encode") and i not in codec_actions:
                actions_after.setdefault(action.after, []).append((i, action))
        for i, action in actions_after.get(None, ()):
            self.issue(i, action, -1, None, self.start_actions)
        planned, state, ops = self.planned, self.state, profile.ops
        incoming_at, open_offload, copies = self.incoming_at, self.open_offload, self.copies
        op_index, recomputed_at, allocs, frees, groups = seq.op_index, seq.recomputed, seq.allocs, seq.frees, seq.group
        for k in self.interesting_items(actions_after):
            op = ops[op_index[k]]
            if incoming_at:
                for tid in incoming_at.pop(k, ()):
                    if state[tid] == INCOMING and self.incoming[tid] == k:
                        state[tid] = GPU
                        del self.incoming[tid]
            recomputed = recomputed_at[k]
            if seq.codec and k in seq.codec:
                self.walk_codec_item(k, seq.codec[k])
                continue
            if k in self.cpu_items:
                self.walk_cpu_item(k, op)
                after = actions_after.get(groups[k])
                if after:
                    sink = self.actions.setdefault(k, [])
                    for i, action in after:
                        self.issue(i, action, k, groups[k], sink)
                continue
            if recomputed is not None:
                self.check_recompute(k, recomputed, op)
            for tid in seq.reads.get(k, op.inputs) if seq.reads else op.inputs:   # R60: a re-run's reads
                if tid in planned:
                    st = state[tid]
                    if st is LEAVING:
                        open_offload[tid].last_reader = k
                    elif st is not GPU:
                        self.check_use(tid, k, "reads")
            if recomputed is None:
                for tid in op.updates:
                    self.updated_at.setdefault(tid, []).append(k)   # R15 counts every tensor's
                    if tid in planned:
                        self.check_use(tid, k, "updates")
                        if state[tid] is LEAVING:
                            raise self.invalid("R11", k, tid, f"op {groups[k]!r} updates {tid!r} "
                                                              "during its offload window")
                        tier_copies = copies[tid]
                        for tier in tier_copies:
                            tier_copies[tier] = False  # R16
            for tid in allocs[k]:
                if tid in planned:
                    state[tid] = GPU
            for tid in frees[k]:
                if tid in planned and state[tid] in (GPU, LEAVING):
                    state[tid] = DEAD
                    open_offload.pop(tid, None)
            if recomputed is None:
                after = actions_after.get(groups[k])
                if after:
                    sink = self.actions.setdefault(k, [])
                    for i, action in after:
                        self.issue(i, action, k, groups[k], sink)
        self.check_steady_state()
        releases: dict[int, list[Transfer]] = {}
        for transfer in self.transfers:
            if transfer.kind in ("offload", "store") and transfer.last_reader >= 0:
                releases.setdefault(transfer.last_reader, []).append(transfer)
        for tid, codec in self.encoded.items():
            raise PlanInvalid("R42", None, tid, f"{tid!r} is encoded by codec {codec!r} and never decoded")
        return Program(seq=seq, waits=self.waits, releases=releases, actions=self.actions,
                       start_actions=self.start_actions, transfers=self.transfers,
                       initial_copies=dict(plan.initial), on_cpu=self.cpu_items, host_waits=self.host_waits)

    def walk_codec_item(self, k: int, item: CodecItem) -> None:
        """R41, R42: an encode keeps its tensor encoded on the GPU (a Gist encode frees the
        tensor; a compute codec's offload is issued when its encode ends); a decode
        brings the tensor back (a prefetch's decode: its prefetch arrives here)."""
        tid, state, action = item.tensor, self.state, self.plan.actions[item.action]
        st = state[tid]
        if item.kind == "encode":
            if st != GPU:
                raise self.invalid("R42", k, tid, f"encode of {tid!r} after {self.seq.group[k]!r}: it is not "
                                                  f"resident ({_state_words(st)})")
            self.check_codec(k, tid, item.codec)
            if action.kind == "offload":
                self.issue(item.action, action, k, action.after, self.actions.setdefault(k, []))
            else:
                if not self.has_use_from(tid, k + 1):
                    raise self.invalid("R42", k, tid, f"encode of {tid!r} after {self.seq.group[k]!r}: it is not "
                                                      "used again, so there is nothing to decode it for")
                state[tid] = ENCODED
                self.encoded[tid] = item.codec
        elif action.kind == "decode":
            if st != ENCODED or self.encoded.get(tid) != item.codec:
                what = (f"encoded by codec {self.encoded[tid]!r}" if st == ENCODED else _state_words(st))
                raise self.invalid("R42", k, tid, f"decode of {tid!r} with codec {item.codec!r} before "
                                                  f"{self.seq.group[k]!r}: it is not encoded by it ({what})")
            del self.encoded[tid]
            state[tid] = GPU

    def check_codec(self, k: int, tid: str, codec_name: str) -> None:
        """R40: may this codec encode tid here (lossy allowed, binarize's later uses, a
        smaller size)?"""
        uses = self.seq.uses.get(tid, [])
        ops = self.profile.ops
        later = [ops[self.seq.op_index[j]] for j in uses[bisect_left(uses, k + 1):]]
        problem = codec_problem(self.profile, self.tensors[tid], self.machine.codecs[codec_name], later,
                                self.plan.allow_lossy)
        if problem is not None:
            raise self.invalid(problem[0], k, tid, problem[1])

    def walk_cpu_item(self, k: int, op) -> None:
        """R26: a CPU op reads and updates host copies (waiting for the transfers that
        wrote them) and makes its outputs in host memory; a tensor it updates must not
        be resident or incoming on the GPU, whose copy would go stale (an offload's
        window closes: later GPU uses need a prefetch)."""
        copies, state = self.copies, self.state
        for tid in dict.fromkeys(op.inputs + op.updates):
            if copies[tid].get("host") and self.copy_codec.get((tid, "host")):
                raise self.invalid("R41", k, tid, f"op {op.id!r} runs on the CPU and reads {tid!r}, whose host copy "
                                                  f"is compressed (codec {self.copy_codec[(tid, 'host')]!r})")
            if not copies[tid].get("host"):
                verb = "updates" if tid in op.updates else "reads"
                raise self.invalid("R26", k, tid, f"op {op.id!r} runs on the CPU and {verb} {tid!r}, which has no "
                                                  "valid copy in host memory (offload it to host, load it from "
                                                  "the SSD, or start it in host)")
            writer = self.last_offload_to.get((tid, "host"))
            if writer is not None and tid not in self.host_item_writer:
                self.host_waits.setdefault(k, []).append(writer)
        for tid in dict.fromkeys(op.updates):
            if state[tid] in (GPU, INCOMING):
                raise self.invalid("R26", k, tid, f"op {op.id!r} runs on the CPU and updates {tid!r} while it is "
                                                  f"on the GPU ({_state_words(state[tid])}): that copy would go stale")
            self.close_window(tid)   # an offloaded copy on the GPU is stale from here on
            self.copies[tid] = {"host": True}      # R16: the SSD copy, if any, is stale now
            self.host_written_by(tid, k)
            self.updated_at.setdefault(tid, []).append(k)
        for tid in self.seq.allocs[k]:
            state[tid] = AWAY
            self.copies[tid] = {"host": True}
            self.host_written_by(tid, k)
        for tid in self.seq.frees[k]:
            if tid in self.planned:
                state[tid] = DEAD
                self.open_offload.pop(tid, None)

    def host_written_by(self, tid: str, k: int) -> None:
        """The host copy of tid is now the one CPU item k wrote."""
        self.last_offload_to.pop((tid, "host"), None)
        self.host_item_writer[tid] = k

    def last_cpu_use(self, tid: str, k: int) -> int:
        """The last CPU item at or before item k that uses tid (-1: none)."""
        uses = self.seq.uses.get(tid, [])
        for j in reversed(uses[:bisect_left(uses, k + 1)]):
            if j in self.cpu_items:
                return j
        return -1

    def check_use(self, tid: str, k: int, verb: str) -> None:
        st = self.state[tid]
        if st in (GPU, LEAVING):
            return
        name = self.seq.name(k)
        if st == ENCODED:
            raise self.invalid("R42", k, tid, f"{name} {verb} {tid!r}, which is encoded on the GPU by codec "
                                              f"{self.encoded[tid]!r} (decode it before)")
        if st == INCOMING:
            before = self.incoming[tid]
            target = self.seq.group[before] if before >= 0 else "the end of the iteration"
            raise self.invalid("R13", k, tid, f"{name} {verb} {tid!r} after its prefetch was issued but "
                                              f"before its before op {target!r}")
        raise self.invalid("R13", k, tid, f"{name} {verb} {tid!r}, which is not resident ({_state_words(st)})")

    def check_recompute(self, k: int, tid: str, op) -> None:
        """R24, R15: a recompute of ``tid`` at item k runs on the GPU, of a tensor off the GPU
        that R15 lets be recomputed (``recompute_problem``, with the walk's updates)."""
        st = self.state[tid]
        group = self.seq.group[k]
        if op.id in self.plan.cpu_ops or group in self.plan.cpu_ops:
            where = f"its producer {op.id!r}" if op.id in self.plan.cpu_ops else f"op {group!r}"
            raise self.invalid("R24", k, tid, f"recompute of {tid!r}: {where} runs on the CPU; recomputes run "
                                              "on the GPU, before GPU ops")
        if self.tensors[tid].persistent:
            raise self.invalid("R15", k, tid, recompute_problem(self.profile, tid))
        if st in (GPU, INCOMING):
            raise self.invalid("R15", k, tid, f"recompute of {tid!r} before {group!r}: it is "
                                              f"{'resident' if st == GPU else 'incoming'}")
        if st in (UNBORN, DEAD, ENCODED):
            raise self.invalid("R15", k, tid, f"recompute of {tid!r} before {group!r}: it is {_state_words(st)}")
        problem = recompute_problem(self.profile, tid, updates=self.updates_since_made(tid))
        if problem is not None:   # its producer updates in place, or it or an input was updated since
            raise self.invalid("R15", k, tid, problem)
        self.close_window(tid)
        self.state[tid] = GPU

    def updates_since_made(self, tid: str) -> list[tuple[str, str]]:
        """The walk's updates in place R15 counts against a recompute of ``tid``: (tensor,
        op id) of those of ``tid`` and of its producer's inputs since the producer's item."""
        made_by = self.profile.producer[tid]
        if made_by is None:
            return []
        made = self.seq.op_item[self.profile.ops[made_by].id]
        return [(t, self.seq.group[k]) for k, t in counted_updates(self.profile, tid, self.updated_at, made)]

    def check_steady_state(self) -> None:
        """R20, once the walk is over."""
        for tid, before in list(self.incoming.items()):
            if before == -1:
                self.state[tid] = GPU
        for tid in self.compiled.persistent_ids:
            if tid not in self.planned:
                continue
            st = self.state[tid]
            if tid in self.plan.initial:
                tier = self.plan.initial[tid]
                if st not in (AWAY, LEAVING) or not self.copies[tid].get(tier):
                    raise PlanInvalid("R20", None, tid, f"{tid!r} started in {tier} but does not end there "
                                                        f"with a valid copy off the GPU ({_state_words(st)})")
            elif st != GPU:
                raise PlanInvalid("R20", None, tid, f"{tid!r} started on the GPU but is not resident at the "
                                                    f"end of the iteration ({_state_words(st)})")

    # ------------------------------------------------------------------ actions

    def issue(self, action_index: int, action: Action, k: int, after: str | None, sink: list) -> None:
        """Apply one action enqueued at the end of item k (k = -1: iteration start)."""
        tid = action.tensor
        where = after if after is not None else "iteration start"
        st = self.state[tid]
        if action.kind == "offload":
            self.issue_offload(action_index, action, k, after, where, st, sink)
        elif action.kind == "prefetch":
            self.issue_prefetch(action_index, action, k, after, where, st, sink)
        elif action.kind == "load":
            self.issue_load(action_index, action, k, after, where, st, sink)
        elif action.kind == "store":
            self.issue_store(action_index, action, k, after, where, st, sink)
        else:
            self.issue_drop(action_index, action, k, where, st, sink)

    def issue_offload(self, action_index, action, k, after, where, st, sink) -> None:
        tid = action.tensor
        if st == LEAVING:
            raise self.invalid("R11", k, tid, f"offload of {tid!r} after {where}: it is already being offloaded")
        if st != GPU:
            raise self.invalid("R11", k, tid, f"offload of {tid!r} after {where}: it is not resident "
                                              f"({_state_words(st)})")
        nbytes, buffer = self.tensors[tid].bytes, None
        if action.codec is not None:
            self.check_codec(k, tid, action.codec)
            nbytes = compressed_bytes(self.tensors[tid], self.machine.codecs[action.codec])
            if self.machine.codecs[action.codec].where == "compute":
                buffer = buffer_id(tid, action.codec)
        transfer = Transfer(len(self.transfers), action_index, "offload", tid, nbytes, action.to,
                            self.machine.route("offload", action.to), -1, -1, -1, after, buffer=buffer)
        self.copy_codec[(tid, action.to)] = action.codec
        self.state[tid] = LEAVING
        self.open_offload[tid] = transfer
        self.copies[tid][action.to] = True
        self.last_offload_to[(tid, action.to)] = transfer
        if action.to == "host":
            self.host_item_writer.pop(tid, None)
        self.transfers.append(transfer)
        sink.append(transfer)

    def issue_prefetch(self, action_index, action, k, after, where, st, sink) -> None:
        tid = action.tensor
        persistent = self.tensors[tid].persistent
        if st in (GPU, INCOMING):
            raise self.invalid("R12", k, tid, f"prefetch of {tid!r} after {where}: it is already "
                                              f"{'resident' if st == GPU else 'incoming'}")
        if st in (UNBORN, DEAD):
            raise self.invalid("R12", k, tid, f"prefetch of {tid!r} after {where}: it is {_state_words(st)}")
        if not self.copies[tid].get(action.source):
            raise self.invalid("R12", k, tid, f"prefetch of {tid!r} from {action.source} after {where}: "
                                              "no valid copy there (never written, or made stale by an "
                                              "in-place update, R16)")
        before_item = -1
        if action.before is not None and action.before in self.plan.cpu_ops:
            raise self.invalid("R26", k, tid, f"prefetch of {tid!r} before op {action.before!r}, which runs on "
                                              "the CPU and reads host copies")
        if action.before is not None:
            before_item = self.waiting_item(action.before)
            if before_item <= k:
                raise self.invalid("R12", k, tid, f"prefetch of {tid!r}: before op {action.before!r} "
                                                  f"does not come after {where}")
            if not persistent and not self.has_use_from(tid, before_item):
                raise self.invalid("R12", k, tid, f"prefetch of {tid!r}: it is not used at or after "
                                                  f"op {action.before!r}")
        elif not persistent:
            raise self.invalid("R12", k, tid, f"prefetch of {tid!r} with before=null: only persistent "
                                              "tensors can be returned by the end of the iteration")
        written = self.copy_codec.get((tid, action.source))
        if action.codec != written:
            raise self.invalid("R41", k, tid, f"prefetch of {tid!r} from {action.source} with "
                                              f"{'codec ' + repr(action.codec) if action.codec else 'no codec'}: "
                                              f"its source copy was written "
                                              f"{'by codec ' + repr(written) if written else 'uncompressed'}")
        nbytes, buffer = self.tensors[tid].bytes, None
        if action.codec is not None:
            codec = self.machine.codecs[action.codec]
            nbytes = compressed_bytes(self.tensors[tid], codec)
            if codec.where == "compute":
                buffer = buffer_id(tid, action.codec)
                before_item = self.decode_item(action_index)
        self.close_window(tid)
        source = self.last_offload_to.get((tid, action.source))
        transfer = Transfer(len(self.transfers), action_index, "prefetch", tid, nbytes,
                            action.source, self.machine.route("prefetch", action.source),
                            -1 if source is None else source.index, -1, before_item, after, buffer=buffer)
        if action.source == "host":
            transfer.source_item = self.host_item_writer.get(tid, -1)
        self.state[tid] = INCOMING
        self.incoming[tid] = before_item
        if before_item >= 0:
            self.incoming_at.setdefault(before_item, []).append(tid)
            # R6: the first item of the before op's group waits; the rest of the group runs after it
            self.waits.setdefault(before_item, []).append(transfer)
        self.transfers.append(transfer)
        sink.append(transfer)

    def issue_load(self, action_index, action, k, after, where, st, sink) -> None:
        """R26: copy the SSD copy into host memory, for ops on the CPU."""
        tid = action.tensor
        copies = self.copies[tid]
        if st in (UNBORN, DEAD):
            raise self.invalid("R26", k, tid, f"load of {tid!r} after {where}: it is {_state_words(st)}")
        if not copies.get("ssd"):
            raise self.invalid("R26", k, tid, f"load of {tid!r} after {where}: no valid copy on the SSD")
        if copies.get("host"):
            raise self.invalid("R26", k, tid, f"load of {tid!r} after {where}: it already has a valid copy "
                                              "in host memory")
        if self.copy_codec.get((tid, "ssd")):
            raise self.invalid("R41", k, tid, f"load of {tid!r}: its SSD copy is compressed (codec "
                                              f"{self.copy_codec[(tid, 'ssd')]!r}); loads and stores move plain copies")
        source = self.last_offload_to.get((tid, "ssd"))
        transfer = Transfer(len(self.transfers), action_index, "load", tid, self.tensors[tid].bytes, "ssd",
                            self.machine.route("load", "ssd"), -1 if source is None else source.index,
                            -1, -1, after)
        copies["host"] = True
        self.last_offload_to[(tid, "host")] = transfer
        self.host_item_writer.pop(tid, None)
        self.transfers.append(transfer)
        sink.append(transfer)

    def issue_store(self, action_index, action, k, after, where, st, sink) -> None:
        """R26: write the host copy to the SSD and free it from host memory once the
        copy and every earlier CPU op using it have ended."""
        tid = action.tensor
        copies = self.copies[tid]
        if st in (UNBORN, DEAD):
            raise self.invalid("R26", k, tid, f"store of {tid!r} after {where}: it is {_state_words(st)}")
        if not copies.get("host"):
            raise self.invalid("R26", k, tid, f"store of {tid!r} after {where}: no valid copy in host memory")
        if self.copy_codec.get((tid, "host")):
            raise self.invalid("R41", k, tid, f"store of {tid!r}: its host copy is compressed (codec "
                                              f"{self.copy_codec[(tid, 'host')]!r}); loads and stores move plain copies")
        source = self.last_offload_to.get((tid, "host"))
        transfer = Transfer(len(self.transfers), action_index, "store", tid, self.tensors[tid].bytes, "ssd",
                            self.machine.route("store", "ssd"), -1 if source is None else source.index,
                            self.last_cpu_use(tid, k), -1, after, self.host_item_writer.get(tid, -1))
        copies["ssd"], copies["host"] = True, False
        self.last_offload_to[(tid, "ssd")] = transfer
        self.last_offload_to.pop((tid, "host"), None)
        self.host_item_writer.pop(tid, None)
        self.transfers.append(transfer)
        sink.append(transfer)

    def issue_drop(self, action_index, action, k, where, st, sink) -> None:
        tid = action.tensor
        if st not in (GPU, LEAVING):
            raise self.invalid("R14", k, tid, f"drop of {tid!r} after {where}: it is not resident "
                                              f"({_state_words(st)})")
        if st == LEAVING:
            raise self.invalid("R14", k, tid, f"drop of {tid!r} after {where}: inside the window of its offload "
                                              f"after {self.open_offload[tid].after_op or 'iteration start'!r}, "
                                              "which releases the GPU copy itself")
        next_use, recomputed_first = self.next_reference(tid, k)
        never_again = not self.tensors[tid].persistent and next_use is None
        if not (any(self.copies[tid].values()) or recomputed_first or never_again):
            raise self.invalid("R14", k, tid, f"drop of {tid!r} after {where}: no valid copy in host or "
                                              "SSD, and it is used again without a recompute")
        self.state[tid] = DEAD if never_again else AWAY
        sink.append(Drop(action_index, tid))


def _state_words(st: str) -> str:
    return {UNBORN: "not produced yet", GPU: "resident", LEAVING: "being offloaded",
            AWAY: "offloaded or dropped, and not prefetched or recomputed",
            INCOMING: "incoming", ENCODED: "encoded on the GPU, not decoded yet",
            DEAD: "freed after its last use"}[st]
