"""``deepum``: unified memory with correlation prefetching and pre-eviction, after DeepUM
(Jung, Kim, Lee, "DeepUM: Tensor Migration and Prefetching in Unified Memory", ASPLOS
2023). DeepUM runs every allocation in managed memory; a runtime tags each kernel launch
with an execution ID, and driver threads keep correlation tables: which kernel follows
which, and which UM blocks each kernel faulted on. When a kernel is launched, the
prefetcher looks the tables up, prefetches the blocks of the kernels predicted to run
next, and when GPU memory runs short it pre-evicts blocks not expected soon; blocks of
freed (inactive) PyTorch allocations are invalidated rather than written back.

What it does
------------
The tables in the steady state predict one training iteration exactly (the same
kernels in the same order, every iteration), so the planner replays the profile:

- **Prefetch.** When op ``i`` starts (after op ``i - 1``), the blocks op ``i + k``
  will fault on are prefetched (``prefetch(t, after=op i-1, before=op i+k)`` for each
  tensor op ``i + k`` reads or updates), ``k`` being the lookahead. A tensor is left
  out when it is not in ``i + k``'s fault table in the steady state: when an op in
  ``[i, i + k)`` touches it (it is on the GPU then, and recently arrived), or when no op
  between its previous touch and ``i + k`` would overflow the budget without swapping
  (nothing had to evict it). A tensor first made inside the window needs no prefetch
  either (first touch, R31).
- **Pre-eviction.** After its use at op ``a``, a tensor whose next touch ``b`` lies
  beyond the lookahead (``b > a + k + 1``) is offloaded (``offload(t, after=op a)``,
  a migration hint, R33) when memory runs short somewhere in between: when the no-swap
  resident set of some op in ``(a, b)`` exceeds the budget. Its prefetch for ``b`` then
  brings it back. Weights and optimizer state are treated alike (their next touch
  after the last one of the iteration is the first of the next iteration).
- **Invalidation** of dead blocks is the simulator's own rule (R7: a tensor's blocks are
  released at its last use, never written back).
- ``lookahead = -1`` (the default) tries 1, 2, 4, 8 (the value G10's model of DeepUM
  uses), 16, 32 and 64 and keeps the fastest plan by simulation.

Departures from the paper, and why
----------------------------------
1. **Tables replaced by the profile.** DeepUM learns its tables online (and needs a
   few iterations to warm up); a planner knows the iteration in advance, so the plan is
   what the tables hold once warm. Table sizes, hash collisions and mispredictions are
   not modelled, which makes this an optimistic DeepUM.
2. **Tensor granularity.** DeepUM's tables hold UM blocks; here a hint names a tensor
   and migrates the blocks of it that are not on the GPU (R33), which is the same set of
   blocks in the steady state.
3. **Prefetch timing.** DeepUM issues prefetches from a driver thread on the launch of
   a kernel and serves faults before prefetches; here the hints are queued on ``h2d``
   when op ``i`` starts and fault batches go ahead of hints that have not started
   (R31), which is the same priority. Op ``i + k`` waits for its hints (R6) instead of
   faulting on blocks a late prefetch has not brought yet.
4. **Pre-eviction trigger.** DeepUM pre-evicts when free GPU memory falls below a
   threshold; which blocks, and the threshold, are not fully specified. Here it is
   decided statically from the no-swap residency, offloading the tensors idle across an
   op that would not fit, and nothing when everything fits.
5. **Lookahead search.** The paper's prefetch depth is internal to the driver; here it
   is a parameter, tuned by simulation when left at -1.
"""
from __future__ import annotations

from itertools import accumulate

from simulator.api import Simulator
from simulator.plan import Plan, offload, prefetch
from simulator.profile import profile_sha256

from .lowering import OFFLOAD, PREFETCH, Step, issue_order
from .registry import DEFAULT_OPTIONS, Draft, Param, register
from .uvm import backing, read_ops, touches

LOOKAHEADS = (1, 2, 4, 8, 16, 32, 64)


