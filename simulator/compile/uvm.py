"""The static rules of UVM mode (R30-R37 of docs/simulation.md): ``compile_uvm`` checks a
plan with ``"memory": "uvm"`` (which actions it may hold, offload windows, what waits for
what) and lowers it into the ``Program`` the run (simulator/run/uvm.py) executes.

It is the UVM twin of simulator/compile/program.py's ``_Compiler`` and reuses its parts
(the program's types, ``check_plan_rules``, ``compute_sequence``); the memory policy in
time is simulator/run/uvm_memory.py's.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from ..plan import Plan
from ..profile import Profile
from .compiled import CompiledProfile, Machine
from .program import Drop, PlanInvalid, Program, Transfer, check_plan_rules, compute_sequence
from .sequence import Sequence


class ItemTouch:
    """What item k of a sequence touches, as tensor positions: what it pins (R31), what
    it may fault (inputs, then updates, in order), what it allocates, what it updates."""
    __slots__ = ("pins", "reads", "outputs", "updates")

    def __init__(self, pins, reads, outputs, updates):
        self.pins, self.reads, self.outputs, self.updates = pins, reads, outputs, updates


@dataclass(frozen=True)
class UvmTouches:
    """A sequence's touches (R31) per item, for the Python run (``items``), and the same
    with the sequence's times, workspaces, allocations and last uses (R7) as flat arrays
    for the C run (``arrays``; simulator/fast/uvm.py), with a bound on the bytes one item
    or transfer can move (``bound``)."""
    items: tuple[ItemTouch, ...]
    arrays: tuple
    bound: int


def uvm_touches(seq: Sequence, compiled: CompiledProfile) -> UvmTouches:
    """The touches of every item of ``seq`` (see ``UvmTouches``)."""
    arrays = compiled.arrays
    in_off, in_val, up_off, up_val = arrays[5], arrays[6], arrays[7], arrays[8]
    index = compiled.tensor_index
    items = []
    for k, op in enumerate(seq.op_index):
        updates = tuple(dict.fromkeys(up_val[up_off[op]:up_off[op + 1]]))
        reads = tuple(dict.fromkeys(tuple(in_val[in_off[op]:in_off[op + 1]]) + updates))
        outputs = tuple(index[t] for t in seq.allocs[k])
        items.append(ItemTouch(tuple(dict.fromkeys(reads + outputs)), reads, outputs, updates))
    flat = (array("q", seq.time_ps), array("q", seq.workspace), array("q", seq.alloc_bytes),
            *_csr(item.pins for item in items), *_csr(item.reads for item in items),
            *_csr(item.outputs for item in items), *_csr(item.updates for item in items),
            *_csr([index[tid] for tid in frees] for frees in seq.frees))
    return UvmTouches(tuple(items), flat, sum(arrays[0]) + sum(seq.workspace))


def _csr(rows) -> tuple[array, array]:
    offsets, values = array("i", [0]), array("i")
    for row in rows:
        values.extend(row)
        offsets.append(len(values))
    return offsets, values


def compile_uvm(profile: Profile, compiled: CompiledProfile, plan: Plan, machine: Machine):
    """The static rules of a UVM plan (R33, R36, and v2's R11, R12, R20, R21 as R33 keeps
    them); raises PlanInvalid. Returns a ``Program`` with ``uvm`` set.

    In UVM mode recomputes, ``load``, ``store`` and ops on the CPU are not modelled
    (invalid); offloads and prefetches name the backing tier; ``initial`` places
    persistent tensors in the backing tier. R13 (a use of a tensor that is not resident)
    and R20 (steady state) do not apply: a use faults, and R36 runs two iterations.
    """
    backing = plan.uvm_backing or machine.uvm.backing
    check_plan_rules(profile, plan)   # R21, R20 (initial: persistent only), R15 (persistent recompute)
    for action in plan.actions:
        if action.codec is not None:
            raise PlanInvalid("R33", action.after or action.before, action.tensor,
                              f"{action.kind} of {action.tensor!r} with codec {action.codec!r}: UVM mode models "
                              "no codecs (R40-R42)")
        if action.group is not None:
            raise PlanInvalid("R33", action.after, action.tensor, f"{action.kind} of {action.tensor!r} in group "
                              f"{action.group!r}: UVM mode's hints are not grouped (R53 is for explicit copies)")
        if action.kind in ("recompute", "load", "store"):
            raise PlanInvalid("R33", action.before if action.kind == "recompute" else action.after, action.tensor,
                              f"{action.kind} of {action.tensor!r}: UVM mode models no recomputes and no "
                              "SSD <-> host moves; its actions are offload and prefetch hints (and drops of "
                              "read-mostly tensors)")
    if plan.cpu_ops:
        raise PlanInvalid("R33", plan.cpu_ops[0], None, "ops on the CPU (cpu_ops) are not modelled in UVM mode")
    if plan.placement is not None:
        raise PlanInvalid("R33", None, None, "a placement (R50) is for explicit copies; in UVM mode the driver "
                                             "places blocks")
    for tid, tier in plan.initial.items():
        if tier != backing:
            raise PlanInvalid("R36", None, tid, f"{tid!r} starts in {tier}, but managed memory is backed by "
                                                f"{backing} (the plan's uvm_backing, else the machine's uvm.backing)")
    seq = compute_sequence(profile, compiled, plan)
    if seq.uvm is None:
        seq.uvm = uvm_touches(seq, compiled)
    tensors, uses, op_item = profile.tensor_by_id, seq.uses, seq.op_item
    read_mostly = frozenset(plan.read_mostly)
    route_in, route_out = machine.route("prefetch", "host"), machine.route("offload", "host")

    def where(k: int) -> str:
        return seq.group[k] if k >= 0 else "iteration start"

    def invalid(rule: str, k: int, tid: str, reason: str):
        return PlanInvalid(rule, seq.group[k] if k >= 0 else None, tid, reason)

    def life(tid: str) -> tuple[int, int] | None:
        """(producer item, last item it lives through) of a non-persistent tensor."""
        if tensors[tid].persistent:
            return None
        made = op_item[profile.ops[profile.producer[tid]].id]
        used = uses.get(tid)
        return made, used[-1] if used else made

    def check_alive(tid: str, k: int, what: str, rule: str) -> None:
        span = life(tid)
        if span is None:
            return
        if k < span[0]:
            raise invalid(rule, k, tid, f"{what} of {tid!r} after {where(k)}: it is not produced yet")
        if k >= span[1]:
            raise invalid(rule, k, tid, f"{what} of {tid!r} after {where(k)}: it is freed after its last use")

    update_items: dict[str, list[int]] = {}

    def updated_in(tid: str, lo: int, hi: int) -> int | None:
        """The first item in (lo, hi] that updates tid, if any."""
        items = update_items.get(tid)
        if items is None:
            items = update_items[tid] = sorted(op_item[profile.ops[u].id] for u in profile.updaters[tid])
        i = bisect_right(items, lo)
        return items[i] if i < len(items) and items[i] <= hi else None

    open_window: dict[str, tuple] = {}     # tensor -> (offload, issue item)
    last_offload: dict[str, object] = {}

    def close(tid: str, upto: int) -> None:
        """R11: the window of tid's open offload runs over items (k, upto]; reads there
        are its readers, an update there breaks the rule."""
        transfer, k = open_window.pop(tid)
        bad = updated_in(tid, k, upto)
        if bad is not None:
            raise invalid("R11", bad, tid, f"op {seq.group[bad]!r} updates {tid!r} during its offload window")
        used = uses.get(tid, [])
        i = bisect_right(used, upto) - 1
        transfer.last_reader = used[i] if i >= 0 and used[i] > k else -1

    transfers: list = []
    waits: dict[int, list] = {}
    actions_at: dict[int, list] = {}
    start_actions: list = []
    order = sorted(range(len(plan.actions)),
                   key=lambda i: (-1 if plan.actions[i].after is None else op_item[plan.actions[i].after], i))
    for i in order:
        action = plan.actions[i]
        tid = action.tensor
        k = -1 if action.after is None else op_item[action.after]
        sink = start_actions if k < 0 else actions_at.setdefault(k, [])
        nbytes = tensors[tid].bytes
        if action.kind == "drop":
            if tid in open_window:
                raise invalid("R14", k, tid, f"drop of {tid!r} after {where(k)}: inside the window of its offload, "
                                             "which releases the GPU copy itself")
            if tid not in read_mostly or profile.updaters[tid]:
                raise invalid("R33", k, tid, f"drop of {tid!r} after {where(k)}: in UVM mode only a read-mostly "
                                             "tensor that no op updates keeps a valid backing copy to drop to")
            check_alive(tid, k, "drop", "R14")
            sink.append(Drop(i, tid))
        elif action.kind == "offload":
            if action.to != backing:
                raise invalid("R33", k, tid, f"offload of {tid!r} to {action.to}: managed memory is backed by "
                                             f"{backing} here")
            check_alive(tid, k, "offload", "R11")
            if tid in open_window:
                raise invalid("R11", k, tid, f"offload of {tid!r} after {where(k)}: it is already being offloaded")
            transfer = Transfer(len(transfers), i, "offload", tid, nbytes, backing, route_out, -1, -1, -1,
                                action.after)
            open_window[tid] = (transfer, k)
            last_offload[tid] = transfer
            transfers.append(transfer)
            sink.append(transfer)
        else:   # prefetch
            if action.source != backing:
                raise invalid("R33", k, tid, f"prefetch of {tid!r} from {action.source}: managed memory is backed "
                                             f"by {backing} here")
            before_item = -1
            if action.before is not None:
                before_item = seq.group_start[action.before]
                if before_item <= k:
                    raise invalid("R12", k, tid, f"prefetch of {tid!r}: before op {action.before!r} does not "
                                                 f"come after {where(k)}")
                if not tensors[tid].persistent and bisect_left(uses.get(tid, []), before_item) >= len(uses.get(tid, [])):
                    raise invalid("R12", k, tid, f"prefetch of {tid!r}: it is not used at or after "
                                                 f"op {action.before!r}")
            elif not tensors[tid].persistent:
                raise invalid("R12", k, tid, f"prefetch of {tid!r} with before=null: only persistent tensors can "
                                             "be returned by the end of the iteration")
            check_alive(tid, k, "prefetch", "R12")
            if tid in open_window:
                close(tid, k)
            source = last_offload.get(tid)
            transfer = Transfer(len(transfers), i, "prefetch", tid, nbytes, backing, route_in,
                                -1 if source is None else source.index, -1, before_item, action.after)
            if before_item >= 0:
                waits.setdefault(before_item, []).append(transfer)
            transfers.append(transfer)
            sink.append(transfer)
    for tid in list(open_window):
        close(tid, len(seq))
    releases: dict[int, list] = {}
    for transfer in transfers:
        if transfer.kind == "offload" and transfer.last_reader >= 0:
            releases.setdefault(transfer.last_reader, []).append(transfer)
    return Program(seq=seq, waits=waits, releases=releases, actions=actions_at, start_actions=start_actions,
                   transfers=transfers, initial_copies=dict(plan.initial), uvm=True, read_mostly=read_mostly,
                   backing=backing)
