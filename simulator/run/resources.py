"""The parts of the simulated machine, each with one job, kept apart from the event loop
(as SimPy keeps its resources apart from its environment): a FIFO stream, the links
shared by max-min fairness (simulator/model/links.py ``fair_rates``), GPU memory, and
the host and SSD tiers.

simulator/run/engine.py drives them in simulated time; the executor can drive the same
rules in real time. All arithmetic is on integers (R3): bytes, picoseconds, bytes/s.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..model.links import fair_rates

PS_PER_S = 10**12


@dataclass(slots=True)
class Flow:
    """The bytes of one transfer moving over its links (R17)."""
    links: tuple[int, ...]
    remaining: int       # bytes still to move, as of ``since``
    rate: int = 0        # bytes per second
    since: int = 0       # ps: when remaining was last brought up to date
    end: int = 0         # ps: when the last byte arrives at this rate


class Links:
    """Running flows and the link capacities they share; rates change only when a flow
    starts or ends (R17)."""

    def __init__(self, capacity: tuple[int, ...]):
        self.capacity = capacity
        self.flows: dict[int, Flow] = {}     # transfer index -> flow, in start order
        self.samples: list[tuple[int, tuple[int, ...]]] | None = None  # (ps, rate per link) when recording

    def start(self, key: int, links: tuple[int, ...], nbytes: int, now: int) -> None:
        self._advance(now)
        self.flows[key] = Flow(links, nbytes, since=now)
        self._share(now)

    def finish(self, keys: list[int], now: int) -> None:
        """End the flows whose last byte arrived at ``now``."""
        self._advance(now)
        for key in keys:
            del self.flows[key]
        self._share(now)

    def next_end(self) -> int | None:
        return min((flow.end for flow in self.flows.values()), default=None)

    def ending_at(self, now: int) -> list[int]:
        return [key for key, flow in self.flows.items() if flow.end == now]

    def _advance(self, now: int) -> None:
        """Bring every flow's remaining bytes up to ``now`` at its current rate."""
        for flow in self.flows.values():
            moved = flow.rate * (now - flow.since) // PS_PER_S
            flow.remaining = max(0, flow.remaining - moved)
            flow.since = now

    def _share(self, now: int) -> None:
        flows = list(self.flows.values())
        rates = fair_rates([flow.links for flow in flows], self.capacity)
        for flow, rate in zip(flows, rates):
            flow.rate = rate
            flow.end = now + -(-flow.remaining * PS_PER_S // rate)
        if self.samples is not None:
            per_link = [0] * len(self.capacity)
            for flow in flows:
                for link in flow.links:
                    per_link[link] += flow.rate
            sample = (now, tuple(per_link))
            if self.samples and self.samples[-1][0] == now:
                self.samples[-1] = sample
            else:
                self.samples.append(sample)


class Stream:
    """A FIFO queue that runs one transfer at a time, like a CUDA stream (R1, R17)."""

    def __init__(self, name: str):
        self.name = name
        self.queue: deque[int] = deque()
        self.running: int | None = None    # the transfer it runs
        self.busy_ps = 0


class Memory:
    """GPU memory counted in bytes (R2, R4): what is resident, the use and its peak."""

    def __init__(self, budget: int, nbytes: dict[str, int]):
        self.budget = budget
        self.nbytes = nbytes
        self.resident: set[str] = set()
        self.used = 0
        self.peak = 0
        self.peak_at = 0
        self.samples: list[tuple[int, int]] | None = None   # (ps, bytes) when recording

    def fits(self, extra: int) -> bool:
        return self.used + extra <= self.budget

    # where memory has address ranges (simulator/run/arena.py), these also find the ranges
    def fits_item(self, k: int, extra: int) -> bool:
        return self.used + extra <= self.budget

    def fits_prefetch(self, transfers: list[int], extra: int) -> bool:
        return self.used + extra <= self.budget

    def fits_start(self, tid: str, extra: int) -> bool:
        return self.used + extra <= self.budget

    def allocate(self, tensors, extra: int, now: int) -> None:
        """R4: the tensors become resident with ``extra`` bytes (a workspace); the peak is
        noted here, after the instant's frees (R9 applies completions first)."""
        for tid in tensors:
            self.resident.add(tid)
            self.used += self.nbytes[tid]
        self.used += extra
        if self.used > self.peak:
            self.peak, self.peak_at = self.used, now
        self._sample(now)

    def release(self, extra: int, now: int) -> None:
        self.used -= extra
        self._sample(now)

    def free(self, tid: str, now: int) -> None:
        """R4: a freed tensor's bytes leave the use at once."""
        if tid in self.resident:
            self.resident.discard(tid)
            self.used -= self.nbytes[tid]
            self._sample(now)

    def largest(self, n: int = 5) -> list[dict]:
        top = sorted(self.resident, key=lambda t: (-self.nbytes[t], t))[:n]
        return [{"tensor": t, "bytes": self.nbytes[t]} for t in top]

    def _sample(self, now: int) -> None:
        if self.samples is not None:
            if self.samples and self.samples[-1][0] == now:
                self.samples[-1] = (now, self.used)
            else:
                self.samples.append((now, self.used))


class Tiers:
    """Host and SSD capacity (R19): a copy holds its space from its offload's start until
    the tensor is dead; a re-offload to the same tier reuses it."""

    def __init__(self, capacity: dict[str, int], nbytes: dict[str, int]):
        self.capacity = capacity
        self.nbytes = nbytes
        self.used = {tier: 0 for tier in capacity}
        self.peak = {tier: 0 for tier in capacity}
        self.held: dict[tuple[str, str], int] = {}    # (tensor, tier) -> bytes its copy holds

    def take(self, tid: str, tier: str, nbytes: int | None = None) -> bool:
        """Hold space for ``tid`` in ``tier`` (``nbytes``: a compressed copy's size, R41);
        False when that exceeds the capacity."""
        if (tid, tier) in self.held:
            return True
        size = self.nbytes[tid] if nbytes is None else nbytes
        self.held[(tid, tier)] = size
        self.used[tier] += size
        self.peak[tier] = max(self.peak[tier], self.used[tier])
        return self.used[tier] <= self.capacity[tier]

    def release_tier(self, tid: str, tier: str) -> None:
        """Free tid's copy in one tier (a store frees the host copy, R26)."""
        size = self.held.pop((tid, tier), None)
        if size is not None:
            self.used[tier] -= size

    def release(self, tid: str) -> None:
        for tier in self.capacity:
            self.release_tier(tid, tier)
