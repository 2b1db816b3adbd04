"""``g10``: G10's smart tensor migration across GPU, host memory and SSD.

Follows Zhang et al., "G10: Enabling An Efficient Unified GPU Memory and Storage
Architecture with Smart Tensor Migrations", MICRO 2023 (its tensor vitality analysis and
smart tensor migration scheduling), as summarised from the paper (its full text was
not available here to check that summary against), so every rule below is the
summary's:

1. Input: every tensor's idle intervals between uses, at kernel granularity
   (``planner.shared.facts.idle_gaps``; times from the ideal timeline).
2. Greedy: repeatedly take the interval of largest benefit = bytes x (time, inside the
   interval's window, during which the estimated GPU memory is over the budget). The
   window runs from the kernel by which half the tensor could be written out to the
   kernel from which the last half would be read back, given the bandwidth left at each
   kernel. Ties: bytes x interval length. It stops when no interval has a benefit left.
3. Destination, the "2.5x rule" (factor ``rule_factor``): the SSD if the interval is
   longer than factor x (SSD latency + system latency + bytes / SSD bandwidth) and the
   SSD has the bandwidth left for the move; else host memory if the interval is longer
   than factor x (system latency + bytes / PCIe bandwidth) and host memory has room;
   else the tensor stays on the GPU for that interval. (Here the two tiers are tried in
   the other order: see the first departure.)
4. Bandwidth: each kernel offers its time on each link to the moves that overlap it.
5. Eviction right after the last use before the interval. Prefetch: the latest start
   whose remaining per-kernel bandwidth covers the transfer, counting back from the use;
   then (one pass after the greedy, in order of use) moved earlier while the estimated
   memory stays below ``eager_limit`` x budget and the eviction has ended.

How the paper's terms map onto this simulator:

- "System latency" (G10's GPU fault / DMA set-up cost, 45 us in its artifact) is the
  hardware's PCIe ``latency_us``, the per-transfer cost the simulator charges (R17).
  "SSD bandwidth" in the rule is the slower of the SSD's read and write bandwidth; "PCIe
  bandwidth" the slower PCIe direction.
- Bandwidth is accounted as link time: kernel k offers ``time_us[k]`` on each of
  ``pcie_up``, ``pcie_down``, ``ssd_write``, ``ssd_read`` (and of the one copy engine on
  a half-duplex machine). A move runs for its lone duration (latency + bytes / the
  slowest link's bandwidth, ``simulator.model.links.link_speed``) and uses each link it
  crosses in proportion to its share of that link's bandwidth, as the simulator shares
  links (R17): an SSD move takes bytes / PCIe bandwidth of PCIe time, which leaves the
  rest of PCIe to host moves. For a host move this is "bandwidth x kernel time".
- "SSD write bandwidth is free" is read as: with the link time left, the eviction ends
  and the prefetch starts inside the interval with the tensor away for at least one
  kernel. Host moves pass the same test; SSD capacity is checked like host capacity (R19:
  space held from the eviction until the tensor dies or the iteration ends, and reused
  when the tensor goes to the same tier again).
- Persistent tensors (weights, optimizer state, inputs) may move (R20 steady state):
  besides their in-iteration intervals, the interval across the iteration boundary (last
  touch to first touch of the next iteration) is a candidate, as in G10's steady-state
  view of training. Taking it starts the tensor in the tier (``initial``), prefetches it
  before its first touch (issued no earlier than the iteration start) and, after its last
  touch, writes it back (an offload) or, if no op updates it, drops it (its copy there is
  still valid, R14); so it ends where it started. An in-iteration interval always
  prefetches the tensor back before its next touch, so a tensor that started on the GPU
  is resident at the end. A persistent tensor no op touches is simply placed in the tier.

Departures (and why):

- Host memory first, and the SSD only for what host memory cannot hold (the 2.5x rule
  still decides which tiers an interval may use). Sending every long interval to the
  SSD first put the forward pass's activations on a link a fifth of PCIe's speed while
  host memory had room: on G10's machine (the preset a100-40gb-128gb-g10, with
  G10's measured kernel times) ResNet-152 b1280 wrote 153 GiB to the SSD with host
  memory at 99.7 of 128 GiB, and its evictions to the SSD that could not end in time
  (42 GiB) made the forward pass wait for memory: 1.105x the ideal; host first, 1.000x.
  Then, when the SSD was used, the spill choice (``spill_choice``): with the chosen moves
  all in host memory, the bytes over its capacity at the worst kernel are a share of
  the tensors that could go to the SSD (by the rule) and are held across a kernel over
  capacity; that share of them, spread in eviction order from the first eviction on
  (then the longest intervals, while any kernel is still over), try the SSD first, and
  the greedy runs again. With the SSD's writes the bottleneck of the forward pass (SENet-
  154 b1024 must put 179 GiB on the SSD before its backward), host memory first left the
  SSD idle until host memory was full (1.274x); spread, the SSD writes from the start
  and reads back through the whole backward pass (1.244x; the bound is 1.234x). The
  longest intervals alone on the SSD are worse (1.401x: their reads all fall at the end
  of the backward pass). The plan the simulator runs faster of the two is kept. This
  replaces the host-only retry (host memory first leaves nothing for it to win back).
- Whole tensors, not pages: memory is freed when an eviction has ended and taken when a
  prefetch starts (R11, R12). The benefit keeps the paper's half-written / half-read
  window, but an interval whose move would not keep the tensor away during any
  over-budget kernel is skipped: here it would free nothing.
- The greedy is evaluated lazily (benefits only fall as memory and link time are used;
  a switch from SSD to host, or link time an advance gives back, can raise one, which is
  then taken at its new value), and a re-evaluated head within 5% of the best benefit
  left is taken at once (``LAZY_TOLERANCE``): an approximate greedy that cuts the
  re-evaluations, and with them planning time on large profiles, at no loss of plan
  quality on the shipped profiles. Placing a transfer is two binary searches in a running
  sum of the link time left (rebuilt only when a move is taken), and the round that lets
  write-backs run past the last kernel re-evaluates only those write-backs: nothing else
  can use that tail. Together: 52 s -> 4.3 s on a 6,157-op transformer (two drafts).
- Fallback (``fallback``, default on; off gives the rules above alone). The paper's
  runtime overlaps the write-back of updated persistent tensors with the next iteration,
  faults in what a prefetch did not bring in time, and stalls a kernel until migrations
  free its memory; its plan is a schedule the runtime may run late. Here the plan must
  fit the budget in the estimate itself: the rules place every move inside the link time
  of the ideal timeline, and where tensors are made faster than the link can write them
  out (the traced profiles' forward passes: on gpt2-b48-s1024 at 50% of the peak, ~39 GiB
  must leave before the logits' backward, while PCIe moves 27 GiB in the ideal time up
  to there) they leave memory over budget; the simulator then finds an op waiting for
  memory that nothing in flight will free (R10). So when the rules leave estimated memory
  over budget, up to three more greedy rounds follow, each only if memory is still over:
  (1) write-backs across the iteration boundary may run after the last kernel (they
  lengthen the iteration: its tail); (2) a prefetch that cannot be hidden may start in the
  kernel before its use, which waits for the rest (a planned stall, like a fault); (3) an
  eviction that cannot be hidden counts as done from the kernel after the last use (also
  a write-back across the boundary): it takes the link time left in that kernel, and a
  kernel that needs the memory waits for the rest of the copy (a planned memory stall;
  the link time it then takes is not booked). In rounds 2 and 3 a move already chosen
  whose transfers the link time placed so that the tensor is still on the GPU in a kernel
  over budget (a late eviction, or a prefetch that lands ahead of the op that needs the
  memory) is a candidate again, to be advanced (eviction at once and/or prefetch at the
  use, same tier), with benefit = bytes x the over-budget time it newly covers.
  The estimate counts a tensor on the GPU from the first kernel after its prefetch is
  issued, and off it no earlier than the first kernel after its eviction is issued; an op
  waiting for memory lets every copy issued before it end, so a plan whose estimate fits
  the budget only ever stalls, it does not deadlock (no counter-example on the shipped
  profiles; before round 3 and the advances, every g10 plan the simulator found
  infeasible on them had its own estimate over budget).
- Timing is the ideal timeline; the plan is not re-planned from simulated times.
- Recomputation (``recompute``, off by default: G10 only migrates). Where a tier cannot
  take what the moves put on it before the ops that need the room (the SSD's writes when
  anything spills there, else PCIe's), each byte over is a stall, while a tensor whose
  producer re-runs in less time per byte than that tier writes one is cheaper recomputed.
  With ``recompute``, the kernel where the tier falls furthest behind the chosen moves is
  found (``tier_shortfall``: the bytes the moves hold in the tier there, less what it can
  write from the iteration start to it on the ideal timeline); the cheapest recomputable
  tensors idle there (planner/shared/regen.py: R15, their producer's inputs still needed
  after the recompute) are dropped after their last use and recomputed before their
  next, as many bytes as that shortfall, and G10's greedy plans the rest around them;
  then more (or fewer) bytes by ``RECOMPUTE_STEP`` while the simulated iteration
  shortens. The fastest simulated draft is kept, so the option never makes a plan
  slower. On G10's machine with G10's kernel times SENet-154 b1024 goes from 1.244x to
  1.042x the ideal (74 tensors, 95 GiB recomputed; G10 reports 1.07x; the swap-only
  bound is 1.234x), with roofline kernel times from 6.75x to 1.60x, and ResNet-152
  b1280 with roofline times from 4.02x to 1.51x; on a100-40gb-pcie4 (host memory only)
  ResNet-152 b512 at 30% of its peak from 5.49 s to 3.47 s (bound 3.39 s). `joint`
  may return this plan (planner/shared/ilp/common.py ``RECOMPUTE_ALSO``). The search is in
  planner/swap/_g10_recompute.py.
"""
from __future__ import annotations

