"""The discrete-event simulation of one iteration: GPU compute, PCIe, host and SSD.

``simulate(profile, plan, hardware)`` compiles the plan (simulator/program.py: every
rule decidable from the plan alone) and runs it here in time. This Python code is the
reference; when the C module is built, plans that turn out valid and feasible are
compiled and run in C instead (simulator/fastpath.py), with identical results. Rule
numbers (R1-R22) are those of docs/simulation.md. The engine knows nothing of planners.

One compute stream runs the items of the compute sequence in order (R5, R6); the
links ``h2d``, ``d2h``, ``ssd_read`` and ``ssd_write`` are FIFO queues like CUDA
streams (R1, R17, R18). Time advances from instant to instant: at each instant every
completion (and the frees it causes) is applied first, then the compute head tries to
start, then the waiting transfers in enqueue order (R9).
"""
from __future__ import annotations

import gc
import heapq
from collections import deque
from contextlib import contextmanager

from .errors import InputError
from .fastpath import simulate_fast
from .hardware import Hardware
from .plan import Plan, check_plan
from .profile import Profile
from .program import Drop, PlanInvalid, Program, Transfer, compile_program
from .result import Result, Span, Timeline

_ITEM_END = 0
_TRANSFER_END = 1
QUEUES = ("h2d", "d2h", "ssd_read", "ssd_write")


def resolve_budget(budget_bytes: int | None, plan: Plan, hardware: Hardware) -> int:
    """R2: an explicit budget, else the plan's, else the GPU's memory; never above the GPU's."""
    budget = budget_bytes if budget_bytes is not None else plan.budget_bytes
    if budget is None:
        return hardware.gpu.memory_bytes
    return check_budget(budget, hardware)


def check_budget(budget: int, hardware: Hardware) -> int:
    """A budget is a byte count from 0 up to the GPU's memory (R2); InputError otherwise."""
    if budget > hardware.gpu.memory_bytes:
        raise InputError("<argument>", "budget",
                         f"{budget} bytes is more than the GPU's memory ({hardware.gpu.memory_bytes} bytes "
                         f"on {hardware.name}) (R2)")
    if budget < 0:
        raise InputError("<argument>", "budget", "must not be negative")
    return budget


def simulate(profile: Profile, plan: Plan, hardware: Hardware, budget_bytes: int | None = None,
             record: bool = False, reference: bool = False) -> Result:
    """Simulate ``plan`` on ``profile`` and ``hardware``.

    Parameters
    ----------
    budget_bytes : the GPU memory budget; None takes the plan's, then the GPU's (R2).
    record : keep a Timeline (spans and memory samples) in ``result.timeline``.
    reference : always use the pure-Python compile and run loop. Otherwise a run without
        ``record`` goes through the C simulator (simulator/fastpath.py) when it is built,
        and falls back to the reference to explain a plan that is invalid or infeasible.

    Returns
    -------
    Result, with ``valid`` False for a plan that breaks a rule and ``feasible`` False
    for a valid plan that cannot run in the budget.

    Raises
    ------
    InputError for structural problems (unknown ids, a plan for another profile, a
    schedule that breaks dependencies) and a budget above the GPU's memory.
    """
    with _gc_paused():
        check_plan(plan, profile)
        budget = resolve_budget(budget_bytes, plan, hardware)
        if not (record or reference):
            result = simulate_fast(profile, plan, hardware, budget)
            if result is not None:
                return result
        try:
            program = compile_program(profile, plan, hardware)
        except PlanInvalid as exc:
            return Result(valid=False, feasible=False, rule=exc.rule, op=exc.op, tensor=exc.tensor,
                          reason=exc.reason, budget_bytes=budget, ideal_us=profile.ideal_us)
        return _Run(profile, program, hardware, budget, record).run()


