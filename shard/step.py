"""The optimizer step of a rank that owns a shard (ZeRO-1/2/3, FSDP): each optimizer op
updates only the rank's slice of what it touches, so its time, flops and workspace are
scaled by the rank's share of those tensors (the shard's bytes over the full bytes of the
parameters, gradients and optimizer state it reads or writes, padding included), and
what it makes for itself (a cast of the master weights, a foreach op's scratch) is that
slice too. Ops touching none of them keep their figures."""
from __future__ import annotations

import math

from simulator.profile import Profile

from .graph import RankGraph
from .padding import shard_bytes
from .roles import OPTIMIZER, Roles


def shard_step(profile: Profile, roles: Roles, graph: RankGraph) -> None:
    tensors, world = profile.tensor_by_id, graph.world
    owned = roles.param_set | roles.grad_set | frozenset(roles.opt_states)
    for i, op in enumerate(profile.ops):
        if roles.passes[i] != OPTIMIZER:
            continue
        full = part = 0
        for tid in dict.fromkeys((*op.inputs, *op.updates)):
            if tid in owned:
                full += tensors[tid].bytes
                part += shard_bytes(tensors[tid], world)
        if not full:
            continue
        share = part / full
        fields = {"time_us": op.time_us * share}
        if op.flops is not None:
            fields["flops"] = op.flops * share
        if op.workspace_bytes:
            fields["workspace_bytes"] = math.ceil(op.workspace_bytes * share)
        graph.edit(i, **fields)
        for tid in op.outputs:
            graph.shard(tid, payload=False)
