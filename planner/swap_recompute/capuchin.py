"""``capuchin``: swap and recompute, chosen per tensor from its access pattern.

Follows Peng et al., "Capuchin: Tensor-based GPU Memory Management for Deep Learning",
ASPLOS 2020, section 4 (the memory-management policy: "Estimating Swap and
Recomputation Benefit", "Determining Tensor Re-generation Cost", the hybrid swap /
recompute selection and the MSPS recomputation selection), as summarised from the
paper (its abstract and third-party summaries of section 4; the full text could not be
read here), so the rules below are that summary's, and where the summary leaves a detail open the choice is this module's and
is listed under departures.

1. Access sequence: from the profile on its ideal timeline
   (``planner.shared.facts.op_start_us``), each non-persistent tensor's accesses (the ops
   that produce, read or update it, and, once chosen, the recomputes that read it). An
   access pair (evicted-access ``e``, back-access ``c``) is two consecutive accesses with
   at least one op between them.
2. Costs: SwapTime = latency + bytes / bandwidth (d2h out, h2d in); SwapOutEnd = end of
   ``e`` + SwapTime; SwapInStart = start of ``c`` - SwapTime; FreeTime FT = SwapInStart -
   SwapOutEnd. Recompute time = the producer's time (plus a chain's, step 5).
3. Candidates: the pairs whose idle interval holds an op over the budget. The memory
   estimate (``planner.shared.estimate``, shared with g10 and flashneuron) starts from
   ``profile.resident_bytes`` and is updated after every choice (a
   tensor counts as off the GPU from the first op starting after its offload ends, or
   after its drop, up to its prefetch's trigger, or up to its recompute); the memory to
   save is each op's excess over the budget.
4. Swaps first: pairs by FT, descending, each taken if its copies are fully hidden: on a
   FIFO model of each PCIe direction (R1, R17; one queue on a half-duplex link) the
   offload frees the tensor before an over-budget op, the prefetch issued at the
   in-trigger ends before ``c``, and no copy already taken is made late. The in-trigger
   is the last op whose prefetch still ends by ``c`` (walking back from ``c``, with the
   queue: the copy may start later than SwapInStart), and never inside the peak: no op
   between the trigger and ``c`` may be over the budget.
5. When swaps alone are not enough: every remaining pair is scored by MSPS = bytes /
   cost, where cost is the cheaper of its swap overhead and its recompute time, the best
   is taken with its cheaper method, and the others are re-scored after each choice
   (lazily: a popped pair is re-scored and taken only if it still beats the next), since
   a choice changes the queues, the estimate and the recompute sources. A recompute is
   ``drop(t, after=e)`` + ``recompute(t, before=c)``. Its sources are its producer's
   inputs as the plan leaves them at ``c``: a resident input costs nothing (its lifetime
   grows to ``c``); one freed after its last use, or dropped for recomputation across
   ``c``, is recomputed first, recursively (a chain: its producer's time is added, and
   it is dropped again after ``c`` when needed later); one swapped out across ``c`` has
   its prefetch made due at ``c`` (its stall is the cost). R15 is respected: only a
   tensor whose producer updates nothing in place and which is not updated in place
   before ``c`` is recomputed, and the recomputes before one op are issued in producer
   order, so a chain's sources come first.
6. Feedback: the plan is simulated (``simulator.api.simulate``); every prefetch whose
   back-access op still waited for data (``stall_by_op`` ``data_us``) has its trigger
   moved earlier, by the larger of that stall and ``feedback_step`` x the ideal
   iteration (at least one op), but never into the peak (the estimate with the tensor
   back must stay within the budget at every op it moves over) nor before its offload
   frees it; then the plan is simulated again. At most ``feedback_rounds`` rounds (one
   simulation each, about 1 ms on 1,000 ops; 10 by default, since rounds stop early and
   more of them cut resnet50 at 40 GiB from 10.7% to 8.6% overhead at the same planning
   time), stopping early when no trigger moves or a plan fails; the best simulated plan
   is returned.
7. Where the estimate is unsure: when a phase-2 choice had a swap and a recompute whose
   estimated costs were within ``UNSURE`` (2x) of each other, the whole plan is made again
   with swap overheads weighed at 1/``UNSURE`` (leaning to swaps), and the simulator
   keeps the faster of the two (bert-base at 40 GiB on an A100: 4.2% -> 0.5%; on the
   shipped profiles never slower, since the first plan stays when it is not beaten).
8. SSD tier (``ssd``, on by default on a machine with an SSD; a departure, below). Host
   memory and SSD space are tracked per op as R19 counts them: a copy holds space from the
   op after its offload is issued until the tensor's last access (its death), and a second
   offload of a tensor to the same tier reuses the space; a swap whose copy does not fit
   is not an option in that tier. The plan of steps 1-7 swaps to host memory only; when it
   had to refuse a swap for want of host memory, a second plan (steps 1-7 again) may also
   swap to the SSD, and the simulator keeps the faster of the two (note ``ssd_tier``).
   Which tensors go to the SSD: a plan is made (phases 1 and 2) as if host memory were
   unbounded; while its swaps' host copies would overflow host memory at some op, the
   swapped tensor holding space there with the longest free time (step 2) is moved to the
   SSD set (long free times hide the slow copies best). In the second plan those tensors
   try the SSD first and the others host memory first, each falling back to the other
   tier when its own has no room (phase 1: no room or the copy does not hide; phase 2:
   the tier whose swap stalls less, the first tried on a tie). An SSD swap's SwapTime uses
   the SSD route's latency and rate (``transfer_links``: PCIe + SSD latency, the slower
   link's rate, R18); its copies queue FIFO on their own streams (``ssd_write``,
   ``ssd_read``, R1), or on the one copy-engine queue of a half-duplex machine through
   host memory (R17), and each also takes its share of PCIe, a copy of its bytes at the
   PCIe rate queued on the host copy queue of its direction from its estimated start, due
   never (it only delays host copies). A prefetch from the SSD starts after its offload to
   the SSD ends. The stall estimate (phase 2's swap overhead, weighed against recompute
   time by MSPS) counts both queues. A tensor whose copy is still valid reuses it in its
   tier (a drop, then a prefetch from that tier).
   What it gives on G10's machine: docs/planners.md ("SSD spills"), benchmarks/ssd_spills.py.

Departures from the paper, and why:

- Capuchin decides at run time from a measured iteration and adjusts in-triggers from
  run-time feedback; here everything is decided offline on the profile's ideal
  timeline, and the feedback comes from simulated iterations (step 6).
- Memory target: the paper saves ``peak - capacity`` bytes; with several over-budget
  windows that is not enough, so choices go on until the op-granularity estimate is
  within the budget at every op (or no pair helps). Memory saved in MSPS is the tensor's
  bytes, as in the paper.
- Unit of choice: a tensor may be evicted across each of its idle intervals, not once; a
  later swap of a tensor whose host copy is still valid (not updated in place since its
  offload) drops it instead of copying it out again.
- Phase 2 scores every pair by bytes / (cheaper of swap overhead and recompute time):
  the paper's MSPS when recomputing is the cheaper; a pair that cannot be recomputed is
  ranked by bytes / swap overhead. ``recompute=false`` leaves only swaps, ``swap=false``
  only phase 2's recomputes.
- Swap overhead is a stall estimate on the queue model: a late prefetch stalls its
  back-access, a late offload stalls the op that needs its memory, and within a busy
  period of a queue the compute stream, once delayed, gives later copies that much
  more time, so a period costs its largest lateness (periods add up). In phase 2 a
  swap whose offload cannot end before any over-budget op of its interval is still
  allowed, freeing from the first over-budget op (which then waits for the release,
  counted as overhead); the paper has no such case (its swaps are decided on measured
  time and memory is reclaimed when the copy ends).
- "Never inside the peak": the trigger is put after the last over-budget op of the
  interval (as the estimate stands when the pair is chosen); a pair whose hidden
  trigger falls inside is not a free swap and goes to phase 2 with that stall as its
  overhead. Feedback may later move such a trigger earlier once other choices made room.
- Chains: a source swapped out across ``c`` gets its prefetch due at ``c`` (the paper
  would swap it in on demand at the recompute); a tensor is not recomputed from an
  input that is updated in place between its producer and ``c`` (the value would
  differ; the simulator does not check this).
- The recompute items' own memory (the regenerated tensor and chain sources plus the
  largest producer workspace, just before ``c``) is checked against the estimate of
  what is resident entering ``c``; it is an approximation, as is the estimate itself
  (whole ops, ideal times).
- The SSD tier (step 8): Capuchin swaps to host memory only, assumed large enough; here
  swaps spill to the SSD when host memory (counted per op, R19) runs out (``ssd=false``:
  host memory only). Weights and optimizer state never move (``moves_persistent=False``).
- The feedback step: the paper moves the in-trigger earlier when a tensor is still being
  swapped in at its back-access; the amount here is ``max(stall, feedback_step x
  iteration)``, bounded as in step 6.
"""
from __future__ import annotations

