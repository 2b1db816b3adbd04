"""The facts a comparison's report shows, from its result rows: per (profile, machine) a
``Grid`` of cells, each budget's bound (``cell_bound``: the explicit plans' smallest, the
ideal for a UVM-only column) and each plan's gap to it, the planners ranked per budget,
the best plan of each family, fallback marks, and fixed colours per family. Pure
functions; compare/charts.py draws them and compare/report.py writes the page.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from simulator.units import format_bytes, format_us

from .cells import OK, fallback_reason

OTHER = "other"                  # the family of a planner the registry does not know
TOP = 12                         # bars per budget chart; the rest fold into one "+N more" line

# A fixed colour per family (Okabe-Ito where it goes): the same in every chart and table.
FAMILY_COLORS = {
    "baseline": "#4d4d4d", "swap": "#0072b2", "recompute": "#e69f00", "swap + recompute": "#009e73",
    "placement": "#56b4e9", "compression": "#d55e00", "CPU offload": "#cc79a7", "unified memory": "#6a3d9a",
    OTHER: "#b3b3b3",
}


def family_of(planner: str) -> str:
    """The planner's family (``planner.core.registry.FAMILIES``), ``other`` for one the
    registry does not know."""
    from planner.core.registry import FAMILIES, get_planner
    from simulator.errors import InputError
    try:
        family = get_planner(planner).family
    except InputError:
        return OTHER
    return family if family in FAMILIES else OTHER


def family_order() -> list[str]:
    """Families in the order ``swapplan planners`` lists them, ``other`` last."""
    return list(FAMILY_COLORS)


@dataclass
class Grid:
    """One (profile, machine): its planners (rows), budgets (columns), the row of each
    cell, the best planner per budget, the cell bound per budget (``cell_bound``) and each
    planner's family."""
    profile: str
    hardware: str
    planners: list[str]
    budgets: list[str]
    cells: dict[tuple[str, str], dict]
    best: dict[str, list[str]]
    bound: dict[str, float | None]
    families: dict[str, str] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in f"{self.profile}__{self.hardware}")

    def budget_slug(self, budget: str) -> str:
        """The grid's slug and the budget's, for a file name (``50%`` -> ``50pct``)."""
        text = budget.replace("%", "pct").replace(".", "_")
        return self.slug + "__" + "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in text)

    def budget_bytes(self, budget: str) -> int:
        return next(row["budget_bytes"] for (_, b), row in self.cells.items() if b == budget)

    def column(self, budget: str) -> list[dict]:
        """The rows of a budget, in planner order."""
        return [self.cells[(p, budget)] for p in self.planners if (p, budget) in self.cells]

    @property
    def ideal_us(self) -> float | None:
        return next((r["ideal_us"] for r in self.cells.values() if r.get("ideal_us")), None)


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
            grid.families[row["planner"]] = row.get("family") or family_of(row["planner"])
        if row["budget"] not in grid.budgets:
            grid.budgets.append(row["budget"])
        grid.cells[(row["planner"], row["budget"])] = row
    for grid in found.values():
        for budget in grid.budgets:
            fits = [r for r in grid.column(budget) if r["status"] == OK]
            if fits:
                least = min(r["iteration_us"] for r in fits)
                grid.best[budget] = [r["planner"] for r in fits if r["iteration_us"] <= least * (1 + 1e-9)]
            grid.bound[budget] = cell_bound(grid.column(budget))
    return list(found.values())


UVM_BOUND = "uvm (the ideal)"


def cell_bound(rows: list[dict]) -> float | None:
    """The bound of a budget's column: the smallest of the explicit plans' own bounds (each
    plan is at least its own, so every explicit plan of those kinds is at least this); a
    column of unified-memory plans only has the ideal as its bound (``UVM_BOUND``); None
    without one. A UVM plan's bound (the ideal) would make every column read 0%, so it is
    left out when an explicit plan is there."""
    explicit = [r["lower_bound_us"] for r in rows if r.get("lower_bound_us") is not None and r.get("bound") != UVM_BOUND]
    if explicit:
        return min(explicit)
    ideal = [r["lower_bound_us"] for r in rows if r.get("lower_bound_us") is not None]
    return min(ideal) if ideal else None


def only_uvm_bound(rows: list[dict]) -> bool:
    """Whether the column's bound is the ideal because only UVM plans have a bound."""
    bounded = [r for r in rows if r.get("lower_bound_us") is not None]
    return bool(bounded) and all(r.get("bound") == UVM_BOUND for r in bounded)


def gap_to(row: dict, bound: float | None) -> float | None:
    """How far a fitting plan is above ``bound`` (0.05: 5%); None without a time or a bound.
    Negative only for a plan outside the kinds the bound covers (codecs, ops on the CPU)."""
    if row.get("status") != OK or row.get("iteration_us") is None or not bound or bound <= 0:
        return None
    return row["iteration_us"] / bound - 1.0


