"""The links of the host backend in real time: running copies share them max-min fairly.

The same rule as the simulator (R17), with the same function (``fair_rates``): the
rates are recomputed whenever a flow starts or ends, and every copy thread paces its
real memory copies to the credit its flow has earned at its current rate. Flows start
and end at their due times (see executor/scheduler.py, "Time"), which may be a little
in the past when the thread that reports them woke late; the board shares the links
from those times, never going back before the last change. The board
counts in the profile's bytes and simulated seconds: a flow of ``nbytes`` at ``rate``
bytes/s earns ``rate * elapsed_real / time_scale`` bytes of credit; the copy thread maps
credit to the scaled bytes it actually moves.
"""
from __future__ import annotations

import threading
import time

from simulator.model.links import fair_rates


class _Flow:
    __slots__ = ("links", "total", "credited", "rate", "since")

    def __init__(self, links: tuple[int, ...], total: int, now: float):
        self.links, self.total, self.credited, self.rate, self.since = links, total, 0.0, 0.0, now


class LinkBoard:
    """Flows on links of ``capacity`` bytes/s (unscaled), paced in real time stretched
    by ``time_scale``."""

    def __init__(self, capacity: tuple[int, ...], time_scale: float, clock=time.perf_counter):
        self.capacity = capacity
        self.time_scale = time_scale
        self.clock = clock
        self.cond = threading.Condition()
        self.flows: dict[int, _Flow] = {}
        self._keys = 0
        self.last = 0.0        # the latest time the rates were shared at (they change in order)

    def start(self, links: tuple[int, ...], total: int, at: float) -> int:
        """A flow that began at ``at`` (a due time: possibly a little in the past)."""
        with self.cond:
            at = max(at, self.last)
            self._advance(at)
            key = self._keys
            self._keys += 1
            self.flows[key] = _Flow(links, total, at)
            self._share()
            return key

    def finish(self, key: int) -> float:
        """End a flow whose credit has reached its total; returns when it did (its due
        end), and shares the links from then."""
        with self.cond:
            flow = self.flows[key]
            due = flow.since + (flow.total - flow.credited) / flow.rate if flow.rate > 0 else self.clock()
            at = min(max(due, self.last), self.clock())
            self._advance(at)
            del self.flows[key]
            self._share()
            return due

    def credit(self, key: int) -> float:
        """Bytes (unscaled) the flow may have moved by now."""
        with self.cond:
            flow = self.flows[key]
            return min(flow.total, flow.credited + flow.rate * max(0.0, self.clock() - flow.since))

    def wait(self, key: int, target: float, abort: threading.Event) -> None:
        """Block until the flow's credit reaches ``target`` (or the replay aborts); a
        change of rates wakes every waiter to recompute its deadline."""
        with self.cond:
            while not abort.is_set():
                flow = self.flows[key]
                now = self.clock()
                have = flow.credited + flow.rate * max(0.0, now - flow.since)
                if have >= target:
                    return
                self.cond.wait((target - have) / flow.rate if flow.rate > 0 else 0.01)

    def _advance(self, now: float) -> None:
        for flow in self.flows.values():
            if now > flow.since:
                flow.credited = min(flow.total, flow.credited + flow.rate * (now - flow.since))
                flow.since = now
        self.last = max(self.last, now)

    def _share(self) -> None:
        flows = list(self.flows.values())
        if flows:
            rates = fair_rates([flow.links for flow in flows], self.capacity)
            for flow, rate in zip(flows, rates):
                flow.rate = rate / self.time_scale
        self.cond.notify_all()
