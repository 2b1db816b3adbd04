"""The comparison's report: ranking, the budget's bound and the gaps to it, fallback marks,
the best plan of each family, the charts (family colours, the top bars and the folded
rest, legends) and a self-contained HTML page; rows built by hand, so it runs in seconds."""
from __future__ import annotations

import base64
import csv
import json
import shutil
import subprocess
from html.parser import HTMLParser

import matplotlib
import pytest

matplotlib.use("Agg")
from matplotlib.colors import to_hex  # noqa: E402

from compare.cells import COLUMNS, fallback_reason, run_cell  # noqa: E402
from compare.charts import bar_figure, bar_layout, family_figure, png  # noqa: E402
from compare.grid import (FAMILY_COLORS, OTHER, TOP, UVM_BOUND, annotate, best_per_family, bound_text,  # noqa: E402
                          cell_bound, cell_bound_text, family_of, grids, is_fallback, ranking)
from compare.report import html_report, write_report  # noqa: E402
from compare.sweep import compare_folder, expand_cells  # noqa: E402
from planner.core.registry import FAMILIES, select_planners  # noqa: E402

IDEAL = 1000.0
GIB = 2**30


def _row(planner, budget="50%", iteration=None, bound_us=None, bound="swap", status=None, planner_status="heuristic",
         fallback=None, profile="p", hardware="h", budget_bytes=None, seconds=0.5):
    """A result row as run_cell writes it: ``iteration`` None is a plan that does not fit."""
    status = status or ("ok" if iteration is not None else "infeasible")
    return {"profile": profile, "hardware": hardware, "planner": planner, "params": "{}", "seed": 0,
            "budget": budget, "budget_bytes": budget_bytes or int(budget.rstrip("%")) * GIB // 10, "capped": False,
            "status": status, "planner_status": None if status in ("below-floor", "timeout") else planner_status,
            "fallback": fallback, "feasible": status == "ok",
            "iteration_us": iteration if status == "ok" else None, "ideal_us": IDEAL,
            "overhead": iteration / IDEAL - 1 if status == "ok" else None,
            "lower_bound_us": bound_us, "gap_to_bound": None if not (bound_us and iteration) else iteration / bound_us - 1,
            "bound": bound if bound_us is not None else None, "peak_bytes": 0, "bytes_pcie_down": 0,
            "bytes_pcie_up": 0, "bytes_ssd_read": 0, "bytes_ssd_write": 0, "actions": 0,
            "planning_seconds": seconds, "plan_file": None, "error": None if status == "ok" else f"{status}: why"}


def _rows():
    """Two budgets: at 50% explicit plans (the bound is capuchin's, 1005) and a UVM plan;
    at 30% only UVM fits and only its bound (the ideal) is there."""
    return [
        _row("lms", "50%", 1100.0, 1050.0),
        _row("capuchin", "50%", 1010.0, 1005.0, "swap+recompute"),
        _row("vdnn", "50%", 1400.0, 1050.0, planner_status="fallback", fallback="vDNN's rules do not fit"),
        _row("g10", "50%", 1080.0, 1040.0, "swap+persistent"),
        _row("uvm", "50%", 2000.0, IDEAL, UVM_BOUND),
        _row("none", "50%", None, 1050.0),
        _row("lms", "30%", status="below-floor"),
        _row("capuchin", "30%", status="below-floor"),
        _row("vdnn", "30%", status="below-floor"),
        _row("g10", "30%", status="below-floor"),
        _row("uvm", "30%", 3000.0, IDEAL, UVM_BOUND),
        _row("none", "30%", status="below-floor"),
    ]


def test_annotate_adds_family_cell_bound_and_gap_to_every_row():
    rows = annotate(_rows())
    by = {(r["planner"], r["budget"]): r for r in rows}
    assert {r["planner"]: r["family"] for r in rows} == {
        "lms": "swap", "capuchin": "swap + recompute", "vdnn": "swap", "g10": "swap", "uvm": "unified memory",
        "none": "baseline"}
    # 50%: the smallest explicit bound (capuchin's), not the UVM plan's ideal
    assert all(r["cell_bound_us"] == 1005.0 for r in rows if r["budget"] == "50%")
    assert by[("lms", "50%")]["gap_to_cell_bound"] == pytest.approx(1100 / 1005 - 1)
    assert by[("capuchin", "50%")]["gap_to_cell_bound"] == pytest.approx(1010 / 1005 - 1)
    assert by[("uvm", "50%")]["gap_to_cell_bound"] == pytest.approx(2000 / 1005 - 1)
    assert by[("none", "50%")]["gap_to_cell_bound"] is None            # no plan that fits: no gap
    # 30%: only the UVM plan has a bound, the ideal
    assert all(r["cell_bound_us"] == IDEAL for r in rows if r["budget"] == "30%")
    assert by[("uvm", "30%")]["gap_to_cell_bound"] == pytest.approx(2.0)
    assert by[("lms", "30%")]["gap_to_cell_bound"] is None
    # an unknown planner is "other"; an older row without ``fallback`` gets it from its status
    old = _row("mystery", iteration=1200.0, planner_status="fallback")
    del old["fallback"]
    annotate([old])
    assert old["family"] == OTHER and family_of("no-such-planner") == OTHER and old["fallback"]


