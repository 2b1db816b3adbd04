"""Planners: each decides what leaves GPU memory, where it goes, and when it returns.

The planners live in one sub-package per family, after what their plans do; what they
share lives in ``core``:

- ``core/``: the registry, ``make_plan`` (api), lowering decisions to actions, profile
  facts (analysis, facts), segment checkpointing (checkpoint), the memory estimate, the
  lower bound, codecs (compression), grouping, placement, the HiGHS wrapper, the catalog
  that imports every family, and ``none`` (the no-swap baseline every family is compared
  with).
- ``swap/``: explicit copies to host memory or SSD and back: vdnn, vdnn++, lms, capuchin,
  flashneuron, g10, autoswap, chen-meng, gtbm, layrub, cachedarrays, modnn, sentinel.
  Capuchin also recomputes, but swapping is its policy's first phase and recomputation
  the alternative per tensor ("swap and recompute"), so it sits with the swaps;
  sentinel's plans are explicit copies (not managed memory), so it is here and not in
  ``uvm/``.
- ``recompute/``: drop and recompute: chen, checkmate (and its MILP model), superneurons
  (which also offloads convolution outputs, and recomputes the cheap layers), and
  torch-budget.
- ``uvm/``: plans that run in CUDA managed memory: uvm, oc-dnn, deepum, dragon.
- ``offload/``: the optimizer step on the host CPU: zero-offload and zero-infinity.
- ``compress/``: another plan's swaps or stashes kept encoded: cdma, gist, cswap.
- ``search/``: planners that search a solver's or a genetic algorithm's space: ilp/ (the
  interval MILP: autotm, tmof, joint), deeptm (on the same MILP), swapadvisor/.

A planner imports ``core`` and the helpers of its own family (modules whose names start
with ``_``), never another planner, except to reuse that planner's plan, which the
importing module's docstring names (cdma and vdnn++ start from vDNN's plan; checkmate,
the ILPs and deeptm fall back to chen, torch-budget or g10).
"""
