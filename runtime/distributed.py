"""``train_distributed``: one real data-parallel training step on N CPU processes, each
following its rank's plan (docs/runtime.md, "A data-parallel run").

The parent traces the model once with node identity, shards the profile into one rank's
(``shard.shard_profile``: DDP, ZeRO-1/2/3), plans it (a percentage budget is of the
rank's no-swap peak) or loads a plan made for it, and simulates it (a plan the simulator
refuses is not run: PlanRefused). It then forks N ranks (runtime/launch.py); rank r runs
the rank graph (runtime/rank.py) on the shared initial weights, its own batch and RNG
seed (``rank_seed``), its collectives real gloo calls. The parent checks their peaks,
their collectives and the parameters they hold against a single-process reference
(runtime/dp_reference.py) within a tolerance (runtime/dp_checks.py).
"""
from __future__ import annotations

import time

from simulator.errors import InputError
from simulator.hardware import Hardware, load_hardware
from simulator.plan import Plan

from .bindings import initial_values
from .train import check_plan_choice, plan_or_load, traced
from .dp_checks import ATOL, RTOL, check_collectives, check_peaks, compare_tensors
from .dp_reference import reference_data_parallel
from .launch import run_ranks
from .rank import RankInterpreter
from .rank_map import SHARD, rank_map

DEFAULT_HARDWARE = "a100-80gb-sxm-x8"   # a machine with an interconnect (R57)


def rank_seed(seed: int, rank: int) -> int:
    """Rank r's seed (its batch and its RNG) from the run's: rank 0 keeps ``seed``."""
    return seed + 1_000_003 * rank