import time
from dataclasses import replace

from simulator.plan import drop, offload, prefetch, recompute

from ..core.api import score, simulator_for
from ..core.lowering import DROP, PREFETCH, Step, issue_order, phase_of
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.facts import held_per_op
from ..shared.regen import Regen
from ._g10_greedy import G10State, Move, choose_moves
from ._g10_intervals import candidate_intervals
from ._g10_recompute import recompute_spills

# The candidates are _g10_intervals.py (steps 1, 3), the link time and tier space
# _g10_links.py (step 4), the greedy and its state _g10_greedy.py (steps 2, 5, the
# fallback rounds); here the plan: its actions, the spill choice, the drafts, the planner.


def to_actions(profile, moves: list[Move], regens: tuple[Regen, ...] = ()) -> tuple[list, dict[str, str]]:
    """Plan actions in issue order (by the op they follow; drops and offloads first, then
    prefetches by the op that needs them), the recomputes of ``regens`` after them (by
    the op they serve, then their producer), and the initial placements."""
    ops = profile.ops
    keyed = [Step(r.after, DROP, r.before, -1, drop(r.tensor, ops[r.after].id))
             for r in regens]
    initial: dict[str, str] = {}
    for move in moves:
        iv = move.interval
        if iv.wraps:
            initial[iv.tensor] = move.tier
        if iv.after is None:
            continue
        fetch_after = move.fetch_start - 1
        evict = drop(iv.tensor, ops[iv.after].id) if move.evicts_by_drop() else \
            offload(iv.tensor, ops[iv.after].id, move.tier)
        keyed.append(Step(iv.after, phase_of(evict), iv.before, iv.order, evict))
        keyed.append(Step(fetch_after, PREFETCH, iv.before, iv.order,
                      prefetch(iv.tensor, ops[fetch_after].id if fetch_after >= 0 else None,
                               ops[iv.before].id, move.tier)))
    redo = [recompute(r.tensor, ops[r.before].id) for r in sorted(regens, key=lambda r: (r.before, r.producer))]
    return issue_order(keyed) + redo, initial


