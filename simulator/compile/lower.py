"""``compile_program``: a plan checked and lowered into the ``Program`` a run executes,
by mode: explicit plans through simulator/compile/program.py, UVM plans (R30-R37)
through simulator/compile/uvm.py. Choosing here keeps those two modules apart (UVM
mode's compile reuses the explicit one's parts, never the other way round)."""
from __future__ import annotations

from ..plan import Plan
from ..profile import Profile
from .compiled import CompiledProfile, Machine
from .program import PlanInvalid, Program, check_codec_names, compile_explicit
from .uvm import compile_uvm


def compile_program(profile: Profile, compiled: CompiledProfile, plan: Plan, machine: Machine) -> Program:
    """Build the program and check every rule decidable from the plan; raises PlanInvalid
    (rule, op, tensor, reason). Codec names are checked first, then the mode's rules.
    Assumes ``check_plan`` passed (ids are known, SSD actions have an SSD)."""
    if plan.uses_codecs:
        check_codec_names(plan, machine)
    if plan.memory == "uvm":
        if compiled.collectives:
            raise PlanInvalid("R56", None, None, "a rank's collectives are not modeled in managed memory (UVM mode): "
                                                 "plan the rank with explicit copies")
        return compile_uvm(profile, compiled, plan, machine)   # R30-R37: the static rules of UVM mode
    return compile_explicit(profile, compiled, plan, machine)