@contextmanager
def _gc_paused():
    """A simulation makes many short-lived objects and no reference cycles: pausing the
    cyclic garbage collector keeps it from scanning a large profile again and again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Infeasible(Exception):
    def __init__(self, rule: str, op: str | None, tensor: str | None, reason: str, blocked: dict):
        super().__init__(reason)
        self.rule, self.op, self.tensor, self.reason, self.blocked = rule, op, tensor, reason, blocked


class _Run:
    """The state of one simulation; ``run`` drives it to the end of the iteration."""

    def __init__(self, profile: Profile, program: Program, hardware: Hardware, budget: int, record: bool):
        self.profile = profile
        self.program = program
        self.seq = program.seq
        self.budget = budget
        self.nbytes = program.tensor_bytes
        self.now = 0.0
        self.events: list = []
        self.event_seq = 0
        self.transfer_seq = 0
        # GPU memory
        self.on_gpu: set[str] = set(program.initial_gpu)
        self.mem = sum(self.nbytes[t] for t in self.on_gpu)
        self.peak = self.mem
        self.peak_at = 0.0
        # lower tiers (R19)
        self.capacity = {"host": hardware.host.memory_bytes,
                         "ssd": hardware.ssd.capacity_bytes if hardware.ssd else 0}
        self.tier_used = {"host": 0, "ssd": 0}
        self.tier_peak = {"host": 0, "ssd": 0}
        self.tier_space: set[tuple[str, str]] = set()
        # tensors whose last use passed while an offload still reads them (R7, R11)
        self.in_flight: dict[str, int] = {}
        self.dead_pending: set[str] = set()
        # compute stream
        self.head = 0
        self.running = False
        self.ready_at = 0.0          # when the head's predecessor ended
        self.data_ready_at: float | None = None
        self.last_compute_end = 0.0
        self.compute_us = 0.0
        self.recompute_us = 0.0
        self.stall_data = 0.0
        self.stall_memory = 0.0
        self.stall_by_op: dict[str, dict] = {}
        # links
        half = hardware.pcie.duplex == "half"
        self.resource_of = {"h2d": "pcie" if half else "h2d", "d2h": "pcie" if half else "d2h",
                            "ssd_read": "ssd_read", "ssd_write": "ssd_write"}
        self.busy = {r: False for r in self.resource_of.values()}
        self.queues: dict[str, deque[Transfer]] = {q: deque() for q in QUEUES}
        self.bytes_on = {q: 0 for q in QUEUES}
        self.busy_us = {q: 0.0 for q in QUEUES}
        self.last_transfer_end = 0.0
        # timeline
        self.record = record
        self.spans: list[Span] = []
        self.memory: list[tuple[float, int]] = [(0.0, self.mem)] if record else []

    # ------------------------------------------------------------------ memory

    def _alloc(self, tensors, extra: int = 0) -> None:
        for tid in tensors:
            self.on_gpu.add(tid)
            self.mem += self.nbytes[tid]
        self.mem += extra
        if self.mem > self.peak:
            self.peak, self.peak_at = self.mem, self.now
        self._sample()

    def _free(self, tid: str) -> None:
        if tid in self.on_gpu:
            self.on_gpu.discard(tid)
            self.mem -= self.nbytes[tid]
            self._sample()

    def _sample(self) -> None:
        if self.record:
            if self.memory and self.memory[-1][0] == self.now:
                self.memory[-1] = (self.now, self.mem)
            else:
                self.memory.append((self.now, self.mem))

    def _tier_take(self, tid: str, tier: str, who: str | None) -> None:
        if (tid, tier) in self.tier_space:
            return
        self.tier_space.add((tid, tier))
        self.tier_used[tier] += self.nbytes[tid]
        self.tier_peak[tier] = max(self.tier_peak[tier], self.tier_used[tier])
        if self.tier_used[tier] > self.capacity[tier]:
            raise _Infeasible("R19", who, tid, f"{tier} capacity exceeded: {self.tier_used[tier]} bytes needed, "
                              f"{self.capacity[tier]} available", {"tier": tier})

    def _tier_release(self, tid: str) -> None:
        for tier in ("host", "ssd"):
            if (tid, tier) in self.tier_space:
                self.tier_space.discard((tid, tier))
                self.tier_used[tier] -= self.nbytes[tid]

    def _largest_residents(self, n: int = 5) -> list[dict]:
        top = sorted(self.on_gpu, key=lambda t: (-self.nbytes[t], t))[:n]
        return [{"tensor": t, "bytes": self.nbytes[t]} for t in top]

    # ------------------------------------------------------------------ events

    def _push(self, time: float, kind: int, obj) -> None:
        self.event_seq += 1
        heapq.heappush(self.events, (time, self.event_seq, kind, obj))

    def _enqueue(self, transfer: Transfer) -> None:
        self.transfer_seq += 1
        transfer.seq = self.transfer_seq
        for q in transfer.queues:
            self.queues[q].append(transfer)

    def _drop(self, drop: Drop, after: str) -> None:
        if any(not t.ended for t in drop.offloads):  # R14
            raise PlanInvalid("R14", after, drop.tensor,
                              f"drop of {drop.tensor!r} after {after!r} while its offload is still in flight")
        self._free(drop.tensor)

    def _item_end(self, k: int) -> None:
        """R7: workspace, last-use frees, offload releases, then the actions after the op."""
        self.running = False
        self.head = k + 1
        self.ready_at = self.now
        self.data_ready_at = None
        self.last_compute_end = self.now
        self.mem -= self.seq.workspace[k]
        self._sample()
        for tid in self.seq.frees[k]:
            if self.in_flight.get(tid):
                self.dead_pending.add(tid)
            else:
                self._free(tid)
                self._tier_release(tid)
        for transfer in self.program.releases.get(k, ()):
            if transfer.ended:
                self._free(transfer.tensor)
        for action in self.program.actions.get(k, ()):
            if isinstance(action, Drop):
                self._drop(action, self.seq.group[k])
            else:
                self._enqueue(action)

    def _transfer_end(self, transfer: Transfer) -> None:
        transfer.ended = True
        transfer.end_us = self.now
        self.last_transfer_end = max(self.last_transfer_end, self.now)
        for q in transfer.queues:
            self.busy[self.resource_of[q]] = False
        if transfer.kind == "offload":
            tid = transfer.tensor
            self.in_flight[tid] -= 1
            if transfer.last_reader < self.head:  # the last reader in its window has ended
                self._free(tid)
            if tid in self.dead_pending and not self.in_flight[tid]:
                self.dead_pending.discard(tid)
                self._free(tid)
                self._tier_release(tid)

    # ------------------------------------------------------------------ starts

    def _try_compute(self) -> None:
        seq = self.seq
        if self.running or self.head >= len(seq):
            return
        k = self.head
        recomputed = seq.recomputed[k]
        if self.data_ready_at is None:
            if any(not w.ended for w in self.program.waits.get(k, ())):
                return
            if recomputed is not None and recomputed in self.on_gpu:
                return  # R15: the older copy is still being copied out
            self.data_ready_at = self.now
        if self.mem + seq.alloc_bytes[k] > self.budget:
            return
        start = self.now
        data_wait = self.data_ready_at - self.ready_at
        memory_wait = start - self.data_ready_at
        if data_wait > 0 or memory_wait > 0:
            self.stall_data += data_wait
            self.stall_memory += memory_wait
            entry = self.stall_by_op.setdefault(seq.group[k], {"data_us": 0.0, "memory_us": 0.0})
            entry["data_us"] += data_wait
            entry["memory_us"] += memory_wait
        self._alloc(seq.allocs[k], seq.workspace[k])
        self.running = True
        time_us = seq.time_us[k]
        end = start + time_us
        self.compute_us += time_us
        if recomputed is not None:
            self.recompute_us += time_us
        if self.record:
            op = self.profile.ops[seq.op_index[k]]
            name = op.id if recomputed is None else f"recompute {recomputed}"
            self.spans.append(Span("compute", name, start, end, {"op": op.id, "kernel": op.name, "phase": op.phase,
                                                                  "kind": "op" if recomputed is None else "recompute"}))
        self._push(end, _ITEM_END, k)

    def _try_transfers(self) -> None:
        heads = {}
        for q in QUEUES:
            if self.queues[q]:
                transfer = self.queues[q][0]
                heads[transfer.seq] = transfer
        for seq in sorted(heads):
            transfer = heads[seq]
            if any(self.queues[q][0] is not transfer for q in transfer.queues):
                continue
            if any(self.busy[self.resource_of[q]] for q in transfer.queues):
                continue
            tid = transfer.tensor
            if transfer.kind == "prefetch":
                if transfer.source is not None and not transfer.source.ended:
                    continue
                if tid in self.on_gpu or self.mem + transfer.nbytes > self.budget:
                    continue
                self._alloc((tid,))
            else:
                self._tier_take(tid, transfer.tier, transfer.after_op)
                self.in_flight[tid] = self.in_flight.get(tid, 0) + 1
            for q in transfer.queues:
                self.queues[q].popleft()
                self.busy[self.resource_of[q]] = True
                self.bytes_on[q] += transfer.nbytes
                self.busy_us[q] += transfer.duration_us
            transfer.start_us = self.now
            end = self.now + transfer.duration_us
            if self.record:
                for q in transfer.queues:
                    self.spans.append(Span(q, f"{transfer.kind} {tid}", self.now, end,
                                           {"tensor": tid, "bytes": transfer.nbytes, "tier": transfer.tier,
                                            "kind": transfer.kind}))
            self._push(end, _TRANSFER_END, transfer)

    # ------------------------------------------------------------------ run

    def run(self) -> Result:
        result = Result(budget_bytes=self.budget, ideal_us=self.profile.ideal_us,
                        transfers=len(self.program.transfers),
                        recomputes=sum(1 for tid in self.seq.recomputed if tid is not None))
        try:
            if self.mem > self.budget:
                raise _Infeasible("R10", None, None,
                                  f"at start: persistent tensors need {self.mem} bytes, budget is {self.budget}",
                                  {"waiting": "at start", "needed_bytes": self.mem,
                                   "free_bytes": self.budget, "largest_residents": self._largest_residents()})
            for tid, tier in self.program.initial_copies.items():
                self._tier_take(tid, tier, None)
            for action in self.program.start_actions:
                self._enqueue(action)
            self._step()
            events = self.events
            while events:
                self.now = events[0][0]
                while events and events[0][0] == self.now:
                    _, _, kind, obj = heapq.heappop(events)
                    if kind == _ITEM_END:
                        self._item_end(obj)
                    else:
                        self._transfer_end(obj)
                self._step()
            if self.head < len(self.seq) or any(self.queues.values()):
                raise self._stuck()
        except PlanInvalid as exc:
            result.valid = result.feasible = False
            result.rule, result.op, result.tensor, result.reason = exc.rule, exc.op, exc.tensor, exc.reason
        except _Infeasible as exc:
            result.feasible = False
            result.rule, result.op, result.tensor, result.reason = exc.rule, exc.op, exc.tensor, exc.reason
            result.blocked = exc.blocked
        self._fill(result)
        return result

    def _step(self) -> None:
        self._try_compute()
        self._try_transfers()

    def _stuck(self) -> _Infeasible:
        """R10: nothing runs, nothing is pending, and work remains: say what waits."""
        free = self.budget - self.mem
        residents = self._largest_residents()
        shown = ", ".join(f"{r['tensor']} ({r['bytes']} B)" for r in residents) or "none"
        seq, k = self.seq, self.head
        op = seq.group[k] if k < len(seq) else None
        if k < len(seq):
            pending = [w for w in self.program.waits.get(k, ()) if not w.ended]
            if pending:
                waiting = pending[0]
                what = f"op {op!r} waits for the prefetch of {waiting.tensor!r}, which waits for memory"
                needed, tensor = waiting.nbytes, waiting.tensor
            else:
                recomputed = seq.recomputed[k]
                label = f"op {op!r}" if recomputed is None else f"recompute of {recomputed!r} before {op!r}"
                what = f"{label} waits for memory"
                needed, tensor = seq.alloc_bytes[k], recomputed
        else:
            waiting = next(q[0] for q in self.queues.values() if q)
            what = f"the final {waiting.kind} of {waiting.tensor!r} cannot start"
            needed, tensor = waiting.nbytes, waiting.tensor
        reason = f"{what}: needs {needed} bytes, {free} free; largest residents: {shown}"
        return _Infeasible("R10", op, tensor, reason, {"waiting": what, "needed_bytes": needed,
                                                        "free_bytes": free, "largest_residents": residents})

    def _fill(self, result: Result) -> None:
        end = max(self.last_compute_end, self.last_transfer_end, self.now if not result.ok else 0.0)
        result.iteration_us = end
        result.overhead = end / result.ideal_us - 1.0 if result.ideal_us > 0 else 0.0
        result.compute_us = self.compute_us
        result.recompute_us = self.recompute_us
        result.stall_data_us = self.stall_data
        result.stall_memory_us = self.stall_memory
        result.stall_us = self.stall_data + self.stall_memory
        result.tail_us = max(0.0, end - self.last_compute_end)
        result.peak_bytes = self.peak
        result.peak_at_us = self.peak_at
        result.bytes_h2d = self.bytes_on["h2d"]
        result.bytes_d2h = self.bytes_on["d2h"]
        result.bytes_ssd_read = self.bytes_on["ssd_read"]
        result.bytes_ssd_write = self.bytes_on["ssd_write"]
        result.busy_us = {"compute": self.compute_us, **self.busy_us}
        result.host_peak_bytes = self.tier_peak["host"]
        result.ssd_peak_bytes = self.tier_peak["ssd"]
        result.stall_by_op = self.stall_by_op
        if self.record:
            result.timeline = Timeline(spans=self.spans, memory=self.memory, budget_bytes=self.budget,
                                       phases=_phases(self.spans))


def _phases(spans: list[Span]) -> list[tuple[str, float, float]]:
    """Contiguous runs of one phase on the compute track."""
    out: list[list] = []
    for span in spans:
        if span.track != "compute":
            continue
        phase = span.args.get("phase", "other")
        if out and out[-1][0] == phase:
            out[-1][2] = span.end_us
        else:
            out.append([phase, span.start_us, span.end_us])
    return [tuple(p) for p in out]
