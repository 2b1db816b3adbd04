"""What G10's moves are placed in (planner/swap/g10.py, step 4, and R19): the link time
left at each kernel on each link of the simulator's routes (``LinkTime``, a transfer's
share of it a ``Reservation``) and the host and SSD bytes in use at each kernel
(``TierSpace``).
"""
from __future__ import annotations

import numpy as np

from simulator.model.links import LINKS, transfer_links


class Reservation:
    """Link time one transfer takes from kernels ``lo``.. on ``links``: ``used`` is the
    transfer's own running time in each kernel; a link with scale s gives 1/s of that
    (the transfer uses that share of its bandwidth).

    Built from a read-only view of the link time left when it was placed, with the one
    kernel it uses only in part (``edge``: 0 or -1) set to ``edge_us``; the copy is made
    only when the reservation is taken, as most placements are only priced."""
    __slots__ = ("links", "lo", "_base", "_edge", "_edge_us", "_used")

    def __init__(self, links, lo: int, base: np.ndarray, edge: int | None = None, edge_us: float = 0.0):
        self.links = links
        self.lo = lo
        self._base, self._edge, self._edge_us = base, edge, edge_us
        self._used = base if edge is None else None

    @property
    def used(self) -> np.ndarray:
        if self._used is None:
            used = self._base.copy()
            used[self._edge] = self._edge_us
            self._used = used
        return self._used


class LinkTime:
    """Link time left at each kernel, per link of the simulator's route model (R17, R18:
    ``simulator.model.links.transfer_links``): ``pcie_up``, ``pcie_down``,
    ``ssd_write_link``, ``ssd_read_link``, and on a half-duplex machine the one copy ``engine``.

    A transfer runs at the rate of the slowest link it crosses and uses each link's
    bandwidth in proportion: an SSD copy takes bytes / PCIe bandwidth of PCIe time, not
    its whole (slower) duration, as links are shared by bandwidth (R17 of the rules'
    version 2). The copy engine is held whole while a copy that needs it runs.
    """

    def __init__(self, times: np.ndarray, hardware):
        self.hardware = hardware
        self.half = hardware.pcie.duplex == "half"
        names = LINKS + (("engine",) if self.half else ())
        # one entry per kernel, then the tail after the last kernel (closed until opened)
        self.left = {name: np.append(times.astype(float), 0.0) for name in names}
        self._links: dict = {}
        self._sums: dict = {}   # links -> (_arrays), dropped whenever link time changes

    def open_tail(self) -> None:
        """Let transfers run on after the last kernel (they then lengthen the iteration)."""
        for left in self.left.values():
            left[-1] = np.inf
        self._sums.clear()

    def links(self, direction: str, tier: str) -> tuple[tuple[str, float], ...]:
        """The links a transfer crosses, each with its scale: the link's bandwidth over the
        transfer's rate (1 for the slowest link, and for the copy engine)."""
        key = (direction, tier)
        if key not in self._links:
            self._links[key] = self._route(direction, tier)
        return self._links[key]

    def _route(self, direction: str, tier: str) -> tuple[tuple[str, float], ...]:
        _, links, uses_engine = transfer_links(self.hardware, direction, tier)
        rate = min(bandwidth for _, bandwidth in links)
        return tuple((name, bandwidth / rate) for name, bandwidth in links) + ((("engine", 1.0),) if uses_engine else ())

    def _arrays(self, links) -> tuple[np.ndarray, np.ndarray]:
        """The transfer's own running time the links leave it in each kernel, and its
        running sum from kernel 0 (rebuilt only after link time was taken or given back),
        so that placing a transfer is two binary searches, not a scan."""
        found = self._sums.get(links)
        if found is None:
            (name, scale), *rest = links
            avail = self.left[name] * scale
            for name, scale in rest:
                avail = np.minimum(avail, self.left[name] * scale)
            avail = np.maximum(avail, 0.0)
            avail.setflags(write=False)   # reservations keep views of it
            found = self._sums[links] = (avail, np.concatenate(([0.0], np.cumsum(avail))))
        return found

    def _available(self, links, lo: int, hi: int) -> np.ndarray:
        """The transfer's own running time the links leave it in kernels [lo, hi) (a view)."""
        return self._arrays(links)[0][lo:hi]

    def forward(self, links, lo: int, hi: int, duration: float):
        """Run a transfer from the start of kernel ``lo``, in kernels before ``hi``: over
        the fewest kernels whose link time left covers ``duration``.

        Returns (kernel it ends in, kernel by which half is done, Reservation), or None
        when the link time left in [lo, hi) does not cover ``duration``.
        """
        if hi <= lo:
            return None
        avail, sums = self._arrays(links)
        need = duration * (1 - 1e-12)
        if sums[hi] - sums[lo] < need:
            return None
        end = max(lo, int(sums.searchsorted(sums[lo] + need)) - 1)
        half = max(lo, int(sums.searchsorted(sums[lo] + duration / 2)) - 1)
        return end, half, Reservation(links, lo, avail[lo:end + 1], -1, duration - (sums[end] - sums[lo]))

    def backward(self, links, lo: int, hi: int, duration: float):
        """Place a transfer as late as possible so that it ends by the end of kernel
        ``hi - 1``, using kernels from ``lo`` on.

        Returns (kernel it starts in, kernel from which the last half runs,
        Reservation), or None when [lo, hi) does not have the link time.
        """
        if hi <= lo:
            return None
        avail, sums = self._arrays(links)
        need = duration * (1 - 1e-12)
        if sums[hi] - sums[lo] < need:
            return None
        start = min(hi - 1, int(sums.searchsorted(sums[hi] - need, "right")) - 1)
        half = min(hi - 1, int(sums.searchsorted(sums[hi] - duration / 2, "right")) - 1)
        return start, half, Reservation(links, start, avail[start:hi], 0, duration - (sums[hi] - sums[start + 1]))

    def at_the_use(self, links, lo: int, hi: int, duration: float):
        """A prefetch that cannot be hidden: it starts at kernel ``hi - 1`` (if that is not
        before ``lo``), takes the link time left there, and its use waits for the rest."""
        start = hi - 1
        if start < lo:
            return None
        used = np.minimum(self._available(links, start, hi), duration)
        return start, start, Reservation(links, start, used)

    def right_after(self, links, lo: int, hi: int, duration: float):
        """An eviction that cannot be hidden: it starts at kernel ``lo`` (if that is before
        ``hi``) and takes the link time left there; the tensor counts as gone from ``lo``
        on, and a kernel that needs its memory waits for the rest of the copy.

        Returns (``lo - 1``: the eviction counts as ended before ``lo``, ``lo``, Reservation)."""
        if hi <= lo:
            return None
        used = np.minimum(self._available(links, lo, lo + 1), duration)
        return lo - 1, lo, Reservation(links, lo, used)

    def all_left(self, links, lo: int, hi: int) -> Reservation:
        """Every bit of link time left in [lo, hi) (for a transfer longer than that)."""
        return Reservation(links, lo, self._available(links, lo, hi).copy())

    def take(self, reservation: Reservation | None) -> None:
        if reservation is not None:
            for name, scale in reservation.links:
                seg = self.left[name][reservation.lo:reservation.lo + len(reservation.used)]
                seg -= reservation.used / scale
            self._sums.clear()

    def give_back(self, reservation: Reservation | None) -> None:
        if reservation is not None:
            for name, scale in reservation.links:
                seg = self.left[name][reservation.lo:reservation.lo + len(reservation.used)]
                seg += reservation.used / scale
            self._sums.clear()


