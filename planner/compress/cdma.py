"""``cdma``: vDNN's offloads through a compressing copy engine, after cDMA (Rhu, O'Connor,
Chatterjee, Pool, Kwon, Keckler, "Compressing DMA Engine: Leveraging Activation Sparsity
for Training Deep Neural Networks", HPCA'18).

What it does
------------
cDMA keeps vDNN's policy (planner/swap/vdnn.py: each layer's input feature map offloaded in
forward, prefetched one layer ahead in backward) and adds zero-value compression (ZVC: a
1-bit mask per element plus the non-zero values) in the DMA engine, so a sparse ReLU
output crosses PCIe, and sits in host memory, at a fraction of its size; the GPU never
spends a cycle on it. Here every offload and prefetch of vDNN's plan carries the
machine's ``dma`` codec of format ``zvc`` (R41: the transfer moves, and the host holds,
the compressed size; GPU memory is unchanged). It is the one import of another planner
here: vDNN's plan is reused as it is (``vdnn_actions`` of planner/swap/vdnn.py per mode,
``EVERY`` for vDNN's own fallback, ``MODES`` for the parameter).

Departures from the paper, and why
----------------------------------
1. **Only tensors that shrink are compressed.** cDMA's engine compresses every
   offload and falls back to raw bytes per window when ZVC would grow it; R40 makes a
   codec that does not shrink a tensor invalid, so such tensors (density above about
   0.97 for fp32, or no measured density) move uncompressed.
2. **Density is a profile field, fixed for the iteration.** The paper measures ratios
   that change over training (dense early, sparser later); a profile carries one
   density per tensor (``swapplan trace --density``, or ``--density-file`` with densities
   measured on a trained model).
3. **The engine is a "what if".** No shipping GPU has cDMA's engine: the presets'
   ``zvc-dma`` codec models it at link speed, as the paper proposes (its engine keeps up
   with PCIe). A machine without a dma codec cannot run this planner.
4. vDNN's own departures hold (planner/swap/vdnn.py); the feasibility checks of vDNN_dyn
   and of the fallback are made on the compressed plans.
"""
from __future__ import annotations

from simulator.errors import InputError
from simulator.model.codecs import compressed_bytes

from ..core.api import fits, simulator_for
from ..core.registry import DEFAULT_OPTIONS, Draft, Param, register
from ..shared.compression import compress_where, pick_codec, with_codecs
from ..swap.vdnn import EVERY, MODES, vdnn_actions


@register("cdma", "cDMA: vDNN's offloads compressed in the copy engine (zero-value compression of sparse "
                  "activations; needs a dma codec).",
          params=(Param("mode", "all", "vDNN's policy: all, conv or dyn (first of none, conv, all that fits)",
                        choices=MODES),
                  Param("codec", "auto", "the machine's dma codec to use [auto: its first dma zvc codec]"),
                  Param("fallback", True, "when vDNN's offloads do not fit: every layer's inputs and saved "
                                          "tensors, compressed alike (marked fallback)")),
          paper="Rhu et al., Compressing DMA Engine: Leveraging Activation Sparsity for Training Deep Neural "
                "Networks, HPCA 2018", family="compression")
def plan_cdma(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, mode="all", codec="auto", fallback=True):
    engine = pick_codec(hardware, codec, "cdma", where="dma", formats=("zvc",))
    if engine is None:
        raise InputError("<argument>", "--hardware",
                         f"hardware {hardware.name!r} has no dma codec (cDMA's compressing copy engine): add "
                         "codecs: {zvc-dma: {format: zvc, where: dma}} to its file")

    def compressed(choice: str):
        actions, notes = ([], {}) if choice == "none" else vdnn_actions(profile, choice)
        chosen = compress_where(profile, actions, [engine], False,
                                lambda tid, c: profile.tensor_by_id[tid].bytes - compressed_bytes(
                                    profile.tensor_by_id[tid], c))
        return with_codecs(actions, chosen), notes, chosen

    status = "heuristic"
    sim = simulator_for(profile, hardware, options)
    if mode == "dyn":
        for choice in ("none", "conv", "all"):
            actions, notes, chosen = compressed(choice)
            if fits(sim, budget_bytes, actions):
                notes = {**notes, "dyn_choice": choice}
                break
        else:
            notes = {**notes, "dyn_choice": "all (none fits)"}
    else:
        actions, notes, chosen = compressed(mode)
    if fallback and mode != "conv" and not fits(sim, budget_bytes, actions):
        wider, wider_notes, wider_chosen = compressed(EVERY)
        if fits(sim, budget_bytes, wider):
            actions, notes, chosen, status = wider, {**wider_notes, "fallback": "vDNN's rules do not fit the "
                                                     "budget: every layer's inputs and saved tensors"}, \
                wider_chosen, "fallback"
    tensors = profile.tensor_by_id
    plain = sum(tensors[tid].bytes for tid in chosen)
    packed = sum(compressed_bytes(tensors[tid], engine) for tid in chosen)
    notes = {**notes, "mode": mode, "codec": engine.name, "compressed_tensors": len(chosen),
             "compressed_ratio": round(plain / packed, 3) if packed else None,
             "offloaded_tensors_plain": len({a.tensor for a in actions if a.kind == "offload"}) - len(chosen)}
    return Draft(actions=actions, status=status, notes=notes)
