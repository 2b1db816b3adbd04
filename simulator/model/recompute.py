"""May a tensor be recomputed (R15), and the scratch a recompute holds while it runs.

A recompute re-runs the tensor's producer just before an op. R15 refuses it for a
persistent tensor (no op makes it), when the producer updates a tensor in place (a
re-run would update it twice), when the tensor was updated in place after it was
produced (a re-run would make the value it had before), when an input of the producer
was updated in place between the producer's run and the recompute (a re-run would read
the new value: an optimizer step run early by a reordered schedule), and when the
producer is a collective of a data-parallel rank (R56: it runs on the interconnect). The compile
(simulator/compile/program.py) and every planner that chooses recomputes ask
``recompute_problem``; swapadvisor's C decoder keeps a twin, tested equal to it.
"""
from __future__ import annotations

from ..profile import Profile


def recompute_problem(profile: Profile, tid: str, before: int | None = None, updates=None) -> str | None:
    """R15: None when ``tid`` may be recomputed, else why not (the simulator's reason).

    The updates in place that count are ``updates`` (``(tensor, op id)`` pairs: the
    updates of ``tid`` and of its producer's inputs since the producer ran, in the order
    they ran: what a walk of a reordered schedule knows) or, without them, the profile's:
    those at op positions before ``before`` (a recompute just before that op). With
    neither, every update of ``tid`` counts and none of the inputs': the problems that
    hold wherever the recompute lies after ``tid``'s first update, for a caller that
    checks the inputs where it places the recompute (``recomputable_until`` says where)."""
    tensor = profile.tensor_by_id[tid]
    if tensor.persistent:
        return f"recompute of persistent tensor {tid!r} ({tensor.kind})"
    made_by = profile.producer[tid]
    if made_by is None:
        return f"recompute of {tid!r}: no op produces it"
    op = profile.ops[made_by]
    if op.collective is not None:
        return (f"recompute of {tid!r}: its producer {op.id!r} is a {op.collective.kind} (R56): a collective "
                "is not re-run on the compute stream")
    if op.updates:
        return f"recompute of {tid!r}: its producer {op.id!r} updates {op.updates[0]!r} in place"
    if updates is None:   # the producer updates nothing: the profile's first update in place, if any
        if before is None:
            first = min(profile.updaters[tid], default=len(profile.ops))
            updates = ((tid, profile.ops[first].id),) if first < len(profile.ops) else ()
        else:
            updates = tuple((t, profile.ops[u].id) for u, t in counted_updates(profile, tid, profile.updaters, made_by)
                            if u < before)
    for updated, by in updates:
        if updated == tid:
            return f"recompute of {tid!r}: it was updated in place after it was produced (by op {by!r})"
        return (f"recompute of {tid!r}: its producer {op.id!r} reads {updated!r}, updated in place since by op "
                f"{by!r} (a re-run would read the new value)")
    return None


def counted_updates(profile: Profile, tid: str, updated, made: int) -> list[tuple[int, str]]:
    """The in-place updates R15 counts against a recompute of ``tid`` (its producer updating
    nothing): (when, tensor) of those of ``tid`` and of its producer's inputs after ``made``,
    in order. ``updated`` maps a tensor to when it was updated and ``made`` is when the
    producer ran: op positions (``profile.updaters``), or a walk's items."""
    found = [(k, tid) for k in updated.get(tid, ())]
    for x in dict.fromkeys(profile.ops[profile.producer[tid]].inputs):
        if x != tid:
            found.extend((k, x) for k in updated.get(x, ()) if k > made)
    return sorted(found)


def recomputable_until(profile: Profile, tid: str) -> int:
    """The op position past which R15 refuses a recompute of ``tid``, in profile order
    (for ``before`` after its producer, ``recompute_problem(profile, tid, before)`` is not
    None exactly when ``before > recomputable_until``): -1 for a persistent tensor, its
    producer's position when the producer updates in place or is a collective (R56), else
    the first in-place update of it or of an input of its producer after the producer,
    else the number of ops (never)."""
    made_by = profile.producer[tid]
    if made_by is None or profile.tensor_by_id[tid].persistent:
        return -1
    if profile.ops[made_by].collective is not None:
        return made_by
    if profile.ops[made_by].updates:
        return made_by
    found = counted_updates(profile, tid, profile.updaters, made_by)
    return found[0][0] if found else len(profile.ops)


def recompute_scratch(profile: Profile, tid: str, workspace: int | None = None) -> int:
    """R15: the bytes a recompute of ``tid`` holds beside the tensor while it runs: its
    producer's workspace (``workspace``: the chosen variant's, R52; the profile's when
    None) and the other outputs the re-run makes (``Profile.rerun_extra_bytes``)."""
    if workspace is None:
        workspace = profile.ops[profile.producer[tid]].workspace_bytes
    return workspace + profile.rerun_extra_bytes(tid)


def recompute_reads(profile: Profile, producer: int, before: int, position=None) -> tuple[str, ...]:
    """R15, R60: what a re-run of op ``producer`` just before the op at ``before`` reads:
    its inputs, each gathered copy (an all-gather's output, R56) read as the same output
    of the latest all-gather of the same shards before ``before`` (a data-parallel rank's
    checkpointing re-runs a unit's forward on the parameters its backward gathered).
    Positions are op positions, or ``position[op id]`` in a reordered schedule."""
    inputs = profile.ops[producer].inputs
    twins = profile.gather_twins
    if not twins:
        return inputs
    ops = profile.ops
    reads = []
    for tid in inputs:
        chain = twins.get(tid)
        if chain:
            at = [(i if position is None else position[ops[i].id], twin) for i, twin in chain]
            earlier = [(pos, twin) for pos, twin in at if pos < before]
            if earlier:
                tid = max(earlier)[1]
        reads.append(tid)
    return tuple(reads)
