"""``swapplan shard``: the profile of one data-parallel rank (DDP, ZeRO-1/2/3, FSDP full
shard) made from a one-GPU profile; also what ``trace --shard`` prints after sharding."""
from __future__ import annotations

import click

from simulator import catalog
from simulator.units import format_bytes, format_us, parse_size

from cli_common import guard_outputs, profile_input

STRATEGY_CHOICES = ["ddp", "zero1", "zero2", "zero3"]


@click.command("shard")
@click.argument("profile")
@click.option("--strategy", required=True, type=click.Choice(STRATEGY_CHOICES),
              help="ddp: everything whole, gradients all-reduced in buckets; zero1: optimizer state sharded, "
                   "gradients reduce-scattered after the backward; zero2: also gradients, reduce-scattered in "
                   "buckets as they are ready; zero3 (FSDP full shard): also parameters, all-gathered per unit "
                   "before its forward and its backward.")
@click.option("--world", required=True, type=int, help="Ranks (GPUs) of the data-parallel group, 1 to 65536.")
@click.option("--wrap", "wrap", multiple=True, metavar="PATTERN",
              help="zero3: a module path pattern naming wrap units (repeatable; `*` within one dotted segment, "
                   "`**` any number of them) [default: the repeated blocks, e.g. transformer.h.N].")
@click.option("--keep-gathered", is_flag=True,
              help="zero3: gather each unit once; its copies live through the backward (no reshard after "
                   "forward, FSDP's SHARD_GRAD_OP).")
@click.option("--keep-root-gathered", is_flag=True,
              help="zero3: the root unit alone is not resharded after forward (what FSDP does for its root).")
@click.option("--no-prefetch", "no_prefetch", is_flag=True,
              help="zero3: gather each unit just before it runs, not one unit ahead.")
@click.option("--bucket", default=None, metavar="SIZE",
              help="ddp, zero1, zero2: bucket size of the gradient reductions and parameter gathers [default: "
                   "25MiB, DDP's].")
@click.option("-o", "--output", required=True, help="The rank's profile file to write (.json, .json.gz, .yaml).")
def shard_cmd(profile, strategy, world, wrap, keep_gathered, keep_root_gathered, no_prefetch, bucket,
              output) -> None:
    """One rank of WORLD data-parallel ranks training PROFILE (one GPU's iteration) with
    a sharding strategy: its graph, collectives as ops, for plan and simulate (on a
    machine with an interconnect). See docs/sharding.md."""
    from simulator.profile import save_profile
    from shard import DEFAULT_BUCKET_BYTES, shard_profile

    guard_outputs({"-o": output}, [("profile", profile_input(profile))])
    bucket_bytes = DEFAULT_BUCKET_BYTES if bucket is None else parse_size(bucket, "--bucket")
    loaded = catalog.open_profile(profile)
    rank = shard_profile(loaded, strategy, world, wrap=list(wrap) or None, keep_gathered=keep_gathered,
                         bucket_bytes=bucket_bytes, prefetch=not no_prefetch, keep_root_gathered=keep_root_gathered)
    save_profile(rank, output)
    echo_rank(output, loaded, rank)


def echo_rank(output: str, original, rank) -> None:
    """The summary of a rank written to ``output``: units, persistent bytes, collectives."""
    from shard import rank_summary

    s = rank_summary(original, rank)
    click.echo(f"wrote {output}: {rank.name}, {len(rank.ops)} ops, {len(rank.tensors)} tensors, "
               f"peak {format_bytes(rank.peak_bytes)}, ideal {format_us(rank.ideal_us)}")
    units = s["units"]
    if units:
        shown = ", ".join(units) if len(units) <= 4 else f"{units[0]}, {units[1]}, ..., {units[-1]}"
        click.echo(f"  units        {len(units)}: {shown}")
    share = s["persistent_bytes"] / s["unsharded_persistent_bytes"] if s["unsharded_persistent_bytes"] else 1.0
    click.echo(f"  persistent   {format_bytes(s['persistent_bytes'])} per rank, "
               f"{format_bytes(s['unsharded_persistent_bytes'])} unsharded ({share:.1%}); "
               f"padding {format_bytes(s['padding_bytes'])}")
    rows = [f"{kind} {row['ops']} ({format_bytes(row['bytes'])}, sends {format_bytes(row['wire_bytes'])})"
            for kind, row in s["collectives"].items() if row["ops"]]
    click.echo(f"  collectives  {', '.join(rows) if rows else 'none (one rank)'}")
