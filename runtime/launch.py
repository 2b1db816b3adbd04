"""N rank processes on this machine: forked from the parent (which has traced, sharded,
planned and simulated once, so every rank starts from the same graph and plan), joined
by ``torch.distributed`` over gloo with a FileStore in a temporary folder. Each runs its
step and writes what it holds after it (its persistent tensors, its report and its
collective log) to ``rank<r>.pt`` in that folder, or one line saying why it failed to
``rank<r>.err``.
"""
from __future__ import annotations

import os
import tempfile
import time
import traceback
from datetime import timedelta

from simulator.errors import SwapplanError

from .interpreter import RuntimeFailure


def run_ranks(world: int, work, timeout_s: float = 600.0) -> list[dict]:
    """Fork ``world`` processes, rank r calling ``work(r)`` (returning a picklable dict)
    inside an initialised gloo process group; their dicts, by rank. RuntimeFailure
    naming the first rank that failed (or timed out)."""
    import multiprocessing

    import torch

    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="swapplan-ranks-") as folder:
        store = os.path.join(folder, "store")
        procs = [ctx.Process(target=_child, args=(r, world, store, folder, work, timeout_s), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        try:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:
            alive = [p for p in procs if p.is_alive()]
            for p in alive:
                p.kill()
                p.join()
        failures = []
        for r, p in enumerate(procs):
            err = os.path.join(folder, f"rank{r}.err")
            if os.path.exists(err):
                with open(err, encoding="utf-8") as f:
                    failures.append((r, f.read().strip()))
            elif p in alive:
                failures.append((r, f"did not finish within {timeout_s:.0f} s"))
            elif p.exitcode != 0:
                failures.append((r, f"exited with status {p.exitcode}"))
        if failures:
            # a rank that failed first makes the others fail waiting for it: name the first cause
            first = next(((r, m) for r, m in failures if "timed out" not in m.lower() and "connection" not in
                          m.lower()), failures[0])
            raise RuntimeFailure(f"rank {first[0]}: {first[1]}")
        return [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def _child(rank: int, world: int, store: str, folder: str, work, timeout_s: float) -> None:
    import torch.distributed as dist
    status = 0
    try:
        import torch
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=max(30.0, timeout_s)))
        try:
            result = work(rank)
        finally:
            dist.destroy_process_group()
        torch.save(result, os.path.join(folder, f"rank{rank}.pt"))
    except BaseException as exc:   # noqa: BLE001 - reported to the parent as one line
        status = 1
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not isinstance(exc, SwapplanError):
            message = f"{type(exc).__name__}: {message}"
        if os.environ.get("SWAPPLAN_DEBUG"):
            message += "\n" + traceback.format_exc()
        with open(os.path.join(folder, f"rank{rank}.err"), "w", encoding="utf-8") as f:
            f.write(message)
    finally:
        os._exit(status)
