"""What a comparison shows: which plan, and how far from the best possible.

Per (profile, machine): for each budget the planners ranked by overhead (time / ideal - 1)
with the budget's bound (``cell_bound``), each plan's gap to it, planning time, status and
a fallback mark; the best plan of each family per budget; and the overview table of
overhead by planner and budget. The charts are drawn by ``compare.charts``; the HTML page
holds everything (charts embedded) and refers to nothing outside itself. Pure functions of
the result rows; ``annotate`` adds the per-row facts that depend on the other rows
(``family``, ``cell_bound_us``, ``gap_to_cell_bound``) to results.json and results.csv.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

from simulator.files import write_atomic
from simulator.units import format_us

from .cells import BELOW_FLOOR, OK
from .charts import bar_figure, family_figure, png
from .grid import (FAMILY_COLORS, OTHER, Grid, annotate, best_gap, best_per_family, bound_text, budget_label,
                   cell_bound_text, cell_text, families_in, family_order, gap_text, gap_to, grids, is_fallback, pct,
                   ranking)

REPORT_HTML = "report.html"

# ----------------------------------------------------------------------------- charts


def chart_png(grid: Grid) -> bytes:
    """The per-(profile, machine) chart: the best plan of each family against budget."""
    return png(family_figure(grid))


def write_charts(grids_: list[Grid], out: Path) -> dict[str, Path]:
    """Into ``out``: per (profile, machine) ``<slug>.png`` (the best plan of each family
    against budget) and per budget with a fitting plan ``<slug>__<budget>.png`` (the
    ranked bars). Returns them by key: the grid's slug, or ``budget_slug``."""
    written = {}
    for grid in grids_:
        path = out / f"{grid.slug}.png"
        write_atomic(path, png(family_figure(grid)))
        written[grid.slug] = path
        for budget in grid.budgets:
            figure = bar_figure(grid, budget)
            if figure is None:
                continue
            path = out / f"{grid.budget_slug(budget)}.png"
            write_atomic(path, png(figure))
            written[grid.budget_slug(budget)] = path
    return written


