"""What a comparison shows: per (profile, machine) a table of overhead by planner and
budget with the best per budget marked, a chart of overhead against budget, and one HTML
page with both. Pure functions of the result rows."""
from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from pathlib import Path

from simulator.files import write_atomic
from simulator.units import format_bytes

from .cells import BELOW_FLOOR, OK

REPORT_HTML = "report.html"


@dataclass
class Grid:
    """One (profile, machine): its planners (rows), budgets (columns), the row of each
    cell, the best planner per budget and the loosest lower bound per budget."""
    profile: str
    hardware: str
    planners: list[str]
    budgets: list[str]
    cells: dict[tuple[str, str], dict]
    best: dict[str, list[str]]
    bound: dict[str, float | None]

    @property
    def slug(self) -> str:
        return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in f"{self.profile}__{self.hardware}")

    def budget_bytes(self, budget: str) -> int:
        return next(row["budget_bytes"] for (_, b), row in self.cells.items() if b == budget)


def grids(rows: list[dict]) -> list[Grid]:
    """Rows grouped by (profile, machine), in the order they first appear."""
    found: dict[tuple[str, str], Grid] = {}
    for row in rows:
        key = (row["profile"], row["hardware"])
        grid = found.get(key)
        if grid is None:
            grid = found[key] = Grid(row["profile"], row["hardware"], [], [], {}, {}, {})
        if row["planner"] not in grid.planners:
            grid.planners.append(row["planner"])
        if row["budget"] not in grid.budgets:
            grid.budgets.append(row["budget"])
        grid.cells[(row["planner"], row["budget"])] = row
    for grid in found.values():
        for budget in grid.budgets:
            fits = [grid.cells[(p, budget)] for p in grid.planners
                    if (p, budget) in grid.cells and grid.cells[(p, budget)]["status"] == OK]
            if fits:
                least = min(r["iteration_us"] for r in fits)
                grid.best[budget] = [r["planner"] for r in fits if r["iteration_us"] <= least * (1 + 1e-9)]
            bounds = [r["lower_bound_us"] for (p, b), r in grid.cells.items()
                      if b == budget and r.get("lower_bound_us") is not None]
            grid.bound[budget] = min(bounds) if bounds else None
    return list(found.values())


def cell_text(row: dict | None) -> str:
    """A cell as the tables show it: the overhead, or why there is none."""
    if row is None:
        return ""
    if row["status"] == OK:
        return f"{100 * row['overhead']:.1f}%"
    return row["status"]


def bound_text(grid: Grid, budget: str) -> str:
    bound = grid.bound.get(budget)
    ideal = next((r["ideal_us"] for r in grid.cells.values() if r.get("ideal_us")), None)
    if bound is None or not ideal:
        return "-"
    return f"{100 * (bound / ideal - 1):.1f}%"


def budget_label(grid: Grid, budget: str) -> str:
    row = next(r for (_, b), r in grid.cells.items() if b == budget)
    label = f"{budget} ({format_bytes(row['budget_bytes'])}" + (", capped" if row.get("capped") else "") + ")"
    return label if not budget.endswith(("B", "b")) else f"{format_bytes(row['budget_bytes'])}"


# ----------------------------------------------------------------------------- chart