def test_cell_bound_with_and_without_uvm_rows():
    explicit = [_row("lms", iteration=1100.0, bound_us=1050.0), _row("joint", iteration=1020.0, bound_us=1001.0)]
    uvm = [_row("uvm", iteration=2000.0, bound_us=IDEAL, bound=UVM_BOUND)]
    assert cell_bound(explicit) == 1001.0
    assert cell_bound(explicit + uvm) == 1001.0          # the ideal would make every gap read as 0%
    assert cell_bound(uvm) == IDEAL
    assert cell_bound([_row("lms", status="below-floor")]) is None
    grid = {g.profile: g for g in grids(annotate(_rows()))}["p"]
    assert cell_bound_text(grid, "30%").startswith("the ideal (UVM plans only)")
    assert bound_text(grid, "30%") == "0.0% (the ideal: UVM plans only)"
    assert "UVM" not in cell_bound_text(grid, "50%") and "0.5% over the ideal" in cell_bound_text(grid, "50%")


def test_ranking_is_by_time_ties_share_a_rank_and_misses_come_last():
    rows = [_row("a", iteration=1200.0), _row("b", iteration=1010.0), _row("c", iteration=1010.0),
            _row("d"), _row("e", iteration=1100.0), _row("f", status="timeout")]
    grid = grids(rows)[0]
    assert [(rank, r["planner"]) for rank, r in ranking(grid, "50%")] == \
        [(1, "b"), (1, "c"), (3, "e"), (4, "a"), (None, "d"), (None, "f")]
    assert grid.best["50%"] == ["b", "c"]


def test_fallback_marks():
    assert fallback_reason("heuristic", {"fallback": "the heuristic plan simulated faster"}) == \
        "the heuristic plan simulated faster"
    assert fallback_reason("fallback", {}) and fallback_reason("heuristic", {"mode": "all"}) is None
    assert is_fallback(_row("x", iteration=1.0, planner_status="fallback"))
    assert is_fallback(_row("x", iteration=1.0, fallback="fell back"))      # status heuristic, notes say so
    assert not is_fallback(_row("x", iteration=1.0))
    rows = annotate(_rows())
    grid = grids(rows)[0]
    page = _Page.of(html_report([grid], {}))
    marked = {cells[1] for cells in page.rows("ranking") if "fallback" in cells[-1]}
    assert marked == {"vdnn"}
    layout = bar_layout(grid, "50%")
    fig = bar_figure(grid, "50%")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "vdnn \u2020" in labels and "lms" in labels and len(layout.bars) == 5


def test_a_planner_that_falls_back_is_marked_in_its_row():
    # vDNN's own rules do not fit this transformer at 50%: its plan is the wider fallback
    row, _ = run_cell(expand_cells(["synth-transformer-l12-b16-s1024"], ["a100-40gb-pcie4"], ["vdnn"], ["50%"])[0])
    assert row["planner_status"] == "fallback" and "do not fit" in row["fallback"]


def test_best_plan_per_family():
    grid = grids(annotate(_rows()))[0]
    best = best_per_family(grid, "50%")
    assert list(best) == ["baseline", "swap", "swap + recompute", "unified memory"]   # the fixed order
    assert best["swap"]["planner"] == "g10" and best["swap + recompute"]["planner"] == "capuchin"
    assert best["baseline"] is None and best_per_family(grid, "30%")["swap"] is None
    page = _Page.of(html_report([grid], {}))
    table = {cells[0]: cells[1:] for cells in page.rows("families")}
    assert table["swap"][0].startswith("g10 8.0%") and table["baseline"] == ["none fits", "none fits"]
    assert table["unified memory"][1].startswith("uvm 200.0%")


