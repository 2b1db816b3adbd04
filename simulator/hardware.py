"""Hardware: GPU memory and speed, PCIe links, host memory and the SSD.

Presets live in ``profiles/hardware/*.yaml`` (each cites its sources); a user's
own YAML or JSON file is accepted wherever a preset name is. Bandwidths are GB/s
with GB = 1e9 bytes, latencies microseconds, capacities bytes (rule R3).
"""
from __future__ import annotations

import importlib.resources
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import InputError
from .fields import Reader
from .files import read_document
from .units import MAX_BYTES, MAX_GBPS, MAX_US, gbps_to_bytes_per_s, parse_size

DUPLEX_MODES = ("full", "half")
SSD_PATHS = ("host", "direct")
UVM_BACKINGS = ("host", "ssd")
CODEC_FORMATS = ("zvc", "fp16", "bf16", "int8", "binarize")   # R40
LOSSY_FORMATS = frozenset({"fp16", "bf16", "int8"})
CODEC_PLACES = ("dma", "compute")                              # R41
INTERCONNECT_KINDS = ("nvlink", "pcie")                          # R57: pcie shares the GPU's host link


@dataclass(frozen=True)
class Gpu:
    """The accelerator: memory capacity, peak math rates and HBM bandwidth."""
    model: str
    memory_bytes: int
    fp32_tflops: float
    fp16_tflops: float
    bf16_tflops: float | None
    hbm_gbps: float


@dataclass(frozen=True)
class Pcie:
    """The GPU's host link: effective (measured, not theoretical) copy bandwidths."""
    h2d_gbps: float
    d2h_gbps: float
    duplex: str
    latency_us: float


@dataclass(frozen=True)
class Host:
    """Host DRAM available for offloaded tensors."""
    memory_bytes: int


@dataclass(frozen=True)
class Ssd:
    """An NVMe SSD; ``path`` is ``host`` (staged through DRAM) or ``direct`` (GPUDirect Storage)."""
    model: str
    read_gbps: float
    write_gbps: float
    latency_us: float
    capacity_bytes: int
    path: str


@dataclass(frozen=True)
class Cpu:
    """The host CPU, for ops a plan places there (R25): effective (sustained, not
    datasheet) math rate and DRAM bandwidth, and a fixed cost per op."""
    model: str
    tflops: float
    mem_gbps: float
    launch_us: float


@dataclass(frozen=True)
class Interconnect:
    """How the GPUs of a machine reach each other, for the collectives of a data-parallel
    rank (R57): ``gpus`` per node and ``nodes``; within a node, the bandwidth each GPU
    moves each way in a ring (the bus bandwidth NCCL's tests report, not the link's
    datasheet figure) and the latency of one ring step; across nodes, the same per GPU
    over its share of the network. ``kind`` ``pcie``: no GPU-to-GPU link, so every
    collective also crosses the GPU's PCIe link, up and down, beside host copies."""
    kind: str
    gpus: int
    gbps: float
    latency_us: float
    nodes: int = 1
    inter_node_gbps: float | None = None
    inter_node_latency_us: float | None = None

    @property
    def shares_pcie(self) -> bool:
        return self.kind == "pcie"

    @property
    def world(self) -> int:
        """Every GPU of the machine."""
        return self.gpus * self.nodes

    def ring(self, world: int) -> tuple[float, float]:
        """(GB/s, latency us per step) of a ring over ``world`` ranks: the node's link
        within a node, the slower of it and the network once the ring leaves the node."""
        if world <= self.gpus or self.inter_node_gbps is None:
            return self.gbps, self.latency_us
        return min(self.gbps, self.inter_node_gbps), max(self.latency_us, self.inter_node_latency_us or 0.0)