import numpy as np

from simulator.plan import Action, drop, offload, prefetch, recompute

from ..core.api import score, simulator_for
from ..core.lowering import DROP, OFFLOAD, PREFETCH, Step, issue_order
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ._capuchin_choose import UNSURE, free_time, hybrid_phase, queue_prefetch, swap_phase
from ._capuchin_state import HOST, IN, RECOMPUTE, SSD, SWAP, State

# The state is _capuchin_state.py, phases 1 and 2 (steps 4, 5) _capuchin_choose.py; here the
# plan: its actions, the simulated feedback (step 6), the judged replan (step 7) and the SSD
# tier's preselection (step 8).


# ----------------------------------------------------------------------------- the plan


def _actions(state: State) -> list[Action]:
    """The plan's actions: per issuing op, drops, then offloads, then prefetches, copies
    in the order they were taken (the FIFO order the queue model assumed); then the
    recomputes, per op in producer order (a chain's sources first)."""
    ops = state.profile.ops
    producer = state.profile.producer
    steps: list[Step] = []
    redo: list[tuple] = []
    for tid in sorted(state.evictions):
        for ev in state.evictions[tid].values():
            e_id, c_id = ops[ev.after].id, ops[ev.before].id
            if ev.method == RECOMPUTE or ev.reuse_copy:
                steps.append(Step(ev.after, DROP, ev.before, (ev.before, tid), drop(tid, e_id)))
            else:
                steps.append(Step(ev.after, OFFLOAD, ev.before, ev.out_key[2], offload(tid, e_id, ev.tier)))
            if ev.method == RECOMPUTE:
                redo.append(((ev.before, producer[tid], tid), recompute(tid, c_id)))
            else:
                steps.append(Step(ev.trigger, PREFETCH, ev.before, ev.in_key[2],
                                  prefetch(tid, ops[ev.trigger].id, c_id, ev.tier)))
    redo.sort(key=lambda x: x[0])
    return issue_order(steps, fifo=True) + [a for _, a in redo]


