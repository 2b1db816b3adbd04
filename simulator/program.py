"""Compile a plan against a profile into the flat program the engine runs.

Compiling decides everything that does not depend on timing (SIMULATION.md: "validity
is decided from the plan, never from timing", R13): the compute sequence (R5), last
uses (R8), offload windows (R11), and every static rule about residency (R11-R16, R20).
A broken rule raises ``PlanInvalid`` naming the rule, the op and the tensor.

The walk keeps, for each tensor, where the plan has put it:

    UNBORN   not produced yet (non-persistent)
    GPU      resident, readable and writable
    LEAVING  offloaded, its window open: readable, not writable (R11)
    AWAY     not on the GPU (after its window, or dropped)
    INCOMING a prefetch is issued; usable from its ``before`` op on (R12, R13)
    DEAD     freed after its last use
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from .hardware import Hardware
from .plan import Action, Plan
from .profile import Profile

UNBORN, GPU, LEAVING, AWAY, INCOMING, DEAD = "unborn", "gpu", "leaving", "away", "incoming", "dead"


class PlanInvalid(Exception):
    """A plan that breaks a simulation rule (the result is ``valid: false``)."""

    def __init__(self, rule: str, op: str | None, tensor: str | None, reason: str):
        self.rule, self.op, self.tensor, self.reason = rule, op, tensor, reason
        super().__init__(f"{rule}: {reason}")


@dataclass(eq=False, slots=True)
class Transfer:
    """One offload or prefetch: its queues, duration and the static facts the engine needs."""
    action: int                      # index in plan.actions
    kind: str                        # "offload" | "prefetch"
    tensor: str
    nbytes: int
    tier: str                        # "host" | "ssd"
    queues: tuple[str, ...]          # ("d2h",), ("d2h", "ssd_write"), ("h2d",), ("h2d", "ssd_read")
    duration_us: float
    source: "Transfer | None" = None  # prefetch: the offload that wrote its source copy
    last_reader: int = -1            # offload: last item in its window that reads the tensor
    before_item: int = -1            # prefetch: first item that waits for it (-1: none)
    after_op: str | None = None
    # Filled in by the engine as it runs.
    seq: int = -1                    # enqueue order (R1, R9)
    start_us: float = -1.0
    end_us: float = -1.0
    ended: bool = False


@dataclass(eq=False, slots=True)
class Drop:
    """A drop action: frees the GPU copy when its ``after`` op ends (R14)."""
    action: int
    tensor: str
    offloads: tuple[Transfer, ...]   # offloads of the tensor issued before it (R14: none in flight)


@dataclass
class Sequence:
    """The compute sequence (R5) as parallel lists indexed by item, plus its uses (R8).

    Item k runs profile op ``op_index[k]``; ``recomputed[k]`` is the tensor it recomputes
    (None for the op itself); ``group[k]`` is the op id whose group it belongs to.
    """
    op_index: list[int]
    recomputed: list[str | None]
    group: list[str]
    allocs: list[tuple[str, ...]]        # tensors allocated at start
    alloc_bytes: list[int]               # allocs + workspace
    workspace: list[int]
    time_us: list[float]
    frees: list[tuple[str, ...]]         # non-persistent tensors whose last use it is (R7, R8)
    uses: dict[str, list[int]]           # tensor -> items that read or update it
    group_start: dict[str, int]          # op id -> first item of its group
    op_item: dict[str, int]              # op id -> its own item
    recompute_items: dict[str, list[int]]

    def __len__(self) -> int:
        return len(self.op_index)

    def name(self, k: int) -> str:
        """How messages name item k."""
        tid = self.recomputed[k]
        return self.group[k] if tid is None else f"recompute of {tid} before {self.group[k]}"


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
    initial_gpu: list[str]               # persistent tensors resident at start
    initial_copies: dict[str, str]       # tensor -> tier, from plan.initial
    tensor_bytes: dict[str, int]


def link_speed(hardware: Hardware, kind: str, tier: str) -> tuple[float, float]:
    """(latency in us, bytes per us) of an offload or prefetch to or from a tier (R17, R18).

    An SSD transfer moves at the slower of its PCIe direction and the SSD; its latency is
    PCIe + SSD through host memory, the SSD's alone for GPUDirect Storage.
    """
    pcie = hardware.pcie
    link_gbps = pcie.d2h_gbps if kind == "offload" else pcie.h2d_gbps
    latency = pcie.latency_us
    if tier == "ssd":
        ssd = hardware.ssd
        if ssd is None:
            return latency, link_gbps * 1e3
        link_gbps = min(link_gbps, ssd.write_gbps if kind == "offload" else ssd.read_gbps)
        latency = ssd.latency_us if ssd.path == "direct" else pcie.latency_us + ssd.latency_us
    return latency, link_gbps * 1e3  # GB/s = 1e3 bytes per us


def _queues(kind: str, tier: str) -> tuple[str, ...]:
    if kind == "offload":
        return ("d2h", "ssd_write") if tier == "ssd" else ("d2h",)
    return ("h2d", "ssd_read") if tier == "ssd" else ("h2d",)


def default_sequence(profile: Profile) -> Sequence:
    """The sequence of the profile's own order with no recomputes, built once per profile."""
    memo = profile.__dict__.get("_default_sequence")
    if memo is None:
        memo = build_sequence(profile, [op.id for op in profile.ops], {})
        profile.__dict__["_default_sequence"] = memo
    return memo


