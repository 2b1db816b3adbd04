"""The one family map: what kind of plan each family makes, how `swapplan planners` titles
it, the folder that holds its planners, and the names ``--planners`` accepts for it.

A planner's family is what its ``register`` call says (``family=``), and its module lives
in that family's folder, ``planner/<FOLDERS[family]>/`` (tests/test_planner_families.py
holds them to it): the folder a planner is in is the family `swapplan planners` lists it
under. What planners of several families share lives outside the family folders, in
``planner/core`` (the framework) and ``planner/shared`` (facts and models).
"""
from __future__ import annotations

FAMILIES = {     # family -> how `swapplan planners` titles it, in the order it lists them
    "baseline": "baseline", "swap": "swap: tensors to host memory or SSD and back",
    "recompute": "recompute (activation checkpointing): nothing leaves the GPU",
    "swap + recompute": "swap + recompute: each tensor swapped or recomputed, whichever costs less",
    "placement": "placement: a swap plan with one arena placed offline (no fragmentation)",
    "compression": "compression: codecs on the GPU or in the copy engine",
    "CPU offload": "CPU offload (ZeRO): the optimizer step on the host CPU",
    "unified memory": "unified memory: the driver pages on demand",
}

FOLDERS = {      # family -> the package under planner/ that holds its planners (and only them)
    "baseline": "baseline", "swap": "swap", "recompute": "recompute", "swap + recompute": "swap_recompute",
    "placement": "placement", "compression": "compress", "CPU offload": "offload", "unified memory": "uvm",
}

FAMILY_NAMES = {   # what --planners accepts for a family (as ``family:NAME`` or NAME alone)
    "baseline": "baseline", "swap": "swap", "recompute": "recompute", "swap+recompute": "swap + recompute",
    "swap-recompute": "swap + recompute", "placement": "placement", "compression": "compression",
    "compress": "compression", "cpu-offload": "CPU offload", "offload": "CPU offload", "zero": "CPU offload",
    "uvm": "unified memory", "unified-memory": "unified memory",
}