def spill_choice(state: G10State, moves: list[Move]) -> frozenset:
    """The tensors to send to the SSD first: where the moves, all in host memory, would
    hold more than it has (R19: from the eviction until the tensor dies), the tensors of
    the longest idle intervals the SSD rule allows, until what is left fits host memory at
    every kernel. Empty when the SSD is not in play or host memory holds every move."""
    if not state.use_ssd or not moves:
        return frozenset()
    n = state.n
    span: dict[str, list] = {}   # tensor -> [lo, hi, bytes, longest SSD interval, first order]
    for move in moves:
        iv = move.interval
        lo, hi = state.held_range(iv, 0 if iv.after is None else iv.after + 1)
        ssd_us = iv.length_us if "ssd" in state.rule_tiers(iv) else -1.0
        found = span.get(iv.tensor)
        if found is None:
            span[iv.tensor] = [lo, hi, iv.nbytes, ssd_us, iv.order]
        else:
            found[0], found[1] = min(found[0], lo), max(found[1], hi)
            found[3], found[4] = max(found[3], ssd_us), min(found[4], iv.order)
    over = held_per_op(n, [(lo, hi, nbytes) for lo, hi, nbytes, _, _ in span.values()]) - state.space.capacity["host"]
    if over.max() <= 0:
        return frozenset()
    eligible = [(tensor, found) for tensor, found in span.items()
                if found[3] >= 0 and found[1] > found[0] and over[found[0]:found[1]].max() > 0]
    total = sum(found[2] for _, found in eligible)
    share = min(1.0, float(over.max()) / total) if total else 0.0
    chosen = set()
    seen = taken = 0
    for tensor, (lo, hi, nbytes, _, _) in sorted(eligible, key=lambda kv: (kv[1][0], kv[1][4])):
        seen += nbytes
        if taken < share * seen:
            chosen.add(tensor)
            taken += nbytes
            over[lo:hi] -= nbytes
    for tensor, (lo, hi, nbytes, _, _) in sorted(eligible, key=lambda kv: (-kv[1][3], kv[1][4])):
        if over.max() <= 0:
            break
        if tensor not in chosen and over[lo:hi].max() > 0:
            chosen.add(tensor)
            over[lo:hi] -= nbytes
    return frozenset(chosen)


