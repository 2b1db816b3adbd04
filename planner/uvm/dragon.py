"""``dragon``: unified memory backed by an NVMe file, after DRAGON (Markthub, Belviranli,
Lee, Vetter, Matsuoka, "DRAGON: Breaking GPU Memory Capacity Limits with Direct NVM
Access", SC 2018). DRAGON extends the nvidia-uvm driver so that a file on an NVMe SSD is
mapped into the GPU's managed address space (dragon_map / dragon_sync / dragon_unmap):
faults are served from the host page cache, which the kernel fills from the SSD, and
dirty pages go back through the page cache lazily (written to the SSD when the cache
needs room, or at dragon_sync).

What it does
------------
The plan runs in UVM mode with ``"uvm_backing": "ssd"`` (R35): every tensor lives in
the mapped file; host memory is a page cache of ``uvm.host_cache`` bytes (the machine's
hardware file; the whole host memory when it does not say). A fault batch whose blocks
are all in the cache crosses PCIe alone; otherwise it reads through the SSD (one flow
over the SSD and PCIe, with the SSD's latency). An evicted block is written back into
the cache, which first writes its least recently arrived block to the SSD when full.
There are no hints (DRAGON is demand paging), and persistent tensors start as plain
UVM's do (on the GPU while they fit, the rest in the file, R36).

Departures from the paper, and why
----------------------------------
1. **No readahead, no fault coalescing beyond the driver's batch.** DRAGON's page cache
   reads ahead and its driver coalesces faults on contiguous pages; here fault batches
   are plain UVM's (R31: the driver's pages, batches and prefetcher), and the cache holds only what was
   written back to it (so a cold read is one SSD read per batch).
2. **Lazy writes only at eviction.** DRAGON flushes dirty pages at dragon_sync (the
   application's choice); a training loop that never syncs mid-run is modelled: dirty
   data reaches the SSD only when the cache needs room.
3. **Cache size from the machine.** The page cache is whatever host memory the kernel
   gives it; the hardware file's ``uvm.host_cache`` says how much (default: all of host
   memory, in which case a model that fits in host memory runs as plain UVM does after
   the first iteration, which DRAGON's own results show for such sizes). Host memory
   holds only the cache; the file counts on the SSD (R19, R35), so a model larger than
   host memory runs (``a100-40gb-32gb-pcie4``: 32 GiB of host, a 24 GiB cache), where
   plain UVM is infeasible.
4. **Driver details** as in planner.uvm.uvm (R31's fault model, no caching allocator).
"""
from __future__ import annotations

from simulator.errors import InfeasibleError

from ..core.registry import DEFAULT_OPTIONS, Draft, register
from ._driver import UVM_PAPER


@register("dragon", "DRAGON: unified memory backed by a file on the NVMe SSD, with the host page cache in "
                    "front (R35); demand paging, no hints.",
          moves_persistent=True, memory="uvm",
          paper="Markthub et al., DRAGON: Breaking GPU Memory Capacity Limits with Direct NVM Access, SC 2018",
          family="unified memory")
def plan_dragon(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS) -> Draft:
    if hardware.ssd is None:
        raise InfeasibleError(f"planner 'dragon' maps managed memory to a file on the SSD, and {hardware.name} "
                              "has no ssd section")
    cache = hardware.uvm.host_cache_bytes
    return Draft(actions=[], memory="uvm", uvm_backing="ssd",
                 notes={"backing": "ssd", "host_cache_bytes": hardware.host.memory_bytes if cache is None else cache,
                        "driver": UVM_PAPER})
