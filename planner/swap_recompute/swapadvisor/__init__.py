"""``swapadvisor``: SwapAdvisor's genetic search over op schedules and swap decisions.

After Huang, Jin, Li, "SwapAdvisor: Pushing Deep Learning Beyond the GPU Memory Limit
via Smart Swapping", ASPLOS 2020.

- **Chromosome**: an op schedule (a topological order that keeps R21's in-place update
  order) and, per tensor, two genes in [0, 1]: an eviction priority and a leaning to
  recompute (schedule.py, decode.py).
- **Why per-tensor genes, not the paper's size classes.** The paper's allocation gene
  splits a memory pool into size classes because MXNet's allocator has them; the
  simulator counts bytes exactly (R2: no fragmentation, no classes), so class counts
  would tune nothing real. What remains to choose is *which* tensor leaves when memory
  is short, and how it comes back: that is what the genes bias.
- **Decoding** (decode.py): Belady eviction at op granularity (furthest next use first,
  scaled by the gene), swap-in as early as the memory estimate allows, recompute where
  the producer is cheaper than a copy (scaled by the second gene) and its inputs are
  resident. Always a valid plan; the simulator says whether it fits.
- **Fitness**: ``Score.rank()`` from ``simulator.api.Simulator`` (feasible plans by
  iteration time, infeasible ones by bytes over budget), in-process, in a process pool
  (``jobs``) or on Dask (``dask``), identical either way (evaluate.py).
- **GA** (search.py): tournament selection, the paper's crossover (a prefix of one
  parent's schedule, the rest in the other's order; uniform crossover of genes) and
  mutation (move an op between its latest predecessor and earliest successor; perturb
  genes), two elites, early stop after ``patience`` generations without improvement.
- **Seeds and the hall of fame**: the greedy planners' plans (g10, capuchin, lms) are
  scored and kept as they are; their choices also seed genes. The result is the best of
  the search and the seeds, so it is never worse than them.
- **Determinism under a time limit**: all randomness comes from one Generator seeded by
  ``--seed``, and the search stops at a generation boundary on a deterministic
  evaluation budget: the time limit x EVAL_SHARE, divided by a nominal cost per
  evaluation (NOMINAL_COST: per decoder, a fixed part + a part per op). The wall clock is only a safety stop for a
  machine far slower than the model; the notes then say the run was cut there.
"""
from . import search  # noqa: F401  (registers the planner)