def g10_moves(profile, hardware, budget_bytes: int, rule_factor: float, eager_limit: float,
              use_ssd: bool, fallback: bool, spill: frozenset = frozenset(),
              regens: tuple[Regen, ...] = ()) -> tuple[list[Move], G10State]:
    """G10's greedy (and, with ``fallback``, its three fallback rounds), then eager prefetch.
    ``spill``: the tensors whose moves try the SSD first (``spill_choice``); ``regens``:
    the gaps recomputed instead of moved."""
    state = G10State(profile, hardware, budget_bytes, rule_factor, use_ssd, spill, regens)
    intervals = candidate_intervals(profile, state.starts, regens)
    choose_moves(state, intervals)
    state.over_after_rules = state.estimate.any_over()
    if fallback:
        # the tail only helps write-backs across the iteration boundary: every other
        # interval is where round 1 left it (its link time ends before the last kernel)
        write_backs = [iv for iv in intervals if iv.wraps and iv.updated]
        for widen, candidates in ((state.links.open_tail, write_backs), (state.allow_demand_fetch, intervals),
                                  (state.allow_demand_evict, intervals)):
            if not state.estimate.any_over():
                break
            widen()
            choose_moves(state, candidates)
    moves = list(state.taken.values())
    for move in sorted(moves, key=lambda m: (-1 if m.interval.before is None else m.interval.before,
                                             m.interval.wraps, m.interval.order)):
        state.prefetch_earlier(move, eager_limit * budget_bytes)
    return moves, state


