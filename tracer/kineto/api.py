"""Import a PyTorch profiler (Kineto) trace, optionally with an Execution Trace, as a Profile.

``import_kineto(trace_path, et_path=None, iteration=None, name=None)`` turns one training
iteration measured on a GPU into a ``swapplan-profile/1`` with **measured** kernel times.
Only the standard library is used; torch is not needed.

What is modelled
----------------
- **Iteration.** The ``ProfilerStep#N`` span named by ``iteration``; without one, the last
  step that launched GPU work (and, when the trace has a backward pass, contains some of
  it: a trailing step closed by the profiler's stop is usually empty or cut short). A
  trace with no ``ProfilerStep#`` spans is one iteration as a whole (``iteration`` must
  then be left out).
- **Ops.** The top-level CPU operators (``cat`` ``cpu_op``, old ``Operator``) that start
  in the iteration, every thread merged in time order (the backward pass runs on the
  autograd thread). Nesting is time containment on the same (pid, tid): an operator that
  starts inside another's span is its child. Annotations (``user_annotation``,
  ``ProfilerStep#``, ``Optimizer.*``, ``## ... ##``) are not operators: they only set
  the window and the phases.
- **Op time** is the summed duration of the GPU kernels, memcpys and memsets launched on
  the op's behalf. A GPU event is mapped by ``correlation`` -> the ``cuda_runtime`` launch
  with that correlation -> the top-level operator enclosing the launch on its thread; only
  when the trace has no launch event for it, by ``External id`` (old: ``external id``) ->
  the operator with that id. (The launch is the reliable link: the VGG13 trace of
  PyTorch 2.1 carries the correlation in its kernels' ``External id``.) GPU events that
  map to no operator are left out and counted in ``source``.
- **Ops dropped.** A top-level operator that launched no GPU work and allocated no device
  memory (views, CPU scalar work such as Adam's step counters, ``AccumulateGrad`` that
  steals its gradient) is dropped: it takes no GPU time and holds nothing. An operator
  with allocations but no kernels is kept with time 0.
- **Ops split at kernel launches** (``split``, default on). A kept op that launched
  several GPU events, all through launch events, with a memory event between its first
  launch and its last (a compiled region, a cuDNN call with a workspace) becomes one op
  per GPU event, in launch order, named ``<op>/<kernel>``, timed by the event. On the
  CPU clock, an allocation made after launch j-1 and up to launch j is produced by piece
  j; a free from launch j up to launch j+1 ends the lifetime at piece j (before the first
  launch: at the op before). Piece j then holds what is allocated at launch j; its
  workspace is the most the trace holds since launch j-1 beyond that. Buffers the op
  allocates are inputs of its later pieces while allocated (kind ``other`` if the op
  frees them too); the ET's reads of the op are reads of each piece while allocated.
- **Phases.** ``backward``: ops on the autograd thread (a thread whose first op is an
  ``autograd::engine::evaluate_function: ...``) or named like a backward node
  (``autograd::engine::evaluate_function: ...``, ``...Backward0``); ``optimizer``: ops
  inside an ``Optimizer.step#...`` span on their thread; ``other``: ops inside
  ``Optimizer.zero_grad#...`` and main-thread ops after the backward pass began;
  ``forward``: the remaining main-thread ops (before the backward).
- **Tensors and lifetimes** come from the ``[memory]`` events of the GPU that ran the
  kernels. An allocation is paired with the next free of the same ``Addr`` on that
  device, in time order, over the whole trace (addresses are reused). Traces without
  ``Addr`` pair a free with the most recent open allocation of the same size: which
  buffer is freed is then a guess, but the bytes resident at every moment are exact.
  An allocation is produced by the top-level op on the same thread whose span contains
  it (the innermost operator names the tensor); one made outside every operator is given
  to the next kept op. A tensor's last use is the last kept op that starts at or before
  its free; frees are never attributed by span. Tensor bytes are the allocator's block
  sizes, as the trace reports them (rounded up, sometimes by up to 1 MiB when a cached
  block is not split): what the GPU really holds.
- **Workspace.** An allocation whose free falls before the next op starts (producer = last
  use) is a temporary, not a tensor: the op's ``workspace_bytes`` is the peak of the
  running sum of its temporaries.
- **Cut lifetimes.** A free with no allocation in the window (a buffer from before it,
  e.g. the last iteration's gradients freed by ``zero_grad``) is left out; an allocation
  never freed in the window (the new gradients, kept for the next iteration) lives to the
  last op. In steady state these are the same buffers of two successive iterations, so
  each is counted once.
- **Kinds** of window tensors follow the producing op's phase: forward -> activation,
  backward -> gradient, otherwise other.
- **Before the window** (without an ET, and when the trace has ``Total Allocated``): the
  bytes allocated before the window's first ``[memory]`` event (``trace_baseline_bytes``)
  are split by when the window frees them. Those it never frees (weights, optimizer
  state, the batch) are one persistent tensor ``pre_window`` of kind ``input``; those it
  frees while an op runs (e.g. the last iteration's gradients freed by ``zero_grad``) are
  one tensor ``pre_window_freed`` (kind other), output of the first op and held to the
  op of the last such free; those freed before the first op starts are held during no op
  and left out. ``source.memory.pre_window_tensor`` says so, with the bytes. No op uses
  ``pre_window`` (without an ET nobody knows which op reads what).

With an Execution Trace (``et_path``)
-------------------------------------
- ET nodes are joined to Kineto operators by ``rf_id`` = ``Record function id`` when
  both files carry it, else by name and order per thread (a longest-matching-blocks
  alignment), checked by ``seq_id`` = ``Sequence number``. Schemas 1.0.1 (``parent``,
  flat inputs) and 1.0.2+/1.1.x (``ctrl_deps``, ``{values, shapes, types}``, ``attrs``)
  are read. The ET must be of the same process and iteration: fewer than 90 % of the kept
  ops matched, or more than 5 % of the joined pairs with different sequence numbers, is
  an error.
- Each kept op reads the CUDA storages its ET subtree takes as arguments, and updates
  those passed to a mutable schema argument (``Tensor(a!)``). A storage the subtree
  first meets as an output binds to the op's next unclaimed allocation of a fitting size
  (storage ids of schema 1.0.1 are keyed by address, so a later reference resolves to the
  allocation live at that address).
- Storages read but never created in the window are the **persistent** tensors (bytes:
  the extent rounded up to 512 B): updated by the optimizer and read in the forward pass
  -> ``weight``; touched by the optimizer only -> ``optimizer_state``; otherwise
  (the batch, labels, frozen parameters) -> ``input``.
- Lifetimes stay the measured ones: when a tensor is freed after its last ET read, the op
  that frees it lists it as an input too (the profile format expresses a lifetime only
  through uses); ``source.execution_trace.retention_uses`` counts these.

What is approximated, and why
-----------------------------
- Op time is summed kernel time: launch gaps, CPU stalls and overlap between streams are
  not in it (the planner models the GPU's busy time).
- Memory is op-granular: within op i the profile holds everything live at any moment of
  it plus its workspace peak, so the no-swap peak can exceed the trace's by what an op
  frees before it allocates. Split ops hold exactly the trace's peak over each kernel's
  interval (but for an op's tail after its last launch).
- Without an ET there is no dataflow except those lifetime uses, and the persistent
  state is one opaque tensor, ``pre_window``: weights, optimizer state and the batch were
  allocated before the window and are invisible to the ``[memory]`` events but for their
  sum. A planner cannot move part of it, and one that moves persistent tensors may move
  it whole at no cost, as no op reads it.
- FLOPs and modules are not imported.

Checking against the trace
--------------------------
``source.memory`` keeps what the allocator reported in the window: ``trace_baseline_bytes``
(``Total Allocated`` before its first event: everything allocated earlier, i.e. weights,
optimizer state, the batch, the last iteration's gradients) and ``trace_peak_bytes``
(the largest ``Total Allocated``). Without an ET the profile's no-swap peak is
``trace_peak_bytes`` up to op granularity: on the VGG13 trace exactly 39,343,881,216 B
(kept whole: 39,343,883,264 B, 2 KB above). ``peak_fidelity`` sets the two side by side. With one, ``peak_bytes - persistent_bytes`` holds exactly
the window's allocations, op by op, and exceeds ``trace_peak_bytes -
trace_baseline_bytes`` (what the iteration added at its worst moment) by the pre-window
buffers freed before that moment: the trace nets those frees out of its growth, the
window's own allocations do not. That is not double counting: in steady state those are
the last iteration's copies of buffers the window allocates again (on the VGG13 trace,
0.53 GB of gradients: 36.30 GB against 35.77 GB; kept whole, op granularity adds 2 KB).

The result is deterministic (same files, same profile, byte for byte) and validated by
``profile_from_dict``. Every malformed or mismatched input raises ``InputError(file,
where, problem)``. ``source.origin`` names the public origin and licence of traces it
recognises by their sha256 (the VGG13 files of sarchlab/triosim, MIT).

Modules of tracer/kineto/, one step each: ``read`` (the trace's events, nested by thread),
``iteration`` (the window and its ops), ``memory`` (allocations paired with frees,
lifetimes, workspaces), ``et`` (the Execution Trace and its join), ``split`` (ops split at
kernel launches), ``assemble`` (the profile's data); this module runs them in turn.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from simulator.errors import InputError
from simulator.files import read_document
from simulator.profile import Profile, profile_from_dict

from .assemble import assemble
from .et import dataflow, read_et
from .iteration import build_iteration
from .read import read_trace, show
from .split import split_at_kernels

__all__ = ["import_kineto", "peak_fidelity", "PeakFidelity"]


def import_kineto(trace_path, et_path=None, iteration=None, name=None, split=True) -> Profile:
    """Build a validated Profile from a Kineto trace (``.json`` / ``.json.gz``).

    ``et_path``: an Execution Trace of the same run (dataflow, persistent tensors).
    ``iteration``: the ``N`` of ``ProfilerStep#N`` (default: the last complete one).
    ``name``: the profile's name (default: the trace file's name without extensions).
    ``split``: split ops with several kernels and memory events between their launches
    into one op per kernel (default); False keeps every top-level op whole.
    Raises InputError(file, where, problem) for every malformed or mismatched input.
    """
    for label, path in (("trace_path", trace_path), ("et_path", et_path)):
        if not (isinstance(path, (str, os.PathLike)) or (path is None and label == "et_path")):
            raise InputError("<argument>", label, f"expected a file path, got {show(path)}")
    file = str(trace_path)
    step = _check_iteration(iteration)
    if name is not None and (not isinstance(name, str) or not name):
        raise InputError("<argument>", "name", "expected a non-empty string")
    if not isinstance(split, bool):
        raise InputError("<argument>", "split", f"expected True or False, got {show(split)}")
    trace_data = read_document(trace_path, formats=("json",))
    et_data = read_document(et_path, formats=("json",)) if et_path is not None else None
    try:
        trace = read_trace(trace_data, file)
        et = read_et(et_data, str(et_path)) if et_path is not None else None
        if not trace.memory and et is None:
            raise InputError(file, "traceEvents", "no CUDA [memory] events (recorded with "
                                                  "torch.profiler.profile(profile_memory=True)) and no "
                                                  "--et: the profile would hold no tensors, nothing to plan")
        chosen = build_iteration(trace, step)
        flow = dataflow(chosen, et, trace) if et is not None else None
        if split:
            split_at_kernels(chosen, flow)
        data = assemble(chosen, flow, trace, trace_path, et_path, name)
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError,
            OverflowError, RecursionError) as exc:  # a safety net for shapes not foreseen
        problem = " ".join(f"cannot import ({type(exc).__name__}: {exc})".split())
        raise InputError(file, "", problem[:300]) from None
    return profile_from_dict(data, file)


def _check_iteration(iteration) -> int | None:
    if iteration is None:
        return None
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise InputError("<argument>", "iteration",
                         f"expected a whole number >= 0, got {iteration!r}")
    return iteration


@dataclass(frozen=True)
class PeakFidelity:
    """A trace's own memory peak beside the no-swap peak of the profile imported from it."""
    trace_peak_bytes: int | None      # the largest Total Allocated in the window (None: not in the trace)
    imported_peak_bytes: int          # the profile's no-swap peak
    ops: int                          # the profile's ops
    split_ops: int                    # top-level ops split into kernel ops
    profile: Profile

    @property
    def error(self) -> float | None:
        """imported / trace - 1 (0.16: the import is 16% heavier than the trace)."""
        if not self.trace_peak_bytes:
            return None
        return self.imported_peak_bytes / self.trace_peak_bytes - 1


def peak_fidelity(trace_path, et_path=None, iteration=None, split=True) -> PeakFidelity:
    """Import a trace and set its peak ``Total Allocated`` (within the imported window)
    beside the profile's no-swap peak. Without ``et_path`` both count the same bytes."""
    profile = import_kineto(trace_path, et_path, iteration, split=split)
    ops = profile.source["ops"]
    return PeakFidelity(profile.source["memory"].get("trace_peak_bytes"), profile.peak_bytes,
                        len(profile.ops), ops.get("split", {}).get("ops", 0), profile)
