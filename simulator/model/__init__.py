"""The rules as a public floor: what planners, the executor, compare, runtime, fit and the
command line may read of the simulator's model without reaching into the engine.

``links`` (streams, links and routes: R1, R17, R18), ``budget`` (R2), ``recompute`` (may a
tensor be recomputed, and the scratch a recompute holds: R15), ``codecs`` (R40-R42),
``splits`` (R54), ``allocation`` (allocation keys and placements: R50) and ``variants``
(measured op variants from a CSV: R52). The engine (simulator/compile, simulator/run)
builds on these modules; none of them imports the engine.
"""
