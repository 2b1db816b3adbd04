"""What the command line prints for people: tables, a simulation's result, a replay's and a
training run's report, a comparison (the cli_* commands parse and call; this module only formats)."""
from __future__ import annotations

import os
import re
import sys

import click

from planner.shared.bound import bound_words
from simulator.units import format_bytes, format_us


def table(title: str | None, columns: list[str], rows: list[list], right: set[int] = frozenset()) -> None:
    from rich.console import Console
    from rich.table import Table

    view = Table(title=title, box=None, title_justify="left", header_style="bold", pad_edge=False)
    for k, column in enumerate(columns):
        view.add_column(column, justify="right" if k in right else "left", no_wrap=True)
    for row in rows:
        view.add_row(*[str(cell) for cell in row])
    # Not a terminal (a pipe, a file): never wrap or cut rows.
    width = None if sys.stdout.isatty() else 400
    Console(highlight=False, width=width).print(view)


def named_reason(reason: str, profile) -> str:
    """A result's reason as people read it: every op or tensor id of ``profile`` it names
    (quoted, or a resident ``t107 (201326592 B)``) as its name with the id in brackets
    (``layer3.fc1.out [t107]``), and byte counts in KiB/MiB/GiB. JSON output keeps the
    reason as the simulator words it."""
    if profile is None:
        return reason
    tensors = profile.tensor_by_id
    ops = {op.id: op for op in profile.ops}

    def named(key: str, quoted: str) -> str:
        if key in tensors:
            return f"{tensors[key].name} [{key}]" if tensors[key].name else quoted
        if key in ops:
            op = ops[key]
            return op.name + (f" in {op.module}" if op.module else "") + f" [{key}]"
        return quoted

    text = re.sub(r"(?<![\w'])([\w.:/-]+) \((\d+) B\)",
                  lambda m: f"{named(m.group(1), m.group(1))} ({format_bytes(int(m.group(2)))})", reason)
    text = re.sub(r"'([^']+)'", lambda m: named(m.group(1), m.group(0)), text)
    return re.sub(r"\b(\d+)(?: bytes)?(?= free| needed| available|;|,| \(|\)|$)",
                  lambda m: format_bytes(int(m.group(1))) if "bytes" in m.group(0) or int(m.group(1)) >= 1024
                  else m.group(0), text)


def print_result(profile_name: str, hardware_name: str, result, bound: dict | None = None, profile=None) -> None:
    """A simulation's result for people; ``profile`` names ops and tensors in the reason."""
    status = "ok" if result.ok else ("INVALID" if not result.valid else "INFEASIBLE")
    click.echo(f"{profile_name} on {hardware_name}, budget {format_bytes(result.budget_bytes)}: {status}")
    if not result.ok:
        click.echo(f"  {result.rule}: {named_reason(result.reason, profile)}" if result.reason
                   else f"  {result.rule} at op {result.op}")
        if result.valid:
            click.echo(f"  stopped at {format_us(result.iteration_us)}; peak {format_bytes(result.peak_bytes)}"
                       + (f" live, {format_bytes(result.reserved_bytes)} reserved" if result.reserved_bytes is not None
                          else ""))
        return
    click.echo(f"  iteration  {format_us(result.iteration_us)}  (ideal {format_us(result.ideal_us)}, "
               f"overhead {result.overhead * 100:.2f}%)")
    if bound is not None and bound["lower_bound_us"] is not None:
        click.echo(f"  bound      {format_us(bound['lower_bound_us'])}  (none of the {bound_words(bound['bound'])} "
                   f"is faster; this one is {bound['gap_to_bound'] * 100:.2f}% above it)")
    click.echo(f"  compute    {format_us(result.compute_us)}  (recompute {format_us(result.recompute_us)})")
    if result.cpu_us:
        click.echo(f"  cpu        {format_us(result.cpu_us)}  (ops on the host CPU, R24-R28)")
    click.echo(f"  stalls     {format_us(result.stall_us)}  (data {format_us(result.stall_data_us)}, "
               f"memory {format_us(result.stall_memory_us)}), tail {format_us(result.tail_us)}")
    if result.faults or result.evictions:
        click.echo(f"  uvm        {result.faults} fault batches ({format_bytes(result.fault_bytes)}, stalled "
                   f"{format_us(result.stall_fault_us)}), {result.evictions} blocks evicted "
                   f"({format_bytes(result.writeback_bytes)} written back)")
    click.echo(f"  peak       {format_bytes(result.peak_bytes)} at {format_us(result.peak_at_us)}")
    if result.reserved_bytes is not None:
        click.echo(f"  reserved   {format_bytes(result.reserved_bytes)} (the caching allocator's peak, R55: "
                   f"{format_bytes(result.reserved_bytes - result.peak_bytes)} above the live peak)")
    if result.arena_bytes is not None:
        click.echo(f"  arena      {format_bytes(result.arena_bytes)} (fragmentation {result.fragmentation:.3f}: "
                   "arena extent over peak live bytes)")
    if result.codec_us:
        click.echo(f"  codecs     {format_us(result.codec_us)} of encode and decode kernels"
                   + (f"; lossy: {len(result.lossy_tensors)} tensors" if result.lossy_tensors else ""))
    moved = [f"{link} {format_bytes(nbytes)} ({result.link_utilisation[link] * 100:.1f}% busy)"
             for link, nbytes in result.link_bytes.items() if nbytes]
    click.echo("  links      " + (", ".join(moved) if moved else "nothing moved"))
    if result.host_peak_bytes or result.ssd_peak_bytes:
        click.echo(f"  off-GPU    host peak {format_bytes(result.host_peak_bytes)}, "
                   f"ssd peak {format_bytes(result.ssd_peak_bytes)}")
    worst = sorted(result.stall_by_op.items(), key=lambda kv: -sum(kv[1].values()))[:5]
    if worst:
        click.echo("  most stalled: " + ", ".join(f"{op} {format_us(sum(s.values()))}" for op, s in worst))