def _simulate(state: State):
    actions = tuple(_actions(state))
    return actions, score(state.sim, state.budget, actions)


def _move_triggers(state: State, result, step: float) -> int:
    """Move earlier the trigger of every prefetch whose back-access still waited for
    data; returns how many moved."""
    ops = state.profile.ops
    stalls = {op_id: s["data_us"] for op_id, s in result.stall_by_op.items() if s["data_us"] > 1e-9}
    if not stalls:
        return 0
    moved = 0
    shift_floor = step * state.profile.ideal_us
    for tid in sorted(state.evictions):
        for ev in sorted(state.evictions[tid].values(), key=lambda v: v.after):
            if ev.method != SWAP or ops[ev.before].id not in stalls:
                continue
            target = state.starts[ev.trigger + 1] - max(stalls[ops[ev.before].id], shift_floor)
            nbytes = state.tensors[tid].bytes
            too_full = state.estimate.last_over(nbytes, ev.free_from + 1, ev.trigger + 1)
            lowest = ev.free_from if too_full is None else too_full
            p = ev.trigger
            while p > lowest:
                p -= 1
                if state.starts[p + 1] <= target:
                    break
            if p == ev.trigger:
                continue
            state.remove_copy(ev.tier, IN, ev.in_key)
            ev.trigger = ev.free_to = p
            queue_prefetch(state, ev)
            state.refresh(tid)
            moved += 1
    return moved


