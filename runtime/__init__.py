"""A runtime that follows a plan JSON in a real PyTorch training step (docs/runtime.md).

``bind(model_spec, profile)`` ties a profile traced with node identity to the FX graph it
was traced from; ``PlannedInterpreter(bindings, plan)`` runs steps of that graph node by
node, offloading, prefetching, dropping and recomputing at the plan's points; ``train``
does both and checks the planned run against the unplanned one.
"""
from .bindings import Bindings, Values, bind, initial_values
from .interpreter import PlannedInterpreter, PlanRefused, RuntimeFailure, StepReport, reference_step
from .train import train

__all__ = ["bind", "Bindings", "Values", "initial_values", "PlannedInterpreter", "PlanRefused", "RuntimeFailure",
           "StepReport", "reference_step", "train"]
