"""``PlannedInterpreter``: one training step, node by node, following a plan.

The step is the bound FX graph (runtime/bindings.py) run for real. Its kernel nodes run
in the profile's op order, one profile op at a time (``fx.nodes``: usually one node; the
nodes of a mixed-precision optimizer part; a ``_foreach_*`` kernel's ``slot`` for the
per-parameter optimizer ops, ``foreach_split``); an ``inplace_accumulate`` op runs its
``add`` in place into its first argument, as the profile counts it. Nodes that run no op
(views, ``getitem``, allocations, profiler markers) are evaluated when a kernel needs
them, so a view is made only while its storage is present, and unused ones never.

Memory is accounted in pools: "GPU" (the budget), host and SSD. A tensor is its storage:
a copy out is a clone of the storage (host) or a file (SSD), and releasing the GPU copy
resizes the storage to 0 bytes, which frees its memory while every view of it stays
valid; a copy in resizes it back and copies the bytes in. The GPU pool's live bytes are
the ``nbytes`` of the storages it holds (checked against the profile's bytes when made)
plus, while an op runs, the storages its nodes make that are no profile tensor (the
optimizer's ``sqrt(exp_avg_sq)``, the other outputs of a recomputed multi-output op,
which R15 counts as the recompute's scratch).

When things happen: a CPU has no copy engines to run copies beside the kernels, so the
emulation takes its clock from the simulator's timeline of the same plan (docs/
simulation.md): every compute item starts and ends, and every copy starts and ends, at
its simulated instant, and what happens at one instant follows R9 (completions, then the
compute item, then the copies). So prefetches wait for memory and the next op gets
memory first (R6, R12) exactly as simulated. What happens at each point is decided here,
from the plan, as a runtime decides it (executor/program.py reads the plan): R7 frees at
last use, R11 an offload's GPU copy goes when the copy and the last read in its window
have ended, R14 drops, R15 recomputes (a random producer replays the RNG state of its
first run), R16 stale copies, R19 host copies, R20 steady state. Every use checks that
the tensor is on the GPU and has arrived; a break is a ``RuntimeFailure``.

A plan the simulator finds invalid or infeasible is refused before anything runs
(``PlanRefused``).
"""
from __future__ import annotations

import operator
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from executor.program import Copy, Drop, lower as read_plan
from simulator.api import Simulator
from simulator.errors import InputError, SwapplanError
from simulator.hardware import Hardware, load_hardware
from simulator.plan import Plan, empty_plan

from tracer.pytorch.node_identity import flat_tensors
from tracer.pytorch.values import Values

from .bindings import Bindings


class PlanRefused(SwapplanError):
    """The simulator finds the plan invalid (it breaks a rule) or infeasible (it does not
    fit the budget): it is not run. ``result`` is the simulator's Result."""

    def __init__(self, result):
        self.result = result
        what = "invalid" if not result.valid else "infeasible"
        where = ", ".join(f"{k} {v}" for k, v in (("op", result.op), ("tensor", result.tensor)) if v)
        super().__init__(f"plan refused: the simulator finds it {what} ({result.rule}"
                         f"{': ' + where if where else ''}): {result.reason}")


class RuntimeFailure(SwapplanError):
    """The run broke where the simulator said it would not (a use of a tensor that is not
    on the GPU, a copy with no source, a size that differs from the profile's)."""


@dataclass
class StepReport:
    """What one planned step measured."""
    loss: object                 # the returned loss (a 0-dim tensor)
    peak_bytes: int              # the GPU pool's peak
    peak_at: str                 # the op (or copy) at which it was reached
    host_peak_bytes: int
    ssd_peak_bytes: int
    actions_applied: int
    temporaries_bytes: int       # most bytes of non-profile storages an op held
    seconds: float
    recompute_extra_bytes: int = 0   # most bytes of other outputs a recompute made (R15 counts them)
    size_mismatches: list = field(default_factory=list)   # tensors whose storage differs from the profile