def chart_png(grid: Grid) -> bytes:
    """Overhead (%) against budget (GiB): a line per planner over the budgets it fits,
    an x at the top for a plan that does not fit, a grey band below the smallest budget
    any planner can plan for, and the lower bound as a shaded floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = {b: grid.budget_bytes(b) / 2**30 for b in grid.budgets}
    xs = sorted(set(gib.values()))
    fig, ax = plt.subplots(figsize=(8.5, 4.2), dpi=100)
    fitted = [100 * r["overhead"] for r in grid.cells.values() if r["status"] == OK]
    top = max(fitted + [1.0]) * 1.6
    ideal = next((r["ideal_us"] for r in grid.cells.values() if r.get("ideal_us")), None)
    floor = [(gib[b], 100 * (grid.bound[b] / ideal - 1)) for b in grid.budgets
             if grid.bound.get(b) is not None and ideal]
    if floor:
        floor.sort()
        ax.fill_between([x for x, _ in floor], 0, [y for _, y in floor], color="0.85", step=None,
                        label="lower bound", zorder=0)
    below = [gib[b] for b in grid.budgets if all(grid.cells.get((p, b), {}).get("status") == BELOW_FLOOR
                                                   for p in grid.planners)]
    if below:
        ax.axvspan(min(xs) - 0.02 * (max(xs) - min(xs) + 1), max(below), color="0.6", alpha=0.25,
                   label="below every floor")
    markers = "osD^v<>ph*"
    for k, planner in enumerate(grid.planners):
        points = sorted((gib[b], 100 * grid.cells[(planner, b)]["overhead"]) for b in grid.budgets
                        if (planner, b) in grid.cells and grid.cells[(planner, b)]["status"] == OK)
        line, = ax.plot([x for x, _ in points], [y for _, y in points], marker=markers[k % len(markers)],
                        label=planner)
        misses = [gib[b] for b in grid.budgets if (planner, b) in grid.cells
                  and grid.cells[(planner, b)]["status"] not in (OK, BELOW_FLOOR)]
        if misses:
            ax.plot(misses, [top * 0.85] * len(misses), linestyle="none", marker="x", color=line.get_color(),
                    markersize=9)
    ax.set_yscale("symlog", linthresh=1.0)   # linear to 1%, then logarithmic: small and large overheads both show
    ax.set_ylim(0, top)
    ax.set_xlabel("GPU memory budget (GiB)")
    ax.set_ylabel("overhead over the ideal iteration (%)")
    ax.set_title(f"{grid.profile} on {grid.hardware}  (x: does not fit)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def write_charts(grids_: list[Grid], out: Path) -> dict[str, Path]:
    """One PNG per (profile, machine) in ``out``; returns them by grid slug."""
    written = {}
    for grid in grids_:
        path = out / f"{grid.slug}.png"
        write_atomic(path, chart_png(grid))
        written[grid.slug] = path
    return written


# ----------------------------------------------------------------------------- HTML


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{padding:3px 10px;text-align:right;border-bottom:1px solid #ddd}
th:first-child,td:first-child{text-align:left}td.best{background:#d9f2d9;font-weight:bold}
td.miss{color:#a33}td.bound{color:#666;font-style:italic}img{max-width:100%}"""


def html_report(grids_: list[Grid], charts: dict[str, bytes], title: str = "swapplan compare") -> str:
    """One self-contained page: per (profile, machine) its table and chart (embedded)."""
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             "<p>Overhead of the simulated iteration over the ideal one (no swapping, unlimited memory); "
             "the best per budget is highlighted. <i>lower bound</i>: no plan of these kinds can be faster.</p>"]
    for grid in grids_:
        parts.append(f"<h2>{html.escape(grid.profile)} on {html.escape(grid.hardware)}</h2><table><tr><th>planner</th>")
        parts.extend(f"<th>{html.escape(budget_label(grid, b))}</th>" for b in grid.budgets)
        parts.append("</tr>")
        for planner in grid.planners:
            parts.append(f"<tr><td>{html.escape(planner)}</td>")
            for budget in grid.budgets:
                row = grid.cells.get((planner, budget))
                css = "best" if planner in grid.best.get(budget, ()) else ("miss" if row and row["status"] != OK else "")
                tip = html.escape(row["error"] or "", quote=True) if row else ""
                parts.append(f"<td class='{css}' title='{tip}'>{html.escape(cell_text(row))}</td>")
            parts.append("</tr>")
        parts.append("<tr><td class='bound'>lower bound</td>")
        parts.extend(f"<td class='bound'>{html.escape(bound_text(grid, b))}</td>" for b in grid.budgets)
        parts.append("</tr></table>")
        png = charts.get(grid.slug)
        if png:
            parts.append(f"<img alt='overhead against budget' src='data:image/png;base64,"
                         f"{base64.b64encode(png).decode()}'>")
    parts.append("</body></html>\n")
    return "".join(parts)


def write_report(rows: list[dict], out: Path) -> Path:
    """Charts and the HTML page for these rows, into ``out``; returns the page's path."""
    found = grids(rows)
    paths = write_charts(found, out)
    charts = {slug: path.read_bytes() for slug, path in paths.items()}
    page = out / REPORT_HTML
    write_atomic(page, html_report(found, charts).encode())
    return page
