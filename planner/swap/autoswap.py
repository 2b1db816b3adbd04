"""``autoswap``: swap by a vote of three priority scores, after AutoSwap (Zhang, Yeung, Shu,
He, Wang, "Efficient Memory Management for GPU-based Deep Learning Systems",
arXiv:1903.06631, 2019; the swapping half of that paper, whose other half, SmartPool, is
an allocator; implemented in Apache SINGA's swap code).

What it does
------------
AutoSwap reads one iteration's accesses (the ideal timeline of the profile,
``planner.shared.facts.op_start_us``) and a load curve (the bytes on the GPU at each op with
no swapping, ``profile.resident_bytes``), then:

1. **Candidates.** A candidate is an *absence*: two consecutive accesses ``a < c`` of a
   non-persistent tensor (made, read or updated) with at least one op between, and the
   tensor at least ``smallest`` bytes (-1, the default: 0.1% of the budget, so that the
   filter scales from toy models to 40 GiB budgets). A candidate is eligible while its absence
   straddles the op where the load curve peaks (``a < peak < c``).
2. **Scores.** With SwapOut / SwapIn = latency + bytes / bandwidth of a lone copy
   (d2h / h2d) and absence time AT = ideal start of ``c`` - ideal end of ``a``:
   DOA = AT - (SwapOut + SwapIn) (the duration of absence left after the two copies);
   AOA = DOA x bytes when DOA >= 0, DOA / bytes otherwise; WDOA = the sum over the ops
   of the absence of (load - limit) x op time (signed: time spent below the limit
   counts against a candidate).
3. **Majority voting.** Each score ranks the eligible candidates (0 = best, highest
   score first); the vote is ``w_doa x rank(DOA) + w_aoa x rank(AOA) + w_wdoa x
   rank(WDOA)`` and the lowest vote is taken. Its bytes leave the load curve over the
   op positions it is away (step 4), the peak is found again, WDOA and the ranks are
   recomputed over the candidates eligible at the new peak, and so on until the peak is
   within the budget (or no candidate straddles it: the plan is then returned as it
   stands and make_plan marks it infeasible when the simulator agrees).
4. **Schedule: stick-to-limit.** Swap-outs are issued after ``a`` in order of start and
   run one after another on the d2h queue (each after the previous has ended, as the
   plan's FIFO copy queue runs them). Swap-ins are scheduled serially *from the back*:
   sorted by need, latest first, each ends when its op ``c`` starts or when the next
   swap-in starts, whichever is first, and starts SwapIn earlier; the prefetch is issued
   after the last op that ends by then (never before ``a + 1``). Where bringing a
   tensor back that early would put an op over the limit, its swap-in is held back to
   after the last such op (the copy is then no longer hidden: compute waits for it).
   Swap-outs "sync early": an op that would go over the limit while offloads are still
   copying waits for them (the simulator's R6 does exactly that, so the plan needs no
   extra action; the planner's own estimate, ``estimate_us``, replays this schedule on
   the ideal timeline with the two copy queues).
5. **Weights by Bayesian optimisation** (``tune_trials``, 20 by default): the three vote
   weights are tuned with optuna's TPE sampler (``TPESampler(seed=--seed)``), each
   trial's plan scored by the simulator (the fastest plan within budget wins; the given
   weights are the first trial, so tuning never returns a slower plan than them).
   ``tune_trials = 0`` keeps the given weights. Without optuna installed (it is the
   optional extra ``tune``: ``pip install -e '.[tune]'``), a seeded random search over
   the same box takes its place and the notes say so.

Departures from the paper, and why
----------------------------------
1. **Re-evaluated peak.** The paper picks candidates straddling the one peak in the order
   of the vote until the peak load is under the limit. Once candidates leave, another op
   can become the peak; here the peak, the eligible set, WDOA and the ranks are
   recomputed after every choice, so the whole load curve ends within the budget (the
   paper's order is the special case where the first peak stays the peak).
2. **Op granularity.** The load curve is per op (``resident_bytes``: live tensors and the
   op's workspace), not per allocation event, and a chosen tensor counts as away over
   the op positions ``a+1 .. b`` (``b`` the op its swap-in is issued after). That is
   what the simulator needs for the plan to fit: the bytes are off the GPU once the
   offload has ended, and the prefetch allocates when it starts, after ``b``.
3. **Swap times.** DOA subtracts SwapOut + SwapIn (the paper writes 2 x swap time; the
   SINGA code uses the swap-out time twice); on a machine with equal directions they
   agree. Times come from the hardware file's uncontended link speeds, not from a fitted
   line.
4. **Bayesian optimisation of the weights** is run against the simulator's iteration
   time (the paper tunes the weights on measured runs; it does not say which BO
   library). The search box is [0, max(1, given weight)] per weight. With a time limit
   (``RunOptions.time_limit``) the search stops early, and the result may then depend
   on the machine's speed.
5. **No SmartPool.** The paper's memory pool (offline interval colouring) is not
   modelled: the simulator counts bytes with no fragmentation (R2), which is what
   SmartPool approximates.
6. **"no-overhead" mode** (the paper's schedule that ignores the limit while copying) is
   not offered: its plans overrun the budget, which the simulator reports as waiting
   for memory, i.e. the same plan as stick-to-limit.
7. **Only non-persistent tensors** move (weights and optimizer state stay on the GPU,
   ``moves_persistent=False``), and a tensor's host copy is written again for every
   chosen absence (no drop of a still-valid copy).
"""
from __future__ import annotations

