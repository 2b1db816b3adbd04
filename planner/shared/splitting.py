"""Which ops to split (R54) when an op's working set alone is over the budget.

No plan that runs an op whole can go below that op's working set (its inputs, outputs
and workspace). When such an op is marked splittable, running it in k chunks leaves
whole only what it cannot slice; its big tensors are sliced when their producer and
every reader run in k chunks too, so those ops are split with it (the chain a chunked
cross-entropy runs: logits, log-softmax, loss and their gradients, row block by row
block). ``choose_splits`` picks the ops and the smallest k (a power of two up to their
``max_chunks``) at which what the chunks hold at once fits the budget and is within 5% of
the budget of what any k reaches (each chunk costs a launch, and past that point more
chunks save nothing); when no k lets them hold it all, the smallest k whose chunks' own
working sets are within 5% of the budget of the least, a plan then moving slices between
chunks (smaller slices move more easily: VGG-16 b1024 at 30%, capuchin 2.01x at k = 2,
1.49x at k = 32). Only a k at which the split profile's floor fits is taken.

Where some op must be split, ``split_deeper`` may split more: the ops whose working sets
are over a half, then a quarter, of the budget, taken where that lowers the most general
lower bound (planner/shared/bound.py) by ``DEEPER_GAIN`` at least. A big op run whole
fills the budget with its own tensors, so the next one's input cannot come in while it
runs (VGG-16 b1024 at 30%: a ReLU gradient holds 18.4 of the 21.7 GiB, and the 6.6 GB
input of the convolution after it then lands 274 ms late); in chunks, its slices leave as
it goes. There the bound falls from 7.687 s to 7.466 s, and swapadvisor's plan from 8.098 s
to 7.379 s.
"""
from __future__ import annotations

from simulator.hardware import Hardware
from simulator.model.splits import chunk_ids, split_profile
from simulator.profile import Profile

from .bound import lower_bound
from .facts import budget_floor, working_set

MARGIN = 0.05   # of the budget: more chunks than needed to come this close to the best are not taken
DEEPER = (0.5, 0.25)   # split_deeper: the ops over these shares of the budget, tried in turn
DEEPER_GAIN = 1e-3     # a deeper split is taken where it lowers the bound by this share at least


def choose_splits(profile: Profile, budget_bytes: int, moves_persistent: bool = False,
                  cpu_phases: tuple[str, ...] = (), variants: bool = False,
                  over: list[int] | None = None) -> dict[str, int]:
    """{op id: chunks} that bring every op whose working set is over ``budget_bytes``
    within it by splitting (the module docstring); {} when none is over, or when one that
    is over is not splittable or stays over at any k. ``over``: split these ops (their
    positions) instead, as when a plan that runs them whole stops at one."""
    base = 0 if moves_persistent else profile.persistent_bytes
    if over is None:
        over = [i for i, op in enumerate(profile.ops) if op.phase not in cpu_phases and
                base + working_set(profile, i, include_persistent=moves_persistent, variants=variants) > budget_bytes]
    if not over:
        return {}
    group = _group(profile, over)
    if group is None:
        return {}
    most = min(profile.ops[i].split.max_chunks for i in group)
    ids = [profile.ops[i].id for i in group]
    held, floors = {}, {}   # per k: what the chunks hold at once; one chunk's largest working set (where the floor fits)
    k = 2
    while k <= most:
        splits = {op_id: k for op_id in ids}
        split = split_profile(profile, splits)
        held[k] = base + _chunk_need(split, splits, moves_persistent)
        if budget_floor(split, moves_persistent, cpu_phases, variants=variants)[0] <= budget_bytes:
            floors[k] = base + _chunk_floor(split, splits, moves_persistent, variants)
        k *= 2
    for needs in (held, floors):   # chunks that fit whole, else chunks whose slices a plan may move between them
        fit = {k: need for k, need in needs.items() if need <= budget_bytes and k in floors}
        if fit:
            least = min(fit.values())
            chosen = min(k for k, need in fit.items() if need <= least + MARGIN * budget_bytes)
            return {op_id: chosen for op_id in ids}
    return {}