def print_replay(r: dict) -> None:
    status = "ok" if r["ok"] else "FAILED"
    click.echo(f"replay of {r['planner']}'s plan for {r['profile']} on {r['hardware']}, budget "
               f"{format_bytes(r['budget_bytes'])}: {status}")
    click.echo(f"  {r['backend']} backend, time x{r['time_scale']:g}, size x{r['size_scale']:g}; "
               f"{r['wall_s']:.2f} s of real time")

    def err(value):
        return "" if value is None else f"{value * 100:+.2f}%"

    def us(value):
        return "-" if value is None else format_us(value)

    rows = [["iteration", format_us(r["iteration_us"]), us(r["predicted_us"]), err(r["relative_error"])],
            ["compute", format_us(r["compute_us"]), us(r["predicted_compute_us"]), ""],
            ["stalls", format_us(r["stall_us"]), us(r["predicted_stall_us"]), ""],
            ["tail", format_us(r["tail_us"]), us(r["predicted_tail_us"]), ""],
            ["peak", format_bytes(r["peak_bytes"]),
             "-" if r["predicted_peak_bytes"] is None else format_bytes(r["predicted_peak_bytes"]),
             err(r["peak_relative_error"])]]
    for link, nbytes in r["link_bytes"].items():
        predicted = (r["predicted_link_bytes"] or {}).get(link)
        if nbytes or predicted:
            rows.append([link, format_bytes(nbytes), "-" if predicted is None else format_bytes(predicted),
                         err((r["link_relative_error"] or {}).get(link))])
    table(None, ["", "measured", "predicted", "error"], rows, right={1, 2, 3})
    click.echo(f"  region     {format_bytes(r['arena_bytes'])}: peak {format_bytes(r['peak_arena_bytes'])} live, "
               f"extent {format_bytes(r['peak_extent_bytes'])}, fragmentation {r['fragmentation']:.3f}"
               + (f", {r['compactions']} compactions" if r["compactions"] else ""))
    click.echo(f"  integrity  {r['integrity']}")
    if r["late_us"] > 0.01 * max(r["iteration_us"], 1e-9):
        click.echo(f"  note: the checks of {r['late_items']} items outlasted their scaled time by "
                   f"{format_us(r['late_us'])} in all (a smaller --size-scale or a larger --time-scale makes "
                   "them fit)")


def print_train(r: dict) -> None:
    secs = r["seconds_per_step"]
    click.echo(f"train {r['model']} ({r['profile']}), {r['steps']} step(s), {r['planner']} plan on {r['hardware']}: "
               f"{'bit-equal' if r['bit_equal'] else 'NOT bit-equal: ' + ', '.join(r['differences'])}")
    click.echo(f"  peak {format_bytes(r['peak_bytes'])} of budget {format_bytes(r['budget_bytes'])} (simulated "
               f"{format_bytes(r['simulated_peak_bytes'])}, no-swap {format_bytes(r['profile_peak_bytes'])}); "
               f"host peak {format_bytes(r['host_peak_bytes'])}")
    unplanned = "-" if secs["unplanned"] is None else f"{secs['unplanned']:.3f}"
    click.echo(f"  actions {r['actions_applied']}/{r['actions_total']} applied; seconds per step: planned "
               f"{secs['planned']:.3f}, unplanned {unplanned}, reference {secs['reference']:.3f}")


def print_train_world(r: dict) -> None:
    """``train --world N``: the checks in three lines, then a line per rank."""
    state = "ok" if r["ok"] else "FAILED: " + r["failures"][0]
    click.echo(f"train {r['model']} ({r['profile']}), {r['world']} ranks {r['strategy']}, {r['planner']} plan on "
               f"{r['hardware']}: {state}")
    click.echo(f"  parameters and optimizer state: {r['bit_equal_tensors']}/{r['tensors']} bit-equal to one process "
               f"over the {r['world']} batches, largest difference {r['max_abs_difference']:.3g} (rtol "
               f"{r['tolerance']['rtol']:g}, atol {r['tolerance']['atol']:g})")
    click.echo(f"  {len(r['collectives'])} collectives per rank as the graph's; reduce-scatter: {r['reduce_scatter']}")
    for rank in r["ranks"]:
        click.echo(f"  rank {rank['rank']}: peak {format_bytes(rank['peak_bytes'])} of budget "
                   f"{format_bytes(r['budget_bytes'])} (simulated {format_bytes(r['simulated_peak_bytes'])}), "
                   f"loss {rank['loss']:.6g}, actions {rank['actions_applied']}/{r['actions_total']}, "
                   f"{rank['seconds']:.3f} s")


