"""A profile and a machine in the engine's own units, built once and shared by every plan.

``compile_machine`` turns Hardware into integer link capacities (bytes per second),
latencies (picoseconds) and the route of each kind of transfer (R3, R17, R18);
``compile_profile`` turns a Profile into op times in picoseconds, tensor sizes and the
facts every compile of a plan reuses. Both are immutable: the run state lives in
simulator/run/engine.py, a plan's static program in simulator/compile/program.py.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from itertools import accumulate

from ..hardware import Hardware
from ..model.links import Route, routes as machine_routes
from ..profile import Profile, profile_sha256, update_order_pairs
from ..units import us_to_ps
from .sequence import Sequence, build_sequence


@dataclass(frozen=True, slots=True)
class Machine:
    """Hardware as the engine runs it: integer capacities, latencies and routes."""
    name: str
    gpu_bytes: int
    link_capacity: tuple[int, ...]        # bytes per second, indexed by link number
    routes: dict                          # (kind, tier) -> Route; kind offload | prefetch
    half_duplex: bool
    has_ssd: bool
    host_bytes: int
    ssd_bytes: int
    packed: tuple        # simulator/fast/explicit.py: the machine as _fastsim reads it
    cpu: tuple | None = None   # (tflops, mem_gbps, launch_us) of the host CPU (R25), if described
    uvm: "UvmMachine | None" = None   # managed memory (R30-R37)
    codecs: dict = None        # codec name -> hardware.Codec (R40-R42)
    interconnect: object = None   # hardware.Interconnect: a rank's collectives (R57), if described

    def route(self, kind: str, tier: str) -> Route:
        return self.routes[(kind, tier)]


@dataclass(frozen=True, slots=True)
class UvmMachine:
    """The ``uvm`` section in the engine's units (R30, R35): block bytes, the fault
    latency in ps, blocks per fault batch, the backing tier and the host page cache
    (bytes; None without SSD backing), and the SSD's latency in ps for a cache miss."""
    block: int
    fault_latency_ps: int
    batch_blocks: int          # the legacy model's blocks per batch (page = block), else 0 (R31)
    backing: str
    host_cache: int | None
    ssd_latency_ps: int
    page: int = 0              # R30, R31: the fault unit, the big page (bytes), faults per batch,
    big_page: int = 0          # and the prefetcher's threshold (percent)
    batch_faults: int = 1
    threshold: int = 100
    caching: bool = False      # R38: a caching allocator's pool over managed memory
    fault_down: int = 0        # R31: a fault batch's copy rate (bytes/s; 0: the link's), the
    kernel_fault_ps: int = 0   # cost once per item that migrates pages, and per batch of
    first_touch_ps: int = 0    # first-touch faults (new outputs and workspace)
    fault_bulk: int = 0        # R31: the copy rate past an item's first ``fault_ramp`` bytes (0: none)
    fault_ramp: int = 0

    def paging_rates(self, down: int) -> tuple[int, int]:
        """R31: the rates (bytes/s) fault batches copy at over a link of ``down`` bytes/s:
        within the ramp (the slower of ``fault_down`` and the link) and past it (0: none)."""
        return (min(down, self.fault_down) if self.fault_down else down,
                min(down, self.fault_bulk) if self.fault_bulk else 0)


def compile_machine(hardware: Hardware) -> Machine:
    """R17, R18: the machine with its links' capacities and the routes of each kind of
    transfer (simulator/model/links.py ``routes``), packed for the C path too."""
    pcie, ssd = hardware.pcie, hardware.ssd
    half = pcie.duplex == "half"
    capacity, routes = machine_routes(hardware)
    host_bytes, ssd_bytes = hardware.host.memory_bytes, ssd.capacity_bytes if ssd else 0
    uvm = hardware.uvm
    uvm_machine = UvmMachine(uvm.block_bytes, us_to_ps(uvm.fault_latency_us),
                             uvm.legacy_batch_blocks if uvm.legacy_batch_blocks is not None else 0, uvm.backing,
                             uvm.host_cache_bytes,
                             us_to_ps(ssd.latency_us) if ssd else 0, uvm.page_bytes, uvm.big_page_bytes,
                             uvm.fault_batch_faults, uvm.prefetch_threshold, uvm.caching_allocator,
                             round(uvm.fault_gbps * 1e9) if uvm.fault_gbps else 0, us_to_ps(uvm.kernel_fault_us),
                             us_to_ps(uvm.first_touch_us),
                             round(uvm.fault_bulk_gbps * 1e9) if uvm.fault_bulk_gbps else 0,
                             uvm.fault_ramp_bytes if uvm.fault_bulk_gbps else 0)
    return Machine(name=hardware.name, gpu_bytes=hardware.gpu.memory_bytes, link_capacity=tuple(capacity),
                   routes=routes, half_duplex=half, has_ssd=ssd is not None, host_bytes=host_bytes,
                   ssd_bytes=ssd_bytes, packed=_pack_machine(half, host_bytes, ssd_bytes, tuple(capacity), routes),
                   cpu=None if hardware.cpu is None else
                   (hardware.cpu.tflops, hardware.cpu.mem_gbps, hardware.cpu.launch_us), uvm=uvm_machine,
                   codecs={codec.name: codec for codec in hardware.codecs}, interconnect=hardware.interconnect)