def _storage_bytes(storage):
    """A uint8 tensor over a whole storage (for SSD files)."""
    import torch
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _write_file(storage, path: str) -> None:
    """An SSD copy: the bytes through a host staging buffer (numpy must not share the
    storage itself: that would make it impossible to resize)."""
    _storage_bytes(storage.clone()).numpy().tofile(path)


# ops that read only their first argument's shape, dtype and strides (``_value``)
SHAPE_ONLY = frozenset(f"aten.{name}.default" for name in (
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "new_empty", "new_zeros",
    "new_ones", "new_full"))


def _has_meta(node) -> bool:
    return hasattr(node, "meta") and node.meta.get("tensor_meta") is not None


def _stand_in(node):
    """An uninitialised tensor with the traced shape, dtype and strides of ``node``'s value."""
    import torch
    meta = node.meta["tensor_meta"]
    return torch.empty_strided(tuple(meta.shape), tuple(meta.stride), dtype=meta.dtype)


class PlannedInterpreter:
    """Runs steps of ``bindings``' graph following ``plan`` (None: the empty plan, every
    tensor stays on the GPU), within ``budget_bytes`` (None: the plan's, else the
    GPU's), timed by the simulator on ``hardware`` (None: the profile's preset).

    A ``schedule`` is followed (the compute sequence is the plan's) as long as it keeps
    the random ops in the profile's order: they draw from one generator, in order.

    Raises InputError for a plan the runtime cannot follow (ops on the CPU, managed
    memory, a schedule that reorders random ops) or that does not fit the profile, and PlanRefused for one
    the simulator finds invalid or infeasible; neither runs anything.
    """

    def __init__(self, bindings: Bindings, plan: Plan | None = None, hardware: Hardware | str | None = None,
                 budget_bytes: int | None = None, workdir: str | None = None):
        profile = bindings.profile
        self.bindings = bindings
        self.profile = profile
        hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware or bindings.hardware)
        self.hardware = hw
        self.plan = plan if plan is not None else empty_plan(profile)
        if self.plan.uses_cpu:
            raise InputError("<plan>", "cpu_ops",
                             "the runtime runs every op on the GPU; plans with ops on the CPU are not followed")
        if self.plan.uses_codecs:
            raise InputError("<plan>", "actions", "the runtime moves tensors as they are; plans with codecs "
                                                  "(compressed transfers, encode, decode) are not followed yet")
        if self.plan.splits:
            ops = ", ".join(f"{op_id} in {k}" for op_id, k in sorted(self.plan.splits.items()))
            raise InputError("<plan>", "splits", f"the runtime runs every op whole; it cannot run split ops (R54) "
                                                 f"yet: {ops}. `swapplan simulate` scores this plan")
        if getattr(self.plan, "memory", "explicit") != "explicit":
            raise InputError("<plan>", "memory", f"the runtime follows explicit copies; {self.plan.memory!r} "
                                                 "(managed memory) plans are not followed")
        if self.plan.schedule is not None:
            random = [op.id for op in profile.ops if op.fx is not None and op.fx.random]
            chosen = set(random)
            if [op_id for op_id in self.plan.schedule if op_id in chosen] != random:
                raise InputError("<plan>", "schedule", "the plan reorders random ops: the runtime follows "
                                                       "schedules that keep them in the profile's order (the "
                                                       "RNG draws in that order)")
        self.simulator = Simulator(profile, hw)
        result = self.simulator.simulate(self.plan, budget_bytes, record=True)
        if not result.ok:
            raise PlanRefused(result)
        self.result = result
        self.budget_bytes = result.budget_bytes
        self.rplan = read_plan(profile, self.plan, hw)
        self.events = _timed_events(result, self.rplan, profile)
        self.releases: dict[int, list[Copy]] = {}
        for copy in self.rplan.copies:
            if copy.kind == "offload" and copy.last_reader >= 0:
                self.releases.setdefault(copy.last_reader, []).append(copy)
        self.initial = dict(self.plan.initial)
        self.kernel_nodes = bindings.kernel_nodes
        self.input_index = {node: i for i, node in enumerate(bindings.placeholders)}
        self.persistent_ids = [t.id for t in profile.tensors if t.persistent]
        self._workdir = workdir
        self._tmp = None
        self._recompute_extra = None
        self.replay_rng = True          # False only to show what replaying the RNG is for (tests)
        self.host_copies: dict = {}     # tensor -> host storage (survives steps for `initial` tensors)
        self.ssd_files: dict = {}       # tensor -> path

    # ------------------------------------------------------------------ public

    def run(self, values: Values, steps: int = 1) -> list[StepReport]:
        """Run ``steps`` steps on ``values`` (updated in place, as the graph updates its
        inputs). Tensors the plan starts off the GPU (``initial``) are moved there before
        the first step and back after the last (neither counted)."""
        reports = []
        self._place_initial(values)
        try:
            for _ in range(steps):
                reports.append(self.step(values))
        except BaseException:
            self._recover()
            raise
        finally:
            self._restore_initial(values)
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None
        return reports

    def step(self, values: Values) -> StepReport:
        """One step (the ``initial`` tensors already off the GPU, see ``run``)."""
        import torch
        started = time.perf_counter()
        self._begin(values)
        with torch.no_grad():
            for _, what, arg in self.events:
                if what == "start":
                    self._item_start(arg)
                elif what == "end":
                    self._item_end(arg)
                elif what == "copy_start":
                    self._copy_start(arg)
                else:
                    self._copy_end(arg)
        self._finish()
        seconds = time.perf_counter() - started
        report = StepReport(loss=self.loss, peak_bytes=self.peak, peak_at=self.peak_at,
                            host_peak_bytes=self.host_peak, ssd_peak_bytes=self.ssd_peak,
                            actions_applied=self.applied, temporaries_bytes=self.temp_peak, seconds=seconds,
                            recompute_extra_bytes=self.extra_peak,
                            size_mismatches=list(self.mismatches))
        self.env = {}
        return report

    # ------------------------------------------------------------------ state

    def _begin(self, values: Values) -> None:
        flat = values.flat()
        b = self.bindings
        self.env = {node: value for node, value in zip(b.placeholders, flat)}
        self.storages = {}
        for tid in self.persistent_ids:
            node = b.tensors[tid].node
            self.storages[tid] = flat[self.input_index[node]].untyped_storage()
        self.known = {st._cdata for st in self.storages.values()}
        self.gpu: dict[str, int] = {}
        self.live = self.peak = 0
        self.peak_at = "start"
        self.temp = self.temp_peak = self.extra_peak = 0
        self.temps: list = []           # (node, slot) of this op's non-profile values
        self.incoming: set[str] = set()
        self.pending: dict[str, int] = {}
        self.dead_pending: set[str] = set()
        self.ended: set[int] = set()
        self.done: set[int] = set()
        self.rng: dict = {}
        self.applied = 0
        self.loss = None
        self.mismatches: list[str] = []
        self.valid: dict[str, set] = {"host": set(), "ssd": set()}
        self.host_live = self.host_peak = self.ssd_live = self.ssd_peak = 0
        for tid, tier in self.initial.items():
            self.valid[tier].add(tid)
            self._tier_add(tid, tier)
        for tid in self.persistent_ids:
            if tid not in self.initial:
                self._gpu_add(tid, self.storages[tid].nbytes(), "start")
        for step in self.rplan.at_start:
            if isinstance(step, Copy) and step.kind == "offload":
                self.pending[step.tensor] = self.pending.get(step.tensor, 0) + 1

    def _finish(self) -> None:
        """R20 and R19 at the end of the iteration."""
        for tid in self.persistent_ids:
            if tid in self.initial:
                if tid in self.gpu or tid not in self.valid[self.initial[tid]]:
                    raise RuntimeFailure(f"tensor {tid} started in {self.initial[tid]} memory and is not back "
                                         "there (only) at the end of the step (R20)")
            elif tid not in self.gpu:
                raise RuntimeFailure(f"tensor {tid} started on the GPU and is not there at the end of the step (R20)")
        left = [tid for tid in self.gpu if not self.profile.tensor_by_id[tid].persistent]
        if left:
            raise RuntimeFailure(f"tensor {left[0]} is still on the GPU at the end of the step")
        for tid in list(self.host_copies):
            if tid not in self.initial:
                self._tier_drop(tid)
        for tid in list(self.ssd_files):
            if tid not in self.initial:
                self._tier_drop(tid)

    # ------------------------------------------------------------------ pools

    def _gpu_add(self, tid: str, nbytes: int, where: str) -> None:
        self.gpu[tid] = nbytes
        self.live += nbytes
        self._peak(where)

    def _peak(self, where: str) -> None:
        if self.live + self.temp > self.peak:
            self.peak = self.live + self.temp
            self.peak_at = where

    def _gpu_free(self, tid: str) -> None:
        nbytes = self.gpu.pop(tid, None)
        if nbytes is None:
            return
        self.storages[tid].resize_(0)
        self.live -= nbytes

    def _tier_add(self, tid: str, tier: str) -> None:
        nbytes = self.profile.tensor_by_id[tid].bytes
        if tier == "host":
            self.host_live += nbytes
            self.host_peak = max(self.host_peak, self.host_live)
        else:
            self.ssd_live += nbytes
            self.ssd_peak = max(self.ssd_peak, self.ssd_live)

    def _tier_drop(self, tid: str) -> None:
        """A tensor's host and SSD copies go (it is dead, or the iteration ended)."""
        nbytes = self.profile.tensor_by_id[tid].bytes
        if self.host_copies.pop(tid, None) is not None:
            self.host_live -= nbytes
        path = self.ssd_files.pop(tid, None)
        if path is not None:
            self.ssd_live -= nbytes
            os.unlink(path)
        self.valid["host"].discard(tid)
        self.valid["ssd"].discard(tid)

    def _copy_out(self, tid: str, tier: str) -> None:
        """Write the GPU copy of ``tid`` to ``tier`` (R19: a second copy to a tier reuses
        its space)."""
        storage = self.storages[tid]
        if tier == "host":
            if tid not in self.host_copies:
                self._tier_add(tid, "host")
            self.host_copies[tid] = storage.clone()
        else:
            if tid not in self.ssd_files:
                self._tier_add(tid, "ssd")
                self.ssd_files[tid] = os.path.join(self._ssd_dir(), f"{tid}.bin")
            _write_file(storage, self.ssd_files[tid])

    def _copy_in(self, tid: str, tier: str) -> None:
        import numpy as np
        import torch
        storage = self.storages[tid]
        storage.resize_(self.profile.tensor_by_id[tid].bytes)
        if tier == "host":
            storage.copy_(self.host_copies[tid])
        else:
            data = torch.from_numpy(np.fromfile(self.ssd_files[tid], dtype=np.uint8))
            _storage_bytes(storage).copy_(data)

    def _ssd_dir(self) -> str:
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="swapplan-ssd-", dir=self._workdir)
        return self._tmp

    def _place_initial(self, values: Values) -> None:
        """Tensors the plan starts in host or SSD memory go there before the first step."""
        flat = values.flat()
        for tid, tier in self.initial.items():
            node = self.bindings.tensors[tid].node
            storage = flat[self.input_index[node]].untyped_storage()
            if tier == "host":
                self.host_copies[tid] = storage.clone()
            else:
                self.ssd_files[tid] = os.path.join(self._ssd_dir(), f"{tid}.bin")
                _write_file(storage, self.ssd_files[tid])
            storage.resize_(0)

    def _recover(self) -> None:
        """After a failed step: put back the persistent tensors that were away (their
        last copy), so that the caller's values are whole again."""
        for tid in getattr(self, "persistent_ids", ()):
            if tid in self.initial or tid in getattr(self, "gpu", {tid: 0}):
                continue
            for tier, copies in (("host", self.host_copies), ("ssd", self.ssd_files)):
                if tid in copies:
                    self._copy_in(tid, tier)
                    break

    def _restore_initial(self, values: Values) -> None:
        """Bring the ``initial`` tensors back into their storages (after the last step)."""
        flat = values.flat()
        for tid, tier in self.initial.items():
            node = self.bindings.tensors[tid].node
            self.storages[tid] = flat[self.input_index[node]].untyped_storage()
            if tid in self.host_copies or tid in self.ssd_files:
                self._copy_in(tid, tier)
            self.host_copies.pop(tid, None)
            path = self.ssd_files.pop(tid, None)
            if path is not None:
                os.unlink(path)

    # ------------------------------------------------------------------ compute items

    def _item_start(self, k: int) -> None:
        seq, profile = self.rplan.seq, self.profile
        op = profile.ops[seq.op_index[k]]
        recomputed = seq.recomputed[k]
        name = self.rplan.item_name(k)
        for copy in self.rplan.waits.get(k, ()):
            if copy.index not in self.ended:
                raise RuntimeFailure(f"{name} starts before the {copy.describe()} has ended")
        touched = op.inputs + op.updates if recomputed is None else seq.reads.get(k, op.inputs)   # R60: its reads
        for tid in touched:
            if tid not in self.gpu or tid in self.incoming:
                state = "still arriving" if tid in self.incoming else "not on the GPU"
                raise RuntimeFailure(f"{name} reads tensor {tid}, which is {state}")
        self.temps = []
        if op.collective is not None:   # R56: a rank's collective (runtime/rank.py runs them)
            for tid in op.updates:
                self.valid["host"].discard(tid)
                self.valid["ssd"].discard(tid)
            self._run_collective(op, name)
            self._measure_temporaries(name)
            return
        binding = self.bindings.ops[op.id]
        self._before_op(op, k)
        if recomputed is None:
            for tid in op.updates:   # R16: host and SSD copies go stale
                self.valid["host"].discard(tid)
                self.valid["ssd"].discard(tid)
            self._run_op(binding)
            for tid in op.outputs:
                self._register(tid, name)
        else:
            self._recompute(recomputed, binding, name)
            self.applied += 1
        self._after_op(op, k)
        self._measure_temporaries(name)

    # hooks for one rank of a data-parallel run (runtime/rank.py)

    def _before_op(self, op, k: int) -> None:
        """Before op's nodes run (or its recompute, item ``k``): nothing on one GPU."""

    def _after_op(self, op, k: int) -> None:
        """After op's nodes ran (item ``k``): nothing on one GPU."""

    def _run_collective(self, op, name: str) -> None:
        raise RuntimeFailure(f"{name} is a collective ({op.collective.kind}): run a rank's profile with "
                             "runtime.rank.RankInterpreter")

    def _item_end(self, k: int) -> None:
        seq = self.rplan.seq
        op_id = self.profile.ops[seq.op_index[k]].id
        if seq.recomputed[k] is None and op_id == self.bindings.output_producer:
            self._snapshot_loss()
        self._drop_temporaries()
        self.done.add(k)
        for tid in seq.frees[k]:                       # R7
            if self.pending.get(tid):
                self.dead_pending.add(tid)
            else:
                self._gpu_free(tid)
                self._tier_drop(tid)
        for copy in self.releases.get(k, ()):          # R11
            if copy.index in self.ended:
                self._gpu_free(copy.tensor)
        for step in self.rplan.after_item.get(k, ()):  # R14 drops now; copies are enqueued
            if isinstance(step, Drop):
                if step.tensor not in self.gpu:
                    raise RuntimeFailure(f"drop of {step.tensor} after {step.after}: it is not on the GPU")
                self._gpu_free(step.tensor)
                self.applied += 1
            elif step.kind == "offload":
                self.pending[step.tensor] = self.pending.get(step.tensor, 0) + 1

    # ------------------------------------------------------------------ copies

    def _copy_start(self, copy: Copy) -> None:
        tid = copy.tensor
        if copy.kind == "offload":
            if tid not in self.gpu or tid in self.incoming:
                raise RuntimeFailure(f"the {copy.describe()} starts while {tid} is not on the GPU")
            self._copy_out(tid, copy.tier)
        else:
            if tid not in self.valid[copy.tier]:
                raise RuntimeFailure(f"the {copy.describe()} starts with no valid copy in {copy.tier}")
            if tid in self.gpu:
                raise RuntimeFailure(f"the {copy.describe()} starts while {tid} is still on the GPU")
            self._copy_in(tid, copy.tier)
            self.incoming.add(tid)
            self._gpu_add(tid, self.storages[tid].nbytes(), f"prefetch {tid}")

    def _copy_end(self, copy: Copy) -> None:
        tid = copy.tensor
        self.ended.add(copy.index)
        self.applied += 1
        if copy.kind == "prefetch":
            self.incoming.discard(tid)
            return
        self.valid[copy.tier].add(tid)
        self.pending[tid] -= 1
        if copy.last_reader < 0 or copy.last_reader in self.done:   # R11
            self._gpu_free(tid)
        if tid in self.dead_pending and not self.pending[tid]:     # R7: dead, its offload over
            self.dead_pending.discard(tid)
            self._gpu_free(tid)
            self._tier_drop(tid)

    # ------------------------------------------------------------------ running nodes

    def _value(self, node):
        """A node's value: run already (a kernel, a placeholder), or evaluated now (a view,
        getitem, allocation) from its arguments and kept."""
        env = self.env
        if node in env:
            return env[node]
        if node.op == "get_attr":   # a constant the trace captured (not a profile tensor)
            value = env[node] = getattr(self.bindings.graph_module, node.target)
            return value
        if node in self.kernel_nodes or node.op != "call_function":
            raise RuntimeFailure(f"graph node {node.name} is needed before the op that runs it")
        if str(node.target) in SHAPE_ONLY and node.args and _has_meta(node.args[0]) and node.args[0] not in env:
            # reads only its first argument's shape, dtype and strides: the profile records no
            # dependency on it (a dropout mask's empty_like of the attention probabilities), so a
            # schedule (R21) may run it first; the traced metadata stands in for a value not made yet
            rest, kwargs = self._args(node, None, skip_first=True)
            args = [_stand_in(node.args[0]), *rest]
        else:
            args, kwargs = self._args(node, None)
        value = node.target(*args, **kwargs)
        env[node] = value
        self.temps.append((node, None))
        return value

    def _args(self, node, slot, skip_first: bool = False):
        from torch.fx import Node

        def conv(a):
            if isinstance(a, Node):
                return self._value(a)
            if isinstance(a, (list, tuple)):
                return type(a)(conv(x) for x in a)
            if isinstance(a, dict):
                return {k: conv(v) for k, v in a.items()}
            return a

        def top(a):
            if slot is not None and isinstance(a, (list, tuple)):
                return [conv(a[slot])]          # one element of a foreach list
            return conv(a)
        return [top(a) for a in node.args[1 if skip_first else 0:]], {k: top(v) for k, v in node.kwargs.items()}

    def _run_op(self, binding) -> None:
        import torch
        for node in binding.nodes:
            if binding.slot is not None:
                args, kwargs = self._args(node, binding.slot)
                out = node.target(*args, **kwargs)
                if isinstance(out, (list, tuple)) and out:
                    self.env.setdefault(node, {})[binding.slot] = out[0]
                    self.temps.append((node, binding.slot))
                continue
            args, kwargs = self._args(node, None)
            if binding.rewrite == "inplace_accumulate":
                self.env[node] = torch.ops.aten.add_.Tensor(args[0], *args[1:], **kwargs)
                continue
            if binding.random:
                self.rng[node] = torch.get_rng_state()
            self.env[node] = node.target(*args, **kwargs)
            self.temps.append((node, None))

    def _register(self, tid: str, where: str) -> None:
        """The storage of an output the op just made: remembered, counted, checked."""
        b = self.bindings.tensors[tid]
        value = self.env.get(b.node)
        if value is None:
            raise RuntimeFailure(f"{where}: graph node {b.node.name} (the storage of {tid}) did not run")
        tensors = flat_tensors(value)
        storage = tensors[b.output or 0].untyped_storage()
        self.storages[tid] = storage
        self.known.add(storage._cdata)
        nbytes = storage.nbytes()
        if nbytes != self.profile.tensor_by_id[tid].bytes:
            self.mismatches.append(tid)
        self._gpu_add(tid, nbytes, where)

    def _recompute(self, tid: str, binding, where: str) -> None:
        """R15: run the producer again into the tensor's own storage (its RNG state
        replayed). A multi-output producer makes its other outputs again too: they are
        temporaries of the recompute, counted in the pool while it runs, as R15 counts them
        (``recompute_extra_bytes``: the most such bytes one recompute held)."""
        import torch
        if len(binding.nodes) != 1 or binding.slot is not None or binding.rewrite is not None:
            raise RuntimeFailure(f"{where}: op {binding.op} runs several graph nodes and cannot be recomputed")
        node = binding.nodes[0]
        storage = self.storages[tid]
        storage.resize_(self.profile.tensor_by_id[tid].bytes)
        self._gpu_add(tid, storage.nbytes(), where)
        args, kwargs = self._args(node, None)
        current = None
        if binding.random and self.replay_rng:
            if node not in self.rng:
                raise RuntimeFailure(f"{where}: the random op {node.name} has not run before (no RNG state)")
            current = torch.get_rng_state()
            torch.set_rng_state(self.rng[node])
        try:
            out = node.target(*args, **kwargs)
        finally:
            if current is not None:
                torch.set_rng_state(current)
        b = self.bindings.tensors[tid]
        made = flat_tensors(out)
        if b.node is node:
            fresh = made[b.output or 0].untyped_storage()
            if fresh._cdata != storage._cdata:
                storage.copy_(fresh)   # a runtime would write it in place: this copy is not counted
            made = [t for t in made if t.untyped_storage()._cdata != fresh._cdata]
        self._recompute_extra = made   # the producer's other outputs: temporaries of the recompute
        seen = {}
        for t in made:
            st = t.untyped_storage()
            if st._cdata not in self.known:
                seen[st._cdata] = st.nbytes()
        self.extra_peak = max(self.extra_peak, sum(seen.values()))
        self.temps.append(("recompute", None))

    def _measure_temporaries(self, where: str) -> None:
        """Bytes of the storages the op's nodes made that are no profile tensor (held to
        the op's end), added to the GPU pool while the op runs."""
        seen, total = set(), 0
        for node, slot in self.temps:
            if node == "recompute":
                value = self._recompute_extra
            else:
                value = self.env.get(node)
                if slot is not None and isinstance(value, dict):
                    value = value.get(slot)
            for t in flat_tensors(value):
                st = t.untyped_storage()
                if st._cdata in self.known or st._cdata in seen:
                    continue
                seen.add(st._cdata)
                total += st.nbytes()
        self.temp = total
        self.temp_peak = max(self.temp_peak, total)
        self._peak(where)

    def _drop_temporaries(self) -> None:
        """The op has ended: its temporaries go (the values holding them are forgotten)."""
        if self.temp:
            for node, slot in self.temps:
                if node == "recompute":
                    continue
                value = self.env.get(node)
                if slot is not None and isinstance(value, dict):
                    value = value.get(slot)
                if any(t.untyped_storage()._cdata not in self.known for t in flat_tensors(value)
                       if t.untyped_storage().nbytes()):
                    if slot is not None:
                        self.env[node].pop(slot, None)
                    else:
                        self.env.pop(node, None)
        self._recompute_extra = None
        self.temps = []
        self.temp = 0

    def _snapshot_loss(self) -> None:
        import torch.fx
        output = next(n for n in self.bindings.graph_module.graph.nodes if n.op == "output")
        value = torch.fx.node.map_arg(output.args, self._value)
        tensors = flat_tensors(value)
        self.loss = tensors[0].detach().clone() if tensors else None


