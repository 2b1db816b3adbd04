"""``torch-budget``: the knapsack PyTorch's ``torch.compile`` solves for its activation
memory budget (``torch._functorch.config.activation_memory_budget``), as a baseline the
users of this tool already know.

As the PyTorch partitioner does it (from its documentation and design notes): the
activations saved for the backward pass that could be recomputed are the knapsack's
items; each weighs its bytes and costs its recompute time, estimated from FLOPs (ops
without a FLOP count, element-wise ones, cost next to nothing: PyTorch never pays to
save them when it can recompute them); a dynamic program over discretised memory picks
the cheapest set that frees what the budget asks. Here the budget is in bytes of GPU
memory, not a fraction of the activations: the knapsack must free ``peak - budget``
bytes of saved activations, and when the simulator finds the plan still over the budget
(the peak is not only saved activations), the amount grows by what was missing and the
knapsack is solved again (``rounds``).

Departures: recomputes are lowered as chen's lazy variant lowers them (planner/shared/checkpoint.py:
each dropped tensor recomputed just before the first backward op, or recompute, that
needs it; a dropped source is recomputed first), with the same R15 checks; PyTorch
recomputes inside the compiled backward graph instead. FLOPs come from the profile's
``flops`` (converted at the GPU's fp16 peak); ops without them cost their profiled time
times ``FREE_SHARE`` (not zero: the simulator does charge it).
"""
from __future__ import annotations

import numpy as np

from ..core.api import score, simulator_for
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.checkpoint import droppable, recompute_plan, segment_of

FREE_SHARE = 0.1     # what an op without a FLOP count weighs in the knapsack, of its profiled time
BUCKETS = 2000       # the knapsack's memory resolution


def recompute_cost_us(op, hardware) -> float:
    """The knapsack's cost of running ``op`` again: its FLOPs at the GPU's fp16 peak, or a
    share of its profiled time when the profile has no FLOP count for it."""
    if op.flops:
        return op.flops / (hardware.gpu.fp16_tflops * 1e6)
    return FREE_SHARE * op.time_us


def knapsack(weights: np.ndarray, costs: np.ndarray, need: int) -> list[int]:
    """The cheapest items whose weights sum to at least ``need`` (exact in whole bytes up
    to ``BUCKETS`` bytes of need; past that, weights in steps of need / ``BUCKETS``,
    rounded down so that the choice frees at least the need); all of them when even that
    is not enough."""
    if need <= 0:
        return []
    if weights.sum() <= need:
        return list(range(len(weights)))
    step = max(1.0, need / BUCKETS)            # whole bytes while the need is small: exact
    top = int(np.ceil(need / step))
    units = np.floor(weights / step).astype(np.int64)
    best = np.full(top + 1, np.inf)            # best[w]: least cost freeing >= w units
    best[0] = 0.0
    took = np.zeros((len(weights), top + 1), dtype=bool)
    for k in range(len(weights)):
        shifted = best[np.maximum(np.arange(top + 1) - units[k], 0)] + costs[k]
        better = shifted < best
        took[k] = better
        best = np.where(better, shifted, best)
    chosen, w = [], top
    for k in range(len(weights) - 1, -1, -1):
        if took[k, w]:
            chosen.append(k)
            w = max(w - int(units[k]), 0)
    return sorted(chosen)


@register(
    "torch-budget",
    "torch.compile's activation memory budget: a knapsack over the recomputable saved activations, "
    "cheapest (FLOP-estimated) set freeing what the budget asks, recomputed before backward needs it.",
    params=(Param("rounds", 8, "knapsack solves, each asking for what the last plan was still over the budget",
                  low=1, high=100),),
    moves_persistent=False,
    recomputes=True,
    family="recompute",
    paper="PyTorch, torch._functorch.config.activation_memory_budget (min-cut partitioner with a "
          "knapsack over recomputable activations, PyTorch 2.4+)",
)
def plan_torch_budget(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, rounds=8):
    items = droppable(profile, segment_of(profile, 1))
    ids = sorted(items, key=lambda t: (profile.producer[t], t))
    tensors = profile.tensor_by_id
    weights = np.array([tensors[t].bytes for t in ids], dtype=float)
    costs = np.array([recompute_cost_us(profile.ops[profile.producer[t]], hardware) for t in ids])
    need = profile.peak_bytes - budget_bytes
    sim = simulator_for(profile, hardware, options)
    best = None
    for round_no in range(rounds):
        chosen = {ids[k]: 0 for k in knapsack(weights, costs, need)}
        actions = recompute_plan(profile, chosen, lazy=True, allowed=items)
        result = score(sim, budget_bytes, actions)
        key = (not result.ok, result.iteration_us if result.ok else -result.progress)
        if best is None or key < best[0]:
            best = (key, actions, {"dropped_tensors": len(chosen), "freed_bytes": int(sum(tensors[t].bytes
                                                                                          for t in chosen)),
                                   "asked_bytes": int(need), "rounds": round_no + 1})
        if result.ok or len(chosen) == len(ids):
            break
        options.say(f"torch-budget: the plan freeing {need} bytes is over the budget; asking for more")
        need += max(result.peak_bytes - budget_bytes, int(0.05 * weights.sum()), 1) if result.feasible \
            else max(int(0.1 * weights.sum()), 1)
    _, actions, notes = best
    return Draft(actions=actions, notes=notes)
