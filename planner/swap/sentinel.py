"""``sentinel``: interval-based migration of long-lived tensors, after Sentinel (Ren, Luo,
Wu, Xu, Li, "Sentinel: Efficient Tensor Migration and Allocation on Heterogeneous Memory
Systems for Deep Learning", HPCA 2021; arXiv:1909.05182). Sentinel profiles one training
step at tensor level, keeps short-lived tensors (those live within one layer) in fast
memory where they are reused layer after layer and never migrate, and moves long-lived
tensors between fast and slow memory at fixed *migration intervals* of a number of
layers: a tensor leaves fast memory after the interval of its last use and comes back
one interval ahead of its next use. The interval length is chosen by trying values.

What it does (explicit mode: the plan's copies are the only ones)
-----------------------------------------------------------------
- Layers are runs of consecutive ops with one ``module`` and phase (planner.shared.facts); an
  interval of length ``m`` is ``m`` consecutive layers.
- *Short-lived* tensors (made and last used within one layer) stay on the GPU. Every
  other tensor, weights and optimizer state included, is long-lived.
- For each long-lived tensor and each pair of consecutive touches (uses, its making)
  in intervals ``ia`` and ``ib`` with ``ib >= ia + 3``: offload to host after the last op
  of interval ``ia``, prefetch after the last op of interval ``ib - 2`` (so one whole
  interval ahead) before the op of the next touch. Closer touches leave it resident.
- ``interval = -1`` (the default): if the plan that migrates nothing fits, it is
  returned; otherwise the interval lengths 1, 2, 3, 4, 6, 8, 12 and 16 layers are tried
  and the fastest plan that fits is kept (the one-layer plan, which moves the most,
  when none fits; make_plan then marks it infeasible).

Departures from the paper, and why
----------------------------------
1. **GPU and host instead of DRAM and NVM.** Sentinel manages a CPU's heterogeneous
   memory with OS page migration (and a GPU variant with explicit copies); here fast
   memory is the GPU and slow memory host DRAM, with the simulator's copies over PCIe.
2. **No page-level co-allocation.** Sentinel places long-lived tensors of similar
   lifetime in the same pages to avoid false sharing; copies here are per tensor, so
   there is nothing to co-allocate.
3. **Interval search by simulation.** The paper picks the interval with a cost model of
   migration against compute time; here each candidate plan is simulated and the
   fastest that fits is kept (and none when nothing needs to move).
4. **Touch granularity.** A tensor's next use inside the same or the next interval
   keeps it resident; the paper migrates at interval boundaries and counts accesses per
   interval, which gives the same decisions for tensors touched once per interval.
"""
from __future__ import annotations

from simulator.plan import Plan, offload, prefetch
from simulator.profile import profile_sha256

from ..core.api import simulator_for
from ..core.lowering import OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import layer_segments, touch_map

INTERVALS = (1, 2, 3, 4, 6, 8, 12, 16)


def sentinel_actions(profile, interval: int) -> tuple[list, dict]:
    """Sentinel's offloads and prefetches for migration intervals of ``interval`` layers."""
    segments = layer_segments(profile)
    layer_of = [0] * len(profile.ops)
    for index, (first, last) in enumerate(segments):
        for i in range(first, last + 1):
            layer_of[i] = index
    interval_end: dict[int, int] = {}             # interval -> its last op
    for i in range(len(profile.ops)):
        interval_end[layer_of[i] // interval] = i
    ops, tensors = profile.ops, profile.tensor_by_id
    steps, moved, long_lived = [], 0, 0
    for tid, uses in touch_map(profile).items():
        tensor = tensors[tid]
        if not tensor.bytes:
            continue
        if not tensor.persistent and layer_of[uses[0]] == layer_of[uses[-1]]:
            continue                               # short-lived: stays where it is reused
        long_lived += 1
        for a, b in zip(uses, uses[1:]):
            ia, ib = layer_of[a] // interval, layer_of[b] // interval
            if ib < ia + 3:
                continue
            out_at, in_at = interval_end[ia], interval_end[ib - 2]
            steps.append(Step(out_at, OFFLOAD, b, tid, offload(tid, ops[out_at].id, "host")))
            steps.append(Step(in_at, PREFETCH, b, tid, prefetch(tid, ops[in_at].id, ops[b].id, "host")))
            moved += tensor.bytes
    return issue_order(steps), {"interval_layers": interval, "long_lived_tensors": long_lived,
                                "migrated_bytes": moved}


@register("sentinel", "Sentinel: short-lived tensors stay; long-lived ones leave after the interval of their "
                      "use and return one interval ahead of the next (interval length in layers searched).",
          params=(Param("interval", -1, "migration interval in layers (-1: search 1, 2, 3, 4, 6, 8, 12, 16 by "
                                        "simulation, none when nothing needs to move)", low=1, high=100000,
                        also=(-1,)),),
          moves_persistent=True,
          paper="Ren et al., Sentinel: Efficient Tensor Migration and Allocation on Heterogeneous Memory Systems "
                "for Deep Learning, HPCA 2021", family="swap")
def plan_sentinel(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, interval=-1) -> Draft:
    if interval != -1:
        actions, notes = sentinel_actions(profile, interval)
        return Draft(actions=actions, notes=notes)
    simulator = simulator_for(profile, hardware, options)
    sha = profile_sha256(profile)

    def scored(actions):
        return simulator.score(Plan(profile_name=profile.name, profile_sha256=sha, actions=tuple(actions)),
                               budget_bytes)

    if scored([]).ok:
        return Draft(actions=[], notes={"interval_layers": None, "migrated_bytes": 0,
                                        "why": "everything fits: nothing migrates"})
    best, tried = None, {}
    for m in INTERVALS:
        actions, notes = sentinel_actions(profile, m)
        score = scored(actions)
        tried[str(m)] = round(score.iteration_us, 3) if score.ok else None
        options.say(f"sentinel: interval {m}: " + (f"{score.iteration_us:.0f} us" if score.ok else "does not fit"))
        if score.ok and (best is None or score.iteration_us < best[0]):
            best = (score.iteration_us, actions, notes)
    if best is None:
        actions, notes = sentinel_actions(profile, 1)
        return Draft(actions=actions, notes={**notes, "tried": tried})
    return Draft(actions=best[1], notes={**best[2], "tried": tried})