@dataclass(frozen=True)
class Uvm:
    """How CUDA managed memory behaves, for plans in UVM mode (R30-R37): the driver's
    fault model and the tier behind managed memory. Defaults model the nvidia-uvm driver
    (open-gpu-kernel-modules, kernel-open/nvidia-uvm) on an x86 host:

    - ``block_bytes`` 2 MiB: a VA block (uvm_va_block.c, UVM_VA_BLOCK_SIZE), the unit the
      prefetcher works in and the size of the root chunk the driver evicts
      (uvm_pmm_gpu.c, UVM_CHUNK_SIZE_MAX: eviction picks whole root chunks from an LRU list).
    - ``page_bytes`` 4 KiB: the CPU page size of an x86 host, the granularity at which the
      GPU reports faults and at which the driver tracks residency (PAGE_SIZE).
    - ``big_page_bytes`` 64 KiB: the GPU's big page; the prefetcher grows every faulted
      page to its big page (uvm_perf_prefetch.c, grow_fault_granularity: "Assume big
      pages by default"; UVM_PAGE_SIZE_64K).
    - ``fault_batch_faults`` 256: faults fetched from the GPU fault buffer and serviced
      as one batch (uvm_gpu_replayable_faults.c, module parameter
      uvm_perf_fault_batch_count, default UVM_PERF_FAULT_BATCH_COUNT_DEFAULT 256). G10's
      simulator uses 50 (its PCIe_batch_size_page), a model parameter, not the driver's.
    - ``prefetch_threshold`` 51 (percent): the tree prefetcher migrates a subtree of a VA
      block once more than this share of its pages is resident or faulting
      (uvm_perf_prefetch.c, UVM_PREFETCH_THRESHOLD_DEFAULT 51, the test
      ``counter * 100 > subregion_pages * threshold``); 100 disables prefetching.
    - ``fault_latency_us`` 45: the cost of servicing one batch before its transfer
      (UVMSmart's default of 66,645 cycles at 1.48 GHz; G10's artifact, system_latency_us 45).

    Three costs of demand paging, fit on G10's measured A100 kernels (issue 52,
    benchmarks/uvm_kernels.py; docs/simulation.md's ``uvm`` table gives the sources); the
    first model (``legacy_batch_blocks``) has none of them:

    - ``fault_gbps`` 2.2: the rate at which the first ``fault_ramp`` bytes (256 MiB) of an
      item's fault batches copy (the slower of it and the link; None: the link's), and
      ``fault_bulk_gbps`` 5.0 the rate of the rest (None: ``fault_gbps`` throughout):
      demand paging copies far below the link's rate, faster as a kernel's train grows;
    - ``kernel_fault_us`` 680: once per item whose faults migrate pages, on its first batch;
    - ``first_touch_us`` 140: per batch of first-touch faults (an item's new outputs and
      workspace, zero-filled on the GPU, nothing copied); they run while the kernel
      computes, so the item takes the longer of the two.

    ``legacy_batch_blocks`` is set when a file gives ``fault_batch_blocks`` (the first
    UVM model's knob, still read): then a page and a big page are one block, and a batch
    serves that many blocks, which is exactly the first model (docs/simulation.md R31).

    ``caching_allocator`` (default False): tensors live in a caching allocator's pool of
    managed memory (PyTorch over cudaMallocManaged), so freed blocks stay allocated,
    resident and dirty, and new outputs reuse them (R38). False keeps R30's release at
    the last use, which is what DeepUM's invalidation and a UVM-aware allocator do."""
    block_bytes: int = 2 * 1024 * 1024
    fault_latency_us: float = 45.0
    legacy_batch_blocks: int | None = None
    backing: str = "host"
    host_cache_bytes: int | None = None
    page_bytes: int = 4096
    big_page_bytes: int = 65536
    fault_batch_faults: int = 256
    prefetch_threshold: int = 51
    caching_allocator: bool = False
    fault_gbps: float | None = 2.2
    kernel_fault_us: float = 680.0
    first_touch_us: float = 140.0
    fault_bulk_gbps: float | None = 5.0
    fault_ramp_bytes: int = 256 * 1024 * 1024

    @property
    def fault_batch_blocks(self) -> int:
        """The most blocks one fault batch can move (R31): the legacy knob's value, else
        the blocks its ``fault_batch_faults`` pages can reach plus one (the prefetcher can
        complete the block a batch ends in)."""
        if self.legacy_batch_blocks is not None:
            return self.legacy_batch_blocks
        return -(-self.fault_batch_faults * self.page_bytes // self.block_bytes) + 1

    def to_file_dict(self) -> dict:
        """The section as a hardware file writes it."""
        out = {"block": self.block_bytes, "fault_latency_us": self.fault_latency_us, "backing": self.backing,
               "host_cache": self.host_cache_bytes}
        if self.legacy_batch_blocks is not None:
            out["fault_batch_blocks"] = self.legacy_batch_blocks
        else:
            out.update(page=self.page_bytes, big_page=self.big_page_bytes, fault_batch_faults=self.fault_batch_faults,
                       prefetch_threshold=self.prefetch_threshold)
        if self.caching_allocator:
            out["caching_allocator"] = True
        for key in ("fault_gbps", "kernel_fault_us", "first_touch_us", "fault_bulk_gbps"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.fault_bulk_gbps:
            out["fault_ramp"] = self.fault_ramp_bytes
        return out


DRIVER_UVM = Uvm()   # a ``uvm`` section's defaults: the driver's fault model
# No ``uvm`` section at all: the first model (R31 with fault_batch_blocks 1: a fault
# brings its whole block, one block per batch), so files written for it keep their numbers.
DEFAULT_UVM = Uvm(legacy_batch_blocks=1, page_bytes=DRIVER_UVM.block_bytes, big_page_bytes=DRIVER_UVM.block_bytes,
                  fault_batch_faults=1, prefetch_threshold=100, fault_gbps=None, kernel_fault_us=0.0, first_touch_us=0.0,
                  fault_bulk_gbps=None, fault_ramp_bytes=0)


@dataclass(frozen=True)
class Codec:
    """A named compression or encoding (R40-R42): its ``format`` and where it runs, in
    the copy engine as data moves (``dma``: no time of its own) or as GPU kernels on the
    compute stream (``compute``: encode and decode throughputs over the uncompressed
    bytes)."""
    name: str
    format: str
    where: str
    encode_gbps: float | None = None
    decode_gbps: float | None = None

    @property
    def lossy(self) -> bool:
        return self.format in LOSSY_FORMATS


@dataclass(frozen=True)
class Hardware:
    """One machine as the simulator sees it."""
    name: str
    gpu: Gpu
    pcie: Pcie
    host: Host
    ssd: Ssd | None
    source: str = ""
    cpu: Cpu | None = None
    uvm: Uvm = DEFAULT_UVM
    codecs: tuple[Codec, ...] = ()
    interconnect: Interconnect | None = None

    def codec(self, name: str) -> Codec | None:
        """The codec of that name, or None."""
        for codec in self.codecs:
            if codec.name == name:
                return codec
        return None

    def to_dict(self) -> dict:
        """A JSON-ready dict; sizes in bytes, bandwidths in GB/s. The ``uvm`` section is
        left out when it holds the defaults (as files may leave it out)."""
        data = asdict(self)
        data.pop("source")
        if data["cpu"] is None:
            data.pop("cpu")
        if data["interconnect"] is None:
            data.pop("interconnect")
        else:
            data["interconnect"] = {k: v for k, v in data["interconnect"].items() if v is not None}
        if self.uvm == DEFAULT_UVM:
            data.pop("uvm")
        else:
            data["uvm"] = self.uvm.to_file_dict()
        data.pop("codecs")
        if self.codecs:
            data["codecs"] = {c.name: {k: v for k, v in asdict(c).items() if k != "name" and v is not None}
                              for c in self.codecs}
        return data


def hardware_from_dict(data, file: str = "<hardware>") -> Hardware:
    """Build and validate a Hardware from parsed YAML/JSON.

    Raises InputError naming the field for anything missing, unknown or out of range.
    """
    top = Reader(data, file)
    top.reject_unknown({"name", "description", "gpu", "pcie", "host", "ssd", "cpu", "uvm", "codecs",
                        "interconnect"})
    name = top.string("name")
    top.string("description", default="")

    gpu_r = top.mapping("gpu")
    gpu_r.reject_unknown({"model", "memory", "fp32_tflops", "fp16_tflops", "bf16_tflops", "hbm_gbps"})
    memory = parse_size(gpu_r.get("memory"), gpu_r.path("memory"), file)
    if memory <= 0:
        raise gpu_r.error("memory", "must be > 0")
    bf16 = gpu_r.get("bf16_tflops", None)
    gpu = Gpu(
        model=gpu_r.string("model", default=name),
        memory_bytes=memory,
        fp32_tflops=gpu_r.number("fp32_tflops", positive=True),
        fp16_tflops=gpu_r.number("fp16_tflops", positive=True),
        bf16_tflops=None if bf16 is None else gpu_r.number("bf16_tflops", positive=True),
        hbm_gbps=gpu_r.number("hbm_gbps", positive=True),
    )

    pcie_r = top.mapping("pcie")
    pcie_r.reject_unknown({"h2d_gbps", "d2h_gbps", "duplex", "latency_us"})
    pcie = Pcie(
        h2d_gbps=pcie_r.number("h2d_gbps", positive=True),
        d2h_gbps=pcie_r.number("d2h_gbps", positive=True),
        duplex=pcie_r.string("duplex", default="full", choices=DUPLEX_MODES),
        latency_us=pcie_r.number("latency_us", default=0.0),
    )

    host_r = top.mapping("host")
    host_r.reject_unknown({"memory"})
    host = Host(memory_bytes=parse_size(host_r.get("memory"), host_r.path("memory"), file))

    ssd = None
    if top.get("ssd", None) is not None:
        ssd_r = top.mapping("ssd")
        ssd_r.reject_unknown({"model", "read_gbps", "write_gbps", "latency_us", "capacity", "path"})
        ssd = Ssd(
            model=ssd_r.string("model", default="ssd"),
            read_gbps=ssd_r.number("read_gbps", positive=True),
            write_gbps=ssd_r.number("write_gbps", positive=True),
            latency_us=ssd_r.number("latency_us", default=0.0),
            capacity_bytes=parse_size(ssd_r.get("capacity"), ssd_r.path("capacity"), file),
            path=ssd_r.string("path", default="host", choices=SSD_PATHS),
        )
    cpu = None
    if top.get("cpu", None) is not None:
        cpu_r = top.mapping("cpu")
        cpu_r.reject_unknown({"model", "tflops", "mem_gbps", "launch_us"})
        cpu = Cpu(model=cpu_r.string("model", default="cpu"), tflops=cpu_r.number("tflops", positive=True),
                  mem_gbps=cpu_r.number("mem_gbps", positive=True),
                  launch_us=cpu_r.number("launch_us", default=0.0))
    uvm = DEFAULT_UVM
    if top.get("uvm", None) is not None:
        uvm = _uvm_from(top.mapping("uvm"), file, ssd is not None, host.memory_bytes)
    codecs = _codecs_from(top.mapping("codecs")) if top.get("codecs", None) is not None else ()
    interconnect = _interconnect_from(top.mapping("interconnect")) if top.get("interconnect", None) is not None \
        else None
    hardware = Hardware(name=name, gpu=gpu, pcie=pcie, host=host, ssd=ssd, source=file, cpu=cpu, uvm=uvm,
                        codecs=codecs, interconnect=interconnect)
    check_limits(hardware, file)
    return hardware


def _interconnect_from(r: Reader) -> Interconnect:
    """The ``interconnect`` section (R57): {kind, gpus, gbps, latency_us, nodes (1),
    inter_node_gbps and inter_node_latency_us (both needed when nodes > 1)}."""
    r.reject_unknown({"kind", "gpus", "gbps", "latency_us", "nodes", "inter_node_gbps", "inter_node_latency_us"})

    def count(key: str, default: int | None) -> int:
        value = r.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65536:
            raise r.error(key, f"expected an integer from 1 to 65536, got {value!r}")
        return value

    kind = r.string("kind", choices=INTERCONNECT_KINDS)
    gpus, nodes = count("gpus", None), count("nodes", 1)
    if gpus * nodes > 65536:
        raise r.error("nodes", f"{gpus} GPUs x {nodes} nodes is more than 65536 ranks")
    inter_gbps = inter_latency = None
    if nodes > 1:
        inter_gbps = r.number("inter_node_gbps", positive=True)
        inter_latency = r.number("inter_node_latency_us")
    else:
        for key in ("inter_node_gbps", "inter_node_latency_us"):
            if r.get(key, None) is not None:
                raise r.error(key, "only with nodes > 1")
    return Interconnect(kind, gpus, r.number("gbps", positive=True), r.number("latency_us", default=0.0), nodes,
                        inter_gbps, inter_latency)


def _codecs_from(codecs_r: Reader) -> tuple[Codec, ...]:
    """The ``codecs`` section (R40-R42): name -> {format, where, encode_gbps, decode_gbps};
    compute codecs need both throughputs, dma codecs take none (the copy engine
    compresses at the link's speed)."""
    out = []
    for name in codecs_r.data:
        if not isinstance(name, str) or not name:
            raise codecs_r.error(str(name), "a codec's name must be a non-empty string")
        r = codecs_r.mapping(name)
        r.reject_unknown({"format", "where", "encode_gbps", "decode_gbps"})
        fmt = r.string("format", choices=CODEC_FORMATS)
        where = r.string("where", choices=CODEC_PLACES)
        if where == "compute":
            codec = Codec(name, fmt, where, r.number("encode_gbps", positive=True),
                          r.number("decode_gbps", positive=True))
        else:
            for key in ("encode_gbps", "decode_gbps"):
                if r.get(key, None) is not None:
                    raise r.error(key, "a dma codec runs in the copy engine at the link's speed: no throughput")
            if fmt == "binarize":
                raise r.error("format", "binarize is an on-GPU encoding (R42): where must be compute")
            codec = Codec(name, fmt, where)
        out.append(codec)
    return tuple(out)


def _uvm_from(uvm_r: Reader, file: str, has_ssd: bool, host_bytes: int) -> Uvm:
    """The ``uvm`` section (R30-R35): every field optional, defaults as in Uvm.
    ``fault_batch_blocks`` (the first model's knob) selects the legacy model: a page and a
    big page are one block, a batch serves that many blocks; it cannot be combined with
    ``page``, ``big_page``, ``fault_batch_faults`` or ``prefetch_threshold``."""
    uvm_r.reject_unknown({"block", "fault_latency_us", "fault_batch_blocks", "backing", "host_cache", "page",
                          "big_page", "fault_batch_faults", "prefetch_threshold", "caching_allocator", "fault_gbps",
                          "kernel_fault_us", "first_touch_us", "fault_bulk_gbps", "fault_ramp"})
    block = parse_size(uvm_r.get("block", DEFAULT_UVM.block_bytes), uvm_r.path("block"), file)
    if block <= 0:
        raise uvm_r.error("block", "must be > 0")

    def integer(key: str, default: int, lo: int, hi: int) -> int:
        value = uvm_r.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise uvm_r.error(key, f"expected an integer from {lo} to {hi}, got {value!r}")
        return value

    legacy = None
    page, big = DRIVER_UVM.page_bytes, DRIVER_UVM.big_page_bytes
    faults, threshold = DRIVER_UVM.fault_batch_faults, DRIVER_UVM.prefetch_threshold
    if uvm_r.get("fault_batch_blocks", None) is not None:
        legacy = integer("fault_batch_blocks", 1, 1, 1_000_000)
        for key in ("page", "big_page", "fault_batch_faults", "prefetch_threshold", "fault_gbps", "kernel_fault_us",
                    "first_touch_us", "fault_bulk_gbps", "fault_ramp"):
            if uvm_r.get(key, None) is not None:
                raise uvm_r.error(key, "cannot be combined with fault_batch_blocks (the first UVM model: a batch "
                                       "of whole blocks); use fault_batch_faults")
        page = big = block
        faults, threshold = legacy, 100
    else:
        page = parse_size(uvm_r.get("page", page), uvm_r.path("page"), file)
        big = parse_size(uvm_r.get("big_page", big), uvm_r.path("big_page"), file)
        if page <= 0 or page > block:
            raise uvm_r.error("page", f"must be > 0 and at most the block ({block} bytes)")
        if big < page or big > block or big % page:
            raise uvm_r.error("big_page", f"must be a multiple of the page ({page} bytes) and at most the block "
                                          f"({block} bytes)")
        if block % page or -(-block // page) > 1_000_000:
            raise uvm_r.error("block", f"must be a multiple of the page ({page} bytes), at most 10^6 pages")
        faults = integer("fault_batch_faults", faults, 1, 1_000_000)
        threshold = integer("prefetch_threshold", threshold, 0, 100)
    if legacy is None:
        fault_gbps = uvm_r.number("fault_gbps", default=DRIVER_UVM.fault_gbps, positive=True)
        kernel_fault = uvm_r.number("kernel_fault_us", default=DRIVER_UVM.kernel_fault_us)
        first_touch = uvm_r.number("first_touch_us", default=DRIVER_UVM.first_touch_us)
        bulk = uvm_r.get("fault_bulk_gbps", DRIVER_UVM.fault_bulk_gbps)
        bulk = None if bulk is None else uvm_r.number("fault_bulk_gbps", default=DRIVER_UVM.fault_bulk_gbps,
                                                     positive=True)
        ramp = parse_size(uvm_r.get("fault_ramp", DRIVER_UVM.fault_ramp_bytes), uvm_r.path("fault_ramp"), file)
        if ramp < 0:
            raise uvm_r.error("fault_ramp", "must be >= 0")
    else:
        fault_gbps, kernel_fault, first_touch, bulk, ramp = None, 0.0, 0.0, None, 0
    caching = uvm_r.get("caching_allocator", False)
    if not isinstance(caching, bool):
        raise uvm_r.error("caching_allocator", f"expected true or false, got {caching!r}")
    backing = uvm_r.string("backing", default=DEFAULT_UVM.backing, choices=UVM_BACKINGS)
    if backing == "ssd" and not has_ssd:
        raise uvm_r.error("backing", "ssd backing needs an ssd section")
    cache = uvm_r.get("host_cache", None)
    cache_bytes = None if cache is None else parse_size(cache, uvm_r.path("host_cache"), file)
    if backing == "ssd" and cache_bytes is None:
        raise uvm_r.error("host_cache", "ssd backing needs the size of the host page cache (R35; 0 for none)")
    if cache_bytes is not None and cache_bytes > host_bytes:
        raise uvm_r.error("host_cache", f"the page cache ({cache_bytes} bytes) must fit in host memory "
                                        f"({host_bytes} bytes, R35)")
    return Uvm(block_bytes=block, fault_latency_us=uvm_r.number("fault_latency_us",
                                                                 default=DEFAULT_UVM.fault_latency_us),
               legacy_batch_blocks=legacy, backing=backing, host_cache_bytes=cache_bytes, page_bytes=page,
               big_page_bytes=big, fault_batch_faults=faults, prefetch_threshold=threshold,
               caching_allocator=caching, fault_gbps=fault_gbps, kernel_fault_us=kernel_fault,
               first_touch_us=first_touch, fault_bulk_gbps=bulk, fault_ramp_bytes=ramp)


def check_limits(hardware: Hardware, file: str = "<hardware>") -> None:
    """R23: memories and capacities below 2^53 bytes, latencies below 10^9 us,
    bandwidths above 0 (at least 1 byte/s once rounded to bytes per second, R3) and at
    most 10^6 GB/s. InputError naming the field otherwise."""
    sizes = [("gpu.memory", hardware.gpu.memory_bytes), ("host.memory", hardware.host.memory_bytes)]
    latencies = [("pcie.latency_us", hardware.pcie.latency_us), ("uvm.fault_latency_us", hardware.uvm.fault_latency_us),
                 ("uvm.kernel_fault_us", hardware.uvm.kernel_fault_us), ("uvm.first_touch_us", hardware.uvm.first_touch_us)]
    rates = [("pcie.h2d_gbps", hardware.pcie.h2d_gbps), ("pcie.d2h_gbps", hardware.pcie.d2h_gbps),
             ("gpu.hbm_gbps", hardware.gpu.hbm_gbps)]
    if hardware.uvm.fault_gbps:
        rates.append(("uvm.fault_gbps", hardware.uvm.fault_gbps))
    if hardware.uvm.fault_bulk_gbps:
        rates.append(("uvm.fault_bulk_gbps", hardware.uvm.fault_bulk_gbps))
        sizes.append(("uvm.fault_ramp", hardware.uvm.fault_ramp_bytes))
    if hardware.ssd is not None:
        sizes.append(("ssd.capacity", hardware.ssd.capacity_bytes))
        latencies.append(("ssd.latency_us", hardware.ssd.latency_us))
        rates += [("ssd.read_gbps", hardware.ssd.read_gbps), ("ssd.write_gbps", hardware.ssd.write_gbps)]
    if hardware.cpu is not None:
        latencies.append(("cpu.launch_us", hardware.cpu.launch_us))
        rates += [("cpu.tflops", hardware.cpu.tflops), ("cpu.mem_gbps", hardware.cpu.mem_gbps)]
    if hardware.interconnect is not None:
        link = hardware.interconnect
        latencies.append(("interconnect.latency_us", link.latency_us))
        rates.append(("interconnect.gbps", link.gbps))
        if link.inter_node_gbps is not None:
            latencies.append(("interconnect.inter_node_latency_us", link.inter_node_latency_us))
            rates.append(("interconnect.inter_node_gbps", link.inter_node_gbps))
    for codec in hardware.codecs:
        if codec.where == "compute":
            rates += [(f"codecs.{codec.name}.encode_gbps", codec.encode_gbps),
                      (f"codecs.{codec.name}.decode_gbps", codec.decode_gbps)]
    sizes.append(("uvm.block", hardware.uvm.block_bytes))
    if hardware.uvm.host_cache_bytes is not None:
        sizes.append(("uvm.host_cache", hardware.uvm.host_cache_bytes))
    for where, value in sizes:
        if value >= MAX_BYTES:
            raise InputError(file, where, f"{value} bytes is too large: at most 2^53 - 1 (R23)")
    for where, value in latencies:
        if not 0 <= value < MAX_US:
            raise InputError(file, where, f"must be from 0 to below 10^9 us, got {value} (R23)")
    for where, value in rates:
        if not (0 < value <= MAX_GBPS and gbps_to_bytes_per_s(value) >= 1):
            raise InputError(file, where, f"must be > 0 and at most 10^6 GB/s (and at least "
                                          f"1 byte/s), got {value} (R23)")


MAX_UVM_BLOCKS = 1 << 24        # R30: blocks, and fault batches, of one UVM run's tensors


def uvm_scale(uvm: Uvm, sizes) -> tuple[int, int]:
    """(blocks, fault batches) of tensors of ``sizes`` bytes under ``uvm`` (R30, R31): the
    blocks they are cut into, and the batches that bring each of them in once when every
    page faults (at most ``fault_batch_faults`` faults a batch, each grown to its big page
    while the prefetcher is on): what a UVM run's work and memory grow with, per pass."""
    block, page, faults = uvm.block_bytes, uvm.page_bytes, max(1, uvm.fault_batch_faults)
    grow = uvm.big_page_bytes // page if uvm.prefetch_threshold < 100 else 1

    def batches_of(nbytes: int) -> int:          # one block's batches
        return _ceil(_ceil(_ceil(nbytes, page), grow), faults)

    whole = batches_of(block)
    blocks = batches = 0
    for nbytes in sizes:
        if nbytes > 0:
            n = _ceil(nbytes, block)
            blocks += n
            batches += (n - 1) * whole + batches_of(nbytes - (n - 1) * block)
    return blocks, batches


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def check_uvm_scale(hardware: Hardware, sizes, profile_name: str = "the profile") -> None:
    """R30: a UVM run's cost grows with its blocks and its fault batches, not with its
    bytes: a block or page of a few bytes turns a training step into billions of them (a
    1-byte block: 40 GB of tensors, 4*10^10 blocks, out of memory). At most 2^24 of each
    for the profile's tensors; InputError naming the hardware file and field otherwise."""
    uvm, sizes = hardware.uvm, [n for n in sizes if n > 0]
    blocks, batches = uvm_scale(uvm, sizes)
    file = hardware.source or hardware.name
    if blocks > MAX_UVM_BLOCKS:
        least = 1 << max(12, (_ceil(sum(sizes), MAX_UVM_BLOCKS) - 1).bit_length())
        while sum(_ceil(n, least) for n in sizes) > MAX_UVM_BLOCKS:
            least *= 2
        raise InputError(file, "uvm.block", f"a block of {uvm.block_bytes} bytes cuts {profile_name}'s tensors "
                                            f"into {blocks:,} blocks, more than a UVM run allows (2^24, R30); use "
                                            f"a block of at least {least} bytes (the driver's is 2MiB)")
    if batches > MAX_UVM_BLOCKS:
        raise InputError(file, "uvm.page", f"{uvm.page_bytes}-byte pages, {uvm.fault_batch_faults} faults a batch: "
                                           f"{batches:,} fault batches to bring {profile_name}'s tensors in once, "
                                           "more than a UVM run allows (2^24, R30); use larger pages or big pages, "
                                           "or more fault_batch_faults (the driver's: 4KiB, 64KiB, 256)")


def preset_dir() -> Path:
    """The folder of shipped hardware presets."""
    return Path(str(importlib.resources.files("profiles") / "hardware"))


def preset_names() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(p.stem for p in preset_dir().glob("*.yaml"))


def load_hardware(spec: str | Path) -> Hardware:
    """Load a preset by name, or a user's hardware file (YAML or JSON) by path.

    Raises InputError for an unknown name, a missing file or an invalid field.
    """
    text = str(spec)
    path = Path(text)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists():
        return hardware_from_dict(read_document(path), text)
    preset = preset_dir() / f"{text}.yaml"
    if preset.is_file():
        return hardware_from_dict(read_document(preset), str(preset))
    raise InputError("<argument>", "hardware",
                     f"unknown preset {text!r} (presets: {', '.join(preset_names())}; or give a .yaml file)")


def load_presets() -> list[Hardware]:
    """Every shipped preset, sorted by name."""
    return [load_hardware(name) for name in preset_names()]
