"""fit's report: ``report.html`` with one chart (step time and throughput against size,
a line per family, the largest size of each marked) and the families' table: the
largest size, who reaches it, the wall at the next size, the best throughput and the
edge plan's file. Self-contained (the chart embedded); drawn from the summary alone.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

from simulator.files import write_atomic
from simulator.units import format_bytes, format_us

REPORT = "report.html"
CHART = "fit.png"


def chart_png(summary: dict) -> bytes:
    """Two panels sharing the size axis: step time (top) and throughput (bottom), a line
    per family over the sizes that fit, its largest size ringed."""
    from compare.charts import color_of, png
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6.5))
    for row in summary["families"]:
        points = [p for p in row["points"] if p["fits"]]
        if not points:
            continue
        sizes = [p["size"] for p in points]
        color = color_of(row["family"])
        top.plot(sizes, [p["iteration_us"] / 1e3 for p in points], "o-", color=color, label=row["family"])
        bottom.plot(sizes, [p["throughput"] for p in points], "o-", color=color)
        bottom.plot([row["max"]], [row["throughput"]], "o", markersize=12, markerfacecolor="none", color=color)
    top.set_ylabel("step time (ms)")
    bottom.set_ylabel(summary["unit"])
    bottom.set_xlabel(f"{summary['axis']} size" + (" (tokens)" if summary["axis"] == "seq" else " (samples)"))
    for axes in (top, bottom):
        axes.set_xscale("log", base=2)
        axes.grid(True, alpha=0.3)
    top.legend(loc="upper left", fontsize=8)
    top.set_title(f"{summary['model']} on {summary['hardware']}, {format_bytes(summary['memory_bytes'])}")
    return png(fig)


def write_report(summary: dict, out: Path) -> Path:
    """Write ``fit.png`` and ``report.html`` into ``out``; returns the page's path."""
    image = chart_png(summary)
    write_atomic(out / CHART, image)
    page = out / REPORT
    write_atomic(page, render(summary, image).encode())
    return page


def render(summary: dict, image: bytes) -> str:
    esc = html.escape
    rows = []
    for row in summary["families"]:
        link = (f'<a href="{esc(row["plan_file"])}">{esc(row["plan_file"])}</a>' if row["plan_file"] else "-")
        over = f" (+{format_bytes(row['next_over_bytes'])})" if row.get("next_over_bytes") else ""
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in (
            esc(row["family"]), row["max"], esc(row["planner"] or "-"),
            format_us(row["iteration_us"]) if row["iteration_us"] else "-",
            f"{row['throughput']:,.1f}" if row["throughput"] else "-",
            f"{row['best_size']} ({row['best_throughput']:,.1f})" if row["best_size"] else "-",
            esc(f"{row['wall'] or '-'}{over}"), esc(row["wall_text"] or ""), link)) + "</tr>")
    way = (summary.get("global_batch") or {}).get("fastest")
    accumulation = ""
    if way:
        accumulation = (f"<p>Global batch {summary['global_batch']['samples']}: {way['micro_batch']} x "
                        f"{way['accumulation_steps']} accumulation steps with {esc(way['planner'])} "
                        f"({esc(way['family'])}), {format_us(way['step_us'])} a step, "
                        f"{way['samples_per_s']:,.1f} samples/s.</p>")
    unit = esc(summary["unit"])
    fixed = ", ".join(f"{k} {v}" for k, v in summary["fixed"].items() if v is not None)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>swapplan fit: {esc(summary['model'])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:90em}}
table{{border-collapse:collapse}}th,td{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}}</style>
</head><body>
<h1>How big can {esc(summary['model'])} train on {esc(summary['hardware'])}?</h1>
<p>Largest {esc(summary['axis'])} per family within {format_bytes(summary['memory_bytes'])}
({summary['memory_bytes']} B) of GPU memory{', ' + esc(fixed) if fixed else ''}, {esc(summary['dtype'])}
{esc(summary['optimizer'])}. Each edge was tried on both sides: the largest size fits, the next does not
(its wall).</p>
<img alt="step time and throughput against size" src="data:image/png;base64,{base64.b64encode(image).decode()}">
<table><tr><th>family</th><th>largest</th><th>planner</th><th>step</th><th>{unit}</th>
<th>best {unit} (size)</th><th>wall at the next size</th><th>why</th><th>edge plan</th></tr>
{''.join(rows)}
</table>
{accumulation}
</body></html>
"""
