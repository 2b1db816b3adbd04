"""The strategies that keep every parameter whole on every rank: PyTorch DDP (gradients
all-reduced in buckets as they become ready) and DeepSpeed ZeRO-1 and ZeRO-2 (optimizer
state sharded, gradients reduce-scattered, the step run on the rank's share, the updated
parameters all-gathered back in buckets)."""
from __future__ import annotations

from simulator.profile import Profile

from .buckets import fill
from .graph import RankGraph
from .padding import padded_bytes
from .roles import BACKWARD, OPTIMIZER, Roles
from .step import shard_step


def _ready_order(roles: Roles) -> list[str]:
    order = {g: k for k, g in enumerate(roles.grads)}
    return sorted(roles.grads, key=lambda g: (roles.ready[g], order[g]))


def data_parallel(profile: Profile, roles: Roles, graph: RankGraph, *, bucket_bytes: int) -> None:
    """DDP (R59): each bucket of gradients all-reduced in place after the op that completes it."""
    tensors = profile.tensor_by_id
    order = _ready_order(roles)
    for k, bucket in enumerate(fill([(g, tensors[g].bytes) for g in order], bucket_bytes)):
        at = max(roles.ready[g] for g in bucket)
        op = graph.collective(f"ar.bucket{k}", "all_reduce", sum(tensors[g].bytes for g in bucket),
                              phase="backward", module=profile.ops[at].module, updates=bucket)
        graph.after(at, op)


def optimizer_sharded(profile: Profile, roles: Roles, graph: RankGraph, *, stage: int, bucket_bytes: int) -> None:
    """ZeRO-1 (R59; stage 1: gradients reduced once the backward has ended) and ZeRO-2
    (stage 2: each bucket as soon as it is complete)."""
    tensors, world = profile.tensor_by_id, graph.world
    for tid in roles.opt_states:
        graph.shard(tid)
    order = _ready_order(roles)
    end = _end_of_backward(roles)
    for k, bucket in enumerate(fill([(g, padded_bytes(tensors[g], world)) for g in order], bucket_bytes)):
        at = max(roles.ready[g] for g in bucket) if stage == 2 else end
        shards = [graph.shard_of(g) for g in bucket]
        op = graph.collective(f"rs.bucket{k}", "reduce_scatter", sum(padded_bytes(tensors[g], world) for g in bucket),
                              phase="backward", module=profile.ops[at].module, inputs=bucket, outputs=shards)
        graph.after(at, op)
        graph.rename_after(at, dict(zip(bucket, shards)))
    shard_step(profile, roles, graph)
    rank = {p: k for k, p in enumerate(roles.params)}
    stepped = sorted(roles.params, key=lambda p: (roles.last_update[p], rank[p]))
    for p in stepped:
        graph.padding += padded_bytes(tensors[p], world) - tensors[p].bytes
    for k, bucket in enumerate(fill([(p, padded_bytes(tensors[p], world)) for p in stepped], bucket_bytes)):
        at = max(roles.last_update[p] for p in bucket)
        op = graph.collective(f"ag.step.bucket{k}", "all_gather", sum(padded_bytes(tensors[p], world) for p in bucket),
                              phase="optimizer", module=profile.ops[at].module, updates=bucket)
        graph.after(at, op)


def _end_of_backward(roles: Roles) -> int:
    """The last op of the backward before the step (or the last op making a gradient)."""
    first_step = next((i for i, p in enumerate(roles.passes) if p == OPTIMIZER), len(roles.passes))
    backward = [i for i, p in enumerate(roles.passes[:first_step]) if p == BACKWARD]
    latest = max(roles.ready.values(), default=0)
    return max(backward[-1] if backward else latest, latest)
