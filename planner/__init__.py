"""Planners: each decides what leaves GPU memory, where it goes, and when it returns.

The planners live in one folder per family, the family `swapplan planners` lists them
under (planner/core/families.py: the one map; every planner's ``register`` call names its
family too, and tests/test_planner_families.py holds the two to agree):

- ``baseline/``: ``none``, the no-swap plan every family is compared with.
- ``swap/``: explicit copies to host memory or SSD and back: vdnn (with vDNN's layer
  policy, which vdnn++ and cdma reuse), lms, flashneuron, g10, autoswap, chen-meng, gtbm,
  layrub, cachedarrays, modnn, sentinel, and the swap MILPs autotm, tmof and deeptm.
  Sentinel's plans are explicit copies (not managed memory), so it is here and not in
  ``uvm/``; g10 may recompute what the link cannot move in time (``recompute``, off by
  default), a swap planner still.
- ``recompute/``: drop and recompute, nothing leaves the GPU: chen, checkmate (and its
  MILP model), torch-budget.
- ``swap_recompute/``: each tensor swapped or recomputed, whichever costs less: capuchin,
  superneurons, swapadvisor/ (a genetic search), joint (one MILP over both) and best (a
  portfolio of the others).
- ``placement/``: a swap plan with one arena placed offline: vdnn++.
- ``compress/``: another plan's swaps or stashes kept encoded: cdma, gist, cswap.
- ``offload/``: the optimizer step on the host CPU: zero-offload and zero-infinity.
- ``uvm/``: plans that run in CUDA managed memory: uvm, oc-dnn, deepum, dragon.

What planners of several families share is outside the family folders:

- ``core/``: the framework: the registry, the family map, ``make_plan`` (api), lowering
  decisions to actions, and the catalog that imports every family's folder.
- ``shared/``: facts about a profile (facts) and the models planners share: the lower
  bound, the copy queue, the memory estimate, recompute choices (regen), segment
  checkpointing, splits, grouping, placement, codecs (compression), polish, the HiGHS
  wrapper, and the interval MILP (ilp/) the ILP planners solve.

A planner imports ``core``, ``shared`` and the helpers of its own family (modules whose
names start with ``_``), never another planner, except to reuse that planner's plan, which
the importing module's docstring names (cdma and vdnn++ start from vDNN's plan; checkmate,
the ILPs and deeptm fall back to chen, torch-budget or g10).
"""
