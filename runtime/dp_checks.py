"""The checks of a data-parallel run (``swapplan train --world N``), each a list of
one-line failures (empty: passed).

- **peaks**: each rank's "GPU" pool peak within the budget and within ``PEAK_SLACK`` of
  the simulated rank peak;
- **parameters**: the parameters and optimizer state the ranks hold after the step (the
  shards put together, the padding cut) equal the single-process reference within
  ``RTOL`` / ``ATOL``, and full replicas agree bit for bit between ranks;
- **collectives**: what each rank issued equals the rank graph's collective ops, kind,
  payload bytes and order.

Why a tolerance: the ranks sum gradients in the collective's order, the reference in
rank order; fp32 addition is not associative, so sums of more than two terms may differ
in the last bits (a relative error of a few 2^-24 per addition). AdamW's step divides
the gradient's moment by the root of its square, so a relative error e in a gradient
moves a parameter by about lr * e: far below rtol 1e-5 of the parameter plus atol 1e-7.
With two ranks the sums are the same numbers (a + b = b + a) and the result is bit-equal.
"""
from __future__ import annotations

RTOL, ATOL = 1e-5, 1e-7
PEAK_SLACK = 0.01


def check_peaks(ranks: list[dict], budget: int, simulated: int) -> list[str]:
    out = []
    for r in ranks:
        if r["peak_bytes"] > budget:
            out.append(f"rank {r['rank']} peaked at {r['peak_bytes']} bytes, over the budget of {budget}")
        elif abs(r["peak_bytes"] - simulated) > PEAK_SLACK * simulated:
            out.append(f"rank {r['rank']} peaked at {r['peak_bytes']} bytes, more than 1% from the simulated "
                       f"{simulated}")
    return out


def check_collectives(expected: list, logged: list, rank: int) -> list[str]:
    """``expected`` and ``logged``: (op id, kind, payload bytes) in order."""
    expected, logged = [tuple(e) for e in expected], [tuple(e) for e in logged]
    for k, (want, got) in enumerate(zip(expected, logged)):
        if want != got:
            return [f"rank {rank}'s collective {k + 1} was {got[1]} of {got[2]} bytes ({got[0]}); the graph's is "
                    f"{want[1]} of {want[2]} bytes ({want[0]})"]
    if len(expected) != len(logged):
        return [f"rank {rank} issued {len(logged)} collectives; the graph has {len(expected)}"]
    return []


def compare_tensors(got: dict, want: dict) -> dict:
    """``got`` and ``want``: name -> tensor. The largest differences, the names outside
    the tolerance (``differences``) and how many are bit-equal."""
    import torch

    from .train import same_bits
    differences, bit_equal, max_abs, max_rel = [], 0, 0.0, 0.0
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape or g.dtype != w.dtype:
            differences.append(name)
            continue
        if same_bits(g, w):
            bit_equal += 1
            continue
        if not w.is_floating_point():
            differences.append(name)
            continue
        diff = (g.double() - w.double()).abs()
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / w.double().abs().clamp_min(1e-30)).max()))
        if not torch.allclose(g, w, rtol=RTOL, atol=ATOL):
            differences.append(name)
    return {"tensors": len(want), "bit_equal_tensors": bit_equal, "max_abs_difference": max_abs,
            "max_rel_difference": max_rel, "differences": differences}
