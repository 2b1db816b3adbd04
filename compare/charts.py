"""The comparison's charts (matplotlib, drawn off screen), legible with 40 planners:

- ``bar_figure``: per (profile, machine) and budget, the fastest ``TOP`` plans as
  horizontal bars of overhead, best on top, coloured by family, the rest folded into one
  ``+N more`` line, the budget's bound drawn as a labelled vertical line;
- ``family_figure``: per (profile, machine), the best plan of each family against budget,
  one line per family.

Colours are ``grid.FAMILY_COLORS``: a family has the same colour in every chart.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from .cells import BELOW_FLOOR, OK  # noqa: E402
from .grid import (FAMILY_COLORS, OTHER, TOP, Grid, best_per_family, bound_overhead, budget_label,  # noqa: E402
                   cell_text, families_in, is_fallback, only_uvm_bound, ranking)

LINTHRESH = 1.0     # symlog axes: linear up to 1%, logarithmic above
FAMILY_MARKERS = dict(zip(FAMILY_COLORS, "osD^vPph*"))   # fixed too: overlapping points stay apart


def color_of(family: str) -> str:
    return FAMILY_COLORS.get(family, FAMILY_COLORS[OTHER])


def png(fig) -> bytes:
    """The figure as PNG bytes (whole labels: the bounding box is fitted), then closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight", pad_inches=0.15, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


@dataclass
class BarLayout:
    """What a budget's bar chart shows: ``bars`` (the fastest fitting plans, fastest
    first), ``folded`` (every other planner of the column: slower fitting plans, then the
    ones without a plan that fits), and ``families`` (of the bars, in the fixed order)."""
    bars: list[dict]
    folded: list[dict]
    families: list[str]

    def folded_text(self) -> str:
        slower = [r for r in self.folded if r["status"] == OK]
        misses = [r for r in self.folded if r["status"] != OK]
        parts = []
        if slower:
            low, high = min(r["overhead"] for r in slower), max(r["overhead"] for r in slower)
            parts.append(f"{len(slower)} slower ({100 * low:.1f}% to {100 * high:.1f}%)")
        if misses:
            parts.append(f"{len(misses)} without a plan that fits")
        return ", ".join(parts)


def bar_layout(grid: Grid, budget: str, top: int = TOP) -> BarLayout:
    ranked = ranking(grid, budget)
    fits = [row for rank, row in ranked if rank is not None]
    bars = fits[:top]
    folded = fits[top:] + [row for rank, row in ranked if rank is None]
    drawn = {grid.families[r["planner"]] for r in bars}
    return BarLayout(bars, folded, [f for f in FAMILY_COLORS if f in drawn])


def _symlog_helps(values: list[float]) -> bool:
    """A logarithmic axis (above 1%) where the values span more than 30x: else small
    overheads would be invisible next to large ones."""
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) / max(min(positive), LINTHRESH) > 30