import random
import time
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from simulator.model.links import link_speed
from simulator.plan import Plan, offload, prefetch
from simulator.profile import profile_sha256

from ..core.api import simulator_for
from ..core.lowering import OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import op_start_us, touches

WEIGHTS = ("w_doa", "w_aoa", "w_wdoa")
SMALLEST_PER_BUDGET = 1000   # smallest = -1: tensors under 0.1% of the budget are no candidates


@dataclass
class Candidates:
    """Every absence of every eligible tensor, as parallel arrays (ordered by ``a``, then
    the tensor's position in the profile)."""
    tensor: list[str]
    a: np.ndarray          # the access before the absence
    c: np.ndarray          # the access after it
    b_ideal: np.ndarray    # latest op whose ideal end leaves SwapIn before c's start (>= a + 1)
    nbytes: np.ndarray
    out_us: np.ndarray
    in_us: np.ndarray
    doa: np.ndarray
    aoa: np.ndarray

    def __len__(self) -> int:
        return len(self.tensor)


@dataclass
class Swap:
    """One chosen absence: offload after ``a``, prefetch after ``b`` before ``c``."""
    index: int
    tensor: str
    a: int
    b: int
    c: int
    nbytes: int
    out_us: float
    in_us: float


class Model:
    """The profile on its ideal timeline and the machine's copy speeds."""

    def __init__(self, profile, hardware, budget_bytes: int, smallest: int):
        self.profile = profile
        self.limit = budget_bytes
        self.starts = op_start_us(profile)                 # n + 1 entries
        self.times = np.array([op.time_us for op in profile.ops], dtype=float)
        self.resident = np.array(profile.resident_bytes, dtype=np.int64)
        out_lat, out_rate = link_speed(hardware, "offload", "host")
        in_lat, in_rate = link_speed(hardware, "prefetch", "host")
        self.out_time = lambda nbytes: out_lat + nbytes / out_rate
        self.in_time = lambda nbytes: in_lat + nbytes / in_rate
        self.candidates = self._candidates(smallest)

    def last_ending_by(self, when_us: float) -> int:
        """The last op position whose ideal end is at or before ``when_us`` (-1: none)."""
        return bisect_right(self.starts, when_us) - 2

    def _candidates(self, smallest: int) -> Candidates:
        profile, starts = self.profile, self.starts
        rows = []
        for order, tensor in enumerate(profile.tensors):
            if tensor.persistent or tensor.bytes == 0 or tensor.bytes < smallest:
                continue
            points = touches(profile, tensor.id)
            for a, c in zip(points, points[1:]):
                if c - a < 2:
                    continue
                out_us, in_us = self.out_time(tensor.bytes), self.in_time(tensor.bytes)
                absence = starts[c] - starts[a + 1]
                doa = absence - (out_us + in_us)
                aoa = doa * tensor.bytes if doa >= 0 else doa / tensor.bytes
                b = min(max(self.last_ending_by(starts[c] - in_us), a + 1), c - 1)
                rows.append((a, order, c, b, tensor.bytes, out_us, in_us, doa, aoa, tensor.id))
        rows.sort(key=lambda r: (r[0], r[1], r[2]))
        col = list(zip(*rows)) if rows else [()] * 10
        return Candidates(tensor=list(col[9]), a=np.array(col[0], dtype=np.int64), c=np.array(col[2], dtype=np.int64),
                          b_ideal=np.array(col[3], dtype=np.int64), nbytes=np.array(col[4], dtype=np.int64),
                          out_us=np.array(col[5], dtype=float), in_us=np.array(col[6], dtype=float),
                          doa=np.array(col[7], dtype=float), aoa=np.array(col[8], dtype=float))