def _many(n_known=33, n_unknown=7, misses=5):
    """40 planners at one budget: every registered one (the families' colours) and some the
    registry does not know, ``misses`` of them without a plan that fits."""
    names = select_planners("all")[:n_known] + [f"x{k}" for k in range(n_unknown)]
    rows = []
    for k, name in enumerate(names):
        fits = k % (len(names) // misses) != 3 if misses else True
        rows.append(_row(name, iteration=IDEAL * (1.01 + ((k * 7919) % 97) / 50) if fits else None, bound_us=1005.0))
    return annotate(rows), names


def test_every_planner_is_a_bar_or_counted_in_the_folded_line_and_colours_are_the_families():
    rows, names = _many()
    grid = grids(rows)[0]
    layout = bar_layout(grid, "50%")
    bars = [r["planner"] for r in layout.bars]
    folded = [r["planner"] for r in layout.folded]
    assert len(names) == 40 and len(bars) == TOP and sorted(bars + folded) == sorted(names)
    fastest = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["iteration_us"])[:TOP]
    assert bars == [r["planner"] for r in fastest]
    fig = bar_figure(grid, "50%")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == bars + [f"+{len(folded)} more"]
    # bars top to bottom are the ranking, each in its family's colour
    patches = sorted(ax.patches, key=lambda p: p.get_y())
    assert len(patches) == TOP
    assert [p.get_width() for p in patches] == pytest.approx([100 * r["overhead"] for r in fastest])
    assert [to_hex(p.get_facecolor()) for p in patches] == [FAMILY_COLORS[grid.families[b]] for b in bars]
    # the legend names exactly the families drawn, in the fixed order
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    drawn = {grid.families[b] for b in bars}
    assert legend == [f for f in FAMILY_COLORS if f in drawn]
    # the folded line says how many are slower and how many have no plan
    text = " ".join(t.get_text() for t in ax.texts)
    slower = sum(1 for r in layout.folded if r["status"] == "ok")
    assert f"{slower} slower" in text and f"{len(folded) - slower} without a plan that fits" in text
    # the bound: a labelled vertical line at its overhead
    verticals = [line for line in ax.get_lines() if len(set(line.get_xdata())) == 1]
    assert len(verticals) == 1 and verticals[0].get_xdata()[0] == pytest.approx(0.5)
    assert "bound 0.5%" in text
    png(fig)


def test_family_colours_are_fixed_and_the_same_in_every_chart():
    assert set(FAMILIES) | {OTHER} == set(FAMILY_COLORS)
    assert len(set(FAMILY_COLORS.values())) == len(FAMILY_COLORS)
    # capuchin in a grid of two and in a grid of forty: the same colour
    small = grids(annotate([_row("capuchin", iteration=1010.0, profile="q"), _row("lms", iteration=1100.0,
                                                                                 profile="q")]))[0]
    many = _many()[0]
    capuchin = next(r for r in many if r["planner"] == "capuchin")
    capuchin.update(status="ok", iteration_us=1001.0, overhead=0.001)     # a bar there too: the fastest
    big = grids(many)[0]
    colours = []
    for grid in (small, big):
        ax = bar_figure(grid, "50%").axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        patch = sorted(ax.patches, key=lambda p: p.get_y())[labels.index("capuchin")]
        colours.append(to_hex(patch.get_facecolor()))
    assert colours == [FAMILY_COLORS["swap + recompute"]] * 2


def test_the_family_chart_has_one_line_per_family_named_in_the_legend():
    grid = grids(annotate(_rows()))[0]
    ax = family_figure(grid).axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    families = [t.split(":")[0] for t in legend if ":" in t]
    assert families == ["baseline", "swap", "swap + recompute", "unified memory"]
    assert "swap: g10" in legend and "unified memory: uvm" in legend and "baseline: none fits" in legend
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert to_hex(lines["swap: g10"].get_color()) == FAMILY_COLORS["swap"]
    assert list(lines["unified memory: uvm"].get_ydata()) == pytest.approx([200.0, 100.0])   # 30%, then 50%
    # 40 planners: still one line per family
    big = grids(_many()[0])[0]
    legend = [t.get_text() for t in family_figure(big).axes[0].get_legend().get_texts()]
    assert len([t for t in legend if ":" in t]) == len({big.families[p] for p in big.planners})


def test_no_plan_fits_no_bar_chart():
    grid = grids([_row("lms", status="below-floor"), _row("g10")])[0]
    assert bar_figure(grid, "50%") is None
    page = _Page.of(html_report([grid], {}))
    assert "no plan fits" in page.text and page.rows("ranking")   # the table still lists both


# ----------------------------------------------------------------------------- the page