def _better(result, than) -> bool:
    if result.ok != than.ok:
        return result.ok
    if result.valid != than.valid:
        return result.valid
    return result.iteration_us < than.iteration_us - 1e-6


def _feedback(state: State, rounds: int, step: float) -> tuple[list[Action], object, dict]:
    """Step 6: simulate, move stalled prefetch triggers earlier, simulate again; at most
    ``rounds`` times. Returns the best simulated plan's actions, its result and what
    happened."""
    actions, result = _simulate(state)
    best_actions, best = actions, result
    first_stall = result.stall_data_us
    done = 0
    for _ in range(max(0, rounds)):
        if not result.ok or _move_triggers(state, result, step) == 0:
            break
        done += 1
        actions, result = _simulate(state)
        if _better(result, best):
            best_actions, best = actions, result
    notes = {"feedback_rounds_run": done, "first_stall_data_us": first_stall,
             "stall_data_us": best.stall_data_us}
    return list(best_actions), best, notes


def _ssd_tensors(sim, budget_bytes, swap: bool, recompute: bool, swap_weight: float) -> frozenset:
    """The tensors whose swaps should go to the SSD: plan as if host memory were
    unbounded, then, while its swaps' copies would overflow host memory at some op, move
    the swapped tensor with the longest free time among those holding host space there
    to the SSD."""
    state = State(sim, budget_bytes, swap, recompute, swap_weight, False, None,
                   host_bytes=sum(t.bytes for t in sim.profile.tensors))
    if state.estimate.any_over():
        swap_phase(state)
        hybrid_phase(state)
    capacity = sim.hardware.host.memory_bytes
    use = state.tier_use[HOST].copy()
    spans: dict[str, tuple[float, int, int]] = {}
    for tid, evs in state.evictions.items():
        for (e, c), ev in evs.items():
            if ev.method == SWAP and not ev.reuse_copy:
                ft = free_time(state, tid, e, c)
                if tid not in spans or ft > spans[tid][0]:
                    spans[tid] = (ft, state.held[HOST][tid], state.accesses[tid][-1] + 1)
    order = sorted(spans, key=lambda t: (-spans[t][0], -state.tensors[t].bytes, t))
    chosen = []
    while len(use) and int(use.max()) > capacity:
        worst = int(np.argmax(use))
        pick = next((t for t in order if t not in chosen and spans[t][1] <= worst < spans[t][2]), None)
        if pick is None:
            break
        chosen.append(pick)
        use[spans[pick][1]:spans[pick][2]] -= state.tensors[pick].bytes
    return frozenset(chosen)


def _plan(sim, budget_bytes, swap: bool, recompute: bool, swap_weight: float,
          feedback_rounds: int, feedback_step: float, spill: bool = False) -> tuple[Draft, object, int]:
    """One Capuchin plan: phases 1 and 2, then feedback. Returns the draft, its simulated
    result (None without actions) and how many of its phase-2 choices were unsure."""
    return _plan_tiers(sim, budget_bytes, swap, recompute, swap_weight, feedback_rounds, feedback_step, spill)[:3]