def annotate(rows: list[dict]) -> list[dict]:
    """Add to each row (in place) what depends on the other rows of its budget's column:
    ``family``, ``cell_bound_us`` (the column's ``cell_bound``) and ``gap_to_cell_bound``
    (``gap_to``); and ``fallback`` from ``planner_status`` where an older row lacks it.
    Returns the rows."""
    columns: dict[tuple, list[dict]] = {}
    for row in rows:
        columns.setdefault((row["profile"], row["hardware"], row["budget"]), []).append(row)
    families: dict[str, str] = {}
    for column in columns.values():
        bound = cell_bound(column)
        for row in column:
            if row["planner"] not in families:
                families[row["planner"]] = family_of(row["planner"])
            row["family"] = families[row["planner"]]
            row["cell_bound_us"] = bound
            row["gap_to_cell_bound"] = gap_to(row, bound)
            if row.get("fallback") is None:
                row["fallback"] = fallback_reason(row.get("planner_status"), None)
    return rows


def is_fallback(row: dict) -> bool:
    """Whether the row's plan is a fallback: the planner's status says so, or its notes
    (the row's ``fallback`` column) say it fell back."""
    return bool(row.get("fallback")) or row.get("planner_status") == "fallback"


def best_gap(grid: Grid, budget: str) -> float | None:
    """How far the best plan of a column is above its bound (0.05: 5%); None without either."""
    best = [grid.cells[(p, budget)] for p in grid.best.get(budget, ())]
    return gap_to(best[0], grid.bound.get(budget)) if best else None


def gap_text(grid: Grid, budget: str) -> str:
    gap = best_gap(grid, budget)
    return "-" if gap is None else f"{100 * gap:.1f}%"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def cell_text(row: dict | None) -> str:
    """A cell as the tables show it: the overhead, or why there is none."""
    if row is None:
        return ""
    if row["status"] == OK:
        return f"{100 * row['overhead']:.1f}%"
    return row["status"]


def bound_text(grid: Grid, budget: str) -> str:
    """The column's bound as an overhead over the ideal (the overview's row)."""
    bound = grid.bound.get(budget)
    ideal = grid.ideal_us
    if bound is None or not ideal:
        return "-"
    return f"{100 * (bound / ideal - 1):.1f}%" + (" (the ideal: UVM plans only)"
                                                  if only_uvm_bound(grid.column(budget)) else "")


def cell_bound_text(grid: Grid, budget: str) -> str:
    """The column's bound in words: its time and overhead, or that it is the ideal because
    only UVM plans are bounded."""
    bound = grid.bound.get(budget)
    ideal = grid.ideal_us
    if bound is None:
        return "none (no plan here has a bound)"
    if only_uvm_bound(grid.column(budget)):
        return f"the ideal (UVM plans only), {format_us(bound)}"
    return format_us(bound) + (f", {100 * (bound / ideal - 1):.1f}% over the ideal" if ideal else "")


def bound_overhead(grid: Grid, budget: str) -> float | None:
    """The column's bound as an overhead over the ideal (0.006: 0.6%), where the charts draw it."""
    bound, ideal = grid.bound.get(budget), grid.ideal_us
    return None if bound is None or not ideal else bound / ideal - 1.0


def budget_label(grid: Grid, budget: str) -> str:
    row = next(r for (_, b), r in grid.cells.items() if b == budget)
    label = f"{budget} ({format_bytes(row['budget_bytes'])}" + (", capped" if row.get("capped") else "") + ")"
    return label if not budget.endswith(("B", "b")) else f"{format_bytes(row['budget_bytes'])}"


def ranking(grid: Grid, budget: str) -> list[tuple[int | None, dict]]:
    """The budget's plans, fastest first: (rank, row) for each fitting plan (equal times
    share a rank: 1, 1, 3), then (None, row) for the planners without one, in grid order."""
    fits = sorted((r for r in grid.column(budget) if r["status"] == OK),
                  key=lambda r: r["iteration_us"])   # stable: ties keep the grid's order
    ranked: list[tuple[int | None, dict]] = []
    for k, row in enumerate(fits):
        same = k and row["iteration_us"] <= fits[k - 1]["iteration_us"] * (1 + 1e-9)
        ranked.append((ranked[-1][0] if same else k + 1, row))
    return ranked + [(None, r) for r in grid.column(budget) if r["status"] != OK]


def families_in(grid: Grid) -> list[str]:
    """The families of the grid's planners, in ``family_order``."""
    present = set(grid.families.values())
    return [f for f in family_order() if f in present]


def best_per_family(grid: Grid, budget: str) -> dict[str, dict | None]:
    """For each family in the grid: its fastest fitting plan at ``budget`` (None: none fits)."""
    best: dict[str, dict | None] = {f: None for f in families_in(grid)}
    for _, row in ranking(grid, budget):
        family = grid.families[row["planner"]]
        if row["status"] == OK and best[family] is None:
            best[family] = row
    return best
