"""The interval MILP's values read as moves (``decode``: the chosen intervals, ``Chosen``;
``decode_recomputes`` and the chains they need, ``decode_chains``; ``retarget``: each
prefetch due at the first recompute that reads its tensor), the model's step times and
predicted time, and a simulated plan's copies read off its timeline (``copy_times``,
``fetched_after``: what rows.py's ``Formulation.choices_of_plan`` and refine.py match a
plan's moves by). ``form`` is a rows.py ``Formulation`` (not imported here: rows.py imports
this module).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from simulator.profile import Profile

from .candidates import MS, Candidate, Recompute


def copy_times(profile: Profile, timeline) -> tuple[np.ndarray, np.ndarray, dict, dict]:
    """A simulated plan's ``timeline`` read for its copies: the time each op started (kept
    non-decreasing, so that a search finds the first op started by a time) and ended (inf
    when it did not run), the end of the n-th offload of each tensor ((tensor, n) -> us)
    and the start of its n-th prefetch (grouped copies, R53, are left out)."""
    ended: dict[tuple[str, int], float] = {}
    began: dict[tuple[str, int], float] = {}
    seen: dict[tuple[str, str], int] = {}
    for span in timeline.spans:
        kind = span.args.get("kind")
        if kind in ("offload", "prefetch") and "members" not in span.args:
            n = seen.get((kind, span.args["tensor"]), 0)
            seen[kind, span.args["tensor"]] = n + 1
            if kind == "offload":
                ended[span.args["tensor"], n] = span.end_us
            else:
                began[span.args["tensor"], n] = span.start_us
    ran = {span.name: (span.start_us, span.end_us) for span in timeline.spans if span.track == "compute"}
    spans = [ran.get(op.id, (np.inf, np.inf)) for op in profile.ops]
    return (np.maximum.accumulate([start for start, _ in spans]), np.array([end for _, end in spans]),
            ended, began)


def fetched_after(op_starts: np.ndarray, ends: np.ndarray, copied: float) -> int:
    """The fetch position of a prefetch whose copy started at ``copied`` (R12: its memory
    is taken then): the op before the last one started by then, or that op itself when it
    had ended (the copy started while the next op waited, which ran without it before)."""
    j = int(np.searchsorted(op_starts, copied, side="right")) - 1
    return j if j >= 0 and ends[j] <= copied else j - 1


@dataclass(frozen=True)
class Chosen:
    """A moved interval as the solution has it: off the GPU from op ``release``, its
    prefetch issued after op ``fetch``, done in step ``done`` (the last step the model
    gives some of its copy) and due at ``before``."""
    candidate: Candidate
    release: int
    fetch: int
    done: int
    due: int = -1     # the op its prefetch is due at: the interval's end, or a recompute reading it

    @property
    def before(self) -> int:
        return self.candidate.before if self.due < 0 else self.due


def decode(form, values: np.ndarray) -> list[Chosen]:
    chosen = []
    for k, (c, col) in enumerate(zip(form.cands, form.cols)):
        if values[form.Y(k, c.release[-1])] < 0.5:
            continue
        release = next(r for r in c.release if values[form.Y(k, r)] > 0.5)
        fetch = next(f for f in c.fetch if values[form.Z(k, f)] > 0.5)
        pieces = values[col.v:col.v + len(c.in_pieces)]
        busy = np.flatnonzero(pieces > 1e-6 * max(c.in_us * MS, 1e-9))
        done = c.in_pieces[busy[-1]][1] - 1 if len(busy) else c.before - 1
        chosen.append(Chosen(c, release, fetch, done))
    return chosen


def initial_of(chosen: list[Chosen]) -> dict[str, str]:
    """Where the moved wrap candidates start the iteration (the plan's ``initial``)."""
    return {ch.candidate.tensor: ch.candidate.tier for ch in chosen if ch.candidate.wraps}


def decode_recomputes(form, values: np.ndarray) -> list[Recompute]:
    return [r for k, r in enumerate(form.redo) if values[form.Q + k] > 0.5]


def retarget(profile: Profile, chosen: list[Chosen], redone: list[Recompute],
             chains: list[tuple[int, str]]) -> list[Chosen]:
    """Each moved interval with its prefetch due at the first recompute that reads its
    tensor once it is off the GPU (the model has it back by then), else at its end."""
    reads: dict[str, list[int]] = {}
    for at, tid in [(r.before, r.tensor) for r in redone] + list(chains):
        for src in profile.ops[profile.producer[tid]].inputs:
            reads.setdefault(src, []).append(at)
    due = []
    for ch in chosen:
        c = ch.candidate
        early = [at for at in reads.get(c.tensor, ()) if ch.release <= at < c.before]
        due.append(replace(ch, due=min(early)) if early else ch)
    return due


def decode_chains(redone: list[Recompute]) -> list[tuple[int, str]]:
    """The chain sources the chosen recomputes need regenerated, as (op, tensor): a
    source dropped for a recompute across the op it is read at, recursively (as the
    model's ``W`` rows have it; read from the choices, not from ``W``'s values)."""
    across: dict[str, list[Recompute]] = {}
    for r in redone:
        across.setdefault(r.tensor, []).append(r)
    found: set[tuple[int, str]] = set()
    work = [(r.before, r.sources) for r in redone]
    while work:
        at, sources = work.pop()
        for src in sources:
            for r in across.get(src, ()):
                if r.after < at < r.before and (at, src) not in found:
                    found.add((at, src))
                    work.append((at, r.sources))
    return sorted(found)


def step_times(form, values: np.ndarray) -> np.ndarray:
    """The model's step times, in us."""
    return values[form.T:form.T + form.n] / MS


def same_choices(form, x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two solutions make the same integer choices (moves, releases, fetches,
    recomputes)."""
    integer = np.asarray(form.model.integer, dtype=bool)
    return bool(np.array_equal(np.round(x[integer]), np.round(y[integer])))


def predicted_us(form, values: np.ndarray) -> float:
    return float(values[form.T:form.T + form.n].sum()) / MS