def split_deeper(profile: Profile, hardware: Hardware, budget_bytes: int, splits: dict[str, int],
                 moves_persistent: bool = False, cpu_phases: tuple[str, ...] = (),
                 variants: bool = False) -> dict[str, int]:
    """``splits`` (the ops that must be split), or a deeper split where one lowers the
    most general lower bound (the module docstring): the ops whose working sets are over
    each share of ``DEEPER`` of the budget, split by ``choose_splits``, the one of least
    bound, taken when that is ``DEEPER_GAIN`` below the bound with ``splits``."""
    def bound(chosen: dict[str, int]) -> float:
        return lower_bound(split_profile(profile, chosen), hardware, budget_bytes, recompute=True,
                           moves_persistent=True, variants=variants).iteration_us

    if not splits:
        return splits
    base = 0 if moves_persistent else profile.persistent_bytes
    sets = [base + working_set(profile, i, include_persistent=moves_persistent, variants=variants)
            for i in range(len(profile.ops))]
    tried = []
    for share in DEEPER:
        over = [i for i, op in enumerate(profile.ops) if op.phase not in cpu_phases and sets[i] > share * budget_bytes]
        deeper = choose_splits(profile, budget_bytes, moves_persistent, cpu_phases, variants=variants, over=over)
        if deeper and deeper != splits and set(splits) <= set(deeper) and deeper not in tried:
            tried.append(deeper)
    if not tried:   # nothing deeper to weigh: no bound to compute
        return splits
    best, best_us = splits, bound(splits)
    least = best_us * (1.0 - DEEPER_GAIN)
    for deeper in tried:
        us = bound(deeper)
        if us < least and us < best_us:
            best, best_us = deeper, us
    return best


def _group(profile: Profile, over: list[int]) -> list[int] | None:
    """The ops over the budget with the producers and readers of their non-persistent
    tensors, when all of those are splittable (then the tensors are sliced); an op over
    the budget that is not splittable: None. A tensor whose producer or a reader is not
    splittable stays whole, and its ops are not added for it."""
    group = set()
    for i in over:
        op = profile.ops[i]
        if op.split is None:
            return None
        group.add(i)
        for tid in dict.fromkeys(op.inputs + op.outputs):
            tensor = profile.tensor_by_id[tid]
            made = profile.producer.get(tid)
            if tensor.persistent or made is None:
                continue
            family = [made, *profile.consumers.get(tid, ()), *profile.updaters.get(tid, ())]
            if all(profile.ops[q].split is not None for q in family):
                group.update(family)
    return sorted(group)


def _chunk_positions(split: Profile, splits: dict[str, int]) -> list[int]:
    """Where the chunks of the split ops stand in the split profile."""
    index = split.op_index
    return sorted(index[cid] for cid in chunk_ids(splits))


def _chunk_floor(split: Profile, splits: dict[str, int], moves_persistent: bool, variants: bool) -> int:
    """The largest working set of one chunk of the split ops: what must be on the GPU while
    it runs, whatever moves between chunks."""
    return max(working_set(split, i, include_persistent=moves_persistent, variants=variants)
               for i in _chunk_positions(split, splits))


def _chunk_need(split: Profile, splits: dict[str, int], moves_persistent: bool) -> int:
    """The most bytes the chunks of the split ops hold at once: at each chunk, what it
    touches (its working set) and the slices of the same ops' tensors live around it
    (those not yet freed, those already made), which a plan would otherwise have to move
    out between one chunk and the next."""
    chunks = _chunk_positions(split, splits)
    tensors = split.tensor_by_id
    touched = {t for i in chunks for op in (split.ops[i],) for t in op.inputs + op.outputs + op.updates
               if not tensors[t].persistent}
    spans = {t: split.lifetime(t) for t in touched}
    best = 0
    for i in chunks:
        live = sum(tensors[t].bytes for t, (first, last) in spans.items() if first <= i <= last)
        need = live + split.ops[i].workspace_bytes
        if moves_persistent:
            op = split.ops[i]
            need += sum(tensors[t].bytes for t in dict.fromkeys(op.inputs + op.updates) if tensors[t].persistent)
        best = max(best, need)
    return best