def g10_draft(profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback,
              spill: frozenset = frozenset(), regens: tuple[Regen, ...] = ()) -> tuple[Draft, list[Move], G10State]:
    moves, state = g10_moves(profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback, spill,
                             regens)
    actions, initial = to_actions(profile, moves, regens)
    tiers = {tier: sum(1 for m in moves if m.tier == tier) for tier in ("ssd", "host")}
    notes = {"moves": len(moves), "moves_by_tier": tiers,
             "rules_alone_fit": not state.over_after_rules,
             "estimated_over_budget_us": state.estimate.over_us_at()}
    if spill:
        notes["spilled_tensors"] = len(spill)
    if regens:
        notes["recomputed"] = {"tensors": len(regens), "bytes": sum(r.nbytes for r in regens)}
    return Draft(actions=actions, initial=initial, notes=notes), moves, state


def better_by_simulation(sim, budget_bytes, drafts: list[Draft]) -> Draft:
    """The draft whose plan the simulator runs in the budget fastest (the first on ties)."""
    def rank(draft: Draft):
        result = score(sim, budget_bytes, draft.actions, draft.initial)
        return (not result.ok, result.iteration_us if result.ok else 0.0)
    return min(drafts, key=rank)


RECOMPUTE_SHARE = 0.4   # with a time limit, the recompute pass runs only if the drafts took less than this share


def g10_drafts(profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback,
               regens: tuple[Regen, ...] = ()) -> list[tuple[Draft, list[Move], G10State]]:
    """G10's draft (host memory first) and, when it spills to the SSD, the spread one."""
    first = g10_draft(profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback, regens=regens)
    spill = spill_choice(first[2], first[1]) if first[0].notes["moves_by_tier"]["ssd"] else frozenset()
    if not spill:
        return [first]
    return [first, g10_draft(profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback, spill,
                             regens)]


@register(
    "g10",
    "G10 (MICRO'23): benefit-ordered greedy over idle intervals, to host or SSD by the 2.5x rule "
    "(host memory first, spills to the SSD spread from the first eviction), "
    "with bandwidth-aware latest prefetch made eager under 99% memory.",
    params=(
        Param("ssd", True, "use the SSD tier (when the hardware has one)"),
        Param("rule_factor", 2.5, "an interval must be this many times a move's latency + transfer time",
              low=0.0, high=1e6),
        Param("eager_limit", 0.99, "move prefetches earlier while estimated memory stays below this x budget",
              low=0.0, high=1.0),
        Param("fallback", True, "if G10's rules leave memory over budget: tail write-backs, unhidden "
                                "prefetches and evictions"),
        Param("recompute", False, "where the link cannot move the tensors out in time (the SSD's when it "
                                  "spills there), recompute the cheapest instead (not in the paper)"),
    ),
    moves_persistent=True,
    recompute_param="recompute",
    paper="Zhang et al., G10: Enabling An Efficient Unified GPU Memory and Storage Architecture "
          "with Smart Tensor Migrations, MICRO 2023", family="swap",
)
def plan_g10(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, ssd=True, rule_factor=2.5, eager_limit=0.99,
             fallback=True, recompute=False):
    started = time.perf_counter()
    use_ssd = ssd and hardware.ssd is not None
    args = (profile, hardware, budget_bytes, rule_factor, eager_limit, use_ssd, fallback)
    drafts = g10_drafts(*args)
    if len(drafts) == 1 and not recompute:
        return drafts[0][0]
    sim = simulator_for(profile, hardware, options)
    best = better_by_simulation(sim, budget_bytes, [d[0] for d in reversed(drafts)])
    if recompute and options.past(started, RECOMPUTE_SHARE):   # a run with a time limit: it covers g10 too
        return replace(best, notes={**best.notes, "recompute": f"not tried: G10's drafts took more than "
                                                               f"{RECOMPUTE_SHARE:.0%} of the time limit"})
    if recompute:
        _, moves, state = next(d for d in drafts if d[0] is best)
        best = recompute_spills(sim, budget_bytes, best, state, moves,
                                lambda regens: [d[0] for d in g10_drafts(*args, regens=regens)])
    return best
