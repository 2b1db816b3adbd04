"""A data-parallel rank's memory and step time beside published figures and the
frameworks' own formulas (issue 51).

    .venv/bin/python benchmarks/sharding.py [--quick] [--only NAME]

Three kinds of reference:

- **ZeRO's model-state formulas** (Rajbhandari et al., SC'20, section 5 and Figure 1):
  with Psi parameters, mixed-precision Adam (K = 12 bytes a parameter of fp32 master
  weights, momentum and variance besides the 2-byte weights and 2-byte gradients) on N
  ranks a rank holds (2 + 2 + K) Psi (DDP), 4 Psi + K Psi / N (ZeRO-1: optimizer state
  sharded), 2 Psi + (2 + K) Psi / N (ZeRO-2: and gradients), (2 + 2 + K) Psi / N
  (ZeRO-3: and weights). The paper's worked example: 7.5 B parameters on 64 GPUs,
  120 / 31.4 / 16.6 / 1.9 GB. swapplan's rank holds exactly what its traced step holds:
  the weights and optimizer state its trace has (with `--amp bf16`: bf16 weights, fp32
  master weights, two fp32 moments: 14 bytes a parameter persistent, not the paper's 16,
  which counts the 2-byte gradient as a model state) and gradients while they live.
- **DeepSpeed's ZeRO-3 estimator** counts model states only (deepspeedai/DeepSpeed#4527:
  0.49 GB per GPU estimated against 14.7-21.3 GB measured): the activations, gathered
  units and communication buffers it leaves out are what swapplan's rank peak adds.
- **torchtitan's FSDP benchmark** (pytorch/torchtitan docs/performance.md, Table 1):
  Llama 3.1 8B, 8 H100 (96 GB HBM2e, NVLink), FSDP2, local batch 2, sequence 8192,
  bf16 mixed precision, selective activation checkpointing: 82.4 GiB and 5,762 tokens/s
  per GPU (2 x 8192 tokens a GPU a step at 5,762 tokens/s: 2.84 s a step). swapplan
  traces the same model and batch (`tracer/configs/llama3.1-8b.json`), shards it zero3
  over 8 on `h100-80gb-sxm-x8` (80 GB cards, one GiB held back) and lets the recompute
  planners stand in for selective checkpointing (skipped with --quick: the trace takes
  minutes).

Prints one block per model and strategy: the rank's persistent bytes against the
formula, its no-swap peak, the bytes it sends on the interconnect against the ring
formula, and its step with the fastest plan that fits (none when it fits as is).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GIB = 2**30
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
PLANNERS = ("none", "capuchin", "chen", "g10", "lms", "zero-offload")   # the fastest that fits is reported


def zero_model_states(strategy: str, params: float, world: int, weight: float, grad: float, state: float) -> float:
    """ZeRO's bytes a rank holds of weights (``weight`` bytes a parameter), gradients
    (``grad``) and optimizer state (``state``, the paper's K) under ``strategy``."""
    full, shard = {"ddp": (weight + grad + state, 0.0), "zero1": (weight + grad, state),
                   "zero2": (weight, grad + state), "zero3": (0.0, weight + grad + state)}[strategy]
    return params * (full + shard / world)


def paper_example() -> str:
    """The ZeRO paper's own example, from the formula: 7.5 B parameters, 64 GPUs, K = 12."""
    figures = [zero_model_states(s, 7.5e9, 64, 2, 2, 12) / 1e9 for s in STRATEGIES]
    return ("ZeRO paper (7.5 B, 64 GPUs, K = 12): published 120 / 31.4 / 16.6 / 1.9 GB; the formula gives "
            + " / ".join(f"{g:.1f}" for g in figures) + " GB")


def weight_bytes(profile) -> tuple[int, int]:
    """(parameters, weight bytes) of a one-GPU profile: its weights, counted once."""
    weights = [t for t in profile.tensors if t.kind == "weight"]
    params = 0
    for t in weights:
        size = {"bf16": 2, "fp16": 2, "fp32": 4}.get(t.dtype or "fp32", 4)
        params += t.bytes // size
    return params, sum(t.bytes for t in weights)


def best_step(rank, hardware, memory: int, planners) -> tuple[str | None, float | None, float | None]:
    """(planner, step us, peak bytes) of the fastest plan that fits ``memory``."""
    from planner.core.api import make_plan
    from planner.core.registry import RunOptions
    from simulator.errors import SwapplanError

    best = (None, None, None)
    for name in planners:
        try:
            planned = make_plan(rank, hardware, memory, name, {}, 0, RunOptions(seed=0, time_limit=20, threads=1))
        except SwapplanError:
            continue
        result = planned.result
        if result.ok and (best[1] is None or result.iteration_us < best[1]):
            best = (name, result.iteration_us, result.peak_bytes)
        if name == "none" and result.ok:
            break                     # fits as it is: nothing moves faster
    return best


def report(label: str, profile, hardware_name: str, world: int, per_param: tuple[float, float, float],
           tokens: int | None = None) -> None:
    """One model's block: every strategy's rank."""
    from shard import shard_profile
    from simulator.hardware import load_hardware

    hardware = load_hardware(hardware_name)
    memory = hardware.gpu.memory_bytes - GIB
    params, weights = weight_bytes(profile)
    print(f"== {label}: {params / 1e9:.2f} B parameters, one-GPU peak {profile.peak_bytes / GIB:.1f} GiB, "
          f"ideal {profile.ideal_us / 1e6:.3f} s; {world} ranks on {hardware_name} ({memory / GIB:.0f} GiB each)")
    for strategy in STRATEGIES:
        started = time.perf_counter()
        rank = shard_profile(profile, strategy, world)
        weight, grad, state = per_param
        formula = zero_model_states(strategy, params, world, weight, 0, state)   # what stays: weights, state
        with_grads = zero_model_states(strategy, params, world, weight, grad, state)
        held = rank.persistent_bytes - sum(t.bytes for t in rank.tensors if t.kind == "input")
        ring = {"ddp": 2 * weights, "zero1": 2 * weights, "zero2": 2 * weights, "zero3": 3 * weights}[strategy]
        ring = ring * (world - 1) / world
        wire = sum(op.collective.wire_bytes() for op in rank.ops if op.collective is not None)
        planner, step_us, peak = best_step(rank, hardware, memory, PLANNERS)
        step = "no plan fits" if step_us is None else f"{step_us / 1e6:.3f} s by {planner} (peak {peak / GIB:.1f} GiB)"
        rate = ""
        if step_us is not None and tokens:
            rate = f", {tokens / (step_us / 1e6):,.0f} tokens/s a GPU"
        print(f"   {strategy:<5} weights + state {held / GIB:6.2f} GiB (ZeRO {formula / GIB:6.2f}; with gradients "
              f"{with_grads / GIB:6.2f}); no-swap peak {rank.peak_bytes / GIB:6.1f} GiB; sends {wire / 1e9:6.2f} GB "
              f"(ring {ring / 1e9:6.2f}); step {step}{rate} [{time.perf_counter() - started:.0f} s]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="GPT-2 and Llama-2 7B only (no Llama 3.1 8B trace).")
    parser.add_argument("--only", default=None, help="Only the models whose label contains this.")
    options = parser.parse_args()
    from simulator.catalog import open_profile

    print(paper_example())
    print("DeepSpeed's ZeRO-3 estimator (#4527): 0.49 GB per GPU of model states, 14.7-21.3 GB measured: the "
          "activations and gathered units it leaves out are in the no-swap peaks below")
    models = [("GPT-2 b48 s1024 fp32 AdamW", lambda: open_profile("gpt2-b48-s1024"), "a100-80gb-sxm-x8",
               (4, 4, 8), None)]
    try:
        import torch  # noqa: F401
        from tracer.pytorch.trace import trace
    except ImportError:
        print("(torch is not installed: the traced Llama models are skipped; pip install -e '.[trace]')")
    else:
        models.append(("Llama-2 7B b4 s1024 amp bf16 AdamW",
                       lambda: trace(None, batch=4, seq=1024, amp="bf16", optimizer="adamw",
                                     hardware="a100-80gb-sxm-x8", hf_config="llama2-7b"),
                       "a100-80gb-sxm-x8", (2, 2, 12), 4 * 1024))
        if not options.quick:
            models.append(("Llama 3.1 8B b2 s8192 amp bf16 AdamW (torchtitan: 82.4 GiB, 5,762 tokens/s a GPU "
                           "on 96 GB H100s, FSDP, selective checkpointing)",
                           lambda: trace(None, batch=2, seq=8192, amp="bf16", optimizer="adamw",
                                         hardware="h100-80gb-sxm-x8", hf_config="llama3.1-8b"),
                           "h100-80gb-sxm-x8", (2, 2, 12), 2 * 8192))
    for label, make, hardware, per_param, tokens in models:
        if options.only and options.only not in label:
            continue
        started = time.perf_counter()
        profile = make()
        print(f"(traced or loaded in {time.perf_counter() - started:.0f} s)")
        report(label, profile, hardware, 8, per_param, tokens)


if __name__ == "__main__":
    main()
