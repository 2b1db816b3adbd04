"""``uvm``: plain CUDA unified memory, the baseline every UVM paper measures against.

Every tensor lives in managed memory (cudaMallocManaged) and the plan gives the driver
no hint at all: a block that is not on the GPU when a kernel touches it faults in, and a
full GPU evicts the block that arrived least recently (docs/simulation.md, R30-R37; the
driver's behaviour as nvidia-uvm implements it: 2 MiB VA blocks, fault batches, eviction
by migration time; NVIDIA, CUDA C++ Programming Guide, "Unified Memory Programming",
oversubscription on Pascal and later GPUs; fault latency after Ganguly et al., "Interplay
between Hardware Prefetcher and Page Eviction Policy in CPU-GPU Unified Virtual Memory",
ISCA 2019). The plan is ``{"memory": "uvm", "actions": []}``.

Departures, and why
-------------------
1. **The driver's fault model, one access pattern.** Faults are per 4 KiB page, grown to
   64 KiB big pages, serviced 256 to a batch, and the tree prefetcher migrates a subtree
   of a 2 MiB block once more than 51% of it is resident or faulting (R31, the hardware
   file's ``uvm`` section; ``fault_batch_blocks`` selects the first model's whole-block
   batches). A kernel is assumed to touch every page of what it reads once, in address
   order; duplicate faults from many warps on one page, and faults from kernels whose
   accesses are sparse, are not modelled.
2. **No caching allocator by default.** PyTorch's allocator keeps freed blocks for reuse;
   here a tensor's blocks are released at its last use (R7), as DeepUM's invalidation of
   inactive blocks does, so dead data is never written back. A machine whose ``uvm``
   section says ``caching_allocator: true`` models the pool instead (R38: freed blocks
   stay resident, are written back when evicted, and are reused by new outputs).
3. **Any budget holding each op's outputs.** The planner's floor (planner.shared.facts.
   uvm_floor) is the largest op's outputs and workspace, or one fault batch: an op whose
   inputs do not fit streams through them (R32 as docs/simulation.md extends it).

The helpers the UVM-era planners share are in planner/shared/facts.py (layer segments,
every tensor's touches, an op's reads) and uvm/_driver.py (the backing tier, the citation).
"""
from __future__ import annotations

from ..core.registry import DEFAULT_OPTIONS, Draft, register
from ._driver import UVM_PAPER, backing


@register("uvm", "Plain unified memory: every tensor in managed memory, no hints; blocks fault in on use and "
                 "the least recently arrived are evicted (the UVM papers' baseline; runs at any budget that holds "
                 "each op's outputs and workspace).",
          moves_persistent=True, memory="uvm", paper=UVM_PAPER, family="unified memory")
def plan_uvm(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS) -> Draft:
    return Draft(actions=[], memory="uvm", notes={"hints": 0, "backing": backing(hardware)})