class TierSpace:
    """Host and SSD bytes in use at each kernel (R19), with per-tensor space reuse."""

    def __init__(self, n: int, hardware):
        self.capacity = {"host": hardware.host.memory_bytes,
                         "ssd": hardware.ssd.capacity_bytes if hardware.ssd else 0}
        self.used = {tier: np.zeros(n, dtype=np.int64) for tier in self.capacity}
        self.held_from: dict[tuple[str, str], int] = {}
        self.peak = {tier: 0 for tier in self.capacity}   # the most bytes in use at any kernel

    def extra(self, tid: str, tier: str, lo: int, hi: int) -> tuple[int, int]:
        """The kernel range [lo', hi) this tensor would newly hold in the tier."""
        held = self.held_from.get((tid, tier))
        return (lo, hi) if held is None else (lo, min(hi, held))

    def has_room(self, tid: str, tier: str, nbytes: int, lo: int, hi: int) -> bool:
        lo, hi = self.extra(tid, tier, lo, hi)
        if hi <= lo or self.peak[tier] + nbytes <= self.capacity[tier]:
            return True
        return int(self.used[tier][lo:hi].max()) + nbytes <= self.capacity[tier]

    def hold(self, tid: str, tier: str, nbytes: int, lo: int, hi: int) -> None:
        new_lo, new_hi = self.extra(tid, tier, lo, hi)
        if new_hi > new_lo:
            self.used[tier][new_lo:new_hi] += nbytes
            self.peak[tier] = max(self.peak[tier], int(self.used[tier][new_lo:new_hi].max()))
        held = self.held_from.get((tid, tier))
        self.held_from[(tid, tier)] = lo if held is None else min(lo, held)