def _plan_tiers(sim, budget_bytes, swap: bool, recompute: bool, swap_weight: float,
                feedback_rounds: int, feedback_step: float, spill: bool) -> tuple[Draft, object, int, bool]:
    """``_plan``, and whether a swap was refused for want of host memory (``spill``: with
    the SSD tier)."""
    ssd_first = _ssd_tensors(sim, budget_bytes, swap, recompute, swap_weight) if spill else None
    state = State(sim, budget_bytes, swap, recompute, swap_weight, spill, ssd_first)
    if state.estimate.any_over():
        swap_phase(state)
        hybrid_phase(state)
    methods = [ev.method for evs in state.evictions.values() for ev in evs.values()]
    unsure = sum(1 for tid, e, c in state.unsure_pairs if (e, c) in state.evictions.get(tid, {}))
    notes = {"swaps": methods.count(SWAP), "recomputes": methods.count(RECOMPUTE), "unsure_choices": unsure,
             "estimate_over_budget_ops": int(state.estimate.over().sum())}
    if SSD in state.tiers:
        notes["ssd_swaps"] = sum(1 for evs in state.evictions.values() for ev in evs.values()
                                 if ev.method == SWAP and ev.tier == SSD)
    if not state.evictions:
        return Draft(notes=notes), None, unsure, state.host_short
    actions, result, feedback = _feedback(state, feedback_rounds, feedback_step)
    notes.update(feedback)
    return Draft(actions=actions, notes=notes), result, unsure, state.host_short


def _judged_plan(sim, budget_bytes, swap: bool, recompute: bool, feedback_rounds: int, feedback_step: float,
                 spill: bool) -> tuple[Draft, object, bool]:
    """Step 7: a plan, and where its estimate was unsure a swap-leaning one, the faster of
    the two by simulation. Returns the draft, its result and whether host memory was short."""
    draft, result, unsure, short = _plan_tiers(sim, budget_bytes, swap, recompute, 1.0,
                                               feedback_rounds, feedback_step, spill)
    if unsure and swap and recompute:
        # the stall estimate was unsure between a swap and a recompute: plan again leaning
        # to swaps, and let the simulator judge
        other, other_result, _ = _plan(sim, budget_bytes, swap, recompute, 1.0 / UNSURE,
                                       feedback_rounds, feedback_step, spill)
        chosen = other is not None and other_result is not None and (result is None or _better(other_result, result))
        if chosen:
            draft, result = other, other_result
        draft.notes["judged_by_simulation"] = "swap-leaning replan" if chosen else "first plan"
    return draft, result, short


@register(
    "capuchin",
    "Capuchin: per tensor, swap where the copy hides in its idle time, else the cheaper of "
    "a swap stall and a recompute (ranked by memory saved per second); prefetch triggers "
    "moved earlier by simulated feedback; swaps spill to the SSD when host memory is full.",
    params=(
        Param("feedback_rounds", 10,
              "simulate-and-adjust rounds moving stalled prefetch triggers earlier (0: none)", low=0, high=1000),
        Param("feedback_step", 0.05,
              "least a stalled trigger moves earlier per round, as a fraction of the iteration", low=0.0, high=1.0),
        Param("recompute", True, "allow recomputation (drop + recompute) as well as swapping"),
        Param("ssd", True, "when host memory runs out, let swaps go to the SSD as well (machines with one; "
                           "a departure from the paper)"),
        Param("swap", True, "allow swapping to host memory"),
    ),
    moves_persistent=False,
    recomputes=True,
    paper="Peng et al., Capuchin: Tensor-based GPU Memory Management for Deep Learning, ASPLOS 2020",
    family="swap + recompute",
)
def plan_capuchin(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, feedback_rounds=10, feedback_step=0.05,
                  recompute=True, ssd=True, swap=True):
    sim = simulator_for(profile, hardware, options)
    draft, result, short = _judged_plan(sim, budget_bytes, swap, recompute, feedback_rounds, feedback_step, False)
    if short and ssd and swap and hardware.ssd is not None:
        # host memory was short: plan again with the SSD tier, and let the simulator judge
        spilled, spilled_result, _ = _judged_plan(sim, budget_bytes, swap, recompute, feedback_rounds,
                                                   feedback_step, True)
        if spilled_result is not None and (result is None or _better(spilled_result, result)):
            spilled.notes["ssd_tier"] = "host memory short: the plan with SSD spills is faster"
            draft = spilled
        else:
            draft.notes["ssd_tier"] = "host memory short: the host-only plan is kept (the SSD plan is not faster)"
    return draft