def train_distributed(model: str, *, world: int, strategy: str, planner: str | None = None,
                      budget: str | int | None = None, plan: str | Plan | None = None, batch: int | None = None,
                      seq: int | None = None, hardware: str | Hardware | None = None, dtype: str = "fp32",
                      optimizer: str = "adamw", gpu_kernels: bool = True, seed: int = 0, params: dict | None = None,
                      threads: int = 1, wrap=None, notes: list | None = None, timeout_s: float = 600.0,
                      emulate_reduce_scatter: bool = False, tamper=None) -> dict:
    """Run one data-parallel step of ``model`` on ``world`` processes with ``strategy``
    and check it; returns the report (``ok`` and ``failures``: the checks that failed,
    one line each). ``tamper(rank, log)`` may alter a rank's collective log before it is
    checked (tests: the check must notice).

    Raises InputError for bad arguments or a plan for another profile, PlanRefused for a
    plan the simulator refuses, RuntimeFailure when a rank breaks.
    """
    from shard import STRATEGIES, shard_profile

    check_plan_choice(plan, planner, budget)
    if strategy not in STRATEGIES:
        raise InputError("<argument>", "strategy", f"unknown strategy {strategy!r}; expected one of "
                                                   f"{', '.join(STRATEGIES)}")
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise InputError("<argument>", "world", f"a distributed run needs 2 or more ranks, got {world!r} "
                                                "(--world 1 is the single-process train)")
    notes = notes if notes is not None else []
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware or DEFAULT_HARDWARE)
    started = time.perf_counter()
    one_gpu, bindings = traced(model, hw, batch=batch, seq=seq, dtype=dtype, optimizer=optimizer,
                               gpu_kernels=gpu_kernels)
    rank_profile = shard_profile(one_gpu, strategy, world, wrap=wrap)
    rmap = rank_map(one_gpu, rank_profile, world)
    trace_s = time.perf_counter() - started

    started = time.perf_counter()
    the_plan, budget_bytes = plan_or_load(
        rank_profile, hw, budget, planner, params, seed, plan, notes, "the rank's no-swap peak",
        f"one rank of {model}", f"plan the rank profile that `swapplan trace {model} --runtime` then `swapplan shard "
                                f"--strategy {strategy} --world {world}` write")
    plan_s = time.perf_counter() - started

    interpreter = RankInterpreter(bindings, rank_profile, rmap, the_plan, hw, budget_bytes)   # refuses a bad plan
    expected = interpreter.expected_collectives()
    start_values = initial_values(bindings, seed)
    seeds = [rank_seed(seed, r) for r in range(world)]
    batches = [start_values.batch] + [initial_values(bindings, s).batch for s in seeds[1:]]

    def work(rank: int) -> dict:
        return _rank_work(rank, world, interpreter, bindings, rmap, start_values, batches[rank], seeds[rank], threads,
                          emulate_reduce_scatter)

    started = time.perf_counter()
    results = run_ranks(world, work, timeout_s)
    ranks_s = time.perf_counter() - started

    started = time.perf_counter()
    with _threads(threads):
        reference = [_with_batch(start_values.clone(), b) for b in batches]
        ref_losses = reference_data_parallel(bindings, reference, seeds)
    reference_s = time.perf_counter() - started

    result = interpreter.result
    failures = check_peaks(results, result.budget_bytes, result.peak_bytes)
    for r in results:
        log = tamper(r["rank"], r["collectives"]) if tamper is not None else r["collectives"]
        failures += check_collectives(expected, log, r["rank"])
    got, replicas = _assemble(bindings, rank_profile, rmap, results)
    want = _named_state(bindings, reference[0])
    compared = compare_tensors(got, want)
    if compared["differences"]:
        failures.append(f"{len(compared['differences'])} of {compared['tensors']} parameters and optimizer states "
                        f"differ from the single-process step beyond rtol {RTOL:g} / atol {ATOL:g} (first: "
                        f"{compared['differences'][0]})")
    if replicas:
        failures.append(f"the ranks' full copies of {replicas[0]} differ ({len(replicas)} tensors)")
    from .train import same_bits
    loss_equal = [same_bits(r["loss"], w) for r, w in zip(results, ref_losses)]
    kinds: dict[str, int] = {}
    for action in the_plan.actions:
        kinds[action.kind] = kinds.get(action.kind, 0) + 1
    applied = [r["actions_applied"] for r in results]
    if any(a != len(the_plan.actions) for a in applied):
        failures.append(f"a rank applied {min(applied)} of the plan's {len(the_plan.actions)} actions")
    return {
        "model": model, "world": world, "strategy": strategy, "profile": rank_profile.name,
        "profile_sha256": rank_profile.sha256, "one_gpu_profile": one_gpu.name, "hardware": hw.name,
        "planner": the_plan.planner.name if the_plan.planner else planner,
        "plan": plan if isinstance(plan, str) else None, "steps": 1, "batch": one_gpu.source.get("batch"),
        "seq": one_gpu.source.get("seq"), "kernels": "gpu" if gpu_kernels else "cpu", "seed": seed,
        "rank_seeds": seeds, "threads": threads,
        "ok": not failures, "failures": failures,
        "budget_bytes": result.budget_bytes, "simulated_peak_bytes": result.peak_bytes,
        "profile_peak_bytes": rank_profile.peak_bytes, "one_gpu_peak_bytes": one_gpu.peak_bytes,
        "peak_bytes": max(r["peak_bytes"] for r in results),
        "ranks": [{k: v for k, v in r.items() if k not in ("state", "collectives", "loss")}
                  | {"loss": float(r["loss"]) if r["loss"] is not None else None,
                     "loss_equal_reference": eq, "collectives_issued": len(r["collectives"])}
                  for r, eq in zip(results, loss_equal)],
        "collectives": [{"op": op, "kind": kind, "bytes": size} for op, kind, size in expected],
        "reduce_scatter": "emulated (all_reduce, then the rank's slice)" if any(r["emulated"] for r in results)
        else "torch.distributed.reduce_scatter_tensor (gloo)",
        "tolerance": {"rtol": RTOL, "atol": ATOL}, **compared,
        "reference_loss": [float(x) if x is not None else None for x in ref_losses],
        "actions_total": len(the_plan.actions), "actions": kinds,
        "predicted_overhead": result.overhead,
        "seconds": {"trace": trace_s, "plan": plan_s, "ranks": ranks_s, "reference": reference_s},
        "notes": notes,
    }


