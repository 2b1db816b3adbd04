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
from dataclasses import dataclass, field

from .hardware import Hardware
from .plan import Action, Plan
from .profile import Profile

UNBORN, GPU, LEAVING, AWAY, INCOMING, DEAD = "unborn", "gpu", "leaving", "away", "incoming", "dead"


class PlanInvalid(Exception):
    """A plan that breaks a simulation rule (the result is ``valid: false``)."""

    def __init__(self, rule: str, op: str | None, tensor: str | None, reason: str):
        self.rule, self.op, self.tensor, self.reason = rule, op, tensor, reason
        super().__init__(f"{rule}: {reason}")


@dataclass(eq=False)
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


@dataclass(eq=False)
class Drop:
    """A drop action: frees the GPU copy when its ``after`` op ends (R14)."""
    action: int
    tensor: str
    offloads: tuple[Transfer, ...]   # offloads of the tensor issued before it (R14: none in flight)


@dataclass(eq=False)
class Item:
    """One entry of the compute sequence (R5): an op, or a recompute placed before one."""
    kind: str                        # "op" | "recompute"
    op_index: int                    # the profile op that runs (the producer, for a recompute)
    group: str                       # the op id whose group this item belongs to
    tensor: str | None = None        # the recomputed tensor
    allocs: tuple[str, ...] = ()     # tensors allocated at start
    alloc_bytes: int = 0             # allocs + workspace
    workspace: int = 0
    time_us: float = 0.0
    waits: list[Transfer] = field(default_factory=list)      # prefetches it waits for (R6)
    frees: list[str] = field(default_factory=list)           # last uses ending here (R7, R8)
    releases: list[Transfer] = field(default_factory=list)   # offloads whose last reader it is
    actions: list = field(default_factory=list)              # Transfer | Drop enqueued at its end
    updates: tuple[str, ...] = ()


@dataclass
class Program:
    """Everything the engine needs, decided from the plan alone."""
    items: list[Item]
    start_actions: list                       # actions with after = null, in plan order
    transfers: list[Transfer]
    initial_gpu: list[str]                    # persistent tensors resident at start
    initial_copies: dict[str, str]            # tensor -> tier, from plan.initial
    tensor_bytes: dict[str, int]
    persistent: set[str]


def transfer_time_us(hardware: Hardware, kind: str, tier: str, nbytes: int) -> float:
    """Time a transfer holds its link(s): latency + bytes / bandwidth (R17, R18)."""
    pcie = hardware.pcie
    link_gbps = pcie.d2h_gbps if kind == "offload" else pcie.h2d_gbps
    latency = pcie.latency_us
    if tier == "ssd":
        ssd = hardware.ssd
        link_gbps = min(link_gbps, ssd.write_gbps if kind == "offload" else ssd.read_gbps)
        latency = ssd.latency_us if ssd.path == "direct" else pcie.latency_us + ssd.latency_us
    return latency + nbytes / (link_gbps * 1e3)  # GB/s = 1e3 bytes per us


def _queues(kind: str, tier: str) -> tuple[str, ...]:
    if kind == "offload":
        return ("d2h", "ssd_write") if tier == "ssd" else ("d2h",)
    return ("h2d", "ssd_read") if tier == "ssd" else ("h2d",)


def compute_sequence(profile: Profile, plan: Plan) -> list[Item]:
    """R5: for each op of the schedule, its recomputes (plan order), then the op."""
    order = plan.schedule if plan.schedule is not None else [op.id for op in profile.ops]
    recomputes: dict[str, list[Action]] = {}
    for action in plan.actions:
        if action.kind == "recompute":
            recomputes.setdefault(action.before, []).append(action)
    items = []
    for op_id in order:
        for action in recomputes.get(op_id, ()):
            producer = profile.producer[action.tensor]
            op = profile.ops[producer]
            items.append(Item("recompute", producer, op_id, tensor=action.tensor,
                              allocs=(action.tensor,), workspace=op.workspace_bytes,
                              alloc_bytes=profile.tensor_by_id[action.tensor].bytes + op.workspace_bytes,
                              time_us=op.time_us))
        index = profile.op_index[op_id]
        op = profile.ops[index]
        allocs = tuple(dict.fromkeys(op.outputs))
        items.append(Item("op", index, op_id, allocs=allocs, workspace=op.workspace_bytes,
                          alloc_bytes=sum(profile.tensor_by_id[t].bytes for t in allocs) + op.workspace_bytes,
                          time_us=op.time_us, updates=op.updates))
    return items