# ----------------------------------------------------------------------------- HTML


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:110em}
h2{margin-top:2em;border-bottom:2px solid #ccc}h3{margin:1.4em 0 0.3em}
table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{padding:3px 10px;text-align:right;border-bottom:1px solid #ddd}
th{background:#f4f4f4}th:first-child,td:first-child{text-align:left}td.l,th.l{text-align:left}
td.best{background:#d9f2d9;font-weight:bold}td.miss{color:#a33}td.bound{color:#666;font-style:italic}
td.fb{color:#a60;font-weight:bold}img{max-width:100%;height:auto}
.sw{display:inline-block;width:0.9em;height:0.9em;border-radius:2px;margin-right:0.4em;vertical-align:-0.1em}
.row{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}.row>img{flex:0 1 auto;max-width:48em}
.note{color:#555;font-size:0.92em}.legend span.item{margin-right:1.2em;white-space:nowrap}
ul.toc{columns:2}summary{cursor:pointer;color:#555;margin-bottom:0.3em}"""

E = html.escape


def _swatch(family: str) -> str:
    color = FAMILY_COLORS.get(family, FAMILY_COLORS[OTHER])
    return f"<span class='sw' style='background:{color}'></span>{E(family)}"


def _img(png: bytes | None, alt: str) -> str:
    if not png:
        return ""
    return f"<img alt='{E(alt, quote=True)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def _overview(grid: Grid) -> list[str]:
    parts = ["<table class='overview'><tr><th>planner</th><th class='l'>family</th>"]
    parts.extend(f"<th>{E(budget_label(grid, b))}</th>" for b in grid.budgets)
    parts.append("</tr>")
    for planner in grid.planners:
        parts.append(f"<tr><td>{E(planner)}</td><td class='l'>{_swatch(grid.families[planner])}</td>")
        for budget in grid.budgets:
            row = grid.cells.get((planner, budget))
            css = "best" if planner in grid.best.get(budget, ()) else ("miss" if row and row["status"] != OK else "")
            tip = E(row["error"] or "", quote=True) if row else ""
            parts.append(f"<td class='{css}' title='{tip}'>{E(cell_text(row))}</td>")
        parts.append("</tr>")
    parts.append("<tr><td class='bound'>lower bound</td><td></td>")
    parts.extend(f"<td class='bound'>{E(bound_text(grid, b))}</td>" for b in grid.budgets)
    parts.append("</tr><tr><td class='bound'>gap of the best</td><td></td>")
    parts.extend(f"<td class='bound'>{E(gap_text(grid, b))}</td>" for b in grid.budgets)
    parts.append("</tr></table>")
    return parts


def _family_table(grid: Grid) -> list[str]:
    parts = ["<table class='families'><tr><th>family</th>"]
    parts.extend(f"<th>{E(budget_label(grid, b))}</th>" for b in grid.budgets)
    parts.append("</tr>")
    best = {b: best_per_family(grid, b) for b in grid.budgets}
    for family in families_in(grid):
        parts.append(f"<tr><td>{_swatch(family)}</td>")
        for budget in grid.budgets:
            row = best[budget][family]
            if row is None:
                parts.append("<td class='miss'>none fits</td>")
                continue
            gap = gap_to(row, grid.bound.get(budget))
            css = "best" if row["planner"] in grid.best.get(budget, ()) else ""
            parts.append(f"<td class='{css}'>{E(row['planner'])}{' &dagger;' if is_fallback(row) else ''} "
                         f"{E(cell_text(row))} <span class='note'>(gap {E(pct(gap))})</span></td>")
        parts.append("</tr>")
    parts.append("</table>")
    return parts


def _status(row: dict) -> str:
    if row["status"] == OK:
        return f"ok ({row['planner_status']})" if row.get("planner_status") else "ok"
    return row["status"]


_RANKED_HEAD = ("<table class='ranking'><tr><th>#</th><th class='l'>planner</th><th class='l'>family</th>"
                "<th>overhead</th><th>iteration</th><th>gap to bound</th><th>planning</th><th class='l'>status</th>"
                "<th class='l'>fallback</th></tr>")


def _ranked_table(grid: Grid, budget: str) -> list[str]:
    """The fitting plans ranked, then (folded, open on a click) the planners without one."""
    ranked = ranking(grid, budget)
    fits = [(rank, row) for rank, row in ranked if rank is not None]
    misses = [(rank, row) for rank, row in ranked if rank is None]
    parts = ([_RANKED_HEAD] + _ranked_rows(grid, budget, fits) + ["</table>"]) if fits else []
    if misses:
        counts: dict[str, int] = {}
        for _, row in misses:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        parts.append(f"<details{'' if fits else ' open'}><summary>{len(misses)} without a plan that fits: "
                     + E(", ".join(f"{status} {n}" for status, n in counts.items())) + "</summary>"
                     + _RANKED_HEAD)
        parts += _ranked_rows(grid, budget, misses) + ["</table></details>"]
    return parts


def _ranked_rows(grid: Grid, budget: str, ranked: list[tuple[int | None, dict]]) -> list[str]:
    bound = grid.bound.get(budget)
    parts = []
    for rank, row in ranked:
        ok = row["status"] == OK
        css = "best" if row["planner"] in grid.best.get(budget, ()) else ""
        name_css = f"l {css}".strip()
        tip = E(row.get("error") or "", quote=True)
        seconds = row.get("planning_seconds")
        fallback = (f"<td class='l fb' title='{E(row.get('fallback') or 'status fallback', quote=True)}'>"
                    "&dagger; fallback</td>") if is_fallback(row) else "<td></td>"
        parts.append(f"<tr><td>{rank if rank is not None else ''}</td><td class='{name_css}'>{E(row['planner'])}</td>"
                     f"<td class='l'>{_swatch(grid.families[row['planner']])}</td>"
                     f"<td class='{css}'>{E(cell_text(row)) if ok else '-'}</td>"
                     f"<td>{E(format_us(row['iteration_us'])) if ok and row.get('iteration_us') else '-'}</td>"
                     f"<td>{E(pct(gap_to(row, bound)))}</td>"
                     f"<td>{'-' if seconds is None else f'{seconds:.2f} s'}</td>"
                     f"<td class='l{'' if ok else ' miss'}' title='{tip}'>{E(_status(row))}</td>{fallback}</tr>")
    return parts


def _summary(grid: Grid, budget: str) -> str:
    best = grid.best.get(budget)
    if not best:
        below = all(r["status"] == BELOW_FLOOR for r in grid.column(budget))
        return "no plan fits" + (" (below every planner's floor)" if below else "")
    row = grid.cells[(best[0], budget)]
    return (f"best: <b>{E(', '.join(best))}</b> ({E(grid.families[best[0]])}), {E(cell_text(row))} over the ideal, "
            f"{E(pct(best_gap(grid, budget)))} above the bound")


def html_report(grids_: list[Grid], charts: dict[str, bytes], title: str = "swapplan compare") -> str:
    """One self-contained page (styles inline, charts embedded, no link outside it): per
    (profile, machine) the best plan per budget, the best of each family (chart and
    table), per budget the ranked plans (chart and table), and the overview table."""
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{E(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{E(title)}</h1>",
             "<p class='note'><i>overhead</i>: the simulated iteration over the ideal one (no swapping, unlimited "
             "memory) minus 1. <i>bound</i> of a budget: no explicit plan of these planners' kinds can be faster "
             "(the smallest of their own lower bounds; where only unified-memory plans have one, the ideal). "
             "<i>gap to bound</i>: how far a plan is above it (negative only for a plan outside those kinds: "
             "codecs, ops on the CPU). &dagger; <i>fallback</i>: the planner's own method gave no plan that fits, "
             "and this is its fallback. The best per budget is highlighted.</p>",
             "<p class='legend'>families: " + "".join(f"<span class='item'>{_swatch(f)}</span>"
                                                     for f in family_order()) + "</p>"]
    if len(grids_) > 1:
        parts.append("<ul class='toc'>" + "".join(f"<li><a href='#{E(g.slug, quote=True)}'>{E(g.profile)} on "
                                                  f"{E(g.hardware)}</a></li>" for g in grids_) + "</ul>")
    for grid in grids_:
        ideal = grid.ideal_us
        parts.append(f"<h2 id='{E(grid.slug, quote=True)}'>{E(grid.profile)} on {E(grid.hardware)}</h2>"
                     f"<p class='note'>{len(grid.planners)} planners in {len(families_in(grid))} families"
                     + (f"; ideal iteration {E(format_us(ideal))}" if ideal else "") + "</p><ul>")
        parts.extend(f"<li>{E(budget_label(grid, b))}: {_summary(grid, b)}</li>" for b in grid.budgets)
        parts.append("</ul><h3>Best plan of each family</h3><div class='row'>")
        parts.append(_img(charts.get(grid.slug), f"best plan of each family against budget, {grid.profile} on "
                                                 f"{grid.hardware}"))
        parts.append("<div>")
        parts.extend(_family_table(grid))
        parts.append("</div></div>")
        for budget in grid.budgets:
            parts.append(f"<h3>{E(budget_label(grid, budget))}</h3><p>bound: {E(cell_bound_text(grid, budget))}; "
                         f"{_summary(grid, budget)}</p><div class='row'>")
            parts.append(_img(charts.get(grid.budget_slug(budget)), f"planners ranked by overhead at {budget}"))
            parts.append("<div>")
            parts.extend(_ranked_table(grid, budget))
            parts.append("</div></div>")
        parts.append("<h3>Overview: overhead by planner and budget</h3>")
        parts.extend(_overview(grid))
    parts.append("</body></html>\n")
    return "".join(parts)


def write_report(rows: list[dict], out: Path) -> Path:
    """Charts and the HTML page for these rows, into ``out``; returns the page's path.
    The rows are annotated (``annotate``) on the way."""
    found = grids(annotate(rows))
    paths = write_charts(found, out)
    charts = {key: path.read_bytes() for key, path in paths.items()}
    page = out / REPORT_HTML
    write_atomic(page, html_report(found, charts).encode())
    return page