def bar_figure(grid: Grid, budget: str, top: int = TOP):
    """The budget's ranked bar chart, or None when no plan fits it."""
    layout = bar_layout(grid, budget, top)
    if not layout.bars:
        return None
    values = [100 * r["overhead"] for r in layout.bars]
    bound = bound_overhead(grid, budget)
    lines = len(layout.bars) + (1 if layout.folded else 0)
    fig, ax = plt.subplots(figsize=(7.0, 1.5 + 0.32 * lines), dpi=100)
    ax.barh(range(len(values)), values, height=0.7,
            color=[color_of(grid.families[r["planner"]]) for r in layout.bars], zorder=2)
    labels = [r["planner"] + (" \u2020" if is_fallback(r) else "") for r in layout.bars]
    if layout.folded:
        labels.append(f"+{len(layout.folded)} more")
    ax.set_yticks(range(lines), labels)
    ax.set_ylim(lines - 0.4, -0.6)    # fastest on top
    log = _symlog_helps(values + ([100 * bound] if bound else []))
    high = max(values + [100 * bound if bound is not None else 0.0, LINTHRESH])
    if log:
        ax.set_xscale("symlog", linthresh=LINTHRESH)
        ax.set_xlim(0, high * 4)
    else:
        ax.set_xlim(0, high * 1.22)
    for y, (value, row) in enumerate(zip(values, layout.bars)):
        ax.text(value, y, " " + cell_text(row), va="center", ha="left", fontsize=8, zorder=3)
    if layout.folded:
        ax.text(0, lines - 1, " " + layout.folded_text(), va="center", ha="left", fontsize=8, color="0.35",
                style="italic", zorder=5, bbox=dict(facecolor="white", edgecolor="none", pad=1.0))
    if bound is not None:
        x = max(100 * bound, 0.0)
        ax.axvline(x, color="black", linestyle="--", linewidth=1.2, zorder=4)
        text = ("bound: the ideal (UVM plans only)" if only_uvm_bound(grid.column(budget))
                else f"bound {100 * bound:.1f}%")
        ax.text(x, 1.0, text, transform=blended_transform_factory(ax.transData, ax.transAxes), ha="left",
                va="bottom", fontsize=8, zorder=4)
    ax.grid(axis="x", alpha=0.3, zorder=0)
    ax.tick_params(axis="y", labelsize=9)
    xlabel = "overhead over the ideal iteration (%" + (", logarithmic above 1%)" if log else ")")
    if any(is_fallback(r) for r in layout.bars):
        xlabel += "\n\u2020 a fallback plan"
    ax.set_xlabel(xlabel)
    ax.set_title(f"{grid.profile} on {grid.hardware}\nbudget {budget_label(grid, budget)}: fastest "
                 f"{len(layout.bars)} of {len(layout.bars) + len(layout.folded)}", fontsize=10, pad=16)
    ax.legend(handles=[Patch(color=color_of(f), label=f) for f in layout.families], title="family",
              fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def family_figure(grid: Grid):
    """Overhead (%) against budget (GiB) of the best plan of each family: a line per family
    over the budgets where one of its plans fits (its legend entry names the plans that
    were best), an x at the top where none of its plans fits, the budgets' bound as a
    shaded floor and a grey band below every planner's floor."""
    gib = {b: grid.budget_bytes(b) / 2**30 for b in grid.budgets}
    order = sorted(grid.budgets, key=lambda b: gib[b])
    fig, ax = plt.subplots(figsize=(8.0, 4.3), dpi=100)
    fitted = [100 * r["overhead"] for r in grid.cells.values() if r["status"] == OK]
    top = max(fitted + [1.0]) * 2.0
    floor = [(gib[b], 100 * bound_overhead(grid, b)) for b in order if bound_overhead(grid, b) is not None]
    if floor:
        ax.fill_between([x for x, _ in floor], 0, [max(y, 0.0) for _, y in floor], color="0.85", zorder=0,
                        label="bound")
    xs = sorted(set(gib.values()))
    span = (max(xs) - min(xs)) or max(xs) * 0.2 or 1.0
    below = [gib[b] for b in order if all(r["status"] == BELOW_FLOOR for r in grid.column(b))]
    if below:
        ax.axvspan(min(xs) - 0.08 * span, max(below) + 0.06 * span, color="0.6", alpha=0.25,
                   label="below every planner's floor")
    best = {b: best_per_family(grid, b) for b in order}
    drawn = families_in(grid)
    for k, family in enumerate(drawn):
        color = color_of(family)
        dodge = (k - (len(drawn) - 1) / 2) * 0.012 * span   # families at one budget side by side, not hidden
        points = [(gib[b] + dodge, 100 * best[b][family]["overhead"]) for b in order if best[b][family] is not None]
        names = list(dict.fromkeys(best[b][family]["planner"] for b in order if best[b][family] is not None))
        misses = [gib[b] + dodge for b in order if best[b][family] is None and any(
            r["status"] != BELOW_FLOOR for r in grid.column(b) if grid.families[r["planner"]] == family)]
        shown = ", ".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "")
        label = f"{family}: {shown}" if names else f"{family}: none fits"
        ax.plot([x for x, _ in points], [y for _, y in points], marker=FAMILY_MARKERS.get(family, "o"), color=color,
                label=label, linewidth=2, markersize=7, zorder=3)
        if misses:
            ax.plot(misses, [top * 0.8] * len(misses), linestyle="none", marker="x", color=color, markersize=9,
                    markeredgewidth=2, zorder=3)
    ax.set_yscale("symlog", linthresh=LINTHRESH)   # linear to 1%, then logarithmic
    ax.set_ylim(0, top)
    ax.set_xlim(min(xs) - 0.08 * span, max(xs) + 0.08 * span)
    ax.set_xticks([gib[b] for b in order], [budget_label(grid, b).replace(" (", "\n(") for b in order],
                  fontsize=8)
    ax.set_xlabel("GPU memory budget")
    ax.set_ylabel("overhead over the ideal iteration (%)")
    ax.set_title(f"{grid.profile} on {grid.hardware}: the best plan of each family\n(x: no plan of the "
                 "family fits; legend: the plans that were best)", fontsize=10)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


__all__ = ["BarLayout", "bar_figure", "bar_layout", "color_of", "family_figure", "png"]
