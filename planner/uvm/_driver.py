"""What the UVM planners share about the driver (uvm, oc-dnn, deepum, dragon): the tier
that backs managed memory on a machine, and the source of the fault model they cite.
Not a planner (its name starts with ``_``: the catalog skips it)."""
from __future__ import annotations

from simulator.hardware import Hardware

UVM_PAPER = ("NVIDIA CUDA C++ Programming Guide, Unified Memory Programming (oversubscription); fault model after "
             "Ganguly et al., ISCA 2019")


def backing(hardware: Hardware) -> str:
    """The tier managed memory is backed by on this machine (hints name it)."""
    return hardware.uvm.backing