def _rank_work(rank, world, interpreter, bindings, rmap, start_values, batch, seed, threads, emulate) -> dict:
    """In rank ``rank``'s process: its values, its step, what it holds after it."""
    import torch

    from .collectives import Communicator
    torch.set_num_threads(threads)
    values = _rank_values(bindings, rmap, _with_batch(start_values.clone(), batch), rank, world)
    interpreter.comm = Communicator(rank, world, emulate_reduce_scatter=emulate)
    torch.manual_seed(seed)
    report = interpreter.run(values, 1)[0]
    state = {}
    for node, value in zip(bindings.placeholders, values.flat()):
        tid = _placeholder_tensor(bindings, node)
        if tid is not None and bindings.tensors[tid].role in ("parameter", "buffer", "optimizer_state"):
            state[tid] = value
    return {"rank": rank, "peak_bytes": report.peak_bytes, "peak_at": report.peak_at,
            "host_peak_bytes": report.host_peak_bytes, "ssd_peak_bytes": report.ssd_peak_bytes,
            "temporaries_bytes": report.temporaries_bytes, "size_mismatches": list(report.size_mismatches),
            "actions_applied": report.actions_applied, "seconds": report.seconds,
            "comm_buffer_bytes": interpreter.comm_buffer_peak, "staging_bytes": interpreter.staging_peak,
            "loss": report.loss, "collectives": list(interpreter.comm.log), "emulated": interpreter.comm.emulated,
            "state": state}


def _placeholder_tensor(bindings, node) -> str | None:
    found = getattr(bindings, "_by_placeholder", None)
    if found is None:
        found = {b.node: tid for tid, b in bindings.tensors.items() if b.role is not None}
        bindings._by_placeholder = found
    return found.get(node)


def _with_batch(values, batch):
    values.batch = [b.clone() for b in batch]
    return values


def _rank_values(bindings, rmap, values, rank: int, world: int):
    """``values`` with every tensor the rank holds as a shard replaced by its shard: the
    rank's slice of the tensor flattened and padded with zeros to a multiple of the world."""
    import torch
    flat = values.flat()
    for i, node in enumerate(bindings.placeholders):
        tid = _placeholder_tensor(bindings, node)
        if tid is None or tid not in rmap.tensors or rmap.tensors[tid].form != SHARD:
            continue
        whole = flat[i].reshape(-1)
        size = -(-whole.numel() // world)
        shard = torch.zeros(size, dtype=whole.dtype)
        part = whole[rank * size:(rank + 1) * size]
        shard[:part.numel()] = part
        flat[i] = shard
    return _from_flat(values, flat)


def _from_flat(values, flat):
    """A Values shaped as ``values`` holding ``flat`` (its ``flat()`` order)."""
    from tracer.pytorch.values import Values
    it = iter(flat)
    return Values([next(it) for _ in values.params], [next(it) for _ in values.buffers],
                  [[next(it) for _ in s] for s in values.states], [next(it) for _ in values.batch])


def _assemble(bindings, rank_profile, rmap, results):
    """The parameters and optimizer states after the step, put together from the ranks
    (name -> tensor), and the full tensors whose replicas differ between ranks."""
    import torch

    from .train import same_bits
    profile = bindings.profile
    got, replicas = {}, []
    for tid, b in bindings.tensors.items():
        if b.role not in ("parameter", "optimizer_state"):
            continue
        name = profile.tensor_by_id[tid].name or tid
        pieces = [r["state"][tid] for r in results]
        fake = b.node.meta.get("val")
        if rmap.tensors[tid].form == SHARD:
            whole = torch.cat([p.reshape(-1) for p in pieces])[:fake.numel()]
            got[name] = whole.view(tuple(fake.shape))
        else:
            got[name] = pieces[0]
            if not all(same_bits(p, pieces[0]) for p in pieces[1:]):
                replicas.append(name)
    return got, replicas


def _named_state(bindings, values) -> dict:
    out = {}
    for node, value in zip(bindings.placeholders, values.flat()):
        tid = _placeholder_tensor(bindings, node)
        if tid is not None and bindings.tensors[tid].role in ("parameter", "optimizer_state"):
            out[bindings.profile.tensor_by_id[tid].name or tid] = value
    return out


def _threads(n: int):
    from .train import _threads as threads
    return threads(n)
