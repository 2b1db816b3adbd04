"""Real runs never exceed a budget the simulator accepts (issue 31): every planner whose
plans the runtime follows, on the runtime's small models (runtime/small_models.py: an MLP,
one with dropout, a tiny ResNet, a tiny GPT-2, an MLP with layer norm and dropout,
transformer blocks with attention dropout, and attention written out by hand), at 90%, 80% and 60% of the traced peak. Each
plan the simulator accepts runs one real step (runtime.peaks.peak_sweep, the ``train``
path): bit-equal to the unplanned step, its pool's peak within the budget and within 1% of
the budget (or 64 KiB) of the simulated peak.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="real runs need torch (the 'trace' extra)")

from planner.core.registry import planners  # noqa: E402
from runtime.peaks import peak_sweep, peak_table  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

HW = load_hardware("a100-40gb-pcie4")
SHARES = (0.9, 0.8, 0.6)
# multi-output ops (dropout, layer norm, attention) in all but the first and third; se_cnn
# and tied_lm run in benchmarks/fidelity.py (30 s each)
MODELS = ("mlp", "mlp_dropout", "tiny_resnet", "tiny_gpt2", "ln_dropout_mlp", "blocks", "manual_attention")


def followed_planners() -> list[str]:
    """Planners whose plans can be followed: explicit memory, every op on the GPU (codec
    plans are found out after planning and reported as not followed)."""
    return [s.name for s in planners() if s.memory == "explicit" and not s.cpu_phases]


# `make test` runs manual_attention, the quickest of the seven, with every followed planner
# at the three shares (multi-output ops recomputed for real, peaks exact); `make test-slow`
# the other six (a few minutes).
QUICK_MODEL = "manual_attention"


@pytest.mark.parametrize("model", [pytest.param(m, marks=() if m == QUICK_MODEL else pytest.mark.slow)
                                   for m in MODELS])
def test_real_peaks_stay_within_the_budget_and_match_the_simulation(model):
    if model == "tiny_gpt2":
        pytest.importorskip("transformers", reason="the tiny GPT-2 needs transformers")
    rows = peak_sweep(f"runtime.small_models:{model}", followed_planners(), SHARES, HW)
    bad = [r for r in rows if not r.ok]
    assert not bad, "\n" + peak_table(bad)
    ran = [r for r in rows if r.status == "ran"]
    assert len(ran) >= len(rows) // 2, "\n" + peak_table(rows)
    exact = [r for r in ran if r.real_peak_bytes == r.simulated_peak_bytes]
    assert len(exact) == len(ran), "\n" + peak_table([r for r in ran if r not in exact])
    if model not in ("mlp", "tiny_resnet"):   # recomputes of multi-output ops ran for real
        assert sum(r.recomputes > 0 for r in ran) >= 3, "\n" + peak_table(rows)
