"""``flashneuron``: FlashNeuron phase 1, forward activations offloaded to the SSD.

Follows Bae et al., "FlashNeuron: SSD-Enabled Large-Batch Training of Very Deep Neural
Networks", FAST 2021: its offloading policy, phase 1 (offload without compression), in
the form of the public re-implementation of phase 1 that G10's artifact uses as its
FlashNeuron baseline, as summarised from the paper and that artifact (the paper's text
was not available here to check it against):

- Budget for activations = GPU memory budget - weights (here: every persistent tensor:
  weights, optimizer state, inputs, which stay on the GPU) - the largest single-kernel
  working set (of non-persistent tensors, since persistent ones are already counted).
- Offloadable: tensors created by a forward op that live past the loss, i.e. that a
  backward (or later) op uses again.
- Walk them in kernel order (by producer, then profile order), offloading each until the
  rest (the offloadable tensors not offloaded) fits in that budget; other tensors are
  what the working-set term is there to cover.
- Each offload is issued at the start of its last idle gap before the loss: after the
  tensor's last touch at or before the loss.
- Prefetch (the summary gives no rule; this one is ours, documented as such): each
  tensor comes back before its first use after the loss, as late as the SSD read
  bandwidth allows counting back from that use on the ideal timeline, the prefetches
  serialised on the read queue (from the last use backwards, each must end before the
  next one starts); a prefetch is issued after the last op that ideally ends by its
  start. Then, in order of use, it is issued no earlier than memory allows: not while
  the estimated memory (``planner.shared.estimate``, shared with g10 and capuchin: no-swap
  memory, less every offloaded tensor from its offload to its prefetch) plus the tensor
  would pass the budget; and never before the loss, before its own offload, or before
  the prefetch ahead of it on the queue. Without the memory
  and loss bounds, a slow SSD pulls the whole chain of prefetches back into the forward
  pass and refills memory at its peak (the plan then cannot run).

Departures and limits:

- The tier is the hardware's SSD. FlashNeuron moves data GPU <-> SSD peer to peer; the
  simulator takes the SSD path the hardware file declares (``ssd.path``: staged through
  host memory on the shipped presets, ``direct`` for GPUDirect Storage) and this planner
  does not change it. Without an SSD it falls back to host memory and says so in the
  draft's notes (``tier``, ``fallback``).
- Phase 2 (fp16 / CSR compression of activations whose transfers are not hidden) is not
  implemented: the simulator moves tensors at their profiled size.
- FlashNeuron's allocator (resident tensors from the low end of GPU memory, offloaded
  ones from the high end) is not modelled: the simulator counts bytes, with no
  fragmentation (R2).
- A tensor with no idle op between its last touch before the loss and its first touch
  after it (used by the loss's neighbours only) is not offloadable: nothing could run
  while it is away.
- The loss is the last forward op of the profile.
- Only what the budget needs: the working-set reserve of the rule above counts the
  largest single-kernel working set on top of the activations, which on language models
  with large logits makes it offload 1.1-2.1x the bytes the budget requires. So the
  rule's list is trimmed to its shortest prefix (still in kernel order) whose plan the
  simulator runs in the budget, found by bisection (``offloaded_by_rule`` in the notes
  keeps the rule's own count). When the rule's plan does not fit, it is kept as is.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from simulator.model.links import link_speed
from simulator.plan import Plan, offload, prefetch

from ..core.api import simulator_for
from ..core.lowering import OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, register
from ..shared.estimate import MemoryEstimate
from ..shared.facts import op_start_us, touches, working_set


@dataclass(frozen=True)
class Candidate:
    """A forward activation that lives past the loss: its last touch at or before the loss
    (``after``) and its first touch after it (``before``), as op positions."""
    tensor: str
    nbytes: int
    after: int
    before: int


def loss_position(profile) -> int | None:
    """The last forward op (the loss), or None when the profile has no forward op."""
    forward = [i for i, op in enumerate(profile.ops) if op.phase == "forward"]
    return forward[-1] if forward else None


def offloadable(profile, loss: int) -> list[Candidate]:
    """Tensors created in forward and used again after the loss, in kernel order."""
    found = []
    for tensor in profile.tensors:
        made_by = profile.producer[tensor.id]
        if tensor.persistent or made_by is None or profile.ops[made_by].phase != "forward":
            continue
        points = touches(profile, tensor.id)
        before_loss = [k for k in points if k <= loss]
        after_loss = [k for k in points if k > loss]
        if not after_loss or after_loss[0] - before_loss[-1] < 2:
            continue
        found.append((made_by, len(found), Candidate(tensor.id, tensor.bytes, before_loss[-1], after_loss[0])))
    return [c for _, _, c in sorted(found, key=lambda item: item[:2])]


def activation_budget(profile, budget_bytes: int) -> int:
    """GPU budget - persistent tensors - the largest single-kernel working set."""
    largest = max((working_set(profile, i, include_persistent=False) for i in range(len(profile.ops))),
                  default=0)
    return budget_bytes - profile.persistent_bytes - largest


def choose_offloads(candidates: list[Candidate], room_bytes: int) -> list[Candidate]:
    """Walk the candidates in order, offloading each until the rest fit in ``room_bytes``."""
    rest = sum(c.nbytes for c in candidates)
    chosen = []
    for candidate in candidates:
        if rest <= room_bytes:
            break
        chosen.append(candidate)
        rest -= candidate.nbytes
    return chosen


def prefetch_issue_ops(profile, hardware, chosen: list[Candidate], tier: str, loss: int,
                       budget_bytes: int) -> dict[str, int]:
    """For each chosen tensor, the op position after which its prefetch is issued.

    As late as the read link allows: counting back from the last use, the prefetches are
    serialised (each ends before the next starts) and each is issued after the last op
    that ideally ends by its start. Then, in order of use, no earlier than memory allows:
    not while the estimated memory (no-swap memory, less every chosen tensor from its
    offload to its prefetch) plus the tensor would pass the budget, not before the loss,
    not before its offload, and not before the prefetch ahead of it on the queue.
    """
    starts = op_start_us(profile)
    latency, rate = link_speed(hardware, "prefetch", tier)
    latest: dict[str, int] = {}
    next_start = float("inf")
    for c in sorted(chosen, key=lambda c: (c.before, c.after, c.tensor), reverse=True):
        end = min(starts[c.before], next_start)
        start = end - (latency + c.nbytes / rate)
        next_start = start
        latest[c.tensor] = _last_op_ending_by(starts, start)

    estimate = MemoryEstimate(profile, budget_bytes)
    for c in chosen:
        estimate.remove(c.nbytes, c.after + 1, c.before)
    issue: dict[str, int] = {}
    queue_floor = loss
    for c in sorted(chosen, key=lambda c: (c.before, c.after, c.tensor)):
        after = min(max(latest[c.tensor], c.after, queue_floor), c.before - 1)
        crowded = estimate.last_over(c.nbytes, after + 1, c.before)
        if crowded is not None:
            after = crowded
        estimate.add(c.nbytes, after + 1, c.before)
        issue[c.tensor] = queue_floor = after
    return issue


def _last_op_ending_by(starts: list[float], moment_us: float) -> int:
    """The last op position whose ideal end is at or before ``moment_us`` (-1: none)."""
    lo, hi = 0, len(starts) - 1  # starts[k + 1] is the end of op k
    while lo < hi:
        mid = (lo + hi) // 2
        if starts[mid + 1] <= moment_us:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@register(
    "flashneuron",
    "FlashNeuron (FAST'21) phase 1: offload forward activations to the SSD in kernel order "
    "until the rest fit; prefetch each as late as the SSD read queue allows.",
    moves_persistent=False,
    paper="Bae et al., FlashNeuron: SSD-Enabled Large-Batch Training of Very Deep Neural Networks, "
          "FAST 2021", family="swap",
)
def plan_flashneuron(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS):
    tier = "ssd" if hardware.ssd is not None else "host"
    notes = {"tier": tier}
    if tier == "host":
        notes["fallback"] = f"hardware {hardware.name} has no SSD: activations go to host memory"
    loss = loss_position(profile)
    if loss is None:
        return Draft(notes={**notes, "offloaded": 0})
    room = activation_budget(profile, budget_bytes)
    by_rule = choose_offloads(offloadable(profile, loss), room)
    simulator = simulator_for(profile, hardware, options)

    def actions(count: int) -> list:
        return offload_actions(profile, hardware, by_rule[:count], tier, loss, budget_bytes)

    def fits(count: int) -> bool:
        return simulator.score(Plan(profile.name, tuple(actions(count))), budget_bytes).ok

    count = len(by_rule)
    if fits(count):   # the fewest offloads (in kernel order) the simulator runs in the budget
        count = bisect_left(range(count), True, key=fits)
    chosen = by_rule[:count]
    notes.update(offloaded=len(chosen), offloaded_bytes=sum(c.nbytes for c in chosen),
                 offloaded_by_rule=len(by_rule), offloaded_bytes_by_rule=sum(c.nbytes for c in by_rule),
                 activation_budget_bytes=room)
    return Draft(actions=actions(count), notes=notes)


def offload_actions(profile, hardware, chosen: list[Candidate], tier: str, loss: int, budget_bytes: int) -> list:
    """The offloads and prefetches of the chosen tensors, in issue order."""
    issue = prefetch_issue_ops(profile, hardware, chosen, tier, loss, budget_bytes)
    ops = profile.ops
    keyed = []
    for k, c in enumerate(chosen):
        keyed.append(Step(c.after, OFFLOAD, 0, k, offload(c.tensor, ops[c.after].id, tier)))
        keyed.append(Step(issue[c.tensor], PREFETCH, c.before, k,
                      prefetch(c.tensor, ops[issue[c.tensor]].id, ops[c.before].id, tier)))
    return issue_order(keyed)