def _pack_machine(half: bool, host_bytes: int, ssd_bytes: int, capacity: tuple, routes: dict) -> tuple:
    """(half duplex, host bytes, SSD bytes, link capacities, routes): each route is
    (stream, first link, second link or -1, latency ps, uses the copy engine), in the
    order prefetch host, offload host, prefetch SSD, offload SSD (zeros when absent)."""
    packed = []
    for key in (("prefetch", "host"), ("offload", "host"), ("prefetch", "ssd"), ("offload", "ssd")):
        route = routes.get(key)
        if route is None:
            packed.append((0, 0, -1, 0, 0))
        else:
            links = route.links + (-1,)
            packed.append((route.stream, links[0], links[1], route.latency_ps, int(route.uses_engine)))
    return (int(half), host_bytes, ssd_bytes, capacity, tuple(packed))


@dataclass(frozen=True, slots=True)
class CompiledProfile:
    """A profile in the engine's units (op times in ps, sizes), its default compute
    sequence, the R21 order pairs, and the same facts as flat arrays for the C path."""
    name: str
    op_ps: tuple[int, ...]
    ideal_ps: int
    tensor_bytes: dict                       # tensor id -> bytes
    persistent_ids: tuple[str, ...]          # profile order (R10: placed in this order)
    tensor_ids: tuple[str, ...]
    op_ids: tuple[str, ...]
    tensor_index: dict                       # tensor id -> position
    op_index: dict                           # op id -> position
    order_pairs: tuple[tuple[int, int, int, int], ...]  # R21: (before, after, blamed op, tensor) positions
    default_sequence: Sequence               # the profile's order, no recomputes
    profile_order: array                     # op positions 0..n-1 (the schedule of a plan without one)
    sha256: str                              # of the canonical profile (plans name their profile by it)
    op_starts_us: tuple[float, ...]          # each op's start on the ideal timeline, then its end (planners)
    arrays: tuple                            # simulator/fast/explicit.py: what _fastsim reads
    collectives: dict                        # op position -> Collective (R56): a rank's; {} for one GPU


def compile_profile(profile: Profile) -> CompiledProfile:
    """The compiled form of ``profile``. Compiling costs time linear in the profile (a
    third of a second at 11k ops): build it once, in a ``Simulator``, and hand that on."""
    op_ps = tuple(us_to_ps(op.time_us) for op in profile.ops)
    tensor_index = {t.id: i for i, t in enumerate(profile.tensors)}
    pairs = tuple((a, b, b if b in profile.updaters[tid] else a, tensor_index[tid])
                  for a, b, tid in update_order_pairs(profile))
    return CompiledProfile(
        name=profile.name, op_ps=op_ps, ideal_ps=profile.ideal_ps,
        tensor_bytes={t.id: t.bytes for t in profile.tensors},
        persistent_ids=tuple(t.id for t in profile.tensors if t.persistent),
        tensor_ids=tuple(t.id for t in profile.tensors), op_ids=tuple(op.id for op in profile.ops),
        tensor_index=tensor_index, op_index=profile.op_index, order_pairs=pairs,
        default_sequence=build_sequence(profile, op_ps, [op.id for op in profile.ops], {}),
        profile_order=array("i", range(len(profile.ops))), sha256=profile_sha256(profile),
        op_starts_us=(0.0, *accumulate(op.time_us for op in profile.ops)),
        arrays=_arrays(profile, op_ps, tensor_index, pairs),
        collectives={i: op.collective for i, op in enumerate(profile.ops) if op.collective is not None})


def _arrays(profile: Profile, op_ps, index: dict, pairs) -> tuple:
    """The profile as flat arrays (CSR lists of tensor positions per op)."""
    ops = profile.ops
    return (
        array("q", [t.bytes for t in profile.tensors]),
        bytes(t.persistent for t in profile.tensors),
        array("i", [-1 if profile.producer[t.id] is None else profile.producer[t.id] for t in profile.tensors]),
        array("q", op_ps),
        array("q", [op.workspace_bytes for op in ops]),
        *_csr([[index[t] for t in op.inputs] for op in ops]),
        *_csr([[index[t] for t in op.updates] for op in ops]),
        *_csr([[index[t] for t in dict.fromkeys(op.outputs)] for op in ops]),
        *(array("i", column) for column in (zip(*pairs) if pairs else ((), (), (), ()))),
        array("i", _ranks([t.id for t in profile.tensors])),
        _rerun_extra(profile, index),
    )


def _rerun_extra(profile: Profile, index: dict) -> array:
    """Per tensor, the bytes of the other outputs a recompute's re-run makes (R15), capped
    at 2^62 (a budget is below 2^53, so the cap changes no answer)."""
    extra = array("q", bytes(8 * len(profile.tensors)))
    for op in profile.ops:
        if len(op.outputs) > 1 or op.rerun_outputs is not None:   # else nothing else is made
            for t in op.outputs:
                extra[index[t]] = min(profile.rerun_extra_bytes(t), 1 << 62)
    return extra


def _ranks(ids: list[str]) -> list[int]:
    """Each id's place in sorted order (R10 lists residents by size, then id)."""
    rank = [0] * len(ids)
    for place, i in enumerate(sorted(range(len(ids)), key=ids.__getitem__)):
        rank[i] = place
    return rank


def _csr(rows: list[list[int]]) -> tuple[array, array]:
    offsets, values = array("i", [0]), array("i")
    for row in rows:
        values.extend(row)
        offsets.append(len(values))
    return offsets, values
