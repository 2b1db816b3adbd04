"""What fit reports per family, from the probes' rows: the largest size and who reaches
it, its step time and throughput, the wall at the next size, the size with the best
throughput, and with a global batch the fastest micro-batch x accumulation steps. Pure
functions of the rows.
"""
from __future__ import annotations

import math

from .search import EdgeSearch
from .traces import TraceSpec, Traced

# the fields of a family's row in results.json and --json, in order
FAMILY_FIELDS = ("family", "max", "planner", "iteration_us", "throughput", "unit", "wall", "wall_op", "wall_text",
                 "next_size", "next_over_bytes", "peak_bytes", "reserved_bytes", "plan_file", "best_size", "best_planner",
                 "best_throughput", "tried", "planners", "points")


def throughput(spec: TraceSpec, units: int, iteration_us: float, batch: int) -> float:
    """Samples per second on the batch axis; tokens per second (batch x context) on the
    seq axis; of every rank together (a rank's batch is the size)."""
    per_step = spec.size(units) if spec.axis == "batch" else batch * spec.size(units)
    return spec.ranks * per_step / (iteration_us / 1e6)


def unit_of(spec: TraceSpec) -> str:
    return "samples/s" if spec.axis == "batch" else "tokens/s"


def fastest(rows: list[dict]) -> dict | None:
    """The fitting row with the shortest step (ties: the first planner)."""
    return min((r for r in rows if r["fits"]), key=lambda r: r["iteration_us"], default=None)


def family_row(family: str, planners: tuple[str, ...], search: EdgeSearch, spec: TraceSpec,
               rows: dict[tuple[int, str], dict], traces: dict[int, Traced], batch: int) -> dict:
    """One family's result (``FAMILY_FIELDS``)."""
    at = lambda units: [rows[(units, p)] for p in planners if (units, p) in rows]   # noqa: E731
    largest = search.largest
    edge = fastest(at(largest)) if largest else None
    out = dict.fromkeys(FAMILY_FIELDS)
    tried = sorted(units for units in {u for (u, _) in rows} if len(at(units)) == len(planners))
    out.update(family=family, max=spec.size(largest), unit=unit_of(spec), planners=list(planners),
               tried=[spec.size(k) for k in tried])
    if edge is not None:
        out.update(planner=edge["planner"], iteration_us=edge["iteration_us"], peak_bytes=edge["peak_bytes"],
                   reserved_bytes=edge.get("reserved_bytes"),
                   throughput=throughput(spec, largest, edge["iteration_us"], batch), plan_file=edge["plan_file"])
    nxt = largest + 1
    out["next_size"] = spec.size(nxt)
    if search.at_limit:
        out.update(wall="limit", wall_text=f"every size up to the search's limit ({spec.size(search.limit)}) fits",
                   next_size=None)
    elif nxt in traces and traces[nxt].error is not None:
        out.update(wall="trace", wall_text=f"cannot trace {spec.axis} {spec.size(nxt)}: {traces[nxt].error}")
    else:
        failing = at(nxt)
        chosen = next((r for r in failing if edge is not None and r["planner"] == edge["planner"]),
                      failing[0] if failing else None)
        if chosen is not None:
            out.update(wall=chosen["wall"], wall_op=chosen["wall_op"], wall_text=chosen["wall_text"],
                       next_over_bytes=chosen["over_bytes"])
    best, points = None, []
    for units in tried:
        row = fastest(at(units))
        point = {"size": spec.size(units), "fits": row is not None, "planner": None, "iteration_us": None,
                 "throughput": None}
        if row is not None:
            speed = throughput(spec, units, row["iteration_us"], batch)
            point.update(planner=row["planner"], iteration_us=row["iteration_us"], throughput=speed)
            if best is None or speed > best[0]:
                best = (speed, units, row["planner"])
        points.append(point)
    out["points"] = points
    if best is not None:
        out.update(best_throughput=best[0], best_size=spec.size(best[1]), best_planner=best[2])
    return out


def accumulation_candidates(global_batch: int, step: int, largest: int) -> list[int]:
    """The micro-batches (in steps) worth probing for ``global_batch`` samples a step:
    for the three fewest accumulation counts the largest fitting micro-batch allows, the
    smallest micro-batch that still reaches the global batch in that many (so that no
    sample is wasted)."""
    if largest < 1:
        return []
    found = []
    fewest = math.ceil(global_batch / (largest * step))
    for count in range(fewest, fewest + 3):
        units = math.ceil(global_batch / (count * step))
        if 1 <= units <= largest and units not in found:
            found.append(units)
    return found


def accumulation(family: str, planners: tuple[str, ...], global_batch: int, spec: TraceSpec, largest: int,
                 rows: dict[tuple[int, str], dict], traces: dict[int, Traced]) -> dict | None:
    """The fastest way to train ``global_batch`` samples a step in this family: the
    micro-batch, the accumulation steps, and the step time, counted as the micro-batch's
    step repeated with its optimizer ops once (docs/fit.md: the repeated steps' optimizer
    time is the ideal one, taken off)."""
    best = None
    ranks = spec.ranks                    # every rank trains a micro-batch of its own
    for units in accumulation_candidates(math.ceil(global_batch / ranks), spec.step, largest):
        row = fastest([rows[(units, p)] for p in planners if (units, p) in rows])
        if row is None:
            continue
        micro = spec.size(units)
        count = math.ceil(global_batch / (micro * ranks))
        optimizer_us = traces[units].optimizer_us or 0.0
        step_us = count * row["iteration_us"] - (count - 1) * optimizer_us
        if best is None or step_us < best["step_us"]:
            best = {"family": family, "micro_batch": micro, "accumulation_steps": count, "planner": row["planner"],
                    "step_us": step_us, "samples_per_s": global_batch / (step_us / 1e6)}
    return best
