"""``none``: swap nothing. The baseline every other planner is compared with."""
from __future__ import annotations

from ..core.registry import DEFAULT_OPTIONS, Draft, register


@register("none", "Swap nothing: every tensor stays on the GPU (the no-swap baseline).", family="baseline")
def plan_none(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS):
    return Draft()
