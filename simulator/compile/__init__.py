"""The static rules: a plan checked and lowered once into a Program (docs/simulation.md:
"validity is decided from the plan alone, never from timing"). ``lower.compile_program``
is the entry (explicit mode: ``program``; UVM mode: ``uvm``); ``compiled`` holds the
profile and the machine in the run's units, ``sequence`` the compute sequence. The
rules it shares with planners (routes, codecs, allocation keys, recompute) are
simulator/model/'s."""