def build_sequence(profile: Profile, order: list[str], recomputes: dict[str, list[str]]) -> Sequence:
    """R5 and R8: for each op of ``order``, its recomputes (tensor ids, plan order), then the op."""
    tensors = profile.tensor_by_id
    seq = Sequence([], [], [], [], [], [], [], [], {}, {}, {}, {})
    for op_id in order:
        seq.group_start[op_id] = len(seq.op_index)
        for tid in recomputes.get(op_id, ()):
            producer = profile.producer[tid]
            op = profile.ops[producer]
            seq.recompute_items.setdefault(tid, []).append(len(seq.op_index))
            _append(seq, producer, tid, op_id, (tid,), op.workspace_bytes, tensors[tid].bytes, op.time_us)
            for read in dict.fromkeys(op.inputs):
                seq.uses.setdefault(read, []).append(len(seq.op_index) - 1)
        index = profile.op_index[op_id]
        op = profile.ops[index]
        allocs = tuple(dict.fromkeys(op.outputs))
        seq.op_item[op_id] = len(seq.op_index)
        _append(seq, index, None, op_id, allocs, op.workspace_bytes,
                sum(tensors[t].bytes for t in allocs), op.time_us)
        for read in op.inputs + op.updates:
            uses = seq.uses.setdefault(read, [])
            if not uses or uses[-1] != len(seq.op_index) - 1:
                uses.append(len(seq.op_index) - 1)
    frees: dict[int, list[str]] = {}
    for tid, made_by in profile.producer.items():
        if made_by is not None:  # R8: the last item that uses it, else its producer
            uses = seq.uses.get(tid)
            frees.setdefault(uses[-1] if uses else seq.op_item[profile.ops[made_by].id], []).append(tid)
    seq.frees = [tuple(frees.get(k, ())) for k in range(len(seq.op_index))]
    return seq


def _append(seq: Sequence, op_index: int, recomputed, group, allocs, workspace, tensor_bytes, time_us) -> None:
    seq.op_index.append(op_index)
    seq.recomputed.append(recomputed)
    seq.group.append(group)
    seq.allocs.append(allocs)
    seq.workspace.append(workspace)
    seq.alloc_bytes.append(tensor_bytes + workspace)
    seq.time_us.append(time_us)


def compute_sequence(profile: Profile, plan: Plan) -> Sequence:
    """The plan's compute sequence: the cached default one when the plan neither
    reorders ops nor recomputes."""
    recomputes: dict[str, list[str]] = {}
    for action in plan.actions:
        if action.kind == "recompute":
            recomputes.setdefault(action.before, []).append(action.tensor)
    if plan.schedule is None and not recomputes:
        return default_sequence(profile)
    order = list(plan.schedule) if plan.schedule is not None else [op.id for op in profile.ops]
    return build_sequence(profile, order, recomputes)


def _tensor_facts(profile: Profile) -> tuple[list[str], dict[str, int]]:
    """Persistent tensor ids (profile order) and every tensor's bytes, built once per profile."""
    memo = profile.__dict__.get("_tensor_facts")
    if memo is None:
        memo = ([t.id for t in profile.tensors if t.persistent], {t.id: t.bytes for t in profile.tensors})
        profile.__dict__["_tensor_facts"] = memo
    return memo


def compile_program(profile: Profile, plan: Plan, hardware: Hardware) -> Program:
    """Build the program and check every rule decidable from the plan.

    Only the tensors the plan names can leave the GPU, so the walk visits only the
    items that touch them (their uses, producer and last use), the recomputes, and the
    ops that have actions after them or prefetches before them: its cost grows with
    the plan, not the profile. Raises PlanInvalid (rule, op, tensor, reason). Assumes
    ``check_plan`` passed.
    """
    return _Compiler(profile, plan, hardware).compile()