def print_comparison(rows: list[dict]) -> None:
    """Per (profile, machine): overhead by planner and budget, the best per budget marked."""
    from compare.grid import bound_text, budget_label, cell_text, gap_text, grids

    for grid in grids(rows):
        lines = []
        for planner in grid.planners:
            line = [planner]
            for budget in grid.budgets:
                text = cell_text(grid.cells.get((planner, budget)))
                line.append(f"[bold green]{text} *[/]" if planner in grid.best.get(budget, ()) else text)
            lines.append(line)
        lines.append(["[dim]lower bound[/]"] + [f"[dim]{bound_text(grid, b)}[/]" for b in grid.budgets])
        lines.append(["[dim]gap of the best[/]"] + [f"[dim]{gap_text(grid, b)}[/]" for b in grid.budgets])
        click.echo(f"{grid.profile} on {grid.hardware}: overhead over the ideal iteration (* best per budget)")
        table(None, ["planner"] + [budget_label(grid, b) for b in grid.budgets], lines,
               right=set(range(1, len(grid.budgets) + 1)))


def out_of_memory_line(command: str, exc: MemoryError) -> str:
    """The one line for a MemoryError in ``command``: what ran out (the process's
    address-space limit when one is set below the machine's memory, else the machine's
    memory) and what to try."""
    what = "this machine's memory"
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        what += f" ({format_bytes(physical)})"
    except (ValueError, OSError, AttributeError):
        physical = None
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY and (physical is None or soft < physical):
            what = f"this process's address-space limit (ulimit -v: {format_bytes(soft)})"
    except (ImportError, ValueError, OSError):
        pass
    detail = f" ({exc})" if str(exc) else ""
    return (f"{command}: out of memory{detail}: the input needs more than {what}; try a smaller input "
            "(profile, plan, batch, sizes) or a machine with more memory")


def print_hardware(presets) -> None:
    """`swapplan hardware`: one row per preset."""
    rows = []
    for hw in presets:
        ssd = f"{hw.ssd.read_gbps:g}/{hw.ssd.write_gbps:g} GB/s" if hw.ssd else "-"
        rows.append([hw.name, format_bytes(hw.gpu.memory_bytes), f"{hw.gpu.fp32_tflops:g}",
                     f"{hw.gpu.fp16_tflops:g}", f"{hw.gpu.hbm_gbps:g}",
                     f"{hw.pcie.h2d_gbps:g}/{hw.pcie.d2h_gbps:g} GB/s {hw.pcie.duplex}",
                     format_bytes(hw.host.memory_bytes), ssd,
                     f"{hw.cpu.tflops:g} TF, {hw.cpu.mem_gbps:g} GB/s" if hw.cpu else "-",
                     _interconnect_text(hw.interconnect)])
    table(None, ["preset", "GPU memory", "FP32 TF", "FP16 TF", "HBM GB/s", "PCIe h2d/d2h",
                 "host", "SSD read/write", "CPU (ops)", "GPUs (R57)"], rows, right={1, 2, 3, 4})


def _interconnect_text(link) -> str:
    """'8 nvlink 230 GB/s' (and 'x 2 nodes, 45 GB/s'), or '-' for one GPU."""
    if link is None:
        return "-"
    text = f"{link.gpus} {link.kind} {link.gbps:g} GB/s"
    return text if link.nodes == 1 else f"{text} x {link.nodes} nodes, {link.inter_node_gbps:g} GB/s"


def print_profiles(rows: list[dict]) -> None:
    """`swapplan profiles`: one row per shipped profile."""
    table(None, ["name", "ops", "tensors", "peak", "ideal", "source"],
          [[r["name"], r["ops"], r["tensors"], format_bytes(r["peak_bytes"]), format_us(r["ideal_us"]),
            r["source"] or ""] for r in rows], right={1, 2, 3, 4})


def print_planners(specs, families: dict, start_here: str) -> None:
    """`swapplan planners`: where to start, then each family's planners and their knobs."""
    click.echo(start_here)
    for family, title in families.items():
        members = [spec for spec in specs if spec.family == family]
        if members:
            click.echo(f"\n## {title}")
        for spec in members:
            click.echo(f"{spec.name}: {spec.summary}" + (f"  [{spec.paper}]" if spec.paper else ""))
            if spec.moves_persistent:
                click.echo("    moves weights and optimizer state too")
            for p in spec.params:
                click.echo(f"    --param {p.name}={p.default}  {p.help} ({p.describe()})")
