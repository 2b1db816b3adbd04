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
1. **No tree prefetcher, 2 MiB granularity.** The driver faults 4 KB pages and its
   neighbourhood prefetcher grows each fault to a 64 KB leaf and then to the rest of a
   half-resident 2 MiB block; here a whole 2 MiB block (a tensor's last one smaller)
   migrates on its first touch, which is what the prefetcher converges to for the dense,
   sequential accesses of DNN kernels. ``fault_batch_blocks`` (1 by default) says how
   many such blocks one fault batch serves.
2. **No caching allocator.** PyTorch's allocator keeps freed blocks for reuse; here a
   tensor's blocks are released at its last use (R7), as DeepUM's invalidation of
   inactive blocks does, so dead data is never written back.
3. **Any budget holding each op's outputs.** The planner's floor (planner.analysis.
   uvm_floor) is the largest op's outputs and workspace, or one fault batch: an op whose
   inputs do not fit streams through them (R32 as docs/simulation.md extends it).

This module also holds the helpers the other UVM-era planners share (``oc-dnn``,
``deepum``, ``dragon``, ``sentinel``): layer segments and the touches of each tensor.
"""
from __future__ import annotations

from simulator.hardware import Hardware
from simulator.profile import Profile

from .registry import DEFAULT_OPTIONS, Draft, register

UVM_PAPER = ("NVIDIA CUDA C++ Programming Guide, Unified Memory Programming (oversubscription); fault model after "
             "Ganguly et al., ISCA 2019")


def backing(hardware: Hardware) -> str:
    """The tier managed memory is backed by on this machine (hints name it)."""
    return hardware.uvm.backing


def layer_segments(profile: Profile) -> list[tuple[int, int]]:
    """The profile's ops cut into layers as they run: maximal runs of consecutive ops
    with the same ``module`` and phase (an op without a module is a layer of its own).
    (first, last) op positions, in order."""
    out: list[tuple[int, int]] = []
    key_of = None
    for i, op in enumerate(profile.ops):
        key = None if op.module is None else (op.module, op.phase)
        if out and key is not None and key == key_of:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
        key_of = key
    return out


def touches(profile: Profile) -> dict[str, list[int]]:
    """Per tensor, the op positions that make, read or update it, in order."""
    found: dict[str, list[int]] = {}
    for i, op in enumerate(profile.ops):
        for tid in dict.fromkeys(op.outputs + op.inputs + op.updates):
            found.setdefault(tid, []).append(i)
    return found


def read_ops(profile: Profile, i: int) -> list[str]:
    """The tensors op i reads or updates (what it may fault on, R31), in order."""
    op = profile.ops[i]
    return list(dict.fromkeys(op.inputs + op.updates))


@register("uvm", "Plain unified memory: every tensor in managed memory, no hints; blocks fault in on use and "
                 "the least recently arrived are evicted (the UVM papers' baseline; runs at any budget that holds "
                 "each op's outputs and workspace).",
          moves_persistent=True, memory="uvm", paper=UVM_PAPER)
def plan_uvm(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS) -> Draft:
    return Draft(actions=[], memory="uvm", notes={"hints": 0, "backing": backing(hardware)})
