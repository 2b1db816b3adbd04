"""What ``fit`` traces, and the on-disk cache of its traces.

A ``TraceSpec`` is everything ``swapplan trace`` is given but the size being searched;
``TraceSpec.at(step)`` the batch and sequence length of one step of the axis. A trace is
made once per size for every family and planner and kept in ``<out>/traces/`` under a
key of everything that changes it (the spec, the size, the hardware's content, the
model's source or config file, the tracer's own source and torch's version), so a rerun
or a resumed run traces nothing it already has, and a changed model file is traced again.
A size that cannot be traced (a context past the model's positions, a step past the
profile format's limits) is cached too, with its one-line reason.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from simulator.errors import InputError, SwapplanError
from simulator.files import write_atomic

TRACES = "traces"
AXES = ("batch", "seq")


@dataclass(frozen=True)
class TraceSpec:
    """The model and how it trains, as ``swapplan trace`` takes them; ``axis`` says which
    of batch and seq grows (by ``step`` per unit), the other stays at ``batch`` / ``seq``
    (None: the model's default)."""
    model: str | None
    hf_config: str | None
    hardware: str
    axis: str = "batch"
    step: int = 1
    batch: int | None = None
    seq: int | None = None
    dtype: str = "fp32"
    amp: str | None = None
    optimizer: str = "adamw"
    cpu_kernels: bool = False
    strategy: str | None = None     # data parallelism over ``world`` GPUs: each size's rank (swapplan shard)
    world: int = 1

    def at(self, units: int) -> tuple[int | None, int | None]:
        """(batch, seq) of ``units`` steps along the axis."""
        if self.axis == "batch":
            return units * self.step, self.seq
        return self.batch, units * self.step

    def size(self, units: int) -> int:
        """The axis's size at ``units`` steps (samples, or tokens of context)."""
        return units * self.step

    @property
    def label(self) -> str:
        return self.model if self.hf_config is None else Path(self.hf_config).stem

    @property
    def ranks(self) -> int:
        """The data-parallel ranks a step's samples are spread over (1: one GPU)."""
        return self.world if self.strategy is not None else 1


@dataclass(frozen=True)
class Traced:
    """A trace at one size: its profile file and digest, or why there is none."""
    units: int
    path: str | None = None
    sha256: str | None = None
    name: str | None = None
    peak_bytes: int | None = None
    optimizer_us: float | None = None     # the optimizer ops' kernel time (for gradient accumulation)
    error: str | None = None


def cache_key(spec: TraceSpec, units: int, fingerprint: str) -> str:
    """The cache's key of ``spec`` at ``units`` (``fingerprint``: ``environment_fingerprint``)."""
    batch, seq = spec.at(units)
    fields = dict(asdict(spec), batch=batch, seq=seq, axis=None, step=None, env=fingerprint)
    if spec.strategy is None:          # one GPU: the keys of caches made before ranks existed
        del fields["strategy"], fields["world"]
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


def environment_fingerprint(spec: TraceSpec) -> str:
    """What else changes a trace: the hardware's content (its roofline times the kernels),
    the model's source file or config file, the tracer's source and torch's version."""
    from importlib import metadata

    from simulator.hardware import load_hardware

    digest = hashlib.sha256()
    hardware = load_hardware(spec.hardware)
    digest.update(json.dumps(asdict(hardware), sort_keys=True, default=str).encode())
    for path in _model_files(spec):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    root = Path(__file__).resolve().parent.parent
    for folder in ("tracer", "shard") if spec.strategy is not None else ("tracer",):
        for path in sorted((root / folder).rglob("*.py")) + sorted((root / folder).rglob("*.json")):
            digest.update(str(path.relative_to(root / "tracer" if folder == "tracer" else root)).encode())
            digest.update(path.read_bytes())
    try:
        digest.update(metadata.version("torch").encode())
    except metadata.PackageNotFoundError:
        pass
    return digest.hexdigest()


def _model_files(spec: TraceSpec) -> list[Path]:
    """The files a model's trace reads besides the tracer: a config, or the module of a
    ``module:callable`` (found without importing it where it is a plain module)."""
    if spec.hf_config is not None:
        from tracer.hf_config import config_path
        return [Path(config_path(spec.hf_config))]
    if spec.model and ":" in spec.model:
        import importlib.util
        import sys
        module = spec.model.partition(":")[0]
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is not None and found.origin and os.path.isfile(found.origin):
            return [Path(found.origin)]
    return []


class TraceCache:
    """``<out>/traces/``: a profile (``<key>.json.gz``) or a failure (``<key>.error``) per
    key, each written atomically, so that a killed run leaves only whole files."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder) / TRACES

    def get(self, key: str, units: int) -> Traced | None:
        error = self.folder / f"{key}.error"
        if error.is_file():
            return Traced(units, error=error.read_text().strip())
        path = self.folder / f"{key}.json.gz"
        meta = self.folder / f"{key}.meta.json"
        if path.is_file() and meta.is_file():
            try:
                data = json.loads(meta.read_text())
                return Traced(units, str(path), data["sha256"], data["name"], data["peak_bytes"],
                              data["optimizer_us"])
            except (ValueError, KeyError, TypeError):
                return None     # a damaged entry is traced again
        return None


def trace_job(spec: TraceSpec, units: int, key: str, folder: str) -> Traced:
    """Trace ``spec`` at ``units`` into the cache (a worker runs this): the cached entry,
    or the trace's one-line error, cached as well. Errors outside the model (a full disk)
    are raised, never cached."""
    from simulator.profile import save_profile
    from tracer.pytorch.trace import trace

    cache = TraceCache(folder)
    cache.folder.mkdir(parents=True, exist_ok=True)
    batch, seq = spec.at(units)
    try:
        profile = trace(spec.model, batch=batch, seq=seq, dtype=spec.dtype, optimizer=spec.optimizer,
                        hardware=spec.hardware, gpu_kernels=not spec.cpu_kernels, amp=spec.amp,
                        hf_config=spec.hf_config)
        if spec.strategy is not None:      # one rank of ``world`` (R56-R58)
            from shard import shard_profile
            profile = shard_profile(profile, spec.strategy, spec.world)
    except SwapplanError as exc:
        reason = exc.problem if isinstance(exc, InputError) else str(exc)
        write_atomic(cache.folder / f"{key}.error", (reason.replace("\n", " ") + "\n").encode())
        return Traced(units, error=reason)
    path = cache.folder / f"{key}.json.gz"
    save_profile(profile, path)
    optimizer_us = sum(op.time_us for op in profile.ops if op.phase == "optimizer")
    meta = {"sha256": profile.sha256, "name": profile.name, "peak_bytes": profile.peak_bytes,
            "optimizer_us": optimizer_us, "batch": batch, "seq": seq}
    write_atomic(cache.folder / f"{key}.meta.json", (json.dumps(meta, sort_keys=True) + "\n").encode())
    return Traced(units, str(path), profile.sha256, profile.name, profile.peak_bytes, optimizer_us)
