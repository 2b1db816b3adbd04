"""The single-process reference of a data-parallel step: what N ranks compute together.

For each rank r, the one-GPU graph's forward and backward run on rank r's batch with
rank r's RNG seed (the graph's nodes in order, up to the first node of the optimizer
step), and the weight gradients are kept. Their mean (summed in rank order, then divided
by N) is written into rank 0's gradients, and the optimizer's nodes run once on the full
parameters and state. This is the step data parallelism computes; the ranks sum in
another order (the collective's), so the result agrees within rounding, not bit for bit
(bit for bit when N = 2: a sum of two numbers does not depend on the order).
"""
from __future__ import annotations

from tracer.pytorch.node_identity import flat_tensors

from .interpreter import RuntimeFailure


def _optimizer_nodes(bindings) -> set:
    names = {n for op in bindings.profile.ops if op.phase == "optimizer" for n in op.fx.nodes}
    return {n for n in bindings.graph_module.graph.nodes if n.name in names}


def _gradient_ids(bindings) -> list[str]:
    """The weight gradients: gradient tensors an optimizer op reads that an op outside
    the step makes."""
    profile = bindings.profile
    out = {}
    for op in profile.ops:
        if op.phase != "optimizer":
            continue
        for tid in (*op.inputs, *op.updates):
            made = profile.producer.get(tid)
            if profile.tensor_by_id[tid].kind == "gradient" and made is not None \
                    and profile.ops[made].phase != "optimizer":
                out[tid] = None
    return list(out)


def _run(gm, nodes, env: dict, in_place: set) -> None:
    """Run ``nodes`` in order; those in ``in_place`` (ops the profile counts as
    ``inplace_accumulate``) add into their first argument, as the runtime runs them, so
    that a gradient accumulated twice (a tied weight) is in its profile tensor's storage."""
    import torch
    from torch.fx.node import map_arg
    for node in nodes:
        if node.op == "get_attr":
            env[node] = getattr(gm, node.target)
        elif node.op == "call_function":
            args = map_arg(node.args, env.__getitem__)
            kwargs = map_arg(node.kwargs, env.__getitem__)
            if node in in_place:
                env[node] = torch.ops.aten.add_.Tensor(args[0], *args[1:], **kwargs)
            else:
                env[node] = node.target(*args, **kwargs)


def reference_data_parallel(bindings, values_per_rank: list, seeds: list[int]):
    """Run the reference on ``values_per_rank`` (rank r's Values: the same parameters and
    state, rank r's batch; rank 0's are updated in place and hold the result) with
    rank r's RNG seeded by ``seeds[r]``. Returns the losses, one per rank."""
    import torch

    gm = bindings.graph_module
    nodes = list(gm.graph.nodes)
    step = _optimizer_nodes(bindings)
    first = next((i for i, n in enumerate(nodes) if n in step), len(nodes))
    before, after = nodes[:first], nodes[first:]
    grads = _gradient_ids(bindings)
    late = [g for g in grads if bindings.tensors[g].node in after]
    if late:
        raise RuntimeFailure(f"gradient {late[0]} is made after the optimizer step begins: the reference cannot "
                             "average it")
    in_place = {n for b in bindings.ops.values() if b.rewrite == "inplace_accumulate" for n in b.nodes}
    loss_at = bindings.tensors.get(bindings.output_tensor) if bindings.output_tensor else None
    losses, envs, kept = [], [], []
    with torch.no_grad():
        for values, seed in zip(values_per_rank, seeds):
            torch.manual_seed(seed)
            env = dict(zip(bindings.placeholders, values.flat()))
            _run(gm, before, env, in_place)
            kept.append([flat_tensors(env[bindings.tensors[g].node])[bindings.tensors[g].output or 0] for g in grads])
            envs.append(env)
            loss = flat_tensors(env[loss_at.node])[loss_at.output or 0] if loss_at is not None else None
            losses.append(loss.detach().clone() if loss is not None else None)
        for i in range(len(grads)):
            total = kept[0][i].clone()
            for r in range(1, len(kept)):
                total += kept[r][i]
            kept[0][i].copy_(total / len(kept))
        _run(gm, after, envs[0], in_place)
    return losses
