"""Streams, links and routes (R1, R17, R18): how each kind of transfer moves, and how
flows share the links they cross (``fair_rates``).

The one route and link model: the compile turns it into the engine's ``Machine``
(simulator/compile/compiled.py), the run and the executor share bandwidth with
``fair_rates``, and planners estimate copy times with it (``transfer_links``,
``link_speed``) in their own units.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..hardware import Hardware
from ..units import gbps_to_bytes_per_s, us_to_ps

STREAMS = ("h2d", "d2h", "ssd_read", "ssd_write")            # R1: FIFO queues
LINKS = ("pcie_down", "pcie_up", "ssd_read_link", "ssd_write_link")  # R17: shared by bandwidth
H2D, D2H, SSD_READ, SSD_WRITE = range(4)                      # stream numbers
PCIE_DOWN, PCIE_UP, SSD_READ_LINK, SSD_WRITE_LINK = range(4)  # link numbers
COMM_LINKS = ("interconnect", "network")                      # R57: a rank's collectives, after LINKS
INTERCONNECT, NETWORK = 4, 5


@dataclass(frozen=True, slots=True)
class Route:
    """How one kind of transfer moves (R17, R18): the stream it queues on, the links its
    flow crosses, the latency it waits first, and whether it needs the one copy engine
    of a half-duplex machine."""
    stream: int
    links: tuple[int, ...]
    latency_ps: int
    uses_engine: bool


def routes(hardware: Hardware) -> tuple[list[int], dict]:
    """R17, R18: each link's capacity (bytes per second) and each kind of transfer's route,
    keyed (kind, tier). A host copy crosses its PCIe direction; an SSD copy crosses the
    SSD link and the PCIe direction as one flow, after PCIe + SSD latency through host
    memory (the SSD's alone for ``direct``); with half duplex, host copies and host-path
    SSD copies need the one copy engine."""
    pcie, ssd = hardware.pcie, hardware.ssd
    half = pcie.duplex == "half"
    pcie_latency = us_to_ps(pcie.latency_us)
    capacity = [gbps_to_bytes_per_s(pcie.h2d_gbps), gbps_to_bytes_per_s(pcie.d2h_gbps), 1, 1]
    found = {("prefetch", "host"): Route(H2D, (PCIE_DOWN,), pcie_latency, half),
             ("offload", "host"): Route(D2H, (PCIE_UP,), pcie_latency, half)}
    if ssd is not None:
        capacity[SSD_READ_LINK] = gbps_to_bytes_per_s(ssd.read_gbps)
        capacity[SSD_WRITE_LINK] = gbps_to_bytes_per_s(ssd.write_gbps)
        through_host = ssd.path == "host"
        latency = us_to_ps(ssd.latency_us) + (pcie_latency if through_host else 0)
        found[("prefetch", "ssd")] = Route(SSD_READ, (SSD_READ_LINK, PCIE_DOWN), latency, half and through_host)
        found[("offload", "ssd")] = Route(SSD_WRITE, (PCIE_UP, SSD_WRITE_LINK), latency, half and through_host)
        ssd_latency = us_to_ps(ssd.latency_us)   # R26: between SSD and host memory, no PCIe, no copy engine
        found[("load", "ssd")] = Route(SSD_READ, (SSD_READ_LINK,), ssd_latency, False)
        found[("store", "ssd")] = Route(SSD_WRITE, (SSD_WRITE_LINK,), ssd_latency, False)
    return capacity, found


@dataclass(frozen=True, slots=True)
class CollectiveRoute:
    """How a rank's collectives over ``world`` ranks move (R57): the links their flow
    crosses (numbers after ``LINKS``: the interconnect; the network once the ring leaves
    a node; both PCIe directions where the GPUs have no link of their own), the latency
    of one ring step in ps, and the capacities of the two collective links."""
    links: tuple[int, ...]
    step_ps: int
    capacity: tuple[int, int]

    def latency_ps(self, steps: int) -> int:
        return steps * self.step_ps


def collective_route(link, world: int) -> CollectiveRoute:
    """R57: the route of a ring collective over ``world`` ranks on the interconnect
    ``link`` (hardware.Interconnect; the caller has checked it holds ``world`` GPUs)."""
    crosses = (INTERCONNECT,)
    network = 1
    step = link.latency_us
    if world > link.gpus and link.inter_node_gbps is not None:
        crosses += (NETWORK,)
        network = gbps_to_bytes_per_s(link.inter_node_gbps)
        step = max(step, link.inter_node_latency_us or 0.0)
    if link.shares_pcie:
        crosses += (PCIE_UP, PCIE_DOWN)
    return CollectiveRoute(crosses, us_to_ps(step), (gbps_to_bytes_per_s(link.gbps), network))


def collective_us(hardware: Hardware, kind_steps: int, wire_bytes: int, world: int) -> float:
    """A lone collective's time in us (R57), in planners' units: its ring steps' latency,
    then its wire bytes at the slowest link it crosses."""
    route = collective_route(hardware.interconnect, world)
    capacity, _ = routes(hardware)
    rates = [(list(capacity) + list(route.capacity))[link] for link in route.links]
    return route.latency_ps(kind_steps) / 10**6 + wire_bytes / min(rates) * 10**6


def transfer_links(hardware: Hardware, kind: str, tier: str) -> tuple[float, tuple[tuple[str, float], ...], bool]:
    """The simulator's route of a lone offload or prefetch to or from a tier (R17, R18), in
    planners' units: (latency in us, the links it crosses as (name in ``LINKS``, bytes per
    us), whether it holds the one copy engine of a half-duplex machine). The one route
    and link model that planners (g10, the ILPs, the bound) estimate with."""
    capacity, found = routes(hardware)
    route = found[(kind, tier)]
    return (route.latency_ps / 10**6, tuple((LINKS[link], capacity[link] / 10**6) for link in route.links),
            route.uses_engine)


def link_speed(hardware: Hardware, kind: str, tier: str) -> tuple[float, float]:
    """(latency in us, bytes per us) of a lone offload or prefetch to or from a tier: the
    uncontended figures planners estimate with (R17, R18): its slowest link's rate."""
    latency, links, _ = transfer_links(hardware, kind, tier)
    return latency, min(rate for _, rate in links)


def fair_rates(flow_links: list[tuple[int, ...]], capacity: tuple[int, ...]) -> list[int]:
    """R17: each flow's rate (bytes/s) by max-min fairness, by progressive filling.

    With every flow unfrozen and every link's spare equal to its capacity, each round
    takes, over links with unfrozen flows, floor(spare / unfrozen flows on it); the
    least of these is the level; every unfrozen flow of a link at that level gets
    max(level, 1) and is frozen, its rate taken off the spare of each link it crosses.
    """
    rates = [0] * len(flow_links)
    unfrozen = list(range(len(flow_links)))
    spare = list(capacity)
    while unfrozen:
        count = [0] * len(spare)
        for f in unfrozen:
            for link in flow_links[f]:
                count[link] += 1
        floors = {link: spare[link] // n for link, n in enumerate(count) if n}
        level = min(floors.values())
        at_level = {link for link, value in floors.items() if value == level}
        rate = max(level, 1)
        still = []
        for f in unfrozen:
            if at_level.intersection(flow_links[f]):
                rates[f] = rate
                for link in flow_links[f]:
                    spare[link] -= rate
            else:
                still.append(f)
        unfrozen = still
    return rates
