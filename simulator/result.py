"""Result: what one simulation of a plan found (stable field names, docs/simulation.md);
Score: the small summary of one a search ranks plans by (the C fast path returns it
without building a Result)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Span:
    """One busy interval on a track: an op, a recompute or a transfer."""
    track: str          # compute | cpu | h2d | d2h | ssd_read | ssd_write (the streams)
    name: str
    start_us: float
    end_us: float
    args: dict = field(default_factory=dict)


@dataclass
class Timeline:
    """What happened when: busy spans per resource and GPU memory over time."""
    spans: list[Span] = field(default_factory=list)
    memory: list[tuple[float, int]] = field(default_factory=list)  # (time_us, bytes) after each change
    budget_bytes: int = 0
    phases: list[tuple[str, float, float]] = field(default_factory=list)  # (phase, start, end)
    link_rates: list[tuple[float, dict]] = field(default_factory=list)   # (time_us, link -> bytes/s) at each change
    link_capacity: dict = field(default_factory=dict)                     # link -> bytes/s


@dataclass
class Result:
    """The outcome of simulating one plan on one profile and machine.

    ``valid`` is False when the plan breaks a rule (``rule``, ``op``, ``tensor``,
    ``reason`` say which); ``feasible`` is False when a valid plan cannot run in the
    budget (``reason`` names what waits, the bytes needed and free, and the largest
    residents, also in ``blocked``).
    """
    valid: bool = True
    feasible: bool = True
    rule: str | None = None
    op: str | None = None
    tensor: str | None = None
    reason: str | None = None
    budget_bytes: int = 0
    iteration_us: float = 0.0
    ideal_us: float = 0.0
    overhead: float = 0.0
    compute_us: float = 0.0
    recompute_us: float = 0.0
    cpu_us: float = 0.0                               # time the CPU stream was busy (R24-R28)
    codec_us: float = 0.0                             # encode and decode kernels (R41, R42): part of compute_us
    stall_us: float = 0.0
    stall_data_us: float = 0.0
    stall_memory_us: float = 0.0
    stall_fault_us: float = 0.0                       # UVM (R31): waits for fault batches and their write-backs
    tail_us: float = 0.0
    peak_bytes: int = 0
    peak_at_us: float = 0.0
    arena_bytes: int | None = None                    # R50, R51: the arena a runtime needs (None: bytes counted)
    fragmentation: float | None = None                # R51: arena extent / peak live bytes
    reserved_bytes: int | None = None                 # R55: peak bytes the caching allocator reserved (None: not modelled)
    bytes_h2d: int = 0
    bytes_d2h: int = 0
    bytes_ssd_read: int = 0
    bytes_ssd_write: int = 0
    busy_us: dict = field(default_factory=dict)       # stream -> time a transfer ran on it (latency included)
    link_bytes: dict = field(default_factory=dict)    # link -> bytes that crossed it (R18)
    link_utilisation: dict = field(default_factory=dict)  # link -> bytes / (capacity x iteration)
    host_peak_bytes: int = 0
    ssd_peak_bytes: int = 0
    transfers: int = 0
    recomputes: int = 0
    lossy_tensors: list = field(default_factory=list)  # tensors a lossy codec encodes (R40)
    faults: int = 0                                  # UVM (R37): fault batches
    fault_bytes: int = 0                             # UVM: bytes they moved
    evictions: int = 0                               # UVM: blocks evicted (written back or discarded)
    writeback_bytes: int = 0                         # UVM: bytes evictions wrote back
    stall_by_op: dict = field(default_factory=dict)   # op id -> {"data_us", "memory_us"}
    progress: float = 1.0                            # share of the compute sequence that ran (0 if invalid)
    blocked: dict | None = None                      # infeasible: what waits and why
    timeline: Timeline | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.valid and self.feasible

    def to_dict(self) -> dict:
        """The JSON form: every field but the timeline, in a stable order."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "timeline"}
        return data


@dataclass(frozen=True, slots=True)
class Score:
    """How good a plan is, in a form a search can rank.

    ``valid`` False: the plan breaks ``rule`` (at ``op``, on ``tensor``). ``feasible``
    False: it is valid but does not run in the budget; ``over_budget_bytes`` says by
    how much (its peak with no budget, minus the budget), ``op`` where it stopped and
    ``progress`` the share of the compute sequence that ran. Otherwise
    ``iteration_us`` and ``overhead``.
    """
    valid: bool
    feasible: bool
    iteration_us: float
    overhead: float
    peak_bytes: int
    over_budget_bytes: int = 0
    progress: float = 1.0
    rule: str | None = None
    op: str | None = None
    tensor: str | None = None

    @property
    def ok(self) -> bool:
        return self.valid and self.feasible

    def rank(self) -> tuple:
        """Smaller is better: feasible plans by iteration time, then infeasible ones by
        bytes over budget, then invalid ones by how late they break a rule."""
        if self.ok:
            return (0, self.iteration_us)
        if self.valid:
            return (1, self.over_budget_bytes, -self.progress)
        return (2,)
