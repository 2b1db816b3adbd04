"""``zero-offload`` and ``zero-infinity``: the optimizer step on the host CPU.

After Ren, Rajbhandari, Aminabadi, Ruwase, Yang, Zhang, Li, He, "ZeRO-Offload:
Democratizing Billion-Scale Model Training", USENIX ATC 2021, and Rajbhandari, Ruwase,
Rasley, Smith, He, "ZeRO-Infinity: Breaking the GPU Memory Wall for Extreme Scale Deep
Learning", SC 2021.

ZeRO-Offload (the paper's rules)
--------------------------------
1. The optimizer states and the fp32 master weights live in host memory, and the
   optimizer step (Adam) runs on the CPU: the ops of phase ``optimizer`` go to
   ``cpu_ops``, except the copy of the new low-precision weight into the GPU's weight
   (``optim::copy_param`` in a mixed-precision profile), which stays on the GPU.
2. Each gradient is offloaded to host memory as soon as backward has made it (after its
   last GPU use), overlapped with the rest of backward.
3. The new low-precision weights (``<param>.new``, made on the CPU by
   ``optim::cast_master``) are copied up and written into the GPU's weights.
4. The low-precision weights stay on the GPU; activations are checkpointed when they do
   not fit (the paper uses Megatron's activation checkpointing; here Chen et al.'s
   segments, the ``chen`` planner's actions, from planner/shared/checkpoint.py).

ZeRO-Infinity (the paper's rules)
---------------------------------
1. As ZeRO-Offload, and the copy into the weight runs on the CPU too: the whole optimizer
   step is on the host.
2. Optimizer state and master weights live on NVMe: each is loaded into host memory
   before its step (``load``, a few steps ahead) and stored back after it (``store``).
3. The low-precision weights live in host memory and are fetched to the GPU before each
   use in forward and backward (``ahead`` ops early, the paper's prefetch) and dropped
   after it; a weight's recomputes count as uses.
4. Gradients go to host memory as they are made (the paper may put them on NVMe too).

How a plan is chosen
--------------------
Both planners build a few variants and keep the fastest the simulator runs within the
budget: the optimizer ops in the profile's order or moved up to just after their
gradient is made (``reorder``: the CPU then works while backward still runs, the
overlap the paper reaches with per-bucket updates), the new weights copied up as soon as
they are made or after backward (less GPU memory during backward), and, for
ZeRO-Infinity, prefetch distances. When no variant fits, Chen's segments are added to
the best variant and the segment counts searched as ``chen`` does.

Departures (and why)
--------------------
- No one-step delayed parameter update (ZeRO-Offload's DPU): it changes the training
  algorithm, and a plan describes one iteration of the profile's.
- The CPU's time per op comes from the hardware file's CPU roofline (R25), not from a
  measured CPU-Adam; its copies of ``<param>.new`` are whole tensors, not buckets.
- ZeRO-Infinity's gradients stay in host memory (no NVMe gradients), and activation
  checkpoints stay on the GPU (the paper can offload them to host memory).
- Profiles without the mixed-precision structure (fp32 Adam updates the weight itself)
  work too: the weight is offloaded after its last backward use, updated on the CPU and
  prefetched back by the end of the iteration.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from simulator.errors import InputError
from simulator.plan import drop, load, offload, prefetch, store
from simulator.profile import Profile

from ..core.api import score, simulator_for
from ..core.lowering import DROP, OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.checkpoint import chen_actions, forward_ops

CPU, GPU = True, False


@dataclass
class Layout:
    """Where every op runs and in which order: ``order`` lists op indices (the plan's
    schedule), ``pos`` maps an op index to its place in it."""
    order: list[int]
    cpu: frozenset[int]
    pos: dict[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.pos = {op: p for p, op in enumerate(self.order)}


def optimizer_ops(profile: Profile, copies_on_cpu: bool) -> frozenset[int]:
    """The ops that run on the CPU: every optimizer op, except (``copies_on_cpu`` False)
    those that only copy optimizer-made tensors into a weight that forward or backward
    reads (mixed precision's ``optim::copy_param``)."""
    ops = profile.ops
    chosen = set()
    for i, op in enumerate(ops):
        if op.phase != "optimizer":
            continue
        if not copies_on_cpu and op.updates and _copies_into_weight(profile, op):
            continue
        chosen.add(i)
    return frozenset(chosen)


def _copies_into_weight(profile: Profile, op) -> bool:
    ops = profile.ops
    reads_optimizer_made = all(profile.producer[t] is not None and ops[profile.producer[t]].phase == "optimizer"
                               for t in op.inputs)
    writes_weight = any(any(ops[u].phase != "optimizer" for u in profile.consumers[t] + profile.updaters[t])
                        for t in op.updates)
    return reads_optimizer_made and writes_weight


def by_readiness(profile: Profile, cpu: frozenset[int]) -> list[int]:
    """The profile's order with each CPU op moved up to just after the last earlier op it
    must follow: one touching a tensor it touches (R21 keeps in-place updates in order).
    The optimizer ops left on the GPU (the copies into the weights) go last, in the order
    their inputs are ready, so that the new weights are used in the order they arrive."""
    ops = profile.ops
    last_touch: dict[str, int] = {}
    followers: dict[int, list[int]] = {}
    moved, deferred = set(), []
    for i, op in enumerate(ops):
        touched = set(op.inputs) | set(op.outputs) | set(op.updates)
        if i in cpu:
            anchor = max((last_touch[t] for t in touched if t in last_touch), default=-1)
            followers.setdefault(anchor, []).append(i)
            moved.add(i)
        elif op.phase == "optimizer":
            deferred.append(i)
        for t in touched:
            last_touch[t] = i
    order: list[int] = []

    def place(i: int) -> None:
        if i >= 0:
            order.append(i)
        for j in followers.get(i, ()):
            place(j)

    place(-1)
    waiting = set(deferred)
    for i in range(len(ops)):
        if i not in moved and i not in waiting:
            place(i)
    pos = {op: p for p, op in enumerate(order)}
    ready = {i: max((pos.get(profile.producer[t], -1) for t in ops[i].inputs if profile.producer[t] is not None),
                    default=-1) for i in deferred}
    for i in sorted(deferred, key=lambda i: (ready[i], i)):
        place(i)
    return order


@dataclass(frozen=True)
class Variant:
    """One way to lay out the step: what the search varies."""
    reorder: bool = True          # CPU ops just after their inputs are ready
    new_late: bool = False        # copy new weights up only after backward
    ahead: int = 4                # zero-infinity: weight prefetch distance, in ops
    load_ahead: int = 2           # zero-infinity: state loads this many CPU ops early
    grads_to: str = "host"        # zero-infinity: "ssd" spills gradients to NVMe, loaded for the step


class _Builder:
    """Turns a layout and a variant into steps, initial placements and the CPU ops."""

    def __init__(self, profile: Profile, infinity: bool, variant: Variant, extra_uses: dict[str, list[int]]):
        self.profile, self.infinity, self.variant = profile, infinity, variant
        cpu = optimizer_ops(profile, copies_on_cpu=infinity)
        order = by_readiness(profile, cpu) if variant.reorder else list(range(len(profile.ops)))
        self.layout = Layout(order, cpu)
        self.steps: list[Step] = []
        self.initial: dict[str, str] = {}
        self.extra_uses = extra_uses          # tensor -> op indices of recomputes that read it
        pos = self.layout.pos
        self.last_backward = max((pos[i] for i, op in enumerate(profile.ops) if op.phase == "backward"),
                                 default=-1)
        self.cpu_order = sorted(cpu, key=pos.__getitem__)
        self.cpu_rank = {i: k for k, i in enumerate(self.cpu_order)}
        self.gpu_positions = [p for p, i in enumerate(order) if i not in cpu]
        self.gpu_rank = {p: k for k, p in enumerate(self.gpu_positions)}

    def op_id(self, p: int) -> str | None:
        return None if p < 0 else self.profile.ops[self.layout.order[p]].id

    def add(self, at: int, phase: int, need: int, action) -> None:
        self.steps.append(Step(at, phase, need, (action.tensor, action.kind), action))

    def events(self, tid: str) -> list[tuple[int, bool, str]]:
        """(position, on the CPU, ``make`` / ``update`` / ``read``) of every op touching
        tid, and of the recomputes reading it, in schedule order."""
        profile, pos, cpu = self.profile, self.layout.pos, self.layout.cpu
        found: dict[int, str] = {}
        made = profile.producer[tid]
        if made is not None:
            found[made] = "make"
        for u in profile.consumers[tid]:
            found.setdefault(u, "read")
        for u in profile.updaters[tid]:
            found[u] = "update"
        for i in self.extra_uses.get(tid, ()):
            found.setdefault(i, "read")
        return sorted((pos[i], i in cpu, what) for i, what in found.items())

    def build(self) -> tuple[list, dict]:
        profile = self.profile
        tensors = profile.tensor_by_id
        touched_on_cpu: dict[str, None] = {}
        for i in self.cpu_order:
            op = profile.ops[i]
            for t in op.inputs + op.outputs + op.updates:
                touched_on_cpu[t] = None
        weights = []
        if self.infinity:
            weights = [t.id for t in profile.tensors if t.kind == "weight" and any(
                not on_cpu for _, on_cpu, _ in self.events(t.id))]
        for tid in weights:
            self.fetch_per_use(tid)
        for tid in touched_on_cpu:
            if tid in weights:
                continue
            events = self.events(tid)
            if tensors[tid].persistent and all(on_cpu for _, on_cpu, _ in events):
                self.host_state(tid, events)
            else:
                self.follow(tid, events)
        return issue_order(self.steps), self.initial

    def host_state(self, tid: str, events) -> None:
        """Optimizer state: in host memory (ZeRO-Offload), or on the SSD, loaded before
        its first CPU use and stored after its last (ZeRO-Infinity)."""
        if not self.infinity:
            self.initial[tid] = "host"
            return
        self.initial[tid] = "ssd"
        first, last = events[0][0], events[-1][0]
        at = self.load_point(first)
        self.add(at, PREFETCH, first, load(tid, self.op_id(at)))
        self.add(last, OFFLOAD, last, store(tid, self.op_id(last)))

    def load_point(self, p: int) -> int:
        """Where a load for the CPU op at position p is issued: after the CPU op
        ``load_ahead`` CPU ops earlier (-1: at the iteration start)."""
        early = self.cpu_rank[self.layout.order[p]] - self.variant.load_ahead
        return -1 if early < 0 else self.layout.pos[self.cpu_order[early]]

    def follow(self, tid: str, events) -> None:
        """A tensor both streams use: offloaded before a CPU use when only the GPU has a
        valid copy, prefetched before a GPU use when only the host has one (ZeRO-Offload's
        gradients down and new weights up; fp32 weights down and back by the end)."""
        persistent = self.profile.tensor_by_id[tid].persistent
        on_gpu, on_host = persistent, False
        last_gpu, last_cpu = -1, -1
        for p, on_cpu, what in events:
            if on_cpu:
                if not on_host and what != "make":
                    if self.variant.grads_to == "ssd" and not persistent:
                        self.add(last_gpu, OFFLOAD, p, offload(tid, self.op_id(last_gpu), "ssd"))
                        at = max(last_gpu, self.load_point(p))
                        self.add(at, PREFETCH, p, load(tid, self.op_id(at)))
                    else:
                        self.add(last_gpu, OFFLOAD, p, offload(tid, self.op_id(last_gpu)))
                    on_host = True
                if what != "read":
                    on_host, on_gpu = True, False
                last_cpu = p
            else:
                if not on_gpu and what != "make":
                    at = last_cpu
                    if self.variant.new_late and p > self.last_backward >= last_cpu:
                        at = self.last_backward
                    self.add(at, PREFETCH, p, prefetch(tid, self.op_id(at), self.op_id(p)))
                if what != "read":
                    on_host = False
                on_gpu = True
                last_gpu = p
        if persistent and not on_gpu:
            self.add(last_cpu, PREFETCH, len(self.layout.order), prefetch(tid, self.op_id(last_cpu), None))

    def fetch_per_use(self, tid: str) -> None:
        """ZeRO-Infinity's weights: in host memory, fetched ``ahead`` GPU ops before each
        run of GPU uses, dropped after it (offloaded instead when the GPU updated it)."""
        self.initial[tid] = "host"
        gpu_at = self.gpu_positions
        ahead = self.variant.ahead
        runs: list[list] = []
        for p, on_cpu, what in self.events(tid):
            writes = what != "read"
            if on_cpu:
                runs.append(["cpu", p, p, writes])
                continue
            if runs and runs[-1][0] == "gpu" and self.gpu_rank[p] - ahead <= self.gpu_rank[runs[-1][2]]:
                runs[-1][2], runs[-1][3] = p, runs[-1][3] or writes
            else:
                runs.append(["gpu", p, p, writes])
        previous = -1
        for where, first, last, writes in runs:
            if where == "cpu":
                previous = last
                continue
            early = self.gpu_rank[first] - ahead - 1
            at = max(previous, gpu_at[early] if early >= 0 else -1)
            self.add(at, PREFETCH, first, prefetch(tid, self.op_id(at), self.op_id(first)))
            if writes:
                self.add(last, OFFLOAD, last, offload(tid, self.op_id(last)))
            else:
                self.add(last, DROP, last, drop(tid, self.op_id(last)))
            previous = last


def _recompute_readers(profile: Profile, actions) -> dict[str, list[int]]:
    """Tensor -> ops before which a recompute reads it (as weights, for ZeRO-Infinity)."""
    uses: dict[str, list[int]] = {}
    for a in actions:
        if a.kind == "recompute":
            for t in profile.ops[profile.producer[a.tensor]].inputs:
                uses.setdefault(t, []).append(profile.op_index[a.before])
    return uses


def _try(sim, budget_bytes, infinity, variant, chen=None):
    """Build, score and return (key, draft parts, result) for one variant."""
    profile = sim.profile
    recompute_actions = chen or []
    builder = _Builder(profile, infinity, variant, _recompute_readers(profile, recompute_actions))
    actions, initial = builder.build()
    actions = _merge(profile, builder.layout, actions, recompute_actions)
    schedule = None if not variant.reorder else [profile.ops[i].id for i in builder.layout.order]
    cpu_ops = tuple(profile.ops[i].id for i in builder.cpu_order)
    result = score(sim, budget_bytes, actions, initial, schedule, cpu_ops)
    key = (not result.ok, result.iteration_us if result.ok else -result.progress)
    return key, (actions, initial, schedule, cpu_ops), result


def _merge(profile: Profile, layout: Layout, actions: list, recompute_actions: list) -> list:
    """The ZeRO actions with Chen's drops in issue order, then Chen's recomputes."""
    if not recompute_actions:
        return actions
    steps = [Step(layout.pos[profile.op_index[a.after]], DROP, -1, (a.tensor,), a)
             for a in recompute_actions if a.kind == "drop"]
    ordered = issue_order(steps)
    # the ZeRO actions are already in issue order: interleave by the op they follow
    at = {id(a): (-1 if a.after is None else layout.pos[profile.op_index[a.after]]) for a in actions + ordered}
    merged = sorted(actions + ordered, key=lambda a: (at[id(a)], a.kind != "drop"))
    return merged + [a for a in recompute_actions if a.kind == "recompute"]


def _segment_counts(profile: Profile) -> list[int]:
    """Chen's segment counts to try (each recomputed lazily, which fits more): powers of
    four and the paper's sqrt(n), up to n/2."""
    forward = len(forward_ops(profile))
    counts = {round(math.sqrt(forward))} | {2 * 4 ** k for k in range(6)}
    return sorted(c for c in counts if 1 <= c <= max(1, forward // 2))


def _variants(infinity: bool, ahead: int) -> list[Variant]:
    if infinity:
        distances = [(ahead, 4 * ahead)] if ahead > 0 else [(2, 4), (8, 32)]
        return [Variant(reorder=r, ahead=a, load_ahead=la) for r in (True, False) for a, la in distances]
    return [Variant(reorder=r, new_late=late) for r in (True, False) for late in (False, True)]


def _plan(profile, hardware, budget_bytes, options, infinity: bool, ahead: int, recompute: bool) -> Draft:
    name = "zero-infinity" if infinity else "zero-offload"
    if hardware.cpu is None:
        raise InputError(hardware.source or hardware.name, "cpu", f"{name} runs the optimizer on the host CPU: "
                         "the hardware needs a `cpu` section (tflops, mem_gbps, launch_us)")
    if not any(op.phase == "optimizer" for op in profile.ops):
        raise InputError("<profile>", "ops", f"{name}: profile {profile.name!r} has no optimizer ops to run on the CPU")
    tried = []
    sim = simulator_for(profile, hardware, options)

    def run(variants, chen_for=None):
        for variant in variants:
            for count, lazy in ([(None, None)] if chen_for is None else chen_for):
                chen = None if count is None else chen_actions(profile, count, lazy)[0]
                tried.append((*_try(sim, budget_bytes, infinity, variant, chen), variant,
                              None if count is None else (count, lazy)))

    def fits() -> bool:
        return any(t[2].ok for t in tried)

    for spill in ((False, True) if infinity else (False,)):
        layouts = [dataclasses.replace(v, grads_to="ssd" if spill else "host") for v in _variants(infinity, ahead)]
        start = len(tried)
        run(layouts)
        where = "gradients spilled to NVMe, " if spill else ""
        options.say(f"{name}: {where}{len(layouts)} layouts, " + ("one fits" if fits() else "none fits"))
        if recompute and not fits():
            # activations: Chen's segments on the two layouts that went furthest on the GPU
            short = sorted((t for t in tried[start:] if t[2].valid and t[2].rule != "R19"), key=lambda t: t[0])[:2]
            run([t[3] for t in short], [(c, True) for c in _segment_counts(profile)])
            options.say(f"{name}: {where}with Chen's segments, " + ("one fits" if fits() else "none fits"))
        if fits() or not any(t[2].rule == "R19" and "host" in (t[2].reason or "") for t in tried[start:]):
            break   # spilling gradients helps only when host memory is what is short
    key, (actions, initial, schedule, cpu_ops), result, variant, chen = min(tried, key=lambda t: t[0])
    notes = {"variant": {"reorder": variant.reorder, **({"ahead": variant.ahead, "load_ahead": variant.load_ahead}
                                                        if infinity else {"new_after_backward": variant.new_late})},
             "chen_segments": None if chen is None else {"segments": chen[0], "lazy": chen[1]},
             "cpu_ops": len(cpu_ops), "plans_simulated": len(tried),
             "where_time_goes_us": {"iteration": result.iteration_us, "gpu_compute": result.compute_us,
                                    "recompute": result.recompute_us, "cpu": result.cpu_us,
                                    "gpu_stalls": result.stall_us, "tail": result.tail_us},
             "host_peak_bytes": result.host_peak_bytes, "ssd_peak_bytes": result.ssd_peak_bytes}
    return Draft(actions=actions, schedule=schedule, initial=initial, cpu_ops=cpu_ops, notes=notes)


@register(
    "zero-offload",
    "ZeRO-Offload: the optimizer step on the CPU with states in host memory; gradients down as "
    "backward makes them, new low-precision weights up; Chen's checkpointing if activations do not fit.",
    params=(Param("recompute", True, "add Chen's activation checkpointing when no layout fits"),),
    moves_persistent=True,
    recomputes=True,
    cpu_phases=("optimizer",),
    paper="Ren et al., ZeRO-Offload: Democratizing Billion-Scale Model Training, USENIX ATC 2021",
    family="CPU offload",
)
def plan_zero_offload(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, recompute=True):
    return _plan(profile, hardware, budget_bytes, options, infinity=False, ahead=0, recompute=recompute)


@register(
    "zero-infinity",
    "ZeRO-Infinity: the whole optimizer step on the CPU, its state on NVMe (loaded and stored around "
    "each step), weights in host memory fetched before each use; Chen's checkpointing if needed.",
    params=(Param("ahead", 0, "fetch each weight this many ops before its use (0: try 1, 4 and 16)",
                  low=0, high=100_000),
            Param("recompute", True, "add Chen's activation checkpointing when no layout fits")),
    moves_persistent=True,
    recomputes=True,
    cpu_phases=("optimizer",),
    paper="Rajbhandari et al., ZeRO-Infinity: Breaking the GPU Memory Wall for Extreme Scale Deep Learning, "
          "SC 2021",
    family="CPU offload",
)
def plan_zero_infinity(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, ahead=0, recompute=True):
    return _plan(profile, hardware, budget_bytes, options, infinity=True, ahead=ahead, recompute=recompute)