def deepum_actions(profile, budget_bytes: int, tier: str, lookahead: int, pre_evict: bool) -> list:
    """DeepUM's prefetches (and pre-evictions) for a lookahead of ``lookahead`` ops."""
    ops, tensors, k = profile.ops, profile.tensor_by_id, lookahead
    touched = touches(profile)
    n = len(ops)
    over = [0, *accumulate(1 if r > budget_bytes else 0 for r in profile.resident_bytes)]

    def short(lo: int, hi: int) -> bool:
        """Does an op strictly between positions lo and hi (hi may pass the iteration's
        end: the next iteration's ops) not fit in the budget without swapping?"""
        if hi > n:
            return short(lo, n) or short(-1, hi - n)
        if lo < -1:           # from the previous iteration's op lo + n
            return short(lo + n, n) or short(-1, hi)
        return hi > lo + 1 and over[hi] - over[lo + 1] > 0

    steps = []
    for j in range(n):
        for tid in read_ops(profile, j):
            if not tensors[tid].bytes:
                continue
            uses = touched[tid]
            place = uses.index(j)
            previous = uses[place - 1] if place else (uses[-1] - n if tensors[tid].persistent else None)
            at = j - k - 1                          # issued when op j - k starts (-1: at the start)
            if previous is not None and (previous > at or not short(previous, j)):
                continue       # touched inside the window, or nothing could evict it since: not in j's fault table
            at = max(at, -1)
            after = None if at < 0 else ops[at].id
            steps.append(Step(at, PREFETCH, j, tid, prefetch(tid, after, ops[j].id, tier)))
    if pre_evict:
        for tid, uses in touched.items():
            tensor = tensors[tid]
            if not tensor.bytes:
                continue
            pairs = list(zip(uses, uses[1:]))
            if tensor.persistent:
                pairs.append((uses[-1], uses[0] + n))   # across the iteration's end
            for a, b in pairs:
                if b - a > k + 1 and short(a, b):
                    steps.append(Step(a, OFFLOAD, b, tid, offload(tid, ops[a].id, tier)))
    return issue_order(steps)


@register("deepum", "DeepUM: unified memory; when op i starts, prefetch what op i+k will fault on; pre-evict "
                    "tensors idle past the lookahead where memory runs short (lookahead tuned by simulation).",
          params=(Param("lookahead", -1, "k: ops between a prefetch and the op it serves (-1: try 1, 2, 4, 8, "
                                         "16, 32, 64 and keep the fastest)", low=1, high=100000, also=(-1,)),
                  Param("pre_evict", True, "offload tensors idle past the lookahead where memory runs short")),
          moves_persistent=True, memory="uvm",
          paper="Jung, Kim, Lee, DeepUM: Tensor Migration and Prefetching in Unified Memory, ASPLOS 2023")
def plan_deepum(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, lookahead=-1, pre_evict=True) -> Draft:
    tier = backing(hardware)
    if lookahead != -1:
        actions = deepum_actions(profile, budget_bytes, tier, lookahead, pre_evict)
        return Draft(actions=actions, memory="uvm", notes={"lookahead": lookahead, "hints": len(actions)})
    simulator = Simulator(profile, hardware)
    sha = profile_sha256(profile)
    tried = {}
    best = None
    for k in LOOKAHEADS:
        if k >= len(profile.ops):
            break
        actions = deepum_actions(profile, budget_bytes, tier, k, pre_evict)
        plan = Plan(profile_name=profile.name, profile_sha256=sha, actions=tuple(actions), memory="uvm")
        score = simulator.score(plan, budget_bytes)
        tried[str(k)] = round(score.iteration_us, 3) if score.ok else None
        options.say(f"deepum: lookahead {k}: " + (f"{score.iteration_us:.0f} us" if score.ok else "does not run"))
        if best is None or score.rank() < best[0]:
            best = (score.rank(), k, actions)
    _, k, actions = best if best is not None else (None, 1, deepum_actions(profile, budget_bytes, tier, 1,
                                                                            pre_evict))
    return Draft(actions=actions, memory="uvm", notes={"lookahead": k, "tuned": tried, "hints": len(actions)})