def _ranks(score: np.ndarray) -> np.ndarray:
    """0 for the highest score, 1 for the next, ... (ties: the earlier candidate first)."""
    order = np.argsort(-score, kind="stable")
    ranks = np.empty(len(score), dtype=float)
    ranks[order] = np.arange(len(score), dtype=float)
    return ranks


def select(model: Model, weights: tuple[float, float, float]) -> tuple[list[Swap], bool, int]:
    """Majority voting with the re-evaluated peak (steps 1-3): the chosen absences, in the
    order taken, whether the load curve ended within the limit, and the rounds run."""
    cand, limit, times = model.candidates, model.limit, model.times
    load = model.resident.copy()
    chosen = np.zeros(len(cand), dtype=bool)
    swaps: list[Swap] = []
    w_doa, w_aoa, w_wdoa = weights
    rounds = 0
    while True:
        peak = int(np.argmax(load)) if len(load) else 0
        if not len(load) or load[peak] <= limit:
            return swaps, True, rounds
        eligible = np.flatnonzero(~chosen & (cand.a < peak) & (cand.c > peak))
        if not eligible.size:
            return swaps, False, rounds
        rounds += 1
        weighted = np.concatenate(([0.0], np.cumsum((load - limit).astype(float) * times)))
        a, c = cand.a[eligible], cand.c[eligible]
        wdoa = weighted[c] - weighted[a + 1]
        vote = (w_doa * _ranks(cand.doa[eligible]) + w_aoa * _ranks(cand.aoa[eligible])
                + w_wdoa * _ranks(wdoa))
        pick = int(eligible[int(np.argmin(vote))])
        a, c = int(cand.a[pick]), int(cand.c[pick])
        over = np.flatnonzero(load[a + 1:c] > limit)
        b = max(int(cand.b_ideal[pick]), a + 1 + int(over[-1]))
        load[a + 1:b + 1] -= cand.nbytes[pick]
        chosen[pick] = True
        swaps.append(Swap(pick, cand.tensor[pick], a, b, c, int(cand.nbytes[pick]),
                          float(cand.out_us[pick]), float(cand.in_us[pick])))


def stick_to_limit(model: Model, swaps: list[Swap]) -> tuple[list[Swap], bool]:
    """Step 4: swap-ins serial from the back, then held back wherever an op would go over
    the limit. Returns the swaps with their final ``b`` and whether every op fits."""
    starts, limit = model.starts, model.limit
    next_start = float("inf")
    for swap in sorted(swaps, key=lambda s: (-s.c, -s.a, s.index)):
        ends_by = min(starts[swap.c], next_start)
        swap.b = min(max(model.last_ending_by(ends_by - swap.in_us), swap.a + 1), swap.c - 1)
        next_start = starts[swap.b + 1]
    load = model.resident.copy()
    for swap in swaps:
        load[swap.a + 1:swap.b + 1] -= swap.nbytes
    fits = True
    for q in np.flatnonzero(load > limit).tolist():
        if load[q] <= limit:
            continue
        present = sorted((s for s in swaps if s.a < q < s.c and s.b < q), key=lambda s: (-s.c, s.index))
        for swap in present:
            load[swap.b + 1:q + 1] -= swap.nbytes
            swap.b = q
            if load[q] <= limit:
                break
        fits = fits and load[q] <= limit
    return swaps, fits