def _reads(profile: Profile, item: Item) -> tuple[str, ...]:
    op = profile.ops[item.op_index]
    return op.inputs if item.kind == "recompute" else op.inputs + op.updates


def compile_program(profile: Profile, plan: Plan, hardware: Hardware) -> Program:
    """Build the program and check every rule decidable from the plan.

    Raises PlanInvalid (rule, op, tensor, reason). Assumes ``check_plan`` passed.
    """
    items = compute_sequence(profile, plan)
    tensors = profile.tensor_by_id
    persistent = {t.id for t in profile.tensors if t.persistent}

    # Where each op's group starts, and which items use each tensor (R8).
    group_start: dict[str, int] = {}
    op_item: dict[str, int] = {}
    uses: dict[str, list[int]] = {}
    recompute_items: dict[str, list[int]] = {}
    for k, item in enumerate(items):
        group_start.setdefault(item.group, k)
        if item.kind == "op":
            op_item[item.group] = k
        else:
            recompute_items.setdefault(item.tensor, []).append(k)
        for tid in _reads(profile, item):
            uses.setdefault(tid, []).append(k)
    for tid, made_by in profile.producer.items():
        if made_by is not None:  # R8: the last item that uses it, else its producer
            user_items = uses.get(tid)
            items[user_items[-1] if user_items else op_item[profile.ops[made_by].id]].frees.append(tid)

    def has_use_from(tid: str, k: int) -> bool:
        user_items = uses.get(tid, [])
        return bisect_left(user_items, k) < len(user_items)

    def next_reference(tid: str, k: int) -> tuple[int | None, bool]:
        """The next item after k that uses tid, and whether a recompute of tid comes first."""
        user_items = uses.get(tid, [])
        j = bisect_left(user_items, k + 1)
        next_use = user_items[j] if j < len(user_items) else None
        recs = recompute_items.get(tid, [])
        r = bisect_left(recs, k + 1)
        next_rec = recs[r] if r < len(recs) else None
        recomputed_first = next_rec is not None and (next_use is None or next_rec <= next_use)
        return next_use, recomputed_first

    # ---- the walk
    state: dict[str, str] = {}
    copies: dict[str, dict[str, bool]] = {tid: {} for tid in tensors}
    for tid in tensors:
        state[tid] = GPU if tid in persistent else UNBORN
    for tid, tier in plan.initial.items():
        state[tid] = AWAY
        copies[tid][tier] = True
    open_offload: dict[str, Transfer] = {}        # tensor -> offload whose window is open
    last_offload_to: dict[tuple[str, str], Transfer] = {}
    offloads_of: dict[str, list[Transfer]] = {}
    incoming: dict[str, int] = {}                 # tensor -> before item (or -1 for end)
    incoming_by_item: dict[int, list[str]] = {}
    updated_at: dict[str, list[int]] = {}
    transfers: list[Transfer] = []
    start_actions: list = []

    def invalid(rule: str, k: int | None, tid: str | None, reason: str):
        op = items[k].group if k is not None and k >= 0 else None
        return PlanInvalid(rule, op, tid, reason)

    def close_window(tid: str) -> None:
        open_offload.pop(tid, None)
        if state[tid] == LEAVING:
            state[tid] = AWAY

    def issue(action_index: int, action: Action, k: int, after: str | None, sink: list) -> None:
        """Apply one action enqueued at the end of item k (k = -1: iteration start)."""
        tid = action.tensor
        where = after if after is not None else "iteration start"
        st = state[tid]
        if action.kind == "offload":
            if st == LEAVING:
                raise invalid("R11", k, tid, f"offload of {tid!r} after {where}: it is already being offloaded")
            if st != GPU:
                raise invalid("R11", k, tid, f"offload of {tid!r} after {where}: it is not resident ({_state_words(st)})")
            if action.to == "ssd" and hardware.ssd is None:
                raise invalid("R18", k, tid, f"offload of {tid!r} to ssd: hardware {hardware.name} has no SSD")
            transfer = Transfer(action_index, "offload", tid, tensors[tid].bytes, action.to,
                                _queues("offload", action.to),
                                transfer_time_us(hardware, "offload", action.to, tensors[tid].bytes),
                                after_op=after)
            state[tid] = LEAVING
            open_offload[tid] = transfer
            copies[tid][action.to] = True
            last_offload_to[(tid, action.to)] = transfer
            offloads_of.setdefault(tid, []).append(transfer)
            transfers.append(transfer)
            sink.append(transfer)
        elif action.kind == "prefetch":
            if st in (GPU, INCOMING):
                raise invalid("R12", k, tid, f"prefetch of {tid!r} after {where}: it is already "
                              f"{'resident' if st == GPU else 'incoming'}")
            if st in (UNBORN, DEAD):
                raise invalid("R12", k, tid, f"prefetch of {tid!r} after {where}: it is {_state_words(st)}")
            if action.source == "ssd" and hardware.ssd is None:
                raise invalid("R18", k, tid, f"prefetch of {tid!r} from ssd: hardware {hardware.name} has no SSD")
            if not copies[tid].get(action.source):
                raise invalid("R12", k, tid, f"prefetch of {tid!r} from {action.source} after {where}: "
                              f"no valid copy there (never written, or made stale by an in-place update, R16)")
            if action.before is not None:
                before_item = group_start[action.before]
                if before_item <= k:
                    raise invalid("R12", k, tid, f"prefetch of {tid!r}: before op {action.before!r} "
                                  f"does not come after {where}")
                if tid not in persistent and not has_use_from(tid, before_item):
                    raise invalid("R12", k, tid, f"prefetch of {tid!r}: it is not used at or after "
                                  f"op {action.before!r}")
            else:
                before_item = -1
                if tid not in persistent:
                    raise invalid("R12", k, tid, f"prefetch of {tid!r} with before=null: only persistent "
                                  "tensors can be returned by the end of the iteration")
            close_window(tid)
            transfer = Transfer(action_index, "prefetch", tid, tensors[tid].bytes, action.source,
                                _queues("prefetch", action.source),
                                transfer_time_us(hardware, "prefetch", action.source, tensors[tid].bytes),
                                source=last_offload_to.get((tid, action.source)),
                                before_item=before_item, after_op=after)
            state[tid] = INCOMING
            incoming[tid] = before_item
            if before_item >= 0:
                incoming_by_item.setdefault(before_item, []).append(tid)
                for j in range(before_item, op_item[action.before] + 1):
                    items[j].waits.append(transfer)
            transfers.append(transfer)
            sink.append(transfer)
        else:  # drop
            if st not in (GPU, LEAVING):
                raise invalid("R14", k, tid, f"drop of {tid!r} after {where}: it is not resident ({_state_words(st)})")
            has_copy = any(copies[tid].values())
            next_use, recomputed_first = next_reference(tid, k)
            never_again = tid not in persistent and next_use is None
            if not (has_copy or recomputed_first or never_again):
                raise invalid("R14", k, tid, f"drop of {tid!r} after {where}: no valid copy in host or "
                              "SSD, and it is used again without a recompute")
            open_offload.pop(tid, None)
            state[tid] = DEAD if never_again else AWAY
            sink.append(Drop(action_index, tid, tuple(offloads_of.get(tid, ()))))

    actions_after: dict[str | None, list[tuple[int, Action]]] = {}
    for i, action in enumerate(plan.actions):
        if action.kind != "recompute":
            actions_after.setdefault(action.after, []).append((i, action))

    for i, action in actions_after.get(None, ()):
        issue(i, action, -1, None, start_actions)

    for k, item in enumerate(items):
        op = profile.ops[item.op_index]
        for tid in incoming_by_item.get(k, ()):
            if state[tid] == INCOMING and incoming[tid] == k:
                state[tid] = GPU
                del incoming[tid]
        if item.kind == "recompute":
            tid = item.tensor
            st = state[tid]
            if tid in persistent:
                raise invalid("R15", k, tid, f"recompute of persistent tensor {tid!r}")
            if st in (GPU, INCOMING):
                raise invalid("R15", k, tid, f"recompute of {tid!r} before {item.group!r}: it is "
                              f"{'resident' if st == GPU else 'incoming'}")
            if st in (UNBORN, DEAD):
                raise invalid("R15", k, tid, f"recompute of {tid!r} before {item.group!r}: it is {_state_words(st)}")
            if op.updates:
                raise invalid("R15", k, tid, f"recompute of {tid!r}: its producer {op.id!r} updates "
                              f"{op.updates[0]!r} in place")
            if updated_at.get(tid):
                raise invalid("R15", k, tid, f"recompute of {tid!r}: it was updated in place after it was "
                              f"produced (by op {items[updated_at[tid][0]].group!r})")
            close_window(tid)
        for tid in op.inputs:
            _check_use(state, incoming, tid, k, item, items, invalid, "reads")
            if state[tid] == LEAVING:
                open_offload[tid].last_reader = k
        if item.kind == "op":
            for tid in op.updates:
                _check_use(state, incoming, tid, k, item, items, invalid, "updates")
                if state[tid] == LEAVING:
                    raise invalid("R11", k, tid, f"op {item.group!r} updates {tid!r} during its offload window")
                for tier in copies[tid]:
                    copies[tid][tier] = False  # R16
                updated_at.setdefault(tid, []).append(k)
            for tid in item.allocs:
                state[tid] = GPU
        else:
            state[item.tensor] = GPU
        for tid in item.frees:
            if state[tid] in (GPU, LEAVING):
                state[tid] = DEAD
                open_offload.pop(tid, None)
        if item.kind == "op":
            for i, action in actions_after.get(item.group, ()):
                issue(i, action, k, item.group, item.actions)

    for tid, before_item in list(incoming.items()):
        if before_item == -1:
            state[tid] = GPU
    for t in profile.tensors:
        if not t.persistent:
            continue
        tid, st = t.id, state[t.id]
        if tid in plan.initial:
            tier = plan.initial[tid]
            if st not in (AWAY, LEAVING) or not copies[tid].get(tier):
                raise PlanInvalid("R20", None, tid, f"{tid!r} started in {tier} but does not end there "
                                  f"with a valid copy off the GPU ({_state_words(st)})")
        elif st != GPU:
            raise PlanInvalid("R20", None, tid, f"{tid!r} started on the GPU but is not resident at the "
                              f"end of the iteration ({_state_words(st)})")

    for transfer in transfers:
        if transfer.kind == "offload" and transfer.last_reader >= 0:
            items[transfer.last_reader].releases.append(transfer)
    return Program(items=items, start_actions=start_actions, transfers=transfers,
                   initial_gpu=[t.id for t in profile.tensors if t.persistent and t.id not in plan.initial],
                   initial_copies=dict(plan.initial),
                   tensor_bytes={t.id: t.bytes for t in profile.tensors}, persistent=persistent)


def _check_use(state, incoming, tid, k, item, items, invalid, verb) -> None:
    st = state[tid]
    if st in (GPU, LEAVING):
        return
    name = item.group if item.kind == "op" else f"recompute of {item.tensor} before {item.group}"
    if st == INCOMING:
        before = incoming[tid]
        target = items[before].group if before >= 0 else "the end of the iteration"
        raise invalid("R13", k, tid, f"{name} {verb} {tid!r} after its prefetch was issued but before "
                      f"its before op {target!r}")
    raise invalid("R13", k, tid, f"{name} {verb} {tid!r}, which is not resident ({_state_words(st)})")


def _state_words(st: str) -> str:
    return {UNBORN: "not produced yet", GPU: "resident", LEAVING: "being offloaded",
            AWAY: "offloaded or dropped, and not prefetched or recomputed",
            INCOMING: "incoming", DEAD: "freed after its last use"}[st]