class _Compiler:
    """One static walk of a plan over its compute sequence (see the module docstring)."""

    def __init__(self, profile: Profile, plan: Plan, hardware: Hardware):
        self.profile = profile
        self.plan = plan
        self.hardware = hardware
        self.seq = compute_sequence(profile, plan)
        self.tensors = profile.tensor_by_id
        self.planned = set(plan.initial) | {a.tensor for a in plan.actions}
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
        self.offloads_of: dict[str, list[Transfer]] = {}
        self.incoming: dict[str, int] = {}              # tensor -> its prefetch's before item (-1: end)
        self.incoming_at: dict[int, list[str]] = {}
        self.updated_at: dict[str, list[int]] = {}
        self.transfers: list[Transfer] = []
        self.links = {(kind, tier): (_queues(kind, tier), *link_speed(hardware, kind, tier))
                      for kind in ("offload", "prefetch") for tier in ("host", "ssd")}
        self.waits: dict[int, list[Transfer]] = {}
        self.actions: dict[int, list] = {}
        self.start_actions: list = []

    # ------------------------------------------------------------------ helpers

    def invalid(self, rule: str, k: int | None, tid: str | None, reason: str) -> PlanInvalid:
        op = self.seq.group[k] if k is not None and k >= 0 else None
        return PlanInvalid(rule, op, tid, reason)

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
        for ks in seq.recompute_items.values():
            found.update(ks)
        for op_id in actions_after:
            if op_id is not None:
                found.add(seq.op_item[op_id])
        for action in self.plan.actions:
            if action.kind == "prefetch" and action.before is not None:
                found.add(seq.group_start[action.before])
        return sorted(found)

    # ------------------------------------------------------------------ the walk

    def compile(self) -> Program:
        seq, profile, plan = self.seq, self.profile, self.plan
        actions_after: dict[str | None, list[tuple[int, Action]]] = {}
        for i, action in enumerate(plan.actions):
            if action.kind != "recompute":
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
            if recomputed is not None:
                self.check_recompute(k, recomputed, op)
            for tid in op.inputs:
                if tid in planned:
                    st = state[tid]
                    if st is LEAVING:
                        open_offload[tid].last_reader = k
                    elif st is not GPU:
                        self.check_use(tid, k, "reads")
            if recomputed is None:
                for tid in op.updates:
                    if tid in planned:
                        self.check_use(tid, k, "updates")
                        if state[tid] is LEAVING:
                            raise self.invalid("R11", k, tid, f"op {groups[k]!r} updates {tid!r} "
                                                              "during its offload window")
                        tier_copies = copies[tid]
                        for tier in tier_copies:
                            tier_copies[tier] = False  # R16
                        self.updated_at.setdefault(tid, []).append(k)
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
            if transfer.kind == "offload" and transfer.last_reader >= 0:
                releases.setdefault(transfer.last_reader, []).append(transfer)
        persistent_ids, tensor_bytes = _tensor_facts(profile)
        return Program(seq=seq, waits=self.waits, releases=releases, actions=self.actions,
                       start_actions=self.start_actions, transfers=self.transfers,
                       initial_gpu=[t for t in persistent_ids if t not in plan.initial],
                       initial_copies=dict(plan.initial), tensor_bytes=tensor_bytes)

    def check_use(self, tid: str, k: int, verb: str) -> None:
        st = self.state[tid]
        if st in (GPU, LEAVING):
            return
        name = self.seq.name(k)
        if st == INCOMING:
            before = self.incoming[tid]
            target = self.seq.group[before] if before >= 0 else "the end of the iteration"
            raise self.invalid("R13", k, tid, f"{name} {verb} {tid!r} after its prefetch was issued but "
                                              f"before its before op {target!r}")
        raise self.invalid("R13", k, tid, f"{name} {verb} {tid!r}, which is not resident ({_state_words(st)})")

    def check_recompute(self, k: int, tid: str, op) -> None:
        st = self.state[tid]
        group = self.seq.group[k]
        if self.tensors[tid].persistent:
            raise self.invalid("R15", k, tid, f"recompute of persistent tensor {tid!r}")
        if st in (GPU, INCOMING):
            raise self.invalid("R15", k, tid, f"recompute of {tid!r} before {group!r}: it is "
                                              f"{'resident' if st == GPU else 'incoming'}")
        if st in (UNBORN, DEAD):
            raise self.invalid("R15", k, tid, f"recompute of {tid!r} before {group!r}: it is {_state_words(st)}")
        if op.updates:
            raise self.invalid("R15", k, tid, f"recompute of {tid!r}: its producer {op.id!r} updates "
                                              f"{op.updates[0]!r} in place")
        if self.updated_at.get(tid):
            raise self.invalid("R15", k, tid, f"recompute of {tid!r}: it was updated in place after it was "
                                              f"produced (by op {self.seq.group[self.updated_at[tid][0]]!r})")
        self.close_window(tid)
        self.state[tid] = GPU

    def check_steady_state(self) -> None:
        """R20, once the walk is over."""
        for tid, before in list(self.incoming.items()):
            if before == -1:
                self.state[tid] = GPU
        for tid in _tensor_facts(self.profile)[0]:
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
        else:
            self.issue_drop(action_index, action, k, where, st, sink)

    def issue_offload(self, action_index, action, k, after, where, st, sink) -> None:
        tid = action.tensor
        if st == LEAVING:
            raise self.invalid("R11", k, tid, f"offload of {tid!r} after {where}: it is already being offloaded")
        if st != GPU:
            raise self.invalid("R11", k, tid, f"offload of {tid!r} after {where}: it is not resident "
                                              f"({_state_words(st)})")
        if action.to == "ssd" and self.hardware.ssd is None:
            raise self.invalid("R18", k, tid, f"offload of {tid!r} to ssd: hardware {self.hardware.name} "
                                              "has no SSD")
        nbytes = self.tensors[tid].bytes
        queues, latency_us, bytes_per_us = self.links[("offload", action.to)]
        transfer = Transfer(action_index, "offload", tid, nbytes, action.to, queues,
                            latency_us + nbytes / bytes_per_us, None, -1, -1, after)
        self.state[tid] = LEAVING
        self.open_offload[tid] = transfer
        self.copies[tid][action.to] = True
        self.last_offload_to[(tid, action.to)] = transfer
        self.offloads_of.setdefault(tid, []).append(transfer)
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
        if action.source == "ssd" and self.hardware.ssd is None:
            raise self.invalid("R18", k, tid, f"prefetch of {tid!r} from ssd: hardware {self.hardware.name} "
                                              "has no SSD")
        if not self.copies[tid].get(action.source):
            raise self.invalid("R12", k, tid, f"prefetch of {tid!r} from {action.source} after {where}: "
                                              "no valid copy there (never written, or made stale by an "
                                              "in-place update, R16)")
        before_item = -1
        if action.before is not None:
            before_item = self.seq.group_start[action.before]
            if before_item <= k:
                raise self.invalid("R12", k, tid, f"prefetch of {tid!r}: before op {action.before!r} "
                                                  f"does not come after {where}")
            if not persistent and not self.has_use_from(tid, before_item):
                raise self.invalid("R12", k, tid, f"prefetch of {tid!r}: it is not used at or after "
                                                  f"op {action.before!r}")
        elif not persistent:
            raise self.invalid("R12", k, tid, f"prefetch of {tid!r} with before=null: only persistent "
                                              "tensors can be returned by the end of the iteration")
        self.close_window(tid)
        nbytes = self.tensors[tid].bytes
        queues, latency_us, bytes_per_us = self.links[("prefetch", action.source)]
        transfer = Transfer(action_index, "prefetch", tid, nbytes, action.source, queues,
                            latency_us + nbytes / bytes_per_us, self.last_offload_to.get((tid, action.source)),
                            -1, before_item, after)
        self.state[tid] = INCOMING
        self.incoming[tid] = before_item
        if before_item >= 0:
            self.incoming_at.setdefault(before_item, []).append(tid)
            for j in range(before_item, self.seq.op_item[action.before] + 1):
                self.waits.setdefault(j, []).append(transfer)
        self.transfers.append(transfer)
        sink.append(transfer)

    def issue_drop(self, action_index, action, k, where, st, sink) -> None:
        tid = action.tensor
        if st not in (GPU, LEAVING):
            raise self.invalid("R14", k, tid, f"drop of {tid!r} after {where}: it is not resident "
                                              f"({_state_words(st)})")
        next_use, recomputed_first = self.next_reference(tid, k)
        never_again = not self.tensors[tid].persistent and next_use is None
        if not (any(self.copies[tid].values()) or recomputed_first or never_again):
            raise self.invalid("R14", k, tid, f"drop of {tid!r} after {where}: no valid copy in host or "
                                              "SSD, and it is used again without a recompute")
        self.open_offload.pop(tid, None)
        self.state[tid] = DEAD if never_again else AWAY
        sink.append(Drop(action_index, tid, tuple(self.offloads_of.get(tid, ()))))


def _state_words(st: str) -> str:
    return {UNBORN: "not produced yet", GPU: "resident", LEAVING: "being offloaded",
            AWAY: "offloaded or dropped, and not prefetched or recomputed",
            INCOMING: "incoming", DEAD: "freed after its last use"}[st]
