"""A FIFO copy queue on a plan's ideal timeline (R1, R17), for planners that place copies
one by one and want to know what each costs: when a copy would end, and how much compute
late copies would stall."""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass


@dataclass
class Copy:
    """One copy in a queue."""
    key: tuple            # FIFO order: (op position it is issued after, kind, order taken)
    enqueue_us: float
    duration_us: float
    deadline_us: float    # prefetch: start of its back-access; offload: start of the first freed op


class CopyQueue:
    """A FIFO copy queue on the ideal timeline (R1, R17): copies start in the order they
    are issued, each when it is issued and the one before it has ended.

    Its ``stall`` estimates the compute time lost to late copies (a late prefetch stalls
    its back-access, a late offload the op that needs its memory): within a busy period
    (copies back to back) the compute stream, once delayed, gives the later copies that
    much more time, so a period costs its largest lateness; periods add up.
    """

    def __init__(self) -> None:
        self.copies: list[Copy] = []
        self.keys: list[tuple] = []
        self.ends: list[float] = []
        self.stall = 0.0

    def _update(self) -> None:
        self.ends = []
        self.stall = queue_stall(self.copies, self.ends)

    def end_if_added(self, key: tuple, enqueue_us: float, duration_us: float) -> float:
        """When a copy issued at ``key`` would end (copies after it are not counted)."""
        i = bisect_left(self.keys, key)
        before = self.ends[i - 1] if i > 0 else -math.inf
        return max(enqueue_us, before) + duration_us

    def extra_stall(self, copy: Copy) -> float:
        """How much ``stall`` would grow with the copy added."""
        i = bisect_left(self.keys, copy.key)
        return queue_stall(self.copies[:i] + [copy] + self.copies[i:], None) - self.stall

    def with_copy(self, copy: Copy) -> "CopyQueue":
        """A new queue: this one with the copy added."""
        link = CopyQueue()
        i = bisect_left(self.keys, copy.key)
        link.copies = self.copies[:i] + [copy] + self.copies[i:]
        link.keys = self.keys[:i] + [copy.key] + self.keys[i:]
        link._update()
        return link

    def add(self, copy: Copy) -> None:
        i = bisect_left(self.keys, copy.key)
        self.keys.insert(i, copy.key)
        self.copies.insert(i, copy)
        self._update()

    def remove(self, key: tuple) -> None:
        i = bisect_left(self.keys, key)
        assert self.keys[i] == key
        del self.keys[i]
        del self.copies[i]
        self._update()


def queue_stall(copies: list[Copy], ends: list[float] | None) -> float:
    """The stall estimate of a FIFO queue (see ``CopyQueue``); fills ``ends`` if given."""
    total = period = 0.0
    end = -math.inf
    for copy in copies:
        if copy.enqueue_us > end:       # idle before it: a new busy period
            total += period
            period = 0.0
            end = copy.enqueue_us
        end += copy.duration_us
        if ends is not None:
            ends.append(end)
        period = max(period, end - copy.deadline_us)
    return total + period
