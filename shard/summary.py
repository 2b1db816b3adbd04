"""What one rank holds and moves, beside the one-GPU profile it was made from: its
persistent bytes, and its collectives by kind (ops, payload bytes, bytes each rank
sends)."""
from __future__ import annotations

from simulator.catalog import collectives_by_kind
from simulator.profile import Profile


def rank_summary(original: Profile, rank: Profile) -> dict:
    shard = rank.source.get("shard") or {}
    return {
        "name": rank.name,
        "strategy": shard.get("strategy"),
        "world": shard.get("world"),
        "units": shard.get("units"),
        "padding_bytes": shard.get("padding_bytes"),
        "persistent_bytes": rank.persistent_bytes,
        "unsharded_persistent_bytes": original.persistent_bytes,
        "peak_bytes": rank.peak_bytes,
        "unsharded_peak_bytes": original.peak_bytes,
        "ideal_us": rank.ideal_us,
        "collectives": collectives_by_kind(rank),
    }
