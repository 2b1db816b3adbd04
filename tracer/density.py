"""Tensor densities (the fraction of non-zero elements) for a profile: measured on a real
CPU step, or read from a file (docs/tracing.md, "Sparsity").

``measure(...)`` runs one real training step of the traced FX graph (forward, loss,
backward, optimizer) on the CPU with the model's own seeded initial weights, fresh
optimizer state and a seeded synthetic batch (:func:`tracer.pytorch.values.seeded_values`),
node by node in graph order, as :mod:`runtime` runs it (CUDA-only attention through its
CPU emulation; an ``inplace_accumulate`` add in place into its first argument, so that a
gradient's storage holds what the profile says it holds). Each profile tensor is one
storage; its density is the fraction of the storage's elements (in the tensor's dtype)
that are not zero, counted once the last op of the step that writes the storage has run
(its producer, or its last in-place update): the value it holds for the rest of its life.
So an activation is counted as it is saved for the backward (after an in-place ReLU), a
gradient once accumulated, and weights and optimizer state after the optimizer step (the
values the next step starts from; a fresh optimizer's zero moments would say 0). A tensor
that no op writes (the batch, a buffer the step only reads) is counted as it comes in.

- Every dtype is counted the same way: an element is zero when it compares equal to 0
  (``-0.0`` included; NaN is not zero); bool masks count their true elements, index
  tensors their non-zero indices: a zero-value compressor drops zero elements whatever
  their type.
- Densities are rounded to :data:`DIGITS` decimal digits, and the step runs with a fixed
  number of intra-op threads (:data:`DEFAULT_THREADS`, whatever the machine's cores), so
  that the same model, seed and sizes give the same profile bytes (with the same torch
  build and CPU kernels: other kernels, or another thread count, may round a value near
  zero the other way, which can move a density by one in its last digit).
- The step runs at a smaller batch than the profile's (``density_batch``) and, for a
  language model, a shorter sequence (``density_seq``; defaults: :func:`step_sizes`): its
  graph must lower to the same tensors and ops (same ids, kinds, names, dtypes; same op
  names, phases, modules and dataflow), only their sizes differ, else an InputError says
  where they first differ (a default shorter sequence whose graph differs gives way to
  the traced one). The densities of the tensors whose size scales with the batch
  (activations, their gradients, the batch) are per-sample (per-token) statistics, and a
  few samples measure them. A tensor of the same size at both sizes is a sum over the
  batch (a weight's gradient, the optimizer state made from it) or does not depend on it
  (weights, buffers): at a few samples its zeros are not those of the full batch (one
  of VGG-16's classifier gradients is 11% non-zero at batch 2, because few samples
  reach its units), so when the step runs at a smaller size such tensors get no density
  (the simulator takes them as dense); at the traced sizes every tensor gets one.
- Only the graph nodes the counted tensors depend on run (:func:`needed_nodes`): at a
  smaller size, the weight gradients and the optimizer step are left out and the
  optimizer state gets no memory. Every random op up to the last counted tensor runs,
  so each one draws what it draws in the whole step: the counts are those of a run of
  every node.

``read_density_file(path, profile)`` reads a JSON object mapping tensor ids (or unique
tensor names) to densities; ``with_densities(profile, densities)`` returns the profile
with them; ``write_density_file(profile, path)`` writes a profile's densities in that
format.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from simulator.errors import InputError
from simulator.files import read_document, write_atomic
from simulator.profile import Profile

DIGITS = 4           # densities are rounded to this many decimal digits
DEFAULT_BATCH = 4    # the default density batch: min(the profile's batch, this) ...
LM_BATCH = 2         # ... of a language model: min(batch, this) sequences (at batch 1 GPT-2's graph differs)
LM_SEQ = 128         # ... of min(seq, this) tokens (then the traced seq, if the graph differs at this one)
SEED_RANGE = (0, 2**64 - 1)   # the seeds torch.manual_seed takes (a negative one is an alias of one of these)
DEFAULT_THREADS = 2  # intra-op threads of the step: a fixed count, so the same counts on every machine
                     # with the same kernels (a conv's reduction is split by thread count)
LANGUAGE_MODELS = ("causal-lm", "masked-lm")

_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}


# ----------------------------------------------------------------------------- files


def read_density_file(path, profile: Profile) -> dict[str, float]:
    """The densities of a ``--density-file`` for ``profile``: ``{tensor id: density}``
    (:func:`load_density_file`, then :func:`resolve_densities`)."""
    return resolve_densities(load_density_file(path), profile, str(path))


def load_density_file(path) -> dict[str, float]:
    """A ``--density-file``: a JSON object whose keys are tensor ids (or tensor names) and
    whose values are numbers from 0 to 1. Returns it as ``{key: density}``.

    Raises InputError naming the file, the key and the problem: a file that cannot be
    read or is not a JSON object, an empty key, a value that is not a number from 0 to 1.
    """
    file = str(path)
    data = read_document(path, formats=("json",))
    if not isinstance(data, dict):
        raise InputError(file, "", f"expected a JSON object mapping tensor ids (or names) to densities from 0 "
                                   f"to 1, got {_json_type(data)}")
    out = {}
    for key, value in data.items():
        if not key:
            raise InputError(file, repr(key), "expected a tensor id or name, got an empty key")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= 1:
            raise InputError(file, key, f"expected a density (fraction of non-zero elements) from 0 to 1, "
                                        f"got {json.dumps(value) if _plain(value) else repr(value)}")
        out[key] = float(value)
    return out


def resolve_densities(raw: dict[str, float], profile: Profile, file: str) -> dict[str, float]:
    """``{tensor id: density}`` from the keys of a density file: a tensor id of ``profile``,
    or a name that exactly one of its tensors has. InputError (naming ``file`` and the
    key) for an unknown id or name, a name several tensors share, a tensor given twice."""
    by_id = profile.tensor_by_id
    by_name: dict[str, list[str]] = {}
    for t in profile.tensors:
        if t.name:
            by_name.setdefault(t.name, []).append(t.id)
    out: dict[str, float] = {}
    given_as: dict[str, str] = {}
    for key, value in raw.items():
        if key in by_id:
            tid = key
        elif key in by_name:
            ids = by_name[key]
            if len(ids) > 1:
                raise InputError(file, key, f"{len(ids)} tensors of profile {profile.name!r} have this name "
                                            f"({', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''}): use their ids")
            tid = ids[0]
        else:
            raise InputError(file, key, f"profile {profile.name!r} has no tensor with this id or name")
        if tid in out:
            raise InputError(file, key, f"tensor {tid} is given twice (as {given_as[tid]!r} and {key!r})")
        out[tid] = value
        given_as[tid] = key
    return out


def _json_type(value) -> str:
    return {list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(type(value), "a number")


def _plain(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def with_densities(profile: Profile, densities: dict[str, float | None], note: dict | None = None) -> Profile:
    """``profile`` with these tensors' densities set (others keep theirs); ``note``, when
    given, becomes ``source["density"]`` (how the densities were obtained)."""
    tensors = tuple(replace(t, density=densities[t.id]) if t.id in densities else t for t in profile.tensors)
    source = dict(profile.source)
    if note is not None:
        source["density"] = note
    return Profile(name=profile.name, tensors=tensors, ops=profile.ops, source=source, origin=profile.origin)


def density_map(profile: Profile) -> dict[str, float]:
    """``{tensor id: density}`` of the tensors that have one, in profile order."""
    return {t.id: t.density for t in profile.tensors if t.density is not None}


def write_density_file(profile: Profile, path) -> None:
    """Write ``{tensor id: density}`` (the format ``read_density_file`` reads), one entry a line."""
    items = [f"{json.dumps(tid)}: {density!r}" for tid, density in density_map(profile).items()]
    text = "{\n" + ",\n".join(items) + "\n}\n" if items else "{}\n"
    write_atomic(path, text.encode("utf-8"))


def summary(profile: Profile) -> str:
    """One line: how many tensors have a density, and the mean density by kind."""
    by_kind: dict[str, list[float]] = {}
    for t in profile.tensors:
        if t.density is not None:
            by_kind.setdefault(t.kind, []).append(t.density)
    if not by_kind:
        return "no densities"
    count = sum(map(len, by_kind.values()))
    parts = [f"{kind} {sum(v) / len(v):.3f}" for kind, v in sorted(by_kind.items())]
    return f"densities of {count} tensors, mean by kind: {', '.join(parts)}"


# ----------------------------------------------------------------------------- sizes


def step_sizes(kind: str | None, batch: int, seq: int | None, density_batch: int | None = None,
               density_seq: int | None = None) -> tuple[int, list]:
    """The batch of the density step and the sequence lengths (or image sides) to try, in
    order, for a model of this ``kind`` (a registered model's, "causal-lm" for a config,
    None for a user model) traced at ``batch`` and ``seq``: what is given, else
    min(batch, LM_BATCH) sequences of min(seq, LM_SEQ) tokens, then of ``seq`` tokens,
    for a language model, and min(batch, DEFAULT_BATCH) samples at the traced size
    otherwise (an image's statistics depend on its side; a user model's seq may mean
    anything)."""
    lm = kind in LANGUAGE_MODELS
    small_b = density_batch if density_batch is not None else min(batch, LM_BATCH if lm else DEFAULT_BATCH)
    if density_seq is not None or seq is None:
        return small_b, [seq if density_seq is None else density_seq]
    if lm and seq > LM_SEQ:
        return small_b, [LM_SEQ, seq]
    return small_b, [seq]


# ----------------------------------------------------------------------------- structure


def structure_problem(full: tuple[list, list], small: tuple[list, list]) -> str | None:
    """Where the tensors and ops of two lowerings of one model at different sizes differ
    in anything but sizes (bytes, shapes, times, FLOPs, workspace, node identity), or None."""
    (ft, fo), (st, so) = full, small
    if len(ft) != len(st):
        return f"{len(ft)} tensors at full size, {len(st)} at the smaller one"
    if len(fo) != len(so):
        return f"{len(fo)} ops at full size, {len(so)} at the smaller one"
    for a, b in zip(ft, st):
        for key in ("id", "kind", "name", "dtype"):
            if getattr(a, key) != getattr(b, key):
                return f"tensor {a.id}: {key} {getattr(a, key)!r} at full size, {getattr(b, key)!r} at the smaller one"
    for a, b in zip(fo, so):
        for key in ("id", "name", "phase", "module", "inputs", "outputs", "updates"):
            if getattr(a, key) != getattr(b, key):
                return f"op {a.id}: {key} {getattr(a, key)!r} at full size, {getattr(b, key)!r} at the smaller one"
    return None


# ----------------------------------------------------------------------------- measuring


def measure(capture, tensors: list, ops: list, workload, *, optimizer: str = "adamw", amp: str | None = None,
            dtype: str = "fp32", seed: int = 0, threads: int = DEFAULT_THREADS,
            wanted=None) -> dict[str, float | None]:
    """Densities of ``tensors`` (lowered from ``capture`` with node identity:
    ``lower(..., runtime=True)``), from one real step of the captured graph on the CPU.

    ``workload``: the same model, built for a real run (:func:`tracer.models.build` with
    ``device="cpu"``, or on the meta device: materialised) right after
    ``torch.manual_seed(seed)``; its batch is synthetic, from ``seed``. The step runs with
    ``threads`` intra-op threads (a kernel's low bits, and so a value near zero, can
    depend on how many share its work). ``wanted``: the ids of the tensors to count (None:
    all); the step stops once they are counted (the optimizer step, when no tensor it
    writes is wanted, is not run). Returns ``{tensor id: density}`` (None for a tensor not
    wanted, or whose storage the step never held).

    Raises InputError when the graph has an op with no CPU kernel (and no emulation in
    :mod:`tracer.pytorch.cpu_kernels`).
    """
    import torch
    from torch.fx import Interpreter

    from tracer.pytorch import cpu_kernels
    from tracer.pytorch.node_identity import flat_tensors
    from tracer.pytorch.values import seeded_values

    gm = capture.graph_module
    _check_cpu_kernels(gm)
    position = {node.name: k for k, node in enumerate(gm.graph.nodes)}
    by_id = {t.id: t for t in tensors}

    # Where each tensor's storage appears (its node) and when it is counted (after the
    # last graph node of the last op that writes it; at the start if none does).
    wanted = {t.id for t in tensors} if wanted is None else set(wanted)
    last_writer: dict[str, Any] = {}
    inplace: set[str] = set()
    for op in ops:
        if op.fx.rewrite == "inplace_accumulate":
            inplace.update(op.fx.nodes)
        for tid in op.outputs + op.updates:
            last_writer[tid] = op
    appears: dict[str, list] = {}
    counted_at: dict[str, list] = {}
    at_start = []
    for t in tensors:
        if t.id not in wanted:
            continue
        appears.setdefault(t.fx.node, []).append(t)
        op = last_writer.get(t.id)
        if op is None:
            at_start.append(t.id)
        else:
            counted_at.setdefault(max(op.fx.nodes, key=position.__getitem__), []).append(t.id)

    needed = needed_nodes(gm, set(appears) | set(counted_at), inplace)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = seeded_values(capture, workload, optimizer=optimizer, amp=amp, dtype=dtype, seed=seed,
                           optimizer_step=_reads_states(placeholders, capture, needed))

    storages: dict[str, Any] = {}
    found: dict[str, float | None] = {}

    remaining = set(wanted)

    def count(tid: str) -> None:
        storage = storages.pop(tid, None)
        found[tid] = None if storage is None else _density(storage, by_id[tid].dtype)
        remaining.discard(tid)

    class Run(Interpreter):
        extra_traceback = False

        def run_node(self, node):
            if node.op != "placeholder" and node.name not in needed:
                return None   # nothing counted depends on it (a weight's gradient, the optimizer step)
            if node.name in inplace:   # as the profile counts it: in place into the held gradient
                with self._set_current_node(node):
                    args, kwargs = self.fetch_args_kwargs_from_env(node)
                    result = torch.ops.aten.add_.Tensor(args[0], *args[1:], **kwargs)
            else:
                result = super().run_node(node)
            for t in appears.get(node.name, ()):
                flat = flat_tensors(result)
                index = t.fx.output or 0
                if index < len(flat):
                    storages[t.id] = flat[index].untyped_storage()
            if node.op == "placeholder" and node is last_placeholder:
                for tid in at_start:
                    count(tid)
            for tid in counted_at.get(node.name, ()):
                count(tid)
            if not remaining:
                raise _Counted
            return result

    last_placeholder = placeholders[-1] if placeholders else None
    cpu_kernels.install()
    torch.manual_seed(seed)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            Run(gm).run(values.params, values.buffers, values.states, values.batch)
    except _Counted:
        pass
    finally:
        torch.set_num_threads(before)
    for tid in list(storages):   # (never counted: cannot happen for a well-formed profile)
        count(tid)
    return {t.id: found.get(t.id) for t in tensors}


def needed_nodes(gm, terminals, inplace=frozenset()) -> set[str]:
    """The names of the graph nodes that the values of the nodes ``terminals`` depend on:
    their inputs, transitively; every node up to the last terminal that writes in place a
    storage one of those holds (an accumulation, an in-place ReLU; ``inplace``: nodes run
    in place into their first argument); and every random op up to it, so that the RNG
    stream is drawn as in the whole step. A run of these nodes alone gives the terminals
    the values a run of every node gives them (a weight's gradient, the optimizer step,
    are left out when nothing counted depends on them)."""
    from tracer.pytorch.node_identity import is_random

    nodes = list(gm.graph.nodes)
    if not terminals:
        return set()
    by_name = {n.name: n for n in nodes}
    end = max(k for k, n in enumerate(nodes) if n.name in terminals)
    writes: dict[str, set] = {}
    stack = list(terminals)
    for node in nodes[:end + 1]:
        written = _written_storages(node, inplace)
        if written:
            writes[node.name] = written
        if node.op == "call_function" and is_random(node.target):
            stack.append(node.name)
    needed: set[str] = set()
    held: set = set()   # storages of the needed nodes' values
    while stack:
        while stack:
            name = stack.pop()
            if name in needed:
                continue
            needed.add(name)
            node = by_name[name]
            held.update(_storages(node.meta.get("val")))
            stack.extend(n.name for n in node.all_input_nodes)
        stack = [name for name, written in writes.items() if name not in needed and written & held]
    return needed


def _storages(value) -> set:
    """Storage identities of the (fake) tensors in a node's value (the tracer's own
    identity of a tensor: one per storage)."""
    from tracer.pytorch.node_identity import flat_tensors
    return {t.untyped_storage()._cdata for t in flat_tensors(value)}


def _written_storages(node, inplace) -> set:
    """Storage identities of what ``node`` writes in place (its schema's ``(a!)``
    arguments, batch norm's running statistics; its first argument for ``inplace``)."""
    import torch

    from tracer.pytorch.node_identity import node_values, written_args
    if node.op != "call_function":
        return set()
    if node.name in inplace:
        return _storages(node_values(node.args[0]))
    if not isinstance(node.target, torch._ops.OpOverload):
        return set()
    args, kwargs = node_values((node.args, node.kwargs))
    return _storages(written_args(node.target, args, kwargs))


def _reads_states(placeholders: list, capture, needed: set[str]) -> bool:
    """Whether a needed node reads the optimizer state (the graph inputs, ``placeholders``,
    after the parameters and buffers, before the batch)."""
    first = len(capture.params) + len(capture.buffers)
    count = sum(len(s) for s in capture.states)
    return any(node.name in needed for node in placeholders[first:first + count])


def check_seed(seed) -> int:
    """``seed`` when torch takes it as a seed (a whole number in :data:`SEED_RANGE`);
    InputError naming ``density-seed`` and the range otherwise."""
    low, high = SEED_RANGE
    if isinstance(seed, bool) or not isinstance(seed, int) or not low <= seed <= high:
        shown = repr(seed) if not isinstance(seed, int) or abs(seed) < 10**30 else f"{seed:.3e}"
        raise InputError("<argument>", "density-seed", f"must be a whole number from {low} to {high} (2^64 - 1, "
                                                       f"the seeds torch takes), got {shown}")
    return seed


def check_memory(tensors: list, ops: list, batch: int, seq: int | None) -> None:
    """InputError when the real step cannot fit this machine's memory: its no-swap peak
    (the lowered profile's) plus the model's own copy of its weights, against the memory
    available now (Linux ``MemAvailable``; not checked where it cannot be read)."""
    available = _available_memory()
    if available is None:
        return
    profile = Profile(name="density-step", tensors=tuple(tensors), ops=tuple(ops))
    need = profile.peak_bytes + sum(t.bytes for t in tensors if t.kind == "weight")
    if need > available:
        at = f"batch {batch}" + (f", seq {seq}" if seq is not None else "")
        raise InputError("<argument>", "density", f"the real step at {at} needs about {need / 2**30:.1f} GiB of "
                                                  f"memory and {available / 2**30:.1f} GiB are available: measure at "
                                                  "a smaller --density-batch / --density-seq, or give --density-file")


def _available_memory() -> int | None:
    from tracer.hf_config import available_memory
    return available_memory()


class _Counted(Exception):
    """Every wanted tensor is counted: the rest of the step need not run."""


def _check_cpu_kernels(gm) -> None:
    """InputError when an op of the graph has no CPU kernel here (:func:`tracer.pytorch.cpu_kernels.missing`)."""
    from tracer.pytorch import cpu_kernels
    missing = cpu_kernels.missing(gm)
    if missing:
        raise InputError("<argument>", "density", f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} "
                                                  "no CPU kernel: densities cannot be measured here (trace with "
                                                  "--cpu-kernels, or give --density-file)")


def _density(storage, dtype_name: str | None) -> float | None:
    """The fraction of the storage's elements (in ``dtype_name``) that are not zero, rounded."""
    import torch
    nbytes = storage.nbytes()
    if nbytes == 0:
        return None
    dtype = getattr(torch, _DTYPES.get(dtype_name or "", dtype_name or ""), None)
    if not isinstance(dtype, torch.dtype):
        return None
    size = torch.empty(0, dtype=dtype).element_size()
    if nbytes % size:
        return None
    flat = torch.empty(0, dtype=dtype).set_(storage, 0, (nbytes // size,))
    return round(int(torch.count_nonzero(flat)) / flat.numel(), DIGITS)


__all__ = ["DIGITS", "DEFAULT_BATCH", "LM_BATCH", "LM_SEQ", "DEFAULT_THREADS", "SEED_RANGE", "check_seed", "step_sizes", "measure",
           "needed_nodes", "check_memory", "structure_problem",
           "read_density_file", "load_density_file", "resolve_densities", "with_densities", "density_map",
           "write_density_file", "summary"]