def estimate(model: Model, swaps: list[Swap]) -> float:
    """The iteration on the ideal timeline with the plan's two serial copy queues: an op
    waits for its prefetches, and for running offloads when it would go over the limit
    (stick-to-limit's early sync)."""
    n = len(model.times)
    outs: dict[int, list[Swap]] = {}
    ins: dict[int, list[Swap]] = {}
    for swap in swaps:
        outs.setdefault(swap.a, []).append(swap)
        ins.setdefault(swap.b, []).append(swap)
    due: dict[int, float] = {}
    out_end: dict[int, float] = {}
    away = np.zeros(n + 1, dtype=np.int64)   # bytes counted away at each op once offloaded
    for swap in swaps:
        away[swap.a + 1] += swap.nbytes
        away[swap.b + 1] -= swap.nbytes
    away = np.cumsum(away)[:n]
    clock = d2h = h2d = 0.0
    copying: list[Swap] = []                  # offloads whose copy may still run
    for p in range(n):
        for swap in [s for s in copying if s.b < p]:
            copying.remove(swap)
        need = int(model.resident[p] - away[p]) + sum(s.nbytes for s in copying if out_end[s.index] > clock)
        for swap in sorted(copying, key=lambda s: out_end[s.index]):
            if need <= model.limit:
                break
            if out_end[swap.index] > clock:
                clock = out_end[swap.index]       # sync early
                need -= swap.nbytes
        clock = max(clock, due.pop(p, 0.0))
        clock += float(model.times[p])
        for swap in outs.get(p, ()):
            d2h = max(d2h, clock) + swap.out_us
            out_end[swap.index] = d2h
            copying.append(swap)
        for swap in sorted(ins.get(p, ()), key=lambda s: (s.c, s.index)):
            h2d = max(h2d, clock, out_end.get(swap.index, 0.0)) + swap.in_us
            due[swap.c] = max(due.get(swap.c, 0.0), h2d)
    return max(clock, d2h, h2d)


def swap_actions(profile, swaps: list[Swap]) -> list:
    """The plan's actions for ``swaps``, in issue order."""
    ops = profile.ops
    steps = []
    for swap in swaps:
        steps.append(Step(swap.a, OFFLOAD, swap.c, (swap.tensor, swap.c), offload(swap.tensor, ops[swap.a].id, "host")))
        steps.append(Step(swap.b, PREFETCH, swap.c, (swap.tensor, swap.c),
                          prefetch(swap.tensor, ops[swap.b].id, ops[swap.c].id, "host")))
    return issue_order(steps)


def autoswap_plan(model: Model, weights) -> tuple[list, list[Swap], dict]:
    """The actions, swaps and notes for one weight vector."""
    swaps, fitted, rounds = select(model, weights)
    swaps, fits = stick_to_limit(model, swaps)
    notes = {"candidates": len(model.candidates), "swapped": len(swaps),
             "swapped_bytes": sum(s.nbytes for s in swaps), "rounds": rounds,
             "selection": "the load curve fits the budget" if fitted and fits else
             "no candidate straddles the remaining peak: the budget is not met by AutoSwap's estimate"}
    return swap_actions(model.profile, swaps), swaps, notes


def _suggest_box(given: tuple[float, float, float]) -> list[tuple[str, float]]:
    return [(name, max(1.0, value)) for name, value in zip(WEIGHTS, given)]


