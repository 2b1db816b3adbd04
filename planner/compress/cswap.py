"""``cswap``: another planner's swaps, each compressed on the GPU only where that is
faster, after CSWAP (Chen, Zhu, Liu, Wu, Shen, Wang, Jin, "CSWAP: A Self-Tuning
Compression Framework for Accelerating Tensor Swapping in GPUs", CLUSTER'21; lossy
codecs as CSwap+ adds them, TPDS'22).

What it does
------------
The base planner (``base``, Capuchin by default) decides what is swapped and when. Then,
per swapped tensor, CSWAP's rule: compress it only if compress + transfer of the smaller
copy + decompress takes less than the plain transfer. Here the costs are R41's: the
codec's encode and decode kernels at their throughputs over the tensor's bytes, and
each offload and prefetch of the compressed size on its uncontended link. Among the
machine's compute codecs the one that saves the most time is taken (``codec=auto``;
lossy ones only with ``allow_lossy``), or the one named. The compressed plan is scored
by the simulator and kept only if it is no slower than the base plan (which is
returned otherwise, with a note).

``swapplan plan --planner P --codec C`` runs this planner with ``base=P`` and ``codec=C``.

Departures from the paper, and why
----------------------------------
1. **Sparsity and kernel times are not predicted.** CSWAP trains models to predict each
   tensor's sparsity and (de)compression time as training goes on; here density is the
   profile's (measured by ``swapplan trace --density`` or given with ``--density-file``)
   and kernel times come from the hardware file's codec throughputs.
2. **Kernels run on the compute stream**, where R41 puts them (CSWAP overlaps them with
   other streams where it can): each costs compute time, which the rule counts.
3. **One codec per tensor** for all its swaps (a prefetch must read the copy its
   offload wrote with the same codec, R41); tensors moved at the iteration's start or
   due back at its end, persistent tensors, and tensors moved between SSD and host
   memory stay uncompressed.
4. **Algorithm choice** is among the hardware file's codecs (zvc, and fp16 / bf16 /
   int8 when lossy ones are allowed), not CSWAP's set of GPU compressors.
"""
from __future__ import annotations

from simulator.errors import InputError

from ..core.api import score, simulator_for
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, get_planner, register
from ..shared.compression import pick_codec, swap_codecs, where_it_pays, with_codecs


def resolve_base(name: str):
    """The base planner's spec; InputError for one that cannot be a base."""
    if name in ("cswap", "cdma", "gist"):
        raise InputError("<argument>", "--param cswap.base", f"{name!r} cannot be cswap's base (a planner "
                                                             "that decides plain swaps: capuchin, vdnn, lms, ...)")
    spec = get_planner(name)
    if spec.memory != "explicit":
        raise InputError("<argument>", "--param cswap.base", f"{name!r} plans managed memory (UVM): it has no "
                                                             "swaps to compress")
    return spec


@register("cswap", "CSWAP: another planner's swaps (capuchin by default), each compressed on the GPU only "
                   "where compress + smaller transfer + decompress beats the plain transfer.",
          params=(Param("base", "capuchin", "the planner whose swaps are compressed"),
                  Param("codec", "auto", "the machine's compute codec to use [auto: per tensor, the one that "
                                         "saves the most time]"),
                  Param("allow_lossy", False, "let lossy codecs (fp16, bf16, int8) be chosen (CSwap+)")),
          recomputes=True,
          paper="Chen et al., CSWAP: A Self-Tuning Compression Framework for Accelerating Tensor Swapping in "
                "GPUs, CLUSTER 2021", family="compression")
def plan_cswap(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, base="capuchin", codec="auto",
               allow_lossy=False):
    spec = resolve_base(base)
    if codec == "auto":
        candidates = swap_codecs(hardware, allow_lossy)
    else:
        candidates = [pick_codec(hardware, codec, "cswap")]
    draft = spec.func(profile, hardware, budget_bytes, options=options, **spec.resolve({}))
    sim = simulator_for(profile, hardware, options)
    actions = list(draft.actions)
    chosen = where_it_pays(profile, hardware, actions, candidates, allow_lossy)
    notes = {"base": base, "base_status": draft.status, "compressed_tensors": len(chosen),
             "codecs": sorted({c.name for c in chosen.values()}),
             "swapped_tensors": len({a.tensor for a in actions if a.kind == "offload"})}
    if not candidates:
        notes["why_none"] = f"hardware {hardware.name!r} has no compute codec" + ("" if allow_lossy else
                                                                                    " that is lossless")
    compressed = with_codecs(actions, chosen)
    kept = compressed
    if chosen:
        extra = dict(initial=draft.initial, schedule=draft.schedule, cpu_ops=draft.cpu_ops)
        before = score(sim, budget_bytes, actions, **extra)
        after = score(sim, budget_bytes, compressed, allow_lossy=allow_lossy, **extra)
        if before.ok and (not after.ok or after.iteration_us > before.iteration_us):
            kept, chosen = actions, {}
            notes["kept_base"] = (f"compressed plan {'does not run' if not after.ok else 'is slower'} "
                                  f"({after.iteration_us:.0f} us vs {before.iteration_us:.0f} us): base plan kept")
            notes["compressed_tensors"] = 0
    return Draft(actions=kept, schedule=draft.schedule, initial=draft.initial, cpu_ops=draft.cpu_ops,
                 status=draft.status, notes=notes, allow_lossy=allow_lossy and bool(chosen))
