"""``shard_profile``: the profile of one rank of N symmetric data-parallel ranks."""
from __future__ import annotations

from simulator.errors import InputError
from simulator.profile import Profile

from .graph import RankGraph
from .options import DEFAULT_BUCKET_BYTES, check_options, check_profile
from .replicated import data_parallel, optimizer_sharded
from .roles import find_roles
from .units import find_units, unit_name
from .zero3 import fully_sharded


def shard_profile(profile: Profile, strategy: str, world: int, wrap=None, keep_gathered: bool = False,
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES, prefetch: bool = True,
                  keep_root_gathered: bool = False) -> Profile:
    """One rank's graph of ``profile`` (one GPU's training iteration) trained on ``world``
    ranks with ``strategy``: ``ddp``, ``zero1``, ``zero2`` or ``zero3`` (R59, see
    docs/sharding.md). Collectives are ops (R56); ``source.shard`` says how it was made
    and the name gains ``-<strategy>-w<world>``. World 1 gives the same tensors and ops.

    Raises InputError naming the argument or field for an unknown strategy, a world
    outside 1..65536, a wrap pattern matching no op's module, options of zero3 given to
    another strategy, a profile without weights, one no optimizer op updates a weight
    of, or one already sharded.
    """
    opts = check_options(strategy, world, wrap, keep_gathered, keep_root_gathered, bucket_bytes, prefetch)
    check_profile(profile)
    roles = find_roles(profile)
    if not roles.params:
        raise InputError(profile.origin, "ops", "no optimizer op updates a weight: the profile has no parameters "
                                                "to shard or gradients to reduce (trace it with its optimizer step)")
    units = find_units(profile, roles, opts.wrap) if opts.strategy == "zero3" else None
    graph = RankGraph(profile, opts.world)
    if opts.world > 1:
        if opts.strategy == "ddp":
            data_parallel(profile, roles, graph, bucket_bytes=opts.bucket_bytes)
        elif opts.strategy == "zero3":
            fully_sharded(profile, roles, units, graph, keep_gathered=opts.keep_gathered,
                          keep_root_gathered=opts.keep_root_gathered, prefetch=opts.prefetch)
        else:
            optimizer_sharded(profile, roles, graph, stage=int(opts.strategy[-1]), bucket_bytes=opts.bucket_bytes)
    zero3 = opts.strategy == "zero3"
    entry = {
        "strategy": opts.strategy,
        "world": opts.world,
        "units": [unit_name(u) for u in units.paths] if zero3 else None,
        "padding_bytes": graph.padding,
        "bucket_bytes": None if zero3 else opts.bucket_bytes,
        "keep_gathered": opts.keep_gathered if zero3 else None,
        "keep_root_gathered": opts.keep_root_gathered if zero3 else None,
        "prefetch": opts.prefetch if zero3 else None,
    }
    if opts.world == 1:
        return Profile(name=_name(profile, opts), tensors=profile.tensors, ops=profile.ops,
                       source={**profile.source, "shard": entry}, origin=profile.origin)
    return graph.build(_name(profile, opts), {**profile.source, "shard": entry})


def _name(profile: Profile, opts) -> str:
    return f"{profile.name}-{opts.strategy}-w{opts.world}"