def tune(model: Model, hardware, given: tuple[float, float, float], trials: int, options) -> tuple[tuple, str, int]:
    """Bayesian optimisation of the weights (optuna TPE, seeded), or a seeded random search
    without optuna. Returns the best weights, the method used and the plans simulated."""
    profile = model.profile
    simulator = simulator_for(profile, hardware, options)
    sha = profile_sha256(profile)
    cache: dict[tuple, tuple] = {}
    best: list = [None, None]                      # (rank, weights)
    started = time.perf_counter()

    def evaluate(weights: tuple) -> float:
        actions, swaps, _ = autoswap_plan(model, weights)
        key = tuple((s.index, s.b) for s in swaps)
        if key not in cache:
            score = simulator.score(Plan(profile_name=profile.name, profile_sha256=sha, actions=tuple(actions)),
                                    model.limit)
            cache[key] = score.rank()
        rank = cache[key]
        if best[0] is None or rank < best[0]:
            best[0], best[1] = rank, weights
        if rank[0] == 0:
            return float(rank[1])
        return 1e15 + float(rank[1]) if rank[0] == 1 else 1e18

    def out_of_time() -> bool:
        return options.time_limit is not None and time.perf_counter() - started > options.time_limit

    box = _suggest_box(given)
    try:
        import optuna
    except ImportError:
        optuna = None
    if optuna is not None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=options.seed))
        study.enqueue_trial(dict(zip(WEIGHTS, given)))

        def objective(trial):
            weights = tuple(trial.suggest_float(name, 0.0, high) for name, high in box)
            value = evaluate(weights)
            options.say(f"autoswap: trial {trial.number}: weights {tuple(round(w, 3) for w in weights)}: "
                        + (f"{value:.0f} us" if value < 1e15 else "does not fit"))
            if out_of_time():
                study.stop()
            return value

        study.optimize(objective, n_trials=trials)
        method = f"optuna TPE ({len(study.trials)} trials, seed {options.seed})"
    else:
        rng = random.Random(options.seed)
        evaluate(given)
        done = 1
        for _ in range(trials - 1):
            if out_of_time():
                break
            evaluate(tuple(rng.uniform(0.0, high) for _, high in box))
            done += 1
        method = (f"seeded random search ({done} trials, seed {options.seed}): optuna is not installed "
                  "(pip install -e '.[tune]' for Bayesian optimisation)")
    return best[1], method, len(cache)


@register("autoswap", "AutoSwap: swap the absences that straddle the load peak, ranked by a weighted vote of "
                      "DOA, AOA and WDOA, until the peak fits; stick-to-limit schedule; weights tuned by Bayesian "
                      "optimisation (optuna).",
          params=(Param("smallest", -1, "smallest tensor (bytes) that is a candidate (-1: 0.1% of the budget)",
                        low=0, also=(-1,)),
                  Param("w_doa", 1.0, "vote weight of the DOA rank (duration of absence left after the copies)",
                        low=0.0),
                  Param("w_aoa", 1.0, "vote weight of the AOA rank (DOA x size, or DOA / size when negative)",
                        low=0.0),
                  Param("w_wdoa", 1.0, "vote weight of the WDOA rank (load over the limit, summed over the "
                                       "absence)", low=0.0),
                  Param("tune_trials", 20, "trials of Bayesian optimisation of the three weights (optuna TPE, "
                                           "seeded by --seed; the given weights first); 0: the given weights",
                        low=0, high=10000)),
          moves_persistent=False,
          paper="Zhang et al., Efficient Memory Management for GPU-based Deep Learning Systems (AutoSwap), "
                "arXiv:1903.06631, 2019", family="swap")
def plan_autoswap(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, smallest=-1, w_doa=1.0,
                  w_aoa=1.0, w_wdoa=1.0, tune_trials=20) -> Draft:
    if smallest == -1:
        smallest = budget_bytes // SMALLEST_PER_BUDGET
    model = Model(profile, hardware, budget_bytes, smallest)
    given = (float(w_doa), float(w_aoa), float(w_wdoa))
    if not len(model.resident) or int(model.resident.max()) <= budget_bytes:
        return Draft(actions=[], notes={"candidates": len(model.candidates), "swapped": 0,
                                        "why": "the load curve fits the budget: nothing to swap"})
    tuning = None
    weights = given
    if tune_trials > 0 and len(model.candidates):
        weights, method, simulated = tune(model, hardware, given, tune_trials, options)
        tuning = {"method": method, "distinct_plans": simulated}
    actions, swaps, notes = autoswap_plan(model, weights)
    notes = {**notes, "smallest_bytes": smallest, "weights": dict(zip(WEIGHTS, [round(w, 6) for w in weights]))}
    if tuning is not None:
        notes["tuning"] = tuning
    return Draft(actions=actions, estimate_us=round(estimate(model, swaps), 3), notes=notes)
