"""``oc-dnn``: unified memory with a prefetch of each layer's tensors before it, after
OC-DNN (Awan, Chu, Subramoni, Lu, Panda, "OC-DNN: Exploiting Advanced Unified Memory
Capabilities in CUDA 9 and Volta GPUs for Out-of-Core DNN Training", HiPC 2018): OC-Caffe
allocates every buffer with cudaMallocManaged and, before each layer's forward or
backward pass, issues cudaMemPrefetchAsync for that layer's buffers, with cudaMemAdvise
hints on them.

What it does
------------
- The plan runs in UVM mode (R30-R37). A *layer* is a run of consecutive ops with one
  ``module`` and phase (planner.shared.facts.layer_segments): a layer's forward, or its backward.
- For every layer L, each tensor L's ops read or update is prefetched
  (``prefetch(t, after=<op before layer L - ahead>, before=<first op of L using t>)``):
  issued when layer ``L - ahead`` starts, so with ``ahead`` = 1 (the default) the
  copies of the next layer overlap the current layer's compute. A tensor already on
  the GPU makes the hint move nothing (R33); one L itself produces is not prefetched.
- Weights are advised read-mostly (``read_mostly``, R34): an evicted weight block is
  dropped, not written back, until the optimizer updates it.

Departures from the paper, and why
----------------------------------
1. **How far ahead.** The paper prefetches "before each layer"; how long before is not
   stated (the abstract and the seed notes leave it open). ``ahead`` = 0 issues the hint
   when the layer itself starts (the layer's first op then waits for it, R6); 1, the
   default, one layer earlier, which is what overlapping copies with compute needs.
2. **Which advice.** OC-Caffe sets cudaMemAdvise flags on its buffers; which flag on
   which buffer is not stated. Here weights are read-mostly (they are read by every
   forward and backward op and written once, by the optimizer), and nothing is given
   SetPreferredLocation or SetAccessedBy (not modelled, R34).
3. **Layers from the profile.** Caffe's layers are the profile's modules; an op without
   a module is a layer of its own.
4. **Driver details** as in planner.uvm.uvm (2 MiB blocks, no tree prefetcher, no caching
   allocator).
"""
from __future__ import annotations

from simulator.plan import prefetch

from ..core.lowering import PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import layer_segments, read_ops
from ._driver import backing


def oc_dnn_actions(profile, tier: str, ahead: int) -> list:
    """The prefetch hints of OC-DNN with ``ahead`` layers of lead, in issue order."""
    segments = layer_segments(profile)
    ops, producer, tensors = profile.ops, profile.producer, profile.tensor_by_id
    steps = []
    for index, (first, last) in enumerate(segments):
        at = segments[index - ahead][0] - 1 if index >= ahead else -1   # when that layer starts (-1: at start)
        first_use: dict[str, int] = {}
        for i in range(first, last + 1):
            for tid in read_ops(profile, i):
                first_use.setdefault(tid, i)
        for tid, use in first_use.items():
            made = producer[tid]
            if use <= at or tensors[tid].bytes == 0 or (made is not None and made > at):
                continue           # used before the hint could land, empty, or not made yet
            after = None if at < 0 else ops[at].id
            steps.append(Step(at, PREFETCH, use, tid, prefetch(tid, after, ops[use].id, tier)))
    return issue_order(steps)


@register("oc-dnn", "OC-DNN: unified memory; before each layer, prefetch the tensors it reads and updates "
                    "(one layer ahead); weights advised read-mostly.",
          params=(Param("ahead", 1, "issue a layer's prefetches this many layers before it (0: as it starts)",
                        low=0, high=1024),
                  Param("read_mostly", True, "advise weights read-mostly (cudaMemAdviseSetReadMostly)")),
          moves_persistent=True, memory="uvm",
          paper="Awan et al., OC-DNN: Exploiting Advanced Unified Memory Capabilities in CUDA 9 and Volta GPUs "
                "for Out-of-Core DNN Training, HiPC 2018", family="unified memory")
def plan_oc_dnn(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, ahead=1, read_mostly=True) -> Draft:
    actions = oc_dnn_actions(profile, backing(hardware), ahead)
    advised = tuple(t.id for t in profile.tensors if t.kind == "weight" and t.bytes) if read_mostly else ()
    return Draft(actions=actions, memory="uvm", read_mostly=advised,
                 notes={"layers": len(layer_segments(profile)), "prefetches": len(actions),
                        "read_mostly_tensors": len(advised)})
