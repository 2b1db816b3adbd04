"""ZeRO-3 / FSDP full sharding: every parameter, its gradient and its optimizer state
live as one rank's shard; each unit's parameters are all-gathered before the unit's
forward and again before its backward (resharded after the forward, FSDP's default),
and its gradients reduce-scattered once the backward has made the last of them."""
from __future__ import annotations

from simulator.profile import Profile

from .graph import RankGraph
from .padding import padded_bytes
from .roles import BACKWARD, FORWARD, OPTIMIZER, Roles
from .step import shard_step
from .units import ROOT, Units, unit_name

_TAG = {FORWARD: "fwd", BACKWARD: "bwd"}


def fully_sharded(profile: Profile, roles: Roles, units: Units, graph: RankGraph, *, keep_gathered: bool,
                  keep_root_gathered: bool, prefetch: bool) -> None:
    """ZeRO-3 / FSDP full shard (R59): weights and optimizer state sharded; per unit a
    gather before its forward and its backward, a reduce-scatter after its backward."""
    for tid in (*roles.params, *roles.opt_states):
        graph.shard(tid)
    unit_params = {u: units.params_of(u, roles.params) for u in units.paths}
    first = _first_ops(profile, roles, units, unit_params)

    keep = {u: keep_gathered or (keep_root_gathered and u == ROOT) for u in units.paths}
    forward = sorted((u for u in units.paths if first[u][FORWARD] is not None), key=lambda u: first[u][FORWARD])
    backward = sorted((u for u in units.paths if first[u][BACKWARD] is not None
                       and not (keep[u] and first[u][FORWARD] is not None)), key=lambda u: first[u][BACKWARD])
    copies: dict[tuple[str, str], dict[str, str]] = {}   # (unit, pass) -> parameter -> its gathered copy
    for pass_, order in ((FORWARD, forward), (BACKWARD, backward)):
        for k, unit in enumerate(order):
            at = first[order[k - 1]][pass_] if prefetch and k else first[unit][pass_]
            copies[unit, pass_] = _gather(profile, graph, unit, unit_params[unit], pass_, at)

    for p in roles.params:
        unit = units.of_param[p]
        for i in roles.readers(profile, p):
            pass_ = roles.passes[i]
            gathered = copies.get((unit, pass_)) or copies[unit, FORWARD]
            graph.rename(i, p, gathered[p])

    _reduce_scatters(profile, roles, units, graph, backward + [u for u in forward if u not in backward])
    shard_step(profile, roles, graph)


def _first_ops(profile: Profile, roles: Roles, units: Units, unit_params: dict) -> dict:
    """Per unit, its first op of the forward and of the backward (an op of its modules,
    or one reading its parameters); None where it has none."""
    first = {u: {FORWARD: None, BACKWARD: None} for u in units.paths}

    def seen(unit: str, i: int) -> None:
        pass_ = roles.passes[i]
        if pass_ != OPTIMIZER and unit in first and (first[unit][pass_] is None or i < first[unit][pass_]):
            first[unit][pass_] = i

    for i, unit in enumerate(units.of_op):
        seen(unit, i)
    for unit, params in unit_params.items():
        for p in params:
            for i in roles.readers(profile, p):
                seen(unit, i)
    return first


def _gather(profile: Profile, graph: RankGraph, unit: str, params: list[str], pass_: str, at: int) -> dict:
    """An all-gather of the unit's shards into a full copy of each parameter, put before
    op ``at``; the copies, by parameter."""
    tag = _TAG[pass_]
    made = {}
    for p in params:
        tensor = profile.tensor_by_id[p]
        size = padded_bytes(tensor, graph.world)
        made[p] = graph.add_tensor(f"{p}@gathered.{tag}", tensor, kind="other", size=size,
                                   name=f"{tensor.name or p} (gathered for the {pass_})",
                                   whole_shape=size == tensor.bytes)
    size = sum(graph.tensors[c].bytes for c in made.values())
    op = graph.collective(f"ag.{tag}.{unit_name(unit)}", "all_gather", size, phase=pass_,
                          module=unit or None, inputs=params, outputs=list(made.values()))
    graph.before(at, op)
    return made


def _reduce_scatters(profile: Profile, roles: Roles, units: Units, graph: RankGraph, backward: list[str]) -> None:
    """Per unit, a reduce-scatter of its weight gradients into shards, after the last op
    writing one of them; later ops read the shards."""
    grads_of: dict[str, list[str]] = {}
    for g in roles.grads:
        stepped = {units.of_param[p] for p in roles.grad_params.get(g, ())}
        unit = stepped.pop() if len(stepped) == 1 else units.of_op[roles.ready[g]]
        grads_of.setdefault(unit, []).append(g)
    rank = {u: k for k, u in enumerate(backward)}
    at = {u: max(roles.ready[g] for g in grads) for u, grads in grads_of.items()}
    # ready at the same op: the unit whose backward began last is reduced first (the root last, as
    # FSDP's root reduces in its final callback)
    for unit in sorted(grads_of, key=lambda u: (at[u], -rank.get(u, -1), u)):
        grads = grads_of[unit]
        shards = [graph.shard_of(g) for g in grads]
        size = sum(padded_bytes(profile.tensor_by_id[g], graph.world) for g in grads)
        op = graph.collective(f"rs.{unit_name(unit)}", "reduce_scatter", size, phase="backward",
                              module=unit or None, inputs=grads, outputs=shards)
        graph.after(at[unit], op)
        graph.rename_after(at[unit], dict(zip(grads, shards)))

