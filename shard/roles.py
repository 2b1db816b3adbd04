"""What the tensors and ops of a one-GPU profile are to data parallelism.

- the **pass** of each op: ``optimizer`` for the step's ops, else ``forward`` before the
  first backward op and ``backward`` from it on;
- the **parameters**: weights an optimizer op updates (directly, or, under mixed
  precision, the copy back from the master weights); other weights (buffers such as batch
  norm's running statistics, frozen weights) stay whole on every rank;
- the **optimizer state** (kind ``optimizer_state``, fp32 master weights included);
- the **weight gradients**: gradients an optimizer op reads that an op before the step
  makes, each *ready* at the last op outside the step that writes it (its producer, or
  the last accumulation into it, as for tied weights);
- for each weight gradient, the parameters the optimizer op reading it steps, followed
  through the step's dataflow for a few hops (master weights, cast, copy back); empty
  where that is ambiguous (one foreach op over every tensor).
"""
from __future__ import annotations

from dataclasses import dataclass

from simulator.profile import Profile

FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
_HOPS = 3          # how far the step's dataflow is followed from a gradient to its parameter
_MAX_REACHED = 16  # past this many ops the trail is ambiguous (a foreach step over everything)


@dataclass(frozen=True)
class Roles:
    passes: tuple[str, ...]                    # per op: forward, backward or optimizer
    params: tuple[str, ...]                    # in tensor order
    buffers: tuple[str, ...]                   # weights no optimizer op updates
    opt_states: tuple[str, ...]
    grads: tuple[str, ...]                     # weight gradients, in tensor order
    ready: dict[str, int]                      # weight gradient -> the last op before the step writing it
    grad_params: dict[str, tuple[str, ...]]    # weight gradient -> the parameters its step updates (may be ())
    last_update: dict[str, int]                # parameter -> the last optimizer op updating it

    @property
    def param_set(self) -> frozenset[str]:
        return frozenset(self.params)

    @property
    def grad_set(self) -> frozenset[str]:
        return frozenset(self.grads)

    def readers(self, profile: Profile, tid: str) -> list[int]:
        """The ops outside the step that read or update ``tid``, in order."""
        found = set(profile.consumers.get(tid, ())) | set(profile.updaters.get(tid, ()))
        return sorted(i for i in found if self.passes[i] != OPTIMIZER)


def op_passes(profile: Profile) -> tuple[str, ...]:
    first_backward = next((i for i, op in enumerate(profile.ops) if op.phase == "backward"), len(profile.ops))
    return tuple(OPTIMIZER if op.phase == "optimizer" else FORWARD if i < first_backward else BACKWARD
                 for i, op in enumerate(profile.ops))


def find_roles(profile: Profile) -> Roles:
    ops, tensors = profile.ops, profile.tensor_by_id
    passes = op_passes(profile)
    last_update: dict[str, int] = {}
    grads_read: dict[str, None] = {}
    for i, op in enumerate(ops):
        if passes[i] != OPTIMIZER:
            continue
        for tid in op.updates:
            if tensors[tid].kind == "weight":
                last_update[tid] = i
        for tid in (*op.inputs, *op.updates):
            tensor = tensors[tid]
            made = profile.producer.get(tid)
            if tensor.kind == "gradient" and made is not None and passes[made] != OPTIMIZER:
                grads_read[tid] = None
    params = tuple(t.id for t in profile.tensors if t.id in last_update)
    buffers = tuple(t.id for t in profile.tensors if t.kind == "weight" and t.id not in last_update)
    opt_states = tuple(t.id for t in profile.tensors if t.kind == "optimizer_state")
    grads = tuple(t.id for t in profile.tensors if t.id in grads_read)
    ready = {}
    for g in grads:
        writers = [profile.producer[g], *(i for i in profile.updaters.get(g, ()) if passes[i] != OPTIMIZER)]
        ready[g] = max(writers)
    return Roles(passes=passes, params=params, buffers=buffers, opt_states=opt_states, grads=grads,
                 ready=ready, grad_params=_grad_params(profile, passes, frozenset(grads), frozenset(params)),
                 last_update=last_update)


def _grad_params(profile: Profile, passes, grads: frozenset, params: frozenset) -> dict[str, tuple[str, ...]]:
    """Weight gradient -> the parameters the optimizer op reading it updates, through at
    most _HOPS later optimizer ops reading what it writes; () when the trail reaches
    more than _MAX_REACHED ops."""
    ops = profile.ops
    step_readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        if passes[i] == OPTIMIZER:
            for tid in dict.fromkeys((*op.inputs, *op.updates)):
                step_readers.setdefault(tid, []).append(i)
    found: dict[str, dict[str, None]] = {}
    for i, op in enumerate(ops):
        if passes[i] != OPTIMIZER:
            continue
        read = [tid for tid in dict.fromkeys((*op.inputs, *op.updates)) if tid in grads]
        if not read:
            continue
        reached = _reach(ops, i, step_readers)
        stepped = [tid for tid in reached if tid in params] if reached is not None else []
        for g in read:
            found.setdefault(g, {}).update(dict.fromkeys(stepped))
    return {g: tuple(ps) for g, ps in found.items()}


def _reach(ops, start: int, step_readers: dict) -> list[str] | None:
    """The tensors op ``start`` writes and those later optimizer ops reading them write,
    _HOPS deep; None past _MAX_REACHED ops."""
    seen_ops = {start}
    written = dict.fromkeys((*ops[start].updates, *ops[start].outputs))
    frontier = list(written)
    for _ in range(_HOPS):
        following = []
        for tid in frontier:
            for j in step_readers.get(tid, ()):
                if j <= start or j in seen_ops:
                    continue
                seen_ops.add(j)
                if len(seen_ops) > _MAX_REACHED:
                    return None
                for out in (*ops[j].updates, *ops[j].outputs):
                    if out not in written:
                        written[out] = None
                        following.append(out)
        frontier = following
    return list(written)