def _timed_events(result, rplan, profile) -> list:
    """The plan's points in the simulator's time, ordered as R9 orders one instant:
    compute ends, copy ends, the compute item, copy starts (a zero-length item starts
    and ends in its place)."""
    spans = result.timeline.spans
    seq = rplan.seq
    on_comm = [k for k in range(len(seq))
               if seq.recomputed[k] is None and profile.ops[seq.op_index[k]].collective is not None]
    comm = set(on_comm)
    items = [k for k in range(len(seq)) if k not in comm] + on_comm   # GPU items in order, then the comm stream's
    compute = [s for s in spans if s.track == "compute"] + [s for s in spans if s.track == "comm"]
    if len(compute) != len(seq):
        raise RuntimeFailure(f"the simulated timeline has {len(compute)} compute items, the plan {len(seq)}")
    events = []
    for k, span in zip(items, compute):
        if span.args.get("op") != profile.ops[seq.op_index[k]].id:
            raise RuntimeFailure(f"the simulated timeline runs {span.args.get('op')} where the plan runs "
                                 f"{rplan.item_name(k)}")
        events.append(((span.start_us, 2, k, 0), "start", k))
        end_key = (span.end_us, 2, k, 1) if span.end_us <= span.start_us else (span.end_us, 0, k, 0)
        events.append((end_key, "end", k))
    by_key: dict = {}
    for copy in rplan.copies:
        by_key.setdefault((copy.kind, copy.tensor, copy.tier), []).append(copy)
    spans_by_key: dict = {}
    for span in spans:
        if span.track in ("compute", "cpu", "comm"):
            continue
        a = span.args
        for tensor in a.get("members", (a["tensor"],)):   # a group (R53): its members copy together
            spans_by_key.setdefault((a["kind"], tensor, a["tier"]), []).append(span)
    if sum(map(len, spans_by_key.values())) != len(rplan.copies):
        raise RuntimeFailure("the simulated timeline and the plan have different copies")
    for key, copies in by_key.items():
        copies.sort(key=lambda c: (c.issue_item, c.action))
        timed = sorted(spans_by_key.get(key, ()), key=lambda s: s.start_us)
        if len(timed) != len(copies):
            raise RuntimeFailure(f"the simulated timeline and the plan have different copies of {key[1]}")
        for copy, span in zip(copies, timed):
            order = (copy.issue_item, copy.action)
            events.append(((span.start_us, 3, order, 0), "copy_start", copy))
            events.append(((span.end_us, 1, order, 0), "copy_end", copy))
    events.sort(key=operator.itemgetter(0))
    return events


def reference_step(bindings: Bindings, values: Values):
    """The unplanned step: the bound graph called as a whole (``GraphModule.__call__``),
    foreach kernels unsplit, the out-of-place adds out of place. Updates ``values`` in
    place and returns the loss."""
    import torch
    with torch.no_grad():
        out = bindings.graph_module(values.params, values.buffers, values.states, values.batch)
    tensors = flat_tensors(out)
    return tensors[0].detach().clone() if tensors else None