class _Page(HTMLParser):
    """The parts of a page the tests read: tags, attributes, text, tables by class."""

    def __init__(self):
        super().__init__()
        self.tags, self.attrs, self.text, self.ids = [], [], "", set()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self._cell = None

    @classmethod
    def of(cls, text: str) -> "_Page":
        page = cls()
        page.feed(text)
        page.close()
        return page

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        self.attrs.append((tag, attrs))
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "table":
            self.tables.append((attrs.get("class", ""), []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self.tables:
            self.tables[-1][1][-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        self.text += data
        if self._cell is not None:
            self._cell += data

    def rows(self, css: str) -> list[list[str]]:
        """The data rows (no header) of every table of this class."""
        return [row for cls, rows in self.tables if cls == css for row in rows[1:]]


def test_the_page_is_self_contained_and_holds_every_table_and_chart(tmp_path):
    rows = _rows() + [dict(r, profile="q") for r in _rows()]
    page_path = write_report(rows, tmp_path)
    text = page_path.read_text()
    page = _Page.of(text)
    # every chart on disk is embedded: per (profile, machine) the family chart, and a bar chart
    # per budget with a plan that fits
    written = sorted(p.name for p in tmp_path.glob("*.png"))
    assert written == sorted(f"{p}__h{s}.png" for p in "pq" for s in ("", "__30pct", "__50pct"))
    images = [attrs["src"] for tag, attrs in page.attrs if tag == "img"]
    assert len(images) == len(written)
    embedded = {base64.b64decode(src.removeprefix("data:image/png;base64,")) for src in images}
    assert all(src.startswith("data:image/png;base64,") for src in images)
    assert embedded == {(tmp_path / name).read_bytes() for name in written}
    # nothing outside the page: no scripts, styles or frames by reference, no URLs; links are in-page
    assert not {"script", "link", "iframe", "object", "embed", "base"} & set(page.tags)
    for tag, attrs in page.attrs:
        for key in ("href", "src", "action", "background", "srcset"):
            value = attrs.get(key)
            if value is None or (tag == "img" and key == "src"):
                continue
            assert key == "href" and value.startswith("#") and value[1:] in page.ids, (tag, key, value)
    lowered = text.lower()
    assert "http:" not in lowered and "https:" not in lowered and "url(" not in lowered and "@import" not in lowered
    # per (profile, machine): the overview, the families and one ranking per budget, every planner in each
    classes = [cls for cls, _ in page.tables]
    assert classes.count("overview") == 2 and classes.count("families") == 2
    ranked = page.rows("ranking")
    planners = {r["planner"] for r in rows}
    assert len(ranked) == len(rows) and {cells[1] for cells in ranked} == planners
    assert [cells[1] for cells in ranked[:6]] == ["capuchin", "g10", "lms", "vdnn", "uvm", "none"]
    first = ranked[0]
    assert first[0] == "1" and first[3] == "1.0%" and first[5] == "0.5%" and first[6] == "0.50 s"
    assert "the ideal (UVM plans only)" in page.text


def test_results_json_and_csv_carry_family_and_the_cell_bound(tmp_path):
    store = compare_folder(tmp_path)
    store.open()
    store.save([dict(row, key=str(k)) for k, row in enumerate(_rows())])
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["columns"] == list(COLUMNS)
    assert {"family", "fallback", "cell_bound_us", "gap_to_cell_bound"} <= set(COLUMNS)
    by = {(r["planner"], r["budget"]): r for r in data["rows"]}
    assert by[("capuchin", "50%")]["family"] == "swap + recompute"
    assert by[("lms", "50%")]["cell_bound_us"] == 1005.0
    assert by[("lms", "50%")]["gap_to_cell_bound"] == pytest.approx(1100 / 1005 - 1)
    assert by[("vdnn", "50%")]["fallback"] == "vDNN's rules do not fit"
    with open(tmp_path / "results.csv") as handle:
        csv_rows = {(r["planner"], r["budget"]): r for r in csv.DictReader(handle)}
    assert csv_rows[("uvm", "30%")]["family"] == "unified memory"
    assert float(csv_rows[("uvm", "30%")]["cell_bound_us"]) == IDEAL
    assert float(csv_rows[("uvm", "30%")]["gap_to_cell_bound"]) == pytest.approx(2.0)
    assert csv_rows[("none", "30%")]["gap_to_cell_bound"] == ""


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def test_a_real_browser_renders_the_page(tmp_path):
    browser = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if browser is None:
        pytest.skip(f"no headless browser on this machine (looked for {', '.join(BROWSERS)}); "
                    "Debian: apt-get install chromium")
    page = write_report(annotate(_rows()), tmp_path)
    shot = tmp_path / "shot.png"
    # the network flags: this machine's network is closed, and Chromium's background
    # connections would otherwise be refused many at a time
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--disable-quic",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600",
                    f"--screenshot={shot}", page.resolve().as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.exists(), "the browser wrote no screenshot"
    import numpy as np
    from PIL import Image
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=int)
    assert pixels.shape == (1600, 1200, 3)
    ink = float((pixels.sum(axis=2) < 600).mean())
    assert ink > 0.01, f"the page looks blank ({100 * ink:.2f}% of pixels not near white)"
    # the embedded charts rendered: the swap family's blue covers far more than its swatches
    # in the tables (about 1,500 pixels without the charts, 19,000 with them)
    blue = np.array([int(FAMILY_COLORS["swap"][k:k + 2], 16) for k in (1, 3, 5)])
    assert int((np.abs(pixels - blue).max(axis=2) < 12).sum()) > 6000
