"""The arguments of ``shard_profile``, checked: InputError naming the argument (or the
profile's field) and the problem."""
from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import InputError
from simulator.profile import Profile
from simulator.units import MAX_BYTES

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
MAX_WORLD = 65536                       # the format's limit on a collective's world (R56)
DEFAULT_BUCKET_BYTES = 25 * 2**20       # PyTorch DDP's bucket_cap_mb default
ARGUMENT = "<argument>"


@dataclass(frozen=True)
class ShardOptions:
    strategy: str
    world: int
    wrap: tuple[str, ...] | None = None
    keep_gathered: bool = False
    keep_root_gathered: bool = False
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    prefetch: bool = True


def check_options(strategy, world, wrap, keep_gathered, keep_root_gathered, bucket_bytes, prefetch) -> ShardOptions:
    if strategy not in STRATEGIES:
        raise InputError(ARGUMENT, "strategy",
                         f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD:
        raise InputError(ARGUMENT, "world", f"expected a whole number of ranks from 1 to {MAX_WORLD}, got {world!r}")
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or not 1 <= bucket_bytes < MAX_BYTES:
        raise InputError(ARGUMENT, "bucket_bytes", f"expected a size from 1 byte to below 2^53, got {bucket_bytes!r}")
    if isinstance(wrap, str):
        wrap = (wrap,)
    if wrap is not None:
        wrap = tuple(wrap)
        if not wrap:
            raise InputError(ARGUMENT, "wrap", "expected at least one module path pattern (or none at all)")
    if strategy != "zero3":
        for name, given in (("wrap", wrap is not None), ("keep_gathered", keep_gathered),
                            ("keep_root_gathered", keep_root_gathered), ("prefetch", not prefetch)):
            if given:
                raise InputError(ARGUMENT, name,
                                 f"applies to zero3 only (its wrap units and gathers), not to {strategy}")
    return ShardOptions(strategy, world, wrap, bool(keep_gathered), bool(keep_root_gathered), bucket_bytes,
                        bool(prefetch))


def check_profile(profile: Profile) -> None:
    """A one-GPU profile with weights, not already one rank of a sharded run."""
    if "shard" in profile.source:
        shard = profile.source["shard"]
        what = f"{shard.get('strategy')} over {shard.get('world')}" if isinstance(shard, dict) else "sharded"
        raise InputError(profile.origin, "source.shard", f"the profile is already one rank ({what}); shard the "
                                                         "one-GPU profile it was made from")
    for i, op in enumerate(profile.ops):
        if op.collective is not None:
            raise InputError(profile.origin, f"ops[{i}] ({op.id}).collective",
                             "the profile already has collective ops (one rank of a data-parallel run); "
                             "shard the one-GPU profile")
    if not any(t.kind == "weight" for t in profile.tensors):
        raise InputError(profile.origin, "tensors", "the profile has no weight tensors: nothing to shard or reduce")
